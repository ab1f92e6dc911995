package runqueue_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// Review of "a flag-on dequeue of a queue with no scheduler state and no
// ready run starts none" (lua/dequeue_vtime.lua): the states around that
// early return (acks carried in the call, a broken or stray state, a lost
// ckIndex, promotion under ScanLimit, gated keys, weights, the Worker,
// DequeueShard, DequeueWait, coalesced calls, flag flips), on miniredis, a
// real Redis and a three-node cluster.

// s21rSchedKeys are the scheduler keys (ckVtime, ckVtimeState) present
// under the bundle's prefix.
func s21rSchedKeys(t testing.TB, b *testBundle) []string {
	t.Helper()
	var out []string
	for _, k := range b.keysUnder(t) {
		if s18IsSched(k) {
			out = append(out, k)
		}
	}
	return out
}

// s21rDropState deletes a queue's scheduler state (as StateTTL would).
func s21rDropState(t testing.TB, b *testBundle, queue string) {
	t.Helper()
	qk := keySpace(t, b).Env(env).Queue(queue)
	require.NoError(t, b.client.Del(b.ctx, qk.CkVtime()).Err())
	require.NoError(t, b.client.Del(b.ctx, qk.CkVtimeState()).Err())
}

// TestS21RAckAndDequeueNoState: AckAndDequeue carrying acks on a queue
// whose scheduler state is gone (StateTTL) and that has nothing ready:
// the acks are made (once, results as usual), nothing is served and no
// scheduler state starts; the queue leaves no key at all. Acks that find
// nothing to ack (a wrong token, an unknown run) write nothing. When the
// ack frees the slot of a key at its limit with a run ready, that run is
// served in the same call, from a state started then. maxCount 0 too.
func TestS21RAckAndDequeueNoState(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := s17Setup(t, c, true, func(cfg *runqueue.Config) { cfg.KeyConcurrency = 1 })

		for _, maxCount := range []int{0, 1, 10} {
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: fmt.Sprintf("a-%d", maxCount)})
			runs := dequeue(t, b, queueName, 1)
			require.Len(t, runs, 1)
			s21rDropState(t, b, queueName)

			// A stale delivery first: nothing to ack, nothing written.
			stale := *runs[0]
			stale.Token++
			before := s17AllKeys(t, b.client, b.prefix)
			got, errs, err := b.q.AckAndDequeue(b.ctx, []*runqueue.Run{&stale}, env, queueName, maxCount)
			require.NoError(t, err)
			require.Empty(t, got)
			require.Len(t, errs, 1)
			require.Error(t, errs[0])
			require.Equal(t, before, s17AllKeys(t, b.client, b.prefix), "maxCount %d: an ack that acked nothing wrote", maxCount)

			got, errs, err = b.q.AckAndDequeue(b.ctx, runs, env, queueName, maxCount)
			require.NoError(t, err)
			require.Empty(t, got)
			require.Equal(t, []error{nil}, errs)
			require.Empty(t, s21rSchedKeys(t, b), "maxCount %d: the acks started a scheduler state", maxCount)
			require.Empty(t, s17RunKeys(t, b), "maxCount %d: keys left by a queue with no run", maxCount)
			require.Equal(t, runqueue.Stats{}, queueStats(t, b, queueName))

			// The same ack again: gone, nothing written.
			before = s17AllKeys(t, b.client, b.prefix)
			_, errs, err = b.q.AckAndDequeue(b.ctx, runs, env, queueName, maxCount)
			require.NoError(t, err)
			require.Len(t, errs, 1)
			require.Equal(t, before, s17AllKeys(t, b.client, b.prefix))
		}

		// a at its limit with a2 ready, the state gone: the ack frees the
		// slot and the same call serves a2.
		enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "a1"})
		enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "a2"})
		runs := dequeue(t, b, queueName, 10)
		require.Equal(t, []string{"a1"}, runIDs(runs))
		s21rDropState(t, b, queueName)
		got, errs, err := b.q.AckAndDequeue(b.ctx, runs, env, queueName, 10)
		require.NoError(t, err)
		require.Equal(t, []error{nil}, errs)
		require.Equal(t, []string{"a2"}, runIDs(got))
		require.True(t, s18SchedOf(t, b, env, queueName).exists)
		got, errs, err = b.q.AckAndDequeue(b.ctx, got, env, queueName, 10)
		require.NoError(t, err)
		require.Equal(t, []error{nil}, errs)
		require.Empty(t, got)
		s18RequireIdleState(t, b, env, queueName, 1)
	})
}

