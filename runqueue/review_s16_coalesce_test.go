package runqueue_test

// Review s16: adversarial probes of the coalesced Enqueue, Ack and Dequeue
// paths (coalesce.go) and their cancellation, and of Close racing with
// them. Every test is named TestS16Coalesce*. See the comment of each test
// for what it probes; a test that showed a defect says DEFECT (fixed since;
// it passes):
//   - TestS16CoalesceEnqueueRetryOvertakenByAbandonedSend (serial=false):
//     a coalesced Enqueue that returned ctx.Err() kept its send going; the
//     retry the doc calls safe could be queued, dequeued and acked before
//     the abandoned send landed and queued the run a second time (fixed:
//     a caller whose run is on the wire waits for its send).
//   - TestS16CoalesceDequeueShardRunsWithError (doc/API): DequeueShard and
//     DequeueShardWait returned held runs together with ctx.Err(), which
//     their docs did not say (fixed: runs come back with a nil error).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// s16Backends are miniredis (logic) and the binary's shared real Redis
// (timing); the cluster is left out to keep the probes fast.
var s16Backends = []backend{
	{Name: "Mini", Client: redistest.Mini},
	{Name: "Real", Client: redistest.Real},
}

func s16EachBackend(t *testing.T, fn func(t *testing.T, c redis.UniversalClient)) {
	redistest.ForEachBackend(t, s16Backends, fn)
}

// s16EachFlag runs fn with the scheduler flag off and on, on each backend.
func s16EachFlag(t *testing.T, fn func(t *testing.T, c redis.UniversalClient, on bool)) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			s16EachBackend(t, func(t *testing.T, c redis.UniversalClient) { fn(t, c, on) })
		})
	}
}

// s16Outcome is what one Enqueue said.
type s16Outcome struct {
	ok  bool
	err error
}

func (o s16Outcome) String() string {
	var qf *runqueue.QueueFullError
	var inv *runqueue.InvalidError
	switch {
	case o.err == nil:
		return fmt.Sprintf("ok=%v", o.ok)
	case errors.As(o.err, &qf):
		return "full:" + qf.Scope
	case errors.As(o.err, &inv):
		return "invalid:" + inv.Field
	case errors.Is(o.err, runqueue.ErrConflict):
		return "conflict"
	default:
		return "err:" + o.err.Error()
	}
}

// s16EnqueueAsync calls Enqueue in a goroutine.
func s16EnqueueAsync(ctx context.Context, q *runqueue.Queue, p runqueue.EnqueueParams) <-chan s16Outcome {
	out := make(chan s16Outcome, 1)
	go func() {
		ok, err := q.Enqueue(ctx, p)
		out <- s16Outcome{ok, err}
	}()
	return out
}

// s16HoldEnqueueSenders sends a run of queue "hold" in each of the two
// senders, each held at h's gate, and returns their outcomes.
func s16HoldEnqueueSenders(t *testing.T, b *testBundle, h *gateHook) []<-chan s16Outcome {
	t.Helper()
	var out []<-chan s16Outcome
	for i := range 2 {
		out = append(out, s16EnqueueAsync(b.ctx, b.q, runqueue.EnqueueParams{Env: env, Queue: "hold", ID: fmt.Sprintf("h%d", i)}))
		h.await(t, i+1)
	}
	return out
}

// s16Pend starts Enqueue calls of ps in order, each waiting in the pending
// list before the next starts (the senders are held), so that they go in
// one batch in this order.
func s16Pend(t *testing.T, b *testBundle, ctxs []context.Context, ps []runqueue.EnqueueParams) []<-chan s16Outcome {
	t.Helper()
	base := b.q.PendingEnqueues()
	out := make([]<-chan s16Outcome, len(ps))
	for i, p := range ps {
		ctx := b.ctx
		if ctxs != nil && ctxs[i] != nil {
			ctx = ctxs[i]
		}
		out[i] = s16EnqueueAsync(ctx, b.q, p)
		require.Eventually(t, func() bool { return b.q.PendingEnqueues() == base+i+1 }, 5*time.Second, time.Millisecond)
	}
	return out
}

// s16Norm renders a dump with the bundle's prefix taken out, so that the
// states of two bundles compare.
func s16Norm(t *testing.T, b *testBundle) map[string]string {
	t.Helper()
	out := map[string]string{}
	for k, v := range b.dump(t) {
		out[strings.ReplaceAll(k, b.prefix, "P")] = strings.ReplaceAll(v, b.prefix, "P")
	}
	return out
}

