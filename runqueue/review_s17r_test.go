package runqueue_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// Reviewer s17r: adversarial checks of the s17 fixes.

// TestS17RWorkerReleaseClockBefore1970: a Worker holds a run whose handler
// ignores nothing but is slow; the clock then reads before 1970 and the
// worker is shut down with a deadline, so it releases the run (requeue).
//
// DEFECT (fixed since: release and heartbeat check the clock and write
// nothing when it is out of range): Worker.release (worker.go) built its
// requeue calls with w.q.now() and no checkNow, so the forced shutdown writes the run back
// with available_at -100000000 (record "0|2|0|-100000000|...", ready
// score -1e8, and with the flag on a negative scheduler origin x), which
// the fix says no writing call may do ("nothing written"); the run is
// later delivered with AvailableAt in 1969. Expected: the release is
// refused (the run left to lease recovery). Fix: checkNow in
// Worker.release, and in Worker.heartbeat (it writes now+lease as a lease
// deadline).
func TestS17RWorkerReleaseClockBefore1970(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			c := redistest.Mini(t)
			b := setup(t, c, func(cfg *runqueue.Config) {
				cfg.VtimeScheduling = on
				cfg.LeaseDuration = time.Minute
			})
			good := b.clock.Now()
			enqueue(t, b, runqueue.EnqueueParams{ID: "a", Payload: []byte("x")})
			started := make(chan struct{}, 1)
			w, err := runqueue.NewWorker(b.q, func(ctx context.Context, r *runqueue.Run) error {
				started <- struct{}{}
				<-ctx.Done()
				return ctx.Err()
			}, &runqueue.WorkerConfig{Queues: []runqueue.WorkerQueue{{Env: env, Queue: queueName}}, Concurrency: 1})
			require.NoError(t, err)
			require.NoError(t, w.Start(context.Background()))
			select {
			case <-started:
			case <-time.After(5 * time.Second):
				t.Fatal("the handler never ran")
			}
			s17SetClock(b.clock, time.Unix(-100000, 0))
			sctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			_ = w.Shutdown(sctx)
			cancel()
			s17SetClock(b.clock, good.Add(2*time.Minute))
			_, err = b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 10)
			require.NoError(t, err)
			runs, err := b.q.Dequeue(b.ctx, env, queueName, 10)
			require.NoError(t, err, "the queue must work once the clock is right")
			require.Equal(t, []string{"a"}, runIDs(runs))
			require.False(t, runs[0].AvailableAt.Before(time.Unix(0, 0)),
				"the release stored available_at %v, before 1970", runs[0].AvailableAt)
		})
	}
}

// TestS17RLayoutKeyEvicted: with AllowEviction, the layout version key (a
// string read only by New: the least recently used key of the prefix, the
// first an LRU policy evicts) is evicted while this build's queues hold
// runs. The next New of the same build (a restart, a new worker) must
// start.
//
// DEFECT (fixed since: with AllowEviction New records the version again,
// as before, documented at Config.AllowEviction and LayoutVersion):
// checkLayout treated "no version, but data" as layout 1 and
// refuses with a *LayoutError; before the change New re-recorded the
// version. Under AllowEviction (the config the s17 eviction fixes are
// about) one eviction of the layout key stops every later New until an
// operator SETs it by hand. Fix: tell layout-1 data from this layout's by
// a key only layouts >= 2 write (e.g. a shard's token counter, or record
// the version also in each shard's master key as a member), or skip the
// refusal when AllowEviction is set and data of the current layout is
// found.
func TestS17RLayoutKeyEvicted(t *testing.T) {
	c := redistest.Mini(t)
	b := setup(t, c, func(cfg *runqueue.Config) { cfg.AllowEviction = true })
	enqueue(t, b, runqueue.EnqueueParams{ID: "a", Payload: []byte("x")})
	require.NoError(t, c.Del(b.ctx, "{"+b.prefix+":0}:layout").Err()) // evicted
	q2, err := runqueue.New(b.ctx, c, &runqueue.Config{Prefix: b.prefix, Clock: b.clock, AllowEviction: true})
	if q2 != nil {
		_ = q2.Close()
	}
	require.NoError(t, err, "a restart of the same build after the layout key was evicted")
}

