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
				enqueueAll(t, b, ps)
				b.clock.Advance(2 * time.Second)
				served, total := servedByKey(t, b, calls, maxCount)
				require.Equal(t, calls*maxCount, total, "every call full")
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

// TestDequeueWeightedDelayedLeftAndHeld: what a heavy key leaves of its
// promotion share goes to the others by weight too. Keys w01 and w03
// (weights 1 and 3) have delayed backlogs; w10 (weight 10) either has 5
// runs falling due a call (it leaves most of its share) or is at its key
// limit (held: what it takes goes again to the others). helper-168, at the
// first version of the weighted promotion (its first pass by weight, the
// second and the held variants' re-spread even): w03's part of the w01 +
// w03 serves 0.579 and 0.580, where 0.750 is due (0.505 and 0.510 before
// any weighting).
func TestDequeueWeightedDelayedLeftAndHeld(t *testing.T) {
	t.Parallel()
	for _, held := range []bool{false, true} {
		t.Run(fmt.Sprintf("held=%v", held), func(t *testing.T) {
			t.Parallel()
			forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
				b := setup(t, c, func(cfg *runqueue.Config) {
					cfg.VtimeScheduling = true
					if held {
						cfg.KeyConcurrency = 200
					}
				})
				var ps []runqueue.EnqueueParams
				if held {
					for i := range 200 {
						ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: "w10", ID: fmt.Sprint("held-", i)})
					}
					enqueueAll(t, b, ps)
					require.Len(t, dequeue(t, b, queueName, 200), 200)
					ps = nil
				}
				for _, k := range []string{"w01", "w03"} {
					for i := range 1200 {
						ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: k, ID: fmt.Sprint(k, "-", i), Delay: time.Second})
					}
				}
				for i := range 1200 {
					p := runqueue.EnqueueParams{Env: env, Queue: queueName, Key: "w10", ID: fmt.Sprint("w10-", i), Delay: time.Second}
					if !held {
						if i == 50 {
							break
						}
						p.Delay += time.Duration(i/5) * 10 * time.Millisecond // 5 due a call
					}
					ps = append(ps, p)
				}
				require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, "w03", 3))
				require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, "w10", 10))
				enqueueAll(t, b, ps)
				b.clock.Advance(time.Second)
				served, _ := servedByKey(t, b, 10, 100)
				part := float64(served["w03"]) / float64(served["w01"]+served["w03"])
				t.Logf("served %v; w03 / (w01 + w03) = %.3f (0.750 due)", served, part)
				require.InDelta(t, 0.75, part, 0.03)
			})
		})
	}
}

// TestDequeueWeightedDelayedRunsOut: what a heavy key cannot take of its
// promotion share goes to the others by weight, not by their place in the
// delay index. Keys a01 and d03 (weights 1 and 3) have delayed backlogs
// due together; b03 (weight 3) has 25 runs falling due a call, which it
// promotes in its first two shares (18, then up to 23) and then has no
// more; c10 (weight 10) has 5 a call. helper-170 (stop 52): the third
// pass gave what b03 left to the first in the delay index's order, a01:
// here d03's part of the a01 + d03 serves 0.586 (a01 29 runs a call, d03
// 41; 0.407 in helper-170's shape), where 0.750 is due. The later passes
// now fill by weight (vtime.PromotePlanWeighted): a01 18, d03 53.
func TestDequeueWeightedDelayedRunsOut(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = true })
		const calls = 10
		var ps []runqueue.EnqueueParams
		for _, k := range []string{"a01", "d03"} {
			for i := range 1200 {
				ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: k, ID: fmt.Sprint(k, "-", i), Delay: time.Second})
			}
		}
		for k, perCall := range map[string]int{"b03": 25, "c10": 5} {
			for i := range calls * perCall {
				ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: k, ID: fmt.Sprint(k, "-", i),
					Delay: time.Second + time.Duration(i/perCall)*10*time.Millisecond})
			}
		}
		for k, w := range map[string]float64{"b03": 3, "d03": 3, "c10": 10} {
			require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, k, w))
		}
		enqueueAll(t, b, ps)
		b.clock.Advance(time.Second)
		served, _ := servedByKey(t, b, calls, 100)
		part := float64(served["d03"]) / float64(served["a01"]+served["d03"])
		t.Logf("served %v; d03 / (a01 + d03) = %.3f (0.750 due)", served, part)
		require.InDelta(t, 0.75, part, 0.03)
		require.Equal(t, calls*25, served["b03"], "b03 served every run due")
		require.Equal(t, calls*5, served["c10"], "c10 served every run due")
	})
}

// servedByKey makes calls Dequeue(maxCount) calls of the bundle's queue,
// 10 ms of its clock apart, acking what each serves, and returns the runs
// served by key and in all.
func servedByKey(t *testing.T, b *testBundle, calls, maxCount int) (map[string]int, int) {
	t.Helper()
	served, total := map[string]int{}, 0
	for range calls {
		runs := dequeue(t, b, queueName, maxCount)
		for _, r := range runs {
			served[r.Key]++
		}
		total += len(runs)
		_, err := b.q.AckMany(b.ctx, runs)
		require.NoError(t, err)
		b.clock.Advance(10 * time.Millisecond)
	}
	return served, total
}
