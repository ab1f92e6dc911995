package runqueue_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// corruptRecord replaces run id's stored record with one that does not
// parse (a hand edit, a writer's bug).
func corruptRecord(t *testing.T, b *testBundle, id string) {
	t.Helper()
	runsKey := keySpace(t, b).Env(env).Queue(queueName).Runs()
	require.NoError(t, b.client.HSet(b.ctx, runsKey, keys.Segment(id), "not a record").Err())
}

// enqueueCorrupt queues n runs, each of its own key and a millisecond
// after the one before, whose records then do not parse.
func enqueueCorrupt(t *testing.T, b *testBundle, n int) {
	t.Helper()
	for i := range n {
		id := fmt.Sprintf("bad%03d", i)
		enqueue(t, b, runqueue.EnqueueParams{ID: id, Key: id})
		corruptRecord(t, b, id)
		b.clock.Advance(time.Millisecond)
	}
}

// editRecord rewrites run id's stored record field by field (edit gets
// ttl, att, pr, at, lt, vm and the payload).
func editRecord(t *testing.T, b *testBundle, id string, edit func(f []string)) {
	t.Helper()
	runsKey := keySpace(t, b).Env(env).Queue(queueName).Runs()
	rec, err := b.client.HGet(b.ctx, runsKey, keys.Segment(id)).Result()
	require.NoError(t, err)
	f := strings.SplitN(rec, "|", 7)
	require.Len(t, f, 7)
	edit(f)
	require.NoError(t, b.client.HSet(b.ctx, runsKey, keys.Segment(id), strings.Join(f, "|")).Err())
}

// requireDeadAsIs: run id is the queue's one dead letter, its record as
// it was left (attempt 0), and inFlight runs are in flight (not it).
func requireDeadAsIs(t *testing.T, b *testBundle, id string, inFlight int64) {
	t.Helper()
	dead, err := b.q.DeadLetters(b.ctx, env, queueName, 0, 10)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, id, dead[0].ID)
	require.Zero(t, dead[0].Attempt, "its record is as it was")
	require.True(t, dead[0].Corrupt, "its record does not parse")
	st := queueStats(t, b, queueName)
	require.Equal(t, int64(1), st.Dead)
	require.Equal(t, inFlight, st.InFlight, "its hold and slot are released")
}

// TestDequeueCorruptDelayedRecord: a delayed run whose stored record does
// not parse stopped its queue: every dequeue whose promotion reached it
// failed ("attempt to perform arithmetic on field 'pr'") once it was due,
// and it was the first due. It is now made ready when due, served, and
// dead-lettered with its record as it is by the call that serves it, which
// delivers the others.
func TestDequeueCorruptDelayedRecord(t *testing.T) {
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		enqueue(t, b, runqueue.EnqueueParams{ID: "bad", Key: "k1", Delay: time.Second})
		enqueue(t, b, runqueue.EnqueueParams{ID: "r1", Key: "k2", Delay: 2 * time.Second})
		enqueue(t, b, runqueue.EnqueueParams{ID: "r2", Key: "k1", Delay: 2 * time.Second})
		corruptRecord(t, b, "bad")
		b.clock.Advance(3 * time.Second)
		runs, err := b.q.Dequeue(b.ctx, env, queueName, 10)
		require.NoError(t, err)
		require.ElementsMatch(t, []string{"r1", "r2"}, runIDs(runs))
		ackAll(t, b, runs)
		requireDeadAsIs(t, b, "bad", 0)
		st := queueStats(t, b, queueName)
		require.Zero(t, st.Ready+st.Delayed)
	})
}

