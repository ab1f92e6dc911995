package runqueue_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// scriptGate holds every script call sent on its own (not in a pipeline:
// a dequeue's) at a gate of its own until the test releases it, and
// records each call's size (maxCount, scan and promote limit: ARGV[2],
// ARGV[10] and ARGV[11] of a dequeue script). Disarmed it lets everything
// through unrecorded; opened, every call.
type scriptGate struct {
	mu     sync.Mutex
	armed  bool
	opened bool
	held   []*heldCall
}

// heldCall is one script call at the gate: its size, closed release lets
// it through, and done is closed once its reply is in.
type heldCall struct {
	size     [3]int
	release  chan struct{}
	released bool // (h.mu)
	done     chan struct{}
}

// let closes c.release once; h.mu is held.
func (c *heldCall) let() {
	if !c.released {
		c.released = true
		close(c.release)
	}
}

func newScriptGate() *scriptGate { return &scriptGate{} }

func (h *scriptGate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *scriptGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *scriptGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		name := fmt.Sprint(args[0])
		h.mu.Lock()
		if !h.armed || name != "evalsha" && name != "eval" && name != "fcall" {
			h.mu.Unlock()
			return next(ctx, cmd)
		}
		argv := args[3+args[2].(int):]
		c := &heldCall{size: [3]int{argv[1].(int), argv[9].(int), argv[10].(int)}, release: make(chan struct{}), done: make(chan struct{})}
		if h.opened {
			c.let()
		}
		h.held = append(h.held, c)
		h.mu.Unlock()
		<-c.release
		defer close(c.done)
		return next(ctx, cmd)
	}
}

// arm starts recording and holding calls afresh (on) or lets everything
// through.
func (h *scriptGate) arm(on bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.armed, h.opened, h.held = on, false, nil
}

// open lets every call through, held or to come.
func (h *scriptGate) open() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.opened {
		return
	}
	h.opened = true
	for _, c := range h.held {
		c.let()
	}
}

// await waits until n calls (or more) have reached the gate.
func (h *scriptGate) await(t *testing.T, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.held) >= n
	}, 5*time.Second, time.Millisecond)
}

// release lets the i-th call to reach the gate through, once it has, and
// waits for its reply.
func (h *scriptGate) release(t *testing.T, i int) {
	t.Helper()
	h.await(t, i+1)
	h.mu.Lock()
	c := h.held[i]
	c.let()
	h.mu.Unlock()
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		t.Fatalf("call %d did not complete", i)
	}
}

// calls is the maxCount of each call that reached the gate, in order.
func (h *scriptGate) calls() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]int, len(h.held))
	for i, c := range h.held {
		out[i] = c.size[0]
	}
	return out
}

// size is the i-th call's maxCount, scan and promote limit.
func (h *scriptGate) size(i int) [3]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.held[i].size
}

// releaseInOrder lets the first n calls to reach the gate through one at
// a time, each after the one before has its reply: a sender that ends
// its call takes the calls waiting then, and its call reaches the gate
// next. While more of the n are to come, it waits for that call (the
// (i+3)-th: the other sender's is held as the (i+2)-th) before it lets
// the other sender go, or a sender slow to send what it took (a loaded
// machine) would be overtaken by the other's next call.
func (h *scriptGate) releaseInOrder(t *testing.T, n int) {
	t.Helper()
	for i := range n {
		h.release(t, i)
		if i+3 <= n {
			h.await(t, i+3)
		}
	}
}

// gatedDequeues runs fn for each flag state and backend, on a bundle
// whose Queue talks to the server through a client of its own that holds
// single script calls at h (disarmed: the test arms it).
func gatedDequeues(t *testing.T, mutate func(*runqueue.Config), fn func(t *testing.T, b *testBundle, h *scriptGate)) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
				h := newScriptGate()
				o := otherClient(t, c)
				b := setup(t, o, func(cfg *runqueue.Config) {
					cfg.VtimeScheduling = on
					if mutate != nil {
						mutate(cfg)
					}
				})
				o.AddHook(h)
				t.Cleanup(h.open) // before Close, which waits for the senders
				fn(t, b, h)
			})
		})
	}
}

type deqOutcome struct {
	runs []*runqueue.Run
	err  error
}

