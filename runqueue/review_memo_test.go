package runqueue_test

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

var memoBackends = []backend{
	{Name: "Mini", Client: redistest.Mini},
	{Name: "Real", Client: redistest.Real},
}

// normDump is the bundle's keys and values with its prefix taken out.
func normDump(t *testing.T, b *testBundle) map[string]string {
	out := map[string]string{}
	for k, v := range b.dump(t) {
		out[strings.ReplaceAll(k, b.prefix, "P")] = strings.ReplaceAll(v, b.prefix, "P")
	}
	return out
}

// memoInputs: n runs over keys keys (and the default key) with ids drawn
// from ids ids, in a mix that exercises the memo and the bulk path: the
// same variant again (higher, equal, lower scores), priorities that make a
// later run lower, ready, stale and delayed runs of one variant, TTLs,
// ids repeated in the batch or stored before it (idempotent retries and
// conflicts), runs refused at MaxKeyDepth.
func memoInputs(r *rand.Rand, now time.Time, n, keys, ids int) []runqueue.EnqueueParams {
	var ps []runqueue.EnqueueParams
	for i := 0; i < n; i++ {
		p := runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprintf("k%d", r.Intn(keys)),
			ID: fmt.Sprint(r.Intn(ids)), Payload: []byte{byte('a' + r.Intn(2))}, Priority: r.Intn(10)}
		switch r.Intn(4) {
		case 0:
			p.AvailableAt = now.Add(time.Duration(1+r.Intn(5)) * time.Minute)
		case 1:
			p.AvailableAt = now
		default:
			p.AvailableAt = now.Add(-time.Duration(r.Intn(5)) * time.Minute)
		}
		if r.Intn(3) == 0 {
			p.TTL = time.Duration(1+r.Intn(3)) * time.Hour
		}
		if r.Intn(5) == 0 {
			p.Key = ""
		}
		ps = append(ps, p)
	}
	return ps
}

// TestReviewMemoEquivalence: EnqueueMany of N runs (run by run, or in bulk)
// against N single-run calls (SerialCalls) on the same inputs and the same
// prior state: the same results, the same stored data (ckIndex,
// delayIndex, master, depth, scheduler state...), the same Schedule and
// the same dequeue order. With
// 8 keys, runs served before the batch leave tags above V, so the batch's
// new keys queue in the newcomer lane, in the order they register.
func TestReviewMemoEquivalence(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	redistest.ForEachBackend(t, memoBackends, func(t *testing.T, c redis.UniversalClient) {
		for _, on := range []bool{false, true} {
			// n: runs in the batch (from 32 on, without admission
			// limits, the script writes them in bulk).
			for _, lim := range []struct{ q, k, keys, n int }{{0, 0, 3, 12}, {0, 2, 3, 12}, {6, 0, 3, 12}, {0, 0, 8, 12},
				{0, 0, 3, 40}, {0, 0, 8, 40}, {0, 2, 8, 40}} {
				// One parallel subtest per flag and limits: every case has
				// bundles (prefixes) of its own, and a case's calls wait on
				// round trips, which the subtests overlap.
				t.Run(fmt.Sprintf("on=%v,q=%d,k=%d,keys=%d,n=%d", on, lim.q, lim.k, lim.keys, lim.n), func(t *testing.T) {
					t.Parallel()
					for seed := int64(0); seed < 40; seed++ {
						name := fmt.Sprintf("on=%v/q=%d/k=%d/keys=%d/n=%d/seed=%d", on, lim.q, lim.k, lim.keys, lim.n, seed)
						mk := func(serial bool) *testBundle {
							return setup(t, c, func(cfg *runqueue.Config) {
								cfg.VtimeScheduling, cfg.SerialCalls = on, serial
								cfg.MaxQueueDepth, cfg.MaxKeyDepth = lim.q, lim.k
							})
						}
						bm, bs := mk(false), mk(true)
						now := bm.clock.Now()
						r := rand.New(rand.NewSource(seed))
						pre := memoInputs(r, now, 4, lim.keys, 4)
						for i := range pre {
							pre[i].ID = "pre" + pre[i].ID
						}
						batch := memoInputs(r, now, lim.n, lim.keys, lim.n)
						for _, b := range []*testBundle{bm, bs} {
							_, _ = b.q.EnqueueMany(b.ctx, pre) // the same prior state (errors alike)
							if lim.keys > 3 {
								dequeue(t, b, queueName, 2)
							}
						}
						enqueueBothWays(t, bm, bs, batch, name)
						requireSameOutcome(t, bs, bm, on, 2, name)
					}
				})
			}
		}
	})
}

// enqueueBothWays enqueues batch with one EnqueueMany on bulk and with a
// call per run on single, requires the same answers (errors included) and
// returns bulk's.
func enqueueBothWays(t *testing.T, bulk, single *testBundle, batch []runqueue.EnqueueParams, name string) []runqueue.EnqueueResult {
	t.Helper()
	resM, _ := bulk.q.EnqueueMany(bulk.ctx, batch) // the runs' errors are compared below
	var resS []runqueue.EnqueueResult
	for _, p := range batch {
		res, _ := single.q.EnqueueMany(single.ctx, []runqueue.EnqueueParams{p})
		resS = append(resS, res[0])
	}
	require.Equal(t, fmt.Sprint(resS), fmt.Sprint(resM), name)
	return resM
}

// requireSameOutcome: got holds what want holds and answers alike: the
// stored keys and values (prefix aside), the queue's stats, its schedule
// (flag on), and the runs of 8 dequeues of take runs each, in order.
func requireSameOutcome(t *testing.T, want, got *testBundle, on bool, take int, name string) {
	t.Helper()
	require.Equal(t, normDump(t, want), normDump(t, got), name)
	require.Equal(t, queueStats(t, want, queueName), queueStats(t, got, queueName), name)
	if on {
		sW, err := want.q.Schedule(want.ctx, env, queueName, 10)
		require.NoError(t, err)
		sG, err := got.q.Schedule(got.ctx, env, queueName, 10)
		require.NoError(t, err)
		require.Equal(t, sW, sG, name)
	}
	var oW, oG []string
	for i := 0; i < 8; i++ {
		oW = append(oW, runIDs(dequeue(t, want, queueName, take))...)
		oG = append(oG, runIDs(dequeue(t, got, queueName, take))...)
	}
	require.Equal(t, oW, oG, name)
}