// TestS21RBrokenStateEmptyQueue: a state hash without its ckVtime (the
// sentinel lost: deleted by hand, evicted) on a queue with nothing ready.
// A poll, alone or carrying an ack, answers without error, the ack made
// exactly once; the broken state goes whole and no state starts again
// (the call Go repeats at once finds no state and nothing ready). New work
// is then served from a fresh state.
func TestS21RBrokenStateEmptyQueue(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := s17Setup(t, c, true, nil)
		qk := keySpace(t, b).Env(env).Queue(queueName)
		for _, n := range []int{1, 10} {
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: fmt.Sprintf("x%d", n)})
			runs := dequeue(t, b, queueName, n)
			ackAll(t, b, runs)
			require.True(t, s18SchedOf(t, b, env, queueName).exists)
			require.NoError(t, c.Del(b.ctx, qk.CkVtime()).Err())
			require.Empty(t, dequeue(t, b, queueName, n))
			require.Empty(t, s21rSchedKeys(t, b), "batch %d: a broken state on an empty queue", n)
			require.Empty(t, s17RunKeys(t, b))
		}

		// The same, the poll carrying the ack of the queue's last run.
		enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "y"})
		runs := dequeue(t, b, queueName, 1)
		require.Len(t, runs, 1)
		require.NoError(t, c.Del(b.ctx, qk.CkVtime()).Err())
		got, errs, err := b.q.AckAndDequeue(b.ctx, runs, env, queueName, 10)
		require.NoError(t, err)
		require.Empty(t, got)
		require.Equal(t, []error{nil}, errs)
		require.Empty(t, s21rSchedKeys(t, b))
		require.Empty(t, s17RunKeys(t, b))

		enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "z1"})
		enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: "z2"})
		got = dequeue(t, b, queueName, 10)
		require.Equal(t, []string{"z1", "z2"}, runIDs(got))
		ackAll(t, b, got)
		s18RequireIdleState(t, b, env, queueName, 2)
	})
}

// TestS21RStrayCkVtime: a ckVtime left without its hash (the hash evicted,
// ckVtime keeping its TTL) holding a parked tag far above the clock. A
// poll of the queue with nothing ready writes nothing (the stray stays
// until its TTL: the dequeue is no writer here), and the stray never
// counts: the first work, queued by a flag-on or by a flag-off instance,
// starts the state afresh, the stray's parked tag gone, and the keys are
// served in registration order from V = 0.
func TestS21RStrayCkVtime(t *testing.T) {
	for _, producerOn := range []bool{true, false} {
		t.Run(fmt.Sprintf("producer-vtime=%v", producerOn), func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
				b := s17Setup(t, c, true, nil)
				prod := b.q
				if !producerOn {
					off, err := runqueue.New(b.ctx, c, &runqueue.Config{Prefix: b.prefix, Clock: b.clock, SerialCalls: true})
					require.NoError(t, err)
					t.Cleanup(func() { _ = off.Close() })
					prod = off
				}
				qk := keySpace(t, b).Env(env).Queue(queueName)
				vmA := keys.VariantMember("a")
				const far = 1_000_000_000_000 // a parked tag of a million quanta
				require.NoError(t, c.ZAdd(b.ctx, qk.CkVtime(), redis.Z{Score: 0, Member: ""},
					redis.Z{Score: far - (1 << 52), Member: vmA}).Err())
				require.NoError(t, c.PExpire(b.ctx, qk.CkVtime(), time.Hour).Err())

				before := s17AllKeys(t, b.client, b.prefix)
				require.Empty(t, dequeue(t, b, queueName, 1))
				require.Empty(t, dequeue(t, b, queueName, 10))
				require.Equal(t, before, s17AllKeys(t, b.client, b.prefix), "a poll of a queue with a stray ckVtime wrote")

				for i, k := range []string{"a", "b"} {
					ok, err := prod.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: k, ID: fmt.Sprintf("%s%d", k, i)})
					require.NoError(t, err)
					require.True(t, ok)
				}
				if producerOn {
					s := s18SchedOf(t, b, env, queueName)
					require.True(t, s.exists)
					require.Zero(t, s.parked, "the stray's parked tag outlived the state's start")
				}
				runs := dequeue(t, b, queueName, 1)
				require.Equal(t, []string{"a0"}, runIDs(runs), "the stray's parked tag held key a back")
				runs = append(runs, dequeue(t, b, queueName, 1)...)
				require.Equal(t, []string{"a0", "b1"}, runIDs(runs))
				ackAll(t, b, runs)
				s18RequireIdleState(t, b, env, queueName, 2)
				// a's parked tag is its one serve's, not the stray's.
				p, err := c.ZScore(b.ctx, qk.CkVtime(), vmA).Result()
				require.NoError(t, err)
				require.Less(t, p+(1<<52), float64(far))
			})
		})
	}
}

