package runqueue_test

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// Review of the sentinel's move to score 0 (d263b2d): sched_state no
// longer checks the sentinel, so a writer other than the dequeue meets a
// state hash without its ckVtime as if it were whole.

// TestReviewCkVtimeRecreatedWithoutTTL: "the key lives exactly as long as
// the state hash (created, refreshed and expiring together)". ckVtime goes
// (by hand, or evicted), and an enqueue of a new key registers it: the
// ZADD makes ckVtime again, without the sentinel and without a TTL (the
// hash's lifetime is not due for a refresh). Until some later script
// meets the state, ckVtime lives for ever.
func TestReviewCkVtimeRecreatedWithoutTTL(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = true })
		qk := reviewQK(t, b)
		reviewEnqueue(t, b, "a", "a1")
		require.NoError(t, c.Del(b.ctx, qk.CkVtime()).Err())
		reviewEnqueue(t, b, "b", "b1")
		hashTTL, err := c.PTTL(b.ctx, qk.CkVtimeState()).Result()
		require.NoError(t, err)
		require.Positive(t, hashTTL)
		zTTL, err := c.PTTL(b.ctx, qk.CkVtime()).Result()
		require.NoError(t, err)
		require.Positive(t, zTTL, "ckVtime expires with its hash")
	})
}
