package runqueue

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// RepairOptions are the choices of a Repair; nil means every default.
type RepairOptions struct {
	// DeadLetterOrphans dead-letters the runs Repair finds in no set (see
	// RepairResult.Orphans) instead of queueing them again: a run whose
	// dead letter's entry was lost is found so too, and queued again it
	// would run again (unless it died for its attempts, which Repair can
	// tell: see RepairResult.OrphansDead). Default false: queued again.
	DeadLetterOrphans bool
}

// RepairResult says what Repair found missing or wrong and wrote.
type RepairResult struct {
	// Runs is the number of the queue's records read.
	Runs int
	// Orphans is the number of runs found in none of the sets a run is
	// always in (its key's ready or delayed runs, the runs in flight, the
	// dead letters) and without a lease, their set lost. Each was queued
	// again as its record says (ready at its AvailableAt by its priority,
	// or delayed until then; its attempt as it was), but for those counted
	// in OrphansDead and OrphansExpired.
	Orphans int
	// OrphansDead is how many of the Orphans were dead-lettered: all of
	// them but the expired with RepairOptions.DeadLetterOrphans, else those
	// whose attempts are past MaxAttempts (only a run dead-lettered for its
	// attempts has such a record: its dead letter's entry was lost; the
	// Queue's MaxAttempts must be the deployment's). Not told to the
	// Observer.
	OrphansDead int
	// OrphansExpired is how many of the Orphans were deleted because their
	// TTL had passed before any delivery (their TTL entry still there), as
	// ExpireTTL would have, and told to the Observer as ExpireTTL does. A
	// run with a TTL whose TTL entry is gone too is taken for delivered
	// once (a dequeue drops the entry): it is queued again without a TTL,
	// its record's deadline cleared as a redelivery's rewrite clears it
	// (a run never delivered whose set and TTL entry were both lost is
	// such a run too, and may then be delivered past its TTL).
	OrphansExpired int
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
	// Dead is true when the queue's count of dead-lettered runs (QueueStats'
	// and EnvStats' Dead) was rewritten from its dead letters.
	Dead bool
	// TTLEntries is the number of queued runs with a TTL whose entry in the
	// shard's TTL set was added.
	TTLEntries int
	// Leases is the number of runs in flight whose lease was added, with a
	// deadline LeaseDuration from now.
	Leases int
	// KeyCounts is the number of the queue's concurrency keys whose count
	// of runs in flight (what KeyConcurrency is held to) was set, added or
	// removed: its runs held, and its leases whose hold was lost.
	KeyCounts int
}

// Changed reports whether Repair wrote anything.
func (r RepairResult) Changed() bool {
	return r.Orphans > 0 || r.IndexEntries > 0 || r.Depth || r.Master || r.Dead || r.TTLEntries > 0 ||
		r.Leases > 0 || r.KeyCounts > 0
}

// repairChunk is how many runs or held runs one repair script call takes
// (the "index" part takes every key at once: see Repair).
const repairChunk = 1000