// TestDequeueCorruptReadyRecord: a Dequeue that served a run whose record
// does not parse failed whole (ErrCorruptRecord), and the good runs it had
// taken stayed held until their leases passed (recovered with attempt + 1,
// dead-lettered under MaxAttempts 1). The call now delivers the good runs
// and dead-letters the bad one at once, and, having served fewer than
// asked, calls again: the key's next run, held back by the bad run's slot,
// comes in the same Dequeue. A Nack with DeadLetter of such a run (held)
// dead-letters it too, where it was refused; a Nack that would retry it
// still is.
func TestDequeueCorruptReadyRecord(t *testing.T) {
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		b.reopen(t, func(cfg *runqueue.Config) { cfg.KeyConcurrency, cfg.MaxAttempts = 1, 1 })
		enqueue(t, b, runqueue.EnqueueParams{ID: "bad", Key: "k1"})
		enqueue(t, b, runqueue.EnqueueParams{ID: "r1", Key: "k2"})
		enqueue(t, b, runqueue.EnqueueParams{ID: "r2", Key: "k1"})
		corruptRecord(t, b, "bad")
		runs, err := b.q.Dequeue(b.ctx, env, queueName, 10)
		require.NoError(t, err)
		require.Equal(t, []string{"r1", "r2"}, runIDs(runs), "r2 after bad freed k1's slot (limit 1)")
		more := runs[1:]
		require.Equal(t, 1, more[0].Attempt)
		ackAll(t, b, runs[:1])
		requireDeadAsIs(t, b, "bad", 1)

		// A held run whose record is then broken: a retrying Nack is
		// refused with nothing written, a dead-lettering one is not.
		corruptRecord(t, b, "r2")
		before := b.dump(t)
		_, err = b.q.Nack(b.ctx, more[0], nil)
		require.ErrorIs(t, err, runqueue.ErrCorruptRecord)
		require.Equal(t, before, b.dump(t), "a refused nack writes nothing")
		res, err := b.q.Nack(b.ctx, more[0], &runqueue.NackOptions{DeadLetter: true})
		require.NoError(t, err)
		require.Equal(t, runqueue.NackResult{Requeued: false, Attempt: 0}, res)
		st := queueStats(t, b, queueName)
		require.Equal(t, runqueue.Stats{Dead: 2}, runqueue.Stats{Ready: st.Ready, Delayed: st.Delayed, InFlight: st.InFlight, Dead: st.Dead})
	})
}

// TestDequeueRecordGoAndLuaAgree: records that the scripts' parser
// refuses and Go's took (a sign, a priority of two digits) were delivered,
// and their nack was then refused (RQ_CORRUPT) and their recovery
// dead-lettered them; Go now refuses what the scripts refuse, so the call
// that serves one dead-letters it at once. A number past int64, which the
// scripts read as a float and Go refuses, is dead-lettered the same way.
func TestDequeueRecordGoAndLuaAgree(t *testing.T) {
	edits := map[string]func(f []string){
		"signed attempt":  func(f []string) { f[1] = "+" + f[1] },
		"negative ttl":    func(f []string) { f[0] = "-1" },
		"priority 05":     func(f []string) { f[2] = "0" + f[2] },
		"at of 20 digits": func(f []string) { f[3] = "99999999999999999999" },
		"empty lt":        func(f []string) { f[4] = "" },
	}
	for name, edit := range edits {
		t.Run(name, func(t *testing.T) {
			forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
				enqueue(t, b, runqueue.EnqueueParams{ID: "bad", Key: "k1", Payload: []byte("p|q")})
				enqueue(t, b, runqueue.EnqueueParams{ID: "r1", Key: "k2"})
				editRecord(t, b, "bad", edit)
				runs, err := b.q.Dequeue(b.ctx, env, queueName, 10)
				require.NoError(t, err)
				require.Equal(t, []string{"r1"}, runIDs(runs))
				ackAll(t, b, runs)
				requireDeadAsIs(t, b, "bad", 0)
				st := queueStats(t, b, queueName)
				require.Zero(t, st.Ready+st.Delayed)
			})
		})
	}
}

// corruptObs counts what the Observer hears of.
type corruptObs struct {
	runqueue.NopObserver
	deq, ack, dead, requeued, recovered atomic.Int64
}

func (o *corruptObs) Dequeued(runs []*runqueue.Run, _ time.Time) { o.deq.Add(int64(len(runs))) }
func (o *corruptObs) Acked(_, _ string, n int)                   { o.ack.Add(int64(n)) }
func (o *corruptObs) Recovered(_, _ string, n, _ int)            { o.recovered.Add(int64(n)) }
func (o *corruptObs) Nacked(_, _ string, requeued bool) {
	if requeued {
		o.requeued.Add(1)
	} else {
		o.dead.Add(1)
	}
}

// TestDequeueCorruptObserverBalance: the Observer hears of a run served
// with a record that does not parse as dequeued and nacked to the dead
// letter, so its dequeued runs equal the acked, nacked and recovered ones
// (helper-137: it heard only of the nack), through a coalesced Dequeue
// (the default) and a call of its own (SerialCalls).
func TestDequeueCorruptObserverBalance(t *testing.T) {
	for _, serial := range []bool{false, true} {
		t.Run(fmt.Sprintf("serial=%v", serial), func(t *testing.T) {
			forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
				obs := &corruptObs{}
				b.reopen(t, func(cfg *runqueue.Config) { cfg.Observer, cfg.SerialCalls = obs, serial })
				enqueue(t, b, runqueue.EnqueueParams{ID: "bad", Key: "k1"})
				enqueue(t, b, runqueue.EnqueueParams{ID: "good", Key: "k2"})
				corruptRecord(t, b, "bad")
				runs, err := b.q.Dequeue(b.ctx, env, queueName, 10)
				require.NoError(t, err)
				require.Equal(t, []string{"good"}, runIDs(runs))
				ackAll(t, b, runs)
				require.EqualValues(t, 2, obs.deq.Load(), "dequeued")
				require.EqualValues(t, 1, obs.ack.Load(), "acked")
				require.EqualValues(t, 1, obs.dead.Load(), "dead-lettered")
				require.Zero(t, obs.requeued.Load()+obs.recovered.Load())
			})
		})
	}
}