// s16Sequence is a batch of runs whose outcomes depend on one another:
// idempotent retries, conflicts by payload and by key, admission limits
// (when set), delayed runs, TTLs, and with filler runs of other keys so
// that the batch takes the enqueue script's bulk path (32 runs or more, no
// limit) or not.
func s16Sequence(fill int) []runqueue.EnqueueParams {
	r := func(id, key, payload string) runqueue.EnqueueParams {
		return runqueue.EnqueueParams{Env: env, Queue: "q", Key: key, ID: id, Payload: []byte(payload)}
	}
	seq := []runqueue.EnqueueParams{
		r("x", "k", "p1"),
		r("x", "k", "p1"), // idempotent retry in the same batch
		r("x", "k", "p2"), // conflict: payload
		r("x", "k2", "p1"),
		r("y", "k2", "py"),
		r("w1", "k", "pw1"),
		r("w2", "k", "pw2"),
		r("x", "k", "p1"),
	}
	z := r("z", "", "pz")
	z.Delay = time.Minute
	z.TTL = time.Hour
	seq = append(seq, z, z)
	zc := z
	zc.Delay = 2 * time.Minute // same body: the delay is not part of it
	seq = append(seq, zc)
	for i := range fill {
		seq = append(seq, r(fmt.Sprintf("f%02d", i), fmt.Sprintf("fk%d", i%5), "f"))
	}
	seq = append(seq, r("x", "", "p1"), r("f00", "fk0", "f"), r("f01", "fk1", "g"))
	return seq
}

// A batch of coalesced Enqueues whose runs depend on one another (the same
// id twice, a conflict by payload and by key, an admission limit reached in
// the batch, an idempotent retry of a run while its key is full, delayed
// runs and TTLs) gives every caller the answer a call of its own, in the
// batch's order, gives; and Redis ends in the same state, key for key. On
// the enqueue script's run-by-run path (limits) and bulk path (no limit,
// 32 runs or more), flag off and on.
func TestS16CoalesceEnqueueBatchMatchesSerial(t *testing.T) {
	cases := []struct {
		name  string
		fill  int
		limit func(*runqueue.Config)
	}{
		{"each/keydepth", 0, func(c *runqueue.Config) { c.MaxKeyDepth = 2 }},
		{"each/queuedepth", 30, func(c *runqueue.Config) { c.MaxQueueDepth = 20 }},
		{"each/nolimit", 0, nil},
		{"bulk", 40, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
				mutate := func(serial bool) func(*runqueue.Config) {
					return func(cfg *runqueue.Config) {
						cfg.VtimeScheduling = on
						cfg.SerialCalls = serial
						if tc.limit != nil {
							tc.limit(cfg)
						}
					}
				}
				seq := s16Sequence(tc.fill)
				// The reference: each run in a call of its own.
				ref := setup(t, c, mutate(true))
				for i := range 2 {
					ok, err := ref.q.Enqueue(ref.ctx, runqueue.EnqueueParams{Env: env, Queue: "hold", ID: fmt.Sprintf("h%d", i)})
					require.NoError(t, err)
					require.True(t, ok)
				}
				want := make([]string, len(seq))
				for i, p := range seq {
					ok, err := ref.q.Enqueue(ref.ctx, p)
					want[i] = s16Outcome{ok, err}.String()
				}
				// Sanity of the reference itself.
				require.Equal(t, "ok=true", want[0])
				require.Equal(t, "ok=false", want[1])
				require.Equal(t, "conflict", want[2])
				require.Equal(t, "conflict", want[3])

				h := newGateHook(8)
				b := gated(t, c, h, mutate(false))
				held := s16HoldEnqueueSenders(t, b, h)
				pend := s16Pend(t, b, nil, seq)
				h.open()
				for _, ch := range held {
					o := <-ch
					require.NoError(t, o.err)
					require.True(t, o.ok)
				}
				got := make([]string, len(seq))
				for i, ch := range pend {
					got[i] = (<-ch).String()
				}
				require.Equal(t, want, got, "each caller's answer, coalesced vs call by call")
				require.Eventually(t, func() bool { return b.q.Senders() == 0 }, 5*time.Second, time.Millisecond)
				calls := h.calls()
				require.Contains(t, calls, len(seq), "the pending runs went in one script call: %v", calls)
				require.Equal(t, s16Norm(t, ref), s16Norm(t, b), "Redis state, coalesced vs call by call")
			})
		})
	}
}

