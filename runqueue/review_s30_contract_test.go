package runqueue_test

// Session 30 review: contracts of the write calls: a cancelled context
// returns promptly and leaves no goroutine; bad input writes nothing; a
// call sent twice is safe.

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

func s30Backends(t *testing.T, fn func(t *testing.T, c redis.UniversalClient)) {
	for _, name := range []string{"Mini", "Real"} {
		t.Run(name, func(t *testing.T) {
			if name == "Mini" {
				fn(t, redistest.Mini(t))
			} else {
				fn(t, redistest.Real(t))
			}
		})
	}
}

// Blocking dequeues return promptly on cancellation and, after Close and
// a worker's Shutdown, no goroutine of the library is left.
func TestS30CancelNoLeak(t *testing.T) {
	s30Backends(t, func(t *testing.T, c redis.UniversalClient) {
		for _, on := range []bool{false, true} {
			c.Ping(context.Background())
			ign := goleak.IgnoreCurrent()
			func() {
				b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = on; wallClock(cfg) })
				ctx, cancel := context.WithTimeout(b.ctx, 100*time.Millisecond)
				start := time.Now()
				runs, err := b.q.DequeueWait(ctx, env, queueName, 5, 10*time.Second)
				cancel()
				require.Empty(t, runs)
				require.ErrorIs(t, err, context.DeadlineExceeded)
				require.Less(t, time.Since(start), 2*time.Second)

				ctx, cancel = context.WithCancel(b.ctx)
				go func() { time.Sleep(100 * time.Millisecond); cancel() }()
				start = time.Now()
				_, err = b.q.DequeueShardWait(ctx, b.q.ShardOf(env), 5, 10*time.Second)
				require.ErrorIs(t, err, context.Canceled)
				require.Less(t, time.Since(start), 2*time.Second)

				w, err := runqueue.NewWorker(b.q, func(context.Context, *runqueue.Run) error { return nil },
					&runqueue.WorkerConfig{Queues: []runqueue.WorkerQueue{{Env: env, Queue: queueName}},
						Shards: []int{(b.q.ShardOf(env) + 1) % b.q.Shards()}, Concurrency: 4})
				require.NoError(t, err)
				require.NoError(t, w.Start(b.ctx))
				enqueue(t, b, runqueue.EnqueueParams{ID: "a"})
				sctx, scancel := context.WithTimeout(b.ctx, 5*time.Second)
				require.NoError(t, w.Shutdown(sctx))
				scancel()
				require.NoError(t, b.q.Close())
				require.NoError(t, b.q.Close())
				_, err = b.q.DequeueWait(b.ctx, env, queueName, 1, time.Second)
				require.ErrorIs(t, err, runqueue.ErrClosed)
			}()
			// Server-side goroutines of miniredis for the client's pooled
			// connections are not the library's.
			redistest.VerifyNoLeaks(t, ign,
				goleak.IgnoreAnyFunction("github.com/alicebob/miniredis/v2/server.(*Server).servePeer"),
				goleak.IgnoreAnyFunction("github.com/alicebob/miniredis/v2/server.(*Server).servePeer.func2"))
		}
	})
}

