package runqueue_test

// Review s19: a Redis Cluster resharding. While a slot moves between
// masters (CLUSTER SETSLOT ... MIGRATING / IMPORTING, then MIGRATE of its
// keys), Redis runs a script on the source only when every key it declares
// exists there, and a command inside the script that touches a missing key
// (one the script builds itself, or one it emptied and writes again) fails
// the script after the writes before it. A call must fail whole, with
// nothing written, and succeed once the slot has moved.

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// s19ReshardState queues, on one env of q's cluster, what makes every
// queue-level key of the env's queue exist: ready runs of k1, a delayed run
// with a TTL on k9, and three runs in flight (a and b of k1, x of k3). It
// returns the in-flight runs.
func s19ReshardState(t *testing.T, b *testBundle, env, queue string) []*runqueue.Run {
	t.Helper()
	for _, p := range []runqueue.EnqueueParams{
		{Key: "k1", ID: "a"}, {Key: "k1", ID: "b"},
		{Key: "k9", ID: "z", Delay: time.Hour, TTL: 2 * time.Hour},
		{Key: "k3", ID: "x"},
	} {
		p.Env, p.Queue, p.Payload = env, queue, []byte(p.ID)
		_, err := b.q.Enqueue(b.ctx, p)
		require.NoError(t, err)
	}
	held, err := b.q.Dequeue(b.ctx, env, queue, 10)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"a", "b", "x"}, runIDs(held))
	_, err = b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: queue, Key: "k1", ID: "b2", Payload: []byte("b2")})
	require.NoError(t, err)
	return held
}

// TestS19ReshardNothingHalfWritten: with the env's slot MIGRATING (and
// later half moved), every call either succeeds or fails with nothing
// written; once the slot has moved, the calls that failed succeed when
// made again, and every run is served exactly once.
//
// Before the fix, a flag-off Enqueue of a new key, on a queue whose
// declared keys all existed, wrote the run's record and then failed on its
// key's ready set ("Script attempted to access a non local key"): the run
// was never served, and the retried Enqueue, idempotent on the ID, queued
// nothing.
func TestS19ReshardNothingHalfWritten(t *testing.T) {
	t.Parallel() // servers of its own (spawned for it), and no tight wall-clock bound
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			t.Parallel()
			c := redistest.OwnCluster(t)
			b := setup(t, c, func(cfg *runqueue.Config) {
				cfg.VtimeScheduling = on
				cfg.LeaseDuration = time.Hour
			})
			ctx := b.ctx
			const env, queue = "env1", "q"
			held := s19ReshardState(t, b, env, queue)
			slot := keys.Slot(fmt.Sprintf("{%s:%d}", b.prefix, b.q.ShardOf(env)))
			m, err := redistest.StartMigration(ctx, c, slot)
			require.NoError(t, err)

			var failed []string // the calls that failed, to make again after the move
			try := func(what string, call func() error) {
				before := s19rSnap(t, c, b.prefix, slot)
				err := call()
				if err == nil {
					return
				}
				failed = append(failed, what)
				require.Equal(t, before, s19rSnap(t, c, b.prefix, slot), "%s failed (%v) and wrote", what, err)
			}
			enqueue := func(key, id string) func() error {
				return func() error {
					_, err := b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: env, Queue: queue, Key: key, ID: id, Payload: []byte(id)})
					return err
				}
			}
			var served []string
			var mu sync.Mutex
			dequeue := func() error {
				runs, err := b.q.Dequeue(ctx, env, queue, 1)
				for _, r := range runs {
					mu.Lock()
					served = append(served, r.ID)
					mu.Unlock()
					require.NoError(t, b.q.Ack(ctx, r))
				}
				return err
			}
			x := held[slices.Index(runIDs(held), "x")]
			nackX := func() error {
				_, err := b.q.Nack(ctx, x, &runqueue.NackOptions{RetryAt: b.clock.Now()})
				return err
			}

			// The slot MIGRATING, no key moved yet.
			try("enqueue c (a new key)", enqueue("k2", "c"))
			try("enqueue d (k1)", enqueue("k1", "d"))
			try("nack x", nackX)
			try("dequeue", dequeue)
			// Half moved: a few keys at a time, a call between each move.
			for i := 0; ; i++ {
				n, err := m.MoveKeys(ctx, 2)
				require.NoError(t, err)
				if n == 0 {
					break
				}
				try(fmt.Sprintf("enqueue e%d", i), enqueue(fmt.Sprintf("kk%d", i), fmt.Sprintf("e%d", i)))
				try(fmt.Sprintf("dequeue %d", i), dequeue)
			}
			t.Logf("failed during the move: %d calls: %s", len(failed), strings.Join(failed, ", "))
			require.NoError(t, m.Finish(ctx))

			// The slot moved: every call that failed succeeds now.
			require.NoError(t, enqueue("k2", "c")())
			require.NoError(t, enqueue("k1", "d")())
			for i := range 100 {
				require.NoError(t, enqueue(fmt.Sprintf("kk%d", i), fmt.Sprintf("e%d", i))())
			}
			if err := nackX(); err != nil {
				require.ErrorIs(t, err, runqueue.ErrNotInFlight, "x was nacked during the move")
			}
			for _, r := range held {
				if r.ID != "x" {
					require.NoError(t, b.q.Ack(ctx, r))
				}
			}
			b.clock.Advance(90 * time.Minute) // z is due (its TTL is 2h)
			for {
				n := len(served)
				require.NoError(t, dequeue())
				if len(served) == n {
					break
				}
			}
			sort.Strings(served)
			want := []string{"b2", "c", "d", "x", "z"}
			for i := range 100 {
				want = append(want, fmt.Sprintf("e%d", i))
			}
			sort.Strings(want)
			require.Equal(t, want, served, "every run served exactly once")
			// Nothing is left of the queue but, flag on, the scheduler's
			// state, which lives StateTTL past the last flag-on dequeue.
			for _, k := range b.keysUnder(t) {
				require.True(t, on && expiresOnItsOwn(k), "left: %s", k)
				require.Positive(t, c.PTTL(ctx, k).Val(), "%s has a TTL", k)
			}
		})
	}
}

