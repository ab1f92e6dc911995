package runqueue_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// TestDequeueShardRotatingEnvsTakeTurns: envs that a DequeueShard call
// reaches only through its rotating read (their queues sort behind
// another env's 64 oldest queues) take turns, whatever their names. Such
// an env was dropped from the shard's credit between the calls that read
// it, so it came back as new every time, and envs new together were
// ranked by name: 14 of the 65 envs were served in 300 calls of 1
// (helper-125, stop 41). Each env's runs are acked when served.
func TestDequeueShardRotatingEnvsTakeTurns(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, func(cfg *runqueue.Config) { cfg.Shards = 1 })
		start := b.clock.Now()
		var ps []runqueue.EnqueueParams
		for i := range 64 { // env a's 64 queues, the oldest in the shard
			for j := range 5 {
				ps = append(ps, runqueue.EnqueueParams{Env: "a", Queue: fmt.Sprintf("q%02d", i),
					ID: fmt.Sprint(j), AvailableAt: start.Add(-time.Hour)})
			}
		}
		for i := range 64 { // 64 envs of one queue each, behind them
			for j := range 10 {
				ps = append(ps, runqueue.EnqueueParams{Env: fmt.Sprintf("e%02d", i), Queue: "q",
					ID: fmt.Sprint(j), AvailableAt: start.Add(-time.Minute)})
			}
		}
		enqueueAll(t, b, ps)
		got := map[string]int{}
		const calls = 300
		for range calls {
			runs, err := b.q.DequeueShard(b.ctx, 0, 1)
			require.NoError(t, err)
			require.Len(t, runs, 1)
			got[runs[0].Env]++
			ackAll(t, b, runs)
			b.clock.Advance(time.Millisecond)
		}
		var never []string
		for i := range 64 {
			if e := fmt.Sprintf("e%02d", i); got[e] == 0 {
				never = append(never, e)
			}
		}
		t.Logf("runs served by env: %v", got)
		require.Empty(t, never, "envs reached through the rotating read, never served in %d calls: %v", calls, got)
		require.Positive(t, got["a"], "%v", got)
	})
}

// TestDequeueShardComingAndGoingShare: a backlogged env beside m + m envs
// that take turns to have a run each (one run a call for each of m
// envs), calls of m, is served at least its equal share of the 2m + 1
// envs, rounded down, over 60 calls. An env that went away came back
// level with the least served, however far ahead it had been, so the
// envs taking turns took more: 24 runs at m = 3 (share 25.7) and 26 at
// m = 10 (share 28.6).
func TestDequeueShardComingAndGoingShare(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		for _, m := range []int{3, 10} {
			b := setup(t, c, func(cfg *runqueue.Config) { cfg.Shards = 1 })
			enqueueN(t, b, "s", "q", 1000)
			const calls = 60
			got := map[string]int{}
			for k := range calls {
				for j := range m {
					_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: fmt.Sprintf("%s%d", []string{"f", "g"}[k%2], j),
						Queue: "q", ID: fmt.Sprint(k)})
					require.NoError(t, err)
				}
				runs, err := b.q.DequeueShard(b.ctx, 0, m)
				require.NoError(t, err)
				require.Len(t, runs, m)
				for _, r := range runs {
					got[r.Env]++
				}
				ackAll(t, b, runs)
			}
			share := calls * m / (2*m + 1)
			require.GreaterOrEqual(t, got["s"], share, "m = %d: %v", m, got)
		}
	})
}

