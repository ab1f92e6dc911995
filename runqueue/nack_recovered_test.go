package runqueue_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// A holder's nack that arrives after its lease was recovered settles
// nothing and says so: ErrNotInFlight while the run waits to be delivered
// again (ErrLeaseLost once it is), not the {Requeued, Attempt} a retried
// nack finds when its first call went through. Before, the recovery wrote
// the holder's token as the run's last settled token, so the late nack was
// taken for such a retry and reported success (a Worker then reported
// OutcomeRetry or OutcomeDead, and counted a nack, for a run it no longer
// held). A nack that did go through still answers its retry the same
// while the run waits for its next delivery; once a later stay ended (a
// recovery), the retry is ErrNotInFlight, not an answer from that stay.
func TestNackAfterLeaseRecovery(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		for _, on := range []bool{false, true} {
			for _, dead := range []bool{false, true} {
				t.Run(fmt.Sprintf("on=%v/dead=%v", on, dead), func(t *testing.T) {
					b := setup(t, c, func(cfg *runqueue.Config) {
						cfg.VtimeScheduling = on
						cfg.LeaseDuration = 10 * time.Second
						if dead {
							cfg.MaxAttempts = 1 // the recovery dead-letters it
						}
					})
					shard := b.q.ShardOf(env)
					enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "r"})
					old := dequeue(t, b, queueName, 1)[0]
					b.clock.Advance(11 * time.Second)
					n, err := b.q.RecoverLeases(b.ctx, shard, 100)
					require.NoError(t, err)
					require.Equal(t, 1, n)
					before := queueStats(t, b, queueName)
					for _, kill := range []bool{false, true} {
						_, err = b.q.Nack(b.ctx, old, &runqueue.NackOptions{DeadLetter: kill})
						require.ErrorIs(t, err, runqueue.ErrNotInFlight, "the late nack settled nothing (dead letter %v)", kill)
					}
					require.Equal(t, before, queueStats(t, b, queueName), "and changed nothing")
					if dead {
						return
					}
					// Delivered again: the late nack is the lease lost.
					cur := dequeue(t, b, queueName, 1)[0]
					require.NotEqual(t, old.Token, cur.Token)
					_, err = b.q.Nack(b.ctx, old, nil)
					require.ErrorIs(t, err, runqueue.ErrLeaseLost)
					// The current holder's nack goes through; its retry gets
					// the same answer, also once a later delivery's lease was
					// recovered.
					res, err := b.q.Nack(b.ctx, cur, &runqueue.NackOptions{RetryAt: b.clock.Now()})
					require.NoError(t, err)
					require.True(t, res.Requeued)
					again, err := b.q.Nack(b.ctx, cur, &runqueue.NackOptions{RetryAt: b.clock.Now()})
					require.NoError(t, err)
					require.Equal(t, res.Requeued, again.Requeued)
					require.Equal(t, res.Attempt, again.Attempt)
					next := dequeue(t, b, queueName, 1)[0]
					b.clock.Advance(11 * time.Second)
					n, err = b.q.RecoverLeases(b.ctx, shard, 100)
					require.NoError(t, err)
					require.Equal(t, 1, n)
					// A stay later: the old nack's retry is not answered from
					// it (it would say what the recovery did, not the nack).
					_, err = b.q.Nack(b.ctx, cur, &runqueue.NackOptions{RetryAt: b.clock.Now()})
					require.ErrorIs(t, err, runqueue.ErrNotInFlight, "a retry of a nack that settled an earlier stay")
					_, err = b.q.Nack(b.ctx, next, nil)
					require.ErrorIs(t, err, runqueue.ErrNotInFlight, "the recovered holder's late nack")
				})
			}
		}
	})
}
