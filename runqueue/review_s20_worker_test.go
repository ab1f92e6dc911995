package runqueue_test

// Review s20: a Worker stop that never ended. A fetch loop that looked at
// the stop's steps, decided not to leave, and then saw one more step taken
// before it slept (the stop closed its drained signal in between) slept on
// a select with nothing left to wake it: Shutdown(context.Background())
// never returned. CI met it once in TestS16BForceRacesStopCompletion (about
// one stop in fifty thousand); the hook here holds the loop in that window.

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// A graceful Shutdown of an idle worker whose fetch loops take the stop's
// last step only after deciding to wait: it returns nil, the stop's own
// result, not the error of the ctx that ends five seconds later (forcing
// the stop was the only thing that woke the loops before the fix). Both
// kinds of source: a queue and a whole shard.
func TestS20StopStepBetweenLookAndWait(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  func(q *runqueue.Queue) *runqueue.WorkerConfig
	}{
		{"queue", func(*runqueue.Queue) *runqueue.WorkerConfig {
			return &runqueue.WorkerConfig{Queues: []runqueue.WorkerQueue{{Env: env, Queue: queueName}}, Concurrency: 2,
				SweepInterval: -1, Logger: quietLogger}
		}},
		{"shard", func(q *runqueue.Queue) *runqueue.WorkerConfig {
			return &runqueue.WorkerConfig{Shards: []int{q.ShardOf(env)}, Concurrency: 2,
				SweepInterval: -1, Logger: quietLogger}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := setup(t, redistest.Mini(t), nil)
			enqueue(t, b, runqueue.EnqueueParams{ID: "a"})
			done := make(chan string, 1)
			w, err := runqueue.NewWorker(b.q, func(_ context.Context, r *runqueue.Run) error {
				done <- r.ID
				return nil
			}, tc.cfg(b.q))
			require.NoError(t, err)
			give := make(chan struct{})
			defer close(give)
			w.HoldFetchWaitUntilDrained(give)
			require.NoError(t, w.Start(context.Background()))
			require.Equal(t, "a", <-done)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			require.NoError(t, w.Shutdown(ctx), "a graceful stop of an idle worker")
			s := queueStats(t, b, queueName)
			require.Zero(t, s.Ready+s.InFlight, "the run was acked: %+v", s)
		})
	}
}
