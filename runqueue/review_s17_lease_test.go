package runqueue_test

// Review s17: adversarial probes of leases (ExtendLease, RecoverLeases,
// LeaseDuration, delivery tokens), TTL expiry, delays and priority. Every
// test is named TestS17Lease*. Helpers s17* are in review_s17_dead_test.go.

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// TestS17LeaseExtendAfterRecovery: a holder whose lease was recovered
// gets ErrNotInFlight from ExtendLease while the run waits, ErrLeaseLost
// once it is delivered again, and writes nothing either way; the new
// holder's extension keeps recovery away, and a recovery into the dead
// letter also answers ErrNotInFlight.
func TestS17LeaseExtendAfterRecovery(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		b := s17Setup(t, c, on, func(cfg *runqueue.Config) {
			cfg.LeaseDuration = 10 * time.Second
			cfg.MaxAttempts = 2
		})
		shard := b.q.ShardOf(env)
		enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "r"})
		old := dequeue(t, b, queueName, 1)[0]
		require.True(t, old.LeaseDeadline.Equal(b.clock.Now().Add(10*time.Second)))
		b.clock.Advance(10 * time.Second) // exactly the deadline: recovery may take it
		n, err := b.q.RecoverLeases(b.ctx, shard, 10)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		st := s17AllKeys(t, c, b.prefix)
		oldDeadline := old.LeaseDeadline
		require.ErrorIs(t, b.q.ExtendLease(b.ctx, old, time.Minute), runqueue.ErrNotInFlight)
		require.Equal(t, oldDeadline, old.LeaseDeadline, "a failed extension leaves the Run as it was")
		require.Equal(t, st, s17AllKeys(t, c, b.prefix))

		cur := dequeue(t, b, queueName, 1)[0]
		require.Equal(t, 2, cur.Attempt)
		require.Greater(t, cur.Token, old.Token)
		st = s17AllKeys(t, c, b.prefix)
		require.ErrorIs(t, b.q.ExtendLease(b.ctx, old, time.Minute), runqueue.ErrLeaseLost)
		require.Equal(t, st, s17AllKeys(t, c, b.prefix))

		// The holder's heartbeat, sent twice, and recovery after the first
		// deadline but before the extended one.
		require.NoError(t, b.q.ExtendLease(b.ctx, cur, time.Minute))
		require.NoError(t, b.q.ExtendLease(b.ctx, cur, time.Minute))
		require.True(t, cur.LeaseDeadline.Equal(b.clock.Now().Add(time.Minute)))
		b.clock.Advance(30 * time.Second)
		n, err = b.q.RecoverLeases(b.ctx, shard, 10)
		require.NoError(t, err)
		require.Zero(t, n)
		// A heartbeat after the deadline passed but before a sweep: still the
		// holder.
		b.clock.Advance(31 * time.Second)
		require.NoError(t, b.q.ExtendLease(b.ctx, cur, time.Nanosecond))
		require.True(t, cur.LeaseDeadline.Equal(b.clock.Now().Add(time.Millisecond)), "a sub-ms extension is 1ms")
		b.clock.Advance(time.Millisecond)
		n, err = b.q.RecoverLeases(b.ctx, shard, 10)
		require.NoError(t, err)
		require.Equal(t, 1, n, "attempt 2 of 2: dead")
		d, err := b.q.DeadLetter(b.ctx, env, queueName, "k", "r")
		require.NoError(t, err)
		require.Equal(t, 3, d.Attempt)
		require.ErrorIs(t, b.q.ExtendLease(b.ctx, cur, time.Minute), runqueue.ErrNotInFlight)
		require.ErrorIs(t, b.q.ExtendLease(b.ctx, old, time.Minute), runqueue.ErrNotInFlight)
	})
}

// s17SetClock sets a fake clock to at (Advance takes a Duration, which
// cannot span the centuries to year 9999).
func s17SetClock(c *fakeClock, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = at
}