// TestS21RLostIndex: ready runs whose ckIndex entry was lost (a hand
// edit, or an index evicted alone) cannot be found by a dequeue with
// either flag; flag on serves exactly what flag off does, and a flag-on
// poll that finds nothing starts no state. Work queued afterwards is
// served under both flags alike.
func TestS21RLostIndex(t *testing.T) {
	s16EachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		served := map[bool][]string{}
		for _, on := range []bool{false, true} {
			b := s17Setup(t, c, on, nil)
			qk := keySpace(t, b).Env(env).Queue(queueName)
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "a1"})
			require.NoError(t, b.client.Del(b.ctx, qk.CkIndex()).Err())
			s21rDropState(t, b, queueName)
			var ids []string
			for _, n := range []int{1, 10} {
				runs := dequeue(t, b, queueName, n)
				ids = append(ids, runIDs(runs)...)
				ackAll(t, b, runs)
			}
			require.Empty(t, s21rSchedKeys(t, b), "vtime=%v", on)
			enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: "b1"})
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "a2"})
			for range 3 {
				runs := dequeue(t, b, queueName, 10)
				ids = append(ids, runIDs(runs)...)
				ackAll(t, b, runs)
			}
			served[on] = ids
		}
		require.ElementsMatch(t, served[false], served[true], "flag on served otherwise than flag off")
		t.Logf("served: %v", served[true])
	})
}

// TestS21RPromotionUnderScanLimit: five keys' delayed runs fall due
// together and ScanLimit (2) lets a call promote only some of them; the
// scheduler state is deleted before every call, so every call meets a
// queue without state. A call of 1 still serves one run every time (each
// call promotes what it serves), a call of 10 serves what it promoted,
// and every run is served once, with both flags, before the queue is
// empty; then a poll writes nothing.
func TestS21RPromotionUnderScanLimit(t *testing.T) {
	for _, batch := range []int{1, 10} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
				b := s17Setup(t, c, on, func(cfg *runqueue.Config) { cfg.ScanLimit = 2 })
				const n = 5
				for i := range n {
					enqueue(t, b, runqueue.EnqueueParams{Key: fmt.Sprintf("k%d", i), ID: fmt.Sprintf("r%d", i), Delay: time.Minute})
				}
				require.Empty(t, dequeue(t, b, queueName, batch))
				require.Empty(t, s21rSchedKeys(t, b))
				b.clock.Advance(time.Minute)
				seen := map[string]bool{}
				for call := 0; len(seen) < n; call++ {
					require.Less(t, call, n+2, "served %v", seen)
					s21rDropState(t, b, queueName)
					runs := dequeue(t, b, queueName, batch)
					require.NotEmpty(t, runs, "call %d served nothing with %d due runs left", call, n-len(seen))
					for _, r := range runs {
						require.False(t, seen[r.ID], "%s served twice", r.ID)
						seen[r.ID] = true
					}
					ackAll(t, b, runs)
				}
				s21rDropState(t, b, queueName)
				before := s17AllKeys(t, b.client, b.prefix)
				require.Empty(t, dequeue(t, b, queueName, batch))
				require.Equal(t, before, s17AllKeys(t, b.client, b.prefix))
				require.Empty(t, s17RunKeys(t, b))
			})
		})
	}
}

