package runqueue_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

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
			_, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{RetryAt: time.Now().Add(time.Hour)})
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
