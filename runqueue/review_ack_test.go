package runqueue_test

// Adversarial review of held_ack's duplicate handling (d008e79) and of the
// coalesced Ack (bbac649, 98aa024).

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// ackObserver counts Observer.Acked per env/queue.
type ackObserver struct {
	runqueue.NopObserver
	mu sync.Mutex
	n  map[string]int
}

func newAckObserver() *ackObserver { return &ackObserver{n: map[string]int{}} }

func (o *ackObserver) Acked(env, queue string, n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.n[env+"/"+queue] += n
}

func (o *ackObserver) total() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	t := 0
	for _, v := range o.n {
		t += v
	}
	return t
}

func errClass(err error) string {
	switch {
	case err == nil:
		return "nil"
	case errors.Is(err, runqueue.ErrLeaseLost):
		return "lease_lost"
	case errors.Is(err, runqueue.ErrNotInFlight):
		return "not_in_flight"
	case errors.Is(err, runqueue.ErrNotFound):
		return "not_found"
	default:
		return "other:" + err.Error()
	}
}

func errClasses(errs []error) []string {
	out := make([]string, len(errs))
	for i, e := range errs {
		out[i] = errClass(e)
	}
	return out
}

// dupScene: run "r" (key k) of queue q delivered three times (d[0], d[1]
// stale, d[2] the holder's unless recoveredOnly), plus "o" (q, key k) and
// "p" (q2, key k) in flight, so that a double release shows in every
// counter.
type dupScene struct {
	b   *testBundle
	obs *ackObserver
	d   []*runqueue.Run // d0, d1, d2 (d2 nil when recoveredOnly)
	wk  *runqueue.Run   // d2 (or d1) under another key
}

func newDupScene(t *testing.T, c redis.UniversalClient, vtime, recoveredOnly bool) *dupScene {
	t.Helper()
	obs := newAckObserver()
	b := setup(t, c, func(cfg *runqueue.Config) {
		cfg.LeaseDuration = 10 * time.Second
		cfg.VtimeScheduling = vtime
		cfg.Observer = obs
		cfg.SerialCalls = true
	})
	s := &dupScene{b: b, obs: obs}
	enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "r"})
	for i := range 3 {
		if i == 2 && recoveredOnly {
			break
		}
		if i > 0 {
			b.clock.Advance(10 * time.Second)
			n, err := b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 100)
			require.NoError(t, err)
			require.Equal(t, 1, n)
		}
		got := dequeue(t, b, queueName, 1)
		require.Len(t, got, 1)
		require.Equal(t, "r", got[0].ID)
		s.d = append(s.d, got[0])
	}
	if recoveredOnly {
		b.clock.Advance(10 * time.Second)
		n, err := b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 100)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		s.d = append(s.d, nil)
	}
	wk := *s.d[1]
	if s.d[2] != nil {
		wk = *s.d[2]
	}
	wk.Key = "other"
	s.wk = &wk
	// Runs of others, in flight after the recoveries (their leases run).
	enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "o"})
	enqueue(t, b, runqueue.EnqueueParams{Queue: "q2", Key: "k", ID: "p"})
	if recoveredOnly {
		// "r" is ready again: take "o" only by taking both and giving r back
		// would change r; instead dequeue q2 and leave "o" ready.
		require.Len(t, dequeue(t, b, "q2", 1), 1)
	} else {
		require.Equal(t, []string{"o"}, runIDs(dequeue(t, b, queueName, 1)))
		require.Len(t, dequeue(t, b, "q2", 1), 1)
	}
	return s
}

func (s *dupScene) pick(label string) *runqueue.Run {
	switch label {
	case "s0":
		return s.d[0]
	case "s1":
		return s.d[1]
	case "c":
		return s.d[2]
	case "w":
		return s.wk
	}
	panic(label)
}

