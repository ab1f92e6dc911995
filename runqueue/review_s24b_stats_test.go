package runqueue_test

// Review s24b: Stats on a real Redis, both flag states.

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// TestS24BOldestReadyAgeWithPriority: one key holds an old run of priority
// 0 and a newer one of priority 9. Priority orders the newer one first
// (ready score = available_at - 9 x PriorityStep), so the run first in line
// is the newer one while the old one waits behind it.
//
// Contract (stats.go, Stats.OldestReadyAge): "now minus the available_at
// of the ready run first in line ... Without priorities that is the oldest
// ready run; with them a run that became ready earlier may wait behind it,
// so the longest wait can exceed this by up to MaxPriority x
// PriorityStep". (A review found the doc promising the oldest ready run's
// age, which the stats never measured with priorities; finding it would
// read every run's record, payloads included, so the doc now says what is
// measured and by how much it can fall short.)
func TestS24BOldestReadyAgeWithPriority(t *testing.T) {
	s24bFlags(t, nil, func(t *testing.T, b *testBundle) {
		enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "old"})
		b.clock.Advance(time.Minute)
		enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "same", Priority: 0})
		b.clock.Advance(time.Second)

		// Without priorities: the oldest ready run's age.
		ks, err := b.q.KeyStats(b.ctx, env, queueName, "k")
		require.NoError(t, err)
		assert.Equal(t, 61*time.Second, ks.OldestReadyAge, "KeyStats: the oldest ready run is \"old\", 61s")
		assert.Equal(t, 61*time.Second, queueStats(t, b, queueName).OldestReadyAge)

		// With one: the age of the run first in line, within MaxPriority x
		// PriorityStep of the longest wait.
		enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "urgent", Priority: runqueue.MaxPriority})
		b.clock.Advance(time.Second)
		ks, err = b.q.KeyStats(b.ctx, env, queueName, "k")
		require.NoError(t, err)
		require.Equal(t, int64(3), ks.Ready)
		assert.Equal(t, time.Second, ks.OldestReadyAge, "KeyStats: \"urgent\" is first in line, 1s")
		qs := queueStats(t, b, queueName)
		assert.Equal(t, time.Second, qs.OldestReadyAge, "QueueStats: the same variant's head")
		step := b.q.Config().PriorityStep
		assert.LessOrEqual(t, 62*time.Second-ks.OldestReadyAge, time.Duration(runqueue.MaxPriority)*step,
			"the longest wait (\"old\", 62s) exceeds it by at most MaxPriority x PriorityStep")
		served := dequeue(t, b, queueName, 1)
		require.Len(t, served, 1)
		require.Equal(t, "urgent", served[0].ID, "first in line is what a dequeue serves")
	})
}
