package runqueue_test

// helper-193's review of 100f94d (place_soonest, dueDelayed). Figures in
// the report. WakeStorm and StormLooks only log what they measure (compare
// with the parent commit). These fail on 100f94d and pass on its parent
// (but BulkSameTime/k0=false, the commit's own fix) and with the fix in
// the report: SameTimeNoWake, BulkSameTime/k0=true,
// ShardHeldDelayedSpendsEarlyLook, ShardPollDeferred (its ShardWorker
// case needs the same poll-phase fix in the Worker's fetch loop).

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

// q000Wake is the wake channel of env a's queue q000.
func q000Wake(t *testing.T, b *testBundle) string {
	t.Helper()
	return keySpace(t, b).Env("a").Queue("q000").Wake()
}

// wakeCount subscribes to the wake channel wake (a shard's), runs write,
// then publishes a marker and counts the wake-ups before it (the channel
// delivers in order: a wake-up comes before the marker or was never sent).
func wakeCount(t *testing.T, b *testBundle, c redis.UniversalClient, wake string, write func()) int {
	t.Helper()
	sub := c.Subscribe(b.ctx, wake)
	defer func() { _ = sub.Close() }()
	_, err := sub.Receive(b.ctx)
	require.NoError(t, err)
	write()
	const marker = "marker"
	require.NoError(t, c.Publish(b.ctx, wake, marker).Err())
	n := 0
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	for {
		msg, err := sub.ReceiveMessage(ctx)
		require.NoError(t, err)
		if msg.Payload == marker {
			return n
		}
		n++
	}
}

// TestReviewH193WakeStorm: wake-ups published by n = 30 delayed writes of
// new keys into env a's q000, one Enqueue each, after a first delayed run
// (key k0 at T = now + 1 h), in an idle queue (only that delayed work) and
// beside held work (key h at KeyConcurrency 1, a run held): all at T
// (same time), or at T-1 ms, T-2 ms, ... (decreasing). None of these runs
// is due within any poll; a waiter needs no wake-up for any of them.
func TestReviewH193WakeStorm(t *testing.T) {
	const n = 30
	for _, on := range []bool{false, true} {
		for _, held := range []bool{false, true} {
			for _, order := range []string{"same", "decreasing"} {
				t.Run(fmt.Sprintf("vtime=%v/held=%v/%s", on, held, order), func(t *testing.T) {
					forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
						b := setup(t, c, func(cfg *runqueue.Config) {
							cfg.VtimeScheduling, cfg.Shards, cfg.KeyConcurrency = on, 1, 1
							cfg.LeaseDuration = time.Hour
						})
						if held {
							heldQueues(t, b, "a", 0, 1)
						}
						T := b.clock.Now().Add(time.Hour)
						enqueue(t, b, runqueue.EnqueueParams{Env: "a", Queue: "q000", Key: "k0", ID: "k0", AvailableAt: T})
						got := wakeCount(t, b, c, q000Wake(t, b), func() {
							for i := 1; i <= n; i++ {
								at := T
								if order == "decreasing" {
									at = T.Add(-time.Duration(i) * time.Millisecond)
								}
								enqueue(t, b, runqueue.EnqueueParams{Env: "a", Queue: "q000", Key: fmt.Sprint("k", i), ID: fmt.Sprint("k", i), AvailableAt: at})
							}
						})
						t.Logf("%d delayed writes (%s, held=%v): %d wake-ups", n, order, held, got)
						if order == "same" {
							require.Zero(t, got, "runs due with the queue's first delayed work tell no waiter")
						} else {
							// Each the queue's earliest delayed work: an idle
							// queue's master score moves at each (so before
							// 100f94d too); beside held work each is the first
							// due after now.
							require.Equal(t, n, got, "each earlier run is the queue's next work")
						}
					})
				})
			}
		}
	}
}

