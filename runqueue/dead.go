package runqueue

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/keys"
)

// DeadRun is a dead-lettered run.
type DeadRun struct {
	Env, Queue, Key, ID string
	Payload             []byte
	Attempt             int // attempts made + 1
	Priority            int
	DiedAt              time.Time
	// Corrupt: its stored record does not parse (see ErrCorruptRecord), so
	// Payload, Attempt and Priority are zero; Redrive serves it once the
	// record is mended (until then it returns ErrNotFound). A run whose
	// record is gone has them zero too, and Corrupt false.
	Corrupt bool
}

// DeadLetters lists up to limit (1..10000) dead-lettered runs of a queue,
// oldest death first, starting at offset, payloads included. It reads the
// list, then the runs' records in one pipeline: two round trips.
func (q *Queue) DeadLetters(ctx context.Context, env, queue string, offset, limit int) ([]DeadRun, error) {
	if err := checkQueue(env, queue); err != nil {
		return nil, err
	}
	if offset < 0 {
		return nil, invalid("offset", "must not be negative")
	}
	if limit <= 0 || limit > 10000 {
		return nil, invalid("limit", "%d is outside 1..10000", limit)
	}
	qk := q.space.Env(env).Queue(queue)
	zs, err := q.rdb.ZRangeWithScores(ctx, qk.Dead(), int64(offset), int64(offset+limit-1)).Result()
	if err != nil {
		return nil, err
	}
	out := make([]DeadRun, 0, len(zs))
	for _, z := range zs {
		ref, err := keys.DecodeRunMember(z.Member.(string))
		if err != nil {
			continue
		}
		out = append(out, DeadRun{Env: ref.Env, Queue: ref.Queue, Key: ref.Key, ID: ref.ID,
			DiedAt: time.UnixMilli(int64(z.Score))})
	}
	if err := q.deadRecords(ctx, qk, out); err != nil {
		return nil, err
	}
	return out, nil
}

// DeadLetter inspects one dead-lettered run.
func (q *Queue) DeadLetter(ctx context.Context, env, queue, key, id string) (DeadRun, error) {
	if err := checkRef(env, queue, key, id); err != nil {
		return DeadRun{}, err
	}
	qk := q.space.Env(env).Queue(queue)
	ref := keys.Ref{Env: env, Queue: queue, Key: key, ID: id}
	score, err := q.rdb.ZScore(ctx, qk.Dead(), keys.RunMember(ref)).Result()
	if err == redis.Nil {
		return DeadRun{}, ErrNotFound
	}
	if err != nil {
		return DeadRun{}, err
	}
	ds := []DeadRun{{Env: env, Queue: queue, Key: key, ID: id, DiedAt: time.UnixMilli(int64(score))}}
	err = q.deadRecords(ctx, qk, ds)
	return ds[0], err
}

// deadRecords fills in the attempt, priority and payload of dead runs ds
// of queue qk from their records, read in one pipeline: one HGET a run (a
// reply a record, however large the payloads), one round trip for all. A
// run whose record is gone keeps them zero, as does one whose record does
// not parse (Corrupt).
func (q *Queue) deadRecords(ctx context.Context, qk keys.Queue, ds []DeadRun) error {
	cmds := make([]*redis.StringCmd, len(ds))
	if _, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, d := range ds {
			cmds[i] = p.HGet(ctx, qk.Runs(), keys.Segment(d.ID))
		}
		return nil
	}); err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	for i, c := range cmds {
		raw, err := c.Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			return err
		}
		if r, ok := parseRecord(raw); ok {
			ds[i].Attempt, ds[i].Priority, ds[i].Payload = r.att, r.pr, []byte(r.payload)
		} else {
			ds[i].Corrupt = true
		}
	}
	return nil
}

// Redrive puts a dead-lettered run back in its queue, ready now, with its
// attempts reset. A run that is already live (queued or in flight, for
// instance after a first attempt whose reply was lost and that go-redis
// retried) is left as it is and Redrive succeeds. A run that is neither
// dead nor live (acked, expired, deleted, or never enqueued) is
// ErrNotFound.
func (q *Queue) Redrive(ctx context.Context, env, queue, key, id string) error {
	if err := checkRef(env, queue, key, id); err != nil {
		return err
	}
	qn := q.names(env, queue)
	qk := qn.qk
	v := qk.Variant(key)
	ref := keys.Ref{Env: env, Queue: queue, Key: key, ID: id}
	ks := placeKeys(qk, qk.Dead(), qk.Env.Dead())
	now, err := q.clockNow()
	if err != nil {
		return err
	}
	args := []any{now, keys.Segment(id), v.Member(), keys.RunMember(ref), ms(q.cfg.PriorityStep), qn.member, qn.wake,
		qn.vbase}
	ks, args = q.withHooks(q.scripts.redrive, qn, ks, args)
	return scriptError(run(ctx, q.rdb, q.scripts.redrive, ks, args...).Err(), nil)
}

