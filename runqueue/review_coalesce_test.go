package runqueue_test

// Adversarial review of the coalesced Enqueue (coalesce.go), kept as
// regression tests.
//
// Failed on the first version (a4e25c9): TestReviewCoalesceHugeBurstPipelineTimeout
// (one pipeline for the whole pending list outlived the read timeout),
// TestReviewCoalesceSenderPanicKillsProcess (a panic on the sender goroutine),
// TestReviewCoalesceSilentConnWedgesSenders (the send had no deadline),
// TestReviewCoalesceErrorsMatchSerial (ctx.Err() before the typed errors).

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
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

// countObserver counts Observer.Enqueued.
type countObserver struct {
	runqueue.NopObserver
	n atomic.Int64
}

func (o *countObserver) Enqueued(_, _ string, n int) { o.n.Add(int64(n)) }

// panicObserver panics in Enqueued.
type panicObserver struct{ runqueue.NopObserver }

func (panicObserver) Enqueued(string, string, int) { panic("observer boom") }

type enqOutcome struct {
	id  string
	ok  bool
	err error
}

// fanOut starts one Enqueue per params, each in its own goroutine.
func fanOut(ctx context.Context, q *runqueue.Queue, ps []runqueue.EnqueueParams) <-chan enqOutcome {
	out := make(chan enqOutcome, len(ps))
	for _, p := range ps {
		go func() {
			ok, err := q.Enqueue(ctx, p)
			out <- enqOutcome{p.ID, ok, err}
		}()
	}
	return out
}

// holdAndFanOut sends ps[0] and ps[1] alone, each held at h's gate by its
// sender, then the rest, which wait in the pending list.
func holdAndFanOut(t *testing.T, b *testBundle, h *gateHook, ps []runqueue.EnqueueParams) <-chan enqOutcome {
	t.Helper()
	out := make(chan enqOutcome, len(ps))
	relay := func(ps []runqueue.EnqueueParams) {
		ch := fanOut(b.ctx, b.q, ps)
		go func() {
			for range ps {
				out <- <-ch
			}
		}()
	}
	relay(ps[:1])
	h.await(t, 1)
	relay(ps[1:2])
	h.await(t, 2)
	relay(ps[2:])
	require.Eventually(t, func() bool { return b.q.PendingEnqueues() == len(ps)-2 }, 10*time.Second, time.Millisecond)
	return out
}

func awaitSendersZero(t *testing.T, q *runqueue.Queue) {
	t.Helper()
	require.Eventually(t, func() bool { return q.Senders() == 0 && q.PendingEnqueues() == 0 },
		10*time.Second, time.Millisecond, "senders must exit")
}

