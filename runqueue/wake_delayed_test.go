package runqueue_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// delayedWrites are the writes that put a free key's run id into env a's
// queue q000's delay index, due at a given time: Enqueue, EnqueueMany of 40
// runs of new keys (its bulk path: run id due then, the others an hour
// later), EnqueueMany of 3 (one run at a time) and the Nack of a leased run
// of q000 with a retry time. prepare runs before the wait (the Nack's
// lease) and returns the write.
var delayedWrites = []struct {
	name    string
	prepare func(t *testing.T, b *testBundle, id string) func(at time.Time)
}{
	{"Enqueue", func(t *testing.T, b *testBundle, id string) func(time.Time) {
		return func(at time.Time) {
			enqueue(t, b, runqueue.EnqueueParams{Env: "a", Queue: "q000", Key: "free-" + id, ID: id, AvailableAt: at})
		}
	}},
	{"EnqueueManyBulk", func(t *testing.T, b *testBundle, id string) func(time.Time) {
		return func(at time.Time) { enqueueDelayedMany(t, b, id, at, 40) }
	}},
	{"EnqueueManyEach", func(t *testing.T, b *testBundle, id string) func(time.Time) {
		return func(at time.Time) { enqueueDelayedMany(t, b, id, at, 3) }
	}},
	{"Nack", func(t *testing.T, b *testBundle, id string) func(time.Time) {
		enqueue(t, b, runqueue.EnqueueParams{Env: "a", Queue: "q000", Key: "free-" + id, ID: id})
		runs, err := b.q.Dequeue(b.ctx, "a", "q000", 10)
		require.NoError(t, err)
		require.Equal(t, []string{id}, runIDs(runs), "the free run, not the held one")
		return func(at time.Time) {
			res, err := b.q.Nack(b.ctx, runs[0], &runqueue.NackOptions{RetryAt: at})
			require.NoError(t, err)
			require.True(t, res.Requeued)
		}
	}},
}

// heldSetup is a Queue of one shard, flag on or not, whose env a's queue
// q000 holds a run of key h that its limit (KeyConcurrency 1) holds back,
// the other in flight for an hour (fake clock).
func heldSetup(t *testing.T, c redis.UniversalClient, on bool) *testBundle {
	t.Helper()
	b := setup(t, c, func(cfg *runqueue.Config) {
		cfg.VtimeScheduling, cfg.Shards, cfg.KeyConcurrency = on, 1, 1
		cfg.LeaseDuration = time.Hour
	})
	heldQueues(t, b, "a", 0, 1)
	return b
}

// enqueueDelayedMany enqueues n runs of new keys into env a's q000 in one
// EnqueueMany: run id due at at, the others an hour later.
func enqueueDelayedMany(t *testing.T, b *testBundle, id string, at time.Time, n int) {
	t.Helper()
	ps := make([]runqueue.EnqueueParams, n)
	for i := range ps {
		ps[i] = runqueue.EnqueueParams{Env: "a", Queue: "q000", Key: fmt.Sprintf("free-%s-%d", id, i),
			ID: fmt.Sprintf("%s-later-%d", id, i), AvailableAt: at.Add(time.Hour)}
	}
	ps[n/2].Key, ps[n/2].ID, ps[n/2].AvailableAt = "free-"+id, id, at
	res, err := b.q.EnqueueMany(b.ctx, ps)
	require.NoError(t, err)
	for _, r := range res {
		require.NoError(t, r.Err)
		require.True(t, r.Queued)
	}
}

// TestDelayedWriteTellsWaiters: beside due work that limits hold back (key
// h of env a's queue q000 at its limit, a run of it held), the master
// score does not move for delayed work, so before this a write of delayed
// work published no wake-up, and a consumer asleep beside the held work
// (which looks early only at the first delayed time it read when it went
// to sleep) saw it at its poll. Now the write wakes consumers when the
// run is the queue's first delayed work due after the writer's now, and
// not when delayed work is due before it. Each write of delayedWrites,
// both flags; a wake-up is seen on q000's wake channel before a marker
// published after the write.
func TestDelayedWriteTellsWaiters(t *testing.T) {
	t.Parallel()
	for _, on := range []bool{false, true} {
		for _, dw := range delayedWrites {
			t.Run(fmt.Sprintf("vtime=%v/%s", on, dw.name), func(t *testing.T) {
				forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
					b := heldSetup(t, c, on)
					first := dw.prepare(t, b, "d1")
					second := dw.prepare(t, b, "d2")
					now := b.clock.Now()
					told := func(write func(time.Time), at time.Time) bool {
						return wakeCount(t, b, c, q000Wake(t, b), func() { write(at) }) > 0
					}
					require.True(t, told(first, now.Add(time.Second)),
						"the queue's first delayed work beside held work wakes consumers")
					require.False(t, told(second, now.Add(2*time.Second)),
						"delayed work due after other delayed work does not")
					ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
					defer cancel()
					b.clock.Advance(3 * time.Second)
					runs, err := b.q.Dequeue(ctx, "a", "q000", 10)
					require.NoError(t, err)
					require.ElementsMatch(t, []string{"d1", "d2"}, runIDs(runs), "both served when due; h's run held")
				})
			})
		}
	}
}

// TestWaitToldOfDelayedBesideHeld: the four waits of soonWaiters
// (DequeueShardWait, DequeueWait of q000, a Worker of each), asleep beside
// work that limits hold back (key h of q000 at its limit, a run of it
// held; nothing else due within the poll of 2 s), serve a free key's run
// of q000 written 300 ms into the wait and due 200 ms later near its
// time, not at the poll: each write of delayedWrites wakes them (see
// TestDelayedWriteTellsWaiters), their look serves nothing and their next
// wait looks early at the run's time (a shard's: read in the delay index
// of the due queue, dueDelayed). Before, they served it at the poll (about
// 1.5 s after its time). The bound (served within 1 s of its time) says
// only that it did not wait for the poll. Both flags.
func TestWaitToldOfDelayedBesideHeld(t *testing.T) {
	t.Parallel()
	for _, on := range []bool{false, true} {
		for _, wt := range soonWaiters {
			for _, dw := range delayedWrites {
				t.Run(fmt.Sprintf("vtime=%v/%s/%s", on, wt.name, dw.name), func(t *testing.T) {
					forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
						b := setup(t, c, soonConfig(on, 2*time.Second, func(cfg *runqueue.Config) { cfg.KeyConcurrency = 1 }))
						heldQueues(t, b, "a", 0, 1)
						write := dw.prepare(t, b, "soon")
						due := make(chan time.Time, 1)
						go func() { // (a failed write marks t failed and ends here)
							time.Sleep(300 * time.Millisecond)
							at := time.Now().Add(200 * time.Millisecond)
							write(at)
							due <- at
						}()
						got := wt.wait(t, b, 5*time.Second)
						served := time.Now()
						var late time.Duration
						select {
						case at := <-due:
							late = served.Sub(at)
						case <-time.After(10 * time.Second): // the write failed (and said so)
							t.Fatal("the write did not finish")
						}
						t.Logf("served %v %v after its time", got, late.Round(time.Millisecond))
						require.Equal(t, []string{"soon"}, got)
						require.Less(t, late, time.Second, "served near its time, not at the poll")
					})
				})
			}
		}
	}
}