// TestDequeueShardAwayCreditWearsOff: an env that went away far ahead (its
// several queues took more of each call than the env with one) and comes
// back many calls later with one run is served within ceil(envs /
// maxCount) calls, like any env with a ready run while the envs stay the
// same. The credit it left with was kept whole while it was away, so it
// waited behind envs that had long caught up: call 9 with a bound of 2,
// call 13 with a bound of 4 (helper-127, on the first version of 9c88ada).
func TestDequeueShardAwayCreditWearsOff(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		for _, tc := range []struct{ m, queuesA, others int }{{6, 10, 8}, {3, 6, 8}, {4, 8, 12}} {
			b := setup(t, c, func(cfg *runqueue.Config) { cfg.Shards = 1 })
			serve := func() []*runqueue.Run {
				runs, err := b.q.DequeueShard(b.ctx, 0, tc.m)
				require.NoError(t, err)
				ackAll(t, b, runs)
				return runs
			}
			var ps []runqueue.EnqueueParams
			for i := range tc.queuesA {
				for j := range 3 {
					ps = append(ps, runqueue.EnqueueParams{Env: "a", Queue: fmt.Sprintf("q%02d", i), ID: fmt.Sprint(j)})
				}
			}
			enqueueAll(t, b, ps)
			enqueueN(t, b, "b", "q", 1000)
			for servedA := 0; servedA < 3*tc.queuesA; {
				for _, r := range serve() {
					if r.Env == "a" {
						servedA++
					}
				}
			}
			for range 3 { // a is gone
				serve()
			}
			for i := range tc.others {
				enqueueN(t, b, fmt.Sprintf("o%02d", i), "q", 1000)
			}
			for range 20 {
				serve()
			}
			enqueueN(t, b, "a", "back", 1)
			envs := tc.others + 2
			bound := (envs + tc.m - 1) / tc.m
			wait := 0
			for served := false; !served; {
				wait++
				require.LessOrEqual(t, wait, bound, "%+v: a, back with one run, not served within ceil(%d / %d) calls", tc, envs, tc.m)
				for _, r := range serve() {
					served = served || r.Env == "a"
				}
			}
		}
	})
}

// TestShardHeldQueuesReadFurther: a shard call that its oldest queues
// leave short reads the next ones. Env a has H queues whose only work is
// held (one key at KeyConcurrency 1 holding a run never acked, and one
// more ready run of it), older than env b's ready runs of 10 free keys;
// Shards 1, DequeueShard(0, 10). helper-177 (stop 54): a call reads the
// max(64, 4 x maxCount) oldest due queues and, every other call, as many
// at a moving offset; with 64 or more held queues in front every other
// call came back empty (130: two calls in three) while b had 100 runs it
// could serve, and each DequeueShardWait slept its poll interval. A short
// call now reads up to 3 x that many more: every call serves 10, up to
// 4 x 64 held queues in front. Both flags.
func TestShardHeldQueuesReadFurther(t *testing.T) {
	t.Parallel()
	for _, on := range []bool{false, true} {
		for _, h := range []int{64, 130, 250} {
			t.Run(fmt.Sprintf("vtime=%v/held=%d", on, h), func(t *testing.T) {
				t.Parallel()
				forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
					b := setup(t, c, func(cfg *runqueue.Config) {
						cfg.VtimeScheduling, cfg.KeyConcurrency, cfg.Shards, cfg.LeaseDuration = on, 1, 1, time.Hour
					})
					heldQueues(t, b, "a", 0, h)
					b.clock.Advance(10 * time.Millisecond)
					for i := range 100 {
						enqueue(t, b, runqueue.EnqueueParams{Env: "b", Queue: "q", Key: fmt.Sprint("k", i%10), ID: fmt.Sprint(i)})
					}
					for call := range 6 {
						runs, err := b.q.DequeueShard(b.ctx, 0, 10)
						require.NoError(t, err)
						require.Len(t, runs, 10, "call %d: env b has runs it may serve", call)
						for _, r := range runs {
							require.Equal(t, "b", r.Env)
						}
						ackAll(t, b, runs)
						b.clock.Advance(time.Millisecond)
					}
				})
			})
		}
	}
}

// heldQueues makes queues q<from>..q<to-1> (q000 ...) of env whose only
// work is held: one key at KeyConcurrency 1 (the caller's config) holding
// a run never acked, and one more ready run of it; the clock 1 ms on after
// each, so that they sort in master order.
func heldQueues(t *testing.T, b *testBundle, env string, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		qn := fmt.Sprintf("q%03d", i)
		enqueue(t, b, runqueue.EnqueueParams{Env: env, Queue: qn, Key: "h", ID: "first"})
		runs, err := b.q.Dequeue(b.ctx, env, qn, 10)
		require.NoError(t, err)
		require.Len(t, runs, 1)
		enqueue(t, b, runqueue.EnqueueParams{Env: env, Queue: qn, Key: "h", ID: "second"})
		b.clock.Advance(time.Millisecond)
	}
}
