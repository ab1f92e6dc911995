package runqueue_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// ackNackCases: Ack, AckMany, Nack, retries and dead-lettering.
func ackNackCases() []conformanceCase {
	return []conformanceCase{
		{name: "AckRemovesEverything", fn: func(t *testing.T, b *testBundle) {
			// Every kind of queued run: keys, none, priority, delayed, TTL,
			// and one that went through a nack.
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "1", Payload: []byte("x")})
			enqueue(t, b, runqueue.EnqueueParams{ID: "2", Priority: 3, TTL: time.Hour})
			enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: "3", Delay: time.Second})
			enqueue(t, b, runqueue.EnqueueParams{Queue: "q2", Key: "b", ID: "4"})
			runs := dequeue(t, b, queueName, 10)
			require.Len(t, runs, 2)
			_, err := b.q.Nack(b.ctx, runs[0], &runqueue.NackOptions{RetryAt: b.clock.Now()})
			require.NoError(t, err)
			ackAll(t, b, runs[1:])
			b.clock.Advance(time.Second)
			runs = dequeue(t, b, queueName, 10)
			require.Len(t, runs, 2)
			ackAll(t, b, runs)
			runs = dequeue(t, b, "q2", 10)
			require.Len(t, runs, 1)
			ackAll(t, b, runs)

			require.Equal(t, runqueue.Stats{}, queueStats(t, b, queueName))
			require.Equal(t, runqueue.Stats{}, queueStats(t, b, "q2"))
			require.Empty(t, b.keysUnder(t), "after the last ack no key of the queue is left")
		}},
		{name: "NackRetryAt", fn: func(t *testing.T, b *testBundle) {
			enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "r", Payload: []byte{1, 0, 2}, Priority: 2})
			r := dequeue(t, b, queueName, 1)[0]
			at := b.clock.Now().Add(time.Minute)
			res, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{RetryAt: at})
			require.NoError(t, err)
			require.Equal(t, runqueue.NackResult{Requeued: true, Attempt: 2, RetryAt: time.UnixMilli(at.UnixMilli())}, res)
			require.Equal(t, runqueue.Stats{Delayed: 1}, queueStats(t, b, queueName))

			b.clock.Advance(time.Minute - time.Millisecond)
			require.Empty(t, dequeue(t, b, queueName, 10), "invisible until its retry time")
			b.clock.Advance(time.Millisecond)
			again := dequeue(t, b, queueName, 10)
			require.Len(t, again, 1)
			require.Equal(t, 2, again[0].Attempt)
			require.Equal(t, []byte{1, 0, 2}, again[0].Payload)
			require.Equal(t, "k", again[0].Key)
			require.Greater(t, again[0].Token, r.Token)

			// A retry time in the past is ready at once, and as old as it says.
			res, err = b.q.Nack(b.ctx, again[0], &runqueue.NackOptions{RetryAt: b.clock.Now().Add(-time.Hour)})
			require.NoError(t, err)
			require.True(t, res.Requeued)
			require.Equal(t, 3, res.Attempt)
			require.Equal(t, runqueue.Stats{Ready: 1, OldestReadyAge: time.Hour}, queueStats(t, b, queueName))
			third := dequeue(t, b, queueName, 10)
			require.Len(t, third, 1)
			require.Equal(t, 3, third[0].Attempt)
		}},
		{name: "NackDefaultBackoff", mutate: func(c *runqueue.Config) {
			c.BackoffBase, c.BackoffMax, c.BackoffJitter = time.Second, 3*time.Second, 0.1
		}, fn: func(t *testing.T, b *testBundle) {
			enqueue(t, b, runqueue.EnqueueParams{ID: "r", Payload: []byte("p")})
			// Attempt n waits Base*2^(n-1), at most Max, within the jitter.
			want := []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second}
			for i, base := range want {
				runs := dequeue(t, b, queueName, 1)
				require.Len(t, runs, 1, "delivery %d", i+1)
				require.Equal(t, i+1, runs[0].Attempt)
				require.Equal(t, []byte("p"), runs[0].Payload)
				now := b.clock.Now()
				res, err := b.q.Nack(b.ctx, runs[0], nil)
				require.NoError(t, err)
				require.True(t, res.Requeued)
				require.Equal(t, i+2, res.Attempt)
				wait := res.RetryAt.Sub(now)
				require.GreaterOrEqual(t, wait, time.Duration(float64(base)*0.9)-time.Millisecond, "attempt %d", i+1)
				require.LessOrEqual(t, wait, time.Duration(float64(base)*1.1)+time.Millisecond, "attempt %d", i+1)
				b.clock.Advance(wait - time.Millisecond)
				require.Empty(t, dequeue(t, b, queueName, 1), "not before its retry time")
				b.clock.Advance(time.Millisecond)
			}
			require.Equal(t, 5, dequeue(t, b, queueName, 1)[0].Attempt)
		}},
		{name: "MaxAttemptsDeadLetterAndRedrive", mutate: func(c *runqueue.Config) { c.MaxAttempts = 2 }, fn: func(t *testing.T, b *testBundle) {
			payload := []byte{0, 'd', 0xff}
			enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "r", Payload: payload, Priority: 4, TTL: time.Hour})
			r := dequeue(t, b, queueName, 1)[0]
			res, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{RetryAt: b.clock.Now()})
			require.NoError(t, err)
			require.Equal(t, runqueue.NackResult{Requeued: true, Attempt: 2, RetryAt: time.UnixMilli(b.clock.Now().UnixMilli())}, res)
			r = dequeue(t, b, queueName, 1)[0]
			require.Equal(t, 2, r.Attempt)
			b.clock.Advance(time.Second)
			res, err = b.q.Nack(b.ctx, r, &runqueue.NackOptions{RetryAt: b.clock.Now()})
			require.NoError(t, err)
			require.Equal(t, runqueue.NackResult{Requeued: false, Attempt: 3}, res, "no attempts left: dead-lettered")

			died := time.UnixMilli(b.clock.Now().UnixMilli())
			want := runqueue.DeadRun{Env: env, Queue: queueName, Key: "k", ID: "r", Payload: payload, Attempt: 3, Priority: 4, DiedAt: died}
			dead, err := b.q.DeadLetters(b.ctx, env, queueName, 0, 10)
			require.NoError(t, err)
			require.Equal(t, []runqueue.DeadRun{want}, dead)
			one, err := b.q.DeadLetter(b.ctx, env, queueName, "k", "r")
			require.NoError(t, err)
			require.Equal(t, want, one)
			require.Equal(t, runqueue.Stats{Dead: 1}, queueStats(t, b, queueName))
			require.Empty(t, dequeue(t, b, queueName, 10))
			require.ErrorIs(t, b.q.Ack(b.ctx, r), runqueue.ErrNotInFlight, "a dead run cannot be acked")
			// The dead run still holds its id.
			_, err = b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: "k", ID: "r", Payload: []byte("new")})
			require.ErrorIs(t, err, runqueue.ErrConflict)

			require.ErrorIs(t, b.q.Redrive(b.ctx, env, queueName, "other", "r"), runqueue.ErrNotFound)
			require.ErrorIs(t, b.q.Redrive(b.ctx, env, queueName, "k", "nope"), runqueue.ErrNotFound)
			b.clock.Advance(time.Second)
			require.NoError(t, b.q.Redrive(b.ctx, env, queueName, "k", "r"))
			// A retried redrive (the first reply lost) finds the run live: it
			// succeeds and changes nothing.
			before := b.dump(t)
			require.NoError(t, b.q.Redrive(b.ctx, env, queueName, "k", "r"))
			require.Equal(t, before, b.dump(t))
			require.Equal(t, runqueue.Stats{Ready: 1}, queueStats(t, b, queueName))
			_, err = b.q.DeadLetter(b.ctx, env, queueName, "k", "r")
			require.ErrorIs(t, err, runqueue.ErrNotFound)
			dead, err = b.q.DeadLetters(b.ctx, env, queueName, 0, 10)
			require.NoError(t, err)
			require.Empty(t, dead)

			r2 := dequeue(t, b, queueName, 1)
			require.Len(t, r2, 1)
			require.Equal(t, 1, r2[0].Attempt, "redrive resets the attempts")
			require.Equal(t, payload, r2[0].Payload)
			require.Greater(t, r2[0].Token, r.Token)
			require.ErrorIs(t, b.q.Ack(b.ctx, r), runqueue.ErrLeaseLost, "the pre-death holder stays lost")
			require.NoError(t, b.q.Ack(b.ctx, r2[0]))
			require.Empty(t, b.keysUnder(t))
		}},
		{name: "DeadLettersPaging", mutate: func(c *runqueue.Config) { c.MaxAttempts = 1 }, fn: func(t *testing.T, b *testBundle) {
			for _, id := range []string{"a", "b", "c"} {
				enqueue(t, b, runqueue.EnqueueParams{ID: id})
			}
			for range 3 {
				r := dequeue(t, b, queueName, 1)[0]
				b.clock.Advance(time.Second)
				res, err := b.q.Nack(b.ctx, r, nil)
				require.NoError(t, err)
				require.False(t, res.Requeued)
			}
			page := func(off, n int) []string {
				d, err := b.q.DeadLetters(b.ctx, env, queueName, off, n)
				require.NoError(t, err)
				var ids []string
				for _, x := range d {
					ids = append(ids, x.ID)
				}
				return ids
			}
			require.Equal(t, []string{"a", "b", "c"}, page(0, 10), "oldest death first")
			require.Equal(t, []string{"b"}, page(1, 1))
			require.Empty(t, page(3, 10))
		}},
		{name: "NackDeadLetterOption", fn: func(t *testing.T, b *testBundle) {
			enqueue(t, b, runqueue.EnqueueParams{ID: "r", Payload: []byte("p")})
			r := dequeue(t, b, queueName, 1)[0]
			res, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{DeadLetter: true, RetryAt: b.clock.Now()})
			require.NoError(t, err)
			require.Equal(t, runqueue.NackResult{Requeued: false, Attempt: 2}, res)
			require.Equal(t, runqueue.Stats{Dead: 1}, queueStats(t, b, queueName))
			d, err := b.q.DeadLetter(b.ctx, env, queueName, "", "r")
			require.NoError(t, err)
			require.Equal(t, []byte("p"), d.Payload)
			require.Equal(t, 2, d.Attempt)
			require.Empty(t, dequeue(t, b, queueName, 10))
		}},
		{name: "UnlimitedAttempts", mutate: func(c *runqueue.Config) { c.MaxAttempts = -1 }, fn: func(t *testing.T, b *testBundle) {
			enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
			for i := 1; i <= 12; i++ {
				r := dequeue(t, b, queueName, 1)
				require.Len(t, r, 1)
				require.Equal(t, i, r[0].Attempt)
				res, err := b.q.Nack(b.ctx, r[0], &runqueue.NackOptions{RetryAt: b.clock.Now()})
				require.NoError(t, err)
				require.True(t, res.Requeued)
			}
		}},
	}
}