// dequeueAsync calls Dequeue in a goroutine; its outcome arrives on the
// returned channel.
func dequeueAsync(ctx context.Context, b *testBundle, queue string, n int) <-chan deqOutcome {
	out := make(chan deqOutcome, 1)
	go func() {
		runs, err := b.q.Dequeue(ctx, env, queue, n)
		out <- deqOutcome{runs, err}
	}()
	return out
}

// holdDequeues starts two Dequeue calls of one run of queue each, each
// held at the gate in a call of its own (both senders busy), then the
// calls of ns, which wait for a sender.
func holdDequeues(t *testing.T, b *testBundle, h *scriptGate, queue string, ns ...int) []<-chan deqOutcome {
	t.Helper()
	// An Enqueue returns before its sender has counted itself out: wait
	// for the test's enqueues' senders to end, so that the count below is
	// the dequeues' only.
	require.Eventually(t, func() bool { return b.q.Senders() == 0 }, 5*time.Second, time.Millisecond, "the enqueues' senders end")
	out := []<-chan deqOutcome{dequeueAsync(b.ctx, b, queue, 1)}
	h.await(t, 1)
	out = append(out, dequeueAsync(b.ctx, b, queue, 1))
	h.await(t, 2)
	for i, n := range ns {
		out = append(out, dequeueAsync(b.ctx, b, queue, n))
		require.Eventually(t, func() bool { return b.q.PendingDequeues() == i+1 }, 5*time.Second, time.Millisecond)
	}
	require.Equal(t, 2, b.q.Senders(), "at most two senders")
	return out
}

// dqOutcomes waits for every call and returns the ids each got.
func dqOutcomes(t *testing.T, chs []<-chan deqOutcome) [][]string {
	t.Helper()
	var got [][]string
	for _, ch := range chs {
		o := <-ch
		require.NoError(t, o.err)
		got = append(got, runIDs(o.runs))
	}
	return got
}

// enqueueIDs queues runs of ids on queue, one millisecond apart, over two
// keys in turn: age order and the fair order are both the ids' order.
func enqueueIDs(t *testing.T, b *testBundle, queue string, ids ...string) {
	t.Helper()
	for i, id := range ids {
		b.clock.Advance(time.Millisecond)
		enqueue(t, b, runqueue.EnqueueParams{Queue: queue, Key: "k" + strconv.Itoa(i%2), ID: id})
	}
}

// Dequeue calls that wait while both senders are busy go together in one
// script call of their maxCounts summed, and its runs are handed out in
// serve order, each call taking up to its own maxCount, the earliest
// first; a call the runs do not reach gets none.
func TestDequeueCoalescesConcurrentCalls(t *testing.T) {
	gatedDequeues(t, nil, func(t *testing.T, b *testBundle, h *scriptGate) {
		enqueueIDs(t, b, "q", "r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8")
		h.arm(true)
		chs := holdDequeues(t, b, h, "q", 1, 2, 1, 3, 1, 2)
		h.releaseInOrder(t, 3)
		require.Equal(t, [][]string{{"r0"}, {"r1"}, {"r2"}, {"r3", "r4"}, {"r5"}, {"r6", "r7", "r8"}, {}, {}}, dqOutcomes(t, chs))
		require.Equal(t, []int{1, 1, 10}, h.calls(), "the six waiting calls went in one call of 10")
		require.Equal(t, [3]int{1, 30, 100}, h.size(0), "a call of its own: ScanLimit max(30, 3*1), PromoteLimit")
		require.Equal(t, [3]int{10, 6 * 30, 100}, h.size(2), "six calls' scans summed; their promotions summed, up to the larger of PromoteLimit and the maxCounts summed")
		require.Eventually(t, func() bool { return b.q.Senders() == 0 }, 5*time.Second, time.Millisecond)
		h.arm(false)
		st := queueStats(t, b, "q")
		require.Equal(t, int64(9), st.InFlight)
		require.Zero(t, st.Ready)
	})
}