// counters is every in-flight counter the ack touches, and what a lease
// recovery a minute later finds.
func (s *dupScene) counters(t *testing.T) string {
	t.Helper()
	b := s.b
	q1 := queueStats(t, b, queueName)
	q2 := queueStats(t, b, "q2")
	es, err := b.q.EnvStats(b.ctx, env)
	require.NoError(t, err)
	k1, err := b.q.KeyInflight(b.ctx, env, queueName, "k")
	require.NoError(t, err)
	k2, err := b.q.KeyInflight(b.ctx, env, "q2", "k")
	require.NoError(t, err)
	return fmt.Sprintf("q={ready %d inflight %d} q2={inflight %d} env={inflight %d ready %d} kin(q,k)=%d kin(q2,k)=%d acked=%d",
		q1.Ready, q1.InFlight, q2.InFlight, es.InFlight, es.Ready, k1, k2, s.obs.total())
}

func (s *dupScene) recoverLater(t *testing.T) int {
	t.Helper()
	s.b.clock.Advance(time.Minute)
	n, err := s.b.q.RecoverLeases(s.b.ctx, s.b.q.ShardOf(env), 100)
	require.NoError(t, err)
	return n
}

// Every duplicate pattern in one AckMany / AckAndDequeue call must give
// the results and counters of the same acks sent one call each, in order.
func TestReviewAckDuplicatesMatchSerial(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	seqs := []struct {
		name          string
		labels        []string
		recoveredOnly bool
	}{
		{"SameTokenTwice", []string{"c", "c"}, false},
		{"SameTokenThrice", []string{"c", "c", "c"}, false},
		{"StaleThenHolder", []string{"s1", "c"}, false},
		{"HolderThenStale", []string{"c", "s1"}, false},
		{"StaleHolderStale", []string{"s0", "c", "s1"}, false},
		{"HolderStaleHolder", []string{"c", "s0", "c"}, false},
		{"TwoStaleThenHolder", []string{"s0", "s1", "c"}, false},
		{"StaleStaleOnly", []string{"s0", "s1", "s0"}, false},
		{"HolderThenWrongKey", []string{"c", "w"}, false},
		{"WrongKeyThenHolder", []string{"w", "c"}, false},
		{"RecoveredStaleTwice", []string{"s0", "s1", "s1"}, true},
		{"RecoveredWrongKey", []string{"s1", "w"}, true},
	}
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		for _, vtime := range []bool{false, true} {
			for _, mode := range []string{"AckMany", "AckAndDequeue"} {
				for _, sq := range seqs {
					t.Run(fmt.Sprintf("vtime=%v/%s/%s", vtime, mode, sq.name), func(t *testing.T) {
						batch := newDupScene(t, c, vtime, sq.recoveredOnly)
						serial := newDupScene(t, c, vtime, sq.recoveredOnly)
						var runs []*runqueue.Run
						for _, l := range sq.labels {
							runs = append(runs, batch.pick(l))
						}
						var errs []error
						var err error
						if mode == "AckMany" {
							errs, err = batch.b.q.AckMany(batch.b.ctx, runs)
						} else {
							var got []*runqueue.Run
							got, errs, err = batch.b.q.AckAndDequeue(batch.b.ctx, runs, env, queueName, 0)
							require.Empty(t, got)
						}
						require.NoError(t, err)
						var want []error
						for _, l := range sq.labels {
							e, err := serial.b.q.AckMany(serial.b.ctx, []*runqueue.Run{serial.pick(l)})
							require.NoError(t, err)
							want = append(want, e[0])
						}
						require.Equal(t, errClasses(want), errClasses(errs), "results")
						require.Equal(t, serial.counters(t), batch.counters(t), "counters")
						require.Equal(t, serial.recoverLater(t), batch.recoverLater(t), "leases left")
					})
				}
			}
		}
	})
}

// ackAsync calls Ack in a goroutine.
func ackAsync(ctx context.Context, q *runqueue.Queue, r *runqueue.Run) <-chan error {
	out := make(chan error, 1)
	go func() { out <- q.Ack(ctx, r) }()
	return out
}

