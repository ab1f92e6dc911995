package runqueue_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// TestDequeueShardEnvShareWhateverItsQueues: a shard call shares maxCount
// among envs, not among queues, so an env with backlogs in five queues
// takes no more of the calls than an env with a backlog in one. Before
// 2026-12-06 each queue of a call's plan had an even share: the env of one
// queue got 40 of 200 runs in 20 calls of 10 (and 39 of 140 in calls of 7)
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

// TestDequeueShardEnvShareCappedOldestQueue: an env whose queue with the
// oldest work is at its limit (a queue limit, or its one key's) takes its
// share of a shard call from its other queues. helper-155, at the first
// version of the env shares (the env's share given to its queues in plan
// order, each its part): the capped queue, first in the plan, took the
// env's share of 1 and served none, so the env got 1 run in 40 calls of 4
// beside two envs (53 each is an even share; 40 before env shares).
func TestDequeueShardEnvShareCappedOldestQueue(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"queue", "key"} {
		for _, tc := range []struct{ others, max, queues int }{{2, 3, 2}, {2, 4, 2}, {2, 10, 5}, {4, 6, 3}} {
			t.Run(fmt.Sprintf("%s/others=%d/max=%d/queues=%d", kind, tc.others, tc.max, tc.queues), func(t *testing.T) {
				t.Parallel()
				forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
					b := setup(t, c, func(cfg *runqueue.Config) {
						cfg.VtimeScheduling = true
						cfg.Shards = 1
						cfg.LimitsFor = func(env, queue string) runqueue.Limits {
							if env != "a" || queue != "q0" {
								return runqueue.Limits{}
							}
							if kind == "queue" {
								return runqueue.Limits{Queue: 1}
							}
							return runqueue.Limits{Key: 1}
						}
					})
					// a/q0: the oldest work of the shard, one run held, four
					// more ready behind it.
					old := b.clock.Now().Add(-time.Hour)
					var ps []runqueue.EnqueueParams
					for j := range 5 {
						ps = append(ps, runqueue.EnqueueParams{Env: "a", Queue: "q0", Key: "k", ID: fmt.Sprint(j), AvailableAt: old})
					}
					enqueueAll(t, b, ps)
					held, err := b.q.Dequeue(b.ctx, "a", "q0", 1)
					require.NoError(t, err)
					require.Len(t, held, 1)
					ps = nil
					for j := range 200 {
						at := old.Add(time.Minute + time.Duration(j)*time.Second)
						for i := 1; i < tc.queues; i++ {
							ps = append(ps, runqueue.EnqueueParams{Env: "a", Queue: fmt.Sprint("q", i), ID: fmt.Sprint(j), AvailableAt: at})
						}
						for o := range tc.others {
							ps = append(ps, runqueue.EnqueueParams{Env: fmt.Sprint("o", o), Queue: "q", ID: fmt.Sprint(j), AvailableAt: at})
						}
					}
					enqueueAll(t, b, ps)
					const calls = 30
					got := map[string]int{}
					for range calls {
						runs, err := b.q.DequeueShard(b.ctx, 0, tc.max)
						require.NoError(t, err)
						require.Len(t, runs, tc.max, "every call is full")
						for _, r := range runs {
							got[r.Env]++
						}
						ackAll(t, b, runs)
						b.clock.Advance(time.Millisecond)
					}
					// Every env takes an even share, give or take the run
					// that does not divide.
					even := calls * tc.max / (tc.others + 1)
					for e, n := range got {
						require.InDelta(t, even, n, 1, "env %s: %v", e, got)
					}
					require.Len(t, got, tc.others+1, "every env served: %v", got)
				})
			})
		}
	}
}

// TestDequeueShardEnvShareScriptCalls: a shard call makes one script call
// a run (but for queues found without one) when an env with many queues of
// one run each sits beside envs of one run: what the light envs leave goes
// first to the heavy env's queues the call has not visited, not to those
// that just served their last run. helper-155, at the first version of the
// env shares: 14 script calls for 10 runs (30 queues of one run beside two
// envs of one), 198 for 100 (200 queues beside one); 10 and 100 before.
func TestDequeueShardEnvShareScriptCalls(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ queues, light, max int }{{30, 2, 10}, {10, 3, 8}, {200, 1, 100}} {
		t.Run(fmt.Sprintf("queues=%d/light=%d/max=%d", tc.queues, tc.light, tc.max), func(t *testing.T) {
			t.Parallel()
			b := setup(t, redistest.Real(t), func(cfg *runqueue.Config) { cfg.Shards = 1 })
			q, calls := s18fCounted(t, b, nil)
			at := b.clock.Now().Add(-time.Hour)
			var ps []runqueue.EnqueueParams
			for i := range tc.queues {
				ps = append(ps, runqueue.EnqueueParams{Env: "h", Queue: fmt.Sprint("q", i), ID: "r", AvailableAt: at.Add(time.Duration(i) * time.Millisecond)})
			}
			for l := range tc.light {
				ps = append(ps, runqueue.EnqueueParams{Env: fmt.Sprint("l", l), Queue: "q", ID: "r", AvailableAt: at})
			}
			enqueueAll(t, b, ps)
			runs, err := q.DequeueShard(b.ctx, 0, tc.max)
			require.NoError(t, err)
			require.Len(t, runs, tc.max)
			require.Equal(t, tc.max, calls.get()["dequeue"], "script calls: %v", calls.get())
		})
	}
}
