package runqueue_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// errorCases: invalid input and the typed errors.
func errorCases() []conformanceCase {
	return []conformanceCase{
		{name: "UnknownRun", fn: func(t *testing.T, b *testBundle) {
			enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "r"})
			before := b.dump(t)
			ghost := &runqueue.Run{Env: env, Queue: queueName, Key: "k", ID: "ghost", Token: 1}
			// Ack is idempotent: a run that is gone is done.
			require.NoError(t, b.q.Ack(b.ctx, ghost))
			_, err := b.q.Nack(b.ctx, ghost, nil)
			require.ErrorIs(t, err, runqueue.ErrNotFound)
			require.ErrorIs(t, b.q.ExtendLease(b.ctx, ghost, time.Minute), runqueue.ErrNotFound)
			_, err = b.q.DeadLetter(b.ctx, env, queueName, "k", "ghost")
			require.ErrorIs(t, err, runqueue.ErrNotFound)
			// A queued run is not in flight.
			queued := &runqueue.Run{Env: env, Queue: queueName, Key: "k", ID: "r", Token: 1}
			require.ErrorIs(t, b.q.Ack(b.ctx, queued), runqueue.ErrNotInFlight)
			require.Equal(t, before, b.dump(t), "failed calls write nothing")
		}},
		{name: "AckTwice", fn: func(t *testing.T, b *testBundle) {
			// The first ack removes the run; the second (go-redis retrying a
			// call whose reply was lost looks the same) succeeds and writes
			// nothing, while a nack of the gone run is ErrNotFound.
			enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
			r := dequeue(t, b, queueName, 1)[0]
			require.NoError(t, b.q.Ack(b.ctx, r))
			before := b.dump(t)
			require.NoError(t, b.q.Ack(b.ctx, r))
			require.Equal(t, before, b.dump(t))
			_, err := b.q.Nack(b.ctx, r, nil)
			require.ErrorIs(t, err, runqueue.ErrNotFound)
		}},
		{name: "NackRetried", fn: func(t *testing.T, b *testBundle) {
			// A nack whose reply was lost and that is sent again returns what
			// the first returned, and changes nothing more.
			enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
			r := dequeue(t, b, queueName, 1)[0]
			first, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{RetryAt: b.clock.Now().Add(time.Minute)})
			require.NoError(t, err)
			before := b.dump(t)
			again, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{RetryAt: b.clock.Now().Add(time.Minute)})
			require.NoError(t, err)
			require.Equal(t, first, again)
			require.Equal(t, before, b.dump(t))
			// Once delivered again, the old holder's nack is ErrLeaseLost.
			b.clock.Advance(2 * time.Minute)
			r2 := dequeue(t, b, queueName, 1)[0]
			_, err = b.q.Nack(b.ctx, r, nil)
			require.ErrorIs(t, err, runqueue.ErrLeaseLost)
			require.NoError(t, b.q.Ack(b.ctx, r2))
		}},
		{name: "WrongKey", fn: func(t *testing.T, b *testBundle) {
			enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "r"})
			r := dequeue(t, b, queueName, 1)[0]
			before := b.dump(t)
			for _, key := range []string{"other", ""} {
				wrong := *r
				wrong.Key = key
				require.ErrorIs(t, b.q.Ack(b.ctx, &wrong), runqueue.ErrNotFound, "ack under key %q", key)
				_, err := b.q.Nack(b.ctx, &wrong, nil)
				require.ErrorIs(t, err, runqueue.ErrNotFound, "nack under key %q", key)
				require.ErrorIs(t, b.q.ExtendLease(b.ctx, &wrong, time.Minute), runqueue.ErrNotFound, "extend under key %q", key)
			}
			wrongQueue := *r
			wrongQueue.Queue = "q2"
			require.NoError(t, b.q.Ack(b.ctx, &wrongQueue), "no such run in q2: nothing to do")
			require.Equal(t, before, b.dump(t), "failed calls write nothing")
			require.NoError(t, b.q.Ack(b.ctx, r))
		}},
	}
}
