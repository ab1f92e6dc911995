package runqueue_test

// Session 32 review of commit 4215fdd: PurgeDeadLetters reads the dead runs
// to delete (ZRANGEBYSCORE ... LIMIT limit), then names them to the purge
// script with its time bound.

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// s32Dead makes n dead runs r0..r(n-1) of queueName under key "k", all
// dead at the clock's now.
func s32Dead(t *testing.T, b *testBundle, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: fmt.Sprintf("r%d", i)})
	}
	runs := dequeue(t, b, queueName, n)
	require.Len(t, runs, n)
	for _, r := range runs {
		res, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{DeadLetter: true})
		require.NoError(t, err)
		require.False(t, res.Requeued)
	}
}

// TestS32PurgeExactBoundAndEncodings: runs whose ids and keys need
// encoding (':', '=', '%', unicode, spaces) that died exactly at the bound
// go, those a millisecond after stay; records go with them and the queue
// and env dead counts stay exact. DeleteDeadLetter of one such run too.
func TestS32PurgeExactBoundAndEncodings(t *testing.T) {
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		ids := []string{"a:b", "=x", "é:ü", "50%", "sp ace", "a=b:c=d", "::", "日本"}
		qn := "q:=é"
		for i, id := range ids {
			enqueue(t, b, runqueue.EnqueueParams{Queue: qn, Key: fmt.Sprintf("k:%d=é", i%3), ID: id})
		}
		runs := dequeue(t, b, qn, len(ids))
		require.Len(t, runs, len(ids))
		at := b.clock.Now()
		for i, r := range runs {
			if i == len(runs)/2 {
				b.clock.Advance(time.Millisecond)
			}
			_, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{DeadLetter: true})
			require.NoError(t, err)
		}
		half := len(ids) / 2
		n, err := b.q.PurgeDeadLetters(b.ctx, env, qn, at, 10000)
		require.NoError(t, err)
		require.Equal(t, half, n)
		st := queueStats(t, b, qn)
		require.Equal(t, int64(len(ids)-half), st.Dead)
		es, err := b.q.EnvStats(b.ctx, env)
		require.NoError(t, err)
		require.Equal(t, int64(len(ids)-half), es.Dead)
		left, err := b.q.DeadLetters(b.ctx, env, qn, 0, 100)
		require.NoError(t, err)
		require.Len(t, left, len(ids)-half)
		for _, d := range left {
			require.Equal(t, at.Add(time.Millisecond).UnixMilli(), d.DiedAt.UnixMilli())
		}
		require.NoError(t, b.q.DeleteDeadLetter(b.ctx, env, qn, left[0].Key, left[0].ID))
		n, err = b.q.PurgeDeadLetters(b.ctx, env, qn, at.Add(time.Millisecond), 10000)
		require.NoError(t, err)
		require.Equal(t, len(ids)-half-1, n)
		st = queueStats(t, b, qn)
		require.Equal(t, runqueue.Stats{}, st)
		es, err = b.q.EnvStats(b.ctx, env)
		require.NoError(t, err)
		require.Zero(t, es.Dead)
		// Every id is free again.
		for _, id := range ids {
			enqueue(t, b, runqueue.EnqueueParams{Queue: qn, ID: id})
		}
	})
}