// TestS21RDueBeyondScanNoState: more due keys than a call promotes, with
// no state at all (never made): every call of 1 serves a run, in the
// order of the keys' due times, each promoted key registering as a
// newcomer of a state that starts at the first promotion.
func TestS21RDueBeyondScanNoState(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := s17Setup(t, c, true, func(cfg *runqueue.Config) { cfg.ScanLimit = 1; cfg.PromoteLimit = 1 })
		const n = 4
		for i := range n {
			enqueue(t, b, runqueue.EnqueueParams{Key: fmt.Sprintf("k%d", i), ID: fmt.Sprintf("r%d", i),
				Delay: time.Minute + time.Duration(i)*time.Millisecond})
		}
		b.clock.Advance(time.Hour)
		var ids []string
		for range n {
			runs := dequeue(t, b, queueName, 1)
			require.Len(t, runs, 1)
			ids = append(ids, runs[0].ID)
			ackAll(t, b, runs)
		}
		require.Equal(t, []string{"r0", "r1", "r2", "r3"}, ids)
		require.Empty(t, dequeue(t, b, queueName, 1))
		s18RequireIdleState(t, b, env, queueName, n)
	})
}

// TestS21RGatedAfterStateLoss: key limit 1; the state is lost while key a
// holds its slot. With nothing ready a poll starts no state; a run queued
// then for a is gated, and is served as soon as the slot frees: at once
// when a flag-on instance acks, at the probe when a flag-off one does.
// With a run of a already ready when the state is lost, the poll starts
// the state (discovery) and gates it the same way.
func TestS21RGatedAfterStateLoss(t *testing.T) {
	for _, ackerOn := range []bool{true, false} {
		for _, readyBefore := range []bool{false, true} {
			t.Run(fmt.Sprintf("acker-vtime=%v/ready-before=%v", ackerOn, readyBefore), func(t *testing.T) {
				forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
					b := s17Setup(t, c, true, func(cfg *runqueue.Config) { cfg.KeyConcurrency = 1 })
					acker := b.q
					if !ackerOn {
						off, err := runqueue.New(b.ctx, c, &runqueue.Config{Prefix: b.prefix, Clock: b.clock, SerialCalls: true,
							KeyConcurrency: 1})
						require.NoError(t, err)
						t.Cleanup(func() { _ = off.Close() })
						acker = off
					}
					enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "a1"})
					if readyBefore {
						enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "a2"})
					}
					held := dequeue(t, b, queueName, 10)
					require.Equal(t, []string{"a1"}, runIDs(held))
					s21rDropState(t, b, queueName)
					before := s17AllKeys(t, b.client, b.prefix)
					require.Empty(t, dequeue(t, b, queueName, 10))
					if readyBefore {
						require.True(t, s18SchedOf(t, b, env, queueName).exists)
						require.Equal(t, 1, s18SchedOf(t, b, env, queueName).gate)
					} else {
						require.Equal(t, before, s17AllKeys(t, b.client, b.prefix), "a poll with a's run held and nothing ready wrote")
						enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "a2"})
						require.Empty(t, dequeue(t, b, queueName, 10))
						require.Equal(t, 1, s18SchedOf(t, b, env, queueName).gate)
					}
					enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: "b1"})
					require.NoError(t, acker.Ack(b.ctx, held[0]))
					runs := dequeue(t, b, queueName, 10)
					require.ElementsMatch(t, []string{"a2", "b1"}, runIDs(runs))
					ackAll(t, b, runs)
					s18RequireIdleState(t, b, env, queueName, 2)
					require.Empty(t, s17RunKeys(t, b))
				})
			})
		}
	}
}

// TestS21RWeightsWithoutState: a weight set on a queue without scheduler
// state writes only the weights hash (SetWeight touches the state only
// when its clock exists); a poll then writes nothing; the state that the
// first enqueue starts honours the weight (weight 3 against 1: six serves
// against two in the first eight, within the lag bound at every prefix).
// A weight set while the state exists and then the state lost: the same.
func TestS21RWeightsWithoutState(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := s17Setup(t, c, true, nil)
		check := func(queue string) {
			t.Helper()
			before := s17AllKeys(t, b.client, b.prefix)
			require.Empty(t, dequeue(t, b, queue, 10))
			require.Equal(t, before, s17AllKeys(t, b.client, b.prefix), "%s: a poll wrote", queue)
			for i := range 8 {
				for _, k := range []string{"heavy", "light"} {
					ok, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: queue, Key: k, ID: fmt.Sprintf("%s-%d", k, i)})
					require.NoError(t, err)
					require.True(t, ok)
				}
			}
			n := map[string]int{}
			for i := range 8 {
				runs := dequeue(t, b, queue, 1)
				require.Len(t, runs, 1)
				n[runs[0].Key]++
				lag := float64(n["heavy"])/3 - float64(n["light"])
				require.LessOrEqual(t, lag, 1.0/3+1+0.01, "%s serve %d: %v", queue, i, n)
				require.GreaterOrEqual(t, lag, -(1.0/3 + 1 + 0.01), "%s serve %d: %v", queue, i, n)
				ackAll(t, b, runs)
			}
			require.Equal(t, map[string]int{"heavy": 6, "light": 2}, n, queue)
		}

		require.NoError(t, b.q.SetWeight(b.ctx, env, "fresh", "heavy", 3))
		qk := keySpace(t, b).Env(env).Queue("fresh")
		n, err := c.Exists(b.ctx, qk.CkVtimeState(), qk.CkVtime()).Result()
		require.NoError(t, err)
		require.Zero(t, n, "SetWeight started a scheduler state")
		check("fresh")

		enqueue(t, b, runqueue.EnqueueParams{Queue: "lost", Key: "x", ID: "x"})
		ackAll(t, b, dequeue(t, b, "lost", 1))
		require.NoError(t, b.q.SetWeight(b.ctx, env, "lost", "heavy", 3))
		s21rDropState(t, b, "lost")
		check("lost")
	})
}

