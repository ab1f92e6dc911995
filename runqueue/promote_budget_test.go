package runqueue_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
	"github.com/runqueue/runqueue/vtime"
)

// TestPromoteBudget: a dequeue shares a budget of max(PromoteLimit,
// maxCount) due delayed runs among the due variants it reaches (rounded
// up, at least one each), instead of promoting up to PromoteLimit of each of ScanLimit
// variants. Before, many runs due at once (a cron at midnight) made one
// Dequeue(1000) promote 300,000 runs at the default config (3,000
// variants x 100), 1.5-2.7 s of Redis CPU in one script call; within the
// documented bounds (ScanLimit 10,000, PromoteLimit 500) one Dequeue(1)
// ran 8-12 s and other clients got BUSY (review s26). Each case counts
// what one call moved from delayed to ready, on every backend and flag.
func TestPromoteBudget(t *testing.T) {
	cases := []struct {
		name            string
		keys, perKey    int
		maxCount, scan  int
		promote, served int // runs one call promotes, and serves
	}{
		// 30 of 50 due keys reached (ScanLimit's default, 30 for a
		// Dequeue(1)); 100 shared among them, rounded up: 4 each (1,200
		// before).
		{name: "Dequeue1ManyKeys", keys: 50, perKey: 40, maxCount: 1, promote: 30 * 4, served: 1},
		// One key due: it takes the whole budget, PromoteLimit (100).
		{name: "Dequeue1OneKey", keys: 1, perKey: 500, maxCount: 1, promote: 100, served: 1},
		// Dequeue(1000) reaches all 50 keys: 1,000 shared, 20 each (2,000
		// before: 40 each), and it serves every one of them.
		{name: "Dequeue1000", keys: 50, perKey: 40, maxCount: 1000, promote: 50 * 20, served: 1000},
		// More keys due than the budget: one each, ScanLimit in all.
		{name: "ScanPastBudget", keys: 300, perKey: 3, maxCount: 1, scan: 250, promote: 250, served: 1},
	}
	for _, tc := range cases { // the cases' figures follow the rule
		reached := min(tc.keys, scanOf(tc.scan, tc.maxCount))
		require.Equal(t, tc.promote, reached*vtime.PromoteShare(100, tc.maxCount, reached), tc.name)
	}
	for _, on := range []bool{false, true} {
		for _, tc := range cases {
			t.Run(fmt.Sprintf("vtime=%v/%s", on, tc.name), func(t *testing.T) {
				redistest.ForEachBackend(t, backends, func(t *testing.T, c redis.UniversalClient) {
					b := setup(t, c, func(cfg *runqueue.Config) {
						cfg.VtimeScheduling, cfg.SerialCalls, cfg.ScanLimit = on, true, tc.scan
					})
					var batch []runqueue.EnqueueParams
					flush := func() {
						res, err := b.q.EnqueueMany(b.ctx, batch)
						require.NoError(t, err)
						for _, r := range res {
							require.NoError(t, r.Err)
						}
						batch = batch[:0]
					}
					for k := range tc.keys {
						for i := range tc.perKey {
							batch = append(batch, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprintf("k%d", k),
								ID: fmt.Sprintf("k%d-%d", k, i), Payload: []byte("p"), Delay: time.Second + time.Duration(i)*time.Millisecond})
							if len(batch) == 500 {
								flush()
							}
						}
					}
					flush()
					total := tc.keys * tc.perKey
					require.Equal(t, runqueue.Stats{Delayed: int64(total)}, queueStats(t, b, queueName))
					b.clock.Advance(time.Hour) // every run is due
					runs := dequeue(t, b, queueName, tc.maxCount)
					require.Len(t, runs, tc.served)
					st := queueStats(t, b, queueName)
					require.Equal(t, int64(tc.served), st.InFlight)
					require.Equal(t, int64(tc.promote), int64(total)-st.Delayed, "runs promoted by one call (%+v)", st)
					require.Equal(t, int64(tc.promote-tc.served), st.Ready, "the promoted runs not served are ready")
				})
			})
		}
	}
}

// scanOf is the ScanLimit a dequeue of maxCount uses: the configured one,
// else max(30, 3*maxCount).
func scanOf(scan, maxCount int) int {
	if scan > 0 {
		return scan
	}
	return max(30, 3*maxCount)
}