// Two workers ack one run concurrently, the stale delivery and the holder,
// in one coalesced batch (either order) or in two: the holder's ack acks
// it once; the counters of the key, queue and env drop by one.
func TestReviewAckCoalescedStaleAndHolder(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		for _, vtime := range []bool{false, true} {
			for _, tc := range []struct {
				name      string
				staleLast bool
				split     bool // the two in different sends
			}{{"OneBatchStaleFirst", false, false}, {"OneBatchStaleLast", true, false},
				{"TwoBatchesStaleFirst", false, true}, {"TwoBatchesStaleLast", true, true}} {
				t.Run(fmt.Sprintf("vtime=%v/%s", vtime, tc.name), func(t *testing.T) {
					h := newGateHook(3)
					h.arm(false)
					obs := newAckObserver()
					b := gated(t, c, h, func(cfg *runqueue.Config) {
						cfg.LeaseDuration = 10 * time.Second
						cfg.VtimeScheduling = vtime
						cfg.Observer = obs
					})
					old, cur := redelivered(t, b, "k", "r")
					for _, id := range []string{"x", "y", "z"} {
						enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: id})
					}
					others := dequeue(t, b, queueName, 3)
					require.Len(t, others, 3)
					require.NoError(t, b.q.Ack(b.ctx, others[2])) // warm
					h.arm(true)

					first := ackAsync(b.ctx, b.q, others[0])
					h.await(t, 1)
					var second <-chan error
					if !tc.split {
						second = ackAsync(b.ctx, b.q, others[1])
						h.await(t, 2)
					}
					a, bb := old, cur
					if tc.staleLast {
						a, bb = cur, old
					}
					chA := ackAsync(b.ctx, b.q, a)
					if tc.split {
						h.await(t, 2)
					} else {
						require.Eventually(t, func() bool { return b.q.PendingAcks() == 1 }, 5*time.Second, time.Millisecond)
					}
					chB := ackAsync(b.ctx, b.q, bb)
					require.Eventually(t, func() bool { return b.q.PendingAcks() == 1+boolInt(!tc.split) }, 5*time.Second, time.Millisecond)
					if tc.split {
						second = ackAsync(b.ctx, b.q, others[1])
						require.Eventually(t, func() bool { return b.q.PendingAcks() == 2 }, 5*time.Second, time.Millisecond)
					}
					h.open()
					require.NoError(t, <-first)
					require.NoError(t, <-second)
					errA, errB := <-chA, <-chB
					switch {
					case tc.split:
						// Two sends race once the gate opens: either order.
						holder, stale := errB, errA
						if tc.staleLast {
							holder, stale = errA, errB
						}
						require.NoError(t, holder, "holder")
						if stale != nil {
							require.ErrorIs(t, stale, runqueue.ErrLeaseLost)
						}
					case tc.staleLast:
						require.NoError(t, errA, "holder")
						require.NoError(t, errB, "stale after the holder: gone already")
					default:
						require.ErrorIs(t, errA, runqueue.ErrLeaseLost, "stale first")
						require.NoError(t, errB, "holder")
					}
					require.Eventually(t, func() bool { return b.q.Senders() == 0 }, 5*time.Second, time.Millisecond)
					h.arm(false)
					require.Equal(t, runqueue.Stats{}, queueStats(t, b, queueName))
					es, err := b.q.EnvStats(b.ctx, env)
					require.NoError(t, err)
					require.Equal(t, runqueue.Stats{}, es)
					k, err := b.q.KeyInflight(b.ctx, env, queueName, "k")
					require.NoError(t, err)
					require.Zero(t, k)
					require.Equal(t, 4, obs.total(), "r, x, y, z acked once each")
				})
			}
		}
	})
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Many goroutines ack runs of three envs x three queues (on the cluster,
// several nodes in one pipeline), each run by its holder twice and by a
// forged stale token once, all at once: every caller gets its own run's
// result, every run is acked once, Observer.Acked counts each once, and
// nothing is left in flight.
func TestReviewAckCoalescedManyQueues(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		obs := newAckObserver()
		b := setup(t, c, func(cfg *runqueue.Config) { cfg.Observer = obs; cfg.Shards = 8 })
		envs := []string{"e1", "e2", "e3"}
		qs := []string{"qa", "qb", "qc"}
		const per = 40
		var runs []*runqueue.Run
		for _, e := range envs {
			for _, qn := range qs {
				for i := range per {
					ok, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: e, Queue: qn, Key: "k" + strconv.Itoa(i%3), ID: "r" + strconv.Itoa(i)})
					require.NoError(t, err)
					require.True(t, ok)
				}
				got, err := b.q.Dequeue(b.ctx, e, qn, per)
				require.NoError(t, err)
				require.Len(t, got, per)
				runs = append(runs, got...)
			}
		}
		type out struct {
			kind string
			r    *runqueue.Run
			err  error
		}
		ch := make(chan out, 3*len(runs))
		var start sync.WaitGroup
		start.Add(1)
		var wg sync.WaitGroup
		for _, r := range runs {
			stale := *r
			stale.Token = r.Token + 1_000_000
			for _, k := range []struct {
				kind string
				r    *runqueue.Run
			}{{"holder", r}, {"holder", r}, {"stale", &stale}} {
				wg.Go(func() {
					start.Wait()
					ch <- out{k.kind, r, b.q.Ack(b.ctx, k.r)}
				})
			}
		}
		start.Done()
		wg.Wait()
		close(ch)
		for o := range ch {
			switch o.kind {
			case "holder":
				require.NoError(t, o.err, "%s/%s/%s", o.r.Env, o.r.Queue, o.r.ID)
			case "stale":
				if o.err != nil {
					require.ErrorIs(t, o.err, runqueue.ErrLeaseLost, "%s/%s/%s", o.r.Env, o.r.Queue, o.r.ID)
				}
			}
		}
		require.Equal(t, len(runs), obs.total(), "Observer.Acked")
		for _, e := range envs {
			obs.mu.Lock()
			for _, qn := range qs {
				require.Equal(t, per, obs.n[e+"/"+qn], "%s/%s", e, qn)
			}
			obs.mu.Unlock()
			es, err := b.q.EnvStats(b.ctx, e)
			require.NoError(t, err)
			require.Equal(t, runqueue.Stats{}, es, e)
			for _, qn := range qs {
				s, err := b.q.QueueStats(b.ctx, e, qn)
				require.NoError(t, err)
				require.Equal(t, runqueue.Stats{}, s, e+"/"+qn)
				for i := range 3 {
					k, err := b.q.KeyInflight(b.ctx, e, qn, "k"+strconv.Itoa(i))
					require.NoError(t, err)
					require.Zero(t, k)
				}
			}
		}
		require.Eventually(t, func() bool { return b.q.Senders() == 0 }, 5*time.Second, time.Millisecond)
	})
}

