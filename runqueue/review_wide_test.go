package runqueue_test

import (
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/internal/schedfmt"
	"github.com/runqueue/runqueue/runqueue"
)

// cycleOneKey enqueues, dequeues and acks one run of the key "only" n
// times (the key registers again at every cycle), then enqueues one more.
func cycleOneKey(t *testing.T, b *testBundle, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		reviewEnqueue(t, b, "only", fmt.Sprintf("r%d", i))
		runs, err := b.q.Dequeue(b.ctx, reviewEnv, reviewQueue, 1)
		require.NoError(t, err)
		require.Len(t, runs, 1)
		require.NoError(t, b.q.Ack(b.ctx, runs[0]))
	}
	reviewEnqueue(t, b, "only", "last")
}

// TestReviewWideMarksOneKeyCycling: a queue with ONE key that keeps up
// (enqueue, dequeue, ack, again) never registers a 64th key, yet the
// registration counter counts every re-registration, so after 64 cycles
// the one-key state gets the wide marks (skiplist + hashtable), the
// memory price the commit says small states no longer pay.
func TestReviewWideMarksOneKeyCycling(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = true })
		qk := reviewQK(t, b)
		cycleOneKey(t, b, 2*schedfmt.WideAt)
		z, h := wideMarks(t, b, qk)
		require.False(t, z || h, "a state that only ever registered 1 key got the wide marks (zset %v, hash %v)", z, h)
	})
}

// TestReviewWideEncodingOneKey: the same on a real Redis, by encoding.
func TestReviewWideEncodingOneKey(t *testing.T) {
	c := redistest.Real(t)
	b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = true })
	qk := reviewQK(t, b)
	cycleOneKey(t, b, 2*schedfmt.WideAt)
	requireStateEncoding(t, b, qk, "listpack", "listpack",
		fmt.Sprintf("one-key state after %d cycles", 2*schedfmt.WideAt))
}

// TestReviewWideMarkTakesInspectSlot: readScheduler reads ckVtime ranks
// 0..3*limit+1 and refuses more than 3*limit+1 entries ("sentinel, parked,
// active and gated entries: up to limit of each"). The wide mark is none
// of these but takes one of the slots: a state with limit parked, limit
// competing and limit gated entries, readable without the mark, is
// ErrTooLarge with it.
func TestReviewWideMarkTakesInspectSlot(t *testing.T) {
	c := redistest.Real(t)
	b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = true })
	qk := reviewQK(t, b)
	L := runqueue.MaxInspectVariants
	zs := []redis.Z{{Score: 0, Member: schedfmt.SentinelMember}}
	hs := []any{"v", 0, "e", 0, "c", 0, "s", 2*L + 1, "x", b.clock.Now().UnixMilli() + 86400000,
		"gk", 1, "gn", L + 1, "gp", 0, "ng", L, "nw", -1, "lh", "", schedfmt.WideField, schedfmt.WideValue}
	code := func(n int) string { return fmt.Sprintf("%015d", n) }
	for i := 0; i < L; i++ {
		zs = append(zs, redis.Z{Score: float64(10 - schedfmt.GatedOffset), Member: fmt.Sprintf("=p%d", i)})
		cm := fmt.Sprintf("=c%d", i)
		zs = append(zs, redis.Z{Score: 5, Member: code(i+1) + cm})
		hs = append(hs, cm, code(i+1))
		gm := fmt.Sprintf("=g%d", i)
		zs = append(zs, redis.Z{Score: float64(schedfmt.GatedOffset + i + 1), Member: code(L+i+1) + gm})
		hs = append(hs, gm, code(L+i+1)+"g7")
	}
	require.NoError(t, c.ZAdd(b.ctx, qk.CkVtime(), zs...).Err())
	require.NoError(t, c.HSet(b.ctx, qk.CkVtimeState(), hs...).Err())
	_, exists, err := b.q.SchedulerSnapshot(b.ctx, reviewEnv, reviewQueue)
	require.NoError(t, err, "without the wide member")
	require.True(t, exists)
	require.NoError(t, c.ZAdd(b.ctx, qk.CkVtime(), redis.Z{Score: schedfmt.WideScore, Member: schedfmt.WideMember}).Err())
	_, _, err = b.q.SchedulerSnapshot(b.ctx, reviewEnv, reviewQueue)
	require.NoError(t, err, "with the wide member (same parked/active/gated entries)")
}
