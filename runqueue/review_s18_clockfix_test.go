package runqueue_test

// Tests of the fixes of review s18's clock defects (TestS18ClockWorkerStepBack,
// TestS18ClockWaitPastPollInterval, TestS18ClockShardHidesReadyRuns): the
// heartbeat's extensions in the normal case and with a clock that does
// not move, the waits and the Worker's idle look with ready runs scored
// ahead of their clock, the shard consumers' look-ahead and its bound, and
// no busy loop on a shard or queue whose only work is delayed.

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// s18fCounted opens another Queue on b's prefix with b's config (and clock),
// mutate editing a copy, through a connection of its own whose commands
// the returned scriptCalls counts.
func s18fCounted(t *testing.T, b *testBundle, mutate func(*runqueue.Config)) (*runqueue.Queue, *scriptCalls) {
	t.Helper()
	counted := otherClient(t, b.client)
	calls := &scriptCalls{byName: map[string]int{}, names: scriptNames(t)}
	counted.AddHook(calls)
	cfg := b.q.Config()
	if mutate != nil {
		mutate(&cfg)
	}
	q, err := runqueue.New(b.ctx, counted, &cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	calls.reset()
	return q, calls
}

// s18fHold starts a worker on q (Concurrency 1, mutate editing its config)
// whose handler holds its run until the test ends or its context is
// cancelled; it returns once the handler has the first run.
func s18fHold(t *testing.T, q *runqueue.Queue, mutate func(*runqueue.WorkerConfig)) *runqueue.Worker {
	t.Helper()
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	w := startWorker(t, q, func(ctx context.Context, _ *runqueue.Run) error {
		select {
		case started <- struct{}{}:
		default:
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-release:
			return nil
		}
	}, func(wc *runqueue.WorkerConfig) {
		wc.Concurrency = 1
		if mutate != nil {
			mutate(wc)
		}
	})
	t.Cleanup(func() { close(release) }) // (runs before the worker's shutdown)
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker did not start the handler")
	}
	return w
}

// TestS18ClockFixHeartbeatCounts: with a clock that moves with real time
// the heartbeat extends as it did: a run fetched since the last beat is
// left alone, a lease over half an interval old by the clock is extended once,
// and one extended just now is not extended again, nor after the clock
// steps back before half an interval of real time has passed. (The
// heartbeat's ticker, at 20 min, never beats during the test: each beat is
// a call of Heartbeat.)
func TestS18ClockFixHeartbeatCounts(t *testing.T) {
	s17Flags(t, func(t *testing.T, on bool) {
		b := s17Setup(t, redistest.Real(t), on, func(cfg *runqueue.Config) { cfg.LeaseDuration = time.Hour })
		q, calls := s18fCounted(t, b, nil)
		enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "r", Payload: []byte("p")})
		w := s18fHold(t, q, func(wc *runqueue.WorkerConfig) { wc.HeartbeatInterval = 20 * time.Minute })
		extends := func() int { return calls.get()["extend"] }

		w.Heartbeat()
		require.Zero(t, extends(), "a run fetched since the last beat is left alone")
		b.clock.Advance(10*time.Minute + time.Millisecond) // over half an interval by the clock
		w.Heartbeat()
		require.Equal(t, 1, extends(), "a lease over half an interval old by the clock is extended")
		w.Heartbeat()
		require.Equal(t, 1, extends(), "a lease extended just now is not due")
		b.clock.Advance(-time.Hour)
		w.Heartbeat()
		require.Equal(t, 1, extends(), "a step back alone does not make a lease due at once")
		require.Equal(t, int64(1), queueStats(t, b, queueName).InFlight)
	})
}

// TestS18ClockFixHeartbeatStalledClock: a clock that does not move (or
// stepped back) for the rest of a handler's run: the heartbeat goes on
// extending the lease every interval of real time. Before the fix it sent
// nothing until the clock caught up.
func TestS18ClockFixHeartbeatStalledClock(t *testing.T) {
	s17Flags(t, func(t *testing.T, on bool) {
		b := s17Setup(t, redistest.Real(t), on, func(cfg *runqueue.Config) { cfg.LeaseDuration = time.Hour })
		q, calls := s18fCounted(t, b, nil)
		enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "r", Payload: []byte("p")})
		s18fHold(t, q, func(wc *runqueue.WorkerConfig) { wc.HeartbeatInterval = 50 * time.Millisecond })
		b.clock.Advance(-time.Hour) // and it stays there
		require.Eventually(t, func() bool { return calls.get()["extend"] >= 3 }, 10*time.Second, 10*time.Millisecond,
			"the heartbeat stopped with the clock: %v", calls.get())
	})
}

