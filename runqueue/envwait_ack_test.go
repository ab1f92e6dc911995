package runqueue_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// A flag-on ack or requeue that frees slots of an env with a limit wakes
// the queues of its env's waiting line the free slots go to
// (lib/hooks_vtime), as a dequeue of the env does. Before, a slot a plain
// Ack, AckMany or Nack freed stayed idle until the next dequeue of any
// queue of the env or the waiting queue's poll (30 s in ewSetup).

// TestEnvWaitingPlainReleaseWakes: env limit 1, a plain Dequeue of qa holds
// the slot, a Worker over qb waits (its mark in the line); qa's run is
// released by each way a caller outside a Worker releases one (a lease
// recovery too), and no
// other call of the env follows: qb's Worker is woken and served at once.
func TestEnvWaitingPlainReleaseWakes(t *testing.T) {
	t.Parallel()
	for name, release := range map[string]func(t *testing.T, b *testBundle, r *runqueue.Run){
		"ack": func(t *testing.T, b *testBundle, r *runqueue.Run) {
			require.NoError(t, b.q.Ack(b.ctx, r))
		},
		"ackmany": func(t *testing.T, b *testBundle, r *runqueue.Run) {
			errs, err := b.q.AckMany(b.ctx, []*runqueue.Run{r})
			require.NoError(t, err)
			require.NoError(t, errs[0])
		},
		"nack": func(t *testing.T, b *testBundle, r *runqueue.Run) {
			_, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{RetryAt: b.clock.Now().Add(time.Hour)})
			require.NoError(t, err)
		},
		"deadletter": func(t *testing.T, b *testBundle, r *runqueue.Run) {
			_, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{DeadLetter: true})
			require.NoError(t, err)
		},
		"recover": func(t *testing.T, b *testBundle, _ *runqueue.Run) {
			b.clock.Advance(6 * time.Minute) // (past the lease, 5 min)
			n, err := b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 10)
			require.NoError(t, err)
			require.Equal(t, 1, n)
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
				b, _ := ewSetup(t, c, true, 1)
				ewEnqueue(t, b, "qa", 1)
				ewEnqueue(t, b, "qb", 1)
				a := ewTake(t, b, nil, "qa")
				require.Len(t, a, 1)
				served := make(chan string, 1)
				startWorker(t, b.q, ewServed(served), ewOver("qb"))
				ewWaits(t, b, "qb")
				release(t, b, a[0])
				ewWithin(t, served, "qb after qa's slot was released")
			})
		})
	}
}

// TestEnvWaitingPlainAckWakesEach: env limit 2, both slots held by qa;
// qb is marked by a plain call (its caller does not wait: nobody hears a
// wake-up for qb), qc's Worker waits behind it. One AckMany frees both
// slots: one goes to qb's mark, the other to qc, whose Worker is woken for
// it (a wake-up for the first mark alone would leave qc to its poll: a
// woken consumer passes the slots it does not use on, qb's has none).
func TestEnvWaitingPlainAckWakesEach(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b, _ := ewSetup(t, c, true, 2)
		ewEnqueue(t, b, "qa", 2)
		ewEnqueue(t, b, "qb", 1)
		ewEnqueue(t, b, "qc", 1)
		a, _, err := b.q.AckAndDequeue(b.ctx, nil, env, "qa", 2)
		require.NoError(t, err)
		require.Len(t, a, 2)
		require.Empty(t, ewTake(t, b, nil, "qb"), "the env is full")
		require.True(t, ewMarked(t, b, "qb"), "qb's held call marks it")
		served := make(chan string, 1)
		startWorker(t, b.q, ewServed(served), ewOver("qc"))
		ewWaits(t, b, "qc")
		errs, err := b.q.AckMany(b.ctx, a)
		require.NoError(t, err)
		require.Equal(t, []error{nil, nil}, errs)
		ewWithin(t, served, "qc, second in line, for the second slot")
		require.True(t, ewMarked(t, b, "qb"), "qb keeps its mark (and the slot left to it)")
	})
}

