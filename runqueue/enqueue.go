package runqueue

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
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
	// A time not after this Queue's now (Config.Clock) makes the run ready
	// at once, so a writer whose clock is ahead of its consumers' makes
	// a run ready early by up to the difference (docs/lifecycle.md, Clocks).
	AvailableAt time.Time
	// Delay delays the run by this much after now. Set at most one of
	// AvailableAt and Delay: both is an *InvalidError, nothing written.
	Delay time.Duration
	// TTL expires the run if it is not dequeued within TTL of being
	// enqueued. Zero means no TTL. A run is never delivered once its TTL
	// passed: a dequeue that comes to it first deletes it instead (told to
	// the Observer as Expired), and the sweeps (ExpireTTL, which a Worker
	// runs every WorkerConfig.SweepInterval on average) delete the others,
	// so that they do not keep their memory and ids. A dequeue sweeps
	// such a run where it meets it, at its key's head, as the sweep would:
	// no serve (with the fair scheduler its key is not charged for it, so
	// a key whose backlog outlives its TTL keeps its share of the
	// deliveries), not counted for the call's maxCount or the key's limit.
	// A script call sweeps at most 100 so (vtime.TTLLook); one past its
	// TTL after those is taken as a run (its key charged, counted for the
	// call's maxCount and key limit, no slot kept) and deleted, and the
	// Dequeue calls again for the rest. The TTL binds until the
	// run's first delivery: a run nacked back or recovered has none. The
	// deadline is by the enqueuing instance's clock, the check by the
	// dequeuing one's (README, "Clocks").
	TTL time.Duration
}

// Enqueue stores and queues a run. It returns true when the run was queued
// and false when a run with the same id, key and payload already exists (an
// idempotent retry): queued, in flight, or dead-lettered (an id is free
// again once its run was acked, expired, or deleted from the dead letters;
// priority, delay and TTL are not compared). The same id with another key
// or payload is ErrConflict; a full
// queue is a *QueueFullError (errors.Is ErrQueueFull). Nothing is written on
// error.
//
// Concurrent Enqueue calls on one Queue are coalesced: runs that arrive
// while earlier calls are in flight are sent together, in one EnqueueMany,
// each with its own result (see Config.SerialCalls). A call alone is sent
// at once. A coalesced call runs with the context values of the first
// caller in it, and with the latest of its callers' deadlines. When ctx
// ends before the run is sent, Enqueue withdraws it and returns ctx.Err(),
// nothing written. Once it is sent, Enqueue waits for its result whatever
// ctx (as a call of its own waits for its reply; the call is bounded by
// the client's timeouts, and by the latest deadline when the client has
// ContextTimeoutEnabled: README, "Deadlines"), so that a retry after
// an error can never be overtaken by the first send: a run queued by the
// retry, served and acked is not queued again by a send that was late.
func (q *Queue) Enqueue(ctx context.Context, p EnqueueParams) (bool, error) {
	// After Close a call goes on its own: Close waits for the senders, and
	// no new run may keep them going (do refuses runs once Close began).
	if !q.cfg.SerialCalls {
		// Bad input and a read-only Queue are refused here, as a call of
		// its own refuses them, whatever the context.
		if err := q.checkEnqueue(&p, q.now()); err != nil {
			return false, err
		}
		if q.scripts.enqueue.refused {
			return false, ErrReadOnly
		}
		// The payload is the caller's again as soon as Enqueue returns,
		// which can be before its send has read it (ctx ended).
		p.Payload = bytes.Clone(p.Payload)
		res, err := q.enq.do(ctx, p)
		if err == nil {
			return res.Queued, res.Err
		}
		if !errors.Is(err, errCoalescerClosed) {
			return false, err
		}
	}
	res, err := q.EnqueueMany(ctx, []EnqueueParams{p})
	if err != nil {
		return false, err
	}
	return res[0].Queued, res[0].Err
}

// EnqueueResult is what became of one run of EnqueueMany.
type EnqueueResult struct {
	// Queued is true when the run was queued, false when it was not: a run
	// with the same id, key and payload already existed (Err nil: an
	// idempotent retry), or Err says why.
	Queued bool
	// Err is nil, an *InvalidError, ErrConflict, a *QueueFullError,
	// ErrReadOnly, or the error of the call that carried the run (Redis or
	// the network). Nothing of a run with an error was written.
	Err error
}

// maxBatch bounds the runs of one script call; a call also stops growing at
// batchBytes of payload.
const (
	maxBatch   = 1000
	batchBytes = 4 << 20
)

// EnqueueMany stores and queues runs, results[i] saying what became of
// runs[i]. Each run is all or nothing and idempotent as with Enqueue; runs
// of one base queue go in one script call (up to 1000 runs or 4 MiB of
// payload each), the calls in one pipeline. A Redis or network error
// returns err with results of the runs whose call did not complete left
// unknown (Queued false, Err the same error). Resend the runs whose result
// has an Err: a run is idempotent on its id while it exists, so a resend of
// the whole batch would queue again a run that was queued, served and acked
// in between. On Redis Cluster, a run whose slot is moving fails with
// TRYAGAIN (or an ASK or MOVED redirection) and nothing written (README,
// "Redis Cluster resharding").
func (q *Queue) EnqueueMany(ctx context.Context, runs []EnqueueParams) ([]EnqueueResult, error) {
	return q.enqueueMany(ctx, runs, true)
}