// Repair rebuilds, from the runs a queue holds, what its scripts keep
// beside them, after such a key was lost: deleted by hand, or evicted
// under Config.AllowEviction. Without it a lost key hides runs: a run
// whose key's ready or delayed set was lost is never served again (its
// id stays taken), a key's ready runs are not served (flag off) until it
// gets a new run when the age index was lost, delayed runs never become
// ready without the delay index, a queue missing from its shard's index
// is not found by DequeueShard, a run in flight whose lease is gone is
// never recovered, and a run whose TTL entry was lost is expired only by
// the dequeue that takes it (ExpireTTL does not find it).
//
// It reads the queue's records (its runs hash) and, 1,000 runs a call,
// queues again each run found in no set and without a lease
// (RepairResult.Orphans; or dead-letters or expires it, see there) and
// adds the TTL entry of each queued run with a TTL that has none; then it
// rebuilds the age and delay indexes, the ready and delayed counts, the
// queue's entry in its shard's index and its count of dead runs in one
// script call over every key of the queue; then it adds the leases of
// runs in flight (a deadline LeaseDuration from now: a holder's extension
// moves it as usual; a holder that is gone has its run recovered once it
// passes), 1,000 runs a call, and sets each key's count of runs in flight
// from its runs held and its leases whose hold was lost (lease recovery
// releases the slots of those). Each call writes only what is missing or
// wrong, so it is safe beside the queue's other work and safe to call
// again; a queue with nothing to mend is only read.
//
// The call over every key reads up to 4 commands a key (and writes one
// for each entry it mends): 6-12 µs of Redis a key on Redis 7.0 (0.2 s at
// 20,000 keys), during which Redis serves nothing else; the key counts'
// call reads every run in flight of the queue and its leases. Above some 100,000
// keys in one queue it holds Redis for a second or more, and from about
// 400,000 it passes Redis's busy-reply-threshold (5 s), when other clients
// are answered BUSY until it ends.
//
// Not rebuilt: runs whose record was lost, the env's count of runs in
// flight (it spans the env's queues: one lost counts from 0 again, and as
// the runs in flight at the loss leave, each takes one off the count of
// the runs served since, so the env runs up to that many more than
// EnvConcurrency until its count reaches 0), the scheduler's state (flag
// on; a flag-on dequeue starts it again from the indexes) and which runs
// were dead-lettered: a dead letter whose entry was lost is one of the
// runs found in no set.
//
// Repair reads the Queue's own MaxAttempts (which orphans died for their
// attempts), PriorityStep (the ready scores of orphans queued again) and
// LeaseDuration (the leases it adds): open it with the deployment's.
//
// When a queue's held hash and its leases were both lost, its runs in
// flight are in no set and have no lease: Repair queues them again (or
// dead-letters them with DeadLetterOrphans) while their holders may still
// run them, so they may run twice.
//
// A Queue opened with Config.ReadOnly returns ErrReadOnly.
func (q *Queue) Repair(ctx context.Context, env, queue string, opts *RepairOptions) (RepairResult, error) {
	var res RepairResult
	if err := checkQueue(env, queue); err != nil {
		return res, err
	}
	if opts == nil {
		opts = &RepairOptions{}
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

	// The records: every run, and each key that has one.
	var ids []string
	vms := map[string]bool{}
	err = scanPairs(func(c uint64) *redis.ScanCmd {
		return q.rdb.HScan(ctx, qk.Runs(), c, "", repairChunk)
	}, func(id, rec string) {
		ids = append(ids, id)
		if r, ok := parseRecord(rec); ok {
			vms[r.vm] = true
		}
	})
	if err != nil {
		return res, err
	}
	res.Runs = len(ids)

	// Every run first (runs in no set, TTL entries), so that the indexes
	// count the runs queued again.
	kill := 0
	if opts.DeadLetterOrphans {
		kill = 1
	}
	err = q.repairChunks(ctx, []string{qk.Runs(), qk.CkIndex(), qk.DelayIndex(), qk.Depth(), sh.Master(),
		qk.Held(), qk.Dead(), qk.Env.Dead(), sh.Leases(), sh.TTL()},
		[]any{"runs", qn.vbase, qn.member, qn.runPrefix, now, ms(q.cfg.PriorityStep), kill, max(q.cfg.MaxAttempts, 0)},
		ids, func(cmd *redis.Cmd) error {
			out, err := cmd.Int64Slice()
			if err == nil && len(out) != 4 {
				err = fmt.Errorf("runqueue: repair: unexpected reply %v", out)
			}
			if err == nil {
				res.Orphans += int(out[0])
				res.OrphansDead += int(out[1])
				res.OrphansExpired += int(out[2])
				res.TTLEntries += int(out[3])
			}
			return err
		})
	if res.OrphansExpired > 0 && q.observe {
		q.cfg.Observer.Expired(env, queue, res.OrphansExpired)
	}
	if err != nil {
		return res, err
	}

	args := make([]any, 0, 3+len(vms))
	args = append(args, "index", qn.vbase, qn.member)
	for vm := range vms {
		args = append(args, vm)
	}
	out, err := run(ctx, q.rdb, q.scripts.repair,
		[]string{qk.CkIndex(), qk.DelayIndex(), qk.Depth(), sh.Master(), qk.Dead(), qk.Env.Dead()}, args...).Int64Slice()
	if err = scriptError(err, nil); err != nil {
		return res, err
	}
	if len(out) != 5 {
		return res, fmt.Errorf("runqueue: repair: unexpected reply %v", out)
	}
	res.Keys, res.IndexEntries, res.Depth, res.Master, res.Dead = int(out[0]), int(out[1]), out[2] == 1, out[3] == 1,
		out[4] == 1

	var held []string
	err = scanPairs(func(c uint64) *redis.ScanCmd {
		return q.rdb.HScan(ctx, qk.Held(), c, "", repairChunk)
	}, func(field, _ string) { held = append(held, field) })
	if err != nil {
		return res, err
	}
	// (The clock read again: the reads and calls before may have taken a
	// while on a large queue.)
	if now, err = q.clockNow(); err != nil {
		return res, err
	}
	err = q.repairChunks(ctx, []string{qk.Held(), sh.Leases()},
		[]any{"leases", now + ms(q.cfg.LeaseDuration), qn.runPrefix}, held, addInt(&res.Leases))
	if err != nil {
		return res, err
	}
	// The key counts, from the held runs as they are at the call and the
	// queue's leases without a hold (lease recovery releases their slots
	// too). (An encoded name holds no glob character, and the prefix ends
	// in ':', so the pattern matches this queue's leases alone.)
	args = append(args[:0], "kin", qn.runPrefix)
	err = scanPairs(func(c uint64) *redis.ScanCmd {
		return q.rdb.ZScan(ctx, sh.Leases(), c, qn.runPrefix+"*", repairChunk)
	}, func(member, _ string) { args = append(args, member) })
	if err != nil {
		return res, err
	}
	res.KeyCounts, err = run(ctx, q.rdb, q.scripts.repair, []string{qk.Held(), qk.KeyInflight(), sh.Leases()}, args...).Int()
	return res, scriptError(err, nil)
}

// repairChunks runs a part of the repair script on ks, its arguments head
// then names, repairChunk names a call, and hands each reply to got.
func (q *Queue) repairChunks(ctx context.Context, ks []string, head []any, names []string, got func(*redis.Cmd) error) error {
	for len(names) > 0 {
		chunk := names[:min(len(names), repairChunk)]
		names = names[len(chunk):]
		args := append(make([]any, 0, len(head)+len(chunk)), head...)
		for _, n := range chunk {
			args = append(args, n)
		}
		if err := got(run(ctx, q.rdb, q.scripts.repair, ks, args...)); err != nil {
			return scriptError(err, nil)
		}
	}
	return nil
}

// addInt is a repairChunks reply handler that adds an integer reply to n.
func addInt(n *int) func(*redis.Cmd) error {
	return func(cmd *redis.Cmd) error {
		v, err := cmd.Int()
		*n += v
		return err
	}
}

// scanPairs calls fn with each pair (field and value, member and score)
// of the scan that scan(cursor) sends, to its end (an element written or
// removed during the scan may be seen or not).
func scanPairs(scan func(cursor uint64) *redis.ScanCmd, fn func(a, b string)) error {
	var cursor uint64
	for {
		kv, next, err := scan(cursor).Result()
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