// TestS32PurgeConcurrent: purgers looping "while it returns limit", a
// redriver and a deleter on the same dead runs: the env and queue dead
// counts stay exact, and every record of a deleted run goes.
func TestS32PurgeConcurrent(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, nil)
		const n = 300
		enqueueMany(t, b, n, func(i int) runqueue.EnqueueParams {
			return runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprintf("k%d", i%7), ID: fmt.Sprintf("r%d", i)}
		})
		var runs []*runqueue.Run
		for len(runs) < n {
			rs := dequeue(t, b, queueName, 100)
			require.NotEmpty(t, rs)
			runs = append(runs, rs...)
		}
		for _, r := range runs {
			_, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{DeadLetter: true})
			require.NoError(t, err)
		}
		bound := b.clock.Now()
		var wg sync.WaitGroup
		var deleted atomic.Int64
		for w := 0; w < 4; w++ {
			wg.Go(func() {
				for {
					k, err := b.q.PurgeDeadLetters(b.ctx, env, queueName, bound, 7)
					if err != nil {
						t.Errorf("purge: %v", err)
						return
					}
					deleted.Add(int64(k))
					if k == 0 {
						return
					}
				}
			})
		}
		var redriven atomic.Int64
		wg.Go(func() {
			for i := 0; i < n; i += 5 {
				err := b.q.Redrive(b.ctx, env, queueName, fmt.Sprintf("k%d", i%7), fmt.Sprintf("r%d", i))
				if err == nil {
					// Redrive of a purged run fails with ErrNotFound; it
					// succeeds for a dead one (or a live one).
					redriven.Add(1)
				}
			}
		})
		wg.Go(func() {
			for i := 1; i < n; i += 5 {
				err := b.q.DeleteDeadLetter(b.ctx, env, queueName, fmt.Sprintf("k%d", i%7), fmt.Sprintf("r%d", i))
				if err == nil {
					deleted.Add(1)
				}
			}
		})
		wg.Wait()
		// Finish: whatever is still dead by the bound goes.
		for {
			k, err := b.q.PurgeDeadLetters(b.ctx, env, queueName, bound, 10000)
			require.NoError(t, err)
			deleted.Add(int64(k))
			if k == 0 {
				break
			}
		}
		st := queueStats(t, b, queueName)
		require.Zero(t, st.Dead)
		es, err := b.q.EnvStats(b.ctx, env)
		require.NoError(t, err)
		require.Zero(t, es.Dead)
		require.Equal(t, int64(n), deleted.Load()+st.Ready+st.Delayed+st.InFlight,
			"deleted %d, redriven calls %d, stats %+v", deleted.Load(), redriven.Load(), st)
		space := keySpace(t, b)
		h, err := c.HLen(b.ctx, space.Env(env).Queue(queueName).Runs()).Result()
		require.NoError(t, err)
		require.Equal(t, st.Ready+st.Delayed+st.InFlight, h, "records left")
	})
}

// TestS32PurgeReadOnly: a ReadOnly Queue's purge and delete are refused
// and send nothing.
func TestS32PurgeReadOnly(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, nil)
		s32Dead(t, b, 2)
		var sent atomic.Int64
		o := otherClient(t, c)
		cfg := *b.cfg
		cfg.ReadOnly = true
		q, err := runqueue.New(b.ctx, o, &cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = q.Close() })
		o.AddHook(afterEach(func(cmd redis.Cmder, err error) { sent.Add(1) }))
		_, err = q.PurgeDeadLetters(b.ctx, env, queueName, b.clock.Now(), 10)
		require.ErrorIs(t, err, runqueue.ErrReadOnly)
		require.ErrorIs(t, q.DeleteDeadLetter(b.ctx, env, queueName, "k", "r0"), runqueue.ErrReadOnly)
		require.Zero(t, sent.Load())
		require.Equal(t, int64(2), queueStats(t, b, queueName).Dead)
	})
}

// TestS32PurgeLimit10000Cost: 10000 runs named in one call, on a private
// real Redis: all go, and the script's time a run is near the documented
// "about 5 µs a run deleted (Redis 7.0), some 50 ms at limit 10000".
func TestS32PurgeLimit10000Cost(t *testing.T) {
	c := redistest.Private(t)
	b := setup(t, c, func(cfg *runqueue.Config) { cfg.ScriptsOnly = true })
	const n = 10000
	enqueueMany(t, b, n, func(i int) runqueue.EnqueueParams {
		return runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprintf("k%d", i%50), ID: fmt.Sprintf("r%05d", i),
			Payload: []byte("some payload of a few dozen bytes, as a reference")}
	})
	var runs []*runqueue.Run
	for len(runs) < n {
		rs := dequeue(t, b, queueName, 1000)
		require.NotEmpty(t, rs)
		runs = append(runs, rs...)
	}
	for _, r := range runs {
		_, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{DeadLetter: true})
		require.NoError(t, err)
	}
	require.NoError(t, redistest.ResetStats(b.ctx, c))
	start := time.Now()
	k, err := b.q.PurgeDeadLetters(b.ctx, env, queueName, b.clock.Now(), n)
	wall := time.Since(start)
	require.NoError(t, err)
	require.Equal(t, n, k)
	st, err := redistest.CommandStats(b.ctx, c)
	require.NoError(t, err)
	t.Logf("server %s; wall %v; scripts %+v; total %+v; all %+v", redistest.Source(), wall, st.Scripts(), st.Total(), st)
	require.Zero(t, queueStats(t, b, queueName).Dead)
}
