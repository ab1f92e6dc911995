package runqueue_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// callCounter is a go-redis hook that counts the client's calls: one a
// command sent alone, one a pipeline or transaction (one round trip, or
// one per node of a cluster, sent together).
type callCounter struct{ n atomic.Int64 }

func (c *callCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *callCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

func (c *callCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmds)
	}
}

// countedClient is a client of its own to c's server (or cluster), whose
// calls are counted: the shared clients carry other tests' traffic.
func countedClient(t *testing.T, c redis.UniversalClient) (redis.UniversalClient, *callCounter) {
	t.Helper()
	var own redis.UniversalClient
	switch c := c.(type) {
	case *redis.ClusterClient:
		own = redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Options().Addrs})
	case *redis.Client:
		own = redis.NewClient(&redis.Options{Addr: c.Options().Addr})
	default:
		t.Fatalf("unsupported client %T", c)
	}
	t.Cleanup(func() { _ = own.Close() })
	cc := &callCounter{}
	own.AddHook(cc)
	return own, cc
}

// TestStatsReadInFewRoundTrips: EnvStats reads its queues in pipelines (a
// few round trips whatever their number, where it made one to three a
// queue, one queue after another) and DeadLetters the dead runs' records
// in one; both report what the per-queue and per-run calls report.
func TestStatsReadInFewRoundTrips(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		own, calls := countedClient(t, c)
		b := setup(t, own, nil)
		const queues = 300
		var runs []runqueue.EnqueueParams
		var ready, delayed int64 // (a delay of 0 is ready at once)
		for i := range queues {
			queue := fmt.Sprintf("q%d", i)
			runs = append(runs,
				runqueue.EnqueueParams{Env: "e", Queue: queue, Key: "a", ID: "1", Priority: i % 3},
				runqueue.EnqueueParams{Env: "e", Queue: queue, Key: "b", ID: "2"})
			if i%4 == 0 {
				runs = append(runs, runqueue.EnqueueParams{Env: "e", Queue: queue, ID: "3", Delay: time.Duration(i%7) * time.Second})
				if i%7 == 0 {
					ready++
				} else {
					delayed++
				}
			}
			ready += 2
			if len(runs) >= 200 || i == queues-1 {
				_, err := b.q.EnqueueMany(b.ctx, runs)
				require.NoError(t, err)
				runs = runs[:0]
			}
			b.clock.Advance(7 * time.Millisecond)
		}
		// Dead runs of their own queue, with payloads, attempts and priorities.
		const dead = 150
		for i := range dead {
			runs = append(runs, runqueue.EnqueueParams{Env: "e", Queue: "dq", Key: fmt.Sprintf("k%d", i%5),
				ID: fmt.Sprintf("d%d", i), Payload: []byte(fmt.Sprintf("payload %d", i)), Priority: i % 10})
		}
		_, err := b.q.EnqueueMany(b.ctx, runs)
		require.NoError(t, err)
		held, err := b.q.Dequeue(b.ctx, "e", "dq", dead)
		require.NoError(t, err)
		require.Len(t, held, dead)
		for _, r := range held {
			b.clock.Advance(time.Millisecond)
			_, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{DeadLetter: true})
			require.NoError(t, err)
		}
		b.clock.Advance(3 * time.Second) // some delayed runs due, some not

		// What the per-queue calls report, summed as EnvStats documents.
		var want runqueue.Stats
		for i := range queues {
			s, err := b.q.QueueStats(b.ctx, "e", fmt.Sprintf("q%d", i))
			require.NoError(t, err)
			want.Ready += s.Ready
			want.Delayed += s.Delayed
			want.OldestReadyAge = max(want.OldestReadyAge, s.OldestReadyAge)
		}
		ds, err := b.q.QueueStats(b.ctx, "e", "dq")
		require.NoError(t, err)
		want.Dead = ds.Dead
		require.Equal(t, ready, want.Ready)
		require.Equal(t, delayed, want.Delayed)
		require.Equal(t, int64(dead), want.Dead)
		require.Positive(t, want.OldestReadyAge)

		before := calls.n.Load()
		got, err := b.q.EnvStats(b.ctx, "e")
		require.NoError(t, err)
		n := calls.n.Load() - before
		require.Equal(t, want, got)
		// The env's queue list, three pipelines, the dead counts, the
		// in-flight count.
		require.LessOrEqual(t, n, int64(6), "EnvStats over %d queues made %d calls", queues, n)

		before = calls.n.Load()
		list, err := b.q.DeadLetters(b.ctx, "e", "dq", 0, dead)
		require.NoError(t, err)
		n = calls.n.Load() - before
		require.LessOrEqual(t, n, int64(2), "DeadLetters of %d runs made %d calls", dead, n)
		require.Len(t, list, dead)
		for _, d := range list {
			one, err := b.q.DeadLetter(b.ctx, "e", "dq", d.Key, d.ID)
			require.NoError(t, err)
			require.Equal(t, one, d)
			var i int
			_, err = fmt.Sscanf(d.ID, "d%d", &i)
			require.NoError(t, err)
			require.Equal(t, fmt.Sprintf("payload %d", i), string(d.Payload))
			require.Equal(t, i%10, d.Priority)
			require.Equal(t, 2, d.Attempt)
		}
	})
}