// TestReviewH193SameTimeNoWake: a delayed run of a new key at the same
// time as the queue's first delayed work is not the queue's first delayed
// work due after now ("due after other delayed work publishes nothing"):
// the waiters' early look is at that time already. Fails on 100f94d: the
// bound of place_soonest's ZRANGEBYSCORE is exclusive ('(' .. at).
func TestReviewH193SameTimeNoWake(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
				b := heldSetup(t, c, on)
				T := b.clock.Now().Add(time.Second)
				enqueue(t, b, runqueue.EnqueueParams{Env: "a", Queue: "q000", Key: "k0", ID: "k0", AvailableAt: T})
				got := wakeCount(t, b, c, q000Wake(t, b), func() {
					enqueue(t, b, runqueue.EnqueueParams{Env: "a", Queue: "q000", Key: "k1", ID: "k1", AvailableAt: T})
				})
				require.Zero(t, got, "a run due with the queue's first delayed work, not before it, needs no wake-up")
			})
		})
	}
}

// TestReviewH193StormLooks: a wait beside held work (DequeueWait of q000,
// key h at its limit; or DequeueShardWait beside 20 such queues,
// q000-q019), poll 500 ms, waits 2 s while a producer writes 100 delayed
// runs of new keys into q000 every 20 ms, none due within the wait (an
// hour on: at the same time, or each 1 ms before the last). Looks and
// script calls counted as TestWaitEarlyLookBounded counts them, and the
// delay-index reads (ZRANGEBYSCORE). Before 100f94d these writes published
// nothing (q000's master score is the held work's).
func TestReviewH193StormLooks(t *testing.T) {
	const window = 2 * time.Second
	for _, shard := range []bool{false, true} {
		for _, order := range []string{"same"} {
			t.Run(fmt.Sprintf("shard=%v/%s", shard, order), func(t *testing.T) {
				forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
					o, scripts, looks := waitCounter(t, c)
					var ranges atomic.Int64
					o.AddHook(afterEach(func(cmd redis.Cmder, _ error) {
						if cmd.Name() == "zrangebyscore" {
							ranges.Add(1)
						}
					}))
					b := setup(t, o, soonConfig(false, 500*time.Millisecond, func(cfg *runqueue.Config) { cfg.KeyConcurrency = 1 }))
					nq := 1
					if shard {
						nq = 20
					}
					heldQueues(t, b, "a", 0, nq)
					T := time.Now().Add(time.Hour)
					// The producer on its own client (not counted).
					pq, err := runqueue.New(b.ctx, c, &runqueue.Config{Prefix: b.prefix, Shards: 1, KeyConcurrency: 1, LeaseDuration: time.Hour})
					require.NoError(t, err)
					t.Cleanup(func() { _ = pq.Close() })
					done := make(chan struct{})
					go func() {
						defer close(done)
						for i := range 100 {
							at := T
							if order == "decreasing" {
								at = T.Add(-time.Duration(i) * time.Millisecond)
							}
							_, err := pq.Enqueue(context.Background(), runqueue.EnqueueParams{Env: "a", Queue: "q000",
								Key: fmt.Sprint("p", i), ID: fmt.Sprint("p", i), AvailableAt: at})
							if err != nil {
								t.Error(err)
								return
							}
							time.Sleep(20 * time.Millisecond)
						}
					}()
					l0, s0, r0 := looks.Load(), scripts.Load(), ranges.Load()
					var runs []*runqueue.Run
					if shard {
						runs, err = b.q.DequeueShardWait(b.ctx, 0, 10, window)
					} else {
						runs, err = b.q.DequeueWait(b.ctx, "a", "q000", 10, window)
					}
					require.NoError(t, err)
					require.Empty(t, runs)
					l, s, r := looks.Load()-l0, scripts.Load()-s0, ranges.Load()-r0
					<-done
					t.Logf("shard=%v %s: %d looks, %d script calls, %d zrangebyscore in %v", shard, order, l, s, r, window)
					// No wake-up: the poll's looks and at most one early look a
					// poll (as TestWaitEarlyLookBounded); 92-95 looks in 2 s on
					// 100f94d (a wake-up at each write).
					require.LessOrEqual(t, l, 2*int64(window/(500*time.Millisecond))+2, "looks")
				})
			})
		}
	}
}

