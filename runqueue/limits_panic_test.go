package runqueue_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// TestLimitsForPanicIsAnError (helper-219's F4): a Config.LimitsFor that
// panics ended the process when a Worker called it, in a goroutine of its
// own (its fetch, its acks, its sweeps), where a handler's panic is an
// error of its run. Now a panic is an error of the dequeue that asked
// (*InvalidError, Field "Config.LimitsFor"), nothing written; a Worker
// calls again after a pause and serves once LimitsFor answers. Elsewhere
// it counts as no limits: an enqueue (flag on, whose hooks read the
// limits), an ack and a TTL sweep go through.
func TestLimitsForPanicIsAnError(t *testing.T) {
	t.Parallel()
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
				var boom atomic.Bool
				var asked atomic.Int64
				b := setup(t, c, func(cfg *runqueue.Config) {
					cfg.VtimeScheduling = on
					cfg.LimitsFor = func(string, string) runqueue.Limits {
						asked.Add(1)
						if boom.Load() {
							panic("the limits store is down")
						}
						return runqueue.Limits{Env: 2, Key: 1}
					}
				})
				enqueue(t, b, runqueue.EnqueueParams{ID: "held"})
				runs, err := b.q.Dequeue(b.ctx, env, queueName, 1)
				require.NoError(t, err)
				require.Len(t, runs, 1)

				boom.Store(true)
				enqueue(t, b, runqueue.EnqueueParams{ID: "r", Key: "k2"})
				enqueue(t, b, runqueue.EnqueueParams{ID: "short", Key: "k3", TTL: time.Second})
				_, err = b.q.Dequeue(b.ctx, env, queueName, 5)
				var ie *runqueue.InvalidError
				require.True(t, errors.As(err, &ie), "a panic of LimitsFor is the dequeue's error: %v", err)
				require.Equal(t, "Config.LimitsFor", ie.Field)
				require.ErrorContains(t, err, "panicked")
				require.ErrorContains(t, err, "the limits store is down")
				s := queueStats(t, b, queueName)
				require.Equal(t, int64(1), s.InFlight, "nothing written")
				require.Equal(t, int64(2), s.Ready)

				require.NoError(t, b.q.Ack(b.ctx, runs[0]), "an ack goes through")
				b.clock.Advance(2 * time.Second)
				n, err := b.q.ExpireTTL(b.ctx, b.q.ShardOf(env), 10)
				require.NoError(t, err, "a TTL sweep goes through")
				require.Equal(t, 1, n)

				served := make(chan string, 4)
				w := startWorker(t, b.q, func(_ context.Context, r *runqueue.Run) error {
					served <- r.ID
					return nil
				}, nil)
				from := asked.Load()
				require.Eventually(t, func() bool { return asked.Load() >= from+2 }, 20*time.Second, 5*time.Millisecond,
					"the Worker calls again after a failed call")
				select {
				case id := <-served:
					t.Fatalf("%s served while LimitsFor panics", id)
				default:
				}
				boom.Store(false)
				select {
				case id := <-served:
					require.Equal(t, "r", id)
				case <-time.After(20 * time.Second):
					t.Fatal("r not served once LimitsFor answers")
				}
				shutdown(t, w)
			})
		})
	}
}