// s16SetClock sets a fake clock to t.
func s16SetClock(c *fakeClock, t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// A coalesced Enqueue whose context ends: while its run waits in the
// pending list, the run is withdrawn (nothing written; a retry queues it);
// once its batch is on the wire, Enqueue waits for the batch and returns
// its result (true), and a retry with the same id and payload is a no-op
// (false, nil) that leaves one run, with its payload, counted once by the
// Observer.
func TestS16CoalesceEnqueueCancelThenRetry(t *testing.T) {
	s16EachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		obs := &countObserver{}
		h := newGateHook(8)
		b := gated(t, c, h, func(cfg *runqueue.Config) { cfg.Observer = obs })
		// "sent": the first sender's run, held on the wire.
		sentCtx, cancelSent := context.WithCancel(b.ctx)
		defer cancelSent()
		sent := s16EnqueueAsync(sentCtx, b.q, coalesceRun("sent"))
		h.await(t, 1)
		other := s16EnqueueAsync(b.ctx, b.q, coalesceRun("other"))
		h.await(t, 2)
		// "pending": waits for a sender, then gives up.
		pendCtx, cancelPend := context.WithCancel(b.ctx)
		pend := s16Pend(t, b, []context.Context{pendCtx, nil}, []runqueue.EnqueueParams{coalesceRun("pending"), coalesceRun("after")})
		cancelPend()
		require.ErrorIs(t, (<-pend[0]).err, context.Canceled)
		require.Equal(t, 1, b.q.PendingEnqueues(), "the cancelled run left the pending list")
		cancelSent()
		select {
		case o := <-sent:
			t.Fatalf("a cancelled caller whose batch is on the wire waits for it, yet returned %s", o)
		case <-time.After(50 * time.Millisecond):
		}
		h.open()
		require.Equal(t, "ok=true", (<-sent).String(), "its batch went through: the caller learns it")
		require.Equal(t, "ok=true", (<-other).String())
		require.Equal(t, "ok=true", (<-pend[1]).String())
		require.Eventually(t, func() bool { return b.q.Senders() == 0 }, 5*time.Second, time.Millisecond)
		h.arm(false)

		st := queueStats(t, b, "q")
		require.Equal(t, int64(3), st.Ready, "sent, other and after; pending withdrawn")
		// Retries: the written one is a no-op, the withdrawn one queues.
		ok, err := b.q.Enqueue(b.ctx, coalesceRun("sent"))
		require.NoError(t, err)
		require.False(t, ok, "the run of the abandoned batch was written: its retry is a no-op")
		ok, err = b.q.Enqueue(b.ctx, coalesceRun("pending"))
		require.NoError(t, err)
		require.True(t, ok, "the withdrawn run was not written")
		runs := dequeue(t, b, "q", 100)
		require.ElementsMatch(t, []string{"sent", "other", "after", "pending"}, runIDs(runs))
		for _, r := range runs {
			require.Equal(t, "p-"+r.ID, string(r.Payload))
		}
		require.EqualValues(t, 4, obs.n.Load(), "each run counted once")
	})
}

// A retry after a cancelled Enqueue can never be overtaken by the send it
// retries. The caller's batch is on the wire (held here by a go-redis
// hook, as a slow connection, a read timeout that go-redis sends again
// after a backoff, or a stalled sender would hold it) when its context
// ends. Were Enqueue to return ctx.Err() at once, the caller could retry
// (queued: true), a consumer dequeue and ack the run (its id free again),
// and then the first send land and queue the run a second time: a run
// enqueued once, processed once, delivered again. So a caller whose run
// was taken waits for its send, coalesced (serial=false) as with a call of
// its own (serial=true; there the cancelled call may also be refused
// before it gets a connection, with nothing written).
//
// Found as a defect in review s16 (coalesce.go do() returned ctx.Err() at
// once for Enqueue): the second dequeue returned run "x" again.
func TestS16CoalesceEnqueueRetryOvertakenByAbandonedSend(t *testing.T) {
	for _, serial := range []bool{false, true} {
		t.Run(fmt.Sprintf("serial=%v", serial), func(t *testing.T) {
			s16EachBackend(t, func(t *testing.T, c redis.UniversalClient) {
				h := newGateHook(8)
				b := gated(t, c, h, func(cfg *runqueue.Config) { cfg.SerialCalls = serial })
				ctx, cancel := context.WithCancel(b.ctx)
				defer cancel()
				first := s16EnqueueAsync(ctx, b.q, coalesceRun("x"))
				h.await(t, 1) // on its way, held
				cancel()
				var o s16Outcome
				returned := false
				select {
				case o = <-first:
					returned = true
				case <-time.After(50 * time.Millisecond):
					h.open() // the send lands
					o = <-first
				}
				if !serial {
					require.False(t, returned, "a coalesced caller whose run is on the wire waits for its send; got %s", o)
					require.Equal(t, "ok=true", o.String(), "the caller learns that its send queued the run")
				}
				if o.err != nil { // (serial: refused before it got a connection)
					require.ErrorIs(t, o.err, context.Canceled)
					require.False(t, o.ok)
				}
				written := o.err == nil
				// The caller retries; nothing else is held now.
				h.arm(false)
				ok, err := b.q.Enqueue(b.ctx, coalesceRun("x"))
				require.NoError(t, err)
				require.Equal(t, !written, ok, "the retry queues the run only when the first call did not")
				runs := dequeue(t, b, "q", 10)
				require.Equal(t, []string{"x"}, runIDs(runs))
				require.NoError(t, b.q.Ack(b.ctx, runs[0]))
				h.open()
				require.Eventually(t, func() bool { return b.q.Senders() == 0 }, 5*time.Second, time.Millisecond)
				again := dequeue(t, b, "q", 10)
				require.Empty(t, runIDs(again), "run x was enqueued, dequeued and acked once: nothing queues it again")
			})
		})
	}
}

