package runqueue

import (
	"context"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/keys"
)

// RecoverLeases requeues (attempt + 1, ready now) up to limit (1..100000)
// runs of shard whose lease deadline passed, or dead-letters those without
// attempts left.
// Any number of instances may run it concurrently: each run is recovered
// once. It returns how many runs it recovered or dead-lettered; with an
// error (a run's call failed, or the connection was lost part way), that
// count and the Observer still include what the calls that answered did.
func (q *Queue) RecoverLeases(ctx context.Context, shard, limit int) (int, error) {
	now := q.now()
	var tally queueTally
	n, err := q.sweep(ctx, shard, limit, keys.Shard.Leases, now,
		func(qn *queueNames, r rawRef, _ string) call {
			return q.requeueCallRaw(qn, r, 0, now, now, false, q.cfg.MaxAttempts)
		},
		func(ref keys.Ref, cmd *redis.Cmd) (int, error) {
			res, err := cmd.Int64Slice()
			switch err := scriptError(err, nil); err {
			case nil:
				if q.observe {
					dead := 0
					if len(res) > 0 && res[0] == 0 {
						dead = 1
					}
					tally.add(ref.Env, ref.Queue, 1, dead)
				}
				return 1, nil
			case ErrNotFound, ErrNotInFlight, ErrLeaseActive:
				// Another instance got there first, or the holder acked or
				// extended meanwhile.
				return 0, nil
			default:
				return 0, err
			}
		})
	// Runs recovered before an error stay recovered: report them too.
	for _, c := range tally.rows {
		q.cfg.Observer.Recovered(c.env, c.queue, c.n, c.dead)
	}
	return n, err
}

func (q *Queue) checkSweep(shard, limit int) error {
	if err := q.checkShard(shard); err != nil {
		return err
	}
	if limit <= 0 || limit > 100000 {
		return invalid("limit", "%d is outside 1..100000", limit)
	}
	return nil
}

// ExpireTTL removes up to limit (1..100000) queued runs of shard whose TTL
// passed before they were dequeued, and returns how many it expired; with
// an error (a run's call failed, or the connection was lost part way), that
// count and the Observer still include what the calls that answered did.
func (q *Queue) ExpireTTL(ctx context.Context, shard, limit int) (int, error) {
	now := q.now()
	sh := q.space.Shard(max(0, shard))
	var tally queueTally
	n, err := q.sweep(ctx, shard, limit, keys.Shard.TTL, now,
		func(qn *queueNames, r rawRef, member string) call {
			ks := placeKeys(qn.qk, sh.TTL())
			args := []any{now, r.encID, r.vm, member, qn.member, qn.vbase}
			ks, args = q.withHooks(q.scripts.expire, qn, ks, args)
			return call{sc: q.scripts.expire, keys: ks, args: args}
		},
		func(ref keys.Ref, cmd *redis.Cmd) (int, error) {
			n, err := cmd.Int()
			if err == nil && n > 0 && q.observe {
				tally.add(ref.Env, ref.Queue, n, 0)
			}
			return n, scriptError(err, nil)
		})
	// Runs expired before an error stay expired: report them too.
	for _, c := range tally.rows {
		q.cfg.Observer.Expired(c.env, c.queue, c.n)
	}
	return n, err
}

// sweep reads up to limit members of a shard set (leases, ttl) whose score
// is due by now, sends one script call per run in one pipeline, in score
// order, and adds up what each call reports. count sees each call's run,
// so the caller knows the env and queue of what it counts. A call that
// fails (a slot on the move, a broken key), or a connection lost part way
// through the pipeline, ends the sweep with that error after every call
// of the chunk that answered is counted: what they did must be reported.
// build names each run by its key and id as stored (splitRunMember), so
// that a member whose key or id runqueue did not write (added by hand to
// a ready set, then served) is swept as the others are; count sees a Ref
// of its env and queue alone.
func (q *Queue) sweep(ctx context.Context, shard, limit int, set func(keys.Shard) string, now int64,
	build func(qn *queueNames, r rawRef, member string) call, count func(keys.Ref, *redis.Cmd) (int, error)) (int, error) {
	if err := q.checkSweep(shard, limit); err != nil {
		return 0, err
	}
	if q.cfg.ReadOnly {
		// Refused whether or not the shard holds work to sweep.
		return 0, ErrReadOnly
	}
	if err := checkNow(now); err != nil {
		return 0, err
	}
	members, err := q.rdb.ZRangeByScore(ctx, set(q.space.Shard(shard)), &redis.ZRangeBy{
		Min: "-inf", Max: strconv.FormatInt(now, 10), Count: int64(limit)}).Result()
	if err != nil {
		return 0, err
	}
	var calls []call
	var refs []keys.Ref
	for _, m := range members {
		ref, r, ok := splitRunMember(m)
		if !ok {
			continue // not a member runqueue wrote; never crash a sweeper on it
		}
		calls = append(calls, build(q.names(ref.Env, ref.Queue), r, m))
		refs = append(refs, ref)
	}
	n := 0
	for len(calls) > 0 {
		chunk := calls[:min(len(calls), 500)]
		chunkRefs := refs[:len(chunk)]
		calls, refs = calls[len(chunk):], refs[len(chunk):]
		cmds, err := runPipelined(ctx, q.rdb, chunk)
		if err != nil && cmds == nil {
			return n, err
		}
		// With a connection lost part way (err with cmds), the calls
		// answered before it ran and are counted; the others carry err.
		first := err
		for i, cmd := range cmds {
			got, err := count(chunkRefs[i], cmd)
			if err != nil {
				if first == nil {
					first = err
				}
				continue
			}
			n += got
		}
		if first != nil {
			return n, first
		}
	}
	return n, nil
}

// splitRunMember splits a run member (keys.RunMember) into its env and
// queue, decoded, and its variant member and encoded id as stored, which
// need not decode (a ready-set member added by hand, once served). ok is
// false when the env or queue is not as runqueue writes them.
func splitRunMember(m string) (keys.Ref, rawRef, bool) {
	// (An id added by hand may hold ':'; a key runqueue writes never does,
	// so the split is at the first ':' after the queue. A key added by hand
	// with one, whose member's release at serve failed, is split wrongly:
	// its hold and env slot are released, and another key's count.)
	parts := strings.SplitN(m, ":", 4)
	if len(parts) != 4 {
		return keys.Ref{}, rawRef{}, false
	}
	env, err := keys.DecodeSegment(parts[0])
	if err != nil || keys.Segment(env) != parts[0] {
		return keys.Ref{}, rawRef{}, false
	}
	queue, err := keys.DecodeSegment(parts[1])
	if err != nil || keys.Segment(queue) != parts[1] || checkQueue(env, queue) != nil {
		return keys.Ref{}, rawRef{}, false
	}
	return keys.Ref{Env: env, Queue: queue}, rawRef{encID: parts[3], vm: parts[2]}, true
}