// TestEnvWaitingReleaseReadsLimitsOnce: an Ack, an AckMany of one queue's
// runs and a Nack each ask Config.LimitsFor once (a user's function, said
// to be called at each dequeue): the release's script, its scheduler
// arguments and the env's line come from one read (helper-208: 4 reads an
// Ack, 2 a Nack).
func TestEnvWaitingReleaseReadsLimitsOnce(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		var calls atomic.Int64
		b := setup(t, c, func(cfg *runqueue.Config) {
			cfg.VtimeScheduling = true
			cfg.SerialCalls = true // (one call each, not coalesced)
			cfg.LimitsFor = func(string, string) runqueue.Limits {
				calls.Add(1)
				return runqueue.Limits{Env: 4, Key: 10}
			}
		})
		ewEnqueue(t, b, "qa", 4)
		runs, err := b.q.Dequeue(b.ctx, env, "qa", 4)
		require.NoError(t, err)
		require.Len(t, runs, 4)
		calls.Store(0)
		require.NoError(t, b.q.Ack(b.ctx, runs[0]))
		require.Equal(t, int64(1), calls.Swap(0), "Ack")
		errs, err := b.q.AckMany(b.ctx, runs[1:3])
		require.NoError(t, err)
		require.Equal(t, []error{nil, nil}, errs)
		require.Equal(t, int64(1), calls.Swap(0), "AckMany of one queue's runs")
		_, err = b.q.Nack(b.ctx, runs[3], &runqueue.NackOptions{RetryAt: b.clock.Now().Add(time.Hour)})
		require.NoError(t, err)
		require.Equal(t, int64(1), calls.Swap(0), "Nack")
	})
}

// TestEnvWaitingReleaseCorruptLife: a mark's life that does not read as a
// number (a hand edit of the line's hash) is a dead mark: the flag-on Ack,
// Nack and dequeue that read the line drop it and succeed (helper-208: each
// failed with a Lua error, the releases after their writes, until the
// line's keys expired).
func TestEnvWaitingReleaseCorruptLife(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b, _ := ewSetup(t, c, true, 1)
		for _, q := range []string{"qa", "qb", "qc", "qd"} {
			ewEnqueue(t, b, q, 1)
		}
		lives := ewSpace(t, b).Env(env).WaitingUntil()
		corrupt := func(queue string) {
			require.True(t, ewMarked(t, b, queue))
			require.NoError(t, c.HSet(b.ctx, lives, keys.QueueMember(env, queue), "x").Err())
		}
		a := ewTake(t, b, nil, "qa")
		require.Len(t, a, 1)
		require.Empty(t, ewTake(t, b, nil, "qb"))
		require.Empty(t, ewTake(t, b, nil, "qc"))
		corrupt("qb")
		require.NoError(t, b.q.Ack(b.ctx, a[0]))
		require.False(t, ewMarked(t, b, "qb"), "the Ack dropped the dead mark")
		cr := ewTake(t, b, nil, "qc")
		require.Len(t, cr, 1, "the slot was qc's")
		require.Empty(t, ewTake(t, b, nil, "qb"))
		corrupt("qb")
		_, err := b.q.Nack(b.ctx, cr[0], &runqueue.NackOptions{RetryAt: b.clock.Now().Add(time.Hour)})
		require.NoError(t, err)
		require.False(t, ewMarked(t, b, "qb"), "the Nack dropped the dead mark")
		br := ewTake(t, b, nil, "qb")
		require.Len(t, br, 1)
		require.Empty(t, ewTake(t, b, nil, "qd"))
		corrupt("qd")
		require.Empty(t, ewTake(t, b, br, "qb"), "the dequeue that acks qb's run reads the line")
		require.False(t, ewMarked(t, b, "qd"), "and drops the dead mark")
	})
}