// TestS17RLayoutNewsRace: two News on an empty prefix at once both start,
// and the version is recorded once.
func TestS17RLayoutNewsRace(t *testing.T) {
	c := redistest.Mini(t)
	prefix := redistest.Prefix(t)
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			q, err := runqueue.New(context.Background(), c, &runqueue.Config{Prefix: prefix})
			if q != nil {
				_ = q.Close()
			}
			errs <- err
		}()
	}
	for range 8 {
		require.NoError(t, <-errs)
	}
	v, err := c.Get(context.Background(), "{"+prefix+":0}:layout").Result()
	require.NoError(t, err)
	require.Equal(t, fmt.Sprint(runqueue.LayoutVersion), v)
}

// TestS17RKeyStatsDueDelayed: a run whose delay passed with no consumer
// running shows in QueueStats as waiting (OldestReadyAge > 0).
//
// DEFECT (fixed since: KeyStats reads the key's delayed head too):
// KeyStats, which returns the same Stats, reported "delayed,
// age 0" for that key: it measures the age only when Ready > 0. The Stats
// doc now says a due delayed run "counts in Delayed but is waiting"; the
// key's and the queue's reports of the one run disagree. Fix: in
// KeyStats, also read the head of the variant's delayed set (ZRANGE
// WITHSCORES 0 0) and take max(ready age, now - its score) when due.
func TestS17RKeyStatsDueDelayed(t *testing.T) {
	c := redistest.Mini(t)
	b := setup(t, c, nil)
	enqueue(t, b, runqueue.EnqueueParams{ID: "a", Key: "k", Payload: []byte("x"), Delay: time.Second})
	b.clock.Advance(time.Minute)
	qs := queueStats(t, b, queueName)
	require.Equal(t, int64(1), qs.Delayed)
	require.Equal(t, time.Minute-time.Second, qs.OldestReadyAge, "QueueStats counts the due delayed run")
	ks, err := b.q.KeyStats(b.ctx, env, queueName, "k")
	require.NoError(t, err)
	require.Equal(t, int64(1), ks.Delayed)
	require.Equal(t, qs.OldestReadyAge, ks.OldestReadyAge, "KeyStats of the run's key must agree")
}

// TestS17RDueDelayedAgeAfterPromotion: once a dequeue promoted and served
// every delayed run of a variant, the due-delayed age is gone (delayIndex
// holds no stale entry); a future delayed run gives no age.
func TestS17RDueDelayedAgeAfterPromotion(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			b := setup(t, redistest.Mini(t), func(cfg *runqueue.Config) { cfg.VtimeScheduling = on })
			enqueue(t, b, runqueue.EnqueueParams{ID: "a", Key: "k", Payload: []byte("x"), Delay: time.Second})
			enqueue(t, b, runqueue.EnqueueParams{ID: "b", Key: "k2", Payload: []byte("x"), Delay: time.Hour})
			b.clock.Advance(time.Minute)
			runs := dequeue(t, b, queueName, 10)
			require.Equal(t, []string{"a"}, runIDs(runs))
			s := queueStats(t, b, queueName)
			require.Equal(t, runqueue.Stats{Delayed: 1, InFlight: 1}, s)
		})
	}
}

