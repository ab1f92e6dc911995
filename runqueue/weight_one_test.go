package runqueue_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

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
