package runqueue_test

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// workerWait bounds every wait for a worker to do something. It only
// guards against a hang: no test asserts how fast a worker is.
const workerWait = 30 * time.Second

var quietLogger = slog.New(slog.DiscardHandler)

// outcomes is an Observer that passes on every Handled outcome.
type outcomes struct {
	runqueue.NopObserver
	ch chan runqueue.Outcome
}

func newOutcomes() *outcomes { return &outcomes{ch: make(chan runqueue.Outcome, 100000)} }

func (o *outcomes) Handled(_, _ string, _ time.Duration, out runqueue.Outcome) { o.ch <- out }

// next waits for the next n outcomes.
func (o *outcomes) next(t testing.TB, n int) []runqueue.Outcome {
	t.Helper()
	var got []runqueue.Outcome
	timeout := time.After(workerWait)
	for len(got) < n {
		select {
		case out := <-o.ch:
			got = append(got, out)
		case <-timeout:
			t.Fatalf("waited for %d outcomes, got %v", n, got)
		}
	}
	return got
}

// until waits for n outcomes equal to want, ignoring others.
func (o *outcomes) until(t testing.TB, want runqueue.Outcome, n int) {
	t.Helper()
	timeout := time.After(workerWait)
	for seen := 0; seen < n; {
		select {
		case out := <-o.ch:
			if out == want {
				seen++
			}
		case <-timeout:
			t.Fatalf("waited for %d %q outcomes, saw %d", n, want, seen)
		}
	}
}

// workerSetup is setup with an outcomes Observer.
func workerSetup(t testing.TB, c redis.UniversalClient, mutate func(*runqueue.Config)) (*testBundle, *outcomes) {
	t.Helper()
	o := newOutcomes()
	b := setup(t, c, func(cfg *runqueue.Config) {
		cfg.Observer = o
		if mutate != nil {
			mutate(cfg)
		}
	})
	return b, o
}

// newWorker returns a worker on q serving env/queueName, without sweeps
// and quiet unless mutate says otherwise. It is shut down when the test
// ends.
func newWorker(t testing.TB, q *runqueue.Queue, h runqueue.Handler, mutate func(*runqueue.WorkerConfig)) *runqueue.Worker {
	t.Helper()
	cfg := &runqueue.WorkerConfig{
		Queues:        []runqueue.WorkerQueue{{Env: env, Queue: queueName}},
		SweepInterval: -1,
		Logger:        quietLogger,
	}
	if mutate != nil {
		mutate(cfg)
	}
	w, err := runqueue.NewWorker(q, h, cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), workerWait)
		defer cancel()
		_ = w.Shutdown(ctx)
	})
	return w
}

func startWorker(t testing.TB, q *runqueue.Queue, h runqueue.Handler, mutate func(*runqueue.WorkerConfig)) *runqueue.Worker {
	t.Helper()
	w := newWorker(t, q, h, mutate)
	require.NoError(t, w.Start(context.Background()))
	return w
}

func shutdown(t testing.TB, w *runqueue.Worker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), workerWait)
	defer cancel()
	require.NoError(t, w.Shutdown(ctx))
}

// seen records what a handler was given, safe for concurrent use.
type seen struct {
	mu       sync.Mutex
	attempts map[string][]int
}

func newSeen() *seen { return &seen{attempts: map[string][]int{}} }

func (s *seen) add(r *runqueue.Run) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.attempts[r.ID] = append(s.attempts[r.ID], r.Attempt)
}

func (s *seen) get() map[string][]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string][]int{}
	for k, v := range s.attempts {
		out[k] = append([]int(nil), v...)
	}
	return out
}

func requireEmpty(t testing.TB, b *testBundle) {
	t.Helper()
	s := queueStats(t, b, queueName)
	require.Zero(t, s.Ready+s.Delayed+s.InFlight+s.Dead, "queue must be empty: %+v", s)
}

// requireDueAt checks that id is queued and becomes ready exactly at at,
// with attempt: a dequeue 1ms before gets nothing, one at at gets it.
func requireDueAt(t testing.TB, b *testBundle, id string, at time.Time, attempt int) {
	t.Helper()
	b.clock.Advance(at.Sub(b.clock.Now()) - time.Millisecond)
	require.Empty(t, dequeue(t, b, queueName, 10), "%s must not be ready before its retry time", id)
	b.clock.Advance(time.Millisecond)
	runs := dequeue(t, b, queueName, 10)
	require.Equal(t, []string{id}, runIDs(runs))
	require.Equal(t, attempt, runs[0].Attempt)
	ackAll(t, b, runs)
}

type ctxKey struct{}

