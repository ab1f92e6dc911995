package runqueue_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// s31Obs counts every run the Observer hears of, per method.
type s31Obs struct {
	runqueue.NopObserver
	enq, deq, ack atomic.Int64
	mu            sync.Mutex
	deqIDs        map[string]int
}

func (o *s31Obs) Enqueued(_, _ string, n int) { o.enq.Add(int64(n)) }
func (o *s31Obs) Acked(_, _ string, n int)    { o.ack.Add(int64(n)) }
func (o *s31Obs) Dequeued(runs []*runqueue.Run, _ time.Time) {
	o.deq.Add(int64(len(runs)))
	o.mu.Lock()
	for _, r := range runs {
		o.deqIDs[r.Queue+"/"+r.ID]++
	}
	o.mu.Unlock()
}

// Concurrent Enqueue, Dequeue and Ack on one Queue over three queues and
// several keys, every call with a random short deadline (many end before
// the send, some while it is in flight): a run told queued is served
// exactly once; no run is served twice; a Dequeue that returns an error
// leaves nothing held (the queues drain to zero in flight); the Observer
// hears of each run exactly once per event. Covers Dequeue and Ack
// cancellations mixed with Enqueue ones over several queues (the existing
// stress covers Enqueue alone on one queue).
func TestS31MixedCancelStress(t *testing.T) {
	s31EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		obs := &s31Obs{deqIDs: map[string]int{}}
		b := setup(t, c, func(cfg *runqueue.Config) {
			cfg.VtimeScheduling = on
			cfg.Observer = obs
		})
		ctx := context.Background()
		queues := []string{"qa", "qb", "qc"}
		const producers, per, consumers = 12, 60, 8
		var mu sync.Mutex
		told := map[string]string{} // queue/id -> outcome
		served := map[string]int{}
		var failures []string
		fail := func(f string, a ...any) {
			mu.Lock()
			failures = append(failures, fmt.Sprintf(f, a...))
			mu.Unlock()
		}
		short := func(rng *rand.Rand) (context.Context, context.CancelFunc) {
			return context.WithTimeout(ctx, time.Duration(rng.IntN(1500))*time.Microsecond)
		}
		ack := func(rng *rand.Rand, r *runqueue.Run) {
			actx, cancel := short(rng)
			err := b.q.Ack(actx, r)
			cancel()
			if errors.Is(err, context.DeadlineExceeded) {
				err = b.q.Ack(ctx, r) // a retry is safe
			}
			if err != nil {
				fail("ack %s/%s: %v", r.Queue, r.ID, err)
			}
		}
		consume := func(rng *rand.Rand, dctx context.Context, queue string, n int) (int, error) {
			runs, err := b.q.Dequeue(dctx, env, queue, n)
			if err != nil && len(runs) > 0 {
				fail("dequeue returned runs with an error: %v", err)
			}
			if len(runs) > n {
				fail("dequeue of %d got %d", n, len(runs))
			}
			for _, r := range runs {
				mu.Lock()
				served[r.Queue+"/"+r.ID]++
				mu.Unlock()
				ack(rng, r)
			}
			return len(runs), err
		}
		var producing sync.WaitGroup
		var done atomic.Bool
		for w := range producers {
			producing.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(w), 1))
				for i := range per {
					queue := queues[rng.IntN(len(queues))]
					id := fmt.Sprintf("w%d-%d", w, i)
					pctx, cancel := short(rng)
					ok, err := b.q.Enqueue(pctx, runqueue.EnqueueParams{Env: env, Queue: queue,
						Key: fmt.Sprint("k", rng.IntN(4)), ID: id, Payload: []byte(id)})
					cancel()
					v := "true"
					switch {
					case err == nil && !ok:
						v = "false"
					case errors.Is(err, context.DeadlineExceeded):
						v = "ctx"
					case err != nil:
						v = err.Error()
					}
					mu.Lock()
					told[queue+"/"+id] = v
					mu.Unlock()
				}
			})
		}
		var consuming sync.WaitGroup
		for w := range consumers {
			consuming.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(w), 2))
				for !done.Load() {
					dctx, cancel := short(rng)
					_, _ = consume(rng, dctx, queues[rng.IntN(len(queues))], 1+rng.IntN(5))
					cancel()
				}
			})
		}
		producing.Wait()
		done.Store(true)
		consuming.Wait()
		for _, queue := range queues {
			for {
				n, err := consume(rand.New(rand.NewPCG(9, 9)), ctx, queue, 100)
				require.NoError(t, err)
				if n == 0 {
					break
				}
			}
		}
		require.Empty(t, failures)
		counts := map[string]int{}
		for k, v := range told {
			counts[v]++
			switch v {
			case "true":
				require.Equal(t, 1, served[k], "run told queued: %s", k)
			case "ctx":
				require.LessOrEqual(t, served[k], 1, k)
			default:
				t.Errorf("%s: %s", k, v)
			}
		}
		total := 0
		for k, n := range served {
			require.Equal(t, 1, n, "served %d times: %s", n, k)
			require.Contains(t, told, k)
			total++
		}
		t.Logf("outcomes %v, served %d", counts, total)
		for _, queue := range queues {
			st := queueStats(t, b, queue)
			require.Zero(t, st.Ready+st.Delayed+st.InFlight, "queue %s after the drain: %+v", queue, st)
		}
		require.EqualValues(t, total, obs.enq.Load(), "Observer.Enqueued")
		require.EqualValues(t, total, obs.deq.Load(), "Observer.Dequeued")
		require.EqualValues(t, total, obs.ack.Load(), "Observer.Acked")
		obs.mu.Lock()
		for k, n := range obs.deqIDs {
			require.Equal(t, 1, n, k)
		}
		obs.mu.Unlock()
	})
}