// TestS21RWorkerPollsEmptyQueue: a flag-on Worker serving a queue with no
// work polls it (AckAndDequeue) and leaves no scheduler state; work
// queued then is handled, the state starting with it; once the work is
// done and the state lost, the worker's polls start none again.
func TestS21RWorkerPollsEmptyQueue(t *testing.T) {
	s16EachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b, o := workerSetup(t, c, func(cfg *runqueue.Config) {
			cfg.VtimeScheduling = true
			cfg.KeyConcurrency = 1
		})
		var handled atomic.Int64
		w := startWorker(t, b.q, func(ctx context.Context, r *runqueue.Run) error {
			handled.Add(1)
			return nil
		}, func(wc *runqueue.WorkerConfig) { wc.IdlePollInterval = 5 * time.Millisecond })
		time.Sleep(100 * time.Millisecond)
		require.Empty(t, s21rSchedKeys(t, b), "a worker polling an empty queue started a state")
		for i := range 6 {
			enqueue(t, b, runqueue.EnqueueParams{Key: fmt.Sprintf("k%d", i%3), ID: fmt.Sprintf("r%d", i)})
		}
		o.until(t, runqueue.OutcomeAck, 6)
		require.Equal(t, int64(6), handled.Load())
		require.Eventually(t, func() bool { return queueStats(t, b, queueName) == runqueue.Stats{} }, workerWait, time.Millisecond)
		require.True(t, s18SchedOf(t, b, env, queueName).exists)
		s21rDropState(t, b, queueName)
		time.Sleep(100 * time.Millisecond)
		require.Empty(t, s21rSchedKeys(t, b), "a worker polling an emptied queue started a state")
		shutdown(t, w)
		require.Empty(t, s17RunKeys(t, b))
	})
}

// TestS21RShardDelayedOnly: DequeueShard over a shard whose only queue
// holds a delayed run not yet due (within ShardLookAhead or not) serves
// nothing and starts no state; once due, the run is served by the shard
// call, from a state started by its promotion. A second queue of the same
// env without state but with ready work is served in the same call.
func TestS21RShardDelayedOnly(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := s17Setup(t, c, true, func(cfg *runqueue.Config) { cfg.ShardLookAhead = time.Second })
		shard := b.q.ShardOf(env)
		enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "soon", Delay: 500 * time.Millisecond})
		enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "later", Delay: time.Hour})
		before := s17AllKeys(t, b.client, b.prefix)
		runs, err := b.q.DequeueShard(b.ctx, shard, 10)
		require.NoError(t, err)
		require.Empty(t, runs)
		require.Equal(t, before, s17AllKeys(t, b.client, b.prefix), "a shard call with nothing due wrote")
		b.clock.Advance(time.Second)
		enqueue(t, b, runqueue.EnqueueParams{Queue: "other", Key: "b", ID: "now"})
		s21rDropState(t, b, "other")
		runs, err = b.q.DequeueShard(b.ctx, shard, 10)
		require.NoError(t, err)
		require.ElementsMatch(t, []string{"soon", "now"}, runIDs(runs))
		ackAll(t, b, runs)
		runs, err = b.q.DequeueShard(b.ctx, shard, 10)
		require.NoError(t, err)
		require.Empty(t, runs)
		b.clock.Advance(time.Hour)
		s21rDropState(t, b, queueName)
		runs, err = b.q.DequeueShard(b.ctx, shard, 10)
		require.NoError(t, err)
		require.Equal(t, []string{"later"}, runIDs(runs))
		ackAll(t, b, runs)
		require.Empty(t, s17RunKeys(t, b))
	})
}

