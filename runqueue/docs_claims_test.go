package runqueue_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// TestNackRetryAtPast: a nack whose retry time is already past retries the
// run now. The past time was stored as the run's ready time: reported by
// the nack's result, the next delivery's AvailableAt (the Observer's wait)
// and Stats.OldestReadyAge (decades for time zero), and, flag off, it put
// the run ahead of runs older than it (helper-142).
func TestNackRetryAtPast(t *testing.T) {
	t.Parallel()
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		enqueue(t, b, runqueue.EnqueueParams{ID: "r", Key: "k1"})
		runs := dequeue(t, b, queueName, 1)
		require.Len(t, runs, 1)
		b.clock.Advance(time.Second)
		enqueue(t, b, runqueue.EnqueueParams{ID: "older", Key: "k2"})
		b.clock.Advance(time.Second)
		now := b.clock.Now()
		res, err := b.q.Nack(b.ctx, runs[0], &runqueue.NackOptions{RetryAt: time.UnixMilli(0)})
		require.NoError(t, err)
		require.True(t, res.Requeued)
		require.Equal(t, now.UnixMilli(), res.RetryAt.UnixMilli(), "retried now")
		st := queueStats(t, b, queueName)
		require.Equal(t, int64(2), st.Ready)
		require.Less(t, st.OldestReadyAge, time.Minute)
		if !on {
			got := dequeue(t, b, queueName, 2)
			require.Equal(t, []string{"older", "r"}, runIDs(got), "age order: the run enqueued before the retry first")
			require.Equal(t, now.UnixMilli(), got[1].AvailableAt.UnixMilli())
		}
	})
}

// TestSetWeightOneClears: weight 1 is the default, not an override:
// SetWeight of 1 clears the key's override, so Weights does not list it
// and it takes none of Config.MaxWeightOverrides (helper-142: stored, it
// was listed and took the last slot from another key).
func TestSetWeightOneClears(t *testing.T) {
	t.Parallel()
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		b.reopen(t, func(cfg *runqueue.Config) { cfg.MaxWeightOverrides = 1 })
		require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, "k1", 3))
		require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, "k1", 1))
		require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, "k2", 1))
		w, err := b.q.Weights(b.ctx, env, queueName)
		require.NoError(t, err)
		require.Empty(t, w)
		require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, "k3", 2), "the one slot is free")
		require.ErrorIs(t, b.q.SetWeight(b.ctx, env, queueName, "k4", 2), runqueue.ErrTooManyWeights)
	})
}