// The holder acks and nacks one run at once (or a worker nacks while its
// coalesced ack waits): exactly one wins; the counters agree with it.
func TestReviewAckRacesNack(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		for _, vtime := range []bool{false, true} {
			t.Run(fmt.Sprintf("vtime=%v", vtime), func(t *testing.T) {
				obs := newAckObserver()
				b := setup(t, c, func(cfg *runqueue.Config) { cfg.Observer = obs; cfg.VtimeScheduling = vtime; cfg.KeyConcurrency = 50 })
				const n = 60
				for i := range n {
					enqueue(t, b, runqueue.EnqueueParams{Key: "k" + strconv.Itoa(i%2), ID: "r" + strconv.Itoa(i)})
				}
				runs := dequeue(t, b, queueName, n)
				require.Len(t, runs, n)
				var acked, nacked atomic.Int64
				var wg sync.WaitGroup
				for _, r := range runs {
					wg.Go(func() {
						if err := b.q.Ack(b.ctx, r); err == nil {
							acked.Add(1)
						} else if !errors.Is(err, runqueue.ErrNotInFlight) {
							t.Errorf("ack %s: %v", r.ID, err)
						}
					})
					wg.Go(func() {
						_, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{RetryAt: b.clock.Now()})
						if err == nil {
							nacked.Add(1)
						} else if !errors.Is(err, runqueue.ErrNotFound) {
							t.Errorf("nack %s: %v", r.ID, err)
						}
					})
					wg.Go(func() {
						err := b.q.ExtendLease(b.ctx, r, time.Minute)
						if err != nil && !errors.Is(err, runqueue.ErrNotFound) && !errors.Is(err, runqueue.ErrNotInFlight) {
							t.Errorf("extend %s: %v", r.ID, err)
						}
					})
				}
				wg.Wait()
				require.Equal(t, int64(n), acked.Load()+nacked.Load(), "acked %d nacked %d", acked.Load(), nacked.Load())
				require.Equal(t, int(acked.Load()), obs.total())
				st := queueStats(t, b, queueName)
				require.Zero(t, st.InFlight)
				require.Equal(t, nacked.Load(), st.Ready+st.Delayed)
				for i := range 2 {
					k, err := b.q.KeyInflight(b.ctx, env, queueName, "k"+strconv.Itoa(i))
					require.NoError(t, err)
					require.Zero(t, k)
				}
				b.clock.Advance(time.Hour)
				m, err := b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 1000)
				require.NoError(t, err)
				require.Zero(t, m, "no lease left behind")
			})
		}
	})
}