// A run that passed Enqueue's validation but is invalid by the time its
// batch is sent (its delay or TTL reaches past MaxTimeUnixMilli from the
// send's clock) gets a typed *InvalidError (errors.Is ErrInvalid) with
// nothing of it written, and the runs of its batch are queued as if it
// were not there.
func TestS16CoalesceEnqueueInvalidAtSend(t *testing.T) {
	s16EachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		h := newGateHook(8)
		b := gated(t, c, h, nil)
		max := time.UnixMilli(runqueue.MaxTimeUnixMilli)
		// 100 years (MaxDuration) before the end of time.
		s16SetClock(b.clock, max.Add(-runqueue.MaxDuration))
		held := s16HoldEnqueueSenders(t, b, h)
		badDelay := coalesceRun("bad-delay")
		badDelay.Delay = runqueue.MaxDuration
		badTTL := coalesceRun("bad-ttl")
		badTTL.TTL = runqueue.MaxDuration
		pend := s16Pend(t, b, nil, []runqueue.EnqueueParams{coalesceRun("a"), badDelay, coalesceRun("b"), badTTL, coalesceRun("c")})
		b.clock.Advance(time.Millisecond) // the send's clock: now + 100y is past the end
		h.open()
		for _, ch := range held {
			require.NoError(t, (<-ch).err)
		}
		var got []string
		for _, ch := range pend {
			o := <-ch
			if o.err != nil {
				require.ErrorIs(t, o.err, runqueue.ErrInvalid)
			}
			got = append(got, o.String())
		}
		require.Equal(t, []string{"ok=true", "invalid:delay", "ok=true", "invalid:ttl", "ok=true"}, got)
		require.Eventually(t, func() bool { return b.q.Senders() == 0 }, 5*time.Second, time.Millisecond)
		h.arm(false)
		require.Equal(t, []string{"a", "b", "c"}, queuedIDs(t, b))
		for _, id := range []string{"bad-delay", "bad-ttl"} {
			_, _, _, err := b.q.RecordOf(b.ctx, env, "q", id)
			require.ErrorIs(t, err, redis.Nil, "nothing of %s written", id)
		}
	})
}

// s16AckCounter counts Observer.Acked.
type s16AckCounter struct {
	runqueue.NopObserver
	n atomic.Int64
}

func (o *s16AckCounter) Acked(_, _ string, n int) { o.n.Add(int64(n)) }