// Bad input to every write call: a typed error, nothing written.
func TestS30BadInputNothingWritten(t *testing.T) {
	t.Parallel()
	s30Backends(t, func(t *testing.T, c redis.UniversalClient) {
		for _, on := range []bool{false, true} {
			b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = on; cfg.MaxAttempts = 1 })
			ctx := b.ctx
			enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "held"})
			enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "dead"})
			runs := dequeue(t, b, queueName, 2)
			require.Len(t, runs, 2)
			var held *runqueue.Run
			for _, r := range runs {
				if r.ID == "dead" {
					_, err := b.q.Nack(ctx, r, &runqueue.NackOptions{DeadLetter: true})
					require.NoError(t, err)
				} else {
					held = r
				}
			}
			enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "queued"})
			before := b.dump(t)
			bad := *held
			bad.Key = "x\n"
			other := *held
			other.Queue = "other"
			calls := map[string]func() error{
				"SetWeight NaN":   func() error { return b.q.SetWeight(ctx, env, queueName, "k", math.NaN()) },
				"SetWeight Inf":   func() error { return b.q.SetWeight(ctx, env, queueName, "k", math.Inf(1)) },
				"SetWeight small": func() error { return b.q.SetWeight(ctx, env, queueName, "k", 0.0009) },
				"SetWeight neg":   func() error { return b.q.SetWeight(ctx, env, queueName, "k", -1) },
				"SetWeight name":  func() error { return b.q.SetWeight(ctx, env, queueName, " k", 1) },
				"ClearWeight":     func() error { return b.q.ClearWeight(ctx, env, "", "k") },
				"Redrive":         func() error { return b.q.Redrive(ctx, env, queueName, "k", "") },
				"Redrive ws":      func() error { return b.q.Redrive(ctx, env, queueName, "k", "dead ") },
				"Delete":          func() error { return b.q.DeleteDeadLetter(ctx, env, queueName, "k\x00", "dead") },
				"Purge limit": func() error {
					_, err := b.q.PurgeDeadLetters(ctx, env, queueName, time.Now(), 0)
					return err
				},
				"Purge time": func() error {
					_, err := b.q.PurgeDeadLetters(ctx, env, queueName, time.UnixMilli(runqueue.MaxTimeUnixMilli+1), 10)
					return err
				},
				"Purge before epoch": func() error {
					_, err := b.q.PurgeDeadLetters(ctx, env, queueName, time.UnixMilli(-1), 10)
					return err
				},
				"Extend neg":  func() error { return b.q.ExtendLease(ctx, held, -time.Second) },
				"Extend huge": func() error { return b.q.ExtendLease(ctx, held, time.Duration(math.MaxInt64)) },
				"Extend bad":  func() error { return b.q.ExtendLease(ctx, &bad, time.Minute) },
				"Ack bad":     func() error { return b.q.Ack(ctx, &bad) },
				"Nack bad": func() error {
					_, err := b.q.Nack(ctx, &bad, nil)
					return err
				},
				"Nack retry": func() error {
					_, err := b.q.Nack(ctx, held, &runqueue.NackOptions{RetryAt: time.UnixMilli(runqueue.MaxTimeUnixMilli + 1)})
					return err
				},
				"Nack retry neg": func() error {
					_, err := b.q.Nack(ctx, held, &runqueue.NackOptions{RetryAt: time.UnixMilli(-5)})
					return err
				},
				"AckMany bad": func() error {
					errs, err := b.q.AckMany(ctx, []*runqueue.Run{&bad})
					if err != nil {
						return err
					}
					return errs[0]
				},
				"AckAndDequeue other": func() error {
					_, _, err := b.q.AckAndDequeue(ctx, []*runqueue.Run{held, &other}, env, queueName, 1)
					return err
				},
				"AckAndDequeue count": func() error {
					_, _, err := b.q.AckAndDequeue(ctx, []*runqueue.Run{held}, env, queueName, -1)
					return err
				},
				"AckAndDequeue big": func() error {
					_, _, err := b.q.AckAndDequeue(ctx, []*runqueue.Run{held}, env, queueName, 5000)
					return err
				},
				"ExpireTTL":  func() error { _, err := b.q.ExpireTTL(ctx, -1, 10); return err },
				"ExpireTTL2": func() error { _, err := b.q.ExpireTTL(ctx, b.q.Shards(), 10); return err },
				"Recover":    func() error { _, err := b.q.RecoverLeases(ctx, 0, 0); return err },
				"DequeueShardWait": func() error {
					_, err := b.q.DequeueShardWait(ctx, 0, 1, -time.Second)
					return err
				},
				"DequeueWait": func() error {
					_, err := b.q.DequeueWait(ctx, env, queueName, 0, time.Second)
					return err
				},
			}
			for name, f := range calls {
				err := f()
				var ie *runqueue.InvalidError
				if !errors.As(err, &ie) || !errors.Is(err, runqueue.ErrInvalid) {
					t.Errorf("flag %v: %s: got %v, want an *InvalidError", on, name, err)
				}
				if after := b.dump(t); !equalDump(before, after) {
					t.Errorf("flag %v: %s wrote: before %v\nafter %v", on, name, before, after)
					before = after
				}
			}
		}
	})
}

func equalDump(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