func TestWorker(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		t.Run("AckOnNil", func(t *testing.T) {
			t.Parallel()
			b, o := workerSetup(t, c, nil)
			got := newSeen()
			var values atomic.Int64
			h := func(ctx context.Context, r *runqueue.Run) error {
				if ctx.Value(ctxKey{}) == "start" {
					values.Add(1)
				}
				got.add(r)
				return nil
			}
			w := newWorker(t, b.q, h, nil)
			require.NoError(t, w.Start(context.WithValue(context.Background(), ctxKey{}, "start")))
			for i := range 3 {
				enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "r" + strconv.Itoa(i), Payload: []byte("p")})
			}
			require.Equal(t, []runqueue.Outcome{runqueue.OutcomeAck, runqueue.OutcomeAck, runqueue.OutcomeAck}, o.next(t, 3))
			require.Equal(t, map[string][]int{"r0": {1}, "r1": {1}, "r2": {1}}, got.get())
			require.Equal(t, int64(3), values.Load(), "the handler's context carries the Start context's values")
			requireEmpty(t, b)
			shutdown(t, w)
		})
		t.Run("ErrorNacksWithBackoff", func(t *testing.T) {
			t.Parallel()
			b, o := workerSetup(t, c, func(c *runqueue.Config) {
				c.BackoffBase = 10 * time.Second
				c.BackoffJitter = -1
			})
			w := startWorker(t, b.q, func(context.Context, *runqueue.Run) error { return errors.New("flaky") }, nil)
			enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
			require.Equal(t, []runqueue.Outcome{runqueue.OutcomeRetry}, o.next(t, 1))
			shutdown(t, w)
			requireDueAt(t, b, "r", b.clock.Now().Add(10*time.Second), 2)
		})
		t.Run("NoRetryDeadLetters", func(t *testing.T) {
			t.Parallel()
			b, o := workerSetup(t, c, nil)
			w := startWorker(t, b.q, func(_ context.Context, r *runqueue.Run) error {
				if r.ID == "wrapped" {
					return fmt.Errorf("bad payload: %w", runqueue.ErrNoRetry)
				}
				return runqueue.NoRetry(errors.New("bad payload"))
			}, nil)
			enqueue(t, b, runqueue.EnqueueParams{ID: "marked"})
			enqueue(t, b, runqueue.EnqueueParams{ID: "wrapped"})
			require.Equal(t, []runqueue.Outcome{runqueue.OutcomeDead, runqueue.OutcomeDead}, o.next(t, 2))
			shutdown(t, w)
			dead, err := b.q.DeadLetters(b.ctx, env, queueName, 0, 10)
			require.NoError(t, err)
			require.Len(t, dead, 2)
			s := queueStats(t, b, queueName)
			require.Zero(t, s.Ready+s.Delayed+s.InFlight)
		})
		t.Run("LastAttemptDeadLetters", func(t *testing.T) {
			t.Parallel()
			b, o := workerSetup(t, c, func(c *runqueue.Config) { c.MaxAttempts = 1 })
			startWorker(t, b.q, func(context.Context, *runqueue.Run) error { return errors.New("fails") }, nil)
			enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
			require.Equal(t, []runqueue.Outcome{runqueue.OutcomeDead}, o.next(t, 1))
			require.Equal(t, int64(1), queueStats(t, b, queueName).Dead)
		})
		t.Run("RetryAtHonoured", func(t *testing.T) {
			t.Parallel()
			b, o := workerSetup(t, c, nil)
			at := b.clock.Now().Add(time.Hour)
			w := startWorker(t, b.q, func(context.Context, *runqueue.Run) error {
				return runqueue.RetryAt(errors.New("rate limited"), at)
			}, nil)
			enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
			require.Equal(t, []runqueue.Outcome{runqueue.OutcomeRetry}, o.next(t, 1))
			shutdown(t, w)
			requireDueAt(t, b, "r", at, 2)
		})
		t.Run("RetryAfterHonoured", func(t *testing.T) {
			t.Parallel()
			b, o := workerSetup(t, c, nil)
			w := startWorker(t, b.q, func(context.Context, *runqueue.Run) error {
				return fmt.Errorf("wrapped: %w", runqueue.RetryAfter(errors.New("busy"), 2*time.Hour))
			}, nil)
			enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
			require.Equal(t, []runqueue.Outcome{runqueue.OutcomeRetry}, o.next(t, 1))
			shutdown(t, w)
			requireDueAt(t, b, "r", b.clock.Now().Add(2*time.Hour), 2)
		})
		t.Run("PanicRecoveredAndNacked", func(t *testing.T) {
			t.Parallel()
			b, o := workerSetup(t, c, func(c *runqueue.Config) {
				c.BackoffBase = time.Minute
				c.BackoffJitter = -1
			})
			var logs syncBuffer
			w := startWorker(t, b.q, func(context.Context, *runqueue.Run) error { panic("boom") },
				func(c *runqueue.WorkerConfig) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
			enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
			require.Equal(t, []runqueue.Outcome{runqueue.OutcomePanic}, o.next(t, 1))
			shutdown(t, w)
			out := logs.String()
			require.Contains(t, out, "handler panicked")
			require.Contains(t, out, "boom")
			require.Contains(t, out, "worker_test.go", "the log carries the panic's stack")
			requireDueAt(t, b, "r", b.clock.Now().Add(time.Minute), 2)
		})
		t.Run("HeartbeatKeepsLease", func(t *testing.T) {
			t.Parallel()
			b, o := workerSetup(t, c, func(c *runqueue.Config) { c.LeaseDuration = 30 * time.Second })
			started, finish := make(chan struct{}), make(chan struct{})
			got := newSeen()
			w := startWorker(t, b.q, func(ctx context.Context, r *runqueue.Run) error {
				got.add(r)
				close(started)
				select {
				case <-finish:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}, nil)
			enqueue(t, b, runqueue.EnqueueParams{ID: "long"})
			waitClosed(t, started)
			shard := b.q.ShardOf(env)
			// Three times the lease passes while the handler runs; each
			// time a heartbeat came first, so recovery finds nothing.
			for range 3 {
				b.clock.Advance(20 * time.Second)
				w.Heartbeat()
				b.clock.Advance(20 * time.Second)
				n, err := b.q.RecoverLeases(b.ctx, shard, 100)
				require.NoError(t, err)
				require.Zero(t, n, "a heartbeat keeps the lease of a running handler")
			}
			close(finish)
			require.Equal(t, []runqueue.Outcome{runqueue.OutcomeAck}, o.next(t, 1))
			require.Equal(t, map[string][]int{"long": {1}}, got.get())
			requireEmpty(t, b)
		})
		t.Run("LeaseLostCancelsHandler", func(t *testing.T) {
			t.Parallel()
			b, o := workerSetup(t, c, func(c *runqueue.Config) { c.LeaseDuration = 30 * time.Second })
			started := make(chan struct{})
			cause := make(chan error, 1)
			got := newSeen()
			w := startWorker(t, b.q, func(ctx context.Context, r *runqueue.Run) error {
				got.add(r)
				if r.Attempt == 1 {
					close(started)
					<-ctx.Done()
					cause <- ctx.Err()
					return nil // ignored: the lease is gone
				}
				return nil
			}, func(c *runqueue.WorkerConfig) { c.Concurrency = 1 })
			enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
			waitClosed(t, started)
			// The lease passes with no heartbeat (a stalled process, say)
			// and another instance recovers the run.
			b.clock.Advance(31 * time.Second)
			n, err := b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 100)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			w.Heartbeat()
			require.ErrorIs(t, <-cause, context.Canceled)
			require.Equal(t, []runqueue.Outcome{runqueue.OutcomeLeaseLost, runqueue.OutcomeAck}, o.next(t, 2))
			require.Equal(t, map[string][]int{"r": {1, 2}}, got.get())
			requireEmpty(t, b)
		})
		t.Run("ShutdownWaitsForHandlers", func(t *testing.T) {
			t.Parallel()
			b, o := workerSetup(t, c, nil)
			started, finish := make(chan struct{}), make(chan struct{})
			w := startWorker(t, b.q, func(ctx context.Context, r *runqueue.Run) error {
				close(started)
				select {
				case <-finish:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}, nil)
			enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
			waitClosed(t, started)
			done := make(chan error, 1)
			go func() { done <- w.Shutdown(context.Background()) }()
			close(finish)
			require.NoError(t, <-done)
			require.Equal(t, []runqueue.Outcome{runqueue.OutcomeAck}, o.next(t, 1))
			requireEmpty(t, b)
			// A stopped worker takes nothing more.
			enqueue(t, b, runqueue.EnqueueParams{ID: "after"})
			require.Equal(t, int64(1), queueStats(t, b, queueName).Ready)
		})
		t.Run("ShutdownReleasesWhatIsLeft", func(t *testing.T) {
			t.Parallel()
			b, o := workerSetup(t, c, nil)
			var started sync.WaitGroup
			started.Add(3)
			finish := make(chan struct{})
			w := startWorker(t, b.q, func(ctx context.Context, r *runqueue.Run) error {
				started.Done()
				if r.ID == "quick" {
					<-finish
					return nil
				}
				<-ctx.Done() // slow: runs until the worker gives up on it
				return ctx.Err()
			}, func(c *runqueue.WorkerConfig) { c.Concurrency = 3 })
			for _, id := range []string{"quick", "slow1", "slow2"} {
				enqueue(t, b, runqueue.EnqueueParams{ID: id})
			}
			started.Wait()
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- w.Shutdown(ctx) }()
			close(finish)
			require.Equal(t, []runqueue.Outcome{runqueue.OutcomeAck}, o.next(t, 1), "Shutdown waits and acks")
			cancel()
			require.ErrorIs(t, <-done, context.Canceled)
			require.ElementsMatch(t, []runqueue.Outcome{runqueue.OutcomeRetry, runqueue.OutcomeRetry}, o.next(t, 2))

			// The released runs are ready now, not after their lease: the
			// clock has not moved.
			got := newSeen()
			startWorker(t, otherQueue(t, b), func(_ context.Context, r *runqueue.Run) error {
				got.add(r)
				return nil
			}, nil)
			o.until(t, runqueue.OutcomeAck, 2)
			require.Equal(t, map[string][]int{"slow1": {2}, "slow2": {2}}, got.get(),
				"released runs run again at once, the acked one never")
			requireEmpty(t, b)
		})
		t.Run("ReleaseAtLastAttemptIsNotDeadLettered", func(t *testing.T) {
			t.Parallel()
			b, o := workerSetup(t, c, func(c *runqueue.Config) { c.MaxAttempts = 1 })
			started := make(chan struct{})
			w := startWorker(t, b.q, func(ctx context.Context, r *runqueue.Run) error {
				close(started)
				<-ctx.Done()
				return ctx.Err()
			}, nil)
			enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
			waitClosed(t, started)
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			require.ErrorIs(t, w.Shutdown(ctx), context.Canceled)
			require.Equal(t, []runqueue.Outcome{runqueue.OutcomeRetry}, o.next(t, 1))
			s := queueStats(t, b, queueName)
			require.Equal(t, int64(1), s.Ready)
			require.Zero(t, s.Dead)
		})
		t.Run("CrashedWorkerRecoveredBySweep", func(t *testing.T) {
			t.Parallel()
			b, o := workerSetup(t, c, func(c *runqueue.Config) { c.LeaseDuration = 30 * time.Second })
			const n = 5
			var started sync.WaitGroup
			started.Add(n)
			// Worker A has its own connection; its handlers never finish.
			dying, die := context.WithCancel(context.Background())
			a := newWorker(t, otherQueue(t, b), func(ctx context.Context, r *runqueue.Run) error {
				started.Done()
				<-ctx.Done()
				return nil
			}, nil)
			require.NoError(t, a.Start(dying))
			for i := range n {
				enqueue(t, b, runqueue.EnqueueParams{Key: "k" + strconv.Itoa(i%2), ID: "r" + strconv.Itoa(i)})
			}
			started.Wait()
			die() // the process dies: nothing is released or acked
			err := a.Shutdown(context.Background())
			require.ErrorIs(t, err, context.Canceled, "a hard stop is not a clean one")
			var ue *runqueue.UnsettledError
			require.ErrorAs(t, err, &ue)
			require.Positive(t, ue.Runs, "its runs are left in flight")
			o.until(t, runqueue.OutcomeLeaseLost, n)
			require.Equal(t, int64(n), queueStats(t, b, queueName).InFlight, "a dead worker's runs stay in flight")

			b.clock.Advance(31 * time.Second)
			got := newSeen()
			startWorker(t, b.q, func(_ context.Context, r *runqueue.Run) error {
				got.add(r)
				return nil
			}, func(c *runqueue.WorkerConfig) { c.SweepInterval = 10 * time.Millisecond })
			o.until(t, runqueue.OutcomeAck, n)
			want := map[string][]int{}
			for i := range n {
				want["r"+strconv.Itoa(i)] = []int{2}
			}
			require.Equal(t, want, got.get())
			requireEmpty(t, b)
		})
		t.Run("ConcurrencyLimit", func(t *testing.T) {
			t.Parallel()
			b, o := workerSetup(t, c, nil)
			const limit, runs = 4, 40
			var running, most atomic.Int64
			full := make(chan struct{})
			var once sync.Once
			startWorker(t, b.q, func(ctx context.Context, r *runqueue.Run) error {
				n := running.Add(1)
				defer running.Add(-1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				if n == limit {
					once.Do(func() { close(full) })
				}
				select { // the first handlers wait until the limit is reached
				case <-full:
				case <-ctx.Done():
				}
				return nil
			}, func(c *runqueue.WorkerConfig) { c.Concurrency = limit })
			for i := range runs {
				enqueue(t, b, runqueue.EnqueueParams{Key: "k" + strconv.Itoa(i%7), ID: "r" + strconv.Itoa(i)})
			}
			o.until(t, runqueue.OutcomeAck, runs)
			require.Equal(t, int64(limit), most.Load(), "never more handlers at once than Concurrency")
			requireEmpty(t, b)
		})
		t.Run("Shards", func(t *testing.T) {
			t.Parallel()
			b, o := workerSetup(t, c, nil)
			got := newSeen()
			startWorker(t, b.q, func(_ context.Context, r *runqueue.Run) error {
				got.add(r)
				if r.ID == "b-bad" {
					return runqueue.NoRetry(errors.New("bad"))
				}
				return nil
			}, func(c *runqueue.WorkerConfig) {
				c.Queues = nil
				c.Shards = []int{b.q.ShardOf(env)}
			})
			for i := range 10 {
				enqueue(t, b, runqueue.EnqueueParams{Queue: "a", ID: "a-" + strconv.Itoa(i)})
				enqueue(t, b, runqueue.EnqueueParams{Queue: "b", ID: "b-" + strconv.Itoa(i)})
			}
			enqueue(t, b, runqueue.EnqueueParams{Queue: "b", ID: "b-bad"})
			count := map[runqueue.Outcome]int{}
			for _, out := range o.next(t, 21) {
				count[out]++
			}
			require.Equal(t, map[runqueue.Outcome]int{runqueue.OutcomeAck: 20, runqueue.OutcomeDead: 1}, count)
			require.Len(t, got.get(), 21)
			for _, qn := range []string{"a", "b"} {
				s := queueStats(t, b, qn)
				require.Zero(t, s.Ready+s.Delayed+s.InFlight, "queue %s: %+v", qn, s)
			}
		})
		t.Run("AckNotHeldBehindBusySlots", func(t *testing.T) {
			t.Parallel()
			b, o := workerSetup(t, c, nil)
			// One slot, two queues. Queue "other" has a run, "holder",
			// that keeps the slot once it gets it; queueName has a backlog
			// of quick runs. When holder takes the slot a quick run freed,
			// that quick run's ack must go at once, not wait for a slot.
			const quick = 20
			firstRuns, holderQueued := make(chan struct{}), make(chan struct{})
			holding, release := make(chan struct{}), make(chan struct{})
			var ran atomic.Int64
			startWorker(t, b.q, func(ctx context.Context, r *runqueue.Run) error {
				if r.ID != "holder" {
					if ran.Add(1) == 1 { // holder arrives while a quick run holds the slot
						close(firstRuns)
						<-holderQueued
					}
					return nil
				}
				close(holding)
				select {
				case <-release:
				case <-ctx.Done():
				}
				return nil
			}, func(c *runqueue.WorkerConfig) {
				c.Concurrency = 1
				c.Queues = []runqueue.WorkerQueue{{Env: env, Queue: queueName}, {Env: env, Queue: "other"}}
			})
			for i := range quick {
				enqueue(t, b, runqueue.EnqueueParams{ID: "q" + strconv.Itoa(i)})
			}
			waitClosed(t, firstRuns)
			enqueue(t, b, runqueue.EnqueueParams{Queue: "other", ID: "holder"})
			close(holderQueued)
			waitClosed(t, holding)
			n := int(ran.Load()) // no quick run starts while holder holds the slot
			require.Positive(t, n)
			o.until(t, runqueue.OutcomeAck, n) // every quick run that ran is acked while holder holds the slot
			close(release)
			o.until(t, runqueue.OutcomeAck, quick+1-n)
			requireEmpty(t, b)
			require.Zero(t, queueStats(t, b, "other").InFlight)
		})
		t.Run("DelayedRunHandledAtItsTime", func(t *testing.T) {
			t.Parallel()
			b, o := workerSetup(t, c, wallClock)
			got := newSeen()
			startWorker(t, b.q, func(_ context.Context, r *runqueue.Run) error {
				got.add(r)
				return nil
			}, func(c *runqueue.WorkerConfig) { c.IdlePollInterval = time.Hour })
			// Nothing wakes the worker when the run becomes due: its look at
			// the queue after its last empty fetch set a timer for it.
			enqueue(t, b, runqueue.EnqueueParams{ID: "later", Delay: 300 * time.Millisecond})
			require.Equal(t, []runqueue.Outcome{runqueue.OutcomeAck}, o.next(t, 1))
			require.Equal(t, map[string][]int{"later": {1}}, got.get())
		})
		t.Run("IdleWorkerSendsNothing", func(t *testing.T) {
			t.Parallel()
			b, o := workerSetup(t, c, nil)
			// The worker's own client counts every command it sends.
			counted := otherClient(t, b.client)
			var cmds atomic.Int64
			counted.AddHook(countHook{&cmds})
			cfg := b.q.Config()
			q, err := runqueue.New(b.ctx, counted, &cfg)
			require.NoError(t, err)
			t.Cleanup(func() { _ = q.Close() })
			startWorker(t, q, func(context.Context, *runqueue.Run) error { return nil },
				func(c *runqueue.WorkerConfig) { c.IdlePollInterval = time.Hour })
			enqueue(t, b, runqueue.EnqueueParams{ID: "first"})
			o.until(t, runqueue.OutcomeAck, 1)
			// Let the worker reach its wait (it looks once more after the
			// ack), then count over an idle period longer than
			// BlockPollInterval (1s). The wait ends after 400ms without a
			// command (at 100ms, a stall of the worker between its ack and
			// its last look let that look fall in the count).
			for prev := int64(-1); prev != cmds.Load(); {
				prev = cmds.Load()
				time.Sleep(400 * time.Millisecond)
			}
			before := cmds.Load()
			time.Sleep(1500 * time.Millisecond)
			require.Equal(t, before, cmds.Load(), "an idle worker sends no command")
			// Yet it wakes for new work at once (its idle poll is an hour).
			enqueue(t, b, runqueue.EnqueueParams{ID: "second"})
			o.until(t, runqueue.OutcomeAck, 1)
			requireEmpty(t, b)
		})
	})
}

