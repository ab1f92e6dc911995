package runqueue_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// failPipelines, once on, fails every pipeline of its client as a lost
// connection would (the Worker's heartbeat sends its lease extensions in
// one), without sending it.
// With hang on too, a pipeline neither answers nor fails until release
// is closed, whatever its context says: as go-redis (without
// ContextTimeoutEnabled) reads a connection to a paused or unreachable
// server until ReadTimeout. With slow set, a pipeline is sent after that
// long (or fails when its context ends first).
//
// With all set, single commands fail too while on (a Redis out of reach
// fails both). With refused set too, they fail as go-redis fails a call
// to a server that refuses connections (a *net.OpError, which the Worker
// sends again); else with an error the Worker does not send again.
type failPipelines struct {
	nopHook
	on, hang     atomic.Bool
	all, refused bool
	release      chan struct{}
	slow         time.Duration
}

func (h *failPipelines) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.all && h.on.Load() {
			err := errors.New("dial tcp: connect: connection refused")
			if h.refused {
				err = &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
			}
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

func (h *failPipelines) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.slow > 0 {
			select {
			case <-time.After(h.slow):
			case <-ctx.Done():
				for _, c := range cmds {
					c.SetErr(ctx.Err())
				}
				return ctx.Err()
			}
		}
		if !h.on.Load() {
			return next(ctx, cmds)
		}
		err := errors.New("dial tcp: connect: connection refused")
		if h.hang.Load() {
			<-h.release
			err = errors.New("i/o timeout")
		}
		for _, c := range cmds {
			c.SetErr(err)
		}
		return err
	}
}

// TestWorkerLeaseRunsOutUnextended: while a Worker cannot reach Redis to
// extend a lease, its handler runs on until the lease would run out before
// the next beat, and then its context is cancelled (the outcome is
// OutcomeLeaseLost), before a sweep elsewhere may deliver the run again.
// By the clock (Config.Clock within a beat of the deadline) and by
// monotonic time (the clock standing still). helper-115 met it with a Redis
// killed for longer than the lease: the handler kept running beside the
// run's next delivery. Before, the Worker only cancelled on a lease found
// lost, so these handlers were never cancelled.
func TestWorkerLeaseRunsOutUnextended(t *testing.T) {
	t.Parallel()
	for _, byClock := range []bool{true, false} {
		t.Run(fmt.Sprintf("byClock=%v", byClock), func(t *testing.T) {
			// Every call fails, the handler's nack too (else the nack of a
			// handler the expiry timer cancelled, a quarter beat before
			// the lease runs out, would be answered: OutcomeRetry).
			hook := &failPipelines{all: true}
			c := hookedReal(t, hook)
			lease := 10 * time.Second
			if !byClock {
				lease = 1500 * time.Millisecond
			}
			o := newS16Observer()
			b := setup(t, c, func(cfg *runqueue.Config) { cfg.LeaseDuration = lease; cfg.Observer = o })
			started := make(chan struct{})
			cancelled := make(chan struct{})
			w := startWorker(t, b.q, func(ctx context.Context, _ *runqueue.Run) error {
				close(started)
				<-ctx.Done()
				close(cancelled)
				return ctx.Err()
			}, oneSlot(50*time.Millisecond))
			enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
			waitClosed(t, started)
			hook.on.Store(true)
			if byClock {
				// Within the lease: beats fail, the handler runs on.
				b.clock.Advance(lease / 2)
				select {
				case <-cancelled:
					t.Fatal("cancelled while its lease still ran")
				case <-time.After(300 * time.Millisecond):
				}
				// Within one beat of its deadline, not past it: the next
				// beat would come too late to extend it.
				b.clock.Advance(lease/2 - 30*time.Millisecond)
			}
			select {
			case <-cancelled:
			case <-time.After(10 * time.Second):
				t.Fatal("the handler's context was not cancelled after its lease ran out unextended")
			}
			require.Equal(t, runqueue.OutcomeLeaseLost, o.next(t))
			hook.on.Store(false)
			shutdown(t, w)
		})
	}
}

