package runqueue_test

import (
	"fmt"
	"sort"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// TestTopLags checks the bounded lag reader against Schedule, which reads
// every key: the k largest lags of the competing keys are the same.
func TestTopLags(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		t.Run("MatchesSchedule", func(t *testing.T) {
			t.Parallel()
			b := setup(t, c, func(cfg *runqueue.Config) {
				cfg.VtimeScheduling = true
				cfg.KeyConcurrency = 2
			})
			const nkeys = 40
			for i := range nkeys {
				key := fmt.Sprintf("k%02d", i)
				// Distinct weights give distinct lags after a serve.
				require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, key, 0.01*float64(i+1)))
				for j := range 3 {
					enqueue(t, b, runqueue.EnqueueParams{Key: key, ID: fmt.Sprintf("%s-%d", key, j)})
				}
			}
			// Serve some keys up to their limit (gated); every serve moves
			// a key's tag by 1/weight.
			dequeue(t, b, queueName, 50)
			sched, err := b.q.Schedule(b.ctx, env, queueName, 10)
			require.NoError(t, err)
			var want []runqueue.KeyLag
			gated := 0
			for _, k := range sched.Keys {
				switch {
				case k.Gated:
					gated++
				case k.Registered && k.Reason != "waiting in the newcomer lane":
					want = append(want, runqueue.KeyLag{Key: k.Key, Lag: k.Lag})
				}
			}
			sort.SliceStable(want, func(i, j int) bool { return want[i].Lag > want[j].Lag })
			require.Greater(t, len(want), 10, "the case must have competing keys")
			require.Positive(t, gated, "the case must have gated keys (left out)")

			for _, k := range []int{1, 5, 10, len(want), len(want) + 5} {
				got, err := b.q.TopLags(b.ctx, env, queueName, k)
				require.NoError(t, err)
				require.Equal(t, want[:min(k, len(want))], got, "k=%d", k)
			}
		})

		t.Run("EmptyWithoutState", func(t *testing.T) {
			t.Parallel()
			b := setup(t, c, nil) // flag off: no scheduler state is written
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "1"})
			got, err := b.q.TopLags(b.ctx, env, queueName, 10)
			require.NoError(t, err)
			require.Empty(t, got)
			_, err = b.q.TopLags(b.ctx, env, queueName, 0)
			require.ErrorIs(t, err, runqueue.ErrInvalid)
		})
	})
}

// TestActiveQueues checks the queue listing metrics discover queues with:
// only queues with queued runs, every shard's in turn, bounded by limit.
func TestActiveQueues(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, func(cfg *runqueue.Config) { cfg.Shards = 4 })
		want := map[runqueue.QueueRef]bool{}
		for e := range 6 {
			for q := range 3 {
				ref := runqueue.QueueRef{Env: fmt.Sprintf("env%d", e), Queue: fmt.Sprintf("q%d", q)}
				want[ref] = true
				_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: ref.Env, Queue: ref.Queue, ID: "1"})
				require.NoError(t, err)
			}
		}
		// A queue whose only run is in flight holds no queued run.
		_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: "env0", Queue: "busy", ID: "1"})
		require.NoError(t, err)
		runs, err := b.q.Dequeue(b.ctx, "env0", "busy", 1)
		require.NoError(t, err)
		require.Len(t, runs, 1)

		all, total, err := b.q.ActiveQueues(b.ctx, 100)
		require.NoError(t, err)
		require.EqualValues(t, len(want), total)
		got := map[runqueue.QueueRef]bool{}
		for _, r := range all {
			got[r] = true
		}
		require.Equal(t, want, got)

		some, total, err := b.q.ActiveQueues(b.ctx, 5)
		require.NoError(t, err)
		require.EqualValues(t, len(want), total)
		require.Len(t, some, 5)
		shards := map[int]bool{}
		for _, r := range some {
			require.True(t, want[r])
			shards[b.q.ShardOf(r.Env)] = true
		}
		// Taken in turn: the first ones come from every shard that has any.
		used := map[int]bool{}
		for r := range want {
			used[b.q.ShardOf(r.Env)] = true
		}
		require.Equal(t, min(len(used), 5), len(shards))
	})
}
