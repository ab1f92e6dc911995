package runqueue_test

// Review s28w: a handler longer than the lease (kept by the heartbeat)
// while the real redis-server is at maxmemory (noeviction).

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// TestS28WOOMLeaseExtension: a run's handler takes 2.5 s, longer than the
// 1 s lease, which the Worker's heartbeat extends; Redis reaches maxmemory
// as it starts (producers filled it). The docs promise that a full Redis
// still settles runs (acks, nacks, sweeps carry allow-oom); nothing says a
// full Redis takes running handlers' runs away. Expected: the handler runs
// to its end once, its context is never cancelled, the run is acked and
// delivered once.
//
// Fixed (CHANGES/2026-12-04-full-redis.md); it failed: the extension (extend.lua, run by EVALSHA in both flag states,
// a flagless script whose only write is ZADD XX, a command Redis refuses
// as deny-oom when full) fails with OOM at every beat; the heartbeat only
// logs it (Worker.heartbeat: "could not extend a lease"), the lease passes,
// the sweep (allow-oom) recovers the run while its handler runs, the
// next beat finds the lease lost and cancels the handler, and the run is
// requeued, attempt + 1, to be delivered again (observed in every run, both
// flag states: 3 extensions refused, the handler cancelled about 1 s in,
// the run requeued with attempt 2 and, in some runs, redelivered). Each
// round costs an attempt, so on a full Redis a run longer than its lease
// would end dead-lettered (MaxAttempts) though its handler never failed.
// Cause: runqueue/leases.go extendCall / lua/extend.lua, not among the
// allow-oom scripts (runqueue/library.go libraryScripts; flag off, a
// flagless EVALSHA whose first write is deny-oom).
func TestS28WOOMLeaseExtension(t *testing.T) {
	s17Flags(t, func(t *testing.T, on bool) {
		srv := s17Spawn(t)
		admin := srv.admin()
		b := setup(t, srv.admin(), func(cfg *runqueue.Config) {
			cfg.VtimeScheduling = on
			cfg.Clock = nil
			cfg.LeaseDuration = time.Second
			cfg.MaxAttempts = 3
		})
		ctx := b.ctx
		payload := []byte(strings.Repeat("p", 1000))
		for i := range 400 { // the backlog that filled Redis
			enqueue(t, b, runqueue.EnqueueParams{Queue: "backlog", ID: fmt.Sprint("b", i), Payload: payload})
		}
		started := make(chan struct{}, 10)
		logs := &countingHandler{}
		var mu sync.Mutex
		var attempts []int
		cancelled := 0
		w := startWorker(t, b.q, func(hctx context.Context, r *runqueue.Run) error {
			mu.Lock()
			attempts = append(attempts, r.Attempt)
			mu.Unlock()
			started <- struct{}{}
			select {
			case <-hctx.Done():
				mu.Lock()
				cancelled++
				mu.Unlock()
				return hctx.Err()
			case <-time.After(2500 * time.Millisecond):
				return nil
			}
		}, func(wc *runqueue.WorkerConfig) {
			wc.SweepInterval = 100 * time.Millisecond
			wc.Logger = slog.New(logs)
		})
		enqueue(t, b, runqueue.EnqueueParams{ID: "long", Payload: []byte("x")})
		<-started
		used := s28wUsedMemory(t, admin)
		require.NoError(t, admin.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used-200_000, 10)).Err())
		t.Cleanup(func() { _ = admin.ConfigSet(context.Background(), "maxmemory", "0").Err() })
		_, err := b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: env, Queue: "backlog", ID: "more", Payload: payload})
		require.ErrorContains(t, err, "OOM", "Redis is full")

		time.Sleep(4 * time.Second)
		require.NoError(t, admin.ConfigSet(ctx, "maxmemory", "0").Err())
		shutdown(t, w)
		mu.Lock()
		defer mu.Unlock()
		st := queueStats(t, b, queueName)
		t.Logf("flag=%v: deliveries (attempts) %v, handlers cancelled %d, stats %+v; extensions failed (logged) %d",
			on, attempts, cancelled, st, logs.count("could not extend"))
		require.Zero(t, cancelled, "a full Redis took the run from its running handler")
		require.Equal(t, []int{1}, attempts, "the run was delivered again though its handler never failed")
		require.Equal(t, runqueue.Stats{}, st)
	})
}