// A key at its KeyConcurrency limit (1) held by a redelivered run: the
// stale and the holder's ack, coalesced, free it exactly once: the next
// dequeue serves one run of the key, the one after none.
func TestReviewAckKeyLimitFreedOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		for _, vtime := range []bool{false, true} {
			for _, staleLast := range []bool{false, true} {
				t.Run(fmt.Sprintf("vtime=%v/staleLast=%v", vtime, staleLast), func(t *testing.T) {
					h := newGateHook(3)
					h.arm(false)
					b := gated(t, c, h, func(cfg *runqueue.Config) {
						cfg.LeaseDuration = 10 * time.Second
						cfg.VtimeScheduling = vtime
						cfg.KeyConcurrency = 1
					})
					old, cur := redelivered(t, b, "k", "r")
					for _, id := range []string{"x", "y", "z"} {
						enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: id})
					}
					enqueue(t, b, runqueue.EnqueueParams{Key: "m", ID: "m1"})
					enqueue(t, b, runqueue.EnqueueParams{Key: "n", ID: "n1"})
					got := dequeue(t, b, queueName, 10)
					require.Equal(t, []string{"m1", "n1"}, sortedCopy(runIDs(got)), "k at its limit")
					h.arm(true)
					held := holdSenders(t, h, func(i int) <-chan error { return ackAsync(b.ctx, b.q, got[i]) })
					f1, f2 := held[0], held[1]
					a, bb := old, cur
					if staleLast {
						a, bb = cur, old
					}
					chA := ackAsync(b.ctx, b.q, a)
					require.Eventually(t, func() bool { return b.q.PendingAcks() == 1 }, 5*time.Second, time.Millisecond)
					chB := ackAsync(b.ctx, b.q, bb)
					require.Eventually(t, func() bool { return b.q.PendingAcks() == 2 }, 5*time.Second, time.Millisecond)
					h.open()
					require.NoError(t, <-f1)
					require.NoError(t, <-f2)
					// One send: the holder's ack acks, in either order; the
					// stale one fails or finds the run gone.
					errA, errB := <-chA, <-chB
					holder, stale := errB, errA
					if staleLast {
						holder, stale = errA, errB
					}
					require.NoError(t, holder, "holder")
					if stale != nil {
						require.ErrorIs(t, stale, runqueue.ErrLeaseLost)
					}
					require.Eventually(t, func() bool { return b.q.Senders() == 0 }, 5*time.Second, time.Millisecond)
					h.arm(false)
					k, err := b.q.KeyInflight(b.ctx, env, queueName, "k")
					require.NoError(t, err)
					require.Zero(t, k)
					next := dequeue(t, b, queueName, 10)
					require.Len(t, next, 1, "one run of k")
					require.Empty(t, dequeue(t, b, queueName, 10), "k at its limit again")
					k, err = b.q.KeyInflight(b.ctx, env, queueName, "k")
					require.NoError(t, err)
					require.Equal(t, 1, k)
					ackAll(t, b, next)
					require.Len(t, dequeue(t, b, queueName, 10), 1)
				})
			}
		}
	})
}

// goexitHook ends the goroutine that sends a pipeline (as t.FailNow in a
// test's go-redis hook does) the first times, once armed.
type goexitHook struct {
	armed atomic.Bool
	left  atomic.Int64
}

