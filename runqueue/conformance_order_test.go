package runqueue_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// orderCases: the order in which runs are served (age, priority, delay).
func orderCases() []conformanceCase {
	type step struct {
		key, id  string
		priority int
		advance  time.Duration // clock advance before the enqueue
	}
	type tc struct {
		name  string
		steps []step
		batch []int      // maxCount of successive dequeues
		want  [][]string // ids each dequeue returns
	}
	table := []tc{
		{
			name: "AgeOrderAcrossVariants",
			steps: []step{
				{key: "a", id: "a1"}, {key: "b", id: "b1", advance: time.Second}, {key: "a", id: "a2", advance: time.Second},
				{key: "a", id: "a3", advance: time.Second}, {key: "", id: "n1", advance: time.Second}, {key: "b", id: "b2", advance: time.Second},
			},
			batch: []int{10},
			want:  [][]string{{"a1", "b1", "a2", "a3", "n1", "b2"}},
		},
		{
			// One variant gives several runs in one call when it holds the
			// oldest ones; a smaller batch takes the same prefix.
			name: "OneVariantSeveralRuns",
			steps: []step{
				{key: "a", id: "a1"}, {key: "a", id: "a2", advance: time.Second}, {key: "a", id: "a3", advance: time.Second},
				{key: "b", id: "b1", advance: time.Second}, {key: "a", id: "a4", advance: time.Second},
			},
			batch: []int{3, 1, 5},
			want:  [][]string{{"a1", "a2", "a3"}, {"b1"}, {"a4"}},
		},
		{
			// Priority p orders a run as if it were p*PriorityStep (30s)
			// older: p2 at +40s scores -20s, ahead of p0 at 0; p1 at +100s
			// scores +70s, behind b0 at +50s.
			name: "PriorityBoundedAdvantage",
			steps: []step{
				{key: "a", id: "p0"}, {key: "b", id: "p2", priority: 2, advance: 40 * time.Second},
				{key: "b", id: "b0", advance: 10 * time.Second}, {key: "a", id: "p1", priority: 1, advance: 50 * time.Second},
				{key: "c", id: "p9", priority: 9, advance: 0},
			},
			batch: []int{2, 10},
			want:  [][]string{{"p9", "p2"}, {"p0", "b0", "p1"}},
		},
		{
			name: "PriorityInsideOneVariant",
			steps: []step{
				{key: "a", id: "old"}, {key: "a", id: "new-p1", priority: 1, advance: 29 * time.Second},
				{key: "a", id: "newer-p1", priority: 1, advance: 2 * time.Second},
			},
			batch: []int{10},
			want:  [][]string{{"new-p1", "old", "newer-p1"}},
		},
	}
	var out []conformanceCase
	for _, tt := range table {
		out = append(out, conformanceCase{name: tt.name, fn: func(t *testing.T, b *testBundle) {
			for _, s := range tt.steps {
				b.clock.Advance(s.advance)
				enqueue(t, b, runqueue.EnqueueParams{Key: s.key, ID: s.id, Priority: s.priority})
			}
			for i, n := range tt.batch {
				require.Equal(t, tt.want[i], runIDs(dequeue(t, b, queueName, n)), "dequeue %d (maxCount %d)", i, n)
			}
			require.Empty(t, dequeue(t, b, queueName, 10))
		}})
	}
	out = append(out,
		conformanceCase{name: "PriorityNeverEarly", fn: func(t *testing.T, b *testBundle) {
			start := b.clock.Now()
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "late-p9", Priority: 9, AvailableAt: start.Add(10 * time.Second)})
			enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: "now-p0"})
			require.Equal(t, []string{"now-p0"}, runIDs(dequeue(t, b, queueName, 10)))
			b.clock.Advance(10*time.Second - time.Millisecond)
			require.Empty(t, dequeue(t, b, queueName, 10), "priority does not make a run available early")
			enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: "b-p0"})
			b.clock.Advance(time.Millisecond)
			// Once available, its priority puts it ahead of older work.
			require.Equal(t, []string{"late-p9", "b-p0"}, runIDs(dequeue(t, b, queueName, 10)))
		}},
		conformanceCase{name: "DelayedRuns", fn: func(t *testing.T, b *testBundle) {
			start := b.clock.Now()
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "delay5s", Delay: 5 * time.Second})
			enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: "at10s", AvailableAt: start.Add(10 * time.Second)})
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "past", AvailableAt: start.Add(-time.Hour)})
			s := queueStats(t, b, queueName)
			require.Equal(t, int64(1), s.Ready)
			require.Equal(t, int64(2), s.Delayed)

			require.Equal(t, []string{"past"}, runIDs(dequeue(t, b, queueName, 10)))
			require.Empty(t, dequeue(t, b, queueName, 10))
			b.clock.Advance(5*time.Second - time.Millisecond)
			require.Empty(t, dequeue(t, b, queueName, 10), "invisible until its time")
			b.clock.Advance(time.Millisecond)
			require.Equal(t, []string{"delay5s"}, runIDs(dequeue(t, b, queueName, 10)))
			b.clock.Advance(4 * time.Second)
			require.Empty(t, dequeue(t, b, queueName, 10))
			// A due run waits in the delayed set until a dequeue promotes it,
			// so Stats may count it delayed until then.
			b.clock.Advance(time.Second)
			s = queueStats(t, b, queueName)
			require.Equal(t, int64(1), s.Ready+s.Delayed)
			require.Equal(t, int64(2), s.InFlight)
			require.Equal(t, []string{"at10s"}, runIDs(dequeue(t, b, queueName, 10)))
			s = queueStats(t, b, queueName)
			require.Equal(t, runqueue.Stats{InFlight: 3}, s)
		}},
		conformanceCase{name: "DelayedAndReadyInOneVariant", fn: func(t *testing.T, b *testBundle) {
			// A delayed run that comes due orders by its available_at among
			// the variant's ready runs, not behind them.
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "d", Delay: time.Second})
			b.clock.Advance(500 * time.Millisecond)
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "r1"})
			b.clock.Advance(time.Second)
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "r2"})
			require.Equal(t, []string{"r1", "d", "r2"}, runIDs(dequeue(t, b, queueName, 10)))
		}},
	)
	return out
}
