package runqueue_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
	"github.com/runqueue/runqueue/vtime"
)

// TestDequeueFlagOffProducerFlood: in a rollout whose consumers run with
// the flag on while a producer still runs flag off, the keys that producer
// writes after the state's first discovery read (their heads are later)
// are registered by the newcomer rule, as the flag-on producer's would be: the deliveries
// are the same, run for run, whichever build wrote the new keys. A backlog
// of 400 runs, a newcomer h (2 runs, flag on) at call 10, 5 new one-run
// keys every call, 100 calls of Dequeue(5). helper-154, before: a key the
// flag-on dequeue found untagged registered at V whenever it was found, V
// never moved while such keys kept coming, and the backlog got 1 of 500
// deliveries, h none (flag-on producer: the backlog half, h at delivery
// 98 of 1,500 in 300 calls).
func TestDequeueFlagOffProducerFlood(t *testing.T) {
	t.Parallel()
	for _, bk := range backends[:2] {
		t.Run(bk.Name, func(t *testing.T) {
			t.Parallel()
			run := func(t *testing.T, producerOn bool) []string {
				on, producer := consumerAndProducer(t, bk.Client(t), producerOn)
				enqueueMany(t, on, 400, func(i int) runqueue.EnqueueParams {
					return runqueue.EnqueueParams{Env: env, Queue: queueName, Key: "backlog", ID: fmt.Sprint("b", i)}
				})
				var served []string
				for call := range 100 {
					if call == 10 {
						enqueue(t, on, runqueue.EnqueueParams{Key: "h", ID: "h0"})
						enqueue(t, on, runqueue.EnqueueParams{Key: "h", ID: "h1"})
					}
					for i := range 5 {
						k := fmt.Sprintf("new-%03d-%d", call, i)
						enqueue(t, producer, runqueue.EnqueueParams{Key: k, ID: k})
					}
					runs := dequeue(t, on, queueName, 5)
					require.Len(t, runs, 5)
					for _, r := range runs {
						served = append(served, r.Key)
					}
					ackAll(t, on, runs)
					on.clock.Advance(time.Millisecond)
				}
				return served
			}
			byOn, byOff := run(t, true), run(t, false)
			count := func(seq []string, key string) int {
				n := 0
				for _, k := range seq {
					if k == key {
						n++
					}
				}
				return n
			}
			require.GreaterOrEqual(t, count(byOn, "backlog"), 200, "flag-on producer: the backlog keeps half")
			require.Contains(t, byOn, "h")
			require.Equal(t, byOn, byOff, "the deliveries do not depend on the build that wrote the new keys "+
				"(backlog %d and %d of 500)", count(byOn, "backlog"), count(byOff, "backlog"))
		})
	}
}

// TestDequeueFlagOffReturnThenNewKeys: a key that returns (its parked
// tag above V) and new keys, all written flag off after the state's first
// discovery read and found by one later read: the return registers at its
// parked tag, and the new keys after it in the same read queue behind it
// in the lane, as the model says and as with a flag-on producer. helper-156
// found the first version's Lua batching the return's tag after the read,
// so that the new keys' top read missed it and they registered at V, ahead
// of it (n0..n7 before a).
func TestDequeueFlagOffReturnThenNewKeys(t *testing.T) {
	t.Parallel()
	for _, bk := range backends[:2] {
		t.Run(bk.Name, func(t *testing.T) {
			t.Parallel()
			run := func(t *testing.T, producerOn bool) []string {
				on, producer := consumerAndProducer(t, bk.Client(t), producerOn)
				enqueue(t, on, runqueue.EnqueueParams{Key: "a", ID: "a1"})
				ackAll(t, on, dequeue(t, on, queueName, 1))
				on.clock.Advance(time.Millisecond)
				enqueue(t, producer, runqueue.EnqueueParams{Key: "a", ID: "a2"})
				for i := range 8 {
					on.clock.Advance(time.Millisecond)
					enqueue(t, producer, runqueue.EnqueueParams{Key: fmt.Sprint("n", i), ID: fmt.Sprint("n", i)})
				}
				var served []string
				for range 9 {
					on.clock.Advance(time.Millisecond)
					runs := dequeue(t, on, queueName, 1)
					served = append(served, runIDs(runs)...)
					ackAll(t, on, runs)
				}
				return served
			}
			want := []string{"a2", "n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7"}
			require.Equal(t, want, run(t, true), "flag-on producer")
			require.Equal(t, want, run(t, false), "flag-off producer")
		})
	}
}

// consumerAndProducer returns a flag-on bundle (the consumer) and the
// producer on its prefix and clock: the same bundle when producerOn, else
// a flag-off one.
func consumerAndProducer(t *testing.T, c redis.UniversalClient, producerOn bool) (on, producer *testBundle) {
	t.Helper()
	on, off := flagOnAndOff(t, c)
	if producerOn {
		return on, on
	}
	return on, off
}

// flagOnAndOff returns a flag-on bundle and a flag-off one on the same
// prefix and clock (a rollout: instances of both flags on one Redis).
func flagOnAndOff(t *testing.T, c redis.UniversalClient) (on, off *testBundle) {
	t.Helper()
	on = setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = true })
	offQ, err := runqueue.New(on.ctx, c, &runqueue.Config{Prefix: on.prefix, Clock: on.clock})
	require.NoError(t, err)
	t.Cleanup(func() { _ = offQ.Close() })
	return on, &testBundle{ctx: on.ctx, client: c, clock: on.clock, prefix: on.prefix, q: offQ}
}