// DEFECT: the whole pending list goes in ONE pipeline, and go-redis bounds
// a pipeline's replies by one ReadTimeout and retries a pipeline whose read
// timed out (MaxRetries). When the pending list is large enough that Redis
// needs longer than ReadTimeout for all of it (each 100-run script call
// well within it), every script call has already run when the read times
// out; go-redis re-sends the pipeline, which now finds every run already
// there: the callers of brand-new runs get (false, nil), "an idempotent
// retry", or a timeout, and Observer.Enqueued never counts the runs. The
// serial path sends each run in a call of its own and is unaffected by
// how many callers there are. ReadTimeout is shortened here to keep the
// run count small; production's default 3s needs only a larger burst.
//
// Fixed since: one send takes at most coalesceRuns runs. The test judges
// the pipelines' size (at most maxPiped runs each, far within any read
// timeout), which the defect breaks whatever the server's speed, and
// every caller's result under a read timeout of 1s: at 150ms (about the
// time this machine's Redis took for the 40,000 runs of the defect), a
// stall of a loaded machine's client as long also timed out a correct
// call's read, and its retry read as (false, nil).
func TestReviewCoalesceHugeBurstPipelineTimeout(t *testing.T) {
	n := 40000
	if s := os.Getenv("REVIEW_BURST"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	const readTimeout, maxPiped = time.Second, 1000
	for _, serial := range []bool{false, true} {
		t.Run(fmt.Sprintf("serial=%v", serial), func(t *testing.T) {
			c := redistest.Private(t).(*redis.Client)
			opt := *c.Options()
			opt.ReadTimeout = readTimeout
			o := redis.NewClient(&opt)
			t.Cleanup(func() { _ = o.Close() })
			h := newGateHook(8)
			obs := &countObserver{}
			b := setup(t, o, func(cfg *runqueue.Config) { cfg.SerialCalls = serial; cfg.Observer = obs })
			o.AddHook(h)
			if !serial {
				// Hold both senders, let the burst pile up.
				held := holdSenders(t, h, func(i int) <-chan error { return enqueueAsync(b.ctx, b.q, coalesceRun(string(rune('a'+i)))) })
				first, second := held[0], held[1]
				ps := make([]runqueue.EnqueueParams, n)
				for i := range ps {
					ps[i] = coalesceRun("burst-" + strconv.Itoa(i))
				}
				outs := fanOut(b.ctx, b.q, ps)
				require.Eventually(t, func() bool { return b.q.PendingEnqueues() == n }, 30*time.Second, time.Millisecond)
				h.open()
				require.NoError(t, <-first)
				require.NoError(t, <-second)
				bad := map[string]int{}
				for range n {
					o := <-outs
					if o.err != nil || !o.ok {
						bad[fmt.Sprintf("ok=%v err=%v", o.ok, o.err)]++
					}
				}
				awaitSendersZero(t, b.q)
				t.Logf("outcomes other than (true, nil): %v; runs in the queue: %d; Observer.Enqueued: %d",
					bad, queueStats(t, b, "q").Ready, obs.n.Load())
				require.Empty(t, bad, "every burst run is new: each caller must get (true, nil)")
				require.EqualValues(t, n+2, obs.n.Load(), "Observer.Enqueued must count every queued run")
				require.LessOrEqual(t, h.largestPipeline(), maxPiped, "a pipeline too large to be read within a read timeout")
				return
			}
			// Serial: the same burst from 64 goroutines, each run its own call.
			h.open()
			var wg sync.WaitGroup
			var bad atomic.Int64
			for g := range 64 {
				wg.Go(func() {
					for i := g; i < n; i += 64 {
						ok, err := b.q.Enqueue(b.ctx, coalesceRun("burst-"+strconv.Itoa(i)))
						if err != nil || !ok {
							bad.Add(1)
						}
					}
				})
			}
			wg.Wait()
			require.Zero(t, bad.Load())
			require.EqualValues(t, n, obs.n.Load())
		})
	}
}

// DEFECT: a panic inside EnqueueMany (here Observer.Enqueued; a go-redis
// hook or a Config.Clock would do the same) happens on the sender
// goroutine, where no caller can recover it: the process dies. Serially
// the panic reaches the calling goroutine, so a recover there (net/http's
// per-request recover, a worker's) contains it. Were it contained, the
// sender would also leave senders incremented and the batch's callers
// waiting for ever. The test re-runs itself in a child process.
func TestReviewCoalesceSenderPanicKillsProcess(t *testing.T) {
	if mode := os.Getenv("REVIEW_PANIC_CHILD"); mode != "" {
		c := redistest.Mini(t)
		b := setup(t, c, func(cfg *runqueue.Config) {
			cfg.Observer = panicObserver{}
			cfg.SerialCalls = mode == "serial"
		})
		func() {
			defer func() {
				if v := recover(); v != nil {
					fmt.Println("RECOVERED:", v)
				}
			}()
			_, _ = b.q.Enqueue(b.ctx, coalesceRun("x"))
		}()
		fmt.Println("CHILD SURVIVED")
		return
	}
	for _, mode := range []string{"serial", "coalesced"} {
		t.Run(mode, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestReviewCoalesceSenderPanicKillsProcess$", "-test.count=1")
			cmd.Env = append(os.Environ(), "REVIEW_PANIC_CHILD="+mode)
			out, err := cmd.CombinedOutput()
			first, _, _ := strings.Cut(string(out), "\n\ngoroutine")
			t.Logf("child (%s): err=%v\n%s", mode, err, first)
			require.NoError(t, err, "a panic in the enqueue path must reach the caller, who recovers it")
			require.Contains(t, string(out), "RECOVERED: observer boom")
		})
	}
}

