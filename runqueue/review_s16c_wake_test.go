package runqueue_test

// Review s16c: the wake-up count of 33f54c9 (a call that comes back short
// looks again at once when a wake-up came during it): no spin.

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// A key at its limit (KeyConcurrency 1, its run's handler blocked) and a
// steady stream of enqueues to it: the worker's script calls stay bounded
// by the enqueues plus its polls, queue and shard sources, fetchDepth's
// two calls in flight (Concurrency 8).
func TestS16CLimitedKeyStreamNoSpin(t *testing.T) {
	for _, shard := range []bool{false, true} {
		t.Run(fmt.Sprintf("shard=%v", shard), func(t *testing.T) {
			c := s16cClient(t)
			var calls atomic.Int64
			c.AddHook(s16cHook(func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
				if s16cScriptKeys(cmd) >= 0 {
					calls.Add(1)
				}
				return next(ctx, cmd)
			}))
			mut := func(cfg *runqueue.Config) {
				cfg.KeyConcurrency = 1
				cfg.Clock = nil
				cfg.BlockPollInterval = 200 * time.Millisecond
			}
			b := setup(t, c, mut)
			// The enqueuer: another client, so its calls are not counted.
			eb := &testBundle{ctx: context.Background()}
			ecfg := &runqueue.Config{Prefix: b.prefix}
			mut(ecfg)
			eq, err := runqueue.New(context.Background(), otherClient(t, c), ecfg)
			require.NoError(t, err)
			t.Cleanup(func() { _ = eq.Close() })
			eb.q = eq
			block := make(chan struct{})
			w := newWorker(t, b.q, func(ctx context.Context, r *runqueue.Run) error {
				select {
				case <-block:
				case <-ctx.Done():
				}
				return nil
			}, func(wc *runqueue.WorkerConfig) {
				wc.Concurrency = 8
				wc.IdlePollInterval = time.Minute
				if shard {
					wc.Queues = nil
					wc.Shards = []int{b.q.ShardOf(env)}
				}
			})
			require.NoError(t, w.Start(context.Background()))
			enqueue(t, eb, runqueue.EnqueueParams{ID: "first", Key: "k"})
			require.Eventually(t, func() bool { return queueStats(t, b, queueName).InFlight == 1 }, 5*time.Second, 5*time.Millisecond)
			time.Sleep(100 * time.Millisecond)
			before := calls.Load()
			start := time.Now()
			const n = 100
			for i := range n {
				enqueue(t, eb, runqueue.EnqueueParams{ID: fmt.Sprint("r", i), Key: "k"})
				time.Sleep(10 * time.Millisecond)
			}
			took := time.Since(start)
			got := calls.Load() - before
			polls := int64(took / (200 * time.Millisecond))
			t.Logf("%d enqueues over %v: %d worker script calls (polls allowed %d)", n, took, got, polls)
			require.LessOrEqual(t, got, int64(n)+2*polls+10, "the worker spins")
			close(block)
		})
	}
}

// An idle worker on a real Redis: the script calls over two idle windows
// of 2 s grow only with the IdlePollInterval (200 ms): at most about 10
// per window and source.
func TestS16CIdleCallsRealRedis(t *testing.T) {
	c := redistest.Private(t)
	b := setup(t, c, wallClock)
	w := newWorker(t, b.q, func(context.Context, *runqueue.Run) error { return nil }, func(wc *runqueue.WorkerConfig) {
		wc.IdlePollInterval = 200 * time.Millisecond
		wc.Shards = []int{b.q.ShardOf(env)}
	})
	require.NoError(t, w.Start(context.Background()))
	enqueue(t, b, runqueue.EnqueueParams{ID: "a"})
	require.Eventually(t, func() bool { s := queueStats(t, b, queueName); return s.Ready+s.InFlight == 0 }, 5*time.Second, 5*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	count := func() int64 {
		info, err := c.Info(context.Background(), "commandstats").Result()
		require.NoError(t, err)
		var n int64
		for _, line := range strings.Split(info, "\n") {
			for _, name := range []string{"cmdstat_evalsha:", "cmdstat_eval:", "cmdstat_fcall:", "cmdstat_fcall_ro:", "cmdstat_evalsha_ro:"} {
				if strings.HasPrefix(line, name) {
					f := strings.TrimPrefix(strings.SplitN(line[len(name):], ",", 2)[0], "calls=")
					v, _ := strconv.ParseInt(f, 10, 64)
					n += v
				}
			}
		}
		return n
	}
	c0 := count()
	time.Sleep(2 * time.Second)
	c1 := count()
	time.Sleep(2 * time.Second)
	c2 := count()
	t.Logf("script calls: %d then %d over 2 s idle windows (2 sources)", c1-c0, c2-c1)
	require.LessOrEqual(t, c1-c0, int64(2*12+4))
	require.LessOrEqual(t, c2-c1, int64(2*12+4))
}
