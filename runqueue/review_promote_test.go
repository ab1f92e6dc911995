package runqueue_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// TestPromoteFailsMidwayRepaired (flag on; from the adversarial review of
// 2ea228e): a promoting dequeue that fails part-way through the promotion
// (a due delayed run whose record was deleted by hand) leaves the keys it
// promoted before the failure unregistered, since the promotion's
// registrations come after it. Once the broken run is removed, the next
// dequeues find them by discovery: every run is served, once.
func TestPromoteFailsMidwayRepaired(t *testing.T) {
	redistest.ForEachBackend(t, backends[:2], func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling, cfg.SerialCalls = true, true })
		now := b.clock.Now()
		// x and y hold tags above V (one run of each served).
		for _, id := range []string{"x1", "x2", "y1", "y2"} {
			enqueue(t, b, runqueue.EnqueueParams{Key: id[:1], ID: id, Payload: []byte("p"), AvailableAt: now})
		}
		require.Len(t, dequeue(t, b, queueName, 2), 2)
		enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "a1", Payload: []byte("p"), Delay: time.Second})
		enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: "b1", Payload: []byte("p"), Delay: 2 * time.Second})
		qk := reviewQK(t, b)
		require.NoError(t, c.HDel(b.ctx, qk.Runs(), keys.Segment("b1")).Err()) // the hand edit
		b.clock.Advance(3 * time.Second)
		_, err := b.q.Dequeue(b.ctx, env, queueName, 1)
		require.Error(t, err, "a due run without its record fails the promotion")
		registered, err := c.HExists(b.ctx, qk.CkVtimeState(), keys.VariantMember("a")).Result()
		require.NoError(t, err)
		require.False(t, registered, "a's registration comes after the promotion, which failed")

		// The operator removes the broken run.
		vb := qk.Variant("b")
		require.NoError(t, c.ZRem(b.ctx, vb.Delayed(), keys.Segment("b1")).Err())
		require.NoError(t, c.ZRem(b.ctx, qk.DelayIndex(), vb.Member()).Err())
		var served []string
		for range 10 {
			runs := dequeue(t, b, queueName, 1)
			if len(runs) == 0 {
				break
			}
			served = append(served, runs[0].ID)
		}
		require.ElementsMatch(t, []string{"a1", "x2", "y2"}, served, "every run served once after the repair")
	})
}