// Same inputs, same results and typed errors, serial and coalesced.
func TestReviewCoalesceErrorsMatchSerial(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		mk := func(serial, readOnly bool) *testBundle {
			return setup(t, c, func(cfg *runqueue.Config) {
				cfg.SerialCalls = serial
				cfg.ReadOnly = readOnly
				cfg.MaxQueueDepth = 4
				cfg.MaxKeyDepth = 2
				cfg.MaxPayloadBytes = 16
			})
		}
		run := func(id, key, payload string) runqueue.EnqueueParams {
			return runqueue.EnqueueParams{Env: env, Queue: "q", Key: key, ID: id, Payload: []byte(payload)}
		}
		cancelled, cancel := context.WithCancel(context.Background())
		cancel()
		type step struct {
			name string
			ctx  context.Context
			p    runqueue.EnqueueParams
		}
		bg := context.Background()
		steps := []step{
			{"new", bg, run("a", "k", "p")},
			{"retry", bg, run("a", "k", "p")},
			{"conflict payload", bg, run("a", "k", "other")},
			{"conflict key", bg, run("a", "k2", "p")},
			{"new 2", bg, run("b", "k", "p")},
			{"key full", bg, run("c", "k", "p")},
			{"new 3", bg, run("d", "k3", "p")},
			{"new 4", bg, run("e", "k4", "p")},
			{"queue full", bg, run("f", "k5", "p")},
			{"retry when full", bg, run("a", "k", "p")},
			{"empty id", bg, run("", "k", "p")},
			{"no env", bg, runqueue.EnqueueParams{Queue: "q", ID: "x"}},
			{"payload too big", bg, run("g", "k", strings.Repeat("x", 17))},
			{"priority", bg, runqueue.EnqueueParams{Env: env, Queue: "q", ID: "h", Priority: 10}},
			{"negative delay", bg, runqueue.EnqueueParams{Env: env, Queue: "q", ID: "h", Delay: -1}},
			{"at and delay", bg, runqueue.EnqueueParams{Env: env, Queue: "q", ID: "h", Delay: 1, AvailableAt: time.Now()}},
			{"cancelled valid", cancelled, run("i", "k6", "p")},
			{"cancelled invalid", cancelled, run("", "k6", "p")},
		}
		describe := func(ok bool, err error) string {
			var inv *runqueue.InvalidError
			var full *runqueue.QueueFullError
			kind := "nil"
			switch {
			case err == nil:
			case errors.As(err, &inv):
				kind = "InvalidError"
			case errors.As(err, &full):
				kind = fmt.Sprintf("QueueFullError{%s %d}", full.Scope, full.Limit)
			case errors.Is(err, runqueue.ErrConflict):
				kind = "ErrConflict"
			case errors.Is(err, runqueue.ErrReadOnly):
				kind = "ErrReadOnly"
			case errors.Is(err, context.Canceled):
				kind = "Canceled"
			default:
				kind = fmt.Sprintf("%T", err)
			}
			return fmt.Sprintf("%v %s %v", ok, kind, err)
		}
		for _, ro := range []bool{false, true} {
			serial, coal := mk(true, ro), mk(false, ro)
			for _, s := range steps {
				ok1, err1 := serial.q.Enqueue(s.ctx, s.p)
				ok2, err2 := coal.q.Enqueue(s.ctx, s.p)
				if d1, d2 := describe(ok1, err1), describe(ok2, err2); d1 != d2 {
					t.Errorf("readOnly=%v %s: serial %q, coalesced %q", ro, s.name, d1, d2)
				}
			}
			awaitSendersZero(t, coal.q)
		}
	})
}

// Many goroutines enqueue the same id at once: exactly one true, the others
// false (same body) or ErrConflict (another body), and Observer counts one.
func TestReviewCoalesceSameIDConcurrent(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		obs := &countObserver{}
		b := setup(t, c, func(cfg *runqueue.Config) { cfg.Observer = obs })
		const rounds, g = 50, 16
		for r := range rounds {
			id := "same-" + strconv.Itoa(r)
			var trues, falses, conflicts, other atomic.Int64
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range g {
				wg.Go(func() {
					p := coalesceRun(id)
					if r%2 == 1 {
						p.Payload = []byte("body-" + strconv.Itoa(i)) // every body differs
					}
					<-start
					ok, err := b.q.Enqueue(b.ctx, p)
					switch {
					case err == nil && ok:
						trues.Add(1)
					case err == nil:
						falses.Add(1)
					case errors.Is(err, runqueue.ErrConflict):
						conflicts.Add(1)
					default:
						other.Add(1)
					}
				})
			}
			close(start)
			wg.Wait()
			require.EqualValues(t, 1, trues.Load(), "round %d", r)
			require.Zero(t, other.Load())
			if r%2 == 1 {
				require.EqualValues(t, g-1, conflicts.Load())
			} else {
				require.EqualValues(t, g-1, falses.Load())
			}
		}
		require.EqualValues(t, rounds, obs.n.Load())
		awaitSendersZero(t, b.q)
	})
}

