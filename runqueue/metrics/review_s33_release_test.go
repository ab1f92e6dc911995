package metrics_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
	"github.com/runqueue/runqueue/runqueue/metrics"
)

// TestS33ReleasedRunsCountAsNacked: a forced Shutdown releases the runs
// of the handlers still running: "nacked with a retry time of now"
// (Worker.Shutdown), and the Collector reports each such handler with
// outcome "retry" ("the run was nacked for a retry", OutcomeRetry). Yet
// runs_nacked_total does not move: the runs were delivered
// (runs_dequeued_total 4) and are ready again (queue_ready_runs 4), but no
// counter says they went back, so dequeued - acked - nacked - recovered
// (the runs a dashboard believes in flight) stays at 4 for ever and the
// retry outcomes (4) disagree with the nacks (0).
func TestS33ReleasedRunsCountAsNacked(t *testing.T) {
	t.Parallel()
	client := redistest.Real(t)
	ctx := context.Background()
	c, err := metrics.New(&metrics.Options{Logger: slogDiscard()})
	require.NoError(t, err)
	q, err := runqueue.New(ctx, client, &runqueue.Config{Prefix: redistest.Prefix(t), Observer: c})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	c.Watch(q)
	for i := 0; i < 4; i++ {
		_, err := q.Enqueue(ctx, runqueue.EnqueueParams{Env: "env", Queue: "rel", ID: fmt.Sprint(i)})
		require.NoError(t, err)
	}
	var started sync.WaitGroup
	started.Add(4)
	w, err := runqueue.NewWorker(q, func(ctx context.Context, r *runqueue.Run) error {
		started.Done()
		<-ctx.Done()
		return ctx.Err()
	}, &runqueue.WorkerConfig{Queues: []runqueue.WorkerQueue{{Env: "env", Queue: "rel"}}, Concurrency: 4,
		SweepInterval: -1, Logger: slogDiscard()})
	require.NoError(t, err)
	require.NoError(t, w.Start(ctx))
	started.Wait()
	stop, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, w.Shutdown(stop), context.DeadlineExceeded)

	st, err := q.QueueStats(ctx, "env", "rel")
	require.NoError(t, err)
	require.Equal(t, int64(4), st.Ready, "the released runs are ready again")
	require.Zero(t, st.InFlight)

	// Handled is told once the handler returned: it has (ctx cancelled).
	require.Eventually(t, func() bool {
		v, _ := s17Value(s17Gather(t, c), "runqueue_handler_duration_seconds",
			map[string]string{"env": "env", "queue": "rel", "outcome": "retry"})
		return v == 4
	}, 3*time.Second, 20*time.Millisecond, "four handlers reported with outcome retry")
	got := s17Counters(t, c, "rel")
	require.Equal(t, 4.0, got["dequeued"])
	require.Equal(t, 4.0, got["nacked"]+got["acked"]+got["recovered"],
		"counters after a forced Shutdown released 4 runs (nacked with a retry time of now): %v", got)
}

// TestS33ScrapeAfterQueueClose: a collection concurrent with, or after,
// the watched Queue's Close never panics and still reports the counters.
// (Close does not close the client: the scrape still reads Redis.)
func TestS33ScrapeAfterQueueClose(t *testing.T) {
	t.Parallel()
	client := redistest.Real(t)
	ctx := context.Background()
	c, err := metrics.New(&metrics.Options{Logger: slogDiscard()})
	require.NoError(t, err)
	q, err := runqueue.New(ctx, client, &runqueue.Config{Prefix: redistest.Prefix(t), Observer: c})
	require.NoError(t, err)
	c.Watch(q)
	for i := 0; i < 20; i++ {
		_, err := q.Enqueue(ctx, runqueue.EnqueueParams{Env: "env", Queue: "c", ID: fmt.Sprint(i)})
		require.NoError(t, err)
	}
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 20; j++ {
				s17Gather(t, c)
			}
		}()
	}
	require.NoError(t, q.Close())
	wg.Wait()
	mfs := s17Gather(t, c)
	v, ok := s17Value(mfs, "runqueue_queue_ready_runs", s17Q("c"))
	require.True(t, ok)
	require.Equal(t, 20.0, v)
	v, _ = s17Value(mfs, "runqueue_runs_enqueued_total", s17Q("c"))
	require.Equal(t, 20.0, v)
	v, _ = s17Value(mfs, "runqueue_scrape_success", nil)
	require.Equal(t, 1.0, v)
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	require.Empty(t, problems)
}
