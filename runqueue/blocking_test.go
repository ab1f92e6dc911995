package runqueue_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// A blocking call here gets a long timeout (an hour) and a context that ends
// much sooner: returning the run rather than the context's error proves that
// something woke the call, with no duration threshold in the test.
const (
	longTimeout = time.Hour
	waitBound   = 10 * time.Second
)

// settle is how long a test lets a waiter reach its wait before it makes
// work available. Too short only weakens the test (the waiter finds the work
// on its first look); it can never make it fail.
const settle = 100 * time.Millisecond

// otherQueue is a second Queue instance on its own client and the bundle's
// prefix.
func otherQueue(t testing.TB, b *testBundle) *runqueue.Queue {
	t.Helper()
	cfg := b.q.Config()
	q, err := runqueue.New(b.ctx, otherClient(t, b.client), &cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	return q
}

type waitResult struct {
	runs []*runqueue.Run
	err  error
}

// goWait runs call in a goroutine under a context bounded by waitBound and
// returns the channel of its result.
func goWait(t testing.TB, call func(ctx context.Context) ([]*runqueue.Run, error)) <-chan waitResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	out := make(chan waitResult, 1)
	go func() {
		defer cancel()
		runs, err := call(ctx)
		out <- waitResult{runs, err}
	}()
	return out
}

func waitQueue(b *testBundle, queue string) func(ctx context.Context) ([]*runqueue.Run, error) {
	return func(ctx context.Context) ([]*runqueue.Run, error) {
		return b.q.DequeueWait(ctx, env, queue, 10, longTimeout)
	}
}

func waitShard(b *testBundle) func(ctx context.Context) ([]*runqueue.Run, error) {
	return func(ctx context.Context) ([]*runqueue.Run, error) {
		return b.q.DequeueShardWait(ctx, b.q.ShardOf(env), 10, longTimeout)
	}
}

// requireWoken checks that the waiter returned the expected runs, not its
// context's end.
func requireWoken(t testing.TB, res <-chan waitResult, ids ...string) []*runqueue.Run {
	t.Helper()
	r := <-res
	require.NoError(t, r.err, "the waiter was not woken")
	require.ElementsMatch(t, ids, runIDs(r.runs))
	return r.runs
}

