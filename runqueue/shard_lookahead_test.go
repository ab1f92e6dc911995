package runqueue_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// TestDequeueShardAheadQueueRecheckedWithinASecond: a queue whose only
// work is a retry backing off is read by a shard call's look-ahead and
// found without ready runs; a writer whose clock is ahead then queues a
// ready run in it, scored after the retry (so the queue's master score
// stays). The run is served within a second of the consumer's clock. The
// look-ahead remembered the queue as holding none until its score, so
// the run waited for the retry's time: 30 s for a retry in 30 s and a
// writer 45 s ahead, 59 s for 59 s and 59.5 s (helper-161).
func TestDequeueShardAheadQueueRecheckedWithinASecond(t *testing.T) {
	t.Parallel()
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		for _, s := range []struct{ retry, skew time.Duration }{
			{30 * time.Second, 45 * time.Second},
			{59 * time.Second, 59500 * time.Millisecond},
			{30 * time.Second, 90 * time.Second}, // past ShardLookAhead (1m); its queue is within it
		} {
			b := s17Setup(t, c, on, nil)
			shard := b.q.ShardOf(env)
			enqueue(t, b, runqueue.EnqueueParams{Key: "slow", ID: "d"})
			runs := dequeue(t, b, queueName, 1)
			require.Len(t, runs, 1)
			_, err := b.q.Nack(b.ctx, runs[0], &runqueue.NackOptions{RetryAt: b.clock.Now().Add(s.retry)})
			require.NoError(t, err)
			got, err := b.q.DequeueShard(b.ctx, shard, 10)
			require.NoError(t, err)
			require.Empty(t, got, "the retry is not due")
			w, _ := s18cPeer(t, b, s.skew, nil)
			s18cEnq(t, b, w, runqueue.EnqueueParams{Key: "k", ID: "x"})
			waited := time.Duration(-1)
			for step := time.Duration(0); step <= 2*time.Minute; step += 100 * time.Millisecond {
				got, err := b.q.DequeueShard(b.ctx, shard, 10)
				require.NoError(t, err)
				if len(got) > 0 {
					require.Equal(t, "x", got[0].ID)
					waited = step
					break
				}
				b.clock.Advance(100 * time.Millisecond)
			}
			require.GreaterOrEqual(t, waited, time.Duration(0), "x never served")
			require.LessOrEqual(t, waited, time.Second,
				"retry in %v, writer ahead %v: x served after %v of the consumer's clock", s.retry, s.skew, waited)
		}
	})
}

// TestDequeueShardAheadEnvTakesItsShare: an env whose only ready run was
// written by a writer ahead (within ShardLookAhead) is served by the first
// shard call, beside an env whose backlog fills every call: the look-ahead
// plans its queues with the due ones. Before, only a call the due queues
// left short looked ahead, so the env waited out the whole skew (a writer
// 30 s ahead, calls of 5 every 100 ms: call 300; helper-161). A writer
// 5 minutes ahead hides it for the excess over the look-ahead (4 minutes).
func TestDequeueShardAheadEnvTakesItsShare(t *testing.T) {
	t.Parallel()
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		for _, skew := range []time.Duration{time.Second, 30 * time.Second, 59 * time.Second, 5 * time.Minute} {
			b := s17Setup(t, c, on, nil)
			late, shard := busyBeside(t, b, 2000)
			w, _ := s18cPeer(t, b, skew, nil)
			s18cEnq(t, b, w, runqueue.EnqueueParams{Env: late, Key: "x", ID: "x"})
			const step = time.Second
			served := -1
			for call := range 400 {
				runs, err := b.q.DequeueShard(b.ctx, shard, 5)
				require.NoError(t, err)
				require.Len(t, runs, 5, "busy's backlog fills every call")
				for _, r := range runs {
					if r.Env == late {
						served = call
					}
				}
				ackAll(t, b, runs)
				if served >= 0 {
					break
				}
				b.clock.Advance(step)
			}
			bound := 0 // ceil(2 envs / 5): the first call
			if excess := skew - time.Minute; excess > 0 {
				bound = int(excess / step)
			}
			require.GreaterOrEqual(t, served, 0, "writer ahead %v: late env never served", skew)
			require.LessOrEqual(t, served, bound, "writer ahead %v: late env first served at call %d", skew, served)
		}
	})
}

// TestDequeueShardAheadBrokenQueueStopsNothing: a queue in the look-ahead
// window whose ready index is of the wrong type (a hand edit) holds no
// ready run for the look-ahead, and the calls serve the other envs. Since
// the look-ahead reads in every call (f2f880e), the read's WRONGTYPE failed
// every shard call until the queue was due (helper-163: 30 of 45 calls of
// 5, 1 s apart, failed; a Worker handled nothing for 4 s).
func TestDequeueShardAheadBrokenQueueStopsNothing(t *testing.T) {
	t.Parallel()
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		b := s17Setup(t, c, on, nil)
		late, shard := busyBeside(t, b, 100)
		enqueue(t, b, runqueue.EnqueueParams{Env: late, Queue: "q", Key: "d", ID: "d", Delay: 30 * time.Second})
		ck := keySpace(t, b).Env(late).Queue("q").CkIndex()
		require.NoError(t, b.client.Set(b.ctx, ck, "not a sorted set", 0).Err())
		for call := range 10 {
			runs, err := b.q.DequeueShard(b.ctx, shard, 5)
			require.NoError(t, err, "call %d", call)
			require.Len(t, runs, 5, "call %d", call)
			ackAll(t, b, runs)
			b.clock.Advance(time.Second)
		}
	})
}