// One batch of coalesced Acks of one queue that mixes valid acks, a run
// acked twice, a stale delivery's ack before and after the holder's, an
// ack under the wrong key, an ack of a run that is no longer in flight, of
// a run gone already and of a run that never was: each caller gets what a
// call of its own, after the ones before it, would get; only the valid
// ones are acked and counted; the run not in flight stays queued.
func TestS16CoalesceAckMixedBatch(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		obs := &s16AckCounter{}
		h := newGateHook(3)
		b := gated(t, c, h, func(cfg *runqueue.Config) {
			cfg.VtimeScheduling = on
			cfg.Observer = obs
			cfg.LeaseDuration = time.Minute
			cfg.MaxAttempts = -1
		})
		h.arm(false)
		p := func(id, key string, prio int) runqueue.EnqueueParams {
			return runqueue.EnqueueParams{Env: env, Queue: "q", Key: key, ID: id, Priority: prio, Payload: []byte(id)}
		}
		enqueue(t, b, p("r3", "k3", 9))
		enqueue(t, b, p("r5", "k5", 0))
		first := dequeue(t, b, "q", 2)
		require.Equal(t, []string{"r3", "r5"}, runIDs(first))
		r3old, r5old := first[0], first[1]
		b.clock.Advance(2 * time.Minute)
		n, err := b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 100)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		for _, x := range []runqueue.EnqueueParams{p("r1", "k1", 0), p("r2", "k1", 0), p("r4", "k4", 0), p("r6", "k6", 0)} {
			enqueue(t, b, x)
		}
		r3new := dequeue(t, b, "q", 1)[0]
		require.Equal(t, "r3", r3new.ID)
		rest := dequeue(t, b, "q", 10)
		byID := map[string]*runqueue.Run{}
		for _, r := range rest {
			byID[r.ID] = r
		}
		require.Len(t, byID, 5)
		_, err = b.q.Nack(b.ctx, byID["r5"], &runqueue.NackOptions{RetryAt: b.clock.Now().Add(time.Hour)})
		require.NoError(t, err)
		require.NoError(t, b.q.Ack(b.ctx, byID["r6"]))
		enqueue(t, b, runqueue.EnqueueParams{Queue: "hold", ID: "h0"})
		enqueue(t, b, runqueue.EnqueueParams{Queue: "hold", ID: "h1"})
		hold := dequeue(t, b, "hold", 2)
		before := obs.n.Load()

		h.reset(3)
		var held []<-chan error
		for i, r := range hold {
			held = append(held, s16AckAsync(b.ctx, b.q, r))
			h.await(t, i+1)
		}
		wrongKey := *byID["r4"]
		wrongKey.Key = "kX"
		never := *byID["r1"]
		never.ID = "never"
		acks := []struct {
			name string
			r    *runqueue.Run
			want error
		}{
			{"r1", byID["r1"], nil},
			{"r2", byID["r2"], nil},
			{"r2 again", byID["r2"], nil},
			{"r3 stale before", r3old, runqueue.ErrLeaseLost},
			{"r3 holder", r3new, nil},
			{"r3 stale after", r3old, nil}, // gone by then
			{"r4 wrong key", &wrongKey, runqueue.ErrNotFound},
			{"r4", byID["r4"], nil},
			{"r5 not in flight", r5old, runqueue.ErrNotInFlight},
			{"r5 nacked delivery", byID["r5"], runqueue.ErrNotInFlight},
			{"r6 gone", byID["r6"], nil},
			{"never", &never, nil},
		}
		chs := make([]<-chan error, len(acks))
		for i, a := range acks {
			chs[i] = s16AckAsync(b.ctx, b.q, a.r)
			require.Eventually(t, func() bool { return b.q.PendingAcks() == i+1 }, 5*time.Second, time.Millisecond)
		}
		h.open()
		for _, ch := range held {
			require.NoError(t, <-ch)
		}
		for i, a := range acks {
			err := <-chs[i]
			if a.want == nil {
				require.NoError(t, err, a.name)
			} else {
				require.ErrorIs(t, err, a.want, a.name)
			}
		}
		require.Contains(t, h.calls(), len(acks), "the acks went in one script call")
		require.Eventually(t, func() bool { return b.q.Senders() == 0 }, 5*time.Second, time.Millisecond)
		require.EqualValues(t, 2+4, obs.n.Load()-before, "acked: h0, h1, r1, r2, r3, r4")
		st := queueStats(t, b, "q")
		require.Equal(t, runqueue.Stats{Delayed: 1}, runqueue.Stats{Ready: st.Ready, Delayed: st.Delayed, InFlight: st.InFlight})
		for _, k := range []string{"k1", "k3", "k4", "k5", "k6"} {
			n, err := b.q.KeyInflight(b.ctx, env, "q", k)
			require.NoError(t, err)
			require.Zero(t, n, k)
		}
		es, err := b.q.EnvStats(b.ctx, env)
		require.NoError(t, err)
		require.Zero(t, es.InFlight)
	})
}

// s16AckAsync calls Ack in a goroutine.
func s16AckAsync(ctx context.Context, q *runqueue.Queue, r *runqueue.Run) <-chan error {
	out := make(chan error, 1)
	go func() { out <- q.Ack(ctx, r) }()
	return out
}

// s16GatedDequeues is gatedDequeues on s16Backends.
func s16GatedDequeues(t *testing.T, mutate func(*runqueue.Config), fn func(t *testing.T, b *testBundle, h *scriptGate)) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		h := newScriptGate()
		o := otherClient(t, c)
		b := setup(t, o, func(cfg *runqueue.Config) {
			cfg.VtimeScheduling = on
			if mutate != nil {
				mutate(cfg)
			}
		})
		o.AddHook(h)
		t.Cleanup(h.open)
		fn(t, b, h)
	})
}

// s16Pending waits until n Dequeue calls wait for a sender.
func s16PendingDequeues(t *testing.T, b *testBundle, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return b.q.PendingDequeues() == n }, 5*time.Second, time.Millisecond)
}

