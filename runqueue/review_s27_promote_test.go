package runqueue_test

// Review s27 of ff1ad6a (a dequeue's promotion shares a budget of
// max(PromoteLimit, maxCount) among the due variants it reaches) and
// 5d5b70f (flag-off age window bound = first entry left out).
//
// Fixed defect (it failed on ff1ad6a; the two-pass plan, vtime.PromotePlan,
// mends it):
//   - TestS27UnderServeUnevenDue: a Dequeue(100) with one key of 500 due
//     delayed runs and 9 keys of one due run each serves 19 runs (9 + the
//     bulk key's share of ceil(100/10) = 10) although 509 runs are due;
//     before ff1ad6a it served 100. The share a variant with fewer due
//     runs leaves unused is not given to the others, so a call promotes
//     (and serves) less than maxCount while its variants have them.
//
// Regression probes (hold):
//   - TestS27MasterExactAfterFlagOffDequeue: after every flag-off dequeue
//     the shard-master score is exactly min(ckIndex head, delayIndex
//     head): score ties ordered by member bytes, a served variant moving
//     to exactly the bound's score, a window read whole, key limits
//     (reach = scan), priorities, promotion before the read.
//   - TestS27MasterBoundTie: the served variant's next head ties the
//     bound's score (member before and after it); a window read whole.

import (
	"context"
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

func TestS27UnderServeUnevenDue(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			c := redistest.Real(t)
			b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling, cfg.SerialCalls = on, true })
			var batch []runqueue.EnqueueParams
			for i := range 500 {
				batch = append(batch, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: "bulk",
					ID: fmt.Sprintf("bulk-%d", i), Payload: []byte("p"), Delay: time.Second})
			}
			for k := range 9 {
				batch = append(batch, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprintf("retry%d", k),
					ID: fmt.Sprintf("r%d", k), Payload: []byte("p"), Delay: 2 * time.Second})
			}
			for i := 0; i < len(batch); i += 100 {
				res, err := b.q.EnqueueMany(b.ctx, batch[i:min(i+100, len(batch))])
				require.NoError(t, err)
				for _, r := range res {
					require.NoError(t, r.Err)
				}
			}
			b.clock.Advance(time.Minute) // all 509 runs due
			runs := dequeue(t, b, queueName, 100)
			st := queueStats(t, b, queueName)
			t.Logf("served %d, stats %+v", len(runs), st)
			require.Equal(t, 100, len(runs), "Dequeue(100) with 509 due runs (one key of 500, nine of 1) serves %d: "+
				"the 9 one-run keys leave 90 of the budget of 100 unused (share ceil(100/10) = 10)", len(runs))
		})
	}
}

// s27CheckMaster checks the queue's master score against its indexes' heads.
func s27CheckMaster(t *testing.T, ctx context.Context, c redis.UniversalClient, space keys.Space, q *runqueue.Queue, queue, what string) {
	t.Helper()
	qk := space.Env(env).Queue(queue)
	best := -1.0
	for _, idx := range []string{qk.CkIndex(), qk.DelayIndex()} {
		h, err := c.ZRangeWithScores(ctx, idx, 0, 0).Result()
		require.NoError(t, err)
		if len(h) > 0 && (best < 0 || h[0].Score < best) {
			best = h[0].Score
		}
	}
	ms, err := c.ZScore(ctx, space.Shard(q.ShardOf(env)).Master(), qk.Member()).Result()
	if best < 0 {
		require.ErrorIs(t, err, redis.Nil, "%s: empty queue still in master (%v)", what, ms)
		return
	}
	require.NoError(t, err, what)
	require.Equal(t, best, ms, "%s: master score %v, index head %v", what, ms, best)
}