// TestS19ReshardWorkerSettles: a Worker whose runs finish while their slot
// moves settles them once it has moved, without waiting for their leases
// (a minute here, on a clock that does not move). A failed run's nack is
// sent again (a queue source): before, it was logged as failed and the run
// stayed in flight until its lease passed. An ack whose call fails goes
// back to its source and rides with the next call (a shard source, whose
// acks go by AckMany; this held before).
func TestS19ReshardWorkerSettles(t *testing.T) {
	t.Parallel() // servers of its own (spawned for it), and no tight wall-clock bound
	for _, shard := range []bool{false, true} {
		t.Run(fmt.Sprintf("shard=%v", shard), func(t *testing.T) {
			t.Parallel()
			c := redistest.OwnCluster(t)
			b := setup(t, c, func(cfg *runqueue.Config) {
				cfg.LeaseDuration = time.Minute
				cfg.BlockPollInterval = 20 * time.Millisecond
			})
			ctx := b.ctx
			const env, queue = "env1", "q"
			_, err := b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: env, Queue: queue, Key: "k", ID: "r", Payload: []byte("r")})
			require.NoError(t, err)
			release := make(chan struct{})
			started := make(chan struct{}, 4)
			var mu sync.Mutex
			attempts := 0
			handler := func(ctx context.Context, r *runqueue.Run) error {
				mu.Lock()
				attempts++
				n := attempts
				mu.Unlock()
				started <- struct{}{}
				if n > 1 {
					return nil
				}
				<-release
				if shard {
					return nil // its ack meets the move
				}
				return runqueue.RetryAfter(fmt.Errorf("fails once"), 0) // its nack meets the move
			}
			wc := &runqueue.WorkerConfig{SweepInterval: -1, Logger: quietLogger, Concurrency: 1}
			if shard {
				wc.Shards = []int{b.q.ShardOf(env)}
			} else {
				wc.Queues = []runqueue.WorkerQueue{{Env: env, Queue: queue}}
			}
			w, err := runqueue.NewWorker(b.q, handler, wc)
			require.NoError(t, err)
			require.NoError(t, w.Start(ctx))
			t.Cleanup(func() { _ = w.Shutdown(context.Background()) })
			<-started

			slot := keys.Slot(fmt.Sprintf("{%s:%d}", b.prefix, b.q.ShardOf(env)))
			m, err := redistest.StartMigration(ctx, c, slot)
			require.NoError(t, err)
			close(release)
			time.Sleep(300 * time.Millisecond) // the settle meets the move
			require.NoError(t, m.Finish(ctx))

			want := 1
			if !shard {
				want = 2 // the nacked run comes back and is acked
				select {
				case <-started:
				case <-time.After(10 * time.Second):
					t.Fatal("the nacked run did not come back: its nack was not sent again after the move")
				}
			}
			require.Eventually(t, func() bool {
				st, err := b.q.QueueStats(ctx, env, queue)
				return err == nil && st.InFlight == 0 && st.Ready == 0 && st.Delayed == 0
			}, 10*time.Second, 20*time.Millisecond, "the run is settled without waiting for its lease")
			require.NoError(t, w.Shutdown(ctx))
			mu.Lock()
			defer mu.Unlock()
			require.Equal(t, want, attempts)
		})
	}
}
