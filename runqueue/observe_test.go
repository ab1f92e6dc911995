package runqueue_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// recorder is an Observer that writes down every call as one line, so a
// test can compare what was reported with what happened.
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) add(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, fmt.Sprintf(format, args...))
}

// take returns the lines recorded since the last take.
func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.events
	r.events = nil
	return out
}

func (r *recorder) Enqueued(env, queue string, n int) { r.add("enqueued %s/%s %d", env, queue, n) }

func (r *recorder) Dequeued(runs []*runqueue.Run, now time.Time) {
	for _, run := range runs {
		r.add("dequeued %s/%s %s wait=%s", run.Env, run.Queue, run.ID, now.Sub(run.AvailableAt))
	}
}

func (r *recorder) Acked(env, queue string, n int) { r.add("acked %s/%s %d", env, queue, n) }

func (r *recorder) Nacked(env, queue string, requeued bool) {
	r.add("nacked %s/%s requeued=%t", env, queue, requeued)
}

func (r *recorder) Expired(env, queue string, n int) { r.add("expired %s/%s %d", env, queue, n) }

func (r *recorder) Recovered(env, queue string, n, dead int) {
	r.add("recovered %s/%s %d dead=%d", env, queue, n, dead)
}

func (r *recorder) Handled(env, queue string, d time.Duration, o runqueue.Outcome) {
	r.add("handled %s/%s %s %s", env, queue, d, o)
}

// observed is a bundle whose Queue reports to a recorder.
func observed(t *testing.T, c redis.UniversalClient, mutate func(*runqueue.Config)) (*testBundle, *recorder) {
	t.Helper()
	rec := &recorder{}
	b := setup(t, c, func(cfg *runqueue.Config) {
		cfg.Observer = rec
		if mutate != nil {
			mutate(cfg)
		}
	})
	return b, rec
}

