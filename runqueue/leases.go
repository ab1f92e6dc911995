package runqueue

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/runqueue/runqueue/keys"
)

// Ack completes a run: it is removed everywhere and its concurrency released.
// Ack is idempotent: acking a run that no longer exists (acked before, for
// instance by a first attempt whose reply was lost and that go-redis
// retried) succeeds. A holder whose lease was recovered gets ErrNotInFlight
// while the run waits to be delivered again, ErrLeaseLost once it was.
//
// Concurrent Ack calls on one Queue are coalesced into AckMany calls as
// Enqueue calls are (see Enqueue and Config.SerialCalls); when ctx ends
// first, Ack returns ctx.Err() and a retry is safe.
func (q *Queue) Ack(ctx context.Context, r *Run) error {
	if !q.cfg.SerialCalls { // (after Close, a call of its own: see Enqueue)
		if err := checkRun(r); err != nil {
			return err
		}
		if q.scripts.ack.refused {
			return ErrReadOnly
		}
		// What the send reads, copied: the Run is the caller's again as
		// soon as Ack returns (and ExtendLease may write its deadline).
		rc := Run{Env: r.Env, Queue: r.Queue, Key: r.Key, ID: r.ID, Token: r.Token}
		res, err := q.ack.do(ctx, &rc)
		if err == nil {
			return res.err
		}
		if !errors.Is(err, errCoalescerClosed) {
			return err
		}
	}
	errs, err := q.AckMany(ctx, []*Run{r})
	if err != nil {
		return err
	}
	return errs[0]
}

// AckMany acks runs, errs[i] saying what became of runs[i] (nil: acked, or
// gone already), as Ack does for one. Runs of one base queue go in one
// script call (up to 1000 each), the calls in one pipeline. A Redis or
// network error is returned as err (every errs[i] of a call that did not
// complete is that error too); a retry is safe.
func (q *Queue) AckMany(ctx context.Context, runs []*Run) ([]error, error) {
	errs, err := q.ackMany(ctx, runs, true)
	return goneIsAcked(errs), err
}

// errGoneBefore is an ack's result, inside the package, when the run was
// gone before it (acked before, by this holder's earlier call or by
// another delivery's holder; or expired): the public calls answer nil
// (goneIsAcked), and a nil result inside means acked by that call.
var errGoneBefore = errors.New("runqueue: run gone before the ack")

// goneIsAcked maps errGoneBefore in errs to nil, as the public acks
// answer: an ack of a run that is gone succeeds.
func goneIsAcked(errs []error) []error {
	for i, e := range errs {
		if e == errGoneBefore {
			errs[i] = nil
		}
	}
	return errs
}

// ackResult is what became of one coalesced Ack: acked is true when this
// call acked the run (not when it was gone already).
type ackResult struct {
	err   error
	acked bool
}

// ackMany is AckMany with errGoneBefore for the runs that were gone
// already: errs[i] is nil when runs[i] was acked by this call. observe:
// tell the Observer what was acked (a coalesced send leaves it to each
// caller, in the caller's goroutine).
func (q *Queue) ackMany(ctx context.Context, runs []*Run, observe bool) ([]error, error) {
	errs := make([]error, len(runs))
	now, err := q.clockNow()
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs, err
	}
	type batch struct {
		qn   *queueNames
		args []any
		idx  []int
	}
	var order []*batch
	open := map[*queueNames]*batch{}
	for i, r := range runs {
		if err := checkRun(r); err != nil {
			errs[i] = err
			continue
		}
		qn := q.names(r.Env, r.Queue)
		b := open[qn]
		if b == nil || len(b.idx) == maxBatch {
			b = &batch{qn: qn, args: []any{now, qn.runPrefix, 0}}
			open[qn] = b
			order = append(order, b)
		}
		b.args = append(b.args, keys.VariantMember(r.Key), keys.Segment(r.ID), r.Token)
		b.idx = append(b.idx, i)
	}
	if len(order) == 0 {
		return errs, nil
	}
	calls := make([]call, len(order))
	for i, b := range order {
		b.args[2] = len(b.idx)
		lim := q.lenientLimits(b.qn.qk)
		sc := q.ackScript(lim)
		ks, args := q.withRelease(sc, b.qn, b.qn.held, b.args, lim)
		calls[i] = call{sc: sc, keys: ks, args: args}
	}
	cmds, err := runPipelined(ctx, q.rdb, calls)
	if err != nil && cmds == nil {
		for _, b := range order {
			for _, i := range b.idx {
				errs[i] = err
			}
		}
		return errs, err
	}
	// With a connection lost part way (err with cmds), the calls answered
	// before it ran: each cmd says what its call did, and the others carry
	// the error.
	var first error
	for ci, cmd := range cmds {
		vals, err := cmd.Slice()
		if err == nil && len(vals) != len(order[ci].idx) {
			err = fmt.Errorf("runqueue: ack returned %d results for %d runs", len(vals), len(order[ci].idx))
		}
		n := 0
		for k, i := range order[ci].idx {
			switch {
			case err != nil:
				errs[i] = scriptError(err, nil)
				if first == nil {
					first = errs[i]
				}
			case vals[k] == int64(1):
				n++
			case vals[k] == int64(0):
				// Gone already: acked by an earlier call, which counted it.
				errs[i] = errGoneBefore
			default:
				errs[i] = heldError(vals[k])
			}
		}
		if observe && q.observe && n > 0 {
			qk := order[ci].qn.qk
			q.cfg.Observer.Acked(qk.Env.Name(), qk.Name(), n)
		}
	}
	if first == nil {
		first = err
	}
	return errs, first
}