// TestS17LeaseExtendBadInput: bad extensions are *InvalidErrors that write
// nothing, whatever the run's state.
func TestS17LeaseExtendBadInput(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		b := s17Setup(t, c, on, nil)
		enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "r"})
		r := dequeue(t, b, queueName, 1)[0]
		st := s17AllKeys(t, c, b.prefix)
		for _, d := range []time.Duration{0, -time.Millisecond, runqueue.MaxDuration + 1, -1 << 63} {
			s17Invalid(t, b.q.ExtendLease(b.ctx, r, d), "duration")
		}
		s17Invalid(t, b.q.ExtendLease(b.ctx, nil, time.Second), "run")
		bad := *r
		bad.Token = 0
		s17Invalid(t, b.q.ExtendLease(b.ctx, &bad, time.Second), "token")
		bad.Token = -5
		s17Invalid(t, b.q.ExtendLease(b.ctx, &bad, time.Second), "token")
		bad = *r
		bad.ID = "r "
		s17Invalid(t, b.q.ExtendLease(b.ctx, &bad, time.Second), "id")
		require.Equal(t, st, s17AllKeys(t, c, b.prefix))
		// The longest extension is fine from a clock in this century.
		require.NoError(t, b.q.ExtendLease(b.ctx, r, runqueue.MaxDuration))

		// Near the end of time, now + d past year 9999 is refused.
		late := s17Setup(t, c, on, nil)
		s17SetClock(late.clock, time.UnixMilli(runqueue.MaxTimeUnixMilli-10*60_000))
		enqueue(t, late, runqueue.EnqueueParams{ID: "z"})
		z := dequeue(t, late, queueName, 1)[0]
		st = s17AllKeys(t, c, late.prefix)
		s17Invalid(t, late.q.ExtendLease(late.ctx, z, time.Hour), "duration")
		require.Equal(t, st, s17AllKeys(t, c, late.prefix))
	})
}

// TestS17LeaseRecoverTwice: a recovery sent twice recovers once (attempt +
// 1 once); recovery never touches a lease that is still running.
func TestS17LeaseRecoverTwice(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		b := s17Setup(t, c, on, func(cfg *runqueue.Config) { cfg.LeaseDuration = time.Second })
		shard := b.q.ShardOf(env)
		enqueue(t, b, runqueue.EnqueueParams{ID: "a"})
		enqueue(t, b, runqueue.EnqueueParams{ID: "b"})
		runs := dequeue(t, b, queueName, 2)
		require.Len(t, runs, 2)
		b.clock.Advance(999 * time.Millisecond)
		n, err := b.q.RecoverLeases(b.ctx, shard, 10)
		require.NoError(t, err)
		require.Zero(t, n, "1ms before the deadline")
		require.NoError(t, b.q.ExtendLease(b.ctx, runs[1], time.Minute))
		b.clock.Advance(time.Millisecond)
		n, err = b.q.RecoverLeases(b.ctx, shard, 10)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		st := s17AllKeys(t, c, b.prefix)
		n, err = b.q.RecoverLeases(b.ctx, shard, 10)
		require.NoError(t, err)
		require.Zero(t, n)
		require.Equal(t, st, s17AllKeys(t, c, b.prefix))
		got := dequeue(t, b, queueName, 5)
		require.Equal(t, []string{runs[0].ID}, runIDs(got))
		require.Equal(t, 2, got[0].Attempt)
		require.True(t, got[0].AvailableAt.Equal(b.clock.Now()), "ready at once")
		// Bad sweeps write nothing.
		st = s17AllKeys(t, c, b.prefix)
		for _, args := range [][2]int{{-1, 1}, {b.q.Shards(), 1}, {shard, 0}, {shard, -1}, {shard, 100001}} {
			_, err := b.q.RecoverLeases(b.ctx, args[0], args[1])
			s17Invalid(t, err, "")
			_, err = b.q.ExpireTTL(b.ctx, args[0], args[1])
			s17Invalid(t, err, "")
		}
		require.Equal(t, st, s17AllKeys(t, c, b.prefix))
	})
}

