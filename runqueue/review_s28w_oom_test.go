package runqueue_test

// Review s28w: the Worker on a real redis-server that reached maxmemory
// (noeviction) while a backlog waits.

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// s28wUsedMemory reads used_memory from INFO memory.
func s28wUsedMemory(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "memory").Result()
	require.NoError(t, err)
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatal("no used_memory")
	return 0
}

// TestS28WOOMBacklogDrains: producers filled Redis up to maxmemory
// (noeviction: their enqueues now fail with OOM) while no worker ran (a
// deploy, say). A Worker then starts. Processing the backlog is the only
// thing that frees memory (each ack deletes a record), and the docs say a
// full Redis "can still settle runs and free memory". A careful operator
// expects the workers to drain the backlog and the Redis to become
// writable again without intervention.
//
// Expected: every queued run is handled and acked, in both flag states.
//
// Fixed (CHANGES/2026-12-04-full-redis.md). It failed, flag on, in 4 of 4
// runs of every flag-on variant: the Worker's fetch
// carries no acks (it holds no runs), so it is the plain flag-on dequeue:
// by FCALL a function registered without 'allow-oom'
// (runqueue/library.go:80, libraryScripts: dequeue_vtime.lua with settles
// false), which Redis refuses before it runs on a full server; by EVALSHA
// (ScriptsOnly) a flagless script whose first write is a scheduler ZADD/HSET
// (deny-oom; "@user_script:648"), refused too. A Shards worker
// (DequeueShard) is refused the same way. The worker retries for ever
// ("fetch failed ... OOM"); nothing is dequeued, nothing acked, nothing
// freed: the backlog waits until an operator raises maxmemory. Flag off,
// the same fetch runs (EVALSHA; its first write removes) and the worker
// drains all 300 runs. A flag rollout thus turns a full Redis that drains
// itself into one that is stuck. (Note: on this server used_memory stayed
// above maxmemory even after the flag-off drain, so enqueues may stay
// refused for a while either way; the defect is that flag on nothing is
// served at all.)
func TestS28WOOMBacklogDrains(t *testing.T) {
	for _, tc := range []struct {
		name            string
		on, scriptsOnly bool
		shards          bool
	}{
		{"vtime=false", false, false, false},
		{"vtime=true", true, false, false},
		{"vtime=true/ScriptsOnly", true, true, false},
		{"vtime=true/Shards", true, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			on := tc.on
			srv := s17Spawn(t)
			admin := srv.admin()
			b := setup(t, srv.admin(), func(cfg *runqueue.Config) {
				cfg.VtimeScheduling = on
				cfg.ScriptsOnly = tc.scriptsOnly
				cfg.Clock = nil
			})
			ctx := b.ctx
			const n = 300
			payload := []byte(strings.Repeat("p", 1000))
			for i := range n {
				enqueue(t, b, runqueue.EnqueueParams{ID: fmt.Sprint("r", i), Key: fmt.Sprint("k", i%5), Payload: payload})
			}
			// Full: a little below what Redis uses now; acking a few dozen runs
			// frees enough to go below it again.
			used := s28wUsedMemory(t, admin)
			require.NoError(t, admin.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used-30_000, 10)).Err())
			t.Cleanup(func() { _ = admin.ConfigSet(context.Background(), "maxmemory", "0").Err() })
			_, err := b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, ID: "more", Payload: payload})
			require.ErrorContains(t, err, "OOM", "Redis is full: enqueues are refused")

			var handled atomic.Int64
			if on {
				runs, derr := b.q.Dequeue(ctx, env, queueName, 1)
				require.NoError(t, derr, "a plain flag-on Dequeue on the full Redis")
				for _, r := range runs {
					require.NoError(t, b.q.Ack(ctx, r))
					handled.Add(1)
				}
			}
			logs := &countingHandler{}
			w := startWorker(t, b.q, func(ctx context.Context, r *runqueue.Run) error {
				handled.Add(1)
				return nil
			}, func(wc *runqueue.WorkerConfig) {
				wc.Concurrency = 10
				wc.Logger = slog.New(logs)
				if tc.shards {
					wc.Queues, wc.Shards = nil, []int{b.q.ShardOf(env)}
				}
			})
			deadline := time.Now().Add(6 * time.Second)
			for time.Now().Before(deadline) {
				st, err := b.q.QueueStats(ctx, env, queueName)
				require.NoError(t, err)
				if st == (runqueue.Stats{}) {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			st, err := b.q.QueueStats(ctx, env, queueName)
			require.NoError(t, err)
			t.Logf("%s: handled %d of %d runs in 6s; fetch failures logged: %d; stats %+v",
				tc.name, handled.Load(), n, logs.count("fetch failed"), st)
			require.Equal(t, runqueue.Stats{}, st, "the backlog of a full Redis does not drain")
			require.EqualValues(t, n, handled.Load())
			shutdown(t, w)
			t.Logf("used_memory after the drain: %d (maxmemory %d)", s28wUsedMemory(t, admin), used-30_000)
		})
	}
}
