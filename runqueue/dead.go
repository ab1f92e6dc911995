package runqueue

import (
	"context"
	"errors"
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
}

// DeadLetters lists up to limit dead-lettered runs of a queue, oldest death
// first, starting at offset.
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
		d, err := q.deadRun(ctx, qk, ref)
		if err != nil {
			return nil, err
		}
		d.DiedAt = time.UnixMilli(int64(z.Score))
		out = append(out, d)
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
	d, err := q.deadRun(ctx, qk, ref)
	d.DiedAt = time.UnixMilli(int64(score))
	return d, err
}

func (q *Queue) deadRun(ctx context.Context, qk keys.Queue, ref keys.Ref) (DeadRun, error) {
	d := DeadRun{Env: ref.Env, Queue: ref.Queue, Key: ref.Key, ID: ref.ID}
	raw, err := q.rdb.HGet(ctx, qk.Runs(), keys.Segment(ref.ID)).Result()
	if errors.Is(err, redis.Nil) {
		return d, nil
	}
	if err != nil {
		return DeadRun{}, err
	}
	if r, ok := parseRecord(raw); ok {
		d.Attempt, d.Priority, d.Payload = r.att, r.pr, []byte(r.payload)
	}
	return d, nil
}

// Redrive puts a dead-lettered run back in its queue, ready now, with its
// attempts reset. A run that is already live (queued or in flight, for
// instance after a first attempt whose reply was lost and that go-redis
// retried) is left as it is and Redrive succeeds.
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
