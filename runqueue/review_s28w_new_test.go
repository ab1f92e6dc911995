package runqueue_test

// Review s28w: opening a Queue (New) on a real redis-server at maxmemory.

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// TestS28WNewOnFullRedis: a deployment runs on a Redis that fills up
// (maxmemory, noeviction); an instance restarts, or scales out, or an
// operator's tool opens the queues, while it is full. The docs say a full
// Redis still settles runs (acks, nacks, sweeps, redrive carry allow-oom)
// and that a refused FUNCTION LOAD leaves the calls to EVALSHA; New itself
// writes nothing the full server needs (the layout version is there, the
// library too). Expected: New succeeds in both flag states, and the new
// instance can settle (Redrive, Ack) on the full Redis.
//
// Fixed (CHANGES/2026-12-04-full-redis.md); it failed (flag on; every run): New fails with "OOM command not allowed
// when used memory > 'maxmemory'". scriptSet.load (runqueue/scripts.go,
// `switch err := s.lib.load(ctx, c); { ... case err != nil: return err }`)
// returns the OOM refusal of FUNCTION LOAD (Redis refuses that deny-oom
// command on a full server even when the library already exists), though
// library.load returns it precisely so that "this call falls back; the
// next tries again" (runqueue/library.go, comment of load). So on a full
// Redis no flag-on process can start: a Worker restarted then crash-loops,
// and the CLI's writes with -vtime (dead purge, dead delete, redrive: the
// ways to free memory) all fail (internal/cli TestS28WCLIOnFullRedis).
func TestS28WNewOnFullRedis(t *testing.T) {
	s17Flags(t, func(t *testing.T, on bool) {
		srv := s17Spawn(t)
		admin := srv.admin()
		b := setup(t, srv.admin(), func(cfg *runqueue.Config) { cfg.VtimeScheduling = on; cfg.MaxAttempts = 1 })
		ctx := b.ctx
		for i := range 3 {
			enqueue(t, b, runqueue.EnqueueParams{ID: fmt.Sprint(i), Payload: []byte("x")})
		}
		runs := dequeue(t, b, queueName, 3)
		require.Len(t, runs, 3)
		nr, err := b.q.Nack(ctx, runs[0], &runqueue.NackOptions{DeadLetter: true})
		require.NoError(t, err)
		require.False(t, nr.Requeued)
		require.NoError(t, admin.ConfigSet(ctx, "maxmemory", "1").Err())
		t.Cleanup(func() { _ = admin.ConfigSet(context.Background(), "maxmemory", "0").Err() })

		q2, err := runqueue.New(ctx, srv.admin(), &runqueue.Config{Prefix: b.prefix, VtimeScheduling: on})
		require.NoError(t, err, "New on a full Redis")
		t.Cleanup(func() { _ = q2.Close() })
		require.NoError(t, q2.Ack(ctx, runs[1]), "an ack on a full Redis")
		require.NoError(t, q2.Redrive(ctx, env, queueName, "", runs[0].ID), "a redrive on a full Redis")
		st, err := q2.QueueStats(ctx, env, queueName)
		require.NoError(t, err)
		require.Equal(t, runqueue.Stats{Ready: 1, InFlight: 1, OldestReadyAge: st.OldestReadyAge}, st)
	})
}
