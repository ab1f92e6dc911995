package runqueue_test

// Review s28w: the Worker across a restart of a real redis-server without
// persistence (every key lost) while its handlers run.

import (
	"context"
	"fmt"
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

// TestS28WRestartMidProcessing: four handlers run (they honour their
// context) when the server restarts with its data lost. Expected: the
// heartbeat finds the leases gone and cancels the four handlers within
// about a lease; their results count as lease_lost; the worker goes on to
// serve runs enqueued after the restart, acks them once each, and
// Shutdown returns nil promptly; nothing is left in Redis and no goroutine
// outlives the worker and its queue.
func TestS28WRestartMidProcessing(t *testing.T) {
	defer redistest.VerifyNoLeaks(t, goleak.IgnoreCurrent())
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			srv := s17Spawn(t)
			c := redis.NewClient(&redis.Options{Addr: srv.addr, ReadTimeout: 2 * time.Second})
			t.Cleanup(func() { _ = c.Close() })
			b, o := workerSetup(t, c, func(cfg *runqueue.Config) {
				cfg.VtimeScheduling = on
				cfg.Clock = nil
				cfg.LeaseDuration = time.Second
			})
			ctx := b.ctx
			started := make(chan string, 10)
			var cancelled sync.Map // id -> time the handler saw its ctx end
			var newRuns sync.Map   // id -> deliveries
			var newCount atomic.Int64
			w := startWorker(t, b.q, func(hctx context.Context, r *runqueue.Run) error {
				if string(r.Payload) == "old" {
					started <- r.ID
					select {
					case <-hctx.Done():
						cancelled.Store(r.ID, time.Now())
					case <-time.After(8 * time.Second):
					}
					return nil
				}
				v, _ := newRuns.LoadOrStore(r.ID, new(atomic.Int64))
				v.(*atomic.Int64).Add(1)
				newCount.Add(1)
				return nil
			}, func(wc *runqueue.WorkerConfig) {
				wc.Concurrency = 8
				wc.SweepInterval = 100 * time.Millisecond
				wc.IdlePollInterval = 200 * time.Millisecond
			})
			for i := range 4 {
				enqueue(t, b, runqueue.EnqueueParams{ID: fmt.Sprint("old", i), Key: fmt.Sprint("k", i%2), Payload: []byte("old")})
			}
			for range 4 {
				select {
				case <-started:
				case <-time.After(5 * time.Second):
					t.Fatal("the old runs did not start")
				}
			}
			restarted := time.Now()
			srv.kill()
			srv.start()

			deadline := time.Now().Add(4 * time.Second)
			n := 0
			for time.Now().Before(deadline) {
				n = 0
				cancelled.Range(func(_, _ any) bool { n++; return true })
				if n == 4 {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			require.Equal(t, 4, n, "handlers of runs lost with the data are told (their context ends)")
			t.Logf("handlers cancelled within %v of the restart", time.Since(restarted).Round(time.Millisecond))

			for i := range 10 {
				ok, err := b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, ID: fmt.Sprint("new", i),
					Key: fmt.Sprint("k", i%3), Payload: []byte("new")})
				require.NoError(t, err)
				require.True(t, ok)
			}
			got := o.next(t, 14)
			counts := map[runqueue.Outcome]int{}
			for _, g := range got {
				counts[g]++
			}
			require.Equal(t, map[runqueue.Outcome]int{runqueue.OutcomeAck: 10, runqueue.OutcomeLeaseLost: 4}, counts)
			newRuns.Range(func(k, v any) bool {
				require.EqualValues(t, 1, v.(*atomic.Int64).Load(), "run %v delivered more than once", k)
				return true
			})
			require.EqualValues(t, 10, newCount.Load())
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			began := time.Now()
			require.NoError(t, w.Shutdown(sctx))
			require.Less(t, time.Since(began), 2*time.Second)
			require.Equal(t, runqueue.Stats{}, queueStats(t, b, queueName))
			for _, k := range b.keysUnder(t) { // the scheduler's two keys stay, with their lifetime
				require.Regexp(t, `:ckVtime(State)?$`, k, "key left after everything was acked")
				ttl, err := c.PTTL(ctx, k).Result()
				require.NoError(t, err)
				require.Positive(t, ttl, "%s has no TTL", k)
			}
		})
	}
}