// TestS17RShardEnvCursor: one shard, three envs each with a backlog,
// DequeueShard(1) serves them in turn; an env that appears sorting before
// the others (once: before the env cursor; since 2fc3401 the shard's
// credit decides) and an env that vanishes keep the rotation going.
func TestS17RShardEnvCursor(t *testing.T) {
	b := setup(t, redistest.Mini(t), func(cfg *runqueue.Config) { cfg.Shards = 1 })
	for _, e := range []string{"b", "c", "d"} {
		for i := range 3 {
			enqueue(t, b, runqueue.EnqueueParams{Env: e, Queue: "q", ID: fmt.Sprint(e, i), Payload: []byte("x")})
		}
	}
	b.clock.Advance(time.Second)
	next := func() string {
		t.Helper()
		runs, err := b.q.DequeueShard(b.ctx, 0, 1)
		require.NoError(t, err)
		require.Len(t, runs, 1)
		return runs[0].Env
	}
	var got []string
	for range 3 {
		got = append(got, next())
	}
	require.ElementsMatch(t, []string{"b", "c", "d"}, got, "each env once in three calls")
	last := got[2]
	// A new env sorting before every other.
	enqueue(t, b, runqueue.EnqueueParams{Env: "a", Queue: "q", ID: "a0", Payload: []byte("x")})
	seen := map[string]bool{}
	for range 4 {
		seen[next()] = true
	}
	require.Len(t, seen, 4, "four envs in four calls after %s", last)
	// d vanishes (drained): the rotation goes on over the others.
	for {
		runs, err := b.q.Dequeue(b.ctx, "d", "q", 10)
		require.NoError(t, err)
		if len(runs) == 0 {
			break
		}
	}
	seen = map[string]bool{}
	for range 2 {
		seen[next()] = true
	}
	require.Len(t, seen, 2)
}

// TestS17REvictedServedCounts: the runs hash of a queue whose ready runs
// (one with a TTL) are held at the key limit is evicted; a Dequeue, an
// AckAndDequeue and a coalesced Dequeue meeting the orphans deliver none,
// leave nothing in flight (queue, key, env, leases), and ExpireTTL then
// cleans the TTL entry the dequeue left.
func TestS17REvictedServedCounts(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			c := redistest.Mini(t)
			b := setup(t, c, func(cfg *runqueue.Config) {
				cfg.VtimeScheduling = on
				cfg.AllowEviction = true
				cfg.EnvConcurrency = 2
			})
			for i := range 3 {
				enqueue(t, b, runqueue.EnqueueParams{Key: fmt.Sprint("k", i), ID: fmt.Sprint("r", i), Payload: []byte("x"),
					TTL: time.Hour})
			}
			space := keySpace(t, b)
			qk := space.Env(env).Queue(queueName)
			require.NoError(t, c.Del(b.ctx, qk.Runs()).Err()) // evicted
			runs, err := b.q.Dequeue(b.ctx, env, queueName, 1)
			require.NoError(t, err)
			require.Empty(t, runs)
			_, _, err = b.q.AckAndDequeue(b.ctx, nil, env, queueName, 1)
			require.NoError(t, err)
			runs, err = b.q.Dequeue(b.ctx, env, queueName, 10)
			require.NoError(t, err)
			require.Empty(t, runs)
			require.Equal(t, runqueue.Stats{}, queueStats(t, b, queueName))
			es, err := b.q.EnvStats(b.ctx, env)
			require.NoError(t, err)
			require.Equal(t, runqueue.Stats{}, es)
			sh := space.Shard(b.q.ShardOf(env))
			require.Zero(t, c.ZCard(b.ctx, sh.Leases()).Val(), "no lease left")
			require.Zero(t, c.HLen(b.ctx, qk.KeyInflight()).Val(), "no key in flight")
			// The env's limit of 2 is whole again: two new runs are served.
			for i := range 2 {
				enqueue(t, b, runqueue.EnqueueParams{Key: "n", ID: fmt.Sprint("n", i), Payload: []byte("x")})
			}
			b.clock.Advance(time.Millisecond)
			runs, err = b.q.Dequeue(b.ctx, env, queueName, 10)
			require.NoError(t, err)
			require.Len(t, runs, 2)
			ackAll(t, b, runs)
			b.clock.Advance(2 * time.Hour)
			_, err = b.q.ExpireTTL(b.ctx, b.q.ShardOf(env), 100)
			require.NoError(t, err)
			require.Zero(t, c.ZCard(b.ctx, sh.TTL()).Val(), "no TTL entry left")
		})
	}
}

