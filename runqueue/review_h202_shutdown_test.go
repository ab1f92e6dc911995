package runqueue_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// TestH202ShutdownAcksHalfMovedSlot (helper-202's finding): a Worker
// shut down gracefully (Shutdown with a ctx that never ends) while the
// slot of its queue's shard is half moved for 3 s, with six runs finished
// whose acks (or, failing, nacks) are still to go. README ("Redis Cluster
// resharding") says calls on a moving slot fail and succeed once the slot
// has moved; Shutdown's doc says a graceful stop sends the acks of the
// finished runs and returns nil. The fetch loop gave the acks up after its
// fourth failure in a row once the stop began (fetchLoop.finish), about
// 1.1-1.3 s into the hold: Shutdown returned "left 6 runs unsettled" and
// the six runs stayed in flight until their lease passed (to run again).
// The nacks passed: a nack is sent again while Redis refuses it unrun. Now
// so is an ack, while its lease lasts.
func TestH202ShutdownAcksHalfMovedSlot(t *testing.T) {
	t.Parallel() // a cluster of its own
	for _, tc := range []struct {
		name      string
		on, nacks bool
	}{{"vtime=true/acks", true, false}, {"vtime=false/acks", false, false}, {"vtime=true/nacks", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h202ShutdownHalfMoved(t, tc.on, tc.nacks, 3*time.Second)
		})
	}
}

func h202ShutdownHalfMoved(t *testing.T, on, nackVariant bool, hold time.Duration) {
	c := redistest.OwnCluster(t)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	q := s34NewQueue(t, c, prefix, func(cfg *runqueue.Config) {
		cfg.VtimeScheduling = on
		cfg.LeaseDuration = 10 * time.Second
	})
	env, queue := "h202p", "qa"
	space, err := keys.NewSpace(prefix, q.Shards())
	require.NoError(t, err)
	slot := keys.Slot(space.Shard(q.ShardOf(env)).Master())
	for i := 0; i < 6; i++ {
		_, err := q.Enqueue(ctx, runqueue.EnqueueParams{Env: env, Queue: queue, Key: fmt.Sprintf("k%d", i%3), ID: fmt.Sprintf("r%d", i), Payload: []byte("x")})
		require.NoError(t, err)
	}
	release := make(chan struct{})
	var mu sync.Mutex
	runs := map[string]int{}
	var inH atomic.Int64
	logs := &s19sLog{}
	w, err := runqueue.NewWorker(q, func(_ context.Context, r *runqueue.Run) error {
		mu.Lock()
		runs[r.ID]++
		n := runs[r.ID]
		mu.Unlock()
		if n == 1 {
			inH.Add(1)
			<-release
			if nackVariant {
				return runqueue.RetryAfter(errors.New("h202: retry later"), 50*time.Millisecond)
			}
		}
		return nil
	}, &runqueue.WorkerConfig{Queues: []runqueue.WorkerQueue{{Env: env, Queue: queue}}, Concurrency: 6, SweepInterval: -1, Logger: slog.New(logs)})
	require.NoError(t, err)
	require.NoError(t, w.Start(ctx))
	for inH.Load() < 6 {
		time.Sleep(5 * time.Millisecond)
	}

	// Half the slot's keys to another master, then hold.
	m, err := redistest.StartMigration(ctx, c, slot)
	require.NoError(t, err)
	all, err := m.From.ClusterCountKeysInSlot(ctx, slot).Result()
	require.NoError(t, err)
	moved := 0
	for int64(moved) < all/2 {
		n, err := m.MoveKeys(ctx, 1)
		require.NoError(t, err)
		moved += n
	}
	t.Logf("slot %d: %d of %d keys moved; held half moved for %v", slot, moved, all, hold)
	finished := make(chan error, 1)
	go func() {
		time.Sleep(hold)
		finished <- m.Finish(ctx)
	}()

	close(release) // the handlers return; their acks are to go
	t0 := time.Now()
	err = w.Shutdown(context.Background()) // graceful: this ctx never ends
	t.Logf("Shutdown (graceful) returned after %v: %v", time.Since(t0).Round(time.Millisecond), err)
	require.NoError(t, <-finished)
	t.Logf("Worker warnings and errors:\n%s", logs.report())
	st, err2 := q.QueueStats(ctx, env, queue)
	require.NoError(t, err2)
	t.Logf("after the move: %+v (in flight: runs whose ack was given up, to run again after their lease)", st)
	require.NoError(t, err, "a graceful Shutdown during a half-moved slot")
	require.Zero(t, st.InFlight)
}
