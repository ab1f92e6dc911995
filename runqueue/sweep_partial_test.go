package runqueue_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// A sweep sends one script call per due run in one pipeline. When one call
// fails (on a cluster: a slot on the move answers TRYAGAIN or ASK; here a
// broken key answers WRONGTYPE), the calls after it in the same pipeline
// ran all the same. The sweep returns the first error, and it must still
// count and report what those calls did.
//
// DEFECT (found by TestS19ReshardLive in CI, 2026-12-04: the Observer saw
// 190 runs expire of 193 that did): the sweep stopped counting at the first
// failed call, so ExpireTTL's count and Observer.Expired (and
// RecoverLeases' and Observer.Recovered) left out the runs that later calls
// of the pipeline expired or recovered.

// sweepBreakQueue makes every script call on queue's runs fail: its runs
// hash becomes a string.
func sweepBreakQueue(t *testing.T, b *testBundle, queue string) {
	t.Helper()
	runs := keySpace(t, b).Env(env).Queue(queue).Runs()
	require.NoError(t, b.client.Del(b.ctx, runs).Err())
	require.NoError(t, b.client.Set(b.ctx, runs, "broken", 0).Err())
}

func TestSweepCountsPastAFailedCall(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		t.Run("ExpireTTL", func(t *testing.T) {
			b, rec := observed(t, c, nil)
			// "bad" expires first: its call leads the pipeline.
			enqueue(t, b, runqueue.EnqueueParams{Queue: "bad", Key: "k", ID: "b1", TTL: time.Second})
			for i := range 3 {
				enqueue(t, b, runqueue.EnqueueParams{Queue: queueName, Key: "k", ID: fmt.Sprint("r", i), TTL: 2 * time.Second})
			}
			sweepBreakQueue(t, b, "bad")
			rec.take()
			b.clock.Advance(time.Minute)

			n, err := b.q.ExpireTTL(b.ctx, b.q.ShardOf(env), 100)
			require.Error(t, err, "the broken queue's call fails")
			require.Equal(t, 3, n, "the runs expired by the calls after the failed one")
			require.Equal(t, []string{"expired env/q 3"}, rec.take())
			require.Zero(t, queueStats(t, b, queueName).Ready, "they did expire")
		})
		t.Run("RecoverLeases", func(t *testing.T) {
			b, rec := observed(t, c, func(cfg *runqueue.Config) { cfg.LeaseDuration = time.Second })
			enqueue(t, b, runqueue.EnqueueParams{Queue: "bad", Key: "k", ID: "b1"})
			require.Len(t, dequeue(t, b, "bad", 1), 1)
			b.clock.Advance(time.Second) // "bad"'s lease ends first
			for i := range 3 {
				enqueue(t, b, runqueue.EnqueueParams{Queue: queueName, Key: fmt.Sprint("k", i), ID: fmt.Sprint("r", i)})
			}
			require.Len(t, dequeue(t, b, queueName, 3), 3)
			sweepBreakQueue(t, b, "bad")
			rec.take()
			b.clock.Advance(time.Minute)

			n, err := b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 100)
			require.Error(t, err, "the broken queue's call fails")
			require.Equal(t, 3, n, "the runs recovered by the calls after the failed one")
			require.Equal(t, []string{"recovered env/q 3 dead=0"}, rec.take())
			s := queueStats(t, b, queueName)
			require.EqualValues(t, 3, s.Ready, "they were requeued")
			require.Zero(t, s.InFlight)
		})
	})
}