// TestWorkerLeaseRunsOutWhileABeatHangs: a beat whose pipeline neither
// answers nor fails (a paused Redis; a stalled connection, which go-redis
// reads until ReadTimeout whatever the context says) must not keep the
// handler running past its lease, when another instance's sweep may
// deliver the run again. CI met it (TestS35TroubleHeartbeatGap): a beat
// held by go-redis redialling a stopped Redis failed after the lease had
// run out and judged it by the time the beat began, so the handler ran on
// beside the run's next delivery. Before, the Worker cancelled a handler
// only when a beat's call ended, so here it was never cancelled; with a
// deadline on the beat's calls (ffc6155, helper-134), a client that does
// not heed it kept the handler 4 s past its lease. The clock stands still
// (Config.Clock is the test's): only monotonic time runs.
func TestWorkerLeaseRunsOutWhileABeatHangs(t *testing.T) {
	t.Parallel()
	hook := &failPipelines{release: make(chan struct{})}
	hook.hang.Store(true)
	c := hookedReal(t, hook)
	// A long beat, so the margin the bound below leaves the cancel (a
	// quarter beat, 1 s) is not the machine's speed (helper-215: 250 ms at
	// a 1 s beat).
	lease, beat := 12*time.Second, 4*time.Second
	o := newS16Observer()
	b := setup(t, c, func(cfg *runqueue.Config) { cfg.LeaseDuration = lease; cfg.Observer = o; cfg.MaxAttempts = 1 })
	var began time.Time
	var deliveries atomic.Int32
	started := make(chan struct{})
	cancelled := make(chan time.Time, 1)
	w := startWorker(t, b.q, func(ctx context.Context, _ *runqueue.Run) error {
		if deliveries.Add(1) > 1 {
			return nil // given back, it comes again
		}
		began = time.Now()
		close(started)
		<-ctx.Done()
		cancelled <- time.Now()
		return ctx.Err()
	}, oneSlot(beat))
	var once sync.Once
	release := func() { once.Do(func() { close(hook.release) }) }
	t.Cleanup(release)     // before the Worker's and the Queue's, on a failure
	enqueued := time.Now() // before the fetch that sets the lease
	enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
	waitClosed(t, started)
	hook.on.Store(true)
	select {
	case at := <-cancelled:
		// The timer counts from the fetch's start, before began: the
		// handler is cancelled a quarter beat (1 s) before the lease
		// runs out, not a whole beat before (the failing beats of
		// TestWorkerLeaseRunsOutUnextended cancel earlier, by lapse).
		// (Both bounds err on the safe side: the lease is set after the
		// enqueue and before began.)
		require.Less(t, at.Sub(enqueued), lease, "cancelled after its lease ran out")
		require.Greater(t, at.Sub(began), lease-beat, "cancelled more than a beat before its lease ran out")
	case <-time.After(lease + 10*time.Second):
		t.Fatal("the handler's context was not cancelled while its beats hung past the lease")
	}
	// The run is still this delivery's (the clock stands still, so no
	// lease runs out in Redis) and is given back ready, a single call,
	// answered: not nacked, which at MaxAttempts 1 dead-lettered it
	// (helper-136 on 474100c: OutcomeDead for the Worker's own cancel).
	require.Equal(t, runqueue.OutcomeRetry, o.next(t))
	hook.on.Store(false)
	release()
	require.Zero(t, queueStats(t, b, queueName).Dead, "dead-lettered for the Worker's own cancel")
	shutdown(t, w)
}