// TestObserver checks that every operation reports exactly what it did:
// only runs it queued, delivered, acked, nacked, expired or recovered, per
// env and queue, and nothing for retries, gone runs or errors.
func TestObserver(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		t.Run("EnqueueCountsOnlyNewRuns", func(t *testing.T) {
			t.Parallel()
			b, rec := observed(t, c, nil)
			batch := []runqueue.EnqueueParams{
				{Env: env, Queue: "a", ID: "1"}, {Env: env, Queue: "b", ID: "1"}, {Env: env, Queue: "a", ID: "2"},
				{Env: env, Queue: "a", ID: ""}, // invalid: nothing written
			}
			res, err := b.q.EnqueueMany(b.ctx, batch)
			require.NoError(t, err)
			require.Error(t, res[3].Err)
			require.Equal(t, []string{"enqueued env/a 2", "enqueued env/b 1"}, rec.take())

			// The same batch again is an idempotent retry: nothing new.
			_, err = b.q.EnqueueMany(b.ctx, batch)
			require.NoError(t, err)
			ok, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: "a", ID: "1"})
			require.NoError(t, err)
			require.False(t, ok)
			require.Empty(t, rec.take())

			// A conflict or a full queue queues nothing.
			_, err = b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: "a", ID: "1", Payload: []byte("x")})
			require.ErrorIs(t, err, runqueue.ErrConflict)
			require.Empty(t, rec.take())

			// A retry mixed with a new run counts the new run only.
			res, err = b.q.EnqueueMany(b.ctx, []runqueue.EnqueueParams{{Env: env, Queue: "a", ID: "2"}, {Env: env, Queue: "a", ID: "3"}})
			require.NoError(t, err)
			require.Equal(t, []bool{false, true}, []bool{res[0].Queued, res[1].Queued})
			require.Equal(t, []string{"enqueued env/a 1"}, rec.take())
		})

		t.Run("QueueFullCountsNothing", func(t *testing.T) {
			t.Parallel()
			b, rec := observed(t, c, func(cfg *runqueue.Config) { cfg.MaxQueueDepth = 1 })
			enqueue(t, b, runqueue.EnqueueParams{ID: "1"})
			_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, ID: "2"})
			require.ErrorIs(t, err, runqueue.ErrQueueFull)
			require.Equal(t, []string{"enqueued env/q 1"}, rec.take())
		})

		t.Run("EveryDequeuePathReportsItsRunsOnce", func(t *testing.T) {
			t.Parallel()
			b, rec := observed(t, c, nil)
			for _, id := range []string{"1", "2", "3", "4", "5"} {
				enqueue(t, b, runqueue.EnqueueParams{ID: id})
			}
			enqueue(t, b, runqueue.EnqueueParams{ID: "d", Delay: 2 * time.Second})
			rec.take()
			b.clock.Advance(5 * time.Second)

			_ = dequeue(t, b, queueName, 1)
			require.Equal(t, []string{"dequeued env/q 1 wait=5s"}, rec.take())

			runs, err := b.q.DequeueWait(b.ctx, env, queueName, 1, time.Second)
			require.NoError(t, err)
			require.Len(t, runs, 1)
			require.Equal(t, []string{"dequeued env/q 2 wait=5s"}, rec.take())

			shard := b.q.ShardOf(env)
			runs, err = b.q.DequeueShard(b.ctx, shard, 1)
			require.NoError(t, err)
			require.Len(t, runs, 1)
			require.Equal(t, []string{"dequeued env/q 3 wait=5s"}, rec.take())

			runs, err = b.q.DequeueShardWait(b.ctx, shard, 1, time.Second)
			require.NoError(t, err)
			require.Len(t, runs, 1)
			require.Equal(t, []string{"dequeued env/q 4 wait=5s"}, rec.take())

			// The delayed run waited from its available time, not its
			// enqueue.
			runs = dequeue(t, b, queueName, 10)
			require.Equal(t, []string{"5", "d"}, runIDs(runs))
			require.Equal(t, []string{"dequeued env/q 5 wait=5s", "dequeued env/q d wait=3s"}, rec.take())

			// An empty dequeue reports nothing.
			require.Empty(t, dequeue(t, b, queueName, 10))
			require.Empty(t, rec.take())
		})

		t.Run("AcksCountOnlyRunsAcked", func(t *testing.T) {
			t.Parallel()
			b, rec := observed(t, c, nil)
			for _, id := range []string{"1", "2", "3"} {
				enqueue(t, b, runqueue.EnqueueParams{ID: id})
			}
			enqueue(t, b, runqueue.EnqueueParams{Queue: "other", ID: "o"})
			runs := dequeue(t, b, queueName, 3)
			other := dequeue(t, b, "other", 1)
			rec.take()

			require.NoError(t, b.q.Ack(b.ctx, runs[0]))
			require.Equal(t, []string{"acked env/q 1"}, rec.take())
			// Gone already: not counted again.
			require.NoError(t, b.q.Ack(b.ctx, runs[0]))
			require.Empty(t, rec.take())

			// A stale token is an error and acks nothing; gone runs count
			// nothing; each queue reports its own.
			stale := *runs[2]
			stale.Token++
			errs, err := b.q.AckMany(b.ctx, []*runqueue.Run{runs[0], runs[1], other[0], &stale})
			require.NoError(t, err)
			require.Equal(t, []error{nil, nil, nil}, errs[:3])
			require.ErrorIs(t, errs[3], runqueue.ErrLeaseLost)
			require.Equal(t, []string{"acked env/q 1", "acked env/other 1"}, rec.take())
			require.NoError(t, b.q.Ack(b.ctx, runs[2]))
			require.Equal(t, []string{"acked env/q 1"}, rec.take())
		})

		t.Run("AckAndDequeueReportsBoth", func(t *testing.T) {
			t.Parallel()
			b, rec := observed(t, c, nil)
			for _, id := range []string{"1", "2", "3"} {
				enqueue(t, b, runqueue.EnqueueParams{ID: id})
			}
			runs := dequeue(t, b, queueName, 2)
			require.NoError(t, b.q.Ack(b.ctx, runs[0]))
			rec.take()
			b.clock.Advance(time.Second)

			next, errs, err := b.q.AckAndDequeue(b.ctx, runs, env, queueName, 5)
			require.NoError(t, err)
			require.Equal(t, []error{nil, nil}, errs)
			require.Equal(t, []string{"3"}, runIDs(next))
			require.Equal(t, []string{"acked env/q 1", "dequeued env/q 3 wait=1s"}, rec.take())

			// Acks only (maxCount 0), one of them gone: one acked, no dequeue.
			_, _, err = b.q.AckAndDequeue(b.ctx, []*runqueue.Run{runs[1], next[0]}, env, queueName, 0)
			require.NoError(t, err)
			require.Equal(t, []string{"acked env/q 1"}, rec.take())
		})

		t.Run("NackReportsRequeueOrDeadLetter", func(t *testing.T) {
			t.Parallel()
			b, rec := observed(t, c, func(cfg *runqueue.Config) { cfg.MaxAttempts = 2 })
			enqueue(t, b, runqueue.EnqueueParams{ID: "1"})
			enqueue(t, b, runqueue.EnqueueParams{ID: "2"})
			runs := dequeue(t, b, queueName, 2)
			rec.take()

			res, err := b.q.Nack(b.ctx, runs[0], &runqueue.NackOptions{RetryAt: b.clock.Now()})
			require.NoError(t, err)
			require.True(t, res.Requeued)
			_, err = b.q.Nack(b.ctx, runs[1], &runqueue.NackOptions{DeadLetter: true})
			require.NoError(t, err)
			require.Equal(t, []string{"nacked env/q requeued=true", "nacked env/q requeued=false"}, rec.take())

			// The second delivery is the last attempt: its nack dead-letters.
			again := dequeue(t, b, queueName, 1)
			rec.take()
			res, err = b.q.Nack(b.ctx, again[0], nil)
			require.NoError(t, err)
			require.False(t, res.Requeued)
			// A nack by a holder that no longer holds the run reports nothing.
			_, err = b.q.Nack(b.ctx, runs[0], nil)
			require.Error(t, err)
			require.Equal(t, []string{"nacked env/q requeued=false"}, rec.take())
		})

		t.Run("ExpireTTLReportsPerQueue", func(t *testing.T) {
			t.Parallel()
			b, rec := observed(t, c, nil)
			for _, p := range []runqueue.EnqueueParams{
				{Queue: "a", ID: "1", TTL: time.Second}, {Queue: "b", ID: "1", TTL: time.Second},
				{Queue: "a", ID: "2", TTL: time.Second}, {Queue: "a", ID: "3", TTL: time.Hour},
				{Queue: "b", ID: "2", TTL: time.Second},
			} {
				enqueue(t, b, p)
			}
			// A dequeued run with a TTL does not expire.
			require.Len(t, dequeue(t, b, "b", 1), 1)
			rec.take()
			b.clock.Advance(2 * time.Second)

			n, err := b.q.ExpireTTL(b.ctx, b.q.ShardOf(env), 100)
			require.NoError(t, err)
			require.Equal(t, 3, n)
			require.ElementsMatch(t, []string{"expired env/a 2", "expired env/b 1"}, rec.take())

			n, err = b.q.ExpireTTL(b.ctx, b.q.ShardOf(env), 100)
			require.NoError(t, err)
			require.Zero(t, n)
			require.Empty(t, rec.take())
		})

		t.Run("RecoverLeasesReportsPerQueue", func(t *testing.T) {
			t.Parallel()
			b, rec := observed(t, c, func(cfg *runqueue.Config) {
				cfg.MaxAttempts = 2
				cfg.LeaseDuration = time.Second
			})
			enqueue(t, b, runqueue.EnqueueParams{Queue: "a", ID: "1"})
			enqueue(t, b, runqueue.EnqueueParams{Queue: "a", ID: "2"})
			enqueue(t, b, runqueue.EnqueueParams{Queue: "b", ID: "1"})
			a := dequeue(t, b, "a", 2)
			require.Len(t, dequeue(t, b, "b", 1), 1)
			require.NoError(t, b.q.Ack(b.ctx, a[1])) // acked: nothing to recover
			rec.take()
			b.clock.Advance(2 * time.Second)

			shard := b.q.ShardOf(env)
			n, err := b.q.RecoverLeases(b.ctx, shard, 100)
			require.NoError(t, err)
			require.Equal(t, 2, n)
			require.ElementsMatch(t, []string{"recovered env/a 1 dead=0", "recovered env/b 1 dead=0"}, rec.take())

			// Second delivery, lease passes again: no attempts left.
			require.Len(t, dequeue(t, b, "a", 5), 1)
			require.Len(t, dequeue(t, b, "b", 5), 1)
			rec.take()
			b.clock.Advance(2 * time.Second)
			n, err = b.q.RecoverLeases(b.ctx, shard, 100)
			require.NoError(t, err)
			require.Equal(t, 2, n)
			require.ElementsMatch(t, []string{"recovered env/a 1 dead=1", "recovered env/b 1 dead=1"}, rec.take())

			n, err = b.q.RecoverLeases(b.ctx, shard, 100)
			require.NoError(t, err)
			require.Zero(t, n)
			require.Empty(t, rec.take())
		})

		t.Run("FlagOn", func(t *testing.T) {
			t.Parallel()
			b, rec := observed(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = true })
			enqueue(t, b, runqueue.EnqueueParams{Key: "k1", ID: "1"})
			enqueue(t, b, runqueue.EnqueueParams{Key: "k2", ID: "2"})
			runs := dequeue(t, b, queueName, 2)
			require.Len(t, runs, 2)
			ackAll(t, b, runs)
			require.Equal(t, []string{"enqueued env/q 1", "enqueued env/q 1", "dequeued env/q 1 wait=0s",
				"dequeued env/q 2 wait=0s", "acked env/q 1", "acked env/q 1"}, rec.take())
		})
	})
}