func TestS27MasterExactAfterFlagOffDequeue(t *testing.T) {
	c := redistest.Real(t)
	for seed := int64(1); seed <= 12; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			rng := rand.New(rand.NewSource(seed))
			keyLimit := []int{0, 0, 1, 2}[rng.Intn(4)]
			scan := []int{0, 2, 3, 5}[rng.Intn(4)]
			b := setup(t, c, func(cfg *runqueue.Config) {
				cfg.ScanLimit, cfg.PromoteLimit = scan, 1+rng.Intn(3)
				cfg.LimitsFor = func(string, string) runqueue.Limits { return runqueue.Limits{Key: keyLimit} }
			})
			space, err := keys.NewSpace(b.prefix, 16)
			require.NoError(t, err)
			base := b.clock.Now()
			// Few distinct times and key names that share prefixes: many
			// score ties, ordered by member bytes.
			names := []string{"", "a", "aa", "ab", "b", "a b", "é", "B", "~"}
			var held []*runqueue.Run
			n := 0
			for step := 0; step < 150; step++ {
				switch r := rng.Intn(10); {
				case r < 5:
					p := runqueue.EnqueueParams{Env: env, Queue: queueName, Key: names[rng.Intn(len(names))],
						ID: fmt.Sprintf("r%d", n), Payload: []byte("p"), Priority: rng.Intn(3)}
					n++
					at := base.Add(time.Duration(rng.Intn(4)) * time.Second)
					p.AvailableAt = at
					_, err := b.q.Enqueue(b.ctx, p)
					require.NoError(t, err)
				case r < 8:
					runs, err := b.q.Dequeue(b.ctx, env, queueName, 1+rng.Intn(4))
					require.NoError(t, err)
					held = append(held, runs...)
					s27CheckMaster(t, b.ctx, c, space, b.q, queueName, fmt.Sprintf("step %d dequeue", step))
				case r < 9:
					if len(held) > 0 {
						i := rng.Intn(len(held))
						require.NoError(t, b.q.Ack(b.ctx, held[i]))
						held = append(held[:i], held[i+1:]...)
					}
				default:
					b.clock.Advance(time.Duration(rng.Intn(1500)) * time.Millisecond)
				}
			}
		})
	}
}

// A flag-off Dequeue(1) reads two ckIndex entries (the one it may serve
// and the bound); the served variant's next head scores exactly the
// bound's, sorting before it (its member is smaller) or after it: either
// way the master score is the bound's score. Then a window read whole
// that the call empties leaves the master at the delayed head.
func TestS27MasterBoundTie(t *testing.T) {
	c := redistest.Real(t)
	for _, names := range [][2]string{{"a", "b"}, {"b", "a"}} {
		t.Run(names[0]+"-served", func(t *testing.T) {
			b := setup(t, c, nil)
			space, err := keys.NewSpace(b.prefix, 16)
			require.NoError(t, err)
			now := b.clock.Now()
			for _, p := range []runqueue.EnqueueParams{
				{Key: names[0], ID: "x1", AvailableAt: now.Add(-30 * time.Second)},
				{Key: names[0], ID: "x2", AvailableAt: now.Add(-20 * time.Second)},
				{Key: names[1], ID: "y1", AvailableAt: now.Add(-20 * time.Second)},
				{Key: "c", ID: "d1", AvailableAt: now.Add(time.Hour)},
			} {
				p.Payload = []byte("p")
				enqueue(t, b, p)
			}
			got := dequeue(t, b, queueName, 1)
			require.Equal(t, []string{"x1"}, runIDs(got))
			s27CheckMaster(t, b.ctx, c, space, b.q, queueName, "after x1")
			ms, err := c.ZScore(b.ctx, space.Shard(b.q.ShardOf(env)).Master(), space.Env(env).Queue(queueName).Member()).Result()
			require.NoError(t, err)
			require.Equal(t, float64(now.Add(-20*time.Second).UnixMilli()), ms)
			got = dequeue(t, b, queueName, 5) // read whole, emptied
			require.ElementsMatch(t, []string{"x2", "y1"}, runIDs(got))
			s27CheckMaster(t, b.ctx, c, space, b.q, queueName, "after emptying the ready work")
		})
	}
}
