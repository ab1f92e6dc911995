package runqueue_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

func byKey(s *runqueue.Schedule) map[string]runqueue.KeySchedule {
	out := map[string]runqueue.KeySchedule{}
	for _, k := range s.Keys {
		out[k.Key] = k
	}
	return out
}

func TestSchedule(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, func(cfg *runqueue.Config) {
			cfg.VtimeScheduling = true
			cfg.KeyConcurrency = 1
		})
		add := func(key, id string, delay time.Duration) {
			_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: "e", Queue: "q", Key: key, ID: id, Delay: delay})
			require.NoError(t, err)
		}
		add("gated", "g1", 0)
		add("gated", "g2", 0)
		add("busy", "b1", 0)
		add("busy", "b2", 0)
		add("later", "l1", time.Hour)
		add("once", "o1", 0)
		require.NoError(t, b.q.SetWeight(b.ctx, "e", "q", "busy", 2))

		// One run each of gated, busy and once goes in flight: gated is then
		// at its limit of 1, once drains and parks its tag.
		runs, err := b.q.Dequeue(b.ctx, "e", "q", 3)
		require.NoError(t, err)
		require.Len(t, runs, 3)
		for _, r := range runs {
			if r.Key == "busy" {
				require.NoError(t, b.q.Ack(b.ctx, r))
			}
		}

		s, err := b.q.Schedule(b.ctx, "e", "q", 10)
		require.NoError(t, err)
		keys := byKey(s)
		require.Equal(t, "at its limit", keys["gated"].Reason)
		require.True(t, keys["gated"].Registered)
		require.EqualValues(t, 1, keys["gated"].InFlight)
		require.Equal(t, "head in the future", keys["later"].Reason)
		require.False(t, keys["later"].Registered)
		require.EqualValues(t, 1, keys["later"].Delayed)
		require.Equal(t, "", keys["busy"].Reason, "busy has a ready run and room")
		require.Equal(t, 2.0, keys["busy"].Weight)
		require.InDelta(t, keys["busy"].Tag-s.V, keys["busy"].Lag, 1e-12)
		require.Equal(t, "idle", keys["once"].Reason)
		require.False(t, keys["once"].Registered)
		require.True(t, keys["once"].HasParked, "a key that drained above V keeps its tag parked")

		// Schedule changes nothing.
		before := b.dump(t)
		_, err = b.q.Schedule(b.ctx, "e", "q", 10)
		require.NoError(t, err)
		_, err = b.q.Preview(b.ctx, "e", "q", 10)
		require.NoError(t, err)
		require.Equal(t, before, b.dump(t))
	})
}

// TestScheduleAwaitingDiscovery: runs written by a flag-off instance have no
// tag until a flag-on dequeue discovers them.
func TestScheduleAwaitingDiscovery(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		off := setup(t, c, nil)
		on, err := runqueue.New(off.ctx, c, &runqueue.Config{Prefix: off.prefix, Clock: off.clock, VtimeScheduling: true})
		require.NoError(t, err)
		t.Cleanup(func() { _ = on.Close() })
		for i := 0; i < 40; i++ {
			_, err := off.q.Enqueue(off.ctx, runqueue.EnqueueParams{Env: "e", Queue: "q", Key: fmt.Sprintf("k%02d", i), ID: fmt.Sprint(i)})
			require.NoError(t, err)
		}
		s, err := on.Schedule(off.ctx, "e", "q", 1)
		require.NoError(t, err)
		keys := byKey(s)
		require.Equal(t, "awaiting discovery", keys["k00"].Reason)
		require.Equal(t, "awaiting discovery", keys["k39"].Reason)
		_, err = on.Dequeue(off.ctx, "e", "q", 1)
		require.NoError(t, err)
		s, err = on.Schedule(off.ctx, "e", "q", 1)
		require.NoError(t, err)
		// One call's discovery reads ScanLimit (30) variants at its cursor.
		keys = byKey(s)
		require.True(t, keys["k01"].Registered, "the dequeue registered what it discovered")
		require.Equal(t, "", keys["k29"].Reason)
		require.Equal(t, "awaiting discovery", keys["k30"].Reason)
		_, err = on.Dequeue(off.ctx, "e", "q", 1)
		require.NoError(t, err)
		s, err = on.Schedule(off.ctx, "e", "q", 1)
		require.NoError(t, err)
		require.True(t, byKey(s)["k39"].Registered, "the second call's cursor reached the rest")
	})
}