// TestWorkerExactlyOnce runs several workers, each on its own connection,
// over one queue while runs arrive: with handlers that succeed and leases
// that never pass, every run is handled and acked exactly once.
func TestWorkerExactlyOnce(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		for _, on := range []bool{false, true} {
			t.Run("Flag="+strconv.FormatBool(on), func(t *testing.T) {
				t.Parallel()
				b, o := workerSetup(t, c, func(c *runqueue.Config) { c.VtimeScheduling = on })
				const n = 400
				enqueueRange := func(from, to int) {
					ps := make([]runqueue.EnqueueParams, 0, to-from)
					for i := from; i < to; i++ {
						ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: "k" + strconv.Itoa(i%10),
							ID: "r" + strconv.Itoa(i)})
					}
					res, err := b.q.EnqueueMany(b.ctx, ps)
					require.NoError(t, err)
					for _, r := range res {
						require.True(t, r.Queued)
					}
				}
				enqueueRange(0, n/2)
				got := newSeen()
				h := func(_ context.Context, r *runqueue.Run) error {
					got.add(r)
					return nil
				}
				conc := func(c *runqueue.WorkerConfig) { c.Concurrency = 8 }
				workers := []*runqueue.Worker{startWorker(t, b.q, h, conc)}
				for range 2 {
					workers = append(workers, startWorker(t, otherQueue(t, b), h, conc))
				}
				enqueueRange(n/2, n)
				o.until(t, runqueue.OutcomeAck, n)
				for _, w := range workers {
					shutdown(t, w)
				}
				seenRuns := got.get()
				require.Len(t, seenRuns, n)
				for id, atts := range seenRuns {
					require.Equal(t, []int{1}, atts, "run %s", id)
				}
				requireEmpty(t, b)
			})
		}
	})
}

