package runqueue_test

// Review s28w: DEBUG SLEEP longer than the lease while a handler that
// ignores its context runs longer than the lease (its lease kept by the
// heartbeat), and another Worker sweeps the shard.

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// TestS28WServerStallLongerThanLease: worker A's handler ignores its
// context and takes 3 s (lease 1 s, extended by heartbeats); the server
// stalls 2 s (DEBUG SLEEP) 400 ms in. A's extension sent before the stall
// runs after it, with a deadline already past, so worker B's sweep may
// recover the run and B run it again (at least once: allowed). Expected
// whatever the interleaving: A's handler context is cancelled if the run
// was recovered, exactly one result is acked, the other (if any) is
// reported lease_lost, and nothing is left queued or in flight. The run
// may come back to A (at least once): the handler closed startedA on every
// delivery and panicked on a second (helper-135 met it with a first
// version of the lease's expiry timer, which stopped extending the run).
// Its later deliveries return at once, as B's.
func TestS28WServerStallLongerThanLease(t *testing.T) {
	s17Flags(t, func(t *testing.T, on bool) {
		srv := s17Spawn(t)
		admin := srv.admin()
		mk := func() (*redis.Client, *s28wRecorder) {
			c := redis.NewClient(&redis.Options{Addr: srv.addr, ReadTimeout: 5 * time.Second})
			t.Cleanup(func() { _ = c.Close() })
			return c, &s28wRecorder{}
		}
		cA, oA := mk()
		cB, oB := mk()
		bA := setup(t, cA, func(cfg *runqueue.Config) {
			cfg.VtimeScheduling, cfg.Clock, cfg.LeaseDuration, cfg.Observer = on, nil, time.Second, oA
		})
		qB, err := runqueue.New(bA.ctx, cB, &runqueue.Config{Prefix: bA.prefix, VtimeScheduling: on,
			LeaseDuration: time.Second, Observer: oB})
		require.NoError(t, err)
		t.Cleanup(func() { _ = qB.Close() })

		var mu sync.Mutex
		var deliveries []string
		var aCancelled bool
		startedA := make(chan struct{})
		// A may take the run again once it is recovered (at least once):
		// only its first delivery is the slow one.
		wA := startWorker(t, bA.q, func(hctx context.Context, r *runqueue.Run) error {
			mu.Lock()
			deliveries = append(deliveries, "A")
			first := len(deliveries) == 1
			mu.Unlock()
			if !first {
				return nil
			}
			close(startedA)
			time.Sleep(3 * time.Second)
			mu.Lock()
			aCancelled = hctx.Err() != nil
			mu.Unlock()
			return nil
		}, nil)
		enqueue(t, bA, runqueue.EnqueueParams{ID: "r", Payload: []byte("r")})
		waitClosed(t, startedA)
		wB := startWorker(t, qB, func(hctx context.Context, r *runqueue.Run) error {
			mu.Lock()
			deliveries = append(deliveries, "B")
			mu.Unlock()
			return nil
		}, func(wc *runqueue.WorkerConfig) { wc.SweepInterval = 100 * time.Millisecond })
		time.Sleep(400 * time.Millisecond)
		require.NoError(t, admin.Do(bA.ctx, "DEBUG", "SLEEP", "2").Err())
		time.Sleep(3500 * time.Millisecond) // A's handler returns meanwhile
		shutdown(t, wA)
		shutdown(t, wB)
		mu.Lock()
		defer mu.Unlock()
		outs := append(oA.get(), oB.get()...)
		t.Logf("flag=%v: deliveries %v, A's context cancelled %v, outcomes A %v B %v", on, deliveries, aCancelled, oA.get(), oB.get())
		acks := 0
		for _, o := range outs {
			if o == runqueue.OutcomeAck {
				acks++
			} else {
				require.Equal(t, runqueue.OutcomeLeaseLost, o)
			}
		}
		require.Equal(t, 1, acks, "exactly one result acked")
		require.Len(t, outs, len(deliveries))
		if len(deliveries) > 1 {
			require.True(t, aCancelled, "A ran on after its run was recovered, without its context ending")
		}
		require.Equal(t, runqueue.Stats{}, queueStats(t, bA, queueName))
	})
}