// Callers of one coalesced Dequeue whose contexts end once the combined
// call is on the wire (one cancelled, one past its deadline) keep waiting
// and get the runs served for them, with no error: no run is left in
// flight for nobody, none goes to another caller, and nothing is served
// twice (the Dequeue doc: "once sent, it waits for the script call's
// reply ... and returns what it served for it").
func TestS16CoalesceDequeueCancelAfterSent(t *testing.T) {
	s16GatedDequeues(t, nil, func(t *testing.T, b *testBundle, h *scriptGate) {
		enqueueIDs(t, b, "q", "r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8", "r9")
		h.arm(true)
		a := dequeueAsync(b.ctx, b, "q", 1)
		h.await(t, 1)
		a2 := dequeueAsync(b.ctx, b, "q", 1)
		h.await(t, 2)
		ctxC, cancelC := context.WithCancel(b.ctx)
		defer cancelC()
		c := dequeueAsync(ctxC, b, "q", 2)
		s16PendingDequeues(t, b, 1)
		d := dequeueAsync(b.ctx, b, "q", 1)
		s16PendingDequeues(t, b, 2)
		// f's deadline must pass only once a's sender has taken f (after
		// release(0) below), or f is withdrawn instead: a bound generous
		// for a loaded machine, waited out below.
		ctxF, cancelF := context.WithTimeout(b.ctx, 2*time.Second)
		defer cancelF()
		f := dequeueAsync(ctxF, b, "q", 2)
		s16PendingDequeues(t, b, 3)
		h.release(t, 0) // a's sender takes c, d and f: one call of 5, held
		h.await(t, 3)
		require.Equal(t, 5, h.size(2)[0])
		require.Zero(t, b.q.PendingDequeues())
		cancelC()
		<-ctxF.Done()
		select {
		case o := <-c:
			t.Fatalf("c returned (%v, %v) while its call was on the wire", runIDs(o.runs), o.err)
		case o := <-f:
			t.Fatalf("f returned (%v, %v) while its call was on the wire", runIDs(o.runs), o.err)
		case <-time.After(20 * time.Millisecond):
		}
		h.open()
		got := dqOutcomes(t, []<-chan deqOutcome{a, a2, c, d, f})
		// a went first; a2's call and the coalesced one were let go
		// together, in either order; the coalesced one hands its runs out
		// in serve order, the earliest caller first.
		var all []string
		for i, n := range []int{1, 1, 2, 1, 2} {
			require.Len(t, got[i], n, "call %d: %v", i, got)
			all = append(all, got[i]...)
		}
		require.Equal(t, []string{"r0", "r1", "r2", "r3", "r4", "r5", "r6"}, sortedCopy(all), "nothing served twice")
		batch := append(append(append([]string{}, got[2]...), got[3]...), got[4]...)
		require.True(t, slices.IsSorted(batch), "serve order, earliest caller first: %v", batch)
		require.Eventually(t, func() bool { return b.q.Senders() == 0 }, 5*time.Second, time.Millisecond)
		h.arm(false)
		st := queueStats(t, b, "q")
		require.Equal(t, int64(7), st.InFlight, "exactly the runs handed out are in flight")
		require.Equal(t, int64(3), st.Ready)
	})
}

// Every caller of a coalesced Dequeue has a deadline, and all of them pass
// while the combined call waits to be sent (held in a go-redis hook, as a
// busy connection pool would hold it): whatever the call then does, each
// caller's answer matches Redis: an error only when nothing was served
// for it, and the runs in flight are exactly those handed out.
func TestS16CoalesceDequeueAllDeadlinesPassBeforeSend(t *testing.T) {
	s16GatedDequeues(t, nil, func(t *testing.T, b *testBundle, h *scriptGate) {
		enqueueIDs(t, b, "q", "r0", "r1", "r2", "r3", "r4", "r5")
		h.arm(true)
		a := dequeueAsync(b.ctx, b, "q", 1)
		h.await(t, 1)
		a2 := dequeueAsync(b.ctx, b, "q", 1)
		h.await(t, 2)
		// The deadline must pass only once a's sender has taken c and d
		// (after release(0) below), or they are withdrawn and no third
		// call comes: a bound generous for a loaded machine, waited out
		// below.
		ctx, cancel := context.WithTimeout(b.ctx, 2*time.Second)
		defer cancel()
		c := dequeueAsync(ctx, b, "q", 2)
		s16PendingDequeues(t, b, 1)
		d := dequeueAsync(ctx, b, "q", 1)
		s16PendingDequeues(t, b, 2)
		h.release(t, 0)
		h.await(t, 3)
		<-ctx.Done()
		h.open()
		handed := 0
		for i, ch := range []<-chan deqOutcome{a, a2, c, d} {
			o := <-ch
			if o.err != nil {
				require.ErrorIs(t, o.err, context.DeadlineExceeded, "call %d", i)
				require.Empty(t, o.runs)
			}
			t.Logf("call %d: %v %v", i, runIDs(o.runs), o.err)
			handed += len(o.runs)
		}
		require.Eventually(t, func() bool { return b.q.Senders() == 0 }, 5*time.Second, time.Millisecond)
		h.arm(false)
		st := queueStats(t, b, "q")
		require.Equal(t, int64(handed), st.InFlight, "no run in flight that no caller got")
		require.Equal(t, int64(6-handed), st.Ready)
	})
}