// TestWorkerSlowRedisKeepsLease: extensions that answer late but within
// the lease keep the handler running (helper-134 met ffc6155 cancelling
// it: that beat gave its calls up after an interval). Every pipeline
// waits 1.2 s, more than an interval, before it is sent; the handler runs
// 5 s, past the 4 s lease, and its run is acked once.
func TestWorkerSlowRedisKeepsLease(t *testing.T) {
	t.Parallel()
	hook := &failPipelines{slow: 1200 * time.Millisecond}
	c := hookedReal(t, hook)
	o := newS16Observer()
	b := setup(t, c, func(cfg *runqueue.Config) { cfg.LeaseDuration = 4 * time.Second; cfg.Observer = o })
	var calls atomic.Int32
	w := startWorker(t, b.q, func(ctx context.Context, _ *runqueue.Run) error {
		calls.Add(1)
		select {
		case <-time.After(5 * time.Second):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}, oneSlot(time.Second))
	enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
	require.Equal(t, runqueue.OutcomeAck, o.next(t))
	require.EqualValues(t, 1, calls.Load())
	shutdown(t, w)
}

// oneSlot is a Worker's configuration for these tests: one handler at a
// time, beats every beat, no sweeps, quiet.
func oneSlot(beat time.Duration) func(*runqueue.WorkerConfig) {
	return func(wc *runqueue.WorkerConfig) {
		wc.Concurrency = 1
		wc.HeartbeatInterval = beat
		wc.SweepInterval = -1
		wc.Logger = quietLogger
	}
}

// lapsed is a Worker (Concurrency 1, beats of 50 ms, a 10 s lease, no
// sweeps) on a real Redis behind hook, whose run's handler lapse has
// cancelled (see startLapsed).
type lapsed struct {
	b          *testBundle
	w          *runqueue.Worker
	o          *s16Observer
	lease      time.Duration
	finish     chan struct{} // closed: the first delivery's handler returns result(ctx)
	deliveries atomic.Int32
}

// startLapsed queues a run for a new lapsed Worker, waits for its handler,
// has hook fail pipelines (the beats), advances Config.Clock to within a
// beat of the lease's end and returns once lapse has cancelled the
// handler. Later deliveries return nil at once.
func startLapsed(t *testing.T, hook *failPipelines, maxAttempts int, result func(ctx context.Context) error) *lapsed {
	t.Helper()
	l := &lapsed{o: newS16Observer(), lease: 10 * time.Second, finish: make(chan struct{})}
	l.b = setup(t, hookedReal(t, hook), func(cfg *runqueue.Config) {
		cfg.LeaseDuration, cfg.Observer, cfg.MaxAttempts = l.lease, l.o, maxAttempts
	})
	started, cancelled := make(chan struct{}), make(chan struct{})
	l.w = startWorker(t, l.b.q, func(ctx context.Context, _ *runqueue.Run) error {
		if l.deliveries.Add(1) > 1 {
			return nil
		}
		close(started)
		<-ctx.Done()
		close(cancelled)
		<-l.finish
		return result(ctx)
	}, oneSlot(50*time.Millisecond))
	enqueue(t, l.b, runqueue.EnqueueParams{ID: "r"})
	waitClosed(t, started)
	hook.on.Store(true)
	l.b.clock.Advance(l.lease - 30*time.Millisecond)
	waitClosed(t, cancelled)
	return l
}

// TestWorkerLapseKeepsRun: a handler cancelled because its extensions
// failed until its lease would run out before the next beat (lapse) keeps
// its run when Redis answers again within the lease, as one its expiry
// timer cancelled does. Its run was marked lost, its handler's result
// dropped: returning nil, it stayed in flight to be recovered and run
// again; returning the cancel's error, it waited out its lease and its
// recovery counted the attempt (dead-lettered at MaxAttempts 1). Now the
// first is acked and the second given back ready at once, not dead.
// Only pipelines fail (the beat's), and Config.Clock is advanced to
// within a beat of the deadline, so lapse acts, not the expiry timer.
func TestWorkerLapseKeepsRun(t *testing.T) {
	t.Parallel()
	for _, heed := range []bool{true, false} {
		t.Run(fmt.Sprintf("heed=%v", heed), func(t *testing.T) {
			hook := &failPipelines{}
			l := startLapsed(t, hook, 1, func(ctx context.Context) error {
				if heed {
					return ctx.Err()
				}
				return nil
			})
			hook.on.Store(false) // Redis answers again within the lease
			close(l.finish)
			if heed {
				require.Equal(t, runqueue.OutcomeRetry, l.o.next(t))
			}
			require.Equal(t, runqueue.OutcomeAck, l.o.next(t))
			shutdown(t, l.w)
			want := int32(1)
			if heed {
				want = 2 // given back, it came again
			}
			require.Equal(t, want, l.deliveries.Load())
			st := queueStats(t, l.b, queueName)
			require.Equal(t, runqueue.Stats{}, runqueue.Stats{Ready: st.Ready, Delayed: st.Delayed, InFlight: st.InFlight, Dead: st.Dead})
		})
	}
}

// TestWorkerLapseKeepsVerdict: a handler cancelled by lapse (its
// extensions failing) that returns NoRetry has its run dead-lettered, and
// one that returns RetryAfter or RetryAt has it retried at that time. Any
// error after such a cancel was given back ready now: a poison run was
// delivered again at once (and again after each outage that cut it), a
// rate-limited one early. A RetryAt or RetryAfter is still not counted
// against MaxAttempts (helper-143: a handler that wraps every failure in
// one, the cancel's included, had a healthy run dead-lettered at
// MaxAttempts 1 by one outage). A retry time out of range is the backoff,
// as for a nack.
func TestWorkerLapseKeepsVerdict(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		maxAttempts int
		result      func(ctx context.Context) error
		outcome     runqueue.Outcome
		dead        bool
	}{
		{"NoRetry", 0, func(ctx context.Context) error { return runqueue.NoRetry(context.Cause(ctx)) }, runqueue.OutcomeDead, true},
		{"RetryAfter", 0, func(ctx context.Context) error { return runqueue.RetryAfter(ctx.Err(), time.Hour) }, runqueue.OutcomeRetry, false},
		{"RetryAt", 0, func(ctx context.Context) error {
			return fmt.Errorf("rate limited: %w", runqueue.RetryAt(ctx.Err(), time.UnixMilli(1).Add(100*365*24*time.Hour)))
		}, runqueue.OutcomeRetry, false},
		{"RetryAfterAtMaxAttempts", 1, func(ctx context.Context) error {
			return runqueue.RetryAfter(fmt.Errorf("GET upstream: %w", ctx.Err()), time.Hour)
		}, runqueue.OutcomeRetry, false},
		// Out of range: the backoff, as a nack's (helper-144: ready at once).
		{"RetryAtOutOfRange", 0, func(ctx context.Context) error {
			return runqueue.RetryAt(ctx.Err(), time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC))
		}, runqueue.OutcomeRetry, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hook := &failPipelines{}
			l := startLapsed(t, hook, tc.maxAttempts, tc.result)
			hook.on.Store(false) // Redis answers again within the lease
			close(l.finish)
			require.Equal(t, tc.outcome, l.o.next(t))
			shutdown(t, l.w)
			require.Equal(t, int32(1), l.deliveries.Load(), "not delivered again")
			st := queueStats(t, l.b, queueName)
			want := runqueue.Stats{Delayed: 1}
			if tc.dead {
				want = runqueue.Stats{Dead: 1}
			}
			require.Equal(t, want, runqueue.Stats{Ready: st.Ready, Delayed: st.Delayed, InFlight: st.InFlight, Dead: st.Dead})
		})
	}
}