// TestReviewH193ShardHeldDelayedSpendsEarlyLook: helper-184's case (an idle
// env's run due in 500 ms beside an env whose queue holds work that limits
// hold back, DequeueShardWait and a shard Worker, poll 6 s), with one more
// thing: the held key h of q000 has a delayed run of its own due in 200
// ms (held when due: h is at its limit). dueDelayed reads it in q000's
// delay index and makes it the sooner time; the early look at it serves
// nothing and spends the early look, so the idle env's run waits for the
// poll. Before 100f94d the shard wait did not read due queues' delay
// indexes, looked early at the idle env's run and served it at its time.
// (Scaled from a poll of 2 s, the runs due in 100 and 400 ms and a bound
// of 1 s: a run served at its time had 1 s to come, the poll's look came
// 1.6 s late; now it has 3 s, and the poll's look comes 5.5 s late.)
func TestReviewH193ShardHeldDelayedSpendsEarlyLook(t *testing.T) {
	for _, on := range []bool{false, true} {
		for _, wt := range soonWaiters[:3] {
			if wt.name == "DequeueWait" {
				continue
			}
			t.Run(fmt.Sprintf("vtime=%v/%s", on, wt.name), func(t *testing.T) {
				forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
					poll := 6 * time.Second
					b := setup(t, c, soonConfig(on, poll, func(cfg *runqueue.Config) { cfg.KeyConcurrency = 1 }))
					heldQueues(t, b, "a", 0, 1)
					now := time.Now()
					enqueue(t, b, runqueue.EnqueueParams{Env: "a", Queue: "q000", Key: "h", ID: "held-delayed", AvailableAt: now.Add(200 * time.Millisecond)})
					due := now.Add(500 * time.Millisecond)
					enqueue(t, b, runqueue.EnqueueParams{Env: "b", Queue: "q", Key: "k", ID: "soon", AvailableAt: due})
					got := wt.wait(t, b, 2*poll)
					late := time.Since(due)
					t.Logf("served %v %v after its time (poll %v)", got, late.Round(time.Millisecond), poll)
					require.Equal(t, []string{"soon"}, got)
					// (the poll's look: 5.5 s after its time)
					require.Less(t, late, poll/2, "served near its time, as before 100f94d, not at the poll")
				})
			})
		}
	}
}

// TestReviewH193BulkSameTime: EnqueueMany of 40 new keys' runs (the bulk
// path) all due at T beside held work: with a run of another key due at T
// already, it is not the queue's first delayed work before T and needs no
// wake-up; without it, it is and does (one). Fails on 100f94d (1 wake-up
// with k0 there).
func TestReviewH193BulkSameTime(t *testing.T) {
	for _, on := range []bool{false, true} {
		for _, withK0 := range []bool{true, false} {
			t.Run(fmt.Sprintf("vtime=%v/k0=%v", on, withK0), func(t *testing.T) {
				forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
					b := heldSetup(t, c, on)
					T := b.clock.Now().Add(time.Second)
					if withK0 {
						enqueue(t, b, runqueue.EnqueueParams{Env: "a", Queue: "q000", Key: "k0", ID: "k0", AvailableAt: T})
					}
					var ps []runqueue.EnqueueParams
					for i := 1; i <= 40; i++ {
						ps = append(ps, runqueue.EnqueueParams{Env: "a", Queue: "q000", Key: fmt.Sprint("k", i), ID: fmt.Sprint("k", i), AvailableAt: T})
					}
					got := wakeCount(t, b, c, q000Wake(t, b), func() { enqueueAll(t, b, ps) })
					want := 1
					if withK0 {
						want = 0
					}
					require.Equal(t, want, got, "wake-ups")
				})
			})
		}
	}
}

