package runqueue_test

// Review s18r: adversarial probes of the s18 changes (the scheduler
// state's renewal, the shard look-ahead, dead-letter deletion). A test that
// shows a defect says DEFECT and fails until it is fixed; the others hold
// what the change got right.

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// TestS18RStateLostWhileLimitsFull: a flag-on queue whose one slot
// (QueueConcurrency 1) is held by a long run, polled by a flag-on consumer
// every 100ms and fed by producers, for twice StateTTL. Key "old" waits
// from the start; keys mid0.. arrive one by one after it. When the slot
// frees, "old" must be served first (guarantee 10: no key registered after
// it is served before it; it was registered first and no flag-on dequeue
// ever stopped).
//
// DEFECT (fixed since: a dequeue that stops at its capacity renews the
// state as sched_save would: sched_keep in lua/lib/sched_reg.lua): every dequeue of such a queue returns at capacity 0
// (dequeue_vtime's early return runs sched_save on a state it never read:
// no renewal), and since s18 the hooks of enqueue no longer renew either,
// so the state expires StateTTL after its making although flag-on
// instances dequeue the queue all along (CHANGES: "A queue that flag-on
// instances dequeue is unchanged"; Config.StateTTL: "flag-on dequeues
// renew it"). Every waiting key loses its registration and place: the
// keys that registered after the expiry (by their enqueue's hook, at the
// fresh state) are served before "old", which is only rediscovered later.
// With StateTTL at its default (24h), a queue at its env or queue limit
// for a day (long jobs, a stuck env) loses its fairness history while busy.
//
// StateTTL is 3s: a dequeue renews the state once half of its life is gone,
// so the polls below (every 100ms) keep it as long as no two of them are
// more than 1.4s apart. At 1s, a stall of 400ms on a loaded machine let the
// state expire between two polls as documented, and the test failed (CI,
// 2026-12-04); the defect it guards against expires the state 3s after its
// making whatever the polls do.
func TestS18RStateLostWhileLimitsFull(t *testing.T) {
	c := redistest.Real(t)
	const ttl = 3 * time.Second
	b := s17Setup(t, c, true, func(cfg *runqueue.Config) {
		cfg.Clock = nil // Redis expires the state by real time
		cfg.StateTTL = ttl
		cfg.QueueConcurrency = 1
		cfg.LeaseDuration = time.Minute
	})
	enqueue(t, b, runqueue.EnqueueParams{Key: "x", ID: "x1"})
	held := dequeue(t, b, queueName, 1)
	require.Len(t, held, 1)
	enqueue(t, b, runqueue.EnqueueParams{Key: "old", ID: "old1"})
	require.Contains(t, s18SchedOf(t, b, env, queueName).regs, "=old", "old registers at its enqueue")

	deadline := time.Now().Add(2*ttl + 300*time.Millisecond)
	for i := 0; time.Now().Before(deadline); i++ {
		require.Empty(t, dequeue(t, b, queueName, 1), "the slot is held")
		enqueue(t, b, runqueue.EnqueueParams{Key: fmt.Sprintf("mid%d", i), ID: fmt.Sprintf("mid%d", i)})
		time.Sleep(100 * time.Millisecond)
	}
	st := s18SchedOf(t, b, env, queueName)
	ackAll(t, b, held)
	runs := dequeue(t, b, queueName, 1)
	require.Len(t, runs, 1)
	require.Equal(t, "old1", runs[0].ID,
		"the key waiting longest lost its place: the state (registrations now %v) expired while flag-on "+
			"dequeues polled the queue every 100ms at capacity 0", st.regs)
}

