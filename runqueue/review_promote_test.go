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
// 2ea228e): a promoting dequeue meets a due delayed run whose record was
// deleted by hand (or evicted) after it promoted another key's run. It
// once failed part-way, leaving the keys it had promoted unregistered
// until discovery found them and the broken run in place until an
// operator removed it; a run without its record is now dropped by the
// promotion (it leaves the delayed set, the depth counts follow, it is
// not made ready), and the call goes on: every other run is served, once,
// and nothing is left queued.
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
		var served []string
		for range 10 {
			runs := dequeue(t, b, queueName, 1)
			if len(runs) == 0 {
				break
			}
			served = append(served, runs[0].ID)
		}
		require.ElementsMatch(t, []string{"a1", "x2", "y2"}, served, "every run with a record served once")
		vb := qk.Variant("b")
		n, err := c.ZCard(b.ctx, vb.Delayed()).Result()
		require.NoError(t, err)
		require.Zero(t, n, "the run without a record left the delayed set")
		require.Equal(t, runqueue.Stats{InFlight: 5}, queueStats(t, b, queueName), "nothing queued; the five served runs in flight")
	})
}
