package runqueue_test

// Review s28w: a flag-on Worker and a flag-off Worker on one queue of a
// real redis-server, per-key limits, and an outage (SIGSTOP) longer than
// the scheduler's StateTTL.

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// TestS28WMixedWorkersStateExpiresInOutage: producers of both flag states
// enqueue 300 runs over 10 keys (KeyConcurrency 1, QueueConcurrency 6);
// one Worker runs flag on, one flag off (a rollout half done). Midway the
// server stops answering for 2.5 s, so the scheduler's state (StateTTL
// 1 s) expires meanwhile. Expected: every run is handled and acked exactly
// once (leases of 10 s do not pass), two handlers of one key never run at
// once, never more than 6 at once, and nothing is left
// queued or in flight. (It takes about a lease after the outage: runs
// dequeued by fetches that timed out are held by nobody until recovery.)
func TestS28WMixedWorkersStateExpiresInOutage(t *testing.T) {
	srv := s17Spawn(t)
	c := redis.NewClient(&redis.Options{Addr: srv.addr, ReadTimeout: time.Second})
	t.Cleanup(func() { _ = c.Close() })
	mk := func(on bool) *testBundle {
		return setup(t, c, func(cfg *runqueue.Config) {
			cfg.VtimeScheduling = on
			cfg.Clock = nil
			cfg.LeaseDuration = 10 * time.Second
			cfg.KeyConcurrency = 1
			cfg.QueueConcurrency = 6
			cfg.StateTTL = time.Second
			cfg.BlockPollInterval = 50 * time.Millisecond
		})
	}
	bOn := mk(true)
	bOff := mk(false)
	// Same prefix for both: the second bundle got its own; use the first's.
	offQ, err := runqueue.New(context.Background(), c, &runqueue.Config{Prefix: bOn.prefix, Clock: nil,
		LeaseDuration: 10 * time.Second, KeyConcurrency: 1, QueueConcurrency: 6, BlockPollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = offQ.Close() })
	_ = bOff

	var mu sync.Mutex
	perKey := map[string]int{}
	total, maxTotal := 0, 0
	var violations []string
	handled := map[string]int{}
	var by [2]atomic.Int64
	h := func(i int) runqueue.Handler {
		return func(ctx context.Context, r *runqueue.Run) error {
			mu.Lock()
			perKey[r.Key]++
			total++
			maxTotal = max(maxTotal, total)
			if perKey[r.Key] > 1 {
				violations = append(violations, fmt.Sprintf("key %s: %d at once", r.Key, perKey[r.Key]))
			}
			handled[r.ID]++
			mu.Unlock()
			by[i].Add(1)
			time.Sleep(5 * time.Millisecond)
			mu.Lock()
			perKey[r.Key]--
			total--
			mu.Unlock()
			return nil
		}
	}
	wcfg := func(wc *runqueue.WorkerConfig) {
		wc.Concurrency = 8
		wc.IdlePollInterval = 200 * time.Millisecond
		wc.SweepInterval = 200 * time.Millisecond
	}
	wOn := startWorker(t, bOn.q, h(0), wcfg)
	wOff := startWorker(t, offQ, h(1), wcfg)

	produce := func(from, to int) {
		for i := from; i < to; i++ {
			q := bOn.q
			if i%2 == 1 {
				q = offQ
			}
			_, err := q.Enqueue(context.Background(), runqueue.EnqueueParams{Env: env, Queue: queueName,
				Key: fmt.Sprint("k", i%10), ID: fmt.Sprint("r", i), Payload: []byte("x")})
			require.NoError(t, err)
		}
	}
	produce(0, 150)
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, srv.cmd.Process.Signal(syscall.SIGSTOP))
	time.Sleep(2500 * time.Millisecond)
	require.NoError(t, srv.cmd.Process.Signal(syscall.SIGCONT))
	resumed := time.Now()
	produce(150, 300)
	time.Sleep(time.Second)
	t.Logf("1s after the server resumed: %+v", queueStats(t, bOn, queueName))
	for _, k := range bOn.keysUnder(t) {
		if len(k) > 5 && k[len(k)-5:] == ":held" {
			held, _ := c.HGetAll(context.Background(), k).Result()
			mu.Lock()
			for f := range held {
				// A fetch whose reply timed out during the outage ran when
				// the server resumed: its runs are held by nobody until
				// their lease passes (README, "Timeouts and go-redis's
				// retries"), and with KeyConcurrency 1 their keys wait.
				t.Logf("in flight: %s (handled: %v)", f, handled[f[len("=k0:"):]] > 0)
			}
			mu.Unlock()
		}
	}

	deadline := time.Now().Add(12 * time.Second)
	for {
		mu.Lock()
		n := len(handled)
		mu.Unlock()
		st := queueStats(t, bOn, queueName)
		if n == 300 && st == (runqueue.Stats{}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("handled %d of 300 runs; stats %+v; schedule stuck?", n, st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("all handled %v after the server resumed", time.Since(resumed).Round(time.Millisecond))
	shutdown(t, wOn)
	shutdown(t, wOff)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("flag-on worker handled %d, flag-off %d; most at once %d", by[0].Load(), by[1].Load(), maxTotal)
	require.Empty(t, violations, "KeyConcurrency 1 broken")
	require.LessOrEqual(t, maxTotal, 6, "QueueConcurrency 6 broken")
	for id, n := range handled {
		require.Equal(t, 1, n, "run %s handled %d times", id, n)
	}
}