func TestWorkerConfig(t *testing.T) {
	t.Parallel()
	b := setup(t, redistest.Mini(t), func(c *runqueue.Config) { c.LeaseDuration = time.Minute })
	noop := func(context.Context, *runqueue.Run) error { return nil }
	q := []runqueue.WorkerQueue{{Env: env, Queue: queueName}}
	for name, cfg := range map[string]*runqueue.WorkerConfig{
		"Nothing":          {},
		"BadQueue":         {Queues: []runqueue.WorkerQueue{{Env: "", Queue: "q"}}},
		"BadShard":         {Shards: []int{b.q.Shards()}},
		"NegativeShard":    {Shards: []int{-1}},
		"Concurrency":      {Queues: q, Concurrency: -1},
		"HeartbeatTooSlow": {Queues: q, HeartbeatInterval: time.Minute},
		// A run fetched just after a beat waits 1.5 intervals for its
		// first extension: from 2/3 of the lease on, it runs out first.
		"HeartbeatTwoThirds": {Queues: q, HeartbeatInterval: 40 * time.Second},
		"HeartbeatAbove2/3":  {Queues: q, HeartbeatInterval: 50 * time.Second},
		// 3 x 150 years overflows a Duration (helper-143).
		"HeartbeatHuge":     {Queues: q, HeartbeatInterval: 150 * 365 * 24 * time.Hour},
		"SweepLimit":        {Queues: q, SweepLimit: -1},
		"IdlePollTooShort":  {Queues: q, IdlePollInterval: time.Microsecond},
		"NegativeHeartbeat": {Queues: q, HeartbeatInterval: -time.Second},
	} {
		_, err := runqueue.NewWorker(b.q, noop, cfg)
		require.ErrorIs(t, err, runqueue.ErrInvalid, name)
	}
	_, err := runqueue.NewWorker(b.q, nil, &runqueue.WorkerConfig{Queues: q})
	require.ErrorIs(t, err, runqueue.ErrInvalid)

	_, err = runqueue.NewWorker(b.q, noop, &runqueue.WorkerConfig{Queues: q, HeartbeatInterval: 40*time.Second - time.Millisecond})
	require.NoError(t, err, "just under 2/3 of the lease")

	w, err := runqueue.NewWorker(b.q, noop, &runqueue.WorkerConfig{Queues: q})
	require.NoError(t, err)
	require.NoError(t, w.Start(b.ctx))
	require.Error(t, w.Start(b.ctx), "a worker starts once")
	require.NoError(t, w.Shutdown(b.ctx))
	require.NoError(t, w.Shutdown(b.ctx), "Shutdown twice is fine")

	never, err := runqueue.NewWorker(b.q, noop, &runqueue.WorkerConfig{Queues: q})
	require.NoError(t, err)
	require.NoError(t, never.Shutdown(b.ctx), "Shutdown of a worker never started")
}