// heldError maps an error code of lib/held.lua to its error.
func heldError(v any) error {
	code, _ := v.(string)
	return scriptError(errors.New("RQ_"+strings.ToUpper(code)), nil)
}

// ExtendLease moves the lease deadline of a held run to now + d (a heartbeat).
func (q *Queue) ExtendLease(ctx context.Context, r *Run, d time.Duration) error {
	if err := checkRun(r); err != nil {
		return err
	}
	if d <= 0 {
		return invalid("duration", "must be positive")
	}
	if err := checkDuration("duration", d, time.Nanosecond); err != nil {
		return err
	}
	now, err := q.clockNow()
	if err != nil {
		return err
	}
	if err := checkDeadline("duration", now, d); err != nil {
		return err
	}
	deadline := now + max(ms(d), 1)
	c := q.extendCall(r, deadline)
	err = run(ctx, q.rdb, c.sc, c.keys, c.args...).Err()
	if err == nil {
		r.LeaseDeadline = time.UnixMilli(deadline)
	}
	return scriptError(err, nil)
}

// extendCall builds the extend script call that moves r's lease deadline
// to deadline (ms); a Worker sends those of all its running runs in one
// pipeline.
func (q *Queue) extendCall(r *Run, deadline int64) call {
	qk := q.space.Env(r.Env).Queue(r.Queue)
	return call{sc: q.scripts.extend, keys: []string{qk.Runs(), qk.Held(), qk.Leases()},
		args: []any{keys.Segment(r.ID), keys.VariantMember(r.Key), keys.RunMember(r.ref()), r.Token, deadline}}
}

// NackOptions choose what Nack does; nil means retry with backoff.
type NackOptions struct {
	// RetryAt retries at this time; zero means now + Backoff(attempt). A
	// time already past makes the run ready at once and as old as that
	// time: NackResult.RetryAt, the next delivery's AvailableAt and
	// Stats.OldestReadyAge say so, and with the flag off it goes ahead of
	// runs that became ready after it (a retry at its first AvailableAt
	// keeps its place in age order). Past means by this Queue's clock
	// (Config.Clock): a nack from an instance whose clock is ahead of its
	// consumers' makes the run ready early by up to the difference
	// (docs/lifecycle.md, Clocks).
	RetryAt time.Time
	// DeadLetter dead-letters the run now, whatever attempts are left.
	DeadLetter bool
}

// NackResult says what became of a nacked run.
type NackResult struct {
	// Requeued is true when the run will be retried, false when it was
	// dead-lettered.
	Requeued bool
	// Attempt is the attempt number of its next delivery (or of the one it
	// died at + 1).
	Attempt int
	// RetryAt is when it becomes ready again (zero when dead-lettered).
	RetryAt time.Time
}

// Backoff returns the default retry delay after a failed delivery attempt:
// BackoffBase*2^(attempt-1), at most BackoffMax, times a jitter factor.
func (q *Queue) Backoff(attempt int) time.Duration {
	d := float64(q.cfg.BackoffBase) * math.Pow(2, float64(max(attempt, 1)-1))
	d = math.Min(d, float64(q.cfg.BackoffMax))
	if j := q.cfg.BackoffJitter; j > 0 {
		q.rrMu.Lock()
		f := 1 - j + 2*j*q.cfg.Rand.Float64()
		q.rrMu.Unlock()
		d *= f
	}
	return time.Duration(d)
}

