package runqueue

import (
	"context"
	"time"

	"github.com/runqueue/runqueue/keys"
)

// MaxPriority is the highest priority.
const MaxPriority = 9

// EnqueueParams describe one run.
type EnqueueParams struct {
	Env   string // required
	Queue string // required: the base queue
	Key   string // optional concurrency key; "" for none
	ID    string // required: unique within (Env, Queue) while the run exists
	// Payload is stored and returned as is. At most Config.MaxPayloadBytes.
	Payload []byte
	// Priority 0..9: a higher priority is ordered as if it became available
	// Priority*Config.PriorityStep earlier. It never makes a run available
	// before its time.
	Priority int
	// AvailableAt delays the run until then; zero means now (plus Delay).
	AvailableAt time.Time
	// Delay delays the run by this much after now; used when AvailableAt is zero.
	Delay time.Duration
	// TTL expires the run (ExpireTTL) if it is not dequeued within TTL of
	// being enqueued. Zero means no TTL.
	TTL time.Duration
}

// Enqueue stores and queues a run. It returns true when the run was queued
// and false when a run with the same id, key and payload already exists (an
// idempotent retry). The same id with another body is ErrConflict; a full
// queue is a *QueueFullError (errors.Is ErrQueueFull). Nothing is written on
// error.
func (q *Queue) Enqueue(ctx context.Context, p EnqueueParams) (bool, error) {
	if err := checkRef(p.Env, p.Queue, p.Key, p.ID); err != nil {
		return false, err
	}
	if len(p.Payload) > q.cfg.MaxPayloadBytes {
		return false, invalid("payload", "is %d bytes, at most %d allowed", len(p.Payload), q.cfg.MaxPayloadBytes)
	}
	if p.Priority < 0 || p.Priority > MaxPriority {
		return false, invalid("priority", "%d is outside 0..%d", p.Priority, MaxPriority)
	}
	if p.Delay < 0 {
		return false, invalid("delay", "must not be negative")
	}
	if p.TTL < 0 {
		return false, invalid("ttl", "must not be negative")
	}
	if !p.AvailableAt.IsZero() && p.Delay != 0 {
		return false, invalid("delay", "set either AvailableAt or Delay")
	}
	if err := checkDuration("delay", p.Delay, 0); err != nil {
		return false, err
	}
	if err := checkDuration("ttl", p.TTL, 0); err != nil {
		return false, err
	}
	if !p.AvailableAt.IsZero() {
		if err := checkTime("availableAt", p.AvailableAt); err != nil {
			return false, err
		}
	}
	now := q.now()
	if p.Delay > 0 {
		if err := checkDeadline("delay", now, p.Delay); err != nil {
			return false, err
		}
	}
	if p.TTL > 0 {
		if err := checkDeadline("ttl", now, p.TTL); err != nil {
			return false, err
		}
	}
	at := now + ms(p.Delay)
	if !p.AvailableAt.IsZero() {
		at = p.AvailableAt.UnixMilli()
	}
	var expires int64
	if p.TTL > 0 {
		expires = now + max(ms(p.TTL), 1)
	}
	qk := q.space.Env(p.Env).Queue(p.Queue)
	v := qk.Variant(p.Key)
	id := keys.Segment(p.ID)
	ref := keys.Ref{Env: p.Env, Queue: p.Queue, Key: p.Key, ID: p.ID}
	ks := []string{qk.Meta(), v.Ready(), v.Delayed(), qk.CkIndex(), qk.DelayIndex(),
		qk.Depth(), qk.Master(), qk.TTL()}
	args := []any{now, id, v.Member(), p.Payload, p.Priority, at, at - int64(p.Priority)*ms(q.cfg.PriorityStep),
		expires, keys.RunMember(ref), qk.Member(), q.cfg.MaxQueueDepth, q.cfg.MaxKeyDepth, qk.Wake()}
	ks, args = q.withHooks(q.scripts.enqueue, qk, ks, args)
	n, err := run(ctx, q.rdb, q.scripts.enqueue, ks, args...).Int()
	if err != nil {
		return false, scriptError(err, map[string]int{"queue": q.cfg.MaxQueueDepth, "key": q.cfg.MaxKeyDepth})
	}
	return n == 1, nil
}
