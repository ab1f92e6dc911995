package runqueue

import (
	"context"
	"fmt"
)

// RepairResult says what Repair found missing or wrong and wrote.
type RepairResult struct {
	// Runs is the number of the queue's records read.
	Runs int
	// Keys is the number of the queue's concurrency keys looked at.
	Keys int
	// IndexEntries is the number of entries of the queue's age and delay
	// indexes added, moved to their key's oldest run or removed (a key with
	// no queued run of that kind).
	IndexEntries int
	// Depth is true when the queue's counts of ready and delayed runs were
	// rewritten (QueueStats' Ready and Delayed, and the admission limits).
	Depth bool
	// Master is true when the queue's entry in its shard's index of queues
	// with work was added, moved or removed.
	Master bool
	// TTLEntries is the number of queued runs with a TTL whose entry in the
	// shard's TTL set was added.
	TTLEntries int
	// Leases is the number of runs in flight whose lease was added, with a
	// deadline LeaseDuration from now.
	Leases int
	// KeyCounts is the number of the queue's concurrency keys whose count
	// of runs in flight (what KeyConcurrency is held to) was set, added or
	// removed.
	KeyCounts int
}

// Changed reports whether Repair wrote anything.
func (r RepairResult) Changed() bool {
	return r.IndexEntries > 0 || r.Depth || r.Master || r.TTLEntries > 0 || r.Leases > 0 || r.KeyCounts > 0
}

// repairChunk is how many runs or held runs one repair script call takes
// (the "index" part takes every key at once: see Repair).
const repairChunk = 1000

// Repair rebuilds, from the runs a queue holds, what its scripts keep
// beside them, after such a key was lost: deleted by hand, or evicted
// under Config.AllowEviction. Without it a lost index hides runs: a key's
// ready runs are not served (flag off) until it gets a new run, delayed
// runs never become ready, a queue missing from its shard's index is not
// found by DequeueShard, a run in flight whose lease is gone is never
// recovered, and a lost TTL entry never expires its run.
//
// It reads the queue's records (its runs hash) and rebuilds the age and
// delay indexes, the ready and delayed counts and the queue's entry in its
// shard's index of queues in one script call over every key of the queue
// (4 commands and 6-12 µs of Redis a key on Redis 7.0: 0.2 s at 20,000
// keys, during which Redis serves nothing else); then it adds the TTL
// entries of queued runs with a TTL and the leases of runs in flight (a
// deadline LeaseDuration from now: a holder's extension moves it as usual;
// a holder that is gone has its run recovered once it passes), 1,000 runs
// a call, and sets each key's count of runs in flight from the runs held.
// Each call writes only what is missing or wrong, so it is safe beside the
// queue's other work and safe to call again; a queue with nothing to mend
// is only read.
//
// Not rebuilt: the runs themselves (a record lost loses its run; a run
// whose set was lost is found only in its record and is not queued again),
// the env's count of runs in flight (it spans the env's queues; one lost
// counts from 0 again, so the env's runs in flight at the loss are not
// held to EnvConcurrency until they leave flight), the scheduler's state
// (flag on; a flag-on dequeue starts it again from the indexes) and the
// dead letters' index.
//
// A Queue opened with Config.ReadOnly returns ErrReadOnly.
func (q *Queue) Repair(ctx context.Context, env, queue string) (RepairResult, error) {
	var res RepairResult
	if err := checkQueue(env, queue); err != nil {
		return res, err
	}
	if q.cfg.ReadOnly {
		return res, ErrReadOnly
	}
	now, err := q.clockNow()
	if err != nil {
		return res, err
	}
	qn := q.names(env, queue)
	qk := qn.qk
	sh := q.space.Shard(q.ShardOf(env))

	// The records: each key that has one, and the runs with a TTL.
	vms := map[string]bool{}
	var withTTL []string
	err = q.scanHash(ctx, qk.Runs(), func(id, rec string) {
		res.Runs++
		if r, ok := parseRecord(rec); ok {
			vms[r.vm] = true
			if r.ttl != 0 {
				withTTL = append(withTTL, id)
			}
		}
	})
	if err != nil {
		return res, err
	}
	args := make([]any, 0, 3+len(vms))
	args = append(args, "index", qn.vbase, qn.member)
	for vm := range vms {
		args = append(args, vm)
	}
	out, err := run(ctx, q.rdb, q.scripts.repair,
		[]string{qk.CkIndex(), qk.DelayIndex(), qk.Depth(), sh.Master()}, args...).Int64Slice()
	if err = scriptError(err, nil); err != nil {
		return res, err
	}
	if len(out) != 4 {
		return res, fmt.Errorf("runqueue: repair: unexpected reply %v", out)
	}
	res.Keys, res.IndexEntries, res.Depth, res.Master = int(out[0]), int(out[1]), out[2] == 1, out[3] == 1

	for len(withTTL) > 0 {
		chunk := withTTL[:min(len(withTTL), repairChunk)]
		withTTL = withTTL[len(chunk):]
		n, err := q.repairPart(ctx, []string{qk.Runs(), sh.TTL()}, "ttl", qn.vbase, qn.runPrefix, chunk)
		res.TTLEntries += n
		if err != nil {
			return res, err
		}
	}

	var held []string
	err = q.scanHash(ctx, qk.Held(), func(field, _ string) { held = append(held, field) })
	if err != nil {
		return res, err
	}
	deadline := now + ms(q.cfg.LeaseDuration)
	for len(held) > 0 {
		chunk := held[:min(len(held), repairChunk)]
		held = held[len(chunk):]
		n, err := q.repairPart(ctx, []string{qk.Held(), sh.Leases()}, "leases", deadline, qn.runPrefix, chunk)
		res.Leases += n
		if err != nil {
			return res, err
		}
	}
	// The key counts, from the held runs as they are at the call.
	res.KeyCounts, err = run(ctx, q.rdb, q.scripts.repair, []string{qk.Held(), qk.KeyInflight()}, "kin").Int()
	return res, scriptError(err, nil)
}

// repairPart runs one "ttl" or "leases" call of the repair script on
// names and returns what it added.
func (q *Queue) repairPart(ctx context.Context, ks []string, part string, a, b any, names []string) (int, error) {
	args := make([]any, 0, 3+len(names))
	args = append(args, part, a, b)
	for _, n := range names {
		args = append(args, n)
	}
	n, err := run(ctx, q.rdb, q.scripts.repair, ks, args...).Int()
	return n, scriptError(err, nil)
}

// scanHash calls fn with each field and value of hash key, read by HSCAN
// (a field written or removed during the scan may be seen or not).
func (q *Queue) scanHash(ctx context.Context, key string, fn func(field, value string)) error {
	var cursor uint64
	for {
		kv, next, err := q.rdb.HScan(ctx, key, cursor, "", repairChunk).Result()
		if err != nil {
			return err
		}
		for i := 0; i+1 < len(kv); i += 2 {
			fn(kv[i], kv[i+1])
		}
		if next == 0 {
			return nil
		}
		cursor = next
	}
}
