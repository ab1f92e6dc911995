package runqueue

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/keys"
)

func checkRun(r *Run) error {
	if r == nil {
		return invalid("run", "must not be nil")
	}
	if err := checkRef(r.Env, r.Queue, r.Key, r.ID); err != nil {
		return err
	}
	if r.Token <= 0 {
		return invalid("token", "must come from a dequeued run")
	}
	return nil
}

// Ack completes a run: it is removed everywhere and its concurrency released.
// Ack is idempotent: acking a run that no longer exists (acked before, for
// instance by a first attempt whose reply was lost and that go-redis
// retried) succeeds. A holder whose lease was recovered gets ErrNotInFlight
// while the run waits to be delivered again, ErrLeaseLost once it was.
func (q *Queue) Ack(ctx context.Context, r *Run) error {
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
	errs := make([]error, len(runs))
	now := q.now()
	type batch struct {
		qk   keys.Queue
		args []any
		idx  []int
	}
	var order []*batch
	open := map[keys.Queue]*batch{}
	for i, r := range runs {
		if err := checkRun(r); err != nil {
			errs[i] = err
			continue
		}
		qk := q.space.Env(r.Env).Queue(r.Queue)
		b := open[qk]
		if b == nil || len(b.idx) == maxBatch {
			b = &batch{qk: qk, args: []any{now, keys.RunPrefix(r.Env, r.Queue), 0}}
			open[qk] = b
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
		ks, args := q.withHooks(q.scripts.ack, b.qk, q.heldKeys(b.qk), b.args)
		calls[i] = call{sc: q.scripts.ack, keys: ks, args: args}
	}
	cmds, err := runPipelined(ctx, q.rdb, calls)
	if err != nil {
		for _, b := range order {
			for _, i := range b.idx {
				errs[i] = err
			}
		}
		return errs, err
	}
	var first error
	for ci, cmd := range cmds {
		vals, err := cmd.Slice()
		if err == nil && len(vals) != len(order[ci].idx) {
			err = fmt.Errorf("runqueue: ack returned %d results for %d runs", len(vals), len(order[ci].idx))
		}
		acked := 0
		for k, i := range order[ci].idx {
			switch {
			case err != nil:
				errs[i] = scriptError(err, nil)
				if first == nil {
					first = errs[i]
				}
			case vals[k] == int64(1):
				acked++
			case vals[k] == int64(0):
				// Gone already: acked by an earlier call, which counted it.
			default:
				errs[i] = heldError(vals[k])
			}
		}
		if q.observe && acked > 0 {
			qk := order[ci].qk
			q.cfg.Observer.Acked(qk.Env.Name(), qk.Name(), acked)
		}
	}
	return errs, first
}

// heldKeys are the keys of a queue's in-flight bookkeeping, in the order the
// ack script and the dequeue's acks take them.
func (q *Queue) heldKeys(qk keys.Queue) []string {
	return []string{qk.Runs(), qk.Held(), qk.KeyInflight(), qk.Env.InflightCount(), qk.Leases()}
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
	now := q.now()
	if err := checkDeadline("duration", now, d); err != nil {
		return err
	}
	deadline := now + max(ms(d), 1)
	c := q.extendCall(r, deadline)
	err := run(ctx, q.rdb, c.sc, c.keys, c.args...).Err()
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
	// RetryAt retries at this time; zero means now + Backoff(attempt).
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
	now := q.now()
	retry := opts.RetryAt.UnixMilli()
	if opts.RetryAt.IsZero() {
		retry = now + ms(q.Backoff(r.Attempt))
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

// requeueCallMax is requeueCall with the attempt limit given; 0 or
// negative means none (a Worker releasing runs at shutdown must not
// dead-letter one that was only interrupted).
func (q *Queue) requeueCallMax(ref keys.Ref, token, now, retry int64, kill bool, maxAttempts int) call {
	qk := q.space.Env(ref.Env).Queue(ref.Queue)
	v := qk.Variant(ref.Key)
	ks := []string{qk.Runs(), qk.CkIndex(), qk.DelayIndex(), qk.Depth(), qk.Master(),
		qk.Held(), qk.KeyInflight(), qk.Env.InflightCount(), qk.Leases(), qk.Dead(), qk.Env.Dead()}
	killArg := 0
	if kill {
		killArg = 1
	}
	maxAttempts = max(maxAttempts, 0)
	args := []any{now, keys.Segment(ref.ID), v.Member(), keys.RunMember(ref), token, retry,
		ms(q.cfg.PriorityStep), maxAttempts, killArg, qk.Member(), qk.Wake(), qk.VariantBase()}
	ks, args = q.withHooks(q.scripts.requeue, qk, ks, args)
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
	}
	return out, nil
}

// RecoverLeases requeues (attempt + 1, ready now) up to limit runs of shard
// whose lease deadline passed, or dead-letters those without attempts left.
// Any number of instances may run it concurrently: each run is recovered
// once. It returns how many runs it recovered or dead-lettered.
func (q *Queue) RecoverLeases(ctx context.Context, shard, limit int) (int, error) {
	now := q.now()
	var tally queueTally
	n, err := q.sweep(ctx, shard, limit, keys.Shard.Leases, now,
		func(ref keys.Ref, _ string) call { return q.requeueCall(ref, 0, now, now, false) },
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
	if shard < 0 || shard >= q.space.Shards() {
		return invalid("shard", "%d is outside 0..%d", shard, q.space.Shards()-1)
	}
	if limit <= 0 || limit > 100000 {
		return invalid("limit", "%d is outside 1..100000", limit)
	}
	return nil
}

// ExpireTTL removes up to limit queued runs of shard whose TTL passed before
// they were dequeued, and returns how many it expired.
func (q *Queue) ExpireTTL(ctx context.Context, shard, limit int) (int, error) {
	now := q.now()
	sh := q.space.Shard(max(0, shard))
	var tally queueTally
	n, err := q.sweep(ctx, shard, limit, keys.Shard.TTL, now,
		func(ref keys.Ref, member string) call {
			qk := q.space.Env(ref.Env).Queue(ref.Queue)
			v := qk.Variant(ref.Key)
			ks := []string{qk.Runs(), qk.CkIndex(), qk.DelayIndex(), qk.Depth(), qk.Master(), sh.TTL()}
			args := []any{now, keys.Segment(ref.ID), v.Member(), member, qk.Member(), qk.VariantBase()}
			ks, args = q.withHooks(q.scripts.expire, qk, ks, args)
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
// so the caller knows the env and queue of what it counts.
func (q *Queue) sweep(ctx context.Context, shard, limit int, set func(keys.Shard) string, now int64,
	build func(ref keys.Ref, member string) call, count func(keys.Ref, *redis.Cmd) (int, error)) (int, error) {
	if err := q.checkSweep(shard, limit); err != nil {
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
		ref, err := keys.DecodeRunMember(m)
		if err != nil {
			continue // not a member runqueue wrote; never crash a sweeper on it
		}
		calls = append(calls, build(ref, m))
		refs = append(refs, ref)
	}
	n := 0
	for len(calls) > 0 {
		chunk := calls[:min(len(calls), 500)]
		chunkRefs := refs[:len(chunk)]
		calls, refs = calls[len(chunk):], refs[len(chunk):]
		cmds, err := runPipelined(ctx, q.rdb, chunk)
		if err != nil {
			return n, err
		}
		for i, cmd := range cmds {
			got, err := count(chunkRefs[i], cmd)
			if err != nil {
				return n, err
			}
			n += got
		}
	}
	return n, nil
}

// Redrive puts a dead-lettered run back in its queue, ready now, with its
// attempts reset. A run that is already live (queued or in flight, for
// instance after a first attempt whose reply was lost and that go-redis
// retried) is left as it is and Redrive succeeds.
func (q *Queue) Redrive(ctx context.Context, env, queue, key, id string) error {
	if err := checkRef(env, queue, key, id); err != nil {
		return err
	}
	qk := q.space.Env(env).Queue(queue)
	v := qk.Variant(key)
	ref := keys.Ref{Env: env, Queue: queue, Key: key, ID: id}
	ks := []string{qk.Runs(), qk.CkIndex(), qk.DelayIndex(), qk.Depth(), qk.Master(), qk.Dead(), qk.Env.Dead()}
	args := []any{q.now(), keys.Segment(id), v.Member(), keys.RunMember(ref), ms(q.cfg.PriorityStep), qk.Member(), qk.Wake(),
		qk.VariantBase()}
	ks, args = q.withHooks(q.scripts.redrive, qk, ks, args)
	return scriptError(run(ctx, q.rdb, q.scripts.redrive, ks, args...).Err(), nil)
}