func TestWorkerErrors(t *testing.T) {
	t.Parallel()
	base := errors.New("base")
	nr := runqueue.NoRetry(base)
	require.ErrorIs(t, nr, runqueue.ErrNoRetry)
	require.ErrorIs(t, nr, base)
	require.Equal(t, "base", nr.Error())
	require.ErrorIs(t, runqueue.NoRetry(nil), runqueue.ErrNoRetry)

	at := time.UnixMilli(2_000_000_000_000)
	var re *runqueue.RetryError
	require.ErrorAs(t, fmt.Errorf("ctx: %w", runqueue.RetryAt(base, at)), &re)
	require.Equal(t, at, re.At)
	require.ErrorIs(t, re, base)
	require.ErrorAs(t, runqueue.RetryAfter(base, -time.Second), &re)
	require.Zero(t, re.After, "a negative delay means now")
	require.Contains(t, runqueue.RetryAfter(nil, time.Second).Error(), "retry after 1s")
}

// countHook counts the commands a client sends (a pipeline's each).
type countHook struct{ n *atomic.Int64 }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writers (a logger).
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func waitClosed(t testing.TB, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(workerWait):
		t.Fatal("timed out")
	}
}

// TestWorkerLeavesNoGoroutines runs a worker through each way it stops (a
// graceful Shutdown, a Shutdown that gives up and releases, a hard stop
// by the Start context) and checks that none of its goroutines, nor its
// handlers', outlive it. It is not parallel, so that goleak sees only its
// own goroutines.
func TestWorkerLeavesNoGoroutines(t *testing.T) {
	server := redistest.Mini(t).(*redis.Client)
	defer redistest.VerifyNoLeaks(t, goleak.IgnoreCurrent())
	// A client of its own, closed before the check, so that the server's
	// goroutines for its connections are gone too.
	c := redis.NewClient(server.Options())
	defer func() { require.NoError(t, c.Close()) }()
	b := setup(t, c, nil)
	defer func() { require.NoError(t, b.q.Close()) }()
	o := newOutcomes()
	cfg := b.q.Config()
	cfg.Observer = o
	q, err := runqueue.New(b.ctx, c, &cfg)
	require.NoError(t, err)
	defer func() { require.NoError(t, q.Close()) }()

	blocked := make(chan struct{}, 2) // a blocking handler has started
	block := func(ctx context.Context, r *runqueue.Run) error {
		if strings.HasPrefix(r.ID, "blocks") {
			blocked <- struct{}{}
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}
	run := func(round string, stop func(w *runqueue.Worker, startCancel context.CancelFunc)) {
		w, err := runqueue.NewWorker(q, block, &runqueue.WorkerConfig{
			Queues: []runqueue.WorkerQueue{{Env: env, Queue: queueName}}, Concurrency: 4,
			SweepInterval: 10 * time.Millisecond, Logger: quietLogger})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		require.NoError(t, w.Start(ctx))
		enqueue(t, b, runqueue.EnqueueParams{ID: "quick" + round})
		enqueue(t, b, runqueue.EnqueueParams{ID: "blocks" + round})
		o.until(t, runqueue.OutcomeAck, 1)
		// Stop only once the blocking run is held by its handler: the
		// quick run's ack can come before the worker fetched it, and a
		// Shutdown with nothing running returns at once.
		select {
		case <-blocked:
		case <-time.After(workerWait):
			t.Fatal("the blocking run never reached its handler")
		}
		stop(w, cancel)
	}
	// Graceful: the blocked handler is released.
	run("1", func(w *runqueue.Worker, _ context.CancelFunc) {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		require.ErrorIs(t, w.Shutdown(ctx), context.DeadlineExceeded)
	})
	require.Equal(t, []runqueue.Outcome{runqueue.OutcomeRetry}, o.next(t, 1))
	// A hard stop leaves its runs in flight (the released run of the
	// first round is one of them, or still ready).
	run("2", func(w *runqueue.Worker, startCancel context.CancelFunc) {
		startCancel()
		err := w.Shutdown(context.Background())
		require.ErrorIs(t, err, context.Canceled, "a hard stop is not a clean one")
		require.ErrorIs(t, err, runqueue.ErrUnsettled, "its run is left in flight")
	})
	o.until(t, runqueue.OutcomeLeaseLost, 1)
}

// An error storm, every run failing once, costs one Redis call per failure
// (its nack): the retries are fetched, and their acks sent, with the other
// runs'. The calls are counted on the worker's own client by script.
func TestWorkerErrorStormCallsPerFailure(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b, o := workerSetup(t, c, func(c *runqueue.Config) {
			c.Clock = nil // retries come due on the wall clock
			c.BackoffBase = time.Millisecond
			c.BackoffJitter = -1
		})
		const n = 300
		ps := make([]runqueue.EnqueueParams, 0, n)
		for i := range n {
			ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: "k" + strconv.Itoa(i%10), ID: "r" + strconv.Itoa(i)})
		}
		_, err := b.q.EnqueueMany(b.ctx, ps)
		require.NoError(t, err)

		counted := otherClient(t, b.client)
		calls := &scriptCalls{byName: map[string]int{}, names: scriptNames(t)}
		counted.AddHook(calls)
		cfg := b.q.Config()
		q, err := runqueue.New(b.ctx, counted, &cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = q.Close() })
		got := newSeen()
		calls.reset() // opening the queue read and wrote its layout
		w := startWorker(t, q, func(_ context.Context, r *runqueue.Run) error {
			got.add(r)
			if r.Attempt == 1 {
				return errors.New("fails once")
			}
			return nil
		}, func(c *runqueue.WorkerConfig) { c.Concurrency = 50 })
		o.until(t, runqueue.OutcomeAck, n)
		shutdown(t, w)
		for id, atts := range got.get() {
			require.Equal(t, []int{1, 2}, atts, "run %s", id)
		}
		requireEmpty(t, b)
		byName := calls.get()
		require.Equal(t, n, byName["requeue"], "one nack per failure: %v", byName)
		t.Logf("calls of the worker's client for %d runs failing once: %v", n, byName)
		for name := range byName {
			// Everything else is fetching (dequeue, with the acks), a look
			// at the queue while idle (its score, whether it holds ready
			// runs, its delay index's first entry for the early look), or
			// the handshake of a new connection (hello, client setinfo).
			require.Contains(t, []string{"requeue", "dequeue", "ack", "zscore", "zrange", "zrangebyscore", "hello", "client"}, name, "%v", byName)
		}
	})
}

