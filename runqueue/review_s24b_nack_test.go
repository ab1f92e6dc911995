package runqueue_test

// Review s24b: a retried Nack (the caller's retry after a context deadline
// or a lost reply) on a real Redis, both flag states.

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

func s24bFlags(t *testing.T, mutate func(*runqueue.Config), fn func(t *testing.T, b *testBundle)) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			fn(t, setup(t, redistest.Real(t), func(cfg *runqueue.Config) {
				cfg.VtimeScheduling = on
				if mutate != nil {
					mutate(cfg)
				}
			}))
		})
	}
}

// TestS24BNackRetriedRetryAt: a caller whose Nack timed out retries it a
// moment later, computing its retry time again (Nack(ctx, r, nil) draws a
// fresh backoff from a later now; a caller passing "now + 1m" passes a
// later time).
//
// Contract (doc.go): "Every write is safe to send twice, as go-redis does
// when a reply times out: ... a repeated nack returns what the first
// returned"; NackResult.RetryAt (leases.go): "RetryAt is when it becomes
// ready again".
func TestS24BNackRetriedRetryAt(t *testing.T) {
	t.Run("Backoff", func(t *testing.T) {
		s24bFlags(t, func(c *runqueue.Config) { c.BackoffJitter = -1 }, func(t *testing.T, b *testBundle) {
			enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
			r := dequeue(t, b, queueName, 1)[0]
			first, err := b.q.Nack(b.ctx, r, nil)
			require.NoError(t, err)
			require.True(t, first.Requeued)
			b.clock.Advance(500 * time.Millisecond) // the caller's timeout, then its retry
			again, err := b.q.Nack(b.ctx, r, nil)
			require.NoError(t, err)
			require.Equal(t, first, again, "a repeated nack returns what the first returned")
		})
	})
	t.Run("RetryAt", func(t *testing.T) {
		s24bFlags(t, nil, func(t *testing.T, b *testBundle) {
			enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
			r := dequeue(t, b, queueName, 1)[0]
			first, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{RetryAt: b.clock.Now().Add(time.Minute)})
			require.NoError(t, err)
			b.clock.Advance(time.Second)
			again, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{RetryAt: b.clock.Now().Add(time.Minute)})
			require.NoError(t, err)
			// The run is ready at the first call's time, not the retry's.
			b.clock.Advance(first.RetryAt.Sub(b.clock.Now()))
			got := dequeue(t, b, queueName, 1)
			require.Equal(t, []string{"r"}, runIDs(got), "ready at the first nack's RetryAt")
			require.Equal(t, first.RetryAt, again.RetryAt,
				"RetryAt is when it becomes ready again, and a repeated nack returns what the first returned")
		})
	})
}