// A send's maxCounts sum to at most Config.MaxDequeueCount: the calls past
// it go in the next send.
func TestDequeueCoalescedCountBound(t *testing.T) {
	gatedDequeues(t, func(cfg *runqueue.Config) { cfg.MaxDequeueCount = 5 }, func(t *testing.T, b *testBundle, h *scriptGate) {
		enqueueIDs(t, b, "q", "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n")
		h.arm(true)
		chs := holdDequeues(t, b, h, "q", 2, 3, 4, 5)
		h.releaseInOrder(t, 5)
		require.Equal(t, [][]string{{"a"}, {"b"}, {"c", "d"}, {"e", "f", "g"}, {"h", "i", "j", "k"}, {"l", "m", "n"}}, dqOutcomes(t, chs))
		require.Equal(t, []int{1, 1, 5, 4, 5}, h.calls(), "2+3, then 4, then 5")
	})
}

// Calls of different base queues never wait for each other: each queue
// has senders of its own, and a call on qb while qa's two are held is sent
// at once, in a call of its own queue.
func TestDequeueCoalescedQueues(t *testing.T) {
	gatedDequeues(t, nil, func(t *testing.T, b *testBundle, h *scriptGate) {
		enqueueIDs(t, b, "qa", "a0", "a1", "a2", "a3")
		enqueueIDs(t, b, "qb", "b0", "b1", "b2")
		h.arm(true)
		chs := holdDequeues(t, b, h, "qa", 1, 1)
		chs = append(chs, dequeueAsync(b.ctx, b, "qb", 2))
		h.await(t, 3)
		require.Equal(t, 2, b.q.PendingDequeues(), "qa's two wait; qb's went")
		require.Equal(t, 3, b.q.Senders())
		h.release(t, 2)
		require.Equal(t, [][]string{{"b0", "b1"}}, dqOutcomes(t, chs[4:]), "qb served while qa's calls are held")
		h.releaseInOrder(t, 4)
		require.Equal(t, [][]string{{"a0"}, {"a1"}, {"a2"}, {"a3"}}, dqOutcomes(t, chs[:4]))
		require.Equal(t, []int{1, 1, 2, 2}, h.calls())
		require.Eventually(t, func() bool { return b.q.Senders() == 0 }, 5*time.Second, time.Millisecond)
	})
}

// A caller that gives up before its call is sent withdraws it: nothing is
// served for it. One that gives up after its call was sent waits for the
// reply and gets what was served for it, as a call of its own does.
func TestDequeueCoalescedCancel(t *testing.T) {
	gatedDequeues(t, nil, func(t *testing.T, b *testBundle, h *scriptGate) {
		enqueueIDs(t, b, "q", "r0", "r1", "r2", "r3", "r4", "r5")
		h.arm(true)
		ctxA, cancelA := context.WithCancel(b.ctx)
		defer cancelA()
		a := dequeueAsync(ctxA, b, "q", 1)
		h.await(t, 1)
		second := dequeueAsync(b.ctx, b, "q", 1)
		h.await(t, 2)
		ctxC, cancelC := context.WithCancel(b.ctx)
		c := dequeueAsync(ctxC, b, "q", 2)
		require.Eventually(t, func() bool { return b.q.PendingDequeues() == 1 }, 5*time.Second, time.Millisecond)
		d := dequeueAsync(b.ctx, b, "q", 1)
		require.Eventually(t, func() bool { return b.q.PendingDequeues() == 2 }, 5*time.Second, time.Millisecond)
		cancelC()
		require.ErrorIs(t, (<-c).err, context.Canceled)
		require.Equal(t, 1, b.q.PendingDequeues(), "c withdrawn")
		cancelA()
		select {
		case o := <-a:
			t.Fatalf("a returned (%v, %v) while its call was held", runIDs(o.runs), o.err)
		case <-time.After(20 * time.Millisecond):
		}
		h.releaseInOrder(t, 3)
		require.Equal(t, [][]string{{"r0"}, {"r1"}, {"r2"}}, dqOutcomes(t, []<-chan deqOutcome{a, second, d}), "nothing was served for c")
		require.Equal(t, []int{1, 1, 1}, h.calls())
		require.Eventually(t, func() bool { return b.q.Senders() == 0 }, 5*time.Second, time.Millisecond)
		h.arm(false)
		st := queueStats(t, b, "q")
		require.Equal(t, int64(3), st.InFlight)
		require.Equal(t, int64(3), st.Ready)
	})
}

// dequeueObserver records the runs of each Observer.Dequeued report.
type dequeueObserver struct {
	runqueue.NopObserver
	mu      sync.Mutex
	reports [][]string
}