// TestWorkerLapsedAckAfterAnotherDelivery: a handler cancelled by lapse
// (its extensions failing) returns nil only after its lease ran out and
// another instance recovered, ran and acked the run. Its ack finds the run
// gone; that is not this delivery's ack (helper-139 on 717b849: it
// reported OutcomeAck, two for one run, the Observer's acked count one).
// With all set, every call fails and the handler returns at once; its ack
// waits for a fetch until Redis answers again, after the other's ack.
func TestWorkerLapsedAckAfterAnotherDelivery(t *testing.T) {
	t.Parallel()
	for _, all := range []bool{false, true} {
		t.Run(fmt.Sprintf("all=%v", all), func(t *testing.T) {
			hook := &failPipelines{all: all}
			a := startLapsed(t, hook, 0, func(context.Context) error { return nil })
			bA, oA, wA, lease := a.b, a.o, a.w, a.lease
			if all {
				close(a.finish) // returns at once: its ack waits for Redis
			}

			// Another instance, Redis within its reach: the lease runs
			// out, it recovers the run, runs it and acks it.
			real, ok := redistest.Real(t).(*redis.Client)
			require.True(t, ok)
			oB := newS16Observer()
			qB, err := runqueue.New(bA.ctx, clientFor(t, real.Options()),
				&runqueue.Config{Prefix: bA.prefix, Clock: bA.clock, LeaseDuration: lease, Observer: oB})
			require.NoError(t, err)
			t.Cleanup(func() { _ = qB.Close() })
			bA.clock.Advance(time.Second)
			n, err := qB.RecoverLeases(bA.ctx, qB.ShardOf(env), 100)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			wB := startWorker(t, qB, func(context.Context, *runqueue.Run) error { return nil },
				func(wc *runqueue.WorkerConfig) {
					wc.Concurrency = 1
					wc.SweepInterval = -1
					wc.Logger = quietLogger
				})
			require.Equal(t, runqueue.OutcomeAck, oB.next(t))
			shutdown(t, wB)

			if !all {
				close(a.finish)
			}
			hook.on.Store(false)
			require.Equal(t, runqueue.OutcomeLeaseLost, oA.next(t), "the other delivery settled the run")
			shutdown(t, wA)
		})
	}
}

