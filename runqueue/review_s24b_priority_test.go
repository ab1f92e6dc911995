package runqueue_test

// Review s24b: a low-priority run against a continuous stream of
// high-priority runs, on a real Redis, both flag states.

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// TestS24BPriorityStreamBounded: key "k" holds one priority-0 run "low"
// enqueued at t0; then, every 100ms, two priority-9 runs arrive (of the same
// key "k", or of another key "b") and one run is dequeued, so the backlog of
// high-priority runs grows without end.
//
// Contract (doc.go): "A priority p orders the run as if it had become
// available p x Config.PriorityStep ... earlier; it never makes a run
// available before its time, so old work is not starved"; README:
// "priority helps without starving anyone". Same key (both flags) and other
// key with the flag off (age order): no priority-9 run that became
// available after t0 + 9 x PriorityStep may be served before "low". Other
// key with the flag on (docs/design.md guarantee 10, "a key that
// registers when the lane is empty is served within 3 serves per other
// active key"): at most 3 serves of "b" before "low".
func TestS24BPriorityStreamBounded(t *testing.T) {
	const step = time.Second
	for _, floodKey := range []string{"k", "b"} {
		t.Run("flood="+floodKey, func(t *testing.T) {
			s24bFlags(t, func(c *runqueue.Config) { c.PriorityStep = step }, func(t *testing.T, b *testBundle) {
				on := b.cfg.VtimeScheduling
				t0 := b.clock.Now()
				enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "low"})
				avail := map[string]time.Time{}
				served := 0
				for i := 0; ; i++ {
					require.Less(t, i, 1000, "low never served")
					b.clock.Advance(100 * time.Millisecond)
					for j := range 2 {
						id := fmt.Sprintf("hi-%04d-%d", i, j)
						avail[id] = b.clock.Now()
						enqueue(t, b, runqueue.EnqueueParams{Key: floodKey, ID: id, Priority: runqueue.MaxPriority})
					}
					runs := dequeue(t, b, queueName, 1)
					require.Len(t, runs, 1)
					r := runs[0]
					require.NoError(t, b.q.Ack(b.ctx, r))
					if r.ID == "low" {
						t.Logf("low served after %d other serves, at t0+%v", served, b.clock.Now().Sub(t0))
						return
					}
					served++
					if floodKey == "b" && on {
						require.LessOrEqual(t, served, 3, "flag on: at most 3 serves of the other key before low")
					} else {
						require.False(t, avail[r.ID].After(t0.Add(runqueue.MaxPriority*step)),
							"%s (available at t0+%v) served before low", r.ID, avail[r.ID].Sub(t0))
					}
				}
			})
		})
	}
}