// TestDequeueCorruptFirstInLine: a call that served only runs whose
// records do not parse returned nothing while good runs were ready, which
// a blocking dequeue and a Worker read as an idle queue and waited a poll
// interval (helper-137: 2 s at a 2 s BlockPollInterval). The call is made
// again: Dequeue(1) behind two bad runs serves the good one, and so does
// DequeueWait at once.
func TestDequeueCorruptFirstInLine(t *testing.T) {
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		b.reopen(t, func(cfg *runqueue.Config) { cfg.BlockPollInterval = time.Hour })
		for _, id := range []string{"bad1", "bad2", "good1"} {
			enqueue(t, b, runqueue.EnqueueParams{ID: id, Key: id})
			b.clock.Advance(time.Millisecond)
		}
		enqueue(t, b, runqueue.EnqueueParams{ID: "good2", Key: "good2"})
		corruptRecord(t, b, "bad1")
		corruptRecord(t, b, "bad2")
		runs, err := b.q.Dequeue(b.ctx, env, queueName, 1)
		require.NoError(t, err)
		require.Equal(t, []string{"good1"}, runIDs(runs))
		ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
		defer cancel()
		more, err := b.q.DequeueWait(ctx, env, queueName, 1, time.Minute)
		require.NoError(t, err)
		require.Equal(t, []string{"good2"}, runIDs(more))
		dead, err := b.q.DeadLetters(b.ctx, env, queueName, 0, 10)
		require.NoError(t, err)
		require.Len(t, dead, 2)
	})
}

// TestNackCorruptKillAgain: a Nack with DeadLetter of a held run whose
// record does not parse is answered once; sent again (as go-redis resends
// a call whose reply was lost) it is refused with ErrNotFound and writes
// nothing, as is one from a holder whose lease recovery dead-lettered the
// run first. Such a record holds no last settled token, so the two cannot
// be told apart: a0aa540 answered both as the first (helper-138: the stale
// holder's nack then reported a second end of the run).
func TestNackCorruptKillAgain(t *testing.T) {
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		enqueue(t, b, runqueue.EnqueueParams{ID: "r", Key: "k"})
		enqueue(t, b, runqueue.EnqueueParams{ID: "s", Key: "k2"})
		runs := dequeue(t, b, queueName, 2)
		require.Len(t, runs, 2)
		corruptRecord(t, b, "r")
		corruptRecord(t, b, "s")
		res, err := b.q.Nack(b.ctx, runs[0], &runqueue.NackOptions{DeadLetter: true})
		require.NoError(t, err)
		require.Equal(t, runqueue.NackResult{}, res)
		before := b.dump(t)
		_, err = b.q.Nack(b.ctx, runs[0], &runqueue.NackOptions{DeadLetter: true})
		require.ErrorIs(t, err, runqueue.ErrNotFound, "sent again")
		require.Equal(t, before, b.dump(t), "a refused nack writes nothing")

		b.clock.Advance(b.q.Config().LeaseDuration + time.Second)
		n, err := b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 10)
		require.NoError(t, err)
		require.Equal(t, 1, n, "s, dead-lettered as it is")
		before = b.dump(t)
		_, err = b.q.Nack(b.ctx, runs[1], &runqueue.NackOptions{DeadLetter: true})
		require.ErrorIs(t, err, runqueue.ErrNotFound, "after its lease recovery")
		require.Equal(t, before, b.dump(t))
		st := queueStats(t, b, queueName)
		require.Equal(t, runqueue.Stats{Dead: 2}, runqueue.Stats{Ready: st.Ready, Delayed: st.Delayed, InFlight: st.InFlight, Dead: st.Dead})
	})
}