// Nack gives a held run back: retried later with attempt + 1, or
// dead-lettered when it has no attempts left (Config.MaxAttempts) or opts
// asks for it.
func (q *Queue) Nack(ctx context.Context, r *Run, opts *NackOptions) (NackResult, error) {
	if err := checkRun(r); err != nil {
		return NackResult{}, err
	}
	if opts == nil {
		opts = &NackOptions{}
	}
	if !opts.RetryAt.IsZero() {
		if err := checkTime("retryAt", opts.RetryAt); err != nil {
			return NackResult{}, err
		}
	}
	now, err := q.clockNow()
	if err != nil {
		return NackResult{}, err
	}
	retry := opts.RetryAt.UnixMilli()
	if opts.RetryAt.IsZero() {
		backoff := q.Backoff(r.Attempt)
		retry = now + ms(backoff)
		if err := checkDeadline("retryAt", now, backoff); err != nil {
			// A run the script dead-letters uses no retry time: at the end
			// of the range its nack is not refused for one (the last time
			// goes in its place, should the script retry it after all).
			if !opts.DeadLetter && (q.cfg.MaxAttempts <= 0 || r.Attempt < q.cfg.MaxAttempts) {
				return NackResult{}, err
			}
			retry = MaxTimeUnixMilli
		}
	}
	res, err := q.requeue(ctx, r.ref(), r.Token, now, retry, opts.DeadLetter)
	if err == nil && q.observe {
		q.cfg.Observer.Nacked(r.Env, r.Queue, res.Requeued)
	}
	return res, err
}

// requeueCall builds the requeue script call of a held run.
func (q *Queue) requeueCall(ref keys.Ref, token, now, retry int64, kill bool) call {
	return q.requeueCallMax(ref, token, now, retry, kill, q.cfg.MaxAttempts)
}

// releaseCall gives r back, ready at retry, never dead-lettered for it (no
// attempt limit; its attempt counts one more): a Worker's release at
// Shutdown (retry now), and of a run whose handler it cancelled because
// its lease might run out unextended (giveBack).
func (q *Queue) releaseCall(r *Run, now, retry int64) call {
	return q.requeueCallMax(r.ref(), r.Token, now, retry, false, 0)
}

// requeueCallMax is requeueCall with the attempt limit given; 0 or
// negative means none (a Worker releasing runs at shutdown must not
// dead-letter one that was only interrupted).
func (q *Queue) requeueCallMax(ref keys.Ref, token, now, retry int64, kill bool, maxAttempts int) call {
	return q.requeueCallRaw(q.names(ref.Env, ref.Queue), rawRef{encID: keys.Segment(ref.ID), vm: keys.VariantMember(ref.Key)},
		token, now, retry, kill, maxAttempts)
}

// rawRef names a run of a queue by its encoded id and variant member as
// stored, which need not decode: a member of a ready set or of a shard's
// leases that runqueue did not write (a hand edit) is served or recovered
// by these names, so that its hold and slots are released.
type rawRef struct{ encID, vm string }

// requeueCallRaw is requeueCallMax for a run of qn named by r.
func (q *Queue) requeueCallRaw(qn *queueNames, r rawRef, token, now, retry int64, kill bool, maxAttempts int) call {
	qk := qn.qk
	ks := placeKeys(qk, qk.Held(), qk.KeyInflight(), qk.Env.InflightCount(), qk.Leases(), qk.Dead(), qk.Env.Dead())
	killArg := 0
	if kill {
		killArg = 1
	}
	maxAttempts = max(maxAttempts, 0)
	args := []any{now, r.encID, r.vm, qn.runPrefix + r.vm + ":" + r.encID, token, retry,
		ms(q.cfg.PriorityStep), maxAttempts, killArg, qn.member, qn.wake, qn.vbase}
	ks, args = q.withRelease(q.scripts.requeue, qn, ks, args, q.lenientLimits(qk))
	return call{sc: q.scripts.requeue, keys: ks, args: args}
}

func (q *Queue) requeue(ctx context.Context, ref keys.Ref, token, now, retry int64, kill bool) (NackResult, error) {
	c := q.requeueCall(ref, token, now, retry, kill)
	res, err := run(ctx, q.rdb, c.sc, c.keys, c.args...).Int64Slice()
	if err != nil {
		return NackResult{}, scriptError(err, nil)
	}
	out := NackResult{Requeued: res[0] == 1, Attempt: int(res[1])}
	if out.Requeued {
		out.RetryAt = time.UnixMilli(retry)
		if len(res) > 2 { // a retried nack: the time its first call set
			out.RetryAt = time.UnixMilli(res[2])
		}
	}
	return out, nil
}
