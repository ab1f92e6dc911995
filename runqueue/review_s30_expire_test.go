package runqueue_test

// Session 30 review: TTL expiry with the scheduler on while keys are held
// at their limit, drain, are weighted and churn: no scheduler entry left
// behind may stop a key from being served afterwards, and counts at rest
// add up.

import (
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

func TestS30ExpireChurnThenServe(t *testing.T) {
	t.Parallel()
	s30Backends(t, func(t *testing.T, c redis.UniversalClient) {
		for seed := int64(1); seed <= 3; seed++ {
			b := setup(t, c, func(cfg *runqueue.Config) {
				cfg.VtimeScheduling = true
				cfg.KeyConcurrency = 1
				cfg.ScanLimit = 40
			})
			ctx := b.ctx
			rng := rand.New(rand.NewSource(seed))
			const nKeys = 60
			var held []*runqueue.Run
			n := 0
			for round := 0; round < 12; round++ {
				var ps []runqueue.EnqueueParams
				for i := 0; i < 40; i++ {
					k := rng.Intn(nKeys)
					p := runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprintf("k%02d", k),
						ID: fmt.Sprintf("r%d", n), TTL: time.Duration(1+rng.Intn(3)) * time.Second}
					if rng.Intn(4) == 0 {
						p.Delay = time.Duration(rng.Intn(2000)) * time.Millisecond
					}
					n++
					ps = append(ps, p)
				}
				_, err := b.q.EnqueueMany(ctx, ps)
				require.NoError(t, err)
				if round%4 == 0 {
					require.NoError(t, b.q.SetWeight(ctx, env, queueName, fmt.Sprintf("k%02d", rng.Intn(nKeys)), []float64{0.01, 0.5, 5}[rng.Intn(3)]))
				}
				runs, err := b.q.Dequeue(ctx, env, queueName, 1+rng.Intn(8))
				require.NoError(t, err)
				held = append(held, runs...)
				// Settle some held runs.
				rng.Shuffle(len(held), func(i, j int) { held[i], held[j] = held[j], held[i] })
				keep := held[:0]
				for _, r := range held {
					switch rng.Intn(4) {
					case 0:
						require.NoError(t, b.q.Ack(ctx, r))
					case 1:
						_, err := b.q.Nack(ctx, r, &runqueue.NackOptions{RetryAt: b.clock.Now()})
						require.NoError(t, err)
					default:
						keep = append(keep, r)
					}
				}
				held = keep
				b.clock.Advance(time.Duration(rng.Intn(1500)) * time.Millisecond)
				_, err = b.q.ExpireTTL(ctx, b.q.ShardOf(env), 100000)
				require.NoError(t, err)
			}
			// Everything queued expires; the held runs are acked.
			b.clock.Advance(10 * time.Second)
			// Promote due delayed runs (nacked ones carry no TTL) by serving.
			for {
				_, err := b.q.ExpireTTL(ctx, b.q.ShardOf(env), 100000)
				require.NoError(t, err)
				runs, err := b.q.Dequeue(ctx, env, queueName, 100)
				require.NoError(t, err)
				if len(runs) == 0 {
					if len(held) == 0 {
						break
					}
				}
				for _, r := range append(held, runs...) {
					require.NoError(t, b.q.Ack(ctx, r))
				}
				held = nil
			}
			st := queueStats(t, b, queueName)
			require.Equal(t, runqueue.Stats{}, st, "seed %d: at rest", seed)
			// One fresh run per key: every dequeue of 1 must serve, and
			// every key is served within nKeys calls.
			for k := 0; k < nKeys; k++ {
				enqueue(t, b, runqueue.EnqueueParams{Key: fmt.Sprintf("k%02d", k), ID: fmt.Sprintf("fresh%d", k)})
			}
			seen := map[string]bool{}
			for call := 0; call < nKeys; call++ {
				runs, err := b.q.Dequeue(ctx, env, queueName, 1)
				require.NoError(t, err)
				require.Len(t, runs, 1, "seed %d: call %d served nothing with %d keys unserved; schedule %+v",
					seed, call, nKeys-len(seen), s30Sched(t, b))
				seen[runs[0].Key] = true
				require.NoError(t, b.q.Ack(ctx, runs[0]))
			}
			require.Len(t, seen, nKeys)
			require.Equal(t, runqueue.Stats{}, queueStats(t, b, queueName))
			s30Rest(t, b)
		}
	})
}

func s30Sched(t *testing.T, b *testBundle) any {
	s, err := b.q.Schedule(b.ctx, env, queueName, 1)
	if err != nil {
		return err
	}
	return s
}
