package runqueue_test

// Review s16c: 0931935 (lease recovery and redrive write the last settled
// token 0): a retried nack across the run's later states, both flags.

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

func s16cNackStates(t *testing.T, fn func(t *testing.T, b *testBundle)) {
	s16bBackends(t, func(t *testing.T, c redis.UniversalClient) {
		for _, on := range []bool{false, true} {
			t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
				fn(t, setup(t, c, func(cfg *runqueue.Config) {
					cfg.VtimeScheduling = on
					cfg.LeaseDuration = 10 * time.Second
					cfg.MaxAttempts = 2
				}))
			})
		}
	})
}

func TestS16CNackRetryStates(t *testing.T) {
	t.Run("RedeliveredAckedReenqueued", func(t *testing.T) {
		s16cNackStates(t, func(t *testing.T, b *testBundle) {
			enqueue(t, b, runqueue.EnqueueParams{ID: "r", TTL: 5 * time.Second})
			cur := dequeue(t, b, queueName, 1)[0]
			first, err := b.q.Nack(b.ctx, cur, &runqueue.NackOptions{RetryAt: b.clock.Now()})
			require.NoError(t, err)
			require.True(t, first.Requeued)
			again, err := b.q.Nack(b.ctx, cur, &runqueue.NackOptions{RetryAt: b.clock.Now()})
			require.NoError(t, err)
			require.Equal(t, first, again)
			// TTL passes while it waits: a delivered run has no deadline.
			b.clock.Advance(6 * time.Second)
			_, err = b.q.ExpireTTL(b.ctx, b.q.ShardOf(env), 100)
			require.NoError(t, err)
			again, err = b.q.Nack(b.ctx, cur, &runqueue.NackOptions{RetryAt: b.clock.Now()})
			require.NoError(t, err, "after the TTL passed")
			require.Equal(t, first.Requeued, again.Requeued)
			require.Equal(t, first.Attempt, again.Attempt)
			next := dequeue(t, b, queueName, 1)[0]
			_, err = b.q.Nack(b.ctx, cur, nil)
			require.ErrorIs(t, err, runqueue.ErrLeaseLost, "%v", err)
			require.NoError(t, b.q.Ack(b.ctx, next))
			_, err = b.q.Nack(b.ctx, cur, nil)
			require.Error(t, err, "after the ack")
			t.Logf("after ack: %v", err)
			enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
			_, err = b.q.Nack(b.ctx, cur, nil)
			require.True(t, errors.Is(err, runqueue.ErrNotInFlight) || errors.Is(err, runqueue.ErrNotFound), "after a new enqueue: %v", err)
			s := queueStats(t, b, queueName)
			require.Equal(t, int64(1), s.Ready, "%+v", s)
		})
	})
	t.Run("MaxAttemptsRedriveAgain", func(t *testing.T) {
		s16cNackStates(t, func(t *testing.T, b *testBundle) {
			shard := b.q.ShardOf(env)
			enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
			t1 := dequeue(t, b, queueName, 1)[0]
			_, err := b.q.Nack(b.ctx, t1, &runqueue.NackOptions{RetryAt: b.clock.Now()})
			require.NoError(t, err)
			t2 := dequeue(t, b, queueName, 1)[0]
			d, err := b.q.Nack(b.ctx, t2, &runqueue.NackOptions{RetryAt: b.clock.Now()})
			require.NoError(t, err)
			require.False(t, d.Requeued, "max attempts")
			again, err := b.q.Nack(b.ctx, t2, nil)
			require.NoError(t, err)
			require.Equal(t, d, again)
			_, err = b.q.Nack(b.ctx, t1, nil)
			require.ErrorIs(t, err, runqueue.ErrNotInFlight)
			require.NoError(t, b.q.Redrive(b.ctx, env, queueName, "", "r"))
			_, err = b.q.Nack(b.ctx, t2, nil)
			require.ErrorIs(t, err, runqueue.ErrNotInFlight, "after redrive")
			t3 := dequeue(t, b, queueName, 1)[0]
			require.Equal(t, 1, t3.Attempt)
			_, err = b.q.Nack(b.ctx, t2, nil)
			require.ErrorIs(t, err, runqueue.ErrLeaseLost)
			// t3's lease passes: recovery requeues (attempt 2); t3's late nack
			// and t2's retry are both not in flight.
			b.clock.Advance(11 * time.Second)
			n, err := b.q.RecoverLeases(b.ctx, shard, 100)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			for _, r := range []*runqueue.Run{t2, t3} {
				_, err = b.q.Nack(b.ctx, r, nil)
				require.ErrorIs(t, err, runqueue.ErrNotInFlight)
			}
			t4 := dequeue(t, b, queueName, 1)[0]
			res, err := b.q.Nack(b.ctx, t4, &runqueue.NackOptions{DeadLetter: true})
			require.NoError(t, err)
			require.False(t, res.Requeued)
			for _, r := range []*runqueue.Run{t1, t2, t3} {
				_, err = b.q.Nack(b.ctx, r, nil)
				require.ErrorIs(t, err, runqueue.ErrNotInFlight)
			}
			again, err = b.q.Nack(b.ctx, t4, nil)
			require.NoError(t, err)
			require.Equal(t, res, again)
			s := queueStats(t, b, queueName)
			require.Equal(t, int64(1), s.Dead, "%+v", s)
			require.Zero(t, s.Ready+s.InFlight)
		})
	})
}