// scriptNames maps the SHA-1 and the source of every script, and the
// flag-on library's function names, to the script's name without the flag
// suffix ("dequeue_vtime" is "dequeue").
func scriptNames(t testing.TB) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, get := range []func() (map[string]string, error){runqueue.FlagOffScripts, runqueue.FlagOnScripts} {
		srcs, err := get()
		require.NoError(t, err)
		for name, src := range srcs {
			sum := sha1.Sum([]byte(src))
			name = strings.TrimSuffix(name, "_vtime")
			out[hex.EncodeToString(sum[:])] = name
			out[src] = name
		}
	}
	fns, err := runqueue.FlagOnFunctions()
	require.NoError(t, err)
	for name, fn := range fns {
		out[fn] = strings.TrimSuffix(name, "_vtime")
	}
	return out
}

// scriptCalls counts a client's commands, scripts by name, others by
// command name.
type scriptCalls struct {
	names  map[string]string
	mu     sync.Mutex
	byName map[string]int
}

func (s *scriptCalls) add(cmd redis.Cmder) {
	name := strings.ToLower(cmd.Name())
	if args := cmd.Args(); (name == "evalsha" || name == "eval" || name == "fcall") && len(args) > 1 {
		if n, ok := s.names[fmt.Sprint(args[1])]; ok {
			name = n
		}
	}
	s.mu.Lock()
	s.byName[name]++
	s.mu.Unlock()
}