// TestS17RTopLagsFlagOffValidates: TopLags with the flag off still
// refuses a bad k (empty only for valid calls).
func TestS17RTopLagsFlagOffValidates(t *testing.T) {
	b := setup(t, redistest.Mini(t), nil)
	_, err := b.q.TopLags(b.ctx, env, queueName, 0)
	require.ErrorIs(t, err, runqueue.ErrInvalid)
	lags, err := b.q.TopLags(b.ctx, env, queueName, 5)
	require.NoError(t, err)
	require.Empty(t, lags)
}

// TestS17RShardFailingQueueDoesNotBlock: one env's queue whose dequeue
// keeps failing (here LimitsFor refuses it) must not stop DequeueShard from
// serving the shard's other envs. Its failure is the queue's own, so a
// call passes over it and serves the next env: the other envs take every
// call; with nothing else to serve, a call returns the failure. (Before the failing queue was passed over, it failed the call in
// each of its env's turns: 3 of 9 calls, the other envs 3 runs each.)
func TestS17RShardFailingQueueDoesNotBlock(t *testing.T) {
	b := setup(t, redistest.Mini(t), func(cfg *runqueue.Config) {
		cfg.Shards = 1
		cfg.LimitsFor = func(env, _ string) runqueue.Limits {
			if env == "bad" {
				return runqueue.Limits{Key: -1}
			}
			return runqueue.Limits{}
		}
	})
	for _, e := range []string{"a", "bad", "c"} {
		for i := range 4 {
			enqueue(t, b, runqueue.EnqueueParams{Env: e, Queue: "q", ID: fmt.Sprint(e, i), Payload: []byte("x")})
		}
	}
	served := map[string]int{}
	for range 8 {
		runs, err := b.q.DequeueShard(b.ctx, 0, 1)
		require.NoError(t, err, "the failing queue is passed over")
		require.Len(t, runs, 1)
		served[runs[0].Env]++
	}
	require.Equal(t, map[string]int{"a": 4, "c": 4}, served, "the other envs take every call")
	runs, err := b.q.DequeueShard(b.ctx, 0, 1)
	require.Empty(t, runs)
	require.ErrorIs(t, err, runqueue.ErrInvalid, "with nothing else served, the failure is returned")
}

// TestS17RWorkerAcksWhileLimitsRefused: Config.LimitsFor starts refusing a
// queue (a negative limit) while a Worker's handler runs. The Worker's
// fetches fail from then on, but the finished run's ack is made (alone) and
// settled once, as an ack: it is not delivered again when its lease passes,
// and Shutdown leaves nothing unsettled.
func TestS17RWorkerAcksWhileLimitsRefused(t *testing.T) {
	t.Parallel()
	var lim atomic.Pointer[runqueue.Limits]
	lim.Store(&runqueue.Limits{})
	o := newS16Observer()
	b := setup(t, redistest.Mini(t), func(c *runqueue.Config) {
		c.Observer = o
		c.LimitsFor = func(string, string) runqueue.Limits { return *lim.Load() }
	})
	started, finish := make(chan struct{}), make(chan struct{})
	w := startWorker(t, b.q, func(ctx context.Context, r *runqueue.Run) error {
		close(started)
		<-finish
		return nil
	}, func(c *runqueue.WorkerConfig) { c.Concurrency = 1 })
	enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
	waitClosed(t, started)
	lim.Store(&runqueue.Limits{Queue: -1})
	close(finish)
	require.Equal(t, runqueue.OutcomeAck, o.next(t), "the finished run is settled as an ack")
	require.Equal(t, runqueue.Stats{}, queueStats(t, b, queueName), "acked: nothing held or queued")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, w.Shutdown(ctx), "nothing left unsettled")
}