// TestReviewH193ShardBrokenMember: a master member that does not decode
// (beside held queues, so dueDelayed reads the due queues) does not fail
// a shard wait: dueDelayed skips it. The wait times out empty. (A due
// queue's delay index of the wrong type fails DequeueShard's dequeue
// script itself, dq_promote, on the old code too, before dueDelayed
// could skip it: not this commit's.)
func TestReviewH193ShardBrokenMember(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, soonConfig(false, 200*time.Millisecond, func(cfg *runqueue.Config) { cfg.KeyConcurrency = 1 }))
		heldQueues(t, b, "a", 0, 2)
		require.NoError(t, c.ZAdd(b.ctx, keySpace(t, b).Shard(0).Master(), redis.Z{Score: 1, Member: "not a member"}).Err())
		runs, err := b.q.DequeueShardWait(b.ctx, 0, 10, 700*time.Millisecond)
		require.NoError(t, err)
		require.Empty(t, runs)
	})
}

// TestReviewH193ShardPollDeferred: a shard wait beside held work looks
// again at its poll (4 s) for work that limits freed without a publish (an
// Ack publishes nothing): key h of q000 at KeyConcurrency 1, run "second"
// held behind the leased "first", acked 3.5 s into the wait. Key h2 of
// q000 is at its limit too and has a delayed run due 3 s into the wait
// (held when due). Before 100f94d the shard wait did not read q000's delay
// index: it looked at the poll (4 s) and served "second" about 500 ms
// after the ack. With 100f94d it looked early at h2's run (3 s), which
// served nothing and spent the early look, and the next look was a whole
// poll later (7 s): "second" waited about 3.5 s after the ack, later than
// the poll. (DequeueWait of q000 and a Worker of q000 read the delay index
// since stop 56 and did the same: now every wait keeps the poll's phase,
// an early look does not put the poll's look off.)
func TestReviewH193ShardPollDeferred(t *testing.T) {
	for _, wt := range soonWaiters {
		t.Run(wt.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
				// (Scaled from the case above, 2 s poll, h2's run at 1.9 s,
				// the ack at 1.95 s: the ack had 50 ms to run before the
				// poll's look, a stall's worth; now it has 500 ms.)
				poll := 4 * time.Second
				b := setup(t, c, soonConfig(false, poll, func(cfg *runqueue.Config) { cfg.KeyConcurrency = 1 }))
				enqueueAll(t, b, []runqueue.EnqueueParams{
					{Env: "a", Queue: "q000", Key: "h", ID: "first"},
					{Env: "a", Queue: "q000", Key: "h2", ID: "h2first"},
				})
				leased, err := b.q.Dequeue(b.ctx, "a", "q000", 10)
				require.NoError(t, err)
				require.ElementsMatch(t, []string{"first", "h2first"}, runIDs(leased))
				var first *runqueue.Run
				for _, r := range leased {
					if r.ID == "first" {
						first = r
					}
				}
				start := time.Now()
				enqueueAll(t, b, []runqueue.EnqueueParams{
					{Env: "a", Queue: "q000", Key: "h", ID: "second"},
					{Env: "a", Queue: "q000", Key: "h2", ID: "h2delayed", AvailableAt: start.Add(3 * time.Second)},
				})
				acked := make(chan time.Time, 1)
				go func() {
					time.Sleep(time.Until(start.Add(3500 * time.Millisecond)))
					if err := b.q.Ack(b.ctx, first); err != nil {
						t.Error(err)
					}
					acked <- time.Now()
				}()
				got := wt.wait(t, b, 3*poll)
				served := time.Now()
				late := served.Sub(<-acked)
				t.Logf("served %v %v after the ack (poll %v)", got, late.Round(time.Millisecond), poll)
				require.Equal(t, []string{"second"}, got)
				// (a look a whole poll after the early one: 3.5 s after the ack)
				require.Less(t, late, poll/2, "served at the poll, as before 100f94d")
			})
		})
	}
}
