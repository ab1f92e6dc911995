package runqueue_test

// Review s24b: Stats after concurrent producers and a Worker that acks,
// retries and dead-letters, on a real Redis, both flag states.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// TestS24BStatsExactWhenQuiet: 4 producers enqueue 400 runs over 5 keys
// (priorities 0..9; every 10th delayed by an hour) while a Worker handles
// them: ids divisible by 3 fail their first attempt (retried at once),
// ids divisible by 7 are dead-lettered (NoRetry). Once every ready run
// reached its end and the Worker shut down, the stats must be exact.
//
// Contract (doc.go): "QueueStats, KeyStats and EnvStats count ready,
// delayed and in-flight runs, and QueueStats and EnvStats dead ones too";
// Worker: "Every run a worker takes ends acked, nacked (retried or
// dead-lettered) or released by Shutdown"; Shutdown "sends the acks of the
// runs that finished and returns nil".
func TestS24BStatsExactWhenQuiet(t *testing.T) {
	s24bFlags(t, func(c *runqueue.Config) { c.KeyConcurrency = 3 }, func(t *testing.T, b *testBundle) {
		const producers, perProducer, keysN = 4, 100, 5
		total := producers * perProducer
		var delayed, dead, final int
		for i := range total {
			switch {
			case i%10 == 0:
				delayed++
			case i%7 == 0:
				dead++
				final++
			default:
				final++
			}
		}
		var ended atomic.Int64
		done := make(chan struct{})
		var once sync.Once
		handler := func(ctx context.Context, r *runqueue.Run) error {
			i, err := strconv.Atoi(r.ID)
			if err != nil {
				return runqueue.NoRetry(err)
			}
			var out error
			switch {
			case i%3 == 0 && r.Attempt == 1:
				return runqueue.RetryAt(errors.New("again"), b.clock.Now())
			case i%7 == 0:
				out = runqueue.NoRetry(errors.New("bad"))
			}
			if ended.Add(1) == int64(final) {
				once.Do(func() { close(done) })
			}
			return out
		}
		w, err := runqueue.NewWorker(b.q, handler, &runqueue.WorkerConfig{
			Queues: []runqueue.WorkerQueue{{Env: env, Queue: queueName}}, Concurrency: 8, SweepInterval: -1})
		require.NoError(t, err)
		require.NoError(t, w.Start(context.Background()))
		var wg sync.WaitGroup
		for p := range producers {
			wg.Go(func() {
				for j := range perProducer {
					i := p*perProducer + j
					par := runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprint("k", i%keysN),
						ID: fmt.Sprint(i), Priority: i % 10}
					if i%10 == 0 {
						par.Delay = time.Hour
					}
					ok, err := b.q.Enqueue(b.ctx, par)
					if err != nil || !ok {
						t.Errorf("enqueue %d: %v %v", i, ok, err)
						return
					}
				}
			})
		}
		wg.Wait()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("only %d of %d runs ended", ended.Load(), final)
		}
		ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
		defer cancel()
		require.NoError(t, w.Shutdown(ctx))
		require.Equal(t, int64(final), ended.Load(), "no run handled to its end twice")

		want := runqueue.Stats{Delayed: int64(delayed), Dead: int64(dead)}
		require.Equal(t, want, queueStats(t, b, queueName))
		es, err := b.q.EnvStats(b.ctx, env)
		require.NoError(t, err)
		require.Equal(t, want, es)
		var sum runqueue.Stats
		for k := range keysN {
			ks, err := b.q.KeyStats(b.ctx, env, queueName, fmt.Sprint("k", k))
			require.NoError(t, err)
			require.Zero(t, ks.Ready+ks.InFlight, "key k%d: %+v", k, ks)
			sum.Delayed += ks.Delayed
		}
		require.Equal(t, int64(delayed), sum.Delayed)
		dl, err := b.q.DeadLetters(b.ctx, env, queueName, 0, 1000)
		require.NoError(t, err)
		require.Len(t, dl, dead)
	})
}