// TestWorkerGiveBackWhileRedisDown: every call is refused (a Redis out of
// reach), the handler heeds the cancel at once and returns its error, and
// Redis answers again within the lease: the give-back is sent again until
// it lands, so the run is ready at once and not dead-lettered at
// MaxAttempts 1 (helper-139: one attempt, failed, left the run to lease
// recovery, which counted the attempt). The clock stands still.
func TestWorkerGiveBackWhileRedisDown(t *testing.T) {
	t.Parallel()
	hook := &failPipelines{all: true, refused: true}
	c := hookedReal(t, hook)
	o := newS16Observer()
	b := setup(t, c, func(cfg *runqueue.Config) { cfg.LeaseDuration = 3 * time.Second; cfg.Observer = o; cfg.MaxAttempts = 1 })
	started, cancelled := make(chan struct{}), make(chan struct{})
	var deliveries atomic.Int32
	w := startWorker(t, b.q, func(ctx context.Context, _ *runqueue.Run) error {
		if deliveries.Add(1) > 1 {
			return nil
		}
		close(started)
		<-ctx.Done()
		close(cancelled)
		return ctx.Err()
	}, oneSlot(time.Second))
	enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
	waitClosed(t, started)
	hook.on.Store(true)
	waitClosed(t, cancelled)
	time.Sleep(200 * time.Millisecond) // the give-back fails meanwhile
	hook.on.Store(false)
	require.Equal(t, runqueue.OutcomeRetry, o.next(t))
	require.Equal(t, runqueue.OutcomeAck, o.next(t))
	shutdown(t, w)
	require.Equal(t, int32(2), deliveries.Load())
	st := queueStats(t, b, queueName)
	require.Equal(t, runqueue.Stats{}, runqueue.Stats{Ready: st.Ready, Delayed: st.Delayed, InFlight: st.InFlight, Dead: st.Dead})
}

// failSecondAck, once armed, sends only the first call of the next
// pipeline of two ack script calls and fails the second unrun (as a Redis
// error reply would): one queue's ack answered, the other's refused.
type failSecondAck struct {
	nopHook
	sha   string
	armed atomic.Bool
}