// TestDequeueCorruptManyFirstInLine: 40 runs whose records do not parse
// ahead of a good one, calls of 1: the call is made again until it serves
// the good run (helper-138: a bound of 16 calls returned nothing, and a
// DequeueWait slept its poll interval).
func TestDequeueCorruptManyFirstInLine(t *testing.T) {
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		enqueueCorrupt(t, b, 40)
		enqueue(t, b, runqueue.EnqueueParams{ID: "good", Key: "good"})
		runs, err := b.q.Dequeue(b.ctx, env, queueName, 1)
		require.NoError(t, err)
		require.Equal(t, []string{"good"}, runIDs(runs))
		require.EqualValues(t, 40, queueStats(t, b, queueName).Dead)
	})
}

// corruptTimeObs records the times the Observer hears runs dequeued at.
type corruptTimeObs struct {
	runqueue.NopObserver
	mu    sync.Mutex
	times []time.Time
}

func (o *corruptTimeObs) Dequeued(runs []*runqueue.Run, now time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, r := range runs {
		o.times = append(o.times, now, r.AvailableAt)
	}
}

// TestDequeueCorruptThenFails: a call that served only runs whose records
// do not parse and whose call made again then failed (LimitsFor refuses
// from then on) returns that error, and the Observer hears of the runs it
// dead-lettered at the call's time (helper-138: a coalesced call told it
// 1970, the failed call's result carrying no time).
func TestDequeueCorruptThenFails(t *testing.T) {
	for _, serial := range []bool{false, true} {
		t.Run(fmt.Sprintf("serial=%v", serial), func(t *testing.T) {
			forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
				obs := &corruptTimeObs{}
				var armed atomic.Bool
				var calls atomic.Int32
				b.reopen(t, func(cfg *runqueue.Config) {
					cfg.Observer, cfg.SerialCalls = obs, serial
					cfg.LimitsFor = func(_, _ string) runqueue.Limits {
						// (the flag-on enqueue reads them too)
						if armed.Load() && calls.Add(1) > 1 {
							return runqueue.Limits{Key: -1}
						}
						return runqueue.Limits{}
					}
				})
				enqueue(t, b, runqueue.EnqueueParams{ID: "bad", Key: "k1"})
				corruptRecord(t, b, "bad")
				armed.Store(true)
				_, err := b.q.Dequeue(b.ctx, env, queueName, 1)
				require.ErrorIs(t, err, runqueue.ErrInvalid)
				obs.mu.Lock()
				defer obs.mu.Unlock()
				require.Len(t, obs.times, 2)
				for _, at := range obs.times {
					require.WithinDuration(t, b.clock.Now(), at, time.Second)
				}
			})
		})
	}
}

// TestDequeueCorruptDelayedHugeAt: a delayed run whose record's at has
// 20 digits (the scripts' pattern takes it, Go refuses it) stopped the
// queue on miniredis, whose Lua reads no number from it (helper-137); on
// Redis it reads as 1e20. Either way it is now served and dead-lettered.
func TestDequeueCorruptDelayedHugeAt(t *testing.T) {
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		enqueue(t, b, runqueue.EnqueueParams{ID: "bad", Key: "k1", Delay: time.Second})
		enqueue(t, b, runqueue.EnqueueParams{ID: "r1", Key: "k2", Delay: 2 * time.Second})
		editRecord(t, b, "bad", func(f []string) { f[3] = "99999999999999999999" })
		b.clock.Advance(3 * time.Second)
		runs, err := b.q.Dequeue(b.ctx, env, queueName, 10)
		require.NoError(t, err)
		require.Equal(t, []string{"r1"}, runIDs(runs))
		ackAll(t, b, runs)
		requireDeadAsIs(t, b, "bad", 0)
	})
}

// TestDequeueCorruptBounded: a call made again while it serves runs whose
// records do not parse stops after 64 more calls (helper-140: 1,024 let a
// cancelled coalesced Dequeue wait 3 s at 1 ms a round trip); the next
// call goes on. 100 such runs, calls of 1.
func TestDequeueCorruptBounded(t *testing.T) {
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		enqueueCorrupt(t, b, 100)
		enqueue(t, b, runqueue.EnqueueParams{ID: "good", Key: "good"})
		runs, err := b.q.Dequeue(b.ctx, env, queueName, 1)
		require.NoError(t, err)
		dead := queueStats(t, b, queueName).Dead
		if !on {
			require.Empty(t, runs, "flag off serves by age: the 100 first")
		}
		if len(runs) == 0 {
			require.EqualValues(t, 65, dead, "one call and 64 more, a run each")
			runs, err = b.q.Dequeue(b.ctx, env, queueName, 1)
			require.NoError(t, err)
		}
		require.Equal(t, []string{"good"}, runIDs(runs))
		require.LessOrEqual(t, queueStats(t, b, queueName).Dead, int64(100))
	})
}
