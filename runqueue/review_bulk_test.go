package runqueue_test

import (
	"errors"
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// Review of the bulk enqueue path (enqueue.lua, from 32 runs): it must
// leave what n single-run calls leave.

// TestReviewBulkReregisterAfterStateReset: flag on, the scheduler's state
// hash is there without its ckVtime (deleted by hand or evicted; sched_state
// handles it by starting the state again), with key "a" registered in the
// hash. The batch: a run of "a" that moves a's ckIndex entry (ready_start:
// the hash says "a" is registered, nothing is done), a run of new key "b"
// (ready_start finds no sentinel: the state starts again, only "b" is
// registered), then a run of "a" that moves a's entry again (priority):
// single calls, and the run-by-run path, call ready_start("a") again and
// register "a" in the new state. The bulk path's first version called
// ready_start once per variant, so "a" stayed unregistered (ckVtime and
// the state hash differed); it now calls it at each move, as run by run.
func TestReviewBulkReregisterAfterStateReset(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	redistest.ForEachBackend(t, memoBackends, func(t *testing.T, c redis.UniversalClient) {
		// 3 runs: the run-by-run path; 34: the bulk path (the filler runs
		// of "a" are behind its head: they move nothing).
		for _, n := range []int{3, 34} {
			t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
				mk := func(serial bool) *testBundle {
					return setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling, cfg.SerialCalls = true, serial })
				}
				bm, bs := mk(false), mk(true)
				now := bm.clock.Now()
				batch := []runqueue.EnqueueParams{
					{Env: env, Queue: queueName, Key: "a", ID: "a1", Payload: []byte("x"), Priority: 1, AvailableAt: now},
					{Env: env, Queue: queueName, Key: "b", ID: "b1", Payload: []byte("x"), AvailableAt: now},
					{Env: env, Queue: queueName, Key: "a", ID: "a2", Payload: []byte("x"), Priority: 2, AvailableAt: now},
				}
				for i := len(batch); i < n; i++ {
					batch = append(batch, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: "a",
						ID: fmt.Sprintf("f%d", i), Payload: []byte("x"), AvailableAt: now})
				}
				for _, b := range []*testBundle{bm, bs} {
					enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "a0", Payload: []byte("x"), AvailableAt: now})
					require.NoError(t, c.Del(b.ctx, reviewQK(t, b).CkVtime()).Err())
				}
				for _, res := range enqueueBothWays(t, bm, bs, batch, fmt.Sprintf("n=%d", n)) {
					require.True(t, res.Queued)
				}
				requireSameOutcome(t, bs, bm, true, 2, fmt.Sprintf("n=%d", n))
			})
		}
	})
}

// TestReviewBulkEquivalenceStates: EnqueueMany of n >= 32 runs (the bulk
// path) against n single-run calls, from prior states that
// TestReviewMemoEquivalence does not build: batch ids that are stored
// already (queued, delayed or in flight, same or other payload and key),
// a backlog written by a flag-off instance (keys with ready runs and no
// registration) served by a flag-on one, keys of the prior state in the
// newcomer lane, batches up to the 1,000-run limit.
func TestReviewBulkEquivalenceStates(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	redistest.ForEachBackend(t, memoBackends, func(t *testing.T, c redis.UniversalClient) {
		type tc struct {
			on, offWriter bool
			keys, n, ids  int
			seeds         int64
		}
		var cases []tc
		for _, on := range []bool{false, true} {
			for _, off := range []bool{false, true} {
				if off && !on {
					continue
				}
				cases = append(cases,
					tc{on, off, 3, 32, 20, 30}, tc{on, off, 8, 40, 30, 30}, tc{on, off, 12, 100, 80, 15},
					tc{on, off, 40, 1000, 900, 2})
			}
		}
		seen := map[string]int{} // answers of the bulk calls: the states were reached
		for _, k := range cases {
			for seed := int64(0); seed < k.seeds; seed++ {
				name := fmt.Sprintf("on=%v/off=%v/keys=%d/n=%d/seed=%d", k.on, k.offWriter, k.keys, k.n, seed)
				mk := func(serial bool) *testBundle {
					return setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling, cfg.SerialCalls = k.on, serial })
				}
				bm, bs := mk(false), mk(true)
				now := bm.clock.Now()
				r := rand.New(rand.NewSource(seed))
				pre := memoInputs(r, now, k.n/2, k.keys, k.ids)
				batch := memoInputs(r, now.Add(time.Minute), k.n, k.keys, k.ids)
				for _, b := range []*testBundle{bm, bs} {
					w := b.q
					if k.offWriter {
						q, err := runqueue.New(b.ctx, c, &runqueue.Config{Prefix: b.prefix, Clock: b.clock})
						require.NoError(t, err)
						w = q
					}
					_, _ = w.EnqueueMany(b.ctx, pre)
					if k.offWriter {
						_ = w.Close()
					}
					dequeue(t, b, queueName, 3) // in flight; with the flag on, tags above V
					b.clock.Advance(time.Minute)
				}
				for _, res := range enqueueBothWays(t, bm, bs, batch, name) {
					switch {
					case res.Queued:
						seen["queued"]++
					case res.Err == nil:
						seen["retry"]++
					case errors.Is(res.Err, runqueue.ErrConflict):
						seen["conflict"]++
					}
				}
				requireSameOutcome(t, bs, bm, k.on, 3, name)
			}
		}
		for _, a := range []string{"queued", "retry", "conflict"} {
			require.Positive(t, seen[a], a)
		}
		t.Logf("bulk answers: %v", seen)
	})
}

