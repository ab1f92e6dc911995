package runqueue_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// ttlCases: TTL expiry (ExpireTTL).
func ttlCases() []conformanceCase {
	return []conformanceCase{
		{name: "ExpireTTL", fn: func(t *testing.T, b *testBundle) {
			shard := b.q.ShardOf(env)
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "taken", TTL: 10 * time.Second})
			b.clock.Advance(time.Millisecond)
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "ready", TTL: 10 * time.Second})
			enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: "delayed", TTL: 10 * time.Second, Delay: time.Minute})
			enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: "later", TTL: 30 * time.Second})
			enqueue(t, b, runqueue.EnqueueParams{Key: "c", ID: "forever"})
			enqueue(t, b, runqueue.EnqueueParams{Queue: "q2", ID: "other-queue", TTL: 10 * time.Second})
			taken := dequeue(t, b, queueName, 1)
			require.Equal(t, []string{"taken"}, runIDs(taken))

			b.clock.Advance(10*time.Second - time.Millisecond)
			n, err := b.q.ExpireTTL(b.ctx, shard, 100)
			require.NoError(t, err)
			require.Zero(t, n, "not yet due")
			b.clock.Advance(time.Millisecond)
			n, err = b.q.ExpireTTL(b.ctx, shard, 100)
			require.NoError(t, err)
			require.Equal(t, 3, n, "ready, delayed and the other queue's run")
			n, err = b.q.ExpireTTL(b.ctx, shard, 100)
			require.NoError(t, err)
			require.Zero(t, n)
			require.Equal(t, runqueue.Stats{Ready: 2, InFlight: 1, OldestReadyAge: 10 * time.Second}, queueStats(t, b, queueName))
			require.Equal(t, runqueue.Stats{}, queueStats(t, b, "q2"))

			// The dequeued run is never expired, even when nacked back.
			_, err = b.q.Nack(b.ctx, taken[0], &runqueue.NackOptions{RetryAt: b.clock.Now()})
			require.NoError(t, err)
			b.clock.Advance(time.Hour)
			n, err = b.q.ExpireTTL(b.ctx, shard, 100)
			require.NoError(t, err)
			require.Equal(t, 1, n, "only later")
			require.Equal(t, []string{"forever", "taken"}, runIDs(dequeue(t, b, queueName, 10)))

			// An expired id is free again.
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "ready"})
		}},
		{name: "ExpireTTLEndsAtDelivery", fn: func(t *testing.T, b *testBundle) {
			// Back in the queue before its TTL entry is due (a nack, a lease
			// recovery), a delivered run must outlive its old deadline.
			shard := b.q.ShardOf(env)
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "nacked", TTL: 10 * time.Second})
			enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: "recovered", TTL: 10 * time.Second})
			runs := dequeue(t, b, queueName, 2)
			require.Len(t, runs, 2)
			for _, r := range runs {
				if r.ID == "nacked" {
					_, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{RetryAt: b.clock.Now()})
					require.NoError(t, err)
				}
			}
			b.clock.Advance(b.q.Config().LeaseDuration)
			n, err := b.q.RecoverLeases(b.ctx, shard, 100)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			b.clock.Advance(time.Hour)
			n, err = b.q.ExpireTTL(b.ctx, shard, 100)
			require.NoError(t, err)
			require.Zero(t, n, "delivered runs have no TTL")
			require.ElementsMatch(t, []string{"nacked", "recovered"}, runIDs(dequeue(t, b, queueName, 10)))
		}},
		{name: "ExpireTTLLimit", fn: func(t *testing.T, b *testBundle) {
			for i := range 5 {
				enqueue(t, b, runqueue.EnqueueParams{ID: string(rune('a' + i)), TTL: time.Second})
			}
			b.clock.Advance(time.Second)
			n, err := b.q.ExpireTTL(b.ctx, b.q.ShardOf(env), 3)
			require.NoError(t, err)
			require.Equal(t, 3, n)
			n, err = b.q.ExpireTTL(b.ctx, b.q.ShardOf(env), 3)
			require.NoError(t, err)
			require.Equal(t, 2, n)
			require.Empty(t, b.keysUnder(t), "expired runs leave nothing behind")
		}},
	}
}