// TestS17LeaseRecoverRacingAck: recovery sweeps racing the holders' acks
// on a real Redis: every run is either acked by its holder or recovered
// (and its holder told ErrNotInFlight), never both and never lost.
func TestS17LeaseRecoverRacingAck(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			t.Parallel()
			c := redistest.Real(t)
			b := s17Setup(t, c, on, func(cfg *runqueue.Config) {
				cfg.LeaseDuration = time.Second
				cfg.SerialCalls = false
			})
			const n = 300
			for i := range n {
				enqueue(t, b, runqueue.EnqueueParams{Key: fmt.Sprintf("k%d", i%9), ID: fmt.Sprintf("r%03d", i)})
			}
			runs := dequeue(t, b, queueName, n)
			require.Len(t, runs, n)
			b.clock.Advance(2 * time.Second)
			var recovered, acked, notInFlight atomic.Int64
			var wg sync.WaitGroup
			stop := make(chan struct{})
			errs := make(chan error, 16)
			for range 3 {
				wg.Go(func() {
					for {
						k, err := b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 7)
						if err != nil {
							errs <- err
							return
						}
						recovered.Add(int64(k))
						select {
						case <-stop:
							if k == 0 {
								return
							}
						default:
						}
					}
				})
			}
			var ackers sync.WaitGroup
			for w := range 4 {
				ackers.Go(func() {
					for i := w; i < n; i += 4 {
						switch err := b.q.Ack(b.ctx, runs[i]); {
						case err == nil:
							acked.Add(1)
						case errors.Is(err, runqueue.ErrNotInFlight):
							notInFlight.Add(1)
						default:
							errs <- fmt.Errorf("ack %s: %w", runs[i].ID, err)
							return
						}
					}
				})
			}
			ackers.Wait()
			close(stop)
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			require.Equal(t, int64(n), acked.Load()+notInFlight.Load())
			require.Equal(t, notInFlight.Load(), recovered.Load(), "recovered exactly the runs whose ack came too late")
			s := queueStats(t, b, queueName)
			require.Equal(t, recovered.Load(), s.Ready)
			require.Zero(t, s.InFlight)
			again := dequeue(t, b, queueName, n)
			require.Len(t, again, int(recovered.Load()))
			for _, r := range again {
				require.Equal(t, 2, r.Attempt)
			}
			ackAll(t, b, again)
			require.Empty(t, s17RunKeys(t, b))
		})
	}
}

// s17ExpiredCount is an Observer that counts the runs expired, by the
// sweeps and by the dequeues that took them past their TTL.
type s17ExpiredCount struct {
	runqueue.NopObserver
	n atomic.Int64
}

func (o *s17ExpiredCount) Expired(_, _ string, n int) { o.n.Add(int64(n)) }

