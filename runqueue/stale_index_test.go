package runqueue_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// TestDequeueStaleIndexEntry: the oldest run of a queue is taken out by
// hand (its ready set's member and its record deleted, as an operator
// removes a stuck run), so the queue's age index still names its key, whose
// ready set is empty. Flag off, a call of maxCount reads only the first
// maxCount entries of the index when no key limit applies: every call of
// 1 (Dequeue, DequeueShard, a Worker of Concurrency 1) served nothing, for
// ever, and left the entry (helper-141). Now the call that finds such an
// entry removes it: the next call serves the others, and the key's
// variant is gone from the index. (Flag on, the scheduler served the
// others already; the entry stays in the index, which a flag-off call
// would mend.)
func TestDequeueStaleIndexEntry(t *testing.T) {
	t.Parallel()
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		qk := keySpace(t, b).Env(env).Queue(queueName)
		for _, r := range [][2]string{{"poison", "k0"}, {"r1", "k1"}, {"r2", "k2"}, {"r3", "k3"}} {
			enqueue(t, b, runqueue.EnqueueParams{ID: r[0], Key: r[1]})
			b.clock.Advance(time.Millisecond)
		}
		require.NoError(t, b.client.ZRem(b.ctx, qk.Variant("k0").Ready(), keys.Segment("poison")).Err())
		require.NoError(t, b.client.HDel(b.ctx, qk.Runs(), keys.Segment("poison")).Err())

		var got []string
		for range 3 {
			runs, err := b.q.Dequeue(b.ctx, env, queueName, 1)
			require.NoError(t, err)
			got = append(got, runIDs(runs)...)
			ackAll(t, b, runs)
		}
		runs, err := b.q.DequeueShard(b.ctx, b.q.ShardOf(env), 1)
		require.NoError(t, err)
		got = append(got, runIDs(runs)...)
		ackAll(t, b, runs)
		require.Equal(t, []string{"r1", "r2", "r3"}, got, "one call at most finds the stale entry")
		if !on {
			// (Flag on, the scheduler serves around it, and the entry stays.)
			err = b.client.ZScore(b.ctx, qk.CkIndex(), keys.VariantMember("k0")).Err()
			require.ErrorIs(t, err, redis.Nil, "the stale entry left the index")
		}
	})
}
