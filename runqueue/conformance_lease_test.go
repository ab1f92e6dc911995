package runqueue_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// leaseCases: leases: ExtendLease and RecoverLeases.
func leaseCases() []conformanceCase {
	lease := func(c *runqueue.Config) { c.LeaseDuration = 10 * time.Second }
	return []conformanceCase{
		{name: "ExtendLease", mutate: lease, fn: func(t *testing.T, b *testBundle) {
			enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "r"})
			shard := b.q.ShardOf(env)
			r := dequeue(t, b, queueName, 1)[0]
			b.clock.Advance(8 * time.Second)
			require.NoError(t, b.q.ExtendLease(b.ctx, r, 10*time.Second))
			require.Equal(t, b.clock.Now().Add(10*time.Second).UnixMilli(), r.LeaseDeadline.UnixMilli())
			b.clock.Advance(9 * time.Second) // 17s after the dequeue, past the first lease
			n, err := b.q.RecoverLeases(b.ctx, shard, 100)
			require.NoError(t, err)
			require.Zero(t, n, "an extended lease is not recovered")
			require.Equal(t, runqueue.Stats{InFlight: 1}, queueStats(t, b, queueName))
			b.clock.Advance(time.Second)
			n, err = b.q.RecoverLeases(b.ctx, shard, 100)
			require.NoError(t, err)
			require.Equal(t, 1, n, "the extended lease passes in turn")
		}},
		{name: "RecoverLeases", mutate: lease, fn: func(t *testing.T, b *testBundle) {
			enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "r", Payload: []byte{0, 1}})
			b.clock.Advance(time.Millisecond)
			enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "kept"})
			shard := b.q.ShardOf(env)
			runs := dequeue(t, b, queueName, 2)
			require.Len(t, runs, 2)
			old := runs[0]
			b.clock.Advance(5 * time.Second)
			require.NoError(t, b.q.ExtendLease(b.ctx, runs[1], time.Minute))
			b.clock.Advance(5*time.Second - time.Millisecond)
			n, err := b.q.RecoverLeases(b.ctx, shard, 100)
			require.NoError(t, err)
			require.Zero(t, n, "the lease has not passed")
			b.clock.Advance(time.Millisecond)
			n, err = b.q.RecoverLeases(b.ctx, shard, 100)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			require.Equal(t, runqueue.Stats{Ready: 1, InFlight: 1}, queueStats(t, b, queueName))
			n, err = b.q.RecoverLeases(b.ctx, shard, 100)
			require.NoError(t, err)
			require.Zero(t, n, "recovered once")

			// Until it is delivered again, the old holder's calls find it
			// queued.
			require.ErrorIs(t, b.q.Ack(b.ctx, old), runqueue.ErrNotInFlight)
			again := dequeue(t, b, queueName, 10)
			require.Len(t, again, 1)
			require.Equal(t, "r", again[0].ID)
			require.Equal(t, 2, again[0].Attempt)
			require.Equal(t, []byte{0, 1}, again[0].Payload)
			require.Greater(t, again[0].Token, old.Token)

			require.ErrorIs(t, b.q.Ack(b.ctx, old), runqueue.ErrLeaseLost)
			_, err = b.q.Nack(b.ctx, old, nil)
			require.ErrorIs(t, err, runqueue.ErrLeaseLost)
			require.ErrorIs(t, b.q.ExtendLease(b.ctx, old, time.Minute), runqueue.ErrLeaseLost)
			require.Equal(t, runqueue.Stats{InFlight: 2}, queueStats(t, b, queueName), "the lost holder changed nothing")
			require.NoError(t, b.q.Ack(b.ctx, again[0]))
			require.NoError(t, b.q.Ack(b.ctx, runs[1]))
		}},
		{name: "RecoverLeasesLimit", mutate: lease, fn: func(t *testing.T, b *testBundle) {
			for i := range 5 {
				enqueue(t, b, runqueue.EnqueueParams{ID: string(rune('a' + i))})
			}
			require.Len(t, dequeue(t, b, queueName, 10), 5)
			b.clock.Advance(10 * time.Second)
			n, err := b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 2)
			require.NoError(t, err)
			require.Equal(t, 2, n)
			n, err = b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 100)
			require.NoError(t, err)
			require.Equal(t, 3, n)
			require.Equal(t, runqueue.Stats{Ready: 5}, queueStats(t, b, queueName))
		}},
		{name: "RecoverLeasesDeadLetters", mutate: func(c *runqueue.Config) { lease(c); c.MaxAttempts = 1 }, fn: func(t *testing.T, b *testBundle) {
			enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "r", Payload: []byte("p")})
			r := dequeue(t, b, queueName, 1)[0]
			b.clock.Advance(10 * time.Second)
			n, err := b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 100)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			require.Equal(t, runqueue.Stats{Dead: 1}, queueStats(t, b, queueName))
			d, err := b.q.DeadLetter(b.ctx, env, queueName, "k", "r")
			require.NoError(t, err)
			require.Equal(t, 2, d.Attempt)
			require.Equal(t, []byte("p"), d.Payload)
			require.ErrorIs(t, b.q.Ack(b.ctx, r), runqueue.ErrNotInFlight)
		}},
	}
}