// TestS17LeaseExpireRacingDequeue: TTL sweeps racing dequeues on a real
// Redis: every due run is expired once, by a sweep or by the dequeue that
// takes it, and none is delivered (each is past its TTL); a late sweep
// finds nothing.
func TestS17LeaseExpireRacingDequeue(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			t.Parallel()
			c := redistest.Real(t)
			obs := &s17ExpiredCount{}
			b := s17Setup(t, c, on, func(cfg *runqueue.Config) { cfg.SerialCalls = false; cfg.Observer = obs })
			const n = 300
			for i := range n {
				enqueue(t, b, runqueue.EnqueueParams{Key: fmt.Sprintf("k%d", i%11), ID: fmt.Sprintf("r%03d", i),
					TTL: time.Second})
			}
			b.clock.Advance(time.Second)
			var expired atomic.Int64
			var mu sync.Mutex
			var got []*runqueue.Run
			var wg sync.WaitGroup
			errs := make(chan error, 16)
			for range 2 {
				wg.Go(func() {
					for {
						k, err := b.q.ExpireTTL(b.ctx, b.q.ShardOf(env), 9)
						if err != nil {
							errs <- err
							return
						}
						expired.Add(int64(k))
						if k == 0 {
							return
						}
					}
				})
				wg.Go(func() {
					for {
						rs, err := b.q.Dequeue(b.ctx, env, queueName, 5)
						if err != nil {
							errs <- err
							return
						}
						if len(rs) == 0 {
							return
						}
						mu.Lock()
						got = append(got, rs...)
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			// A late sweep does not touch the runs in flight.
			k, err := b.q.ExpireTTL(b.ctx, b.q.ShardOf(env), 1000)
			require.NoError(t, err)
			expired.Add(int64(k))
			seen := map[string]bool{}
			for _, r := range got {
				require.False(t, seen[r.ID], "delivered twice: %s", r.ID)
				seen[r.ID] = true
			}
			s := queueStats(t, b, queueName)
			require.Equal(t, int64(len(got)), s.InFlight)
			require.Empty(t, got, "runs delivered past their TTL")
			require.Equal(t, int64(n), obs.n.Load(), "expired %d (by sweeps %d), delivered %d, left %+v",
				obs.n.Load(), expired.Load(), len(got), s)
			ackAll(t, b, got)
			require.Empty(t, s17RunKeys(t, b))
		})
	}
}

// TestS17LeaseTTLEdges: a TTL of under a millisecond is one millisecond;
// a run expires at its deadline whether ready or delayed; a nacked or
// recovered run has no TTL any more.
func TestS17LeaseTTLEdges(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		b := s17Setup(t, c, on, func(cfg *runqueue.Config) { cfg.LeaseDuration = time.Second })
		shard := b.q.ShardOf(env)
		enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "tiny", TTL: time.Nanosecond})
		enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: "delayed", TTL: time.Millisecond, Delay: time.Hour})
		n, err := b.q.ExpireTTL(b.ctx, shard, 10)
		require.NoError(t, err)
		require.Zero(t, n)
		b.clock.Advance(time.Millisecond)
		n, err = b.q.ExpireTTL(b.ctx, shard, 10)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		s := queueStats(t, b, queueName)
		require.Equal(t, runqueue.Stats{}, s)
		require.Empty(t, s17RunKeys(t, b))

		enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "n", TTL: time.Minute})
		enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: "l", TTL: time.Minute})
		runs := dequeue(t, b, queueName, 2)
		require.Len(t, runs, 2)
		for _, r := range runs {
			if r.ID == "n" {
				_, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{RetryAt: b.clock.Now().Add(2 * time.Minute)})
				require.NoError(t, err)
			}
		}
		b.clock.Advance(time.Second)
		n, err = b.q.RecoverLeases(b.ctx, shard, 10)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		b.clock.Advance(5 * time.Minute)
		n, err = b.q.ExpireTTL(b.ctx, shard, 10)
		require.NoError(t, err)
		require.Zero(t, n, "delivered runs lost their TTL")
		require.Len(t, dequeue(t, b, queueName, 5), 2)
	})
}

