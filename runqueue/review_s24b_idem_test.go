package runqueue_test

// Review s24b: Enqueue retried with the same id after the run left the
// ready state (dead-lettered, expired, deleted), on a full queue, through
// the coalesced and the bulk path; real Redis, both flag states.

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// TestS24BEnqueueRetryLaterStates.
//
// Contract (doc.go): "The id makes it idempotent: the same id with the
// same key and payload is a no-op that returns false, another body is
// ErrConflict"; Enqueue: "Nothing is written on error"; EnqueueMany:
// "Each run is all or nothing and idempotent as with Enqueue ... a run
// is idempotent on its id while it exists"; DeleteDeadLetter: "Its id is
// free again afterwards"; MaxQueueDepth/MaxKeyDepth "refuse runs past a
// depth ..., writing nothing" (a retry of a run already stored is not a
// new run past the depth).
func TestS24BEnqueueRetryLaterStates(t *testing.T) {
	s24bFlags(t, func(c *runqueue.Config) {
		c.MaxAttempts = 1
		c.MaxQueueDepth = 1
		c.MaxKeyDepth = 1
	}, func(t *testing.T, b *testBundle) {
		p := runqueue.EnqueueParams{Env: env, Queue: queueName, Key: "k", ID: "r", Payload: []byte("body"), TTL: time.Minute}
		other := p
		other.Payload = []byte("other")
		same := func(name string, p runqueue.EnqueueParams, wantErr error) {
			t.Helper()
			before := b.dump(t)
			ok, err := b.q.Enqueue(b.ctx, p)
			if wantErr == nil {
				require.NoError(t, err, name)
			} else {
				require.ErrorIs(t, err, wantErr, name)
			}
			require.False(t, ok, name)
			require.Equal(t, before, b.dump(t), "%s must write nothing", name)
			// The same through EnqueueMany on the bulk path (>= 32 runs
			// of one queue, only without admission limits: here the
			// per-run path) with 31 copies of the run.
			many := make([]runqueue.EnqueueParams, 32)
			for i := range many {
				many[i] = p
			}
			res, err := b.q.EnqueueMany(b.ctx, many)
			require.NoError(t, err, name)
			for i, r := range res {
				require.False(t, r.Queued, "%s: run %d", name, i)
				if wantErr == nil {
					require.NoError(t, r.Err, "%s: run %d", name, i)
				} else {
					require.ErrorIs(t, r.Err, wantErr, "%s: run %d", name, i)
				}
			}
			require.Equal(t, before, b.dump(t), "%s (EnqueueMany) must write nothing", name)
		}

		enqueue(t, b, p)
		// The queue is full now (depth 1): a retry is not a new run.
		same("QueuedFull", p, nil)
		same("QueuedFullOther", other, runqueue.ErrConflict)
		r := dequeue(t, b, queueName, 1)[0]
		res, err := b.q.Nack(b.ctx, r, nil) // MaxAttempts 1: dead-lettered
		require.NoError(t, err)
		require.False(t, res.Requeued)
		same("Dead", p, nil)
		same("DeadOther", other, runqueue.ErrConflict)
		// A dead run keeps its record past its TTL: still the same run.
		b.clock.Advance(2 * time.Minute)
		_, err = b.q.ExpireTTL(b.ctx, b.q.ShardOf(env), 100)
		require.NoError(t, err)
		same("DeadPastTTL", p, nil)
		require.NoError(t, b.q.DeleteDeadLetter(b.ctx, env, queueName, "k", "r"))
		enqueue(t, b, other) // "Its id is free again afterwards"
		// Expired: the id is free again.
		b.clock.Advance(2 * time.Minute)
		n, err := b.q.ExpireTTL(b.ctx, b.q.ShardOf(env), 100)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		enqueue(t, b, p)
		st := queueStats(t, b, queueName)
		require.Equal(t, runqueue.Stats{Ready: 1}, st, fmt.Sprintf("%+v", st))
	})
}
