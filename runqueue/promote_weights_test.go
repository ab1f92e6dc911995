package runqueue_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// TestDequeueWeightedDelayedShare: 30 keys whose work all arrives as
// delayed runs, due together; key w10 has weight 10, the others 1. A call
// promotes a budget of max(PromoteLimit, maxCount) runs, and where it
// serves about as many as it promotes the promotion decides the serves.
// helper-165 (stop 52): the budget went evenly to the due variants, so w10
// was served as one of the others: 0.040 of the serves at maxCount 100
// and 0.035 at 200, against 10 / 39 = 0.256 (0.256 with the same runs
// enqueued ready). The first pass now shares the budget by weight
// (vtime.PromotePlanWeighted).
func TestDequeueWeightedDelayedShare(t *testing.T) {
	t.Parallel()
	for _, maxCount := range []int{10, 100, 200} {
		t.Run(fmt.Sprintf("maxCount=%d", maxCount), func(t *testing.T) {
			t.Parallel()
			forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
				b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = true })
				require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, "w10", 10))
				const keys, calls = 30, 20
				want := 10.0 / (10 + keys - 1)
				// Enough that no key runs out in the calls: w10 about
				// want x maxCount a call, the others a few more than
				// their promoted share.
				heavy, light := int(want*float64(maxCount*calls))+maxCount, 4*maxCount*calls/keys+20
				var ps []runqueue.EnqueueParams
				for k := range keys {
					key, n := fmt.Sprint("k", k), light
					if k == 0 {
						key, n = "w10", heavy
					}
					for i := range n {
						ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: key,
							ID: fmt.Sprint(key, "-", i), Payload: []byte("x"), Delay: time.Second})
					}
				}
				for len(ps) > 0 {
					chunk := ps[:min(1000, len(ps))]
					ps = ps[len(chunk):]
					res, err := b.q.EnqueueMany(b.ctx, chunk)
					require.NoError(t, err)
					for _, r := range res {
						require.NoError(t, r.Err)
					}
				}
				b.clock.Advance(2 * time.Second)
				served := map[string]int{}
				total := 0
				for range calls {
					runs, err := b.q.Dequeue(b.ctx, env, queueName, maxCount)
					require.NoError(t, err)
					require.Len(t, runs, maxCount)
					for _, r := range runs {
						served[r.Key]++
					}
					total += len(runs)
					_, err = b.q.AckMany(b.ctx, runs)
					require.NoError(t, err)
					b.clock.Advance(10 * time.Millisecond)
				}
				share := float64(served["w10"]) / float64(total)
				t.Logf("w10 %d of %d serves (%.3f, want %.3f)", served["w10"], total, share, want)
				require.InDelta(t, want, share, 0.02, "w10's share of the serves")
				for k := 1; k < keys; k++ {
					require.Positive(t, served[fmt.Sprint("k", k)], "k%d served", k)
				}
			})
		})
	}
}
