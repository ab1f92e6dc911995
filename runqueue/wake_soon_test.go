package runqueue_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// TestNextDueDelayedBesideHeld: a blocking dequeue beside work that limits
// hold back looks again after BlockPollInterval, but work to come within
// that poll wakes it at its time. helper-184: Shards 1, an env at its limit
// with a ready backlog anywhere on the shard, an idle env's run due in
// 200 ms: DequeueShardWait and a shard Worker served it 1.8 s late, at the
// poll of 2 s (shardNext returned the held queue's old score, a poll).
// helper-177: the same for DequeueWait on one queue whose held keys' runs
// are due beside a free key's run due later. Both flags; when the work to
// come is due after the poll, the poll stands. (ShardLookAhead off.)
func TestNextDueDelayedBesideHeld(t *testing.T) {
	t.Parallel()
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
				b := setup(t, c, func(cfg *runqueue.Config) {
					cfg.VtimeScheduling, cfg.KeyConcurrency, cfg.Shards = on, 1, 1
					cfg.LeaseDuration, cfg.BlockPollInterval = time.Hour, 2*time.Second
					// no look ahead: its rechecks of queues found without
					// ready runs are wake-ups within the poll of their own
					cfg.ShardLookAhead = -1
				})
				heldQueues(t, b, "a", 0, 1) // env a, queue q000: key h at its limit, one run held back
				now := b.clock.Now().UnixMilli()
				at, ok, err := b.q.NextDue(b.ctx, "a", "q000", 0)
				require.NoError(t, err)
				require.True(t, ok)
				require.LessOrEqual(t, at, now, "the held queue alone: a poll")

				// An idle env's run due in 200 ms wakes the shard's waiter at its time.
				enqueue(t, b, runqueue.EnqueueParams{Env: "b", Queue: "q", Key: "k", ID: "soon",
					AvailableAt: b.clock.Now().Add(200 * time.Millisecond)})
				at, ok, err = b.q.NextDue(b.ctx, "", "", 0)
				require.NoError(t, err)
				require.True(t, ok)
				require.Equal(t, now+200, at, "shard: the run due within the poll")

				// The same queue: a free key's run due in 300 ms beside key h's held run.
				enqueue(t, b, runqueue.EnqueueParams{Env: "a", Queue: "q000", Key: "free", ID: "later",
					AvailableAt: b.clock.Now().Add(300 * time.Millisecond)})
				at, ok, err = b.q.NextDue(b.ctx, "a", "q000", -1)
				require.NoError(t, err)
				require.True(t, ok)
				require.Equal(t, now+300, at, "queue: the run due within the poll")

				// Due after the poll: the poll stands.
				enqueue(t, b, runqueue.EnqueueParams{Env: "c", Queue: "q", Key: "k", ID: "far",
					AvailableAt: b.clock.Now().Add(5 * time.Second)})
				runs, err := b.q.DequeueShard(b.ctx, 0, 10)
				require.NoError(t, err)
				require.Empty(t, runs)
				b.clock.Advance(400 * time.Millisecond) // both runs above promoted by the next calls
				for range 2 {
					runs, err = b.q.DequeueShard(b.ctx, 0, 10)
					require.NoError(t, err)
					ackAll(t, b, runs)
				}
				now = b.clock.Now().UnixMilli()
				at, ok, err = b.q.NextDue(b.ctx, "", "", 0)
				require.NoError(t, err)
				require.True(t, ok)
				require.LessOrEqual(t, at, now, "shard: the run due after the poll leaves the poll")
				at, ok, err = b.q.NextDue(b.ctx, "a", "q000", -1)
				require.NoError(t, err)
				require.True(t, ok)
				require.LessOrEqual(t, at, now, "queue: nothing due within the poll")
			})
		})
	}
}
