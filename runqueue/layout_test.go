package runqueue_test

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// TestLayoutVersion: New records the layout version under its prefix and
// refuses a prefix that holds another one, with a typed error and nothing
// else written.
func TestLayoutVersion(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, nil)
		space, err := keys.NewSpace(b.prefix, b.q.Shards())
		require.NoError(t, err)
		got, err := c.Get(b.ctx, space.Layout()).Result()
		require.NoError(t, err)
		// Spelled out: a change of what is stored changes this number.
		require.Equal(t, "9", got)

		// A second instance on the same prefix agrees.
		q2, err := runqueue.New(b.ctx, c, &runqueue.Config{Prefix: b.prefix, Clock: b.clock})
		require.NoError(t, err)
		require.NoError(t, q2.Close())

		// Another version is refused.
		require.NoError(t, c.Set(b.ctx, space.Layout(), "2", 0).Err())
		before := b.dump(t)
		_, err = runqueue.New(b.ctx, c, &runqueue.Config{Prefix: b.prefix, Clock: b.clock})
		require.ErrorIs(t, err, runqueue.ErrLayout)
		var le *runqueue.LayoutError
		require.ErrorAs(t, err, &le)
		require.Equal(t, "2", le.Found)
		require.Equal(t, runqueue.LayoutVersion, le.Want)
		require.Contains(t, err.Error(), "drain")
		require.Equal(t, before, b.dump(t))
	})
}
