package runqueue_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// corruptRecord overwrites the stored record of run id of env/queue with
// garbage, as a hand edit or a foreign writer would.
func corruptRecord(t *testing.T, b *testBundle, queue, id string) {
	t.Helper()
	runs := keySpace(t, b).Env(env).Queue(queue).Runs()
	require.NoError(t, b.client.HSet(b.ctx, runs, keys.Segment(id), "garbage").Err())
}

// requireCorruptGone: run id of queue is gone for good (its record
// removed), nothing of queue is queued or in flight, and key's slot is
// free.
func requireCorruptGone(t *testing.T, b *testBundle, queue, id, key string) {
	t.Helper()
	runs := keySpace(t, b).Env(env).Queue(queue).Runs()
	n, err := b.client.HExists(b.ctx, runs, keys.Segment(id)).Result()
	require.NoError(t, err)
	require.False(t, n, "the corrupt record of %s is still stored", id)
	st := queueStats(t, b, queue)
	require.Zero(t, st.Ready+st.Delayed+st.InFlight+st.Dead, "stats %+v", st)
	kin, err := b.q.KeyInflight(b.ctx, env, queue, key)
	require.NoError(t, err)
	require.Zero(t, kin, "key %s still holds a slot", key)
}

// corruptPath is one way to dequeue.
type corruptPath struct {
	name   string
	serial bool
	deq    func(b *testBundle, n int) ([]*runqueue.Run, error)
}

var corruptPaths = []corruptPath{
	{name: "Dequeue", deq: func(b *testBundle, n int) ([]*runqueue.Run, error) {
		return b.q.Dequeue(b.ctx, env, queueName, n)
	}},
	{name: "DequeueSerial", serial: true, deq: func(b *testBundle, n int) ([]*runqueue.Run, error) {
		return b.q.Dequeue(b.ctx, env, queueName, n)
	}},
	{name: "DequeueWait", deq: func(b *testBundle, n int) ([]*runqueue.Run, error) {
		return b.q.DequeueWait(b.ctx, env, queueName, n, 20*time.Millisecond)
	}},
	{name: "AckAndDequeue", deq: func(b *testBundle, n int) ([]*runqueue.Run, error) {
		runs, errs, err := b.q.AckAndDequeue(b.ctx, nil, env, queueName, n)
		if len(errs) != 0 {
			return nil, fmt.Errorf("ack results %v for no acks", errs)
		}
		return runs, err
	}},
	{name: "DequeueShard", deq: func(b *testBundle, n int) ([]*runqueue.Run, error) {
		return b.q.DequeueShard(b.ctx, b.q.ShardOf(env), n)
	}},
}

// forEachCorrupt runs fn for each flag state, backend and dequeue path, on
// a bundle with a key limit of 1.
func forEachCorrupt(t *testing.T, fn func(t *testing.T, b *testBundle, p corruptPath)) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
				for _, p := range corruptPaths {
					t.Run(p.name, func(t *testing.T) {
						fn(t, setup(t, c, func(cfg *runqueue.Config) {
							cfg.VtimeScheduling = on
							cfg.SerialCalls = p.serial
							cfg.KeyConcurrency = 1
						}), p)
					})
				}
			})
		})
	}
}

// enqueueCorrupt queues bad and ok on key k (in that order), a on ka and b
// on kb, and corrupts bad's record.
func enqueueCorrupt(t *testing.T, b *testBundle) {
	t.Helper()
	for _, r := range [][2]string{{"bad", "k"}, {"ok", "k"}, {"a", "ka"}, {"b", "kb"}} {
		b.clock.Advance(time.Millisecond)
		enqueue(t, b, runqueue.EnqueueParams{ID: r[0], Key: r[1], Payload: []byte("p-" + r[0])})
	}
	corruptRecord(t, b, queueName, "bad")
}

