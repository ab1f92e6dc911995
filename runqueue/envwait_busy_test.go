package runqueue_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// helper-207's audit of the env's waiting line (many Queues with different
// polls, co-consumers stopping in turn): three ways a queue's mark held the
// env's free slots while no consumer of the queue could take them.

// TestEnvWaitingBusyWorkerLeaves: env limit 2, both slots held by plain
// takes of qa. A Worker X (Concurrency 1) over qb and qc marks both; qd's
// Worker waits behind them. One slot frees: X takes it for the first of
// its queues in line, and its one handler keeps that run. The second slot
// frees: it is left to the mark of X's other queue, whose source is woken
// but has no handler slot. It leaves the line (the slot goes on to qd);
// before, the slot sat idle until X's handler ended or the mark lapsed
// (helper-207: an env below its limit for 5.7 s of every 6 s).
func TestEnvWaitingBusyWorkerLeaves(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b, _ := ewSetup(t, c, true, 2)
		ewEnqueue(t, b, "qa", 2)
		ewEnqueue(t, b, "qb", 2)
		ewEnqueue(t, b, "qc", 2)
		ewEnqueue(t, b, "qd", 1)
		a, _, err := b.q.AckAndDequeue(b.ctx, nil, env, "qa", 2)
		require.NoError(t, err)
		require.Len(t, a, 2)
		hold := make(chan struct{})
		defer close(hold)
		xGot := make(chan string, 4)
		startWorker(t, b.q, func(_ context.Context, r *runqueue.Run) error {
			xGot <- r.Queue
			<-hold
			return nil
		}, func(cfg *runqueue.WorkerConfig) {
			cfg.Queues = []runqueue.WorkerQueue{{Env: env, Queue: "qb"}, {Env: env, Queue: "qc"}}
			cfg.Concurrency = 1
		})
		ewWaits(t, b, "qb")
		ewWaits(t, b, "qc")
		dGot := make(chan string, 1)
		startWorker(t, b.q, ewServed(dGot), ewOver("qd"))
		ewWaits(t, b, "qd")
		require.NoError(t, b.q.Ack(b.ctx, a[0]))
		var first string
		select {
		case first = <-xGot:
		case <-time.After(20 * time.Second):
			t.Fatal("X not served the first free slot in 20 s")
		}
		other := map[string]string{"qb": "qc", "qc": "qb"}[first]
		require.True(t, ewMarked(t, b, other), "X's other queue still waits in line")
		require.NoError(t, b.q.Ack(b.ctx, a[1]))
		ewWithin(t, dGot, "qd, while X's handler is busy and the slot was left to "+other)
		select {
		case q := <-xGot:
			t.Fatalf("X ran a second run (%s) with Concurrency 1", q)
		default:
		}
	})
}

// TestEnvWaitingRenewalKeepsLongerLife: a Worker with a 30 s poll waits on
// qb (its mark lives 61 s); a consumer of qb on another Queue with a poll
// of 200 ms makes a held call: the renewal keeps the mark's place and its
// longer life. Before, it cut the life to its own (1.4 s): the mark lapsed
// long before the 30 s Worker's next call, and a slot freed then went to
// the queues behind (helper-207: qb not served in 25 s, qa served 6 times).
func TestEnvWaitingRenewalKeepsLongerLife(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b, line := ewSetup(t, c, true, 1)
		ewEnqueue(t, b, "qa", 1)
		ewEnqueue(t, b, "qb", 2)
		require.Len(t, ewTake(t, b, nil, "qa"), 1)
		startWorker(t, b.q, ewNop, ewOver("qb"))
		ewWaits(t, b, "qb")
		member := keys.QueueMember(env, "qb")
		place, err := b.client.ZScore(b.ctx, line, member).Result()
		require.NoError(t, err)
		before := ewUntil(t, b, "qb")
		require.Greater(t, before, ewServerMs(t, b)+30_000, "the Worker's mark lives two of its polls and a second")
		short := ewPeer(t, b, b.clock, 200*time.Millisecond, 1)
		runs, _, err := short.AckAndDequeue(b.ctx, nil, env, "qb", 1)
		require.NoError(t, err)
		require.Empty(t, runs, "the env is full")
		again, err := b.client.ZScore(b.ctx, line, member).Result()
		require.NoError(t, err)
		require.Equal(t, place, again, "the held call renews qb's mark in its place")
		require.GreaterOrEqual(t, ewUntil(t, b, "qb"), before, "and keeps its longer life")
	})
}