func (s *scriptCalls) reset() {
	s.mu.Lock()
	clear(s.byName)
	s.mu.Unlock()
}

func (s *scriptCalls) get() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.byName)
}

func (s *scriptCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s *scriptCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		s.add(cmd)
		return next(ctx, cmd)
	}
}

func (s *scriptCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			s.add(cmd)
		}
		return next(ctx, cmds)
	}
}

// A handler that calls runtime.Goexit has its run settled as a panic's
// (nacked with backoff, OutcomePanic), and the pool keeps its size: with
// one handler goroutine, every run after the exits is still handled.
func TestWorkerHandlerGoexitKeepsThePool(t *testing.T) {
	t.Parallel()
	b, o := workerSetup(t, redistest.Mini(t), nil)
	w := startWorker(t, b.q, func(ctx context.Context, r *runqueue.Run) error {
		if strings.HasPrefix(r.ID, "exit") {
			runtime.Goexit()
		}
		return nil
	}, func(c *runqueue.WorkerConfig) { c.Concurrency = 1 })
	for _, id := range []string{"exit1", "exit2", "exit3", "ok"} {
		enqueue(t, b, runqueue.EnqueueParams{ID: id})
	}
	require.ElementsMatch(t, []runqueue.Outcome{runqueue.OutcomePanic, runqueue.OutcomePanic,
		runqueue.OutcomePanic, runqueue.OutcomeAck}, o.next(t, 4))
	shutdown(t, w) // graceful: every slot was freed
	s := queueStats(t, b, queueName)
	require.Equal(t, int64(3), s.Delayed, "nacked with backoff: %+v", s)
	require.Zero(t, s.InFlight+s.Ready, "%+v", s)
}

