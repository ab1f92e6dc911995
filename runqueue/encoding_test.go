package runqueue_test

import (
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/internal/schedfmt"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// registerKeys enqueues one run for each of keys k<from>..k<to-1>: each
// registers with the scheduler (flag on).
func registerKeys(t *testing.T, b *testBundle, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		reviewEnqueue(t, b, fmt.Sprintf("k%d", i), fmt.Sprintf("r%d", i))
	}
}

// wideMarks reports whether ckVtime holds the wide member (at its score)
// and the state hash the wide field (with its value).
func wideMarks(t *testing.T, b *testBundle, qk keys.Queue) (inZSet, inHash bool) {
	t.Helper()
	score, err := b.client.ZScore(b.ctx, qk.CkVtime(), schedfmt.WideMember).Result()
	if err != redis.Nil {
		require.NoError(t, err)
		require.Equal(t, float64(schedfmt.WideScore), score)
		inZSet = true
	}
	v, err := b.client.HGet(b.ctx, qk.CkVtimeState(), schedfmt.WideField).Result()
	if err != redis.Nil {
		require.NoError(t, err)
		require.Equal(t, schedfmt.WideValue, v)
		inHash = true
	}
	return inZSet, inHash
}

// TestSchedulerWideMarks: the scripts add the wide marks that schedfmt
// names (one format, two languages) when the state registers its 64th
// variant (ckVtime then holds 64 entries), not before; the readers of the state do not take them for keys.
func TestSchedulerWideMarks(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = true })
		qk := reviewQK(t, b)
		registerKeys(t, b, 0, schedfmt.WideAt-1)
		z, h := wideMarks(t, b, qk)
		require.False(t, z || h, "no mark before the %dth registration", schedfmt.WideAt)
		registerKeys(t, b, schedfmt.WideAt-1, schedfmt.WideAt)
		z, h = wideMarks(t, b, qk)
		require.True(t, z && h, "both marks at the %dth registration", schedfmt.WideAt)
		require.Greater(t, len(schedfmt.WideMember), 64)
		require.Greater(t, len(schedfmt.WideValue), 64)

		s, err := b.q.Schedule(b.ctx, reviewEnv, reviewQueue, 1000)
		require.NoError(t, err)
		require.Len(t, s.Keys, schedfmt.WideAt)
		for _, k := range s.Keys {
			require.True(t, k.Registered, k.Key)
		}
		lags, err := b.q.TopLags(b.ctx, reviewEnv, reviewQueue, 100)
		require.NoError(t, err)
		for _, l := range lags {
			require.Regexp(t, `^k\d+$`, l.Key)
		}
		// The queue drains whole, the marks left alone.
		got := 0
		for {
			runs, err := b.q.Dequeue(b.ctx, reviewEnv, reviewQueue, 10)
			require.NoError(t, err)
			if len(runs) == 0 {
				break
			}
			got += len(runs)
		}
		require.Equal(t, schedfmt.WideAt, got)
		z, h = wideMarks(t, b, qk)
		require.True(t, z && h)
	})
}

// requireStateEncoding checks the Redis encodings of the scheduler's two
// keys (OBJECT ENCODING: a real Redis only), with their memory in the
// message.
func requireStateEncoding(t *testing.T, b *testBundle, qk keys.Queue, zset, hash, step string) {
	t.Helper()
	z, err := b.client.ObjectEncoding(b.ctx, qk.CkVtime()).Result()
	require.NoError(t, err, step)
	h, err := b.client.ObjectEncoding(b.ctx, qk.CkVtimeState()).Result()
	require.NoError(t, err, step)
	zm, _ := b.client.MemoryUsage(b.ctx, qk.CkVtime()).Result()
	hm, _ := b.client.MemoryUsage(b.ctx, qk.CkVtimeState()).Result()
	require.Equal(t, []string{zset, hash}, []string{z, h},
		"%s: ckVtime and state hash encodings (memory %d + %d bytes)", step, zm, hm)
}

// TestSchedulerStateEncoding: on a real Redis at its default
// *-max-listpack-* settings, a small state stays a listpack (compact), and
// from the 64th key on the scheduler's two keys are a skiplist
// and a hash table (a listpack is walked by every lookup: see
// lua/lib/sched_reg.lua), also once the state is started again after it is
// lost and grows again.
func TestSchedulerStateEncoding(t *testing.T) {
	c := redistest.Real(t)
	b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = true })
	qk := reviewQK(t, b)
	check := func(step, zset, hash string) {
		t.Helper()
		requireStateEncoding(t, b, qk, zset, hash, step)
	}
	_, err := b.q.Dequeue(b.ctx, reviewEnv, reviewQueue, 1) // the state, empty
	require.NoError(t, err)
	registerKeys(t, b, 0, schedfmt.WideAt-1)
	check("63 keys", "listpack", "listpack")
	registerKeys(t, b, schedfmt.WideAt-1, schedfmt.WideAt)
	check("64 keys", "skiplist", "hashtable")
	_, err = b.q.Dequeue(b.ctx, reviewEnv, reviewQueue, 100)
	require.NoError(t, err)
	check("after a dequeue", "skiplist", "hashtable")

	require.NoError(t, c.Del(b.ctx, qk.CkVtime(), qk.CkVtimeState()).Err())
	_, err = b.q.Dequeue(b.ctx, reviewEnv, reviewQueue, 1) // a fresh state
	require.NoError(t, err)
	registerKeys(t, b, 100, 100+schedfmt.WideAt-1)
	check("a fresh state of 63 keys", "listpack", "listpack")
	registerKeys(t, b, 200, 201)
	check("a fresh state of 64 keys", "skiplist", "hashtable")
}