func (h *goexitHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *goexitHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *goexitHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.armed.Load() && h.left.Add(-1) >= 0 {
			runtime.Goexit()
		}
		return next(ctx, cmds)
	}
}

// A send that ends its goroutine (runtime.Goexit in a hook) must not leave
// the coalescer counting a sender that is gone: its callers learn of it (a
// panic, as a call of their own would have ended them), and later Acks
// still go out. (First version: the Observer ran on the sender; it runs in
// the caller's goroutine now.)
func TestReviewAckSenderGoexit(t *testing.T) {
	c := otherClient(t, redistest.Mini(t))
	h := &goexitHook{}
	h.left.Store(2)
	b := setup(t, c, nil)
	c.AddHook(h)
	for i := range 3 {
		enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "r" + strconv.Itoa(i)})
	}
	runs := dequeue(t, b, queueName, 3)
	h.armed.Store(true)
	for i := range 2 {
		func() {
			defer func() { require.NotNil(t, recover(), "the send of ack %d ended", i) }()
			_ = b.q.Ack(b.ctx, runs[i])
		}()
	}
	ctx, cancel := context.WithTimeout(b.ctx, 2*time.Second)
	defer cancel()
	err := b.q.Ack(ctx, runs[2])
	require.NoError(t, err, "senders=%d pending=%d", b.q.Senders(), b.q.PendingAcks())
}

// qaPanicObserver panics in Acked for queue "qa" only, and counts the rest.
type qaPanicObserver struct {
	runqueue.NopObserver
	qb atomic.Int64
}

func (o *qaPanicObserver) Acked(_, queue string, n int) {
	if queue == "qa" {
		panic("observer boom on qa")
	}
	o.qb.Add(int64(n))
}

// A panic of the Observer for one queue must not reach, in a coalesced
// send, the callers of other queues, nor leave their acks unreported: each
// alone returns nil and is counted. (First version: it did both; the
// Observer now runs in each caller's goroutine.)
func TestReviewAckObserverPanicOtherQueue(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		h := newGateHook(3)
		h.arm(false)
		obs := &qaPanicObserver{}
		b := gated(t, c, h, func(cfg *runqueue.Config) { cfg.Observer = obs })
		var runs []*runqueue.Run
		for _, qn := range []string{"qa", "qb"} {
			for i := range 3 {
				enqueue(t, b, runqueue.EnqueueParams{Queue: qn, Key: "k", ID: "r" + strconv.Itoa(i)})
			}
			runs = append(runs, dequeue(t, b, qn, 3)...)
		}
		// runs: qa0 qa1 qa2 qb0 qb1 qb2
		h.arm(true)
		type res struct {
			err      error
			panicked any
		}
		ack := func(r *runqueue.Run) <-chan res {
			out := make(chan res, 1)
			go func() {
				defer func() {
					if v := recover(); v != nil {
						out <- res{panicked: v}
					}
				}()
				out <- res{err: b.q.Ack(b.ctx, r)}
			}()
			return out
		}
		f1 := ack(runs[3]) // qb0 alone
		h.await(t, 1)
		f2 := ack(runs[4]) // qb1 alone
		h.await(t, 2)
		a := ack(runs[0]) // qa0 then qb2: one send
		require.Eventually(t, func() bool { return b.q.PendingAcks() == 1 }, 5*time.Second, time.Millisecond)
		qb := ack(runs[5])
		require.Eventually(t, func() bool { return b.q.PendingAcks() == 2 }, 5*time.Second, time.Millisecond)
		h.open()
		require.Equal(t, res{}, <-f1)
		require.Equal(t, res{}, <-f2)
		require.NotNil(t, (<-a).panicked, "qa's own ack: the observer panics, as alone")
		got := <-qb
		h.arm(false)
		s, err := b.q.QueueStats(b.ctx, env, "qb")
		require.NoError(t, err)
		require.Zero(t, s.InFlight, "qb2 was acked")
		require.Equal(t, res{}, got, "qb2's caller does not get qa's panic")
		require.Equal(t, int64(3), obs.qb.Load(), "Observer.Acked of qb")
	})
}