// TestDequeueFoundAgainAtVAtAnyScale: work ready before the scheduler
// state began is found at V whatever its number of keys (guarantee 5):
// after the state expired (an outage longer than StateTTL) over 1,050 keys,
// and after a flip over a fresh state with 1,050 keys of work written flag
// off, every key is served within the discovery's lap and one serve of
// each key (1,050 keys at 10 a call: 105 calls; the lap, ceil(1,050 / (30
// - 10)) + 1 = 54 calls, runs meanwhile). helper-157 broke a first fix (a
// first discovery read of 1,000 keys at V, the rest by the newcomer rule):
// the keys past the read came through the newcomer lane one at a time, the
// 50th first served at call 5,328.
func TestDequeueFoundAgainAtVAtAnyScale(t *testing.T) {
	t.Parallel()
	const nkeys = 1050
	for _, bk := range backends[:2] {
		for _, shape := range []string{"expiry", "flip"} {
			t.Run(bk.Name+"/"+shape, func(t *testing.T) {
				t.Parallel()
				c := bk.Client(t)
				on, off := flagOnAndOff(t, c)
				writer := on
				if shape == "flip" {
					writer = off
				}
				enqueueMany(t, writer, 3*nkeys, func(i int) runqueue.EnqueueParams {
					return runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprintf("k%04d", i%nkeys), ID: fmt.Sprint("r", i)}
				})
				on.clock.Advance(time.Second)
				if shape == "expiry" {
					// Serve a while (the state holds every key's tag), then
					// the state expires whole, as StateTTL does.
					for range 20 {
						ackAll(t, on, dequeue(t, on, queueName, 10))
						on.clock.Advance(time.Millisecond)
					}
					space, err := keys.NewSpace(on.prefix, on.q.Shards())
					require.NoError(t, err)
					qk := space.Env(env).Queue(queueName)
					require.NoError(t, c.Del(on.ctx, qk.CkVtime(), qk.CkVtimeState()).Err())
					on.clock.Advance(time.Minute)
				}
				seen := map[string]int{} // key -> the call of its first serve
				call := 0
				for ; call < 200 && len(seen) < nkeys; call++ {
					runs := dequeue(t, on, queueName, 10)
					require.Len(t, runs, 10, "call %d", call)
					for _, r := range runs {
						if _, ok := seen[r.Key]; !ok {
							seen[r.Key] = call
						}
					}
					ackAll(t, on, runs)
					on.clock.Advance(time.Millisecond)
				}
				require.Len(t, seen, nkeys, "keys served in %d calls", call)
				require.LessOrEqual(t, call, 110, "every key served within a serve of each (105 calls) and a few more")
			})
		}
	}
}

// TestDequeueDiscoveryStaleIndexEntry: a ckIndex entry whose variant has
// no ready run (a hand edit's; flag on, a stale entry stays until a
// flag-off call or Repair meets it) read with untagged keys in one
// discovery read leaves each key its own head record: an old key (its run
// available before the state's first discovery read, dated back by a
// flag-off writer) registers at V, a new one (available after it) as a
// newcomer, as without the entry. The first version read the keys' head
// records with a hole for the entry, so each key after it was judged by
// the record of the key before it (the old key in the lane, the new one at
// V).
func TestDequeueDiscoveryStaleIndexEntry(t *testing.T) {
	t.Parallel()
	for _, bk := range backends[:2] {
		t.Run(bk.Name, func(t *testing.T) {
			t.Parallel()
			regs := func(t *testing.T, ghost bool) (old, fresh vtime.Reg) {
				c := bk.Client(t)
				on, off := flagOnAndOff(t, c)
				enqueue(t, on, runqueue.EnqueueParams{Key: "a", ID: "a1"})
				enqueue(t, on, runqueue.EnqueueParams{Key: "a", ID: "a2"})
				t0 := on.clock.Now()
				ackAll(t, on, dequeue(t, on, queueName, 1)) // the state's first read: b = t0
				on.clock.Advance(time.Millisecond)
				for i := range 2 { // (two runs: a key served once stays registered)
					enqueue(t, off, runqueue.EnqueueParams{Key: "old", ID: fmt.Sprint("o", i), AvailableAt: t0.Add(-time.Second)})
					enqueue(t, off, runqueue.EnqueueParams{Key: "new", ID: fmt.Sprint("n", i)})
				}
				if ghost {
					space, err := keys.NewSpace(on.prefix, on.q.Shards())
					require.NoError(t, err)
					qk := space.Env(env).Queue(queueName)
					score := float64(t0.Add(-2 * time.Second).UnixMilli())
					require.NoError(t, c.ZAdd(on.ctx, qk.CkIndex(), redis.Z{Score: score, Member: keys.VariantMember("ghost")}).Err())
				}
				_, err := on.q.Dequeue(on.ctx, env, queueName, 1)
				require.NoError(t, err)
				s, _, err := on.q.SchedulerSnapshot(on.ctx, env, queueName)
				require.NoError(t, err)
				old, ok := s.Reg[keys.VariantMember("old")]
				require.True(t, ok, "old registered")
				fresh, ok = s.Reg[keys.VariantMember("new")]
				require.True(t, ok, "new registered")
				return old, fresh
			}
			old, fresh := regs(t, false)
			require.False(t, old.Waiting, "old work: at V")
			require.True(t, fresh.Waiting, "new work: the lane")
			gOld, gFresh := regs(t, true)
			require.Equal(t, []bool{false, true}, []bool{gOld.Waiting, gFresh.Waiting}, "with a stale entry before them")
		})
	}
}
