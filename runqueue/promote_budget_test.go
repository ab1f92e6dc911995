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

// TestPromoteBudget: a dequeue spends a budget of max(PromoteLimit,
// maxCount) due delayed runs on the due variants it reaches
// (vtime.PromotePlan: the same share of it each, rounded up, then what a
// variant left unused to those that filled their share),
// instead of promoting up to PromoteLimit of each of ScanLimit variants.
// Before, many runs due at once (a cron at midnight) made one
// Dequeue(1000) promote 300,000 runs at the default config (3,000
// variants x 100), 1.5-2.7 s of Redis CPU in one script call; within the
// documented bounds (ScanLimit 10,000, PromoteLimit 500) one Dequeue(1)
// ran 8-12 s and other clients got BUSY (review s26). And a share left
// unused is not lost: one key of 500 due runs beside nine of one
// (UnevenDue) still fills a Dequeue(100), where an even share alone
// promoted 19 runs and served 19 (review s27). Each case counts what one
// call moved from delayed to ready, on every backend and flag.
func TestPromoteBudget(t *testing.T) {
	rep := func(n, v int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = v
		}
		return out
	}
	cases := []struct {
		name            string
		due             []int // due runs per key
		maxCount, scan  int
		promote, served int // runs one call promotes, and serves
	}{
		// 30 of 50 due keys reached (ScanLimit's default, 30 for a
		// Dequeue(1)); the budget of 100 shared among them, 4 each
		// rounded up, 120 in all (1,200 before the budget; 100 while the
		// first 10 took 4 and the other 20 took 3 in every call).
		{name: "Dequeue1ManyKeys", due: rep(50, 40), maxCount: 1, promote: 120, served: 1},
		// One key due: it takes the whole budget, PromoteLimit (100).
		{name: "Dequeue1OneKey", due: []int{500}, maxCount: 1, promote: 100, served: 1},
		// Dequeue(1000) reaches all 50 keys: 20 each (2,000 before: 40
		// each), and it serves every one of them.
		{name: "Dequeue1000", due: rep(50, 40), maxCount: 1000, promote: 1000, served: 1000},
		// More keys due than the budget: one each, ScanLimit in all.
		{name: "ScanPastBudget", due: rep(300, 3), maxCount: 1, scan: 250, promote: 250, served: 1},
		// What the small keys leave goes to the large one.
		{name: "UnevenDue", due: append([]int{500}, rep(9, 1)...), maxCount: 100, promote: 100, served: 100},
	}
	for _, tc := range cases { // the cases' figures follow the plan
		reached := min(len(tc.due), tc.scan)
		if tc.scan == 0 {
			reached = min(len(tc.due), max(30, 3*tc.maxCount))
		}
		plan, _ := vtime.PromotePlan(100, tc.maxCount, tc.due[:reached], nil)
		total := 0
		for _, n := range plan {
			total += n
		}
		require.Equal(t, tc.promote, total, tc.name)
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
					total := 0
					for k, n := range tc.due {
						for i := range n {
							batch = append(batch, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprintf("k%d", k),
								ID: fmt.Sprintf("k%d-%d", k, i), Payload: []byte("p"), Delay: time.Second + time.Duration(i)*time.Millisecond})
							if len(batch) == 500 {
								flush()
							}
						}
						total += n
					}
					flush()
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