// TestS17LeaseTimeBounds: the time, delay, TTL and priority bounds of
// Enqueue and Nack: out of range is an *InvalidError naming the field,
// with nothing written; the extremes in range are accepted.
func TestS17LeaseTimeBounds(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		b := s17Setup(t, c, on, nil)
		enqueue(t, b, runqueue.EnqueueParams{ID: "held"})
		held := dequeue(t, b, queueName, 1)[0]
		st := s17AllKeys(t, c, b.prefix)
		p := func(f func(*runqueue.EnqueueParams)) runqueue.EnqueueParams {
			x := runqueue.EnqueueParams{Env: env, Queue: queueName, ID: "x"}
			f(&x)
			return x
		}
		for _, tc := range []struct {
			field string
			p     runqueue.EnqueueParams
		}{
			{"priority", p(func(x *runqueue.EnqueueParams) { x.Priority = runqueue.MaxPriority + 1 })},
			{"priority", p(func(x *runqueue.EnqueueParams) { x.Priority = -1 })},
			{"availableAt", p(func(x *runqueue.EnqueueParams) { x.AvailableAt = time.UnixMilli(-1) })},
			{"availableAt", p(func(x *runqueue.EnqueueParams) { x.AvailableAt = time.Unix(0, -1) })},
			{"availableAt", p(func(x *runqueue.EnqueueParams) { x.AvailableAt = time.Date(1, 1, 1, 0, 0, 0, 1, time.UTC) })},
			{"availableAt", p(func(x *runqueue.EnqueueParams) { x.AvailableAt = time.UnixMilli(runqueue.MaxTimeUnixMilli + 1) })},
			{"availableAt", p(func(x *runqueue.EnqueueParams) { x.AvailableAt = time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC) })},
			{"delay", p(func(x *runqueue.EnqueueParams) { x.Delay = -time.Nanosecond })},
			{"delay", p(func(x *runqueue.EnqueueParams) { x.Delay = runqueue.MaxDuration + 1 })},
			{"delay", p(func(x *runqueue.EnqueueParams) { x.Delay, x.AvailableAt = time.Second, time.UnixMilli(1) })},
			{"ttl", p(func(x *runqueue.EnqueueParams) { x.TTL = -time.Nanosecond })},
			{"ttl", p(func(x *runqueue.EnqueueParams) { x.TTL = runqueue.MaxDuration + 1 })},
		} {
			_, err := b.q.Enqueue(b.ctx, tc.p)
			s17Invalid(t, err, tc.field)
		}
		for _, at := range []time.Time{time.UnixMilli(-1), time.UnixMilli(runqueue.MaxTimeUnixMilli + 1),
			time.Date(-5, 1, 1, 0, 0, 0, 0, time.UTC)} {
			_, err := b.q.Nack(b.ctx, held, &runqueue.NackOptions{RetryAt: at})
			s17Invalid(t, err, "retryAt")
			_, err = b.q.Nack(b.ctx, held, &runqueue.NackOptions{RetryAt: at, DeadLetter: true})
			s17Invalid(t, err, "retryAt")
		}
		require.Equal(t, st, s17AllKeys(t, c, b.prefix))

		// The extremes.
		enqueue(t, b, runqueue.EnqueueParams{ID: "epoch", AvailableAt: time.UnixMilli(0), Priority: runqueue.MaxPriority})
		enqueue(t, b, runqueue.EnqueueParams{ID: "end", AvailableAt: time.UnixMilli(runqueue.MaxTimeUnixMilli),
			TTL: runqueue.MaxDuration})
		enqueue(t, b, runqueue.EnqueueParams{ID: "far", Delay: runqueue.MaxDuration})
		got := dequeue(t, b, queueName, 10)
		require.Equal(t, []string{"epoch"}, runIDs(got))
		require.True(t, got[0].AvailableAt.Equal(time.UnixMilli(0)))
		res, err := b.q.Nack(b.ctx, got[0], &runqueue.NackOptions{RetryAt: time.UnixMilli(0)})
		require.NoError(t, err)
		require.True(t, res.Requeued)
		require.Equal(t, []string{"epoch"}, runIDs(dequeue(t, b, queueName, 10)))
		s := queueStats(t, b, queueName)
		require.Equal(t, int64(2), s.Delayed)
		_, err = b.q.Nack(b.ctx, held, &runqueue.NackOptions{RetryAt: time.UnixMilli(runqueue.MaxTimeUnixMilli)})
		require.NoError(t, err)
		require.Equal(t, int64(3), queueStats(t, b, queueName).Delayed)
	})
}

// TestS17LeasePriorityNeverEarly: priority orders a run ahead of older
// work of its key once it is available, never before; a nack keeps the
// priority.
func TestS17LeasePriorityNeverEarly(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		b := s17Setup(t, c, on, func(cfg *runqueue.Config) { cfg.PriorityStep = time.Minute })
		enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "old"})
		enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "hi", Priority: runqueue.MaxPriority, Delay: 10 * time.Second})
		b.clock.Advance(9 * time.Second)
		enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "mid", Priority: 1})
		got := dequeue(t, b, queueName, 1)
		require.Equal(t, []string{"mid"}, runIDs(got), "priority 1 (a minute) beats 9s of age")
		b.clock.Advance(999 * time.Millisecond)
		got2 := dequeue(t, b, queueName, 1)
		require.Equal(t, []string{"old"}, runIDs(got2), "hi is not available yet")
		_, err := b.q.Nack(b.ctx, got2[0], &runqueue.NackOptions{RetryAt: b.clock.Now()})
		require.NoError(t, err)
		b.clock.Advance(time.Millisecond)
		got3 := dequeue(t, b, queueName, 2)
		require.Equal(t, []string{"hi", "old"}, runIDs(got3))
		_, err = b.q.Nack(b.ctx, got[0], &runqueue.NackOptions{RetryAt: b.clock.Now()})
		require.NoError(t, err)
		enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "new0", AvailableAt: b.clock.Now().Add(-30 * time.Second)})
		got4 := dequeue(t, b, queueName, 2)
		require.Equal(t, []string{"mid", "new0"}, runIDs(got4), "the nacked run kept its priority")
	})
}