// TestCorruptRecordDequeue: a dequeue that serves a run whose record does
// not parse delivers the runs of the call that do, with a nil error;
// the corrupt run is removed at once, so that its key's slot is free for
// the next call (key limit 1: "ok", of its key, is served by the next call,
// no lease recovery needed) and it never comes back, not after its lease
// either. Served alone, it is told as a *CorruptRunError. Every dequeue
// path, both flag states, every backend. Before the fix the first call
// returned an error and no run, and held all three for a lease.
func TestCorruptRecordDequeue(t *testing.T) {
	forEachCorrupt(t, func(t *testing.T, b *testBundle, p corruptPath) {
		enqueueCorrupt(t, b)
		runs, err := p.deq(b, 10)
		require.NoError(t, err, "a call that served runs returns them with a nil error")
		require.ElementsMatch(t, []string{"a", "b"}, runIDs(runs))
		for _, r := range runs {
			require.Equal(t, "p-"+r.ID, string(r.Payload))
		}
		ackAll(t, b, runs)

		runs, err = p.deq(b, 10)
		require.NoError(t, err)
		require.Equal(t, []string{"ok"}, runIDs(runs), "the corrupt run's key slot was not freed")
		ackAll(t, b, runs)

		b.clock.Advance(b.q.Config().LeaseDuration + time.Second)
		n, err := b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 100)
		require.NoError(t, err)
		require.Zero(t, n, "nothing was left in flight")
		runs, err = p.deq(b, 10)
		require.NoError(t, err)
		require.Empty(t, runs, "the corrupt run came back")
		requireCorruptGone(t, b, queueName, "bad", "k")

		// Served alone: the call tells it.
		enqueue(t, b, runqueue.EnqueueParams{ID: "bad2", Key: "k"})
		corruptRecord(t, b, queueName, "bad2")
		runs, err = p.deq(b, 10)
		require.Empty(t, runs)
		require.ErrorIs(t, err, runqueue.ErrCorruptRun)
		var ce *runqueue.CorruptRunError
		require.ErrorAs(t, err, &ce)
		require.Equal(t, env, ce.Env)
		require.Equal(t, queueName, ce.Queue)
		require.NoError(t, ce.Err)
		require.Len(t, ce.Runs, 1)
		require.Equal(t, "bad2", ce.Runs[0].ID)
		require.Equal(t, "k", ce.Runs[0].Key)
		require.Equal(t, "garbage", ce.Runs[0].Record)
		require.True(t, ce.Runs[0].Removed)
		runs, err = p.deq(b, 10)
		require.NoError(t, err)
		require.Empty(t, runs)
		requireCorruptGone(t, b, queueName, "bad2", "k")
	})
}

// TestCorruptRecordWorker: a Worker, of a queue (AckAndDequeue) or of a
// shard (DequeueShard), hands out the runs served with a corrupt one, logs
// the corrupt one (an error, not a fetch failure) and never sees it again.
func TestCorruptRecordWorker(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
				for _, shard := range []bool{false, true} {
					t.Run(fmt.Sprintf("shard=%v", shard), func(t *testing.T) {
						b := setup(t, c, func(cfg *runqueue.Config) {
							cfg.VtimeScheduling = on
							cfg.KeyConcurrency = 1
						})
						enqueueCorrupt(t, b)
						var mu sync.Mutex
						var got []string
						logs := &syncBuffer{}
						w := startWorker(t, b.q, func(_ context.Context, r *runqueue.Run) error {
							mu.Lock()
							defer mu.Unlock()
							got = append(got, r.ID)
							return nil
						}, func(wc *runqueue.WorkerConfig) {
							wc.Logger = slog.New(slog.NewTextHandler(logs, nil))
							if shard {
								wc.Queues, wc.Shards = nil, []int{b.q.ShardOf(env)}
							}
						})
						require.Eventually(t, func() bool {
							mu.Lock()
							defer mu.Unlock()
							return len(got) == 3
						}, workerWait, time.Millisecond, "the runs served with the corrupt one were not all handled")
						shutdown(t, w)
						mu.Lock()
						slices.Sort(got)
						require.Equal(t, []string{"a", "b", "ok"}, got)
						mu.Unlock()
						require.Contains(t, logs.String(), "records do not parse")
						require.Contains(t, logs.String(), "bad")
						require.NotContains(t, logs.String(), "fetch failed")
						requireCorruptGone(t, b, queueName, "bad", "k")
					})
				}
			})
		})
	}
}

// TestCorruptRecordCoalesced: coalesced Dequeue calls split the runs that
// decode as ever (earliest calls first, each up to its maxCount); the
// first call left without runs is told of the corrupt one, the others get
// none and a nil error.
func TestCorruptRecordCoalesced(t *testing.T) {
	gatedDequeues(t, nil, func(t *testing.T, b *testBundle, h *scriptGate) {
		enqueueIDs(t, b, "q", "r0", "r1", "x0", "x1", "x2")
		corruptRecord(t, b, "q", "x0")
		h.arm(true)
		chs := holdDequeues(t, b, h, "q", 1, 1, 1, 1)
		h.releaseInOrder(t, 3)
		var got [][]string
		var errs []error
		for _, ch := range chs {
			o := <-ch
			got = append(got, runIDs(o.runs))
			errs = append(errs, o.err)
		}
		require.Equal(t, [][]string{{"r0"}, {"r1"}, {"x1"}, {"x2"}, {}, {}}, got)
		require.Equal(t, []int{1, 1, 4}, h.calls(), "the four waiting calls went in one call of 4")
		for i, err := range errs {
			if i == 4 {
				var ce *runqueue.CorruptRunError
				require.ErrorAs(t, err, &ce, "call %d", i)
				require.Equal(t, "x0", ce.Runs[0].ID)
				continue
			}
			require.NoError(t, err, "call %d", i)
		}
		require.Eventually(t, func() bool { return b.q.Senders() == 0 }, 5*time.Second, time.Millisecond)
		h.arm(false)
		st := queueStats(t, b, "q")
		require.Equal(t, int64(4), st.InFlight, "the corrupt run is not in flight")
		require.Zero(t, st.Ready)
	})
}
