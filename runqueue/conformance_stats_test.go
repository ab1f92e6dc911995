package runqueue_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// statsCases: QueueStats, KeyStats and EnvStats.
func statsCases() []conformanceCase {
	return []conformanceCase{
		{name: "Stats", mutate: func(c *runqueue.Config) { c.MaxAttempts = 1 }, fn: func(t *testing.T, b *testBundle) {
			enqueue(t, b, runqueue.EnqueueParams{Queue: "q1", Key: "a", ID: "1"})
			b.clock.Advance(2 * time.Second)
			enqueue(t, b, runqueue.EnqueueParams{Queue: "q1", Key: "a", ID: "2"})
			enqueue(t, b, runqueue.EnqueueParams{Queue: "q1", Key: "b", ID: "3"})
			enqueue(t, b, runqueue.EnqueueParams{Queue: "q1", Key: "b", ID: "4", Delay: time.Hour})
			enqueue(t, b, runqueue.EnqueueParams{Queue: "q1", ID: "5"})
			enqueue(t, b, runqueue.EnqueueParams{Queue: "q1", ID: "6"})
			enqueue(t, b, runqueue.EnqueueParams{Queue: "q2", ID: "7"})
			enqueue(t, b, runqueue.EnqueueParams{Queue: "q2", ID: "8"})
			b.clock.Advance(5 * time.Second)

			// q1: "1" in flight, "2".."6" queued (all 2s after t0); q2: "7" dead.
			runs := dequeue(t, b, "q1", 1)
			require.Equal(t, []string{"1"}, runIDs(runs))
			q2 := dequeue(t, b, "q2", 1)
			require.Equal(t, []string{"7"}, runIDs(q2))
			res, err := b.q.Nack(b.ctx, q2[0], nil)
			require.NoError(t, err)
			require.False(t, res.Requeued)
			b.clock.Advance(time.Second)

			s := queueStats(t, b, "q1")
			require.Equal(t, runqueue.Stats{Ready: 4, Delayed: 1, InFlight: 1, OldestReadyAge: 6 * time.Second}, s)
			s = queueStats(t, b, "q2")
			require.Equal(t, runqueue.Stats{Ready: 1, Dead: 1, OldestReadyAge: 6 * time.Second}, s)

			for _, tc := range []struct {
				key  string
				want runqueue.Stats
			}{
				{"a", runqueue.Stats{Ready: 1, InFlight: 1, OldestReadyAge: 6 * time.Second}},
				{"b", runqueue.Stats{Ready: 1, Delayed: 1, OldestReadyAge: 6 * time.Second}},
				{"", runqueue.Stats{Ready: 2, OldestReadyAge: 6 * time.Second}},
				{"none", runqueue.Stats{}},
			} {
				ks, err := b.q.KeyStats(b.ctx, env, "q1", tc.key)
				require.NoError(t, err)
				require.Equal(t, tc.want, ks, "key %q", tc.key)
			}
			es, err := b.q.EnvStats(b.ctx, env)
			require.NoError(t, err)
			require.Equal(t, runqueue.Stats{Ready: 5, Delayed: 1, InFlight: 1, Dead: 1, OldestReadyAge: 6 * time.Second}, es)

			// The oldest ready age grows with the clock and is measured on
			// the first run in age order.
			b.clock.Advance(4 * time.Second)
			s = queueStats(t, b, "q1")
			require.Equal(t, 10*time.Second, s.OldestReadyAge)
			ackAll(t, b, runs)
			s = queueStats(t, b, "q1")
			require.Equal(t, int64(0), s.InFlight)

			es, err = b.q.EnvStats(b.ctx, "nobody")
			require.NoError(t, err)
			require.Equal(t, runqueue.Stats{}, es)
		}},
	}
}