// TestS18ClockFixWorkerHeldAhead: the Worker's idle look, for a queue
// source and for a shard source. A producer an hour ahead enqueues two
// runs of a queue whose limit is 1; another instance holds the first; the
// worker finds nothing it may take and goes idle; the holder acks (which
// publishes nothing). The worker looks again within BlockPollInterval
// (50ms) and takes the second run: it does not wait for IdlePollInterval
// (a minute) or for the producer's score.
func TestS18ClockFixWorkerHeldAhead(t *testing.T) {
	for _, shards := range []bool{false, true} {
		name := "queue"
		if shards {
			name = "shard"
		}
		t.Run(name, func(t *testing.T) {
			s17Flags(t, func(t *testing.T, on bool) {
				b := s17Setup(t, redistest.Real(t), on, func(cfg *runqueue.Config) {
					cfg.QueueConcurrency = 1
					cfg.BlockPollInterval = 50 * time.Millisecond
				})
				producer, _ := s18cPeer(t, b, 30*time.Second, nil) // within ShardLookAhead (1m)
				s18cEnq(t, b, producer, runqueue.EnqueueParams{Key: "k", ID: "r1", Payload: []byte("1")})
				s18cEnq(t, b, producer, runqueue.EnqueueParams{Key: "k", ID: "r2", Payload: []byte("2")})
				first := dequeue(t, b, queueName, 1)
				require.Equal(t, []string{"r1"}, runIDs(first))

				q, calls := s18fCounted(t, b, nil)
				got := make(chan string, 2)
				startWorker(t, q, func(_ context.Context, r *runqueue.Run) error {
					got <- r.ID
					return nil
				}, func(wc *runqueue.WorkerConfig) {
					if shards {
						wc.Queues, wc.Shards = nil, []int{b.q.ShardOf(env)}
					}
				})
				// The worker found nothing and looked at when to look again.
				// (A queue source reads the master score and the ckIndex;
				// a shard source read the ckIndex in its fetch, then the
				// master and the ckIndex again.)
				look, n := "zscore", 1
				if shards {
					look, n = "zrange", 3
				}
				require.Eventually(t, func() bool { return calls.get()[look] >= n }, 10*time.Second, 5*time.Millisecond)
				require.NoError(t, b.q.Ack(b.ctx, first[0]))
				select {
				case id := <-got:
					require.Equal(t, "r2", id)
				case <-time.After(15 * time.Second):
					t.Fatalf("the worker did not take the run freed by the ack (IdlePollInterval is 1m): %v", calls.get())
				}
			})
		})
	}
}

// TestS18ClockFixShardAhead: runs a producer 30 s ahead enqueued are
// served at once by DequeueShardWait and by a Worker given Shards, as
// DequeueShard serves them (TestS18ClockShardHidesReadyRuns).
func TestS18ClockFixShardAhead(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		b := s17Setup(t, c, on, nil)
		shard := b.q.ShardOf(env)
		producer, _ := s18cPeer(t, b, 30*time.Second, nil) // within ShardLookAhead (1m)
		s18cEnq(t, b, producer, runqueue.EnqueueParams{Key: "k", ID: "w", Payload: []byte("w")})
		runs, err := b.q.DequeueShardWait(b.ctx, shard, 10, 5*time.Second)
		require.NoError(t, err)
		require.Equal(t, []string{"w"}, runIDs(runs), "DequeueShardWait serves a ready run written ahead")
		ackAll(t, b, runs)

		s18cEnq(t, b, producer, runqueue.EnqueueParams{Key: "k", ID: "x", Payload: []byte("x")})
		got := make(chan string, 1)
		startWorker(t, b.q, func(_ context.Context, r *runqueue.Run) error {
			got <- r.ID
			return nil
		}, func(wc *runqueue.WorkerConfig) { wc.Queues, wc.Shards = nil, []int{shard} })
		select {
		case id := <-got:
			require.Equal(t, "x", id)
		case <-time.After(15 * time.Second):
			t.Fatal("a Worker given Shards did not take a ready run written 30 s ahead")
		}
	})
}