// TestEnvWaitingDequeueWaitLeaves: env limit 1, qa holds the slot; a
// DequeueWait of qb is held (it marks qb) and ends empty, by its timeout
// or its ctx: qb's mark is cut to the leaving grace (before, it lived two
// polls and a second, 61 s here, every free slot of the env left to it:
// helper-207, the env idle 59 s). A caller that waits again at once renews
// the mark in its place.
func TestEnvWaitingDequeueWaitLeaves(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"timeout", "ctx"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
				b, line := ewSetup(t, c, true, 1)
				ewEnqueue(t, b, "qa", 1)
				ewEnqueue(t, b, "qb", 1)
				require.Len(t, ewTake(t, b, nil, "qa"), 1)
				wait := func() {
					var runs []*runqueue.Run
					var err error
					if how == "timeout" {
						runs, err = b.q.DequeueWait(b.ctx, env, "qb", 1, 50*time.Millisecond)
						require.NoError(t, err)
					} else {
						ctx, cancel := context.WithTimeout(b.ctx, 50*time.Millisecond)
						runs, err = b.q.DequeueWait(ctx, env, "qb", 1, time.Minute)
						cancel()
						require.ErrorIs(t, err, context.DeadlineExceeded)
					}
					require.Empty(t, runs, "the env's slot is qa's")
				}
				wait()
				require.True(t, ewMarked(t, b, "qb"), "the wait's held tries marked qb")
				require.LessOrEqual(t, ewUntil(t, b, "qb"), ewServerMs(t, b)+500, "the wait that ended cut qb's mark to the grace")
				place, err := b.client.ZScore(b.ctx, line, keys.QueueMember(env, "qb")).Result()
				require.NoError(t, err)
				runs, _, err := b.q.AckAndDequeue(b.ctx, nil, env, "qb", 1)
				require.NoError(t, err)
				require.Empty(t, runs)
				again, err := b.client.ZScore(b.ctx, line, keys.QueueMember(env, "qb")).Result()
				require.NoError(t, err)
				require.Equal(t, place, again, "a caller that waits again within the grace keeps qb's place")
				require.Greater(t, ewUntil(t, b, "qb"), ewServerMs(t, b)+30_000, "and its mark lives on")
			})
		})
	}
}

// TestEnvWaitingShardWorkerLeaves: env limit 1, a plain take of qa holds
// the slot; a Worker over the env's shard finds qb's run held by the env
// (its DequeueShard call marks qb) and stops gracefully: it leaves the line
// for the queues its calls got fewer runs of, so qb's mark is cut to the
// grace, and the slot qa's Ack frees goes to qc's Worker, which waits
// behind. Before, a shard Worker left its marks to lapse (helper-207: 61 s
// at a 30 s poll, the env served once in 20 s).
func TestEnvWaitingShardWorkerLeaves(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b, _ := ewSetup(t, c, true, 1)
		ewEnqueue(t, b, "qa", 1)
		a := ewTake(t, b, nil, "qa")
		require.Len(t, a, 1)
		ewEnqueue(t, b, "qb", 1)
		ws := startWorker(t, b.q, ewNop, func(cfg *runqueue.WorkerConfig) {
			cfg.Queues, cfg.Shards = nil, []int{b.q.ShardOf(env)}
		})
		ewWaits(t, b, "qb")
		shutdown(t, ws)
		require.LessOrEqual(t, ewUntil(t, b, "qb"), ewServerMs(t, b)+500, "the stopped shard Worker cut qb's mark to the grace")
		ewEnqueue(t, b, "qc", 1)
		served := make(chan string, 1)
		startWorker(t, b.q, ewServed(served), ewOver("qc"))
		ewWaits(t, b, "qc")
		require.NoError(t, b.q.Ack(b.ctx, a[0]))
		ewWithin(t, served, "qc, behind the stopped shard Worker's queue")
	})
}

// TestEnvWaitingDequeueWaitCoWaiterStays: two DequeueWaits of qb on one
// Queue, both held by the env; the one with the shorter timeout ends while
// the other still waits: it does not leave the line (no leave's wake-up
// for qb on the shard's channel), since the other keeps the mark (each
// waiter ending in turn made the rest try again: helper-209, 20 waiters
// made 70-76 calls against 23). When the last one ends, it leaves.
func TestEnvWaitingDequeueWaitCoWaiterStays(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b, _ := ewSetup(t, c, true, 1)
		ewEnqueue(t, b, "qa", 1)
		ewEnqueue(t, b, "qb", 1)
		require.Len(t, ewTake(t, b, nil, "qa"), 1)
		sp := ewSpace(t, b)
		channel := sp.Env(env).Queue("qb").Wake()
		member := keys.QueueMember(env, "qb")
		sub := c.Subscribe(b.ctx, channel)
		defer sub.Close()
		_, err := sub.Receive(b.ctx) // (the subscription's confirmation)
		require.NoError(t, err)
		// wakes reads the channel up to a sentinel published now: the
		// messages published before it, in order.
		wakes := func(sentinel string) (n int) {
			require.NoError(t, c.Publish(b.ctx, channel, sentinel).Err())
			for {
				msg, err := sub.ReceiveMessage(b.ctx)
				require.NoError(t, err)
				if msg.Payload == sentinel {
					return n
				}
				if msg.Payload == member {
					n++
				}
			}
		}
		long := make(chan error, 1)
		ctx, cancel := context.WithCancel(b.ctx)
		defer cancel()
		go func() {
			runs, err := b.q.DequeueWait(ctx, env, "qb", 1, time.Minute)
			if err == nil && len(runs) > 0 {
				err = fmt.Errorf("served %d runs with the env full", len(runs))
			}
			long <- err
		}()
		ewWaits(t, b, "qb")
		require.Zero(t, wakes("s0"))
		runs, err := b.q.DequeueWait(b.ctx, env, "qb", 1, 50*time.Millisecond)
		require.NoError(t, err)
		require.Empty(t, runs)
		require.Zero(t, wakes("s1"), "the co-waiter still waits: no leave")
		require.Greater(t, ewUntil(t, b, "qb"), ewServerMs(t, b)+30_000, "qb's mark keeps its life")
		cancel()
		require.ErrorIs(t, <-long, context.Canceled)
		require.Equal(t, 1, wakes("s2"), "the last waiter leaves (its leave wakes qb's consumers)")
		require.LessOrEqual(t, ewUntil(t, b, "qb"), ewServerMs(t, b)+500)
	})
}