// DeleteDeadLetter deletes one dead-lettered run for good: its record and
// payload, its entry among the queue's dead letters and its count in
// QueueStats and EnvStats (Dead), in one atomic script call (O(log N) in
// the queue's dead letters). Its id is free again afterwards: an Enqueue
// with it queues a new run. Dead letters are kept until they are redriven
// or deleted (see PurgeDeadLetters); nothing expires them.
//
// It returns ErrNotFound when the run is not dead-lettered: no such run,
// one under another key, or a live one (queued or in flight), which it
// leaves as it is. A call sent again after one that succeeded (a lost
// reply retried) finds nothing left and returns ErrNotFound too.
func (q *Queue) DeleteDeadLetter(ctx context.Context, env, queue, key, id string) error {
	if err := checkRef(env, queue, key, id); err != nil {
		return err
	}
	ref := keys.Ref{Env: env, Queue: queue, Key: key, ID: id}
	n, err := q.purge(ctx, q.space.Env(env).Queue(queue), "", keys.RunMember(ref))
	if err == nil && n == 0 {
		err = ErrNotFound
	}
	return err
}

// PurgeDeadLetters deletes for good up to limit (1..10000) dead-lettered
// runs of a queue that died at or before diedBefore, oldest death first,
// and returns how many it deleted. Each goes as with DeleteDeadLetter: its
// record and payload, its entry and its count in QueueStats and EnvStats
// (Dead); their ids are free again afterwards (an Enqueue with one queues
// a new run).
//
// Dead letters are kept until they are redriven or deleted: nothing
// expires them, so a deployment whose runs may die keeps its dead letters
// bounded by calling this now and then, for instance with now minus its
// retention, again while it returns limit. A call reads the runs to
// delete, then deletes them in one atomic script call of O(limit × log N)
// on the queue's dead letters (N of them), and Redis serves nothing else
// while it runs: about 4.5 µs a run deleted (Redis 7.0), some 45 ms at
// limit 10000; a smaller limit (1000: 4.5 ms) keeps each pause short.
//
// A script call go-redis sends again (its reply timed out, see README,
// "Timeouts and go-redis's retries") deletes nothing more: the runs are
// named to it, with diedBefore (a run redriven since the read and dead
// again after diedBefore stays). The count returned is then that of the
// send that answered, which may be 0. Runs read that another call took
// before the delete (a Redrive, a DeleteDeadLetter, another purge) are
// not counted either: so a count below limit does not prove that none is
// left, and a loop that calls again while it returns limit may stop
// early, leaving the rest to its next round (a purge on a schedule).
func (q *Queue) PurgeDeadLetters(ctx context.Context, env, queue string, diedBefore time.Time, limit int) (int, error) {
	if err := checkQueue(env, queue); err != nil {
		return 0, err
	}
	if limit <= 0 || limit > 10000 {
		return 0, invalid("limit", "%d is outside 1..10000", limit)
	}
	if err := checkTime("diedBefore", diedBefore); err != nil {
		return 0, err
	}
	if q.scripts.purge.refused {
		return 0, ErrReadOnly
	}
	qk := q.space.Env(env).Queue(queue)
	before := strconv.FormatInt(diedBefore.UnixMilli(), 10)
	// The runs are read first and named to the script, with the time: a
	// script call go-redis sends again (its reply timed out) then finds
	// them gone and deletes nothing more, where a script that chose the
	// oldest deaths itself would delete up to limit more at each send.
	members, err := q.rdb.ZRangeByScore(ctx, qk.Dead(), &redis.ZRangeBy{Min: "-inf", Max: before, Count: int64(limit)}).Result()
	if err != nil || len(members) == 0 {
		return 0, err
	}
	return q.purge(ctx, qk, before, members...)
}

// purge runs the purge script on qk's dead letters: it deletes the runs of
// members, those that died at or before the time before (ms, decimal) when
// before is not "".
func (q *Queue) purge(ctx context.Context, qk keys.Queue, before string, members ...string) (int, error) {
	args := make([]any, 0, 3+len(members))
	args = append(args, qk.Member(), before, len(members))
	for _, m := range members {
		args = append(args, m)
	}
	deleted, err := run(ctx, q.rdb, q.scripts.purge, []string{qk.Runs(), qk.Dead(), qk.Env.Dead()}, args...).Int()
	return deleted, scriptError(err, nil)
}