func TestDequeueWait(t *testing.T) {
	t.Parallel()
	type mode struct {
		name string
		wait func(b *testBundle) func(ctx context.Context) ([]*runqueue.Run, error)
	}
	modes := []mode{
		{"Queue", func(b *testBundle) func(context.Context) ([]*runqueue.Run, error) { return waitQueue(b, queueName) }},
		{"Shard", waitShard},
	}
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		for _, m := range modes {
			t.Run(m.name, func(t *testing.T) {
				t.Parallel()
				t.Run("ReadyWorkReturnsAtOnce", func(t *testing.T) {
					t.Parallel()
					b := setup(t, c, wallClock)
					enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
					requireWoken(t, goWait(t, m.wait(b)), "r")
				})
				t.Run("WokenByEnqueueElsewhere", func(t *testing.T) {
					t.Parallel()
					b := setup(t, c, wallClock)
					other := otherQueue(t, b)
					res := goWait(t, m.wait(b))
					time.Sleep(settle)
					ok, err := other.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, ID: "r", Payload: []byte("p")})
					require.NoError(t, err)
					require.True(t, ok)
					runs := requireWoken(t, res, "r")
					require.Equal(t, []byte("p"), runs[0].Payload)
				})
				t.Run("WokenByNackElsewhere", func(t *testing.T) {
					t.Parallel()
					b := setup(t, c, wallClock)
					other := otherQueue(t, b)
					enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
					held, err := other.Dequeue(b.ctx, env, queueName, 1)
					require.NoError(t, err)
					require.Len(t, held, 1)
					res := goWait(t, m.wait(b))
					time.Sleep(settle)
					_, err = other.Nack(b.ctx, held[0], &runqueue.NackOptions{RetryAt: time.Now()})
					require.NoError(t, err)
					runs := requireWoken(t, res, "r")
					require.Equal(t, 2, runs[0].Attempt)
				})
				t.Run("WokenByRedriveElsewhere", func(t *testing.T) {
					t.Parallel()
					b := setup(t, c, wallClock)
					other := otherQueue(t, b)
					enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
					held, err := other.Dequeue(b.ctx, env, queueName, 1)
					require.NoError(t, err)
					_, err = other.Nack(b.ctx, held[0], &runqueue.NackOptions{DeadLetter: true})
					require.NoError(t, err)
					res := goWait(t, m.wait(b))
					time.Sleep(settle)
					require.NoError(t, other.Redrive(b.ctx, env, queueName, "", "r"))
					requireWoken(t, res, "r")
				})
				t.Run("TimeoutReturnsEmpty", func(t *testing.T) {
					t.Parallel()
					b := setup(t, c, wallClock)
					// Delayed work due after the timeout does not end the wait.
					enqueue(t, b, runqueue.EnqueueParams{ID: "later", Delay: time.Hour})
					runs, err := b.q.DequeueWait(b.ctx, env, queueName, 10, 50*time.Millisecond)
					require.NoError(t, err)
					require.Empty(t, runs)
					runs, err = b.q.DequeueShardWait(b.ctx, b.q.ShardOf(env), 10, 50*time.Millisecond)
					require.NoError(t, err)
					require.Empty(t, runs)
				})
				t.Run("ContextCanceled", func(t *testing.T) {
					t.Parallel()
					b := setup(t, c, wallClock)
					ctx, cancel := context.WithCancel(b.ctx)
					res := goWait(t, func(context.Context) ([]*runqueue.Run, error) {
						return m.wait(b)(ctx)
					})
					time.Sleep(settle)
					cancel()
					r := <-res
					require.ErrorIs(t, r.err, context.Canceled)
					require.Empty(t, r.runs)
				})
				t.Run("ContextDeadline", func(t *testing.T) {
					t.Parallel()
					b := setup(t, c, wallClock)
					ctx, cancel := context.WithTimeout(b.ctx, 50*time.Millisecond)
					defer cancel()
					runs, err := m.wait(b)(ctx)
					require.ErrorIs(t, err, context.DeadlineExceeded)
					require.Empty(t, runs)
				})
				t.Run("CloseUnblocks", func(t *testing.T) {
					t.Parallel()
					b := setup(t, c, wallClock)
					res := goWait(t, m.wait(b))
					time.Sleep(settle)
					require.NoError(t, b.q.Close())
					r := <-res
					require.ErrorIs(t, r.err, runqueue.ErrClosed)
					// A closed Queue refuses new waits at once.
					_, err := m.wait(b)(b.ctx)
					require.ErrorIs(t, err, runqueue.ErrClosed)
					require.NoError(t, b.q.Close(), "Close twice is fine")
				})
				t.Run("DelayedRunWakesAtItsTime", func(t *testing.T) {
					t.Parallel()
					b := setup(t, c, wallClock)
					enqueue(t, b, runqueue.EnqueueParams{ID: "d", AvailableAt: time.Now().Add(300 * time.Millisecond)})
					requireWoken(t, goWait(t, m.wait(b)), "d")
				})
				t.Run("DelayedRunEnqueuedWhileWaiting", func(t *testing.T) {
					t.Parallel()
					b := setup(t, c, wallClock)
					other := otherQueue(t, b)
					res := goWait(t, m.wait(b))
					time.Sleep(settle)
					ok, err := other.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, ID: "d",
						AvailableAt: time.Now().Add(300 * time.Millisecond)})
					require.NoError(t, err)
					require.True(t, ok)
					requireWoken(t, res, "d")
				})
				t.Run("RetryLaterWhileWaiting", func(t *testing.T) {
					t.Parallel()
					b := setup(t, c, wallClock)
					other := otherQueue(t, b)
					enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
					held, err := other.Dequeue(b.ctx, env, queueName, 1)
					require.NoError(t, err)
					res := goWait(t, m.wait(b))
					time.Sleep(settle)
					_, err = other.Nack(b.ctx, held[0], &runqueue.NackOptions{RetryAt: time.Now().Add(300 * time.Millisecond)})
					require.NoError(t, err)
					requireWoken(t, res, "r")
				})
				t.Run("LimitFreedByAck", func(t *testing.T) {
					t.Parallel()
					// An ack publishes nothing, so a waiter held by a limit
					// looks again every BlockPollInterval.
					b := setup(t, c, func(c *runqueue.Config) {
						c.Clock = nil
						c.KeyConcurrency = 1
						c.BlockPollInterval = 50 * time.Millisecond
					})
					enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "1"})
					enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "2"})
					held := dequeue(t, b, queueName, 10)
					require.Equal(t, []string{"1"}, runIDs(held))
					res := goWait(t, m.wait(b))
					time.Sleep(settle)
					ackAll(t, b, held)
					requireWoken(t, res, "2")
				})
			})
		}
	})
}

// TestDequeueWaitOnlyItsQueue checks that a waiter on one queue is not
// served another queue's work, and that it still gets its own afterwards.
func TestDequeueWaitOnlyItsQueue(t *testing.T) {
	t.Parallel()
	b := setup(t, redistest.Mini(t), wallClock)
	res := goWait(t, waitQueue(b, queueName))
	time.Sleep(settle)
	enqueue(t, b, runqueue.EnqueueParams{Queue: "elsewhere", ID: "x"})
	time.Sleep(settle)
	enqueue(t, b, runqueue.EnqueueParams{ID: "mine"})
	requireWoken(t, res, "mine")
	s := queueStats(t, b, "elsewhere")
	require.Equal(t, int64(1), s.Ready)
}