func (o *dequeueObserver) Dequeued(runs []*runqueue.Run, _ time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.reports = append(o.reports, runIDs(runs))
}

// The Observer hears of each coalesced call's own runs once (not of the
// script call's runs as one report), and nothing of a call that got none.
func TestDequeueCoalescedObserver(t *testing.T) {
	gatedDequeues(t, func(cfg *runqueue.Config) { cfg.Observer = &dequeueObserver{} }, func(t *testing.T, b *testBundle, h *scriptGate) {
		o := b.cfg.Observer.(*dequeueObserver)
		enqueueIDs(t, b, "q", "r0", "r1", "r2", "r3", "r4")
		h.arm(true)
		chs := holdDequeues(t, b, h, "q", 2, 1, 4, 1)
		h.releaseInOrder(t, 3)
		require.Equal(t, [][]string{{"r0"}, {"r1"}, {"r2", "r3"}, {"r4"}, {}, {}}, dqOutcomes(t, chs))
		o.mu.Lock()
		defer o.mu.Unlock()
		reports := slices.Clone(o.reports)
		slices.SortFunc(reports, slices.Compare)
		require.Equal(t, [][]string{{"r0"}, {"r1"}, {"r2", "r3"}, {"r4"}}, reports)
	})
}

// With Config.SerialCalls, and after Close, every Dequeue is a script call
// of its own.
func TestDequeueSerialCalls(t *testing.T) {
	gatedDequeues(t, func(cfg *runqueue.Config) { cfg.SerialCalls = true }, func(t *testing.T, b *testBundle, h *scriptGate) {
		enqueueIDs(t, b, "q", "r0", "r1", "r2", "r3")
		h.arm(true)
		var chs []<-chan deqOutcome
		for range 4 {
			chs = append(chs, dequeueAsync(b.ctx, b, "q", 1))
		}
		h.await(t, 4)
		require.Zero(t, b.q.PendingDequeues())
		h.open()
		var got []string
		for _, ids := range dqOutcomes(t, chs) {
			got = append(got, ids...)
		}
		require.Equal(t, []int{1, 1, 1, 1}, h.calls())
		require.Equal(t, []string{"r0", "r1", "r2", "r3"}, sortedCopy(got))
	})
	gatedDequeues(t, nil, func(t *testing.T, b *testBundle, h *scriptGate) {
		enqueueIDs(t, b, "q", "r0")
		require.NoError(t, b.q.Close())
		h.arm(true)
		h.open()
		require.Equal(t, []string{"r0"}, runIDs(dequeue(t, b, "q", 3)))
		require.Zero(t, b.q.Senders(), "no sender after Close")
		require.Equal(t, []int{3}, h.calls())
	})
}