// TestS21RDequeueWaitEmpty: a flag-on DequeueWait on a queue name never
// used times out empty and writes nothing; one waiting when a run is
// queued gets it.
func TestS21RDequeueWaitEmpty(t *testing.T) {
	s16EachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := s17Setup(t, c, true, wallClock)
		before := s17AllKeys(t, b.client, b.prefix)
		runs, err := b.q.DequeueWait(b.ctx, env, queueName, 10, 50*time.Millisecond)
		require.NoError(t, err)
		require.Empty(t, runs)
		require.Equal(t, before, s17AllKeys(t, b.client, b.prefix))
		go func() {
			time.Sleep(30 * time.Millisecond)
			_, _ = b.q.Enqueue(context.Background(), runqueue.EnqueueParams{Env: env, Queue: queueName, Key: "a", ID: "w"})
		}()
		runs, err = b.q.DequeueWait(b.ctx, env, queueName, 10, 5*time.Second)
		require.NoError(t, err)
		require.Equal(t, []string{"w"}, runIDs(runs))
		ackAll(t, b, runs)
	})
}

// TestS21RCoalescedPolls: concurrent Dequeue calls of empty queue names
// (coalesced into shared script calls) all answer empty without error and
// leave no key; concurrent calls while runs arrive serve each run once.
func TestS21RCoalescedPolls(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = true })
		before := s17AllKeys(t, b.client, b.prefix)
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		for i := range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				runs, err := b.q.Dequeue(b.ctx, env, fmt.Sprintf("q%d", i%4), 1+i%3)
				if err == nil && len(runs) > 0 {
					err = fmt.Errorf("served %v", runIDs(runs))
				}
				if err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		require.Equal(t, before, s17AllKeys(t, b.client, b.prefix))

		const n = 40
		var mu sync.Mutex
		seen := map[string]int{}
		var done atomic.Int64
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for deadline := time.Now().Add(20 * time.Second); done.Load() < n && time.Now().Before(deadline); {
					runs, err := b.q.Dequeue(b.ctx, env, queueName, 1+g%3)
					if err != nil {
						t.Error(err)
						return
					}
					for _, r := range runs {
						mu.Lock()
						seen[r.ID]++
						mu.Unlock()
						_ = b.q.Ack(b.ctx, r)
						done.Add(1)
					}
				}
			}()
		}
		for i := range n {
			enqueue(t, b, runqueue.EnqueueParams{Key: fmt.Sprintf("k%d", i%5), ID: fmt.Sprintf("r%d", i)})
		}
		wg.Wait()
		require.Len(t, seen, n)
		for id, k := range seen {
			require.Equal(t, 1, k, "%s served %d times", id, k)
		}
	})
}