// Close while both Enqueue senders are held with runs pending: Close waits
// for them; a pending caller that gives up meanwhile is withdrawn (nothing
// written); an Enqueue that starts while Close waits goes as a call of its
// own; once the senders are let go every pending caller gets its answer,
// Close returns, no sender is left, and Redis holds exactly the runs
// reported queued.
func TestS16CoalesceCloseWhileHeld(t *testing.T) {
	s16EachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		h := newGateHook(8)
		b := gated(t, c, h, nil)
		held := s16HoldEnqueueSenders(t, b, h)
		ctx2, cancel2 := context.WithCancel(b.ctx)
		defer cancel2()
		pend := s16Pend(t, b, []context.Context{nil, ctx2, nil},
			[]runqueue.EnqueueParams{coalesceRun("e1"), coalesceRun("e2"), coalesceRun("e3")})
		closed := make(chan error, 1)
		go func() { closed <- b.q.Close() }()
		select {
		case err := <-closed:
			t.Fatalf("Close returned (%v) with calls in flight", err)
		case <-time.After(30 * time.Millisecond):
		}
		cancel2()
		require.ErrorIs(t, (<-pend[1]).err, context.Canceled)
		// While Close waits: a call of its own (held at the gate too).
		late := s16EnqueueAsync(b.ctx, b.q, coalesceRun("e4"))
		h.await(t, 3)
		require.Equal(t, 2, b.q.PendingEnqueues(), "e4 did not join the pending list")
		h.open()
		select {
		case err := <-closed:
			require.NoError(t, err)
		case <-time.After(5 * time.Second):
			t.Fatal("Close did not return")
		}
		for _, ch := range append(held, pend[0], pend[2], late) {
			require.Equal(t, "ok=true", (<-ch).String())
		}
		require.Zero(t, b.q.Senders())
		require.Zero(t, b.q.PendingEnqueues())
		h.arm(false)
		require.Equal(t, []string{"e1", "e3", "e4"}, queuedIDs(t, b))
		// After Close: calls work, each on its own.
		ok, err := b.q.Enqueue(b.ctx, coalesceRun("e5"))
		require.NoError(t, err)
		require.True(t, ok)
		require.Zero(t, b.q.Senders())
	})
}

// Close in the middle of concurrent Enqueue, Dequeue and Ack calls of
// one Queue, many of them with contexts that end mid-call: no call hangs,
// every call after Close still works, Close leaves no sender, every run an
// Enqueue reported queued is delivered exactly once, no run is delivered
// that nobody enqueued, and once every run handed out is acked nothing is
// left in flight (a Dequeue that returned an error held nothing).
func TestS16CoalesceCloseUnderLoad(t *testing.T) {
	s16EachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, nil)
		const workers, per = 6, 60
		var mu sync.Mutex
		queued := map[string]bool{} // Enqueue said true
		maybe := map[string]bool{}  // Enqueue said ctx.Err()
		got := map[string]int{}     // deliveries
		var toAck []*runqueue.Run   // acks that failed with ctx.Err(), retried at the end
		var wg sync.WaitGroup
		closed := make(chan struct{})
		for w := range workers {
			wg.Go(func() {
				for i := range per {
					if i == per/3 && w == 0 {
						if err := b.q.Close(); err != nil {
							t.Errorf("Close: %v", err)
						}
						close(closed)
					}
					d := time.Duration((w*per+i)%7) * 100 * time.Microsecond
					ctx, cancel := context.WithTimeout(b.ctx, d+50*time.Microsecond)
					id := fmt.Sprintf("w%d-%d", w, i)
					ok, err := b.q.Enqueue(ctx, coalesceRun(id))
					mu.Lock()
					switch {
					case err == nil && ok:
						queued[id] = true
					case err == nil:
						t.Errorf("%s: new run reported as existing", id)
					case errors.Is(err, context.DeadlineExceeded):
						maybe[id] = true
					default:
						t.Errorf("%s: %v", id, err)
					}
					mu.Unlock()
					runs, err := b.q.Dequeue(ctx, env, "q", 1+i%3)
					if err != nil && (!errors.Is(err, context.DeadlineExceeded) || len(runs) > 0) {
						t.Errorf("Dequeue: %v with %d runs", err, len(runs))
					}
					for _, r := range runs {
						mu.Lock()
						got[r.ID]++
						mu.Unlock()
						if err := b.q.Ack(ctx, r); err != nil {
							if !errors.Is(err, context.DeadlineExceeded) {
								t.Errorf("Ack %s: %v", r.ID, err)
							}
							mu.Lock()
							toAck = append(toAck, r)
							mu.Unlock()
						}
					}
					cancel()
				}
			})
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(8 * time.Second):
			t.Fatal("calls hung")
		}
		<-closed
		require.Zero(t, b.q.Senders())
		for _, r := range toAck {
			require.NoError(t, b.q.Ack(b.ctx, r), "ack retried after ctx.Err()")
		}
		for {
			runs := dequeue(t, b, "q", 1000)
			if len(runs) == 0 {
				break
			}
			for _, r := range runs {
				got[r.ID]++
			}
			ackAll(t, b, runs)
		}
		for id := range queued {
			require.Equal(t, 1, got[id], "run %s reported queued", id)
		}
		for id, n := range got {
			require.True(t, queued[id] || maybe[id], "run %s delivered, never enqueued", id)
			require.Equal(t, 1, n, "run %s delivered %d times", id, n)
		}
		st := queueStats(t, b, "q")
		require.Equal(t, runqueue.Stats{}, st, "nothing left: no run held for a caller that got an error")
		t.Logf("queued %d, ctx errors %d (of which written %d)", len(queued), len(maybe), len(got)-len(queued))
	})
}

