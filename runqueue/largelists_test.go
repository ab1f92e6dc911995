package runqueue_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// TestLargeListsRealRedis drives the scheduler's list-handling paths with
// 10,000 keys on a real Redis, whose Lua refuses to unpack much more than
// 8,000 values (miniredis has no such limit): discovery and the age head
// over 10,000 untagged keys at the largest maxCount, and a key-limit rise
// that returns 10,000 gated keys in one call. Every call must succeed and
// leave a consistent state.
func TestLargeListsRealRedis(t *testing.T) {
	t.Parallel()
	c := redistest.Real(t)
	const keysN = 10000
	ctx := context.Background()

	t.Run("Discovery", func(t *testing.T) {
		t.Parallel()
		off := setup(t, c, func(cfg *runqueue.Config) { cfg.MaxDequeueCount = 2000 })
		on, err := runqueue.New(ctx, c, &runqueue.Config{Prefix: off.prefix, Clock: off.clock, VtimeScheduling: true,
			MaxDequeueCount: 2000})
		require.NoError(t, err)
		defer on.Close()
		for i := 0; i < keysN; i++ {
			_, err := off.q.Enqueue(ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprintf("k%05d", i),
				ID: fmt.Sprint(i)})
			require.NoError(t, err)
		}
		served := 0
		for served < keysN {
			runs, err := on.Dequeue(ctx, env, queueName, 2000)
			require.NoError(t, err)
			require.NotEmpty(t, runs)
			served += len(runs)
			for _, r := range runs {
				require.NoError(t, on.Ack(ctx, r))
			}
		}
		require.Equal(t, keysN, served)
	})

	t.Run("LimitRise", func(t *testing.T) {
		t.Parallel()
		var limit atomic.Int64
		limit.Store(1)
		b := setup(t, c, func(cfg *runqueue.Config) {
			cfg.VtimeScheduling, cfg.MaxDequeueCount = true, 2000
			cfg.LimitsFor = func(string, string) runqueue.Limits { return runqueue.Limits{Key: int(limit.Load())} }
		})
		for i := 0; i < keysN; i++ {
			for j := 0; j < 3; j++ {
				_, err := b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprintf("k%05d", i),
					ID: fmt.Sprintf("%d-%d", i, j)})
				require.NoError(t, err)
			}
		}
		held := 0
		for held < keysN {
			runs, err := b.q.Dequeue(ctx, env, queueName, 2000)
			require.NoError(t, err)
			require.NotEmpty(t, runs)
			held += len(runs)
		}
		snap, _, err := b.q.SchedulerSnapshot(ctx, env, queueName)
		require.NoError(t, err)
		require.Len(t, snap.Reg, keysN)
		for vm, r := range snap.Reg {
			require.True(t, r.Gated, "%s at its limit", vm)
		}
		// The limit rises: the next call returns every gated key and serves.
		limit.Store(2)
		runs, err := b.q.Dequeue(ctx, env, queueName, 2000)
		require.NoError(t, err)
		require.Len(t, runs, 2000)
		snap, _, err = b.q.SchedulerSnapshot(ctx, env, queueName)
		require.NoError(t, err)
		gated := 0
		for _, r := range snap.Reg {
			if r.Gated {
				gated++
			}
		}
		require.Equal(t, 2000, gated, "the keys served up to the new limit are gated again, no other")
	})
}