// TestS21RFlagFlipNewcomerOrder: a flag-on state with a lane of newcomers
// is drained by a flag-off instance and then lost (StateTTL); flag-on
// polls start nothing; new keys queued by a flag-on producer then meet a
// fresh state: the first at V, the others through the lane, each served
// once per round and none registered later served before an earlier one.
func TestS21RFlagFlipNewcomerOrder(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := s17Setup(t, c, true, nil)
		off, err := runqueue.New(b.ctx, c, &runqueue.Config{Prefix: b.prefix, Clock: b.clock, SerialCalls: true})
		require.NoError(t, err)
		t.Cleanup(func() { _ = off.Close() })
		for i := range 3 {
			for j := range 3 {
				enqueue(t, b, runqueue.EnqueueParams{Key: fmt.Sprintf("old%d", i), ID: fmt.Sprintf("old%d-%d", i, j)})
			}
		}
		ackAll(t, b, dequeue(t, b, queueName, 2))
		for i := range 3 {
			enqueue(t, b, runqueue.EnqueueParams{Key: fmt.Sprintf("mid%d", i), ID: fmt.Sprintf("mid%d", i)})
		}
		require.Positive(t, s18SchedOf(t, b, env, queueName).lane, "no newcomer lane to drain")
		for {
			runs, err := off.Dequeue(b.ctx, env, queueName, 10)
			require.NoError(t, err)
			if len(runs) == 0 {
				break
			}
			ackAll(t, b, runs)
		}
		s21rDropState(t, b, queueName)
		before := s17AllKeys(t, b.client, b.prefix)
		require.Empty(t, dequeue(t, b, queueName, 1))
		require.Empty(t, dequeue(t, b, queueName, 10))
		require.Equal(t, before, s17AllKeys(t, b.client, b.prefix))

		// Fresh: new0 has 3 runs, then new1..new3 one each.
		for j := range 3 {
			enqueue(t, b, runqueue.EnqueueParams{Key: "new0", ID: fmt.Sprintf("new0-%d", j)})
		}
		for i := 1; i <= 3; i++ {
			enqueue(t, b, runqueue.EnqueueParams{Key: fmt.Sprintf("new%d", i), ID: fmt.Sprintf("new%d", i)})
		}
		var keysServed []string
		for {
			runs := dequeue(t, b, queueName, 1)
			if len(runs) == 0 {
				break
			}
			keysServed = append(keysServed, runs[0].Key)
			ackAll(t, b, runs)
		}
		require.Len(t, keysServed, 6)
		// Newcomers in registration order, each within 3 serves per
		// other active key of its registration.
		first := map[string]int{}
		for i, k := range keysServed {
			if _, ok := first[k]; !ok {
				first[k] = i
			}
		}
		require.Less(t, first["new0"], first["new1"])
		require.Less(t, first["new1"], first["new2"])
		require.Less(t, first["new2"], first["new3"])
		require.Equal(t, 0, first["new0"])
		require.LessOrEqual(t, first["new1"], 3)
		s18RequireIdleState(t, b, env, queueName, 4)
	})
}

// s21rCommands runs fn and returns the commands the server ran meanwhile
// (INFO commandstats deltas, less the INFO calls), on a private server
// this sequential test has to itself.
func s21rCommands(t *testing.T, c redis.UniversalClient, fn func()) map[string]int64 {
	t.Helper()
	before, err := redistest.CommandStats(context.Background(), c)
	require.NoError(t, err)
	fn()
	after, err := redistest.CommandStats(context.Background(), c)
	require.NoError(t, err)
	out := map[string]int64{}
	for name, st := range after.Sub(before) {
		if name != "info" {
			out[name] = st.Calls
		}
	}
	return out
}

// TestS21RPollCommands: the commands of a flag-on dequeue, as the change
// states them: a queue with a state runs no EXISTS (the same commands as
// before the change); a queue with no state and nothing ready runs one
// EXISTS and no write; a queue with no state and ready work one EXISTS
// more than a call finding a state. Not parallel: the counts are
// server-wide.
func TestS21RPollCommands(t *testing.T) {
	c := redistest.Private(t)
	b := s17Setup(t, c, true, nil)
	writes := []string{"hset", "zadd", "del", "pexpire", "hincrby", "zrem", "set", "incrby", "hdel", "zremrangebyrank"}
	requireNoWrite := func(cmds map[string]int64, what string) {
		t.Helper()
		for _, w := range writes {
			require.Zero(t, cmds[w], "%s: %s ran (%v)", what, w, cmds)
		}
	}
	for _, n := range []int{1, 10} {
		// Warm: scripts loaded, the queue names cached.
		require.Empty(t, dequeue(t, b, queueName, n))
		cmds := s21rCommands(t, c, func() { require.Empty(t, dequeue(t, b, queueName, n)) })
		require.Equal(t, int64(1), cmds["exists"], "batch %d, no state: %v", n, cmds)
		requireNoWrite(cmds, fmt.Sprintf("batch %d, no state, nothing ready", n))
	}

	enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "a1"})
	ackAll(t, b, dequeue(t, b, queueName, 1))
	require.True(t, s18SchedOf(t, b, env, queueName).exists)
	for _, n := range []int{1, 10} {
		cmds := s21rCommands(t, c, func() { require.Empty(t, dequeue(t, b, queueName, n)) })
		require.Zero(t, cmds["exists"], "batch %d, a state: %v", n, cmds)
	}

	// Ready work: with a state, then without.
	enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "a2"})
	with := s21rCommands(t, c, func() { ackAll(t, b, dequeue(t, b, queueName, 1)) })
	enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "a3"})
	s21rDropState(t, b, queueName)
	without := s21rCommands(t, c, func() { ackAll(t, b, dequeue(t, b, queueName, 1)) })
	require.Zero(t, with["exists"], "%v", with)
	require.Equal(t, int64(1), without["exists"], "%v", without)
}
