package runqueue_test

// Session 30 review: dead letters redriven in pages at scale, flag on, on a
// real Redis, while workers serve with weights and a per-key limit.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// s30Rest checks that only tokens, layout, weights and the scheduler's
// two keys (with a TTL) are left under the bundle's prefix.
func s30Rest(t *testing.T, b *testBundle) {
	t.Helper()
	for _, k := range prefixKeys(t, b.client, b.prefix) {
		switch {
		case strings.HasSuffix(k, ":tokens"), strings.HasSuffix(k, ":layout"), strings.HasSuffix(k, ":weights"):
		case expiresOnItsOwn(k):
			ttl, err := b.client.PTTL(b.ctx, k).Result()
			require.NoError(t, err)
			require.Greater(t, ttl, time.Duration(0), "scheduler key %s without TTL", k)
		default:
			t.Errorf("key %s left at rest: %s", k, keyValue(t, b.client, k))
		}
	}
}

func TestS30RedriveScaleWorkers(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"Mini", "Real"} {
		t.Run(name, func(t *testing.T) {
			c := redistest.Mini(t)
			if name == "Real" {
				c = redistest.Real(t)
			}
			const nKeys, nRuns = 300, 2000
			b := setup(t, c, func(cfg *runqueue.Config) {
				wallClock(cfg)
				cfg.VtimeScheduling = true
				cfg.KeyConcurrency = 2
				cfg.MaxAttempts = 1
			})
			ctx := b.ctx
			params := make([]runqueue.EnqueueParams, nRuns)
			for i := range params {
				params[i] = runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprintf("k%03d", i%nKeys),
					ID: fmt.Sprintf("r%04d", i), Payload: []byte("p")}
			}
			res, err := b.q.EnqueueMany(ctx, params)
			require.NoError(t, err)
			for _, r := range res {
				require.NoError(t, r.Err)
				require.True(t, r.Queued)
			}
			for i := 0; i < nKeys; i += 10 {
				require.NoError(t, b.q.SetWeight(ctx, env, queueName, fmt.Sprintf("k%03d", i), []float64{0.5, 2, 4}[i/10%3]))
			}
			// Dead-letter every run: MaxAttempts 1, one nack each.
			dead := 0
			for dead < nRuns {
				runs, err := b.q.Dequeue(ctx, env, queueName, 600)
				require.NoError(t, err)
				require.NotEmpty(t, runs, "after %d dead", dead)
				for _, r := range runs {
					nr, err := b.q.Nack(ctx, r, nil)
					require.NoError(t, err)
					require.False(t, nr.Requeued)
					dead++
				}
			}
			st, err := b.q.QueueStats(ctx, env, queueName)
			require.NoError(t, err)
			require.Equal(t, runqueue.Stats{Dead: nRuns}, st)

			var mu sync.Mutex
			served := map[string]int{}
			var order []string
			done := make(chan struct{})
			handler := func(ctx context.Context, r *runqueue.Run) error {
				mu.Lock()
				served[r.ID]++
				order = append(order, r.Key)
				if len(served) == nRuns {
					select {
					case <-done:
					default:
						close(done)
					}
				}
				mu.Unlock()
				return nil
			}
			var workers []*runqueue.Worker
			for i := 0; i < 2; i++ {
				w, err := runqueue.NewWorker(b.q, handler, &runqueue.WorkerConfig{
					Queues: []runqueue.WorkerQueue{{Env: env, Queue: queueName}}, Concurrency: 16,
					SweepInterval: 200 * time.Millisecond})
				require.NoError(t, err)
				require.NoError(t, w.Start(ctx))
				workers = append(workers, w)
			}
			// Redrive in pages while the workers serve.
			redriven := 0
			for {
				ds, err := b.q.DeadLetters(ctx, env, queueName, 0, 150)
				require.NoError(t, err)
				if len(ds) == 0 {
					break
				}
				for _, d := range ds {
					require.NoError(t, b.q.Redrive(ctx, d.Env, d.Queue, d.Key, d.ID))
					redriven++
				}
			}
			require.Equal(t, nRuns, redriven)
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				mu.Lock()
				n := len(served)
				mu.Unlock()
				st, _ := b.q.QueueStats(ctx, env, queueName)
				t.Fatalf("only %d of %d runs served; stats %+v", n, nRuns, st)
			}
			for _, w := range workers {
				sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				require.NoError(t, w.Shutdown(sctx))
				cancel()
			}
			mu.Lock()
			for id, n := range served {
				require.Equal(t, 1, n, "run %s served %d times", id, n)
			}
			mu.Unlock()
			st, err = b.q.QueueStats(ctx, env, queueName)
			require.NoError(t, err)
			require.Equal(t, runqueue.Stats{}, st)
			es, err := b.q.EnvStats(ctx, env)
			require.NoError(t, err)
			require.Equal(t, runqueue.Stats{}, es)
			s30Rest(t, b)
		})
	}
}