// failNth fails the n-th script call sent on its own (1-based) with err,
// before it reaches Redis, as go-redis fails a call whose context ended
// while it waited for a connection.
type failNth struct {
	n    int
	err  error
	seen atomic.Int64
}

func (h *failNth) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *failNth) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *failNth) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := fmt.Sprint(cmd.Args()[0]); name == "evalsha" || name == "eval" || name == "fcall" {
			if h.seen.Add(1) == int64(h.n) {
				cmd.SetErr(h.err)
				return h.err
			}
		}
		return next(ctx, cmd)
	}
}

// DequeueShard and DequeueShardWait (a cancellation path outside the
// coalescer): the shard's queues are served one script call each. When a
// later call fails (here the context ends between two of them), the runs
// the first served are in flight under a lease: the call returns them
// with a nil error, never with the error (a caller following the Go
// convention, results meaningless with a non-nil error, would drop them
// and leave them held for the whole lease). The queue that failed is
// served by the next call. When the first call fails, the error comes
// back with no run and nothing is in flight.
//
// Found as a defect in review s16: the runs came back together with
// ctx.Err(), which neither doc said.
func TestS16CoalesceDequeueShardRunsWithError(t *testing.T) {
	s16EachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		for _, wait := range []bool{false, true} {
			for _, nth := range []int{1, 2} {
				t.Run(fmt.Sprintf("wait=%v/fail=%d", wait, nth), func(t *testing.T) {
					h := &failNth{n: nth, err: context.Canceled}
					o := otherClient(t, c)
					b := setup(t, o, nil)
					enqueue(t, b, runqueue.EnqueueParams{Queue: "qa", ID: "a"})
					b.clock.Advance(time.Millisecond)
					enqueue(t, b, runqueue.EnqueueParams{Queue: "qb", ID: "b"})
					o.AddHook(h)
					shard := b.q.ShardOf(env)
					call := func() ([]*runqueue.Run, error) {
						if wait {
							return b.q.DequeueShardWait(b.ctx, shard, 2, time.Second)
						}
						return b.q.DequeueShard(b.ctx, shard, 2)
					}
					runs, err := call()
					inFlight := queueStats(t, b, "qa").InFlight + queueStats(t, b, "qb").InFlight
					if err != nil {
						require.ErrorIs(t, err, context.Canceled)
						require.Empty(t, runIDs(runs), "a call that returns an error holds no run for its caller")
						require.Zero(t, inFlight, "nothing in flight after an error")
					} else {
						require.Equal(t, 2, nth, "the first call failed: nothing was served, so the error must come back")
						require.Len(t, runs, 1, "the run the first call served")
						require.EqualValues(t, 1, inFlight, "it is the caller's, in flight")
					}
					if nth == 1 {
						require.Error(t, err, "the first call failed")
					}
					more, err := call()
					require.NoError(t, err)
					require.Len(t, append(runs, more...), 2, "every run served once: %v %v", runIDs(runs), runIDs(more))
					require.ElementsMatch(t, []string{"a", "b"}, runIDs(append(runs, more...)))
				})
			}
		}
	})
}
