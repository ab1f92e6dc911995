package runqueue_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// TestRequeueCorruptRecord: held runs whose stored records do not parse
// (a hand edit, a writer's bug such as Redrive's from year 5138 before
// 8aedc66). A Nack is refused with ErrCorruptRecord and nothing is
// written: the run stays held, its lease and slot in place. Once the lease
// passes, RecoverLeases dead-letters such runs with their records as they
// are (attempt 0 in DeadLetters) and frees their slots; a mended record is
// redriven and served, and PurgeDeadLetters removes one left as it is,
// record and all. requeue.lua released the hold, the lease and the slot
// first and then failed on the record ("arithmetic on a nil value"),
// leaving the run in no set at all; a first fix (735f46f) refused the
// recovery too, and the run, first in its shard's leases for ever, then
// took a place in every sweep's limit (helper-126: RecoverLeases(shard,
// 1) recovered nothing more).
func TestRequeueCorruptRecord(t *testing.T) {
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		b.cfg.KeyConcurrency = 1
		q, err := runqueue.New(b.ctx, b.client, b.cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = q.Close() })
		b.q = q
		enqueue(t, b, runqueue.EnqueueParams{ID: "r0", Key: "k1"})
		enqueue(t, b, runqueue.EnqueueParams{ID: "r1", Key: "k2"})
		enqueue(t, b, runqueue.EnqueueParams{ID: "r2", Key: "k1"})
		runs := dequeue(t, b, queueName, 3)
		require.Equal(t, []string{"r0", "r1"}, runIDs(runs), "k1 at its limit of 1")
		runsKey := keySpace(t, b).Env(env).Queue(queueName).Runs()
		good := map[string]string{}
		for _, r := range runs {
			field := keys.Segment(r.ID)
			rec, err := b.client.HGet(b.ctx, runsKey, field).Result()
			require.NoError(t, err)
			good[r.ID] = rec
			require.NoError(t, b.client.HSet(b.ctx, runsKey, field, "not a record").Err())
		}
		before := b.dump(t)

		_, err = b.q.Nack(b.ctx, runs[0], &runqueue.NackOptions{RetryAt: b.clock.Now()})
		require.ErrorIs(t, err, runqueue.ErrCorruptRecord)
		require.Equal(t, before, b.dump(t), "a refused nack writes nothing")
		require.Empty(t, dequeue(t, b, queueName, 3), "r2 waits: r0 holds k1's slot")

		b.clock.Advance(b.q.Config().LeaseDuration + time.Second)
		n, err := b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 1)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		n, err = b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 1)
		require.NoError(t, err)
		require.Equal(t, 1, n, "the next sweep reaches the next run")
		dead, err := b.q.DeadLetters(b.ctx, env, queueName, 0, 10)
		require.NoError(t, err)
		require.Len(t, dead, 2)
		for _, d := range dead {
			require.Zero(t, d.Attempt, "%s: its record is as it was", d.ID)
		}
		st := queueStats(t, b, queueName)
		require.Equal(t, runqueue.Stats{Ready: 1, Dead: 2}, runqueue.Stats{Ready: st.Ready, Dead: st.Dead, InFlight: st.InFlight})

		// k1's slot is free: r2 is served.
		more := dequeue(t, b, queueName, 3)
		require.Equal(t, []string{"r2"}, runIDs(more))
		ackAll(t, b, more)

		// r0 mended and redriven; r1 purged as it is.
		require.NoError(t, b.client.HSet(b.ctx, runsKey, keys.Segment("r0"), good["r0"]).Err())
		require.NoError(t, b.q.Redrive(b.ctx, env, queueName, "k1", "r0"))
		again := dequeue(t, b, queueName, 3)
		require.Equal(t, []string{"r0"}, runIDs(again))
		require.Equal(t, 1, again[0].Attempt)
		ackAll(t, b, again)
		purged, err := b.q.PurgeDeadLetters(b.ctx, env, queueName, b.clock.Now(), 10)
		require.NoError(t, err)
		require.Equal(t, 1, purged)
		require.Equal(t, runqueue.Stats{}, queueStats(t, b, queueName))
		if !on { // (flag on, the scheduler's state stays until its TTL)
			require.Empty(t, b.keysUnder(t), "nothing left, the corrupt record included")
		}
	})
}
