package runqueue_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// sameShardEnvs returns two env names that hash to the same shard.
func sameShardEnvs(t testing.TB, q *runqueue.Queue) (string, string) {
	t.Helper()
	big := "big"
	for i := range 10000 {
		small := fmt.Sprintf("small-%d", i)
		if q.ShardOf(small) == q.ShardOf(big) {
			return big, small
		}
	}
	t.Fatal("no env shares a shard with big")
	return "", ""
}

// shardDrain dequeues from shard with maxCount until a call returns nothing,
// and returns the calls' runs.
func shardDrain(t testing.TB, b *testBundle, shard, maxCount int, ack bool) [][]*runqueue.Run {
	t.Helper()
	var calls [][]*runqueue.Run
	for {
		runs, err := b.q.DequeueShard(b.ctx, shard, maxCount)
		require.NoError(t, err)
		if len(runs) == 0 {
			return calls
		}
		calls = append(calls, runs)
		if ack {
			ackAll(t, b, runs)
		}
		require.Less(t, len(calls), 100000, "drain does not end")
	}
}

// TestDequeueShardNoStarvation: an env with one ready run is served within
// two shard calls, while another env of the same shard has a backlog of
// thousands of older runs, whatever the instance's rotation state and batch
// size.
func TestDequeueShardNoStarvation(t *testing.T) {
	t.Parallel()
	// miniredis runs Lua slowly (about 2 ms an enqueue under -race), so it
	// gets a smaller backlog; the shard master holds queues, not runs, so
	// the backlog's size does not change what DequeueShard sees.
	for _, bk := range []struct {
		backend
		backlog int
	}{{backend{Name: "Mini", Client: redistest.Mini}, 2000}, {backend{Name: "Real", Client: redistest.Real}, 5000}} {
		t.Run(bk.Name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, bk.Client(t), nil)
			big, small := sameShardEnvs(t, b.q)
			shard := b.q.ShardOf(big)
			enqueueMany(t, b, bk.backlog, func(i int) runqueue.EnqueueParams {
				return runqueue.EnqueueParams{Env: big, Queue: fmt.Sprintf("q%d", i%3), Key: fmt.Sprintf("k%d", i%7), ID: fmt.Sprint(i)}
			})
			b.clock.Advance(time.Minute)
			// The small env's run is younger than the whole backlog, so age
			// order alone would serve it last.
			for round, maxCount := range []int{1, 1, 1, 2, 10} {
				id := fmt.Sprint("s", round)
				enqueue(t, b, runqueue.EnqueueParams{Env: small, ID: id})
				var got []string
				for range 2 {
					runs, err := b.q.DequeueShard(b.ctx, shard, maxCount)
					require.NoError(t, err)
					require.Len(t, runs, maxCount, "the backlog fills every call")
					got = append(got, runIDs(runs)...)
					ackAll(t, b, runs)
				}
				require.Contains(t, got, id, "round %d (maxCount %d): the small env waited more than two calls", round, maxCount)
				b.clock.Advance(time.Second)
			}
		})
	}
}

// TestDequeueShardQueues checks that DequeueShard serves every queue of an
// env, shares one call among them, and drains everything exactly once.
func TestDequeueShardQueues(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, nil)
		queues := []string{"a", "b", "c"}
		want := map[string]bool{}
		for i := range 60 {
			q := queues[i%3]
			id := fmt.Sprint(q, i)
			enqueue(t, b, runqueue.EnqueueParams{Queue: q, Key: fmt.Sprint(i % 4), ID: id})
			want[q+"/"+id] = true
			b.clock.Advance(time.Millisecond)
		}
		calls := shardDrain(t, b, b.q.ShardOf(env), 9, true)
		first := map[string]int{}
		for _, r := range calls[0] {
			first[r.Queue]++
		}
		require.Equal(t, map[string]int{"a": 3, "b": 3, "c": 3}, first, "one call is shared among the queues")
		got := map[string]bool{}
		for _, runs := range calls {
			for _, r := range runs {
				k := r.Queue + "/" + r.ID
				require.False(t, got[k], "%s served twice", k)
				got[k] = true
			}
		}
		require.Equal(t, want, got)
		require.Empty(t, b.keysUnder(t))
	})
}

// TestDequeueShardLimits checks that the env, queue and key limits hold
// through DequeueShard, and that an env held by its limit does not take
// another env's turn.
func TestDequeueShardLimits(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, func(c *runqueue.Config) {
			c.LimitsFor = func(env, queue string) runqueue.Limits {
				return runqueue.Limits{Env: 5, Queue: 3, Key: 1}
			}
		})
		big, small := sameShardEnvs(t, b.q)
		shard := b.q.ShardOf(big)
		for _, q := range []string{"q1", "q2", "q3"} {
			for k := range 4 {
				for i := range 3 {
					enqueue(t, b, runqueue.EnqueueParams{Env: big, Queue: q, Key: fmt.Sprint(k), ID: fmt.Sprint(k, "-", i)})
				}
			}
		}
		runs, err := b.q.DequeueShard(b.ctx, shard, 100)
		require.NoError(t, err)
		require.Len(t, runs, 5, "the env limit")
		perQueue, perKey := map[string]int{}, map[string]int{}
		for _, r := range runs {
			perQueue[r.Queue]++
			perKey[r.Queue+"/"+r.Key]++
		}
		for q, n := range perQueue {
			require.LessOrEqual(t, n, 3, "queue %s", q)
		}
		for k, n := range perKey {
			require.Equal(t, 1, n, "key %s", k)
		}
		more, err := b.q.DequeueShard(b.ctx, shard, 100)
		require.NoError(t, err)
		require.Empty(t, more)
		es, err := b.q.EnvStats(b.ctx, big)
		require.NoError(t, err)
		require.Equal(t, int64(5), es.InFlight)

		// The big env is at its limit; a small env on the same shard is
		// served in the first call.
		enqueue(t, b, runqueue.EnqueueParams{Env: small, ID: "s"})
		got, err := b.q.DequeueShard(b.ctx, shard, 1)
		require.NoError(t, err)
		require.Equal(t, []string{"s"}, runIDs(got))
		require.Equal(t, small, got[0].Env)

		// An ack frees exactly one slot of the big env.
		require.NoError(t, b.q.Ack(b.ctx, runs[0]))
		next, err := b.q.DequeueShard(b.ctx, shard, 100)
		require.NoError(t, err)
		require.Len(t, next, 1)
		require.Equal(t, big, next[0].Env)
	})
}
