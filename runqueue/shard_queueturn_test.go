package runqueue_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// TestDequeueShardQueuesOfAnEnvTakeTurns: when an env's share of a shard
// call is smaller than its number of queues with ready runs, its queues
// take turns at the share, whatever the age of their work. Before, the
// share went to the env's queues in master order (the oldest work first,
// ties by name), so queues whose runs were written in one millisecond were
// served in name order, each until its runs of that millisecond were gone
// (helper-155, stop 49: 3 envs x 30 queues x 40 runs, calls of 10, 7 of
// each env's 30 queues served in 60 calls), and a queue with an old
// backlog held the env's other queues until its backlog was served.
//
// Env a has ten queues, env b one; calls of 4 give each env 2 runs, so
// a's ten queues are each first served within ceil(10 / 2) = 5 calls and
// after 20 calls each has 4 runs, give or take one.
func TestDequeueShardQueuesOfAnEnvTakeTurns(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		for _, flag := range []bool{false, true} {
			for _, shape := range []string{"tied", "backlog"} {
				t.Run(fmt.Sprintf("flag=%v/%s", flag, shape), func(t *testing.T) {
					b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = flag; cfg.Shards = 1 })
					start := b.clock.Now()
					var ps []runqueue.EnqueueParams
					for i := range 10 {
						n, at := 20, start // tied: every run of one millisecond
						if shape == "backlog" {
							// a/q0 has an hour-old backlog of 200 runs;
							// the other queues' runs are a minute old.
							n, at = 5, start.Add(-time.Minute)
							if i == 0 {
								n, at = 200, start.Add(-time.Hour)
							}
						}
						for j := range n {
							ps = append(ps, runqueue.EnqueueParams{Env: "a", Queue: fmt.Sprint("q", i),
								ID: fmt.Sprint(j), AvailableAt: at})
						}
					}
					enqueueAll(t, b, ps)
					enqueueN(t, b, "b", "q", 200)
					first := map[string]int{}
					got := map[string]int{}
					const calls = 20
					for call := 1; call <= calls; call++ {
						runs, err := b.q.DequeueShard(b.ctx, 0, 4)
						require.NoError(t, err)
						require.Len(t, runs, 4)
						for _, r := range runs {
							got[r.Env+"/"+r.Queue]++
							if _, ok := first[r.Env+"/"+r.Queue]; !ok {
								first[r.Env+"/"+r.Queue] = call
							}
						}
						ackAll(t, b, runs)
					}
					require.Equal(t, calls*2, got["b/q"], "env b's share")
					for i := range 10 {
						qn := fmt.Sprint("a/q", i)
						require.Contains(t, first, qn, "%s never served in %d calls: %v", qn, calls, got)
						require.LessOrEqual(t, first[qn], 5, "%s first served at call %d: %v", qn, first[qn], first)
						require.InDelta(t, 4, got[qn], 1, "%s's runs in %d calls: %v", qn, calls, got)
					}
				})
			}
		}
	})
}

// TestDequeueShardNewQueuesDoNotShutOutAnEnvsQueues: an env's queues
// first read by a call rank behind its queues waiting since earlier calls,
// so new queues of the env in every call (a queue a run, say) do not take
// its share for ever. Env a has five queues with backlogs and a new queue
// in each call; calls of 2 give it one run a call.
func TestDequeueShardNewQueuesDoNotShutOutAnEnvsQueues(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		for _, flag := range []bool{false, true} {
			t.Run(fmt.Sprintf("flag=%v", flag), func(t *testing.T) {
				b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = flag; cfg.Shards = 1 })
				for i := range 5 {
					enqueueN(t, b, "a", fmt.Sprint("q", i), 50)
				}
				enqueueN(t, b, "b", "q", 100)
				got := map[string]int{}
				const calls = 30
				for call := range calls {
					b.clock.Advance(time.Millisecond)
					enqueueN(t, b, "a", fmt.Sprint("new", call), 1)
					runs, err := b.q.DequeueShard(b.ctx, 0, 2)
					require.NoError(t, err)
					require.Len(t, runs, 2)
					for _, r := range runs {
						got[r.Env+"/"+r.Queue]++
					}
					ackAll(t, b, runs)
				}
				require.Equal(t, calls, got["b/q"], "env b's share")
				t.Logf("served: %v", got)
				for i := range 5 {
					qn := fmt.Sprint("a/q", i)
					require.GreaterOrEqual(t, got[qn], 2, "%s's runs in %d calls beside a new queue a call: %v", qn, calls, got)
				}
			})
		}
	})
}

