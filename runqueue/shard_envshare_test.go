package runqueue_test

import (
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// TestDequeueShardEnvShareWhateverItsQueues: a shard call shares maxCount
// among envs, not among queues, so an env with backlogs in five queues
// takes no more of the calls than an env with a backlog in one. Before
// 2026-12-06 each queue of a call's plan had an even share: the env of one
// queue got 33 of 200 runs in 20 calls of 10 (and 24 of 140 in calls of 7)
// beside an env of five.
func TestDequeueShardEnvShareWhateverItsQueues(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		for _, flag := range []bool{false, true} {
			for _, maxCount := range []int{10, 7, 2} {
				t.Run(fmt.Sprintf("flag=%v/max=%d", flag, maxCount), func(t *testing.T) {
					b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = flag; cfg.Shards = 1 })
					for i := range 5 {
						enqueueN(t, b, "many", fmt.Sprint("q", i), 60)
					}
					enqueueN(t, b, "one", "q", 300)
					const calls = 20
					got := map[string]int{}
					for range calls {
						runs, err := b.q.DequeueShard(b.ctx, 0, maxCount)
						require.NoError(t, err)
						require.Len(t, runs, maxCount, "both envs have backlogs: every call is full")
						for _, r := range runs {
							got[r.Env]++
						}
						ackAll(t, b, runs)
					}
					// Calls of an odd maxCount alternate the run that does
					// not divide between the envs (the least served first).
					half := calls * maxCount / 2
					require.Equal(t, map[string]int{"many": half, "one": half}, got)
				})
			}
		}
	})
}