// tickClock is a clock that runs from base as the wall clock does.
type tickClock struct{ base, start time.Time }

func (c *tickClock) Now() time.Time { return c.base.Add(time.Since(c.start)) }

// TestDequeueShardWaitAheadRecheck: a DequeueShardWait on a shard whose
// only work is a retry due in 30 s, the look-ahead having found that
// queue without ready runs just before; a writer 45 s ahead then queues a
// ready run there (the queue's score stays the retry's). The wait returns
// it within about the second the look-ahead trusts what it found. Before,
// the wait, woken by the write within that second, found the queue still
// trusted idle and slept until its score (helper-163: a 5 s wait returned
// the run only at its deadline; with the retry in 6 s, at 6 s).
func TestDequeueShardWaitAheadRecheck(t *testing.T) {
	t.Parallel()
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		clk := &tickClock{base: newFakeClock().Now(), start: time.Now()}
		b := s17Setup(t, c, on, func(cfg *runqueue.Config) { cfg.Clock = clk })
		shard := b.q.ShardOf(env)
		enqueue(t, b, runqueue.EnqueueParams{Key: "slow", ID: "d"})
		runs := dequeue(t, b, queueName, 1)
		require.Len(t, runs, 1)
		_, err := b.q.Nack(b.ctx, runs[0], &runqueue.NackOptions{RetryAt: clk.Now().Add(30 * time.Second)})
		require.NoError(t, err)
		got, err := b.q.DequeueShard(b.ctx, shard, 10)
		require.NoError(t, err)
		require.Empty(t, got)
		start := time.Now()
		type result struct {
			runs []*runqueue.Run
			err  error
			took time.Duration
		}
		done := make(chan result, 1)
		go func() {
			runs, err := b.q.DequeueShardWait(b.ctx, shard, 10, 10*time.Second)
			done <- result{runs, err, time.Since(start)}
		}()
		time.Sleep(300 * time.Millisecond)
		w, _ := s18cPeer(t, b, 45*time.Second, nil)
		s18cEnq(t, b, w, runqueue.EnqueueParams{Key: "k", ID: "x"})
		r := <-done
		require.NoError(t, r.err)
		require.Equal(t, []string{"x"}, runIDs(r.runs))
		// The look-ahead's second, and room for a slow machine: well below
		// the 10 s the wait would otherwise last.
		require.Less(t, r.took, 5*time.Second, "x returned after %v", r.took)
	})
}

// TestDequeueShardWaitAheadMarksWakeTogether: a DequeueShardWait beside
// ten queues whose only work is a retry in the look-ahead window, each
// first found idle 100 ms after the one before, looks again about once a
// second for them all. With each queue looked at again a second after its
// own finding, the wait woke once for each (helper-164: 62 reads of the
// shard's master in 3 s, about 31 shard calls; an idle Worker beside 60
// such queues, 60 calls a second).
func TestDequeueShardWaitAheadMarksWakeTogether(t *testing.T) {
	t.Parallel()
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		clk := &tickClock{base: newFakeClock().Now(), start: time.Now()}
		b := s17Setup(t, c, on, func(cfg *runqueue.Config) { cfg.Clock = clk })
		o := otherClient(t, b.client)
		counter := countCommands(o, "")
		cfg := *b.cfg
		q, err := runqueue.New(b.ctx, o, &cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = q.Close() })
		shard := q.ShardOf(env)
		for i := range 10 {
			qn := fmt.Sprint("q", i)
			enqueue(t, b, runqueue.EnqueueParams{Queue: qn, Key: "slow", ID: "d" + qn})
			runs := dequeue(t, b, qn, 1)
			require.Len(t, runs, 1)
			_, err := b.q.Nack(b.ctx, runs[0], &runqueue.NackOptions{RetryAt: clk.Now().Add(30 * time.Second)})
			require.NoError(t, err)
			got, err := q.DequeueShard(b.ctx, shard, 10)
			require.NoError(t, err)
			require.Empty(t, got)
			time.Sleep(100 * time.Millisecond)
		}
		before, _ := counter.snapshot()
		got, err := q.DequeueShardWait(b.ctx, shard, 10, 3*time.Second)
		require.NoError(t, err)
		require.Empty(t, got)
		after, _ := counter.snapshot()
		// A shard call reads the master twice (due, look-ahead) and
		// shardNext once more; about one look a second for 3 s, with room.
		reads := after["zrangebyscore"] - before["zrangebyscore"]
		require.LessOrEqual(t, reads, 16, "reads of the master in a 3 s wait: %v", after)
	})
}

// busyBeside queues n ready runs of env "busy" (4 keys of queueName) and
// returns another env on its shard, and the shard.
func busyBeside(t *testing.T, b *testBundle, n int) (late string, shard int) {
	t.Helper()
	const busy = "busy"
	shard = b.q.ShardOf(busy)
	for i := 0; late == "" && i < 1000; i++ {
		if e := fmt.Sprint("late", i); b.q.ShardOf(e) == shard {
			late = e
		}
	}
	require.NotEmpty(t, late, "no env on %s's shard", busy)
	enqueueMany(t, b, n, func(i int) runqueue.EnqueueParams {
		return runqueue.EnqueueParams{Env: busy, Queue: queueName, Key: fmt.Sprint("k", i%4), ID: fmt.Sprint("b", i)}
	})
	return late, shard
}