// enqueueMany is EnqueueMany; observe: tell the Observer what was queued
// (a coalesced send leaves it to each caller, in the caller's goroutine).
func (q *Queue) enqueueMany(ctx context.Context, runs []EnqueueParams, observe bool) ([]EnqueueResult, error) {
	res := make([]EnqueueResult, len(runs))
	now := q.now()
	type batch struct {
		qn    *queueNames
		args  []any
		idx   []int
		bytes int
	}
	var order []*batch
	open := map[*queueNames]*batch{}
	for i := range runs {
		p := &runs[i]
		if err := q.checkEnqueue(p, now); err != nil {
			res[i].Err = err
			continue
		}
		qn := q.names(p.Env, p.Queue)
		b := open[qn]
		if b == nil || len(b.idx) == maxBatch || b.bytes+len(p.Payload) > batchBytes && len(b.idx) > 0 {
			// Room for the runs left (a coalesced call's runs are mostly of
			// one queue), up to a bound: growing the slice run by run
			// copied it several times over.
			room := min(len(runs)-i, 64)
			args := make([]any, 0, enqueueFixedArgs+enqueueRunArgs*room)
			args = append(args, now, qn.vbase, qn.member, qn.wake, q.cfg.MaxQueueDepth,
				q.cfg.MaxKeyDepth, qn.runPrefix, 0)
			b = &batch{qn: qn, args: args, idx: make([]int, 0, room)}
			open[qn] = b
			order = append(order, b)
		}
		b.args = q.appendEnqueueArgs(b.args, p, now)
		b.idx = append(b.idx, i)
		b.bytes += len(p.Payload)
	}
	calls := make([]call, len(order))
	for i, b := range order {
		b.args[enqueueFixedArgs-1] = len(b.idx)
		ks, args := q.withHooks(q.scripts.enqueue, b.qn, b.qn.place, b.args)
		calls[i] = call{sc: q.scripts.enqueue, keys: ks, args: args}
	}
	if len(calls) == 0 {
		return res, nil
	}
	cmds, err := runPipelined(ctx, q.rdb, calls)
	if err != nil && cmds == nil {
		for _, b := range order {
			for _, i := range b.idx {
				res[i].Err = err
			}
		}
		return res, err
	}
	limits := map[string]int{"queue": q.cfg.MaxQueueDepth, "key": q.cfg.MaxKeyDepth}
	var first error
	for ci, cmd := range cmds {
		vals, err := cmd.Slice()
		if err == nil && len(vals) != len(order[ci].idx) {
			err = fmt.Errorf("runqueue: enqueue returned %d results for %d runs", len(vals), len(order[ci].idx))
		}
		queued := 0
		for k, i := range order[ci].idx {
			switch {
			case err != nil:
				res[i].Err = scriptError(err, limits)
				if first == nil {
					first = res[i].Err
				}
			case vals[k] == int64(1):
				res[i].Queued = true
				queued++
			case vals[k] == int64(0):
			default:
				code, _ := vals[k].(string)
				res[i].Err = scriptError(errors.New("RQ_"+strings.ToUpper(code)), limits)
			}
		}
		// Only runs this call queued: an idempotent retry found its run
		// there already and was counted by the call that queued it.
		if observe && q.observe && queued > 0 {
			qk := order[ci].qn.qk
			q.cfg.Observer.Enqueued(qk.Env.Name(), qk.Name(), queued)
		}
	}
	return res, first // (a lost connection: first is the error of a call it cut)
}

// checkEnqueue validates one run.
func (q *Queue) checkEnqueue(p *EnqueueParams, now int64) error {
	if err := checkRef(p.Env, p.Queue, p.Key, p.ID); err != nil {
		return err
	}
	if err := checkNow(now); err != nil {
		return err
	}
	if len(p.Payload) > q.cfg.MaxPayloadBytes {
		return invalid("payload", "is %d bytes, at most %d allowed", len(p.Payload), q.cfg.MaxPayloadBytes)
	}
	if p.Priority < 0 || p.Priority > MaxPriority {
		return invalid("priority", "%d is outside 0..%d", p.Priority, MaxPriority)
	}
	if p.Delay < 0 {
		return invalid("delay", "must not be negative")
	}
	if p.TTL < 0 {
		return invalid("ttl", "must not be negative")
	}
	if !p.AvailableAt.IsZero() && p.Delay != 0 {
		return invalid("delay", "set either AvailableAt or Delay")
	}
	if err := checkDuration("delay", p.Delay, 0); err != nil {
		return err
	}
	if err := checkDuration("ttl", p.TTL, 0); err != nil {
		return err
	}
	if !p.AvailableAt.IsZero() {
		if err := checkTime("availableAt", p.AvailableAt); err != nil {
			return err
		}
	}
	if p.Delay > 0 {
		if err := checkDeadline("delay", now, p.Delay); err != nil {
			return err
		}
	}
	if p.TTL > 0 {
		if err := checkDeadline("ttl", now, p.TTL); err != nil {
			return err
		}
	}
	return nil
}

// The enqueue script's ARGV: enqueueFixedArgs for the call, then
// enqueueRunArgs for each run (lua/enqueue.lua).
const (
	enqueueFixedArgs = 8
	enqueueRunArgs   = 7
)

// appendEnqueueArgs appends the enqueueRunArgs ARGV values of run p.
func (q *Queue) appendEnqueueArgs(args []any, p *EnqueueParams, now int64) []any {
	at := now + ms(p.Delay)
	if !p.AvailableAt.IsZero() {
		at = p.AvailableAt.UnixMilli()
	}
	var expires int64
	if p.TTL > 0 {
		expires = now + max(ms(p.TTL), 1)
	}
	vm := keys.VariantMember(p.Key)
	rec, off := appendRecord(make([]byte, 0, 40+len(vm)+len(p.Payload)), p.Priority, at, expires, vm, p.Payload)
	return append(args, keys.Segment(p.ID), vm, rec, off, at, at-int64(p.Priority)*ms(q.cfg.PriorityStep), expires)
}
