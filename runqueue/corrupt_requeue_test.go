package runqueue_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// TestRequeueCorruptRecordWritesNothing: a held run whose stored record
// does not parse (a hand edit, a writer's bug such as Redrive's from year
// 5138 before 8aedc66) is refused by Nack and by RecoverLeases with
// ErrCorruptRecord, and nothing is written: the run stays held, its lease
// and slot in place. requeue.lua released the hold, the lease and the slot
// first and then failed on the record ("arithmetic on a nil value"), which
// left the run in no set at all: never delivered again, never recovered,
// never dead-lettered. Once the record is mended, recovery takes the run
// back as usual.
func TestRequeueCorruptRecordWritesNothing(t *testing.T) {
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		enqueue(t, b, runqueue.EnqueueParams{ID: "r0", Key: "k1"})
		enqueue(t, b, runqueue.EnqueueParams{ID: "r1", Key: "k1"})
		runs := dequeue(t, b, queueName, 1)
		require.Len(t, runs, 1)
		runsKey := keySpace(t, b).Env(env).Queue(queueName).Runs()
		field := keys.Segment(runs[0].ID)
		good, err := b.client.HGet(b.ctx, runsKey, field).Result()
		require.NoError(t, err)
		require.NoError(t, b.client.HSet(b.ctx, runsKey, field, "not a record").Err())
		before := b.dump(t)

		_, err = b.q.Nack(b.ctx, runs[0], &runqueue.NackOptions{RetryAt: b.clock.Now()})
		require.ErrorIs(t, err, runqueue.ErrCorruptRecord)
		require.Equal(t, before, b.dump(t), "a refused nack writes nothing")

		b.clock.Advance(b.q.Config().LeaseDuration + time.Second)
		n, err := b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 100)
		require.ErrorIs(t, err, runqueue.ErrCorruptRecord)
		require.Zero(t, n)
		require.Equal(t, before, b.dump(t), "a refused recovery writes nothing")

		// The other run is still served within the key's limits: the
		// corrupt one holds its slot, as any held run does.
		more := dequeue(t, b, queueName, 2)
		require.Equal(t, []string{"r1"}, runIDs(more))
		ackAll(t, b, more)

		require.NoError(t, b.client.HSet(b.ctx, runsKey, field, good).Err())
		n, err = b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 100)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		again := dequeue(t, b, queueName, 1)
		require.Equal(t, []string{runs[0].ID}, runIDs(again))
		require.Equal(t, 2, again[0].Attempt)
	})
}