func (h *failSecondAck) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) != 2 || !h.armed.Load() {
			return next(ctx, cmds)
		}
		for _, c := range cmds {
			if a := c.Args(); len(a) < 2 || fmt.Sprint(a[1]) != h.sha {
				return next(ctx, cmds)
			}
		}
		h.armed.Store(false)
		err := next(ctx, cmds[:1])
		refused := replyErr("ERR refused by the test")
		cmds[1].SetErr(refused)
		if err == nil {
			err = refused
		}
		return err
	}
}

// TestWorkerShardAckBatchFailsElsewhere: a Worker serving a shard acks
// runs of several queues in one pipeline; when one queue's ack call fails
// the whole batch is sent again. A run whose handler lapse cancelled and
// whose ack had answered 1 then finds itself gone: that is its own ack,
// told OutcomeAck (helper-140 on 73951c0: OutcomeLeaseLost for a run this
// Worker acked). Whether both acks wait for the same send depends on the
// fetch loop's timing, so the case is made up to five times until they
// do (each time, whatever happened, both outcomes must be acks).
func TestWorkerShardAckBatchFailsElsewhere(t *testing.T) {
	t.Parallel()
	srcs, err := runqueue.FlagOffScripts()
	require.NoError(t, err)
	sum := sha1.Sum([]byte(srcs["ack"]))
	sha := hex.EncodeToString(sum[:])
	for attempt := range 5 {
		if shardAckBatchFailsElsewhere(t, sha) {
			return
		}
		t.Logf("attempt %d: the two acks went in separate sends", attempt+1)
	}
	t.Fatal("the two acks never went in one send")
}

// shardAckBatchFailsElsewhere makes the case once and reports whether the
// batch's second call was refused.
func shardAckBatchFailsElsewhere(t *testing.T, sha string) bool {
	part := &failSecondAck{sha: sha}
	hook := &failPipelines{}
	c := hookedReal(t, hook)
	c.AddHook(part)
	lease := 10 * time.Second
	o := newS16Observer()
	b := setup(t, c, func(cfg *runqueue.Config) { cfg.LeaseDuration = lease; cfg.Observer = o; cfg.Shards = 1 })
	var started atomic.Int32
	both, finish := make(chan struct{}), make(chan struct{})
	cancelled := make(chan struct{}, 2)
	w := startWorker(t, b.q, func(ctx context.Context, _ *runqueue.Run) error {
		if started.Add(1) == 2 {
			close(both)
		}
		<-ctx.Done()
		cancelled <- struct{}{}
		<-finish
		return nil
	}, func(wc *runqueue.WorkerConfig) {
		wc.Concurrency = 2
		wc.Shards = []int{0}
		wc.HeartbeatInterval = 50 * time.Millisecond
		wc.SweepInterval = -1
		wc.Logger = quietLogger
	})
	enqueue(t, b, runqueue.EnqueueParams{ID: "r1"})
	enqueue(t, b, runqueue.EnqueueParams{Queue: "other", ID: "r2"})
	waitClosed(t, both)
	hook.on.Store(true)
	b.clock.Advance(lease - 30*time.Millisecond)
	for range 2 {
		select {
		case <-cancelled:
		case <-time.After(workerWait):
			t.Fatal("not cancelled")
		}
	}
	// Both handlers return while pipelines fail: their acks fail and wait
	// for the next send.
	close(finish)
	time.Sleep(300 * time.Millisecond)
	part.armed.Store(true)
	hook.on.Store(false)
	require.Equal(t, []runqueue.Outcome{runqueue.OutcomeAck, runqueue.OutcomeAck}, []runqueue.Outcome{o.next(t), o.next(t)})
	shutdown(t, w)
	for _, q := range []string{queueName, "other"} {
		st := queueStats(t, b, q)
		require.Zero(t, st.Ready+st.InFlight+st.Dead, q)
	}
	return !part.armed.Load()
}