// Redis goes away while a batch is held: every member gets an error, the
// senders exit, and after the server is back a retry of every run queues
// each exactly once.
func TestReviewCoalesceServerDownThenRetry(t *testing.T) {
	// Runs last: go-redis's background redial goroutine sleeps 1s before it
	// notices its pool closed (goleak).
	t.Cleanup(func() { time.Sleep(1500 * time.Millisecond) })
	m, c := redistest.MiniServer(t)
	o := otherClient(t, c)
	h := newGateHook(8)
	obs := &countObserver{}
	b := setup(t, o, func(cfg *runqueue.Config) { cfg.Observer = obs })
	o.AddHook(h)
	var ps []runqueue.EnqueueParams
	for i := range 50 {
		ps = append(ps, coalesceRun("r"+strconv.Itoa(i)))
	}
	outs := holdAndFanOut(t, b, h, ps)
	m.Close()
	h.open()
	for range ps {
		o := <-outs
		require.Error(t, o.err, o.id)
		require.False(t, o.ok)
	}
	awaitSendersZero(t, b.q)
	require.NoError(t, m.Restart())
	// The outage's failed dials can trip go-redis's dial breaker (PoolSize
	// of them: 10 per GOMAXPROCS), which then fails every dial at once
	// until its background probe, once a second, gets through: wait until
	// o reaches the server again.
	require.Eventually(t, func() bool { return o.Ping(b.ctx).Err() == nil }, 10*time.Second, 10*time.Millisecond)
	outs = fanOut(b.ctx, b.q, ps)
	queued := 0
	got := map[string]int{}
	for range ps {
		o := <-outs
		got[fmt.Sprint(o.ok, o.err)]++
		if o.ok {
			queued++
		}
	}
	require.Equal(t, map[string]int{"true <nil>": 50}, got)
	require.Equal(t, 50, queued)
	require.EqualValues(t, 50, obs.n.Load())
	require.Len(t, queuedIDs(t, b), 50)
	awaitSendersZero(t, b.q)
}

// The client is closed under held batches: every caller gets an error, the
// senders exit; later calls fail fast and leave no sender.
func TestReviewCoalesceClientClosed(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		h := newGateHook(8)
		o := otherClient(t, c)
		b := setup(t, o, nil)
		o.AddHook(h)
		var ps []runqueue.EnqueueParams
		for i := range 30 {
			ps = append(ps, coalesceRun("r"+strconv.Itoa(i)))
		}
		outs := holdAndFanOut(t, b, h, ps)
		require.NoError(t, o.Close())
		h.open()
		for range ps {
			r := <-outs
			require.Error(t, r.err)
		}
		awaitSendersZero(t, b.q)
		_, err := b.q.Enqueue(b.ctx, coalesceRun("late"))
		require.ErrorIs(t, err, redis.ErrClosed)
		awaitSendersZero(t, b.q)
	})
}