// TestS18ClockFixDelayedNoBusyLoop: a shard whose only work is delayed (a
// run due in 2s and one due in 2h, in two queues, both within
// ShardLookAhead) and a queue whose only work is a delayed run: the
// waits and a Worker given Shards sleep until the due time (or their
// timeout), with BlockPollInterval at 10ms: a few reads, not one every
// 10ms.
func TestS18ClockFixDelayedNoBusyLoop(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		b := s17Setup(t, c, on, func(cfg *runqueue.Config) { cfg.BlockPollInterval = 10 * time.Millisecond })
		shard := b.q.ShardOf(env)
		enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "soon", Payload: []byte("s"), Delay: 2 * time.Second})
		enqueue(t, b, runqueue.EnqueueParams{Queue: "other", Key: "k", ID: "later", Payload: []byte("l"), Delay: 2 * time.Hour})
		q, calls := s18fCounted(t, b, nil)

		runs, err := q.DequeueShardWait(b.ctx, shard, 10, 500*time.Millisecond)
		require.NoError(t, err)
		require.Empty(t, runs)
		require.LessOrEqual(t, calls.get()["zrangebyscore"], 3*2, "DequeueShardWait polled a shard with only delayed work: %v", calls.get())

		calls.reset()
		runs, err = q.DequeueWait(b.ctx, env, queueName, 10, 500*time.Millisecond)
		require.NoError(t, err)
		require.Empty(t, runs)
		require.LessOrEqual(t, calls.get()["dequeue"], 3, "DequeueWait polled a queue with only delayed work: %v", calls.get())

		calls.reset()
		startWorker(t, q, func(context.Context, *runqueue.Run) error { return nil },
			func(wc *runqueue.WorkerConfig) { wc.Queues, wc.Shards = nil, []int{shard} })
		time.Sleep(500 * time.Millisecond)
		require.LessOrEqual(t, calls.get()["zrangebyscore"], 3*2, "the worker polled a shard with only delayed work: %v", calls.get())
		require.Equal(t, int64(1), queueStats(t, b, queueName).Delayed)
	})
}

// TestS18ClockFixShardLookAheadBound: with ShardLookAhead at a minute, a
// producer two minutes ahead hides its ready run from DequeueShard for the
// excess: served once the consumer's clock is a minute on, not before;
// DequeueShardWait meanwhile waits without polling. With a negative
// ShardLookAhead a shard consumer reads only up to its now (a producer a
// minute ahead: served a minute later). The field is validated and
// defaults to 1m.
func TestS18ClockFixShardLookAheadBound(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		b := s17Setup(t, c, on, func(cfg *runqueue.Config) {
			cfg.ShardLookAhead = time.Minute
			cfg.BlockPollInterval = 10 * time.Millisecond
		})
		shard := b.q.ShardOf(env)
		producer, _ := s18cPeer(t, b, 2*time.Minute, nil)
		s18cEnq(t, b, producer, runqueue.EnqueueParams{Key: "k", ID: "r", Payload: []byte("r")})
		q, calls := s18fCounted(t, b, nil)
		runs, err := q.DequeueShardWait(b.ctx, shard, 10, 300*time.Millisecond)
		require.NoError(t, err)
		require.Empty(t, runs, "ahead by more than ShardLookAhead")
		require.LessOrEqual(t, calls.get()["zrangebyscore"], 3*2, "the wait polled: %v", calls.get())
		b.clock.Advance(time.Minute - time.Millisecond)
		runs, err = b.q.DequeueShard(b.ctx, shard, 10)
		require.NoError(t, err)
		require.Empty(t, runs)
		b.clock.Advance(time.Millisecond)
		runs, err = b.q.DequeueShard(b.ctx, shard, 10)
		require.NoError(t, err)
		require.Equal(t, []string{"r"}, runIDs(runs), "within ShardLookAhead of the producer's clock")
		ackAll(t, b, runs)

		// A consumer without look ahead, a minute behind the producer.
		off, offClock := s18cPeer(t, b, 0, func(cfg *runqueue.Config) { cfg.ShardLookAhead = -1 })
		s18cEnq(t, b, producer, runqueue.EnqueueParams{Key: "k", ID: "s", Payload: []byte("s")})
		runs, err = off.DequeueShard(b.ctx, shard, 10)
		require.NoError(t, err)
		require.Empty(t, runs, "no look ahead")
		offClock.Advance(time.Minute)
		runs, err = off.DequeueShard(b.ctx, shard, 10)
		require.NoError(t, err)
		require.Equal(t, []string{"s"}, runIDs(runs))
		require.NoError(t, off.Ack(b.ctx, runs[0]))

		require.Equal(t, time.Minute, (&runqueue.Config{}).WithDefaults().ShardLookAhead)
		_, err = runqueue.New(b.ctx, c, &runqueue.Config{Prefix: redistest.Prefix(t), ShardLookAhead: runqueue.MaxDuration + 1})
		var inv *runqueue.InvalidError
		require.ErrorAs(t, err, &inv)
		require.Equal(t, "Config.ShardLookAhead", inv.Field)
	})
}
