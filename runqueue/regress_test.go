package runqueue_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// TestReusedIDTokensDiffer: a holder whose lease was recovered must not be
// able to ack a later run that reuses the id.
func TestReusedIDTokensDiffer(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, func(cfg *runqueue.Config) { cfg.LeaseDuration = time.Minute })
		enq := func() {
			_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "daily"})
			require.NoError(t, err)
		}
		deq := func() *runqueue.Run {
			runs, err := b.q.Dequeue(b.ctx, "e", "q", 1)
			require.NoError(t, err)
			require.Len(t, runs, 1)
			return runs[0]
		}
		enq()
		a := deq()
		b.clock.Advance(2 * time.Minute)
		n, err := b.q.RecoverLeases(b.ctx, b.q.ShardOf("e"), 10)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		second := deq()
		require.NoError(t, b.q.Ack(b.ctx, second))
		b.clock.Advance(time.Millisecond)
		enq()
		third := deq()
		require.NotEqual(t, a.Token, third.Token)
		err = b.q.Ack(b.ctx, a)
		require.True(t, errors.Is(err, runqueue.ErrLeaseLost), "stale holder's ack: %v", err)
		require.NoError(t, b.q.Ack(b.ctx, third))
	})
}

// TestDequeueShardReachesEnvBehindManyQueues: an env whose one queue sorts
// behind more queues of another env than one read covers is still served
// within a few calls.
func TestDequeueShardReachesEnvBehindManyQueues(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, nil)
		big, small := sameShardEnvs(t, b.q)
		old := b.clock.Now().Add(-time.Hour)
		for i := 0; i < 150; i++ {
			for j := 0; j < 2; j++ {
				_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: big, Queue: fmt.Sprintf("q%03d", i),
					ID: fmt.Sprint(j), AvailableAt: old})
				require.NoError(t, err)
			}
		}
		_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: small, Queue: "only", ID: "x"})
		require.NoError(t, err)
		for call := 1; call <= 4; call++ {
			runs, err := b.q.DequeueShard(b.ctx, b.q.ShardOf(small), 2)
			require.NoError(t, err)
			for _, r := range runs {
				if r.Env == small {
					t.Logf("small env served at call %d", call)
					return
				}
			}
		}
		t.Fatal("the small env was not served within 4 calls")
	})
}

// TestEnvStatsCountsQueuesWithOnlyDeadRuns: EnvStats.Dead includes queues
// that hold nothing but dead-lettered runs, and redrive takes them off.
func TestEnvStatsCountsQueuesWithOnlyDeadRuns(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, nil)
		for _, queue := range []string{"a", "b"} {
			_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: "e", Queue: queue, ID: "1"})
			require.NoError(t, err)
			runs, err := b.q.Dequeue(b.ctx, "e", queue, 1)
			require.NoError(t, err)
			_, err = b.q.Nack(b.ctx, runs[0], &runqueue.NackOptions{DeadLetter: true})
			require.NoError(t, err)
		}
		s, err := b.q.EnvStats(b.ctx, "e")
		require.NoError(t, err)
		require.Equal(t, runqueue.Stats{Dead: 2}, s)
		require.NoError(t, b.q.Redrive(b.ctx, "e", "a", "", "1"))
		s, err = b.q.EnvStats(b.ctx, "e")
		require.NoError(t, err)
		require.Equal(t, int64(1), s.Dead)
		require.Equal(t, int64(1), s.Ready)
	})
}

// TestNoJitterWithNegativeBackoffJitter: a negative jitter gives the exact
// exponential backoff.
func TestNoJitterWithNegativeBackoffJitter(t *testing.T) {
	t.Parallel()
	b := setup(t, backends[0].Client(t), func(cfg *runqueue.Config) { cfg.BackoffJitter = -1 })
	require.Equal(t, 4*time.Second, b.q.Backoff(3))
	require.Equal(t, 10*time.Minute, b.q.Backoff(40))
}

// A stale delivery's ack and the current holder's ack of one run in one
// call (as coalesced Acks of two workers are, when the first's lease passed
// and the run went to the second): the current one acks the run, whatever
// the order, and the stale one fails alone or finds the run gone.
func TestAckManyStaleAndCurrentDelivery(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		for _, tc := range []struct {
			name      string
			staleLast bool
			fused     bool // AckAndDequeue rather than AckMany
		}{{"StaleFirst", false, false}, {"StaleLast", true, false}, {"FusedStaleFirst", false, true}} {
			t.Run(tc.name, func(t *testing.T) {
				b := setup(t, c, func(cfg *runqueue.Config) { cfg.LeaseDuration = 10 * time.Second })
				old, cur := redelivered(t, b, "k", "r")

				acks := []*runqueue.Run{old, cur}
				if tc.staleLast {
					acks = []*runqueue.Run{cur, old}
				}
				var errs []error
				var err error
				if tc.fused {
					var runs []*runqueue.Run
					runs, errs, err = b.q.AckAndDequeue(b.ctx, acks, env, queueName, 10)
					require.Empty(t, runs)
				} else {
					errs, err = b.q.AckMany(b.ctx, acks)
				}
				require.NoError(t, err)
				if tc.staleLast {
					require.NoError(t, errs[0], "the holder's ack")
					require.NoError(t, errs[1], "acked in this call: gone already")
				} else {
					require.ErrorIs(t, errs[0], runqueue.ErrLeaseLost)
					require.NoError(t, errs[1], "the holder's ack")
				}
				require.Equal(t, runqueue.Stats{}, queueStats(t, b, queueName), "the run is gone")
				b.clock.Advance(time.Minute)
				n, err := b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 100)
				require.NoError(t, err)
				require.Zero(t, n, "no lease left to recover")
			})
		}
	})
}

// redelivered enqueues run id of key, dequeues it, lets its lease pass
// (b.cfg.LeaseDuration), recovers it and dequeues it again: old is the
// first delivery, cur the second.
func redelivered(t *testing.T, b *testBundle, key, id string) (old, cur *runqueue.Run) {
	t.Helper()
	enqueue(t, b, runqueue.EnqueueParams{Key: key, ID: id})
	old = dequeue(t, b, queueName, 1)[0]
	b.clock.Advance(b.cfg.LeaseDuration)
	n, err := b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 100)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	cur = dequeue(t, b, queueName, 1)[0]
	require.Greater(t, cur.Token, old.Token)
	return old, cur
}
