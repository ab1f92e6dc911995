package runqueue_test

import (
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// TestPromotionReachesEveryDueKey: with the flag on, a key whose delayed
// runs fall due is promoted (gains a ready run) within ceil(a / ScanLimit)
// + 1 calls, a the due keys ahead of it in the delay index, however many
// runs those keys have due (design.md guarantee 13). A call reaches the
// first ScanLimit due keys and moves each that keeps due runs behind the
// others. Before, a key waited until every key ahead had promoted all
// its due runs before its own: 30 keys of 400 due runs held a 31st key's
// one run for 109 Dequeue(10) calls (1,081 serves); now it is promoted at
// the second call (the case Burst, at the defaults). Random bursts on
// every backend; the clock moves 1 ms a call.
func TestPromotionReachesEveryDueKey(t *testing.T) {
	for seed := range 5 {
		burst := seed == 4
		name := fmt.Sprintf("seed=%d", seed)
		if burst {
			name = "Burst"
		}
		t.Run(name, func(t *testing.T) {
			redistest.ForEachBackend(t, backends, func(t *testing.T, c redis.UniversalClient) {
				rng := rand.New(rand.NewSource(int64(seed)))
				scan := []int{10, 25, 30}[rng.Intn(3)]
				promote := []int{1, 7, 100}[rng.Intn(3)]
				maxCount := 1 + rng.Intn(10)
				floods, floodRuns, smalls := 20+rng.Intn(50), func() int { return 5 + rng.Intn(60) }, 1+rng.Intn(5)
				floodAt := func() time.Duration { return time.Second + time.Duration(rng.Intn(1000))*time.Millisecond }
				smallAt := func() time.Duration { return time.Second + time.Duration(rng.Intn(2000))*time.Millisecond }
				if burst { // the defaults: ScanLimit 30 for a Dequeue(10), PromoteLimit 100
					scan, promote, maxCount = 30, 100, 10
					floods, floodRuns, smalls = 30, func() int { return 400 }, 1
					floodAt = func() time.Duration { return time.Second }
					smallAt = func() time.Duration { return time.Second + time.Millisecond }
				}
				b := setup(t, c, func(cfg *runqueue.Config) {
					cfg.VtimeScheduling, cfg.SerialCalls = true, true
					cfg.ScanLimit, cfg.PromoteLimit = scan, promote
				})
				var batch []runqueue.EnqueueParams
				due := map[string]int{}
				for k := range floods {
					key := fmt.Sprintf("f%02d", k)
					due[key] = floodRuns()
					for i := range due[key] {
						batch = append(batch, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: key,
							ID: fmt.Sprintf("%s-%d", key, i), Delay: floodAt()})
					}
				}
				for k := range smalls {
					key := fmt.Sprintf("s%d", k)
					due[key] = 1
					batch = append(batch, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: key,
						ID: key, Delay: smallAt()})
				}
				for i := 0; i < len(batch); i += 500 {
					res, err := b.q.EnqueueMany(b.ctx, batch[i:min(i+500, len(batch))])
					require.NoError(t, err)
					for _, r := range res {
						require.NoError(t, r.Err)
					}
				}
				b.clock.Advance(4 * time.Second) // every run due
				order, err := c.ZRange(b.ctx, keySpace(t, b).Env(env).Queue(queueName).DelayIndex(), 0, -1).Result()
				require.NoError(t, err)
				require.Len(t, order, len(due))
				bound := map[string]int{}
				for rank, m := range order {
					key, err := keys.DecodeVariantMember(m)
					require.NoError(t, err)
					bound[key] = (rank+scan-1)/scan + 1
				}
				reached := map[string]int{}
				for call := 1; len(reached) < len(due); call++ {
					require.LessOrEqual(t, call, len(due)/scan+2, "keys not reached: %d of %d", len(due)-len(reached), len(due))
					dequeue(t, b, queueName, maxCount)
					for key, n := range due {
						if _, ok := reached[key]; ok {
							continue
						}
						s, err := b.q.KeyStats(b.ctx, env, queueName, key)
						require.NoError(t, err)
						if int(s.Delayed) < n {
							reached[key] = call
							require.LessOrEqual(t, call, bound[key], "key %s (bound %d) first promoted at call %d "+
								"(scan %d, promote limit %d, maxCount %d, %d keys due)", key, bound[key], call,
								scan, promote, maxCount, len(due))
						}
					}
					b.clock.Advance(time.Millisecond)
				}
			})
		})
	}
}
