package runqueue

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
)

// purgeClock is a settable Clock.
type purgeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *purgeClock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *purgeClock) set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }

// TestPurgeKeepsRunsDeadSinceItsRead: PurgeDeadLetters reads the runs to
// delete, then names them to the script with its time. A run redriven and
// dead again between the two (at a time after diedBefore) is not deleted,
// and one still dead from before is. The script is called as
// PurgeDeadLetters calls it, after a read that saw both.
func TestPurgeKeepsRunsDeadSinceItsRead(t *testing.T) {
	redistest.ForEachBackend(t, []redistest.Backend{
		{Name: "Mini", Client: redistest.Mini},
		{Name: "Real", Client: redistest.Real},
		{Name: "Cluster", Client: redistest.Cluster},
	}, func(t *testing.T, c redis.UniversalClient) {
		for _, on := range []bool{false, true} {
			ctx := context.Background()
			clock := &purgeClock{t: time.UnixMilli(2_000_000_000_000)}
			q, err := New(ctx, c, &Config{Prefix: redistest.Prefix(t), Clock: clock, VtimeScheduling: on})
			require.NoError(t, err)
			t.Cleanup(func() { _ = q.Close() })
			const env, queue = "e", "q"
			die := func(id string) {
				_, err := q.Enqueue(ctx, EnqueueParams{Env: env, Queue: queue, Key: "k", ID: id})
				require.NoError(t, err)
				runs, err := q.Dequeue(ctx, env, queue, 1)
				require.NoError(t, err)
				require.Len(t, runs, 1)
				_, err = q.Nack(ctx, runs[0], &NackOptions{DeadLetter: true})
				require.NoError(t, err)
			}
			die("a")
			die("b")
			before := clock.Now()
			qk := q.space.Env(env).Queue(queue)
			read, err := c.ZRangeByScore(ctx, qk.Dead(), &redis.ZRangeBy{Min: "-inf", Max: strconv.FormatInt(before.UnixMilli(), 10)}).Result()
			require.NoError(t, err)
			require.ElementsMatch(t, []string{
				keys.RunMember(keys.Ref{Env: env, Queue: queue, Key: "k", ID: "a"}),
				keys.RunMember(keys.Ref{Env: env, Queue: queue, Key: "k", ID: "b"}),
			}, read)
			// b is redriven and dies again, a second later.
			clock.set(before.Add(time.Second))
			require.NoError(t, q.Redrive(ctx, env, queue, "k", "b"))
			runs, err := q.Dequeue(ctx, env, queue, 1)
			require.NoError(t, err)
			require.Len(t, runs, 1)
			_, err = q.Nack(ctx, runs[0], &NackOptions{DeadLetter: true})
			require.NoError(t, err)

			n, err := q.purge(ctx, qk, strconv.FormatInt(before.UnixMilli(), 10), read...)
			require.NoError(t, err)
			require.Equal(t, 1, n, "a only")
			_, err = q.DeadLetter(ctx, env, queue, "k", "a")
			require.ErrorIs(t, err, ErrNotFound)
			d, err := q.DeadLetter(ctx, env, queue, "k", "b")
			require.NoError(t, err, "b died after the time")
			require.Equal(t, before.Add(time.Second).UnixMilli(), d.DiedAt.UnixMilli())
			st, err := q.QueueStats(ctx, env, queue)
			require.NoError(t, err)
			require.Equal(t, int64(1), st.Dead)
			// The same call again (a resend) deletes nothing more.
			n, err = q.purge(ctx, qk, strconv.FormatInt(before.UnixMilli(), 10), read...)
			require.NoError(t, err)
			require.Zero(t, n)
		}
	})
}