// A release that cannot be sent (Redis is down when the stop is forced) is
// reported: an *UnsettledError that also matches ctx's error, within the
// grace after the deadline. A later Shutdown returns the same result. The
// run stays in flight, for lease recovery.
func TestWorkerShutdownReportsFailedRelease(t *testing.T) {
	t.Parallel()
	m, _ := redistest.MiniServer(t)
	b := setup(t, s16Client(t, m, 1), nil)
	started := make(chan struct{})
	w := startWorker(t, b.q, func(ctx context.Context, r *runqueue.Run) error {
		close(started)
		<-ctx.Done()
		return ctx.Err()
	}, nil)
	enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
	waitClosed(t, started)
	m.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	began := time.Now()
	err := w.Shutdown(ctx)
	took := time.Since(began)
	t.Logf("Shutdown returned %v after %v", err, took)
	require.Less(t, took, 100*time.Millisecond+2*time.Second, "Shutdown keeps to its deadline and grace")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, runqueue.ErrUnsettled)
	var ue *runqueue.UnsettledError
	require.ErrorAs(t, err, &ue)
	require.Equal(t, 1, ue.Runs)
	require.Equal(t, err, w.Shutdown(context.Background()), "a later call returns the same result")
	require.NoError(t, m.Restart())
	require.Equal(t, int64(1), queueStats(t, b, queueName).InFlight, "left to lease recovery")
}

// A failed run whose nack cannot be sent while Shutdown waits is reported
// too; ctx did not end, so the error does not match a ctx error.
func TestWorkerShutdownReportsFailedNack(t *testing.T) {
	t.Parallel()
	m, _ := redistest.MiniServer(t)
	b := setup(t, s16Client(t, m, 1), nil)
	started, finish := make(chan struct{}), make(chan struct{})
	w := startWorker(t, b.q, func(ctx context.Context, r *runqueue.Run) error {
		close(started)
		<-finish
		return errors.New("failed")
	}, nil)
	enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
	waitClosed(t, started)
	m.Close()
	done := make(chan error, 1)
	go func() { done <- w.Shutdown(context.Background()) }()
	close(finish)
	err := <-done
	require.ErrorIs(t, err, runqueue.ErrUnsettled)
	require.NotErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, context.DeadlineExceeded)
	var ue *runqueue.UnsettledError
	require.ErrorAs(t, err, &ue)
	require.Equal(t, 1, ue.Runs)
	require.NoError(t, ue.Err)
}