// A held burst well above the run limit of a send (100 runs), with some
// invalid, duplicate and oversized runs mixed in: each caller gets its own
// result, Redis holds each valid run once, Observer counts them.
func TestReviewCoalesceBigBatch(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		h := newGateHook(8)
		obs := &countObserver{}
		b := gated(t, c, h, func(cfg *runqueue.Config) { cfg.Observer = obs; cfg.MaxPayloadBytes = 64 << 10 })
		held := holdSenders(t, h, func(i int) <-chan error { return enqueueAsync(b.ctx, b.q, coalesceRun(string(rune('a'+i)))) })
		a, bb := held[0], held[1]
		const n = 2500
		var ps []runqueue.EnqueueParams
		want := map[string]string{}
		for i := range n {
			id := "r" + strconv.Itoa(i)
			p := runqueue.EnqueueParams{Env: env, Queue: "q" + strconv.Itoa(i%3), Key: "k" + strconv.Itoa(i%7), ID: id}
			switch i % 10 {
			case 0:
				p.ID = "" // invalid
				want[fmt.Sprint(i)] = "invalid"
			case 1:
				p.Payload = make([]byte, 64<<10+1) // too big
				want[fmt.Sprint(i)] = "invalid"
			default: // 8 KiB each, ~16 MiB in all; ends with its index
				p.Payload = []byte(strings.Repeat("x", 8<<10) + strconv.Itoa(i))
				want[fmt.Sprint(i)] = "true"
			}
			ps = append(ps, p)
		}
		type res struct {
			i   int
			ok  bool
			err error
		}
		out := make(chan res, n)
		for i, p := range ps {
			go func() {
				ok, err := b.q.Enqueue(b.ctx, p)
				out <- res{i, ok, err}
			}()
		}
		// Invalid runs are refused before they wait (as a call of their own
		// refuses them): the valid ones pile up.
		require.Eventually(t, func() bool { return b.q.PendingEnqueues() == n*8/10 }, 10*time.Second, time.Millisecond)
		h.open()
		require.NoError(t, <-a)
		require.NoError(t, <-bb)
		valid := 0
		for range n {
			r := <-out
			var inv *runqueue.InvalidError
			switch want[fmt.Sprint(r.i)] {
			case "invalid":
				require.True(t, errors.As(r.err, &inv), "%d: %v", r.i, r.err)
			default:
				require.NoError(t, r.err, "%d", r.i)
				require.True(t, r.ok, "%d", r.i)
				valid++
			}
		}
		awaitSendersZero(t, b.q)
		require.EqualValues(t, valid+2, obs.n.Load())
		calls := h.calls()
		for _, k := range calls {
			require.LessOrEqual(t, k, 100)
		}
		total := 0
		for q := range 3 {
			s := queueStats(t, b, "q"+strconv.Itoa(q))
			total += int(s.Ready)
		}
		require.Equal(t, valid, total)
		// the payload of each run is its own
		for _, i := range []int{2, 1234, 2499} {
			runs, err := b.q.Dequeue(b.ctx, env, "q"+strconv.Itoa(i%3), 1000)
			require.NoError(t, err)
			for _, r := range runs {
				idx, _ := strconv.Atoi(strings.TrimPrefix(r.ID, "r"))
				require.True(t, strings.HasSuffix(string(r.Payload), strconv.Itoa(idx)), r.ID)
			}
		}
	})
}

