package runqueue_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// TestWorkerNackBehindDelayedHead: a Worker idle with its look timer at
// IdlePollInterval (a look found the queue empty) is woken by one publish
// for two runs: x, delayed 100ms (the queue's head), and fy, ready. The
// fetch gets fy alone (some runs, fewer than asked), and kept the pending
// one-minute timer. fy fails; its nack (backoff 600ms, after x's time)
// publishes nothing, x being the head, and no ack makes the loop look
// again: x and fy waited for that timer, a minute (helper-145, the likely
// cause of an intermittent TestS19FFailover failure: 5 of 5 runs stalled
// before the fix). Now a fetch that gets runs brings the timer forward to
// BlockPollInterval.
func TestWorkerNackBehindDelayedHead(t *testing.T) {
	t.Parallel()
	b := setup(t, redistest.Real(t), func(cfg *runqueue.Config) {
		cfg.Clock = nil
		cfg.BlockPollInterval = 50 * time.Millisecond
		cfg.BackoffBase = 600 * time.Millisecond
		cfg.BackoffMax = 600 * time.Millisecond
	})
	var mu sync.Mutex
	handled := map[string]time.Time{}
	w, err := runqueue.NewWorker(b.q, func(_ context.Context, r *runqueue.Run) error {
		if strings.HasPrefix(r.ID, "f") && r.Attempt == 1 {
			return errors.New("first attempt fails")
		}
		mu.Lock()
		handled[r.ID] = time.Now()
		mu.Unlock()
		return nil
	}, &runqueue.WorkerConfig{Queues: []runqueue.WorkerQueue{{Env: env, Queue: queueName}}, Concurrency: 4})
	require.NoError(t, err)
	require.NoError(t, w.Start(context.WithoutCancel(b.ctx)))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(b.ctx, 3*time.Second)
		defer cancel()
		_ = w.Shutdown(ctx)
	})
	time.Sleep(300 * time.Millisecond) // the loop looked: the queue empty, its timer a minute away
	start := time.Now()
	_, err = b.q.EnqueueMany(b.ctx, []runqueue.EnqueueParams{
		{Env: env, Queue: queueName, ID: "x", Delay: 100 * time.Millisecond},
		{Env: env, Queue: queueName, ID: "fy"},
	})
	require.NoError(t, err)
	// (10 s: a loaded machine's margin; the defect waits a minute.)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(handled) == 2
	}, 10*time.Second, 10*time.Millisecond, "x and fy handled")
	mu.Lock()
	defer mu.Unlock()
	t.Logf("x after %v, fy after %v", handled["x"].Sub(start).Round(time.Millisecond), handled["fy"].Sub(start).Round(time.Millisecond))
}
