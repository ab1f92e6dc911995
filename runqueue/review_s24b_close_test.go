package runqueue_test

// Review s24b: a Worker whose Queue is closed while it runs; real Redis,
// both flag states.

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// TestS24BWorkerAfterQueueClose: a started Worker, idle, then its Queue is
// closed and a run is enqueued.
//
// Contract: Queue.Close (queue.go): "Enqueue, Ack and Dequeue still work
// after Close, each as a call of its own"; WorkerConfig.IdlePollInterval
// (worker.go): "An enqueue wakes the worker at once through pub/sub"
// (IdlePollInterval is "a safety net for a wake-up lost while the pub/sub
// connection reconnects"). Nothing in the docs says a Worker stops being
// woken once its Queue is closed, nor makes Close refuse while a Worker
// runs. Here IdlePollInterval is an hour: the run must still be handled
// promptly, or Start/Close must say the Worker cannot go on.
func TestS24BWorkerAfterQueueClose(t *testing.T) {
	s24bFlags(t, wallClock, func(t *testing.T, b *testBundle) {
		handled := make(chan string, 4)
		w, err := runqueue.NewWorker(b.q, func(ctx context.Context, r *runqueue.Run) error {
			handled <- r.ID
			return nil
		}, &runqueue.WorkerConfig{Queues: []runqueue.WorkerQueue{{Env: env, Queue: queueName}},
			Concurrency: 2, SweepInterval: -1, IdlePollInterval: time.Hour})
		require.NoError(t, err)
		require.NoError(t, w.Start(context.Background()))
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			require.NoError(t, w.Shutdown(ctx))
		}()

		// Sanity: before Close an enqueue wakes it.
		enqueue(t, b, runqueue.EnqueueParams{ID: "before"})
		select {
		case id := <-handled:
			require.Equal(t, "before", id)
		case <-time.After(5 * time.Second):
			t.Fatal("the run enqueued before Close was not handled")
		}
		time.Sleep(200 * time.Millisecond) // the worker is idle again

		require.NoError(t, b.q.Close())
		enqueue(t, b, runqueue.EnqueueParams{ID: "after"}) // works after Close
		select {
		case id := <-handled:
			require.Equal(t, "after", id)
		case <-time.After(5 * time.Second):
			t.Fatal("a run enqueued after Queue.Close is not handled by the running Worker " +
				"(its pub/sub wake-ups were stopped by Close; it waits IdlePollInterval)")
		}
	})
}