// Random cancellation under load: a caller told true has its run queued, a
// caller told ctx.Err() has its run queued at most once, no run is lost
// that was reported queued, Observer counts exactly the runs in Redis,
// and the senders exit.
func TestReviewCoalesceCancelStress(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		obs := &countObserver{}
		b := setup(t, c, func(cfg *runqueue.Config) { cfg.Observer = obs })
		const g, per = 16, 100
		var mu sync.Mutex
		told := map[string]string{}
		var wg sync.WaitGroup
		for w := range g {
			wg.Go(func() {
				for i := range per {
					id := fmt.Sprintf("w%d-%d", w, i)
					ctx, cancel := context.WithTimeout(b.ctx, time.Duration((w*per+i)%300)*time.Microsecond)
					ok, err := b.q.Enqueue(ctx, coalesceRun(id))
					cancel()
					mu.Lock()
					switch {
					case err == nil && ok:
						told[id] = "true"
					case err == nil:
						told[id] = "false"
					case errors.Is(err, context.DeadlineExceeded):
						told[id] = "ctx"
					default:
						told[id] = err.Error()
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		awaitSendersZero(t, b.q)
		in := map[string]bool{}
		for {
			runs := dequeue(t, b, "q", 1000)
			if len(runs) == 0 {
				break
			}
			for _, r := range runs {
				require.False(t, in[r.ID], "dequeued twice: %s", r.ID)
				in[r.ID] = true
			}
		}
		counts := map[string]int{}
		for id, v := range told {
			counts[v]++
			switch v {
			case "true":
				require.True(t, in[id], id)
			case "ctx":
			default:
				t.Errorf("%s: %s", id, v)
			}
		}
		t.Logf("outcomes %v, queued %d", counts, len(in))
		require.EqualValues(t, len(in), obs.n.Load())
	})
}

// blackholeProxy forwards TCP to addr; freeze() makes every connection open
// at the time swallow all bytes both ways without closing (a network
// partition with no reset); later connections forward normally.
type blackholeProxy struct {
	ln    net.Listener
	addr  string
	mu    sync.Mutex
	conns []*proxied
	wg    sync.WaitGroup
	// partition: connections accepted now are frozen too
	partition atomic.Bool
}

type proxied struct {
	a, b   net.Conn
	frozen atomic.Bool
}

func newBlackholeProxy(t *testing.T, addr string) *blackholeProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &blackholeProxy{ln: ln, addr: addr}
	p.wg.Go(func() {
		for {
			a, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", addr)
			if err != nil {
				_ = a.Close()
				continue
			}
			pc := &proxied{a: a, b: b}
			pc.frozen.Store(p.partition.Load())
			p.mu.Lock()
			p.conns = append(p.conns, pc)
			p.mu.Unlock()
			pipe := func(dst, src net.Conn) {
				buf := make([]byte, 32<<10)
				for {
					n, err := src.Read(buf)
					if err != nil {
						_ = dst.Close()
						return
					}
					if !pc.frozen.Load() {
						if _, err := dst.Write(buf[:n]); err != nil {
							_ = src.Close()
							return
						}
					}
				}
			}
			p.wg.Go(func() { pipe(b, a) })
			p.wg.Go(func() { pipe(a, b) })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.a.Close()
			_ = c.b.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// heal lets connections accepted from now on through; frozen ones stay so.
func (p *blackholeProxy) heal() { p.partition.Store(false) }

func (p *blackholeProxy) freeze() {
	p.partition.Store(true)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.frozen.Store(true)
	}
}

// DEFECT: the sender runs EnqueueMany on context.WithoutCancel, so with a
// client that bounds I/O by the context (ContextTimeoutEnabled, no
// Read/WriteTimeout: go-redis's way to let callers' deadlines govern) a
// connection that goes silent wedges the sender for ever. Two such
// connections and every later Enqueue on the Queue waits for its own
// deadline and fails, although the network is back and the serial path
// (bounded by each caller's deadline, which drops the dead connection)
// recovers at once.
func TestReviewCoalesceSilentConnWedgesSenders(t *testing.T) {
	for _, serial := range []bool{true, false} {
		t.Run(fmt.Sprintf("serial=%v", serial), func(t *testing.T) {
			real := redistest.Real(t).(*redis.Client)
			px := newBlackholeProxy(t, real.Options().Addr)
			opt := &redis.Options{Addr: px.ln.Addr().String(), ContextTimeoutEnabled: true,
				ReadTimeout: -1, WriteTimeout: -1, MaxRetries: -1, MinIdleConns: 4}
			o := redis.NewClient(opt)
			t.Cleanup(func() { _ = o.Close() })
			b := setup(t, o, func(cfg *runqueue.Config) { cfg.SerialCalls = serial })
			// Established idle connections for the senders to use (no dial),
			// then the partition: every connection open or opened from now
			// on goes silent for ever.
			require.Eventually(t, func() bool { return o.PoolStats().IdleConns >= 4 }, 5*time.Second, time.Millisecond)
			px.freeze()
			var wg sync.WaitGroup
			for i := range 4 {
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(b.ctx, 300*time.Millisecond)
					defer cancel()
					_, err := b.q.Enqueue(ctx, coalesceRun("lost"+strconv.Itoa(i)))
					require.Error(t, err)
				})
				time.Sleep(20 * time.Millisecond) // one call per sender
			}
			wg.Wait()
			px.heal()
			// The network is back for new connections.
			ctx, cancel := context.WithTimeout(b.ctx, 3*time.Second)
			defer cancel()
			ok, err := b.q.Enqueue(ctx, coalesceRun("after"))
			t.Logf("senders %d, pending %d", b.q.Senders(), b.q.PendingEnqueues())
			require.NoError(t, err, "an Enqueue after the partition healed")
			require.True(t, ok)
		})
	}
}