// TestDequeueShardFailingQueuesBackBehindTheOthers: queues whose calls
// fail (LimitsFor refuses them) go last for shardFailBack (a second) and
// then come back as first read, behind their env's queues that waited
// since: three of them never again come first and stop a call before it
// serves (a call that meets three such failures with nothing served stops
// there). helper-162, at the first version of the queue turns: back with
// the turn they had, the lowest of their env, they came first at every
// return, and a call a second failed (3 of 276) where none had; when their
// work is older than the good queue's, it did so before the turns too.
func TestDequeueShardFailingQueuesBackBehindTheOthers(t *testing.T) {
	t.Parallel()
	for _, older := range []bool{false, true} {
		t.Run(fmt.Sprintf("failingOlder=%v", older), func(t *testing.T) {
			t.Parallel()
			forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
				b := setup(t, c, badLimits)
				bad := func() {
					for i := range 5 {
						enqueueN(t, b, "a", fmt.Sprint("bad", i), 1)
					}
				}
				if older {
					bad()
					b.clock.Advance(time.Second)
				}
				enqueueN(t, b, "a", "good", 400)
				if !older {
					b.clock.Advance(time.Second)
					bad()
				}
				call := func(i int) {
					runs, err := b.q.DequeueShard(b.ctx, 0, 4)
					if older && i == 0 {
						// The first call knows nothing of them: their older
						// work comes first and stops the call.
						require.Error(t, err)
						return
					}
					require.NoError(t, err, "call %d", i)
					require.Len(t, runs, 4, "call %d", i)
					ackAll(t, b, runs)
				}
				callRounds(call)
			})
		})
	}
}

// TestDequeueShardFailingEnvsBackBehindTheOthers: the queues of k envs
// whose calls fail (LimitsFor refuses them), beside an env with a backlog:
// once a second their marks lapse and they come back in their place, the
// first of a call (envs that served nothing rank first). helper-164 (stop
// 51): then three failures with nothing served stopped the call, about one
// call a second (4 calls of 63). A queue that failed within
// shardFailForget fails as a known one, which does not stop a call before
// the others are tried, so only the first calls, which know nothing of
// them, stop (a third of k of them). helper-167 at the first version of
// this fix (their envs' shares served after the others'): with calls of
// fewer runs than envs the failing envs still took the shares and stopped
// the calls of 1, 2 and 3 that followed each lapse.
func TestDequeueShardFailingEnvsBackBehindTheOthers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ bad, maxCount int }{{3, 1}, {3, 2}, {3, 4}, {10, 1}, {10, 4}} {
		t.Run(fmt.Sprintf("bad=%d/maxCount=%d", tc.bad, tc.maxCount), func(t *testing.T) {
			t.Parallel()
			forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
				b := setup(t, c, badEnvLimits)
				enqueueN(t, b, "good", "q", 400)
				b.clock.Advance(time.Second)
				for i := range tc.bad {
					enqueueN(t, b, fmt.Sprint("bad", i), "q", 1)
				}
				// The first calls know nothing of them: they come first,
				// three at a time, and may stop those calls (the first
				// one does).
				first := (tc.bad + 2) / 3
				call := func(i int) {
					runs, err := b.q.DequeueShard(b.ctx, 0, tc.maxCount)
					if i == 0 {
						require.Error(t, err, "call %d", i)
					}
					if i < first {
						ackAll(t, b, runs)
						return
					}
					require.NoError(t, err, "call %d", i)
					require.Len(t, runs, tc.maxCount, "call %d", i)
					ackAll(t, b, runs)
				}
				callRounds(call)
			})
		})
	}
}

// callRounds makes calls 0-15 of call: three rounds of five, each
// followed by a pause past shardFailBack (the failing queues' marks lapse:
// they are back from going late), then one more.
func callRounds(call func(i int)) {
	for round := range 3 {
		for i := range 5 {
			call(round*5 + i)
		}
		time.Sleep(1100 * time.Millisecond)
	}
	call(15)
}
