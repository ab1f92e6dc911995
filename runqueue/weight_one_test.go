package runqueue_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// TestSetWeightOneClears: weight 1 is the default, not an override:
// SetWeight of 1 clears the key's override, so Weights does not list it
// and it takes none of Config.MaxWeightOverrides (helper-142: stored, it
// was listed and took the last slot from another key). So does any weight
// the scheduler holds as 1 (1.0004, 0.9996: the nearest 0.001), which was
// stored as an override until 2026-12-07.
func TestSetWeightOneClears(t *testing.T) {
	t.Parallel()
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		b.reopen(t, func(cfg *runqueue.Config) { cfg.MaxWeightOverrides = 1 })
		require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, "k1", 3))
		require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, "k1", 1))
		require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, "k2", 1))
		// Weights the scheduler holds as 1 (the nearest 0.001) are 1 too.
		require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, "k5", 3))
		require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, "k5", 1.0004))
		require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, "k6", 0.9996))
		w, err := b.q.Weights(b.ctx, env, queueName)
		require.NoError(t, err)
		require.Empty(t, w)
		require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, "k3", 2), "the one slot is free")
		require.ErrorIs(t, b.q.SetWeight(b.ctx, env, queueName, "k4", 2), runqueue.ErrTooManyWeights)
		require.ErrorIs(t, b.q.SetWeight(b.ctx, env, queueName, "k4", 1.0006), runqueue.ErrTooManyWeights,
			"1.0006 is held as 1.001: an override")
		require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, "k3", 1.0004), "clears k3's")
		require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, "k4", 1.0006))
		w, err = b.q.Weights(b.ctx, env, queueName)
		require.NoError(t, err)
		require.Equal(t, map[string]float64{"k4": 1.0006}, w)
	})
}
