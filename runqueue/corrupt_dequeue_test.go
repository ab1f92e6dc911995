package runqueue_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// corruptRecord replaces run id's stored record with one that does not
// parse (a hand edit, a writer's bug) and returns what was there.
func corruptRecord(t *testing.T, b *testBundle, id string) string {
	t.Helper()
	runsKey := keySpace(t, b).Env(env).Queue(queueName).Runs()
	rec, err := b.client.HGet(b.ctx, runsKey, keys.Segment(id)).Result()
	require.NoError(t, err)
	require.NoError(t, b.client.HSet(b.ctx, runsKey, keys.Segment(id), "not a record").Err())
	return rec
}

// requireDeadAsIs: run id is the queue's one dead letter, its record as
// it was left (attempt 0), and nothing is in flight.
func requireDeadAsIs(t *testing.T, b *testBundle, id string) {
	t.Helper()
	dead, err := b.q.DeadLetters(b.ctx, env, queueName, 0, 10)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, id, dead[0].ID)
	require.Zero(t, dead[0].Attempt, "its record is as it was")
	st := queueStats(t, b, queueName)
	require.Equal(t, int64(1), st.Dead)
	require.Zero(t, st.InFlight, "its hold and slot are released")
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
		requireDeadAsIs(t, b, "bad")
		st := queueStats(t, b, queueName)
		require.Zero(t, st.Ready+st.Delayed)
	})
}

// TestDequeueCorruptReadyRecord: a Dequeue that served a run whose record
// does not parse failed whole (ErrCorruptRecord), and the good runs it had
// taken stayed held until their leases passed (recovered with attempt + 1,
// dead-lettered under MaxAttempts 1). The call now delivers the good runs
// and dead-letters the bad one at once; its key's slot is free for the
// key's next run. A Nack with DeadLetter of such a run (held) dead-letters
// it too, where it was refused; a Nack that would retry it still is.
func TestDequeueCorruptReadyRecord(t *testing.T) {
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		b.cfg.KeyConcurrency = 1
		b.cfg.MaxAttempts = 1
		q, err := runqueue.New(b.ctx, b.client, b.cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = q.Close() })
		b.q = q
		enqueue(t, b, runqueue.EnqueueParams{ID: "bad", Key: "k1"})
		enqueue(t, b, runqueue.EnqueueParams{ID: "r1", Key: "k2"})
		enqueue(t, b, runqueue.EnqueueParams{ID: "r2", Key: "k1"})
		corruptRecord(t, b, "bad")
		runs, err := b.q.Dequeue(b.ctx, env, queueName, 10)
		require.NoError(t, err)
		require.Equal(t, []string{"r1"}, runIDs(runs), "k1 was at its limit of 1 with bad")
		ackAll(t, b, runs)
		requireDeadAsIs(t, b, "bad")
		more := dequeue(t, b, queueName, 10)
		require.Equal(t, []string{"r2"}, runIDs(more), "bad's slot was freed")
		require.Equal(t, 1, more[0].Attempt)

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
				rec := corruptRecord(t, b, "bad")
				f := strings.SplitN(rec, "|", 7)
				require.Len(t, f, 7)
				edit(f)
				runsKey := keySpace(t, b).Env(env).Queue(queueName).Runs()
				require.NoError(t, b.client.HSet(b.ctx, runsKey, keys.Segment("bad"), strings.Join(f, "|")).Err())
				runs, err := b.q.Dequeue(b.ctx, env, queueName, 10)
				require.NoError(t, err)
				require.Equal(t, []string{"r1"}, runIDs(runs))
				ackAll(t, b, runs)
				dead, err := b.q.DeadLetters(b.ctx, env, queueName, 0, 10)
				require.NoError(t, err)
				require.Len(t, dead, 1)
				require.Equal(t, "bad", dead[0].ID)
				st := queueStats(t, b, queueName)
				require.Zero(t, st.InFlight+st.Ready+st.Delayed)
			})
		})
	}
}