// TestS17LeaseClockBefore1970: a Config.Clock that steps back before the
// Unix epoch must not let a write store a time outside 0..MaxTimeUnixMilli.
//
// DEFECT (fixed since: every call that writes checks the clock's reading,
// an *InvalidError naming Config.Clock, and Nack its computed retry time):
// q.now() (queue.go) was handed to the scripts unchecked, and the
// write paths check only now + Delay and now + TTL (checkEnqueue:
// checkDeadline, so an Enqueue with a TTL is refused with an
// *InvalidError) but not now itself (an Enqueue without delay or TTL),
// nor Nack's retry = now + Backoff (leases.go). Both write a record whose
// available_at is negative, which lua/lib/record.lua's rec_parse
// ('^(%d+)|(%d+)|(%d)|(%d+)|...') cannot read: RecoverLeases then fails
// with a raw Lua error ("attempt to perform arithmetic on field 'att'"),
// and once the clock is right again every Dequeue of the queue fails in
// dq_promote_variant ("arithmetic on field 'pr'"): the whole queue is
// wedged by one bad clock reading. Expected: the write is refused with an
// *InvalidError (as an Enqueue with a TTL already is) and nothing is
// written, so the queue keeps working. Fix: check now against
// 0..MaxTimeUnixMilli once per call (an *InvalidError naming
// "Config.Clock"), and check Nack's computed retry time like RetryAt.
func TestS17LeaseClockBefore1970(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		b := s17Setup(t, c, on, func(cfg *runqueue.Config) { cfg.LeaseDuration = time.Second })
		good := b.clock.Now()
		enqueue(t, b, runqueue.EnqueueParams{ID: "held"})
		enqueue(t, b, runqueue.EnqueueParams{ID: "queued"})
		held := dequeue(t, b, queueName, 1)[0]

		s17SetClock(b.clock, time.Unix(-100000, 0))
		// With a TTL the bad clock is refused, nothing written.
		st := s17AllKeys(t, c, b.prefix)
		_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, ID: "t", TTL: time.Minute})
		s17Invalid(t, err, "")
		require.Equal(t, st, s17AllKeys(t, c, b.prefix))
		// Without one it must be refused the same way.
		_, err = b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, ID: "x"})
		require.ErrorIs(t, err, runqueue.ErrInvalid, "an enqueue at a time before 1970")
		_, err = b.q.Nack(b.ctx, held, nil)
		require.ErrorIs(t, err, runqueue.ErrInvalid, "a nack whose retry time is before 1970")
		// Every other call that writes refuses it too, naming the clock.
		_, err = b.q.Dequeue(b.ctx, env, queueName, 1)
		s17Invalid(t, err, "Config.Clock")
		_, _, err = b.q.AckAndDequeue(b.ctx, []*runqueue.Run{held}, env, queueName, 1)
		s17Invalid(t, err, "Config.Clock")
		s17Invalid(t, b.q.Ack(b.ctx, held), "Config.Clock")
		s17Invalid(t, b.q.ExtendLease(b.ctx, held, time.Minute), "Config.Clock")
		_, err = b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 10)
		s17Invalid(t, err, "Config.Clock")
		_, err = b.q.ExpireTTL(b.ctx, b.q.ShardOf(env), 10)
		s17Invalid(t, err, "Config.Clock")
		s17Invalid(t, b.q.Redrive(b.ctx, env, queueName, "", "held"), "Config.Clock")
		require.Equal(t, st, s17AllKeys(t, c, b.prefix))

		// The clock is right again: the queue works.
		s17SetClock(b.clock, good.Add(time.Minute))
		_, err = b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 10)
		require.NoError(t, err)
		runs, err := b.q.Dequeue(b.ctx, env, queueName, 10)
		require.NoError(t, err)
		require.NotEmpty(t, runs)
	})
}
