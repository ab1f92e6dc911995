package runqueue_test

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/internal/schedfmt"
	"github.com/runqueue/runqueue/runqueue"
)

// TestSchedulerStateMarks: the scripts write the sentinel member and the
// hash mark that Go reads and writes as schedfmt's constants (one format,
// two languages), on both backends.
func TestSchedulerStateMarks(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = true })
		qk := reviewQK(t, b)
		reviewEnqueue(t, b, "a", "a1")
		_, err := b.q.Dequeue(b.ctx, reviewEnv, reviewQueue, 1) // creates the state
		require.NoError(t, err)
		// Rank 0 of the competing region (from score 0).
		first, err := c.ZRangeByScoreWithScores(b.ctx, qk.CkVtime(),
			&redis.ZRangeBy{Min: schedfmt.ActiveMin, Max: schedfmt.ActiveEnd, Count: 1}).Result()
		require.NoError(t, err)
		require.Equal(t, []redis.Z{{Score: 0, Member: schedfmt.SentinelMember}}, first)
		mark, err := c.HGet(b.ctx, qk.CkVtimeState(), schedfmt.HashMarkField).Result()
		require.NoError(t, err)
		require.Equal(t, schedfmt.HashMark, mark)
		require.Greater(t, len(schedfmt.SentinelMember), 64)
		require.Greater(t, len(schedfmt.HashMark), 64)
	})
}

// TestSchedulerStateNeverListpack: on a real Redis at its default
// *-max-listpack-* settings, the scheduler's two keys are a skiplist and a
// hash table from their creation, however few keys the queue has (a
// listpack is walked by every lookup: see lua/lib/sched.lua), and stay so
// when the state is started again after it is lost.
func TestSchedulerStateNeverListpack(t *testing.T) {
	c := redistest.Real(t)
	b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = true })
	qk := reviewQK(t, b)
	check := func(step string) {
		t.Helper()
		z, err := c.ObjectEncoding(b.ctx, qk.CkVtime()).Result()
		require.NoError(t, err, step)
		require.Equal(t, "skiplist", z, "%s: ckVtime", step)
		h, err := c.ObjectEncoding(b.ctx, qk.CkVtimeState()).Result()
		require.NoError(t, err, step)
		require.Equal(t, "hashtable", h, "%s: state hash", step)
	}
	reviewEnqueue(t, b, "a", "a1")
	reviewEnqueue(t, b, "b", "b1")
	check("after the first enqueues")
	_, err := b.q.Dequeue(b.ctx, reviewEnv, reviewQueue, 1)
	require.NoError(t, err)
	check("after a dequeue")
	require.NoError(t, c.Del(b.ctx, qk.CkVtime(), qk.CkVtimeState()).Err())
	reviewEnqueue(t, b, "c", "c1")
	check("after the state was lost and an enqueue started it again")
}