// TestS18RPurgeRedrivenTwiceOddID: a run with a key and an id that Segment
// escapes (':', '=', '%', non-ASCII) dies, is redriven, dies again and is
// purged by time: one dead letter, counted once in QueueStats and
// EnvStats, deleted once with its record; the id is free afterwards (a new
// run with another payload queues and is served), and purging again
// deletes nothing. Holds on both flags and every backend.
func TestS18RPurgeRedrivenTwiceOddID(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
				b := s17Setup(t, c, on, nil)
				const key, id = "k:=%é", "i:d=%ü"
				s17Kill(t, b, key, id, "p1")
				require.NoError(t, b.q.Redrive(b.ctx, env, queueName, key, id))
				runs := dequeue(t, b, queueName, 1)
				require.Len(t, runs, 1)
				require.Equal(t, id, runs[0].ID)
				res, err := b.q.Nack(b.ctx, runs[0], &runqueue.NackOptions{DeadLetter: true})
				require.NoError(t, err)
				require.False(t, res.Requeued)
				s := queueStats(t, b, queueName)
				require.EqualValues(t, 1, s.Dead)

				n, err := b.q.PurgeDeadLetters(b.ctx, env, queueName, b.clock.Now(), 10)
				require.NoError(t, err)
				require.Equal(t, 1, n)
				s = queueStats(t, b, queueName)
				require.Zero(t, s.Dead)
				es, err := b.q.EnvStats(b.ctx, env)
				require.NoError(t, err)
				require.Zero(t, es.Dead)
				_, err = b.q.DeadLetter(b.ctx, env, queueName, key, id)
				require.ErrorIs(t, err, runqueue.ErrNotFound)

				enqueue(t, b, runqueue.EnqueueParams{Key: key, ID: id, Payload: []byte("p2")})
				runs = dequeue(t, b, queueName, 1)
				require.Len(t, runs, 1)
				require.Equal(t, "p2", string(runs[0].Payload))
				n, err = b.q.PurgeDeadLetters(b.ctx, env, queueName, b.clock.Now(), 10)
				require.NoError(t, err)
				require.Zero(t, n)
				require.ErrorIs(t, b.q.DeleteDeadLetter(b.ctx, env, queueName, key, id), runqueue.ErrNotFound)
				ackAll(t, b, runs)
				require.Empty(t, s17RunKeys(t, b), "nothing left but the scheduler state")
			})
		})
	}
}

// TestS18RShardDelayedCostsRoundTrip: a shard holding one queue with a
// ready run and one queue whose only run is a retry backing off 30s (no
// clock skewed anywhere). DequeueShard(10) serves the ready run.
//
// DEFECT (fixed since: a look-ahead queue found without ready runs is not
// read again while its master score stays: Queue.aheadReady): every shard
// call that served fewer runs than asked, on a shard with any queue whose
// delayed work comes within ShardLookAhead (retry backoffs, short delays),
// paid one more round trip (a ZRANGE of the ckIndex of up to max(64, 4 x
// maxCount) queues) that found nothing, and so did every idle look of
// DequeueShardWait and a shard Worker (shardNext); a Worker's fetch is
// under-full whenever it keeps up, so it paid it on nearly every call.
// Now the first call reads the delayed queue's ckIndex once; the next
// calls (and the idle look) do not, until its master score changes: a
// ready run written by a clock 10s ahead lowers it, and that run is read
// and served at once.
func TestS18RShardDelayedCostsRoundTrip(t *testing.T) {
	b := s17Setup(t, redistest.Real(t), true, nil)
	enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "ready"})
	enqueue(t, b, runqueue.EnqueueParams{Queue: "later", Key: "k", ID: "retry", Delay: 30 * time.Second})

	cl := otherClient(t, b.client)
	var mu sync.Mutex
	var reads []string
	cl.AddHook(afterEach(func(cmd redis.Cmder, _ error) {
		if a := fmt.Sprint(cmd.Args()); cmd.Name() == "zrange" && strings.Contains(a, "ckIndex") {
			mu.Lock()
			reads = append(reads, a)
			mu.Unlock()
		}
	}))
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(reads)
	}
	cfg := *b.cfg
	q, err := runqueue.New(b.ctx, cl, &cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	shard := q.ShardOf(env)
	runs, err := q.DequeueShard(b.ctx, shard, 10)
	require.NoError(t, err)
	require.Equal(t, []string{"ready"}, runIDs(runs))
	require.Equal(t, 1, count(), "the first short call looks at the delayed queue once: %v", reads)
	for i := range 5 {
		enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "ready" + strconv.Itoa(i)})
		runs, err = q.DequeueShard(b.ctx, shard, 10)
		require.NoError(t, err)
		require.Equal(t, []string{"ready" + strconv.Itoa(i)}, runIDs(runs))
	}
	runs, err = q.DequeueShardWait(b.ctx, shard, 10, 20*time.Millisecond)
	require.NoError(t, err)
	require.Empty(t, runs)
	require.Equal(t, 1, count(), "later short calls and the idle look do not read it again: %v", reads)

	producer, _ := s18cPeer(t, b, 10*time.Second, nil)
	s18cEnq(t, b, producer, runqueue.EnqueueParams{Queue: "later", Key: "k2", ID: "ahead"})
	runs, err = q.DequeueShard(b.ctx, shard, 10)
	require.NoError(t, err)
	require.Equal(t, []string{"ahead"}, runIDs(runs), "a ready run scored before the delayed one lowers the score: read again")
}