// A coalesced send stands for the calls it carries: it promotes what one
// call of their maxCounts summed would with their PromoteLimits summed (up
// to 500). With PromoteLimit 1, three calls of one make a call of three
// with PromoteLimit 3: its budget, 3, shared by the two due keys, 2 each
// rounded up, promotes a0, a1, b0 and b1, and it serves those runs in age
// order with the flag off (a0, a1, b0: three calls of one, each promoting
// one run a key, would have served a2, older than b0, third), and in fair
// order with it on, where a registration is pending
// and the scheduler's batch invariance does not hold (docs/design.md,
// guarantee 4): both keys within the lag bound.
func TestDequeueCoalescedPromotes(t *testing.T) {
	mutate := func(cfg *runqueue.Config) { cfg.PromoteLimit = 1 }
	gatedDequeues(t, mutate, func(t *testing.T, b *testBundle, h *scriptGate) {
		on := b.cfg.VtimeScheduling
		twin := setup(t, b.client, func(cfg *runqueue.Config) {
			cfg.VtimeScheduling = on
			cfg.PromoteLimit = 3
		})
		for _, x := range []*testBundle{b, twin} {
			for i, id := range []string{"a0", "a1", "a2", "b0", "b1", "b2"} {
				enqueue(t, x, runqueue.EnqueueParams{Key: id[:1], ID: id, AvailableAt: x.clock.Now().Add(time.Second + time.Duration(i)*time.Millisecond)})
			}
			x.clock.Advance(2 * time.Second)
		}
		got, err := b.q.DequeueCoalesced(b.ctx, env, queueName, 1, 1, 1)
		require.NoError(t, err)
		var coalesced []string
		for _, runs := range got {
			require.Len(t, runs, 1)
			coalesced = append(coalesced, runs[0].ID)
		}
		require.Equal(t, runIDs(dequeue(t, twin, queueName, 3)), coalesced, "as one call of three with PromoteLimit 3")
		if !on {
			require.Equal(t, []string{"a0", "a1", "b0"}, coalesced, "age order over the runs promoted")
			st := queueStats(t, b, queueName)
			require.Equal(t, int64(2), st.Delayed, "four runs promoted, a2 and b2 left: %+v", st)
			return
		}
		a := 0
		for _, id := range coalesced {
			if id[0] == 'a' {
				a++
			}
		}
		require.Contains(t, []int{1, 2}, a, "both keys served: %v", coalesced)
	})
	// With the default PromoteLimit (100), thirty calls of ten over one
	// key with 300 due runs: the call of 300 promotes up to 500 a variant
	// and serves all 300, as the thirty calls would.
	gatedDequeues(t, nil, func(t *testing.T, b *testBundle, h *scriptGate) {
		var ps []runqueue.EnqueueParams
		for i := range 300 {
			ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: "k", ID: "r" + strconv.Itoa(i),
				AvailableAt: b.clock.Now().Add(time.Second + time.Duration(i)*time.Millisecond)})
		}
		_, err := b.q.EnqueueMany(b.ctx, ps)
		require.NoError(t, err)
		b.clock.Advance(2 * time.Second)
		counts := make([]int, 30)
		for i := range counts {
			counts[i] = 10
		}
		got, err := b.q.DequeueCoalesced(b.ctx, env, queueName, counts...)
		require.NoError(t, err)
		for i, runs := range got {
			require.Len(t, runs, 10, "call %d", i)
			require.Equal(t, "r"+strconv.Itoa(10*i), runs[0].ID)
		}
		require.Zero(t, queueStats(t, b, queueName).Delayed)
	})
}

// A send promotes up to its maxCount a variant when its calls' own
// promotions add up to more (a variant gives no more runs than that):
// sixty calls of ten over one key with 600 due runs serve all 600, as the
// sixty calls would, though one call promotes at most PromoteLimit. On a
// real Redis, a send of 2,000 promotes 2,000 runs of a variant in one
// call (its unpacks stay within Lua's limits).
func TestDequeueCoalescedPromotesToCount(t *testing.T) {
	gatedDequeues(t, nil, func(t *testing.T, b *testBundle, h *scriptGate) {
		for _, c := range []struct{ runs, calls, each int }{{600, 60, 10}, {2000, 100, 20}} {
			queue := "q" + strconv.Itoa(c.runs)
			var ps []runqueue.EnqueueParams
			for i := range c.runs {
				ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: queue, Key: "k", ID: "r" + strconv.Itoa(i),
					AvailableAt: b.clock.Now().Add(time.Second + time.Duration(i)*time.Millisecond)})
			}
			for i := 0; i < len(ps); i += 1000 {
				_, err := b.q.EnqueueMany(b.ctx, ps[i:min(i+1000, len(ps))])
				require.NoError(t, err)
			}
			b.clock.Advance(time.Hour)
			counts := make([]int, c.calls)
			for i := range counts {
				counts[i] = c.each
			}
			var got [][]*runqueue.Run
			var err error
			if c.runs > 1000 { // past the default MaxDequeueCount: a Queue that allows 2,000
				big := setup(t, b.client, func(cfg *runqueue.Config) {
					cfg.Prefix, cfg.VtimeScheduling, cfg.MaxDequeueCount = b.prefix, b.cfg.VtimeScheduling, 2000
					cfg.Clock = b.clock
				})
				got, err = big.q.DequeueCoalesced(b.ctx, env, queue, counts...)
			} else {
				got, err = b.q.DequeueCoalesced(b.ctx, env, queue, counts...)
			}
			require.NoError(t, err)
			for i, runs := range got {
				require.Len(t, runs, c.each, "%d runs, call %d", c.runs, i)
				require.Equal(t, "r"+strconv.Itoa(c.each*i), runs[0].ID)
			}
			st := queueStats(t, b, queue)
			require.Zero(t, st.Delayed)
			require.Equal(t, int64(c.runs), st.InFlight)
		}
	})
}