// TestReviewBulkWake: the bulk path publishes on the wake channel exactly
// when one of the n single calls would: runs behind their variant's head
// (equal scores), delayed runs behind the queue's ready work (the queue's
// first delayed work: it publishes) and behind its delayed work (it does
// not), delayed runs that bring the queue's earliest work forward, a ready
// run that moves last behind 39 delayed ones.
func TestReviewBulkWake(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	redistest.ForEachBackend(t, memoBackends, func(t *testing.T, c redis.UniversalClient) {
		for _, on := range []bool{false, true} {
			type scenario struct {
				name  string
				prior []runqueue.EnqueueParams
				batch func(now time.Time) []runqueue.EnqueueParams
				wake  bool
			}
			run := func(key, id string, at time.Time, pr int) runqueue.EnqueueParams {
				return runqueue.EnqueueParams{Env: env, Queue: queueName, Key: key, ID: id, Payload: []byte("x"),
					AvailableAt: at, Priority: pr}
			}
			many := func(now time.Time, key string, at func(i int) time.Time) []runqueue.EnqueueParams {
				var ps []runqueue.EnqueueParams
				for i := 0; i < 40; i++ {
					ps = append(ps, run(key, fmt.Sprintf("%s%d", key, i), at(i), 0))
				}
				return ps
			}
			base := newFakeClock().Now()
			scenarios := []scenario{
				{"BehindHead", []runqueue.EnqueueParams{run("a", "p", base, 0)},
					func(now time.Time) []runqueue.EnqueueParams {
						return many(now, "a", func(int) time.Time { return now })
					}, false},
				// The queue's first delayed work beside its ready work: a
				// consumer asleep beside ready work that limits hold looks
				// early at the first delayed time it read (place_soonest).
				{"DelayedBehindReady", []runqueue.EnqueueParams{run("a", "p", base, 0)},
					func(now time.Time) []runqueue.EnqueueParams {
						return many(now, "b", func(i int) time.Time { return now.Add(time.Duration(40-i) * time.Minute) })
					}, true},
				{"DelayedBehindDelayed", []runqueue.EnqueueParams{run("a", "p", base, 0), run("c", "d", base.Add(time.Minute), 0)},
					func(now time.Time) []runqueue.EnqueueParams {
						return many(now, "b", func(i int) time.Time { return now.Add(time.Duration(41-i) * time.Minute) })
					}, false},
				{"DelayedEarlier", []runqueue.EnqueueParams{run("a", "p", base.Add(time.Hour), 0)},
					func(now time.Time) []runqueue.EnqueueParams {
						return many(now, "b", func(i int) time.Time { return now.Add(time.Duration(40-i) * time.Minute) })
					}, true},
				{"ReadyLast", []runqueue.EnqueueParams{run("a", "p", base, 0)},
					func(now time.Time) []runqueue.EnqueueParams {
						ps := many(now, "b", func(i int) time.Time { return now.Add(time.Minute) })
						ps[39] = run("a", "last", now, 1)
						return ps
					}, true},
			}
			for _, sc := range scenarios {
				name := fmt.Sprintf("on=%v/%s", on, sc.name)
				woke := map[bool]bool{}
				for _, serial := range []bool{false, true} {
					b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling, cfg.SerialCalls = on, serial })
					for _, p := range sc.prior {
						enqueue(t, b, p)
					}
					batch := sc.batch(b.clock.Now())
					woke[serial] = wakeCount(t, b, c, reviewQK(t, b).Wake(), func() {
						if serial {
							for _, p := range batch {
								_, err := b.q.EnqueueMany(b.ctx, []runqueue.EnqueueParams{p})
								require.NoError(t, err)
							}
						} else {
							_, err := b.q.EnqueueMany(b.ctx, batch)
							require.NoError(t, err)
						}
					}) > 0
				}
				require.Equal(t, sc.wake, woke[true], name+": single calls")
				require.Equal(t, woke[true], woke[false], name+": bulk")
			}
		}
	})
}
