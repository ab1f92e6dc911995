package runqueue_test

import (
	"context"
	"errors"
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

// gateHook holds every pipeline of script calls at a gate until it opens,
// and records how many runs each script call carried (ARGV[argv]). It
// starts armed; disarmed it lets everything through unrecorded.
type gateHook struct {
	mu      sync.Mutex
	argv    int // the run count's ARGV index: 8 for enqueue, 3 for ack
	armed   bool
	gate    chan struct{}
	blocked int   // pipelines that reached the gate
	runs    []int // the run count of each script call, in order
	piped   []int // the run count of each pipeline of script calls, in order
}

func newGateHook(argv int) *gateHook {
	return &gateHook{argv: argv, armed: true, gate: make(chan struct{})}
}

// reset closes the gate again, armed, counting runs at ARGV[argv].
func (h *gateHook) reset(argv int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.argv, h.armed, h.gate, h.blocked, h.runs, h.piped = argv, true, make(chan struct{}), 0, nil, nil
}

func (h *gateHook) arm(on bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.armed = on
}

func (h *gateHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *gateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *gateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.mu.Lock()
		armed := h.armed
		h.mu.Unlock()
		scripts, piped := false, 0
		for _, c := range cmds {
			args := c.Args()
			if name := fmt.Sprint(args[0]); !armed || name != "evalsha" && name != "eval" && name != "fcall" {
				continue
			}
			scripts = true
			numKeys := args[2].(int)
			h.mu.Lock()
			h.runs = append(h.runs, args[2+numKeys+h.argv].(int))
			h.mu.Unlock()
			piped += args[2+numKeys+h.argv].(int)
		}
		if scripts {
			h.mu.Lock()
			h.piped = append(h.piped, piped)
			h.blocked++
			gate := h.gate
			h.mu.Unlock()
			<-gate
		}
		return next(ctx, cmds)
	}
}

// open lets the held calls through (again: a no-op).
func (h *gateHook) open() {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.gate:
	default:
		close(h.gate)
	}
}

func (h *gateHook) reached() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.blocked
}

// holdSenders starts call(0), then call(1), each held at h's gate in a
// send of its own: both senders are busy, and the calls after them wait in
// the pending list.
func holdSenders(t *testing.T, h *gateHook, call func(i int) <-chan error) []<-chan error {
	t.Helper()
	out := []<-chan error{call(0)}
	h.await(t, 1)
	out = append(out, call(1))
	h.await(t, 2)
	return out
}

// await waits until n pipelines have reached the gate.
func (h *gateHook) await(t *testing.T, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return h.reached() == n }, 5*time.Second, time.Millisecond)
}

// largestPipeline is the most runs sent in one pipeline.
func (h *gateHook) largestPipeline() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Max(append([]int{0}, h.piped...))
}

func (h *gateHook) calls() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Sorted(slices.Values(h.runs))
}

// gated returns a bundle whose Queue talks to c's server through a client
// of its own that holds script calls at h's gate.
func gated(t *testing.T, c redis.UniversalClient, h *gateHook, mutate func(*runqueue.Config)) *testBundle {
	t.Helper()
	o := otherClient(t, c)
	b := setup(t, o, mutate)
	o.AddHook(h)
	// Before the Queue's Close (cleanups run last first), which waits for
	// the senders: a test that fails with calls held does not hang.
	t.Cleanup(h.open)
	return b
}

func coalesceRun(id string) runqueue.EnqueueParams {
	return runqueue.EnqueueParams{Env: env, Queue: "q", Key: "k", ID: id, Payload: []byte("p-" + id)}
}

// enqueueAsync calls Enqueue in a goroutine; its outcome arrives on the
// returned channel.
func enqueueAsync(ctx context.Context, q *runqueue.Queue, p runqueue.EnqueueParams) <-chan error {
	out := make(chan error, 1)
	go func() {
		ok, err := q.Enqueue(ctx, p)
		if err == nil && !ok {
			err = errors.New("not queued")
		}
		out <- err
	}()
	return out
}

func queuedIDs(t *testing.T, b *testBundle) []string {
	t.Helper()
	return sortedCopy(runIDs(dequeue(t, b, "q", 1000)))
}

// Runs that arrive while both senders are busy go together in one script
// call, each with its own result, and the senders end when nothing is left.
func TestEnqueueCoalescesConcurrentCalls(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		h := newGateHook(8)
		b := gated(t, c, h, nil)
		first := holdSenders(t, h, func(i int) <-chan error { return enqueueAsync(b.ctx, b.q, coalesceRun(string(rune('a'+i)))) })
		var later []<-chan error
		for i := range 5 {
			later = append(later, enqueueAsync(b.ctx, b.q, coalesceRun("c"+strconv.Itoa(i))))
		}
		require.Eventually(t, func() bool { return b.q.PendingEnqueues() == 5 }, 5*time.Second, time.Millisecond)
		require.Equal(t, 2, b.q.Senders(), "at most two senders")
		h.open()
		for _, ch := range append(first, later...) {
			require.NoError(t, <-ch)
		}
		require.Equal(t, []int{1, 1, 5}, h.calls(), "the five waiting runs went in one call")
		require.Eventually(t, func() bool { return b.q.Senders() == 0 }, 5*time.Second, time.Millisecond)
		h.arm(false)
		require.Equal(t, []string{"a", "b", "c0", "c1", "c2", "c3", "c4"}, queuedIDs(t, b))
	})
}

// A caller that gives up before its run is sent withdraws it: nothing is
// written. One that gives up after its run was sent waits for the call and
// gets its result (a retry of its own could otherwise be overtaken by it),
// and the call goes on for it and for the runs sent with it.
func TestEnqueueCoalescedCancel(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		h := newGateHook(8)
		b := gated(t, c, h, nil)
		ctxA, cancelA := context.WithCancel(b.ctx)
		defer cancelA()
		held := holdSenders(t, h, func(i int) <-chan error {
			if i == 0 {
				return enqueueAsync(ctxA, b.q, coalesceRun("a"))
			}
			return enqueueAsync(b.ctx, b.q, coalesceRun("b"))
		})
		a, bb := held[0], held[1]

		ctxC, cancelC := context.WithCancel(b.ctx)
		cc := enqueueAsync(ctxC, b.q, coalesceRun("c"))
		ctxD, cancelD := context.WithCancel(b.ctx)
		defer cancelD()
		d := enqueueAsync(ctxD, b.q, coalesceRun("d"))
		e := enqueueAsync(b.ctx, b.q, coalesceRun("e"))
		require.Eventually(t, func() bool { return b.q.PendingEnqueues() == 3 }, 5*time.Second, time.Millisecond)
		cancelC()
		require.ErrorIs(t, <-cc, context.Canceled)
		require.Equal(t, 2, b.q.PendingEnqueues(), "c withdrawn")
		cancelA()
		select {
		case err := <-a:
			t.Fatalf("a was sent: its caller waits for the call, yet returned %v", err)
		case <-time.After(50 * time.Millisecond):
		}

		h.open()
		require.NoError(t, <-a, "a's call went through: its caller learns it")
		require.NoError(t, <-bb)
		require.Eventually(t, func() bool { return b.q.PendingEnqueues() == 0 }, 5*time.Second, time.Millisecond)
		// d's call is sent on d's context without its cancellation: d
		// giving up now does not fail e.
		cancelD()
		require.NoError(t, <-e)
		if err := <-d; err != nil {
			require.ErrorIs(t, err, context.Canceled)
		}
		require.Eventually(t, func() bool { return b.q.Senders() == 0 }, 5*time.Second, time.Millisecond)
		require.Equal(t, []int{1, 1, 2}, h.calls())
		h.arm(false)
		require.Equal(t, []string{"a", "b", "d", "e"}, queuedIDs(t, b), "c was never written")
	})
}

// With Config.SerialCalls every Enqueue and Ack is a script call of its own.
func TestSerialCalls(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		h := newGateHook(8)
		b := gated(t, c, h, func(cfg *runqueue.Config) { cfg.SerialCalls = true })
		var chs []<-chan error
		for i := range 4 {
			chs = append(chs, enqueueAsync(b.ctx, b.q, coalesceRun("s"+strconv.Itoa(i))))
		}
		h.await(t, 4)
		require.Zero(t, b.q.PendingEnqueues())
		h.open()
		for _, ch := range chs {
			require.NoError(t, <-ch)
		}
		require.Equal(t, []int{1, 1, 1, 1}, h.calls())
		h.arm(false)
		runs := dequeue(t, b, "q", 10)
		require.Equal(t, []string{"s0", "s1", "s2", "s3"}, sortedCopy(runIDs(runs)))

		// And every Ack.
		h.reset(3)
		chs = nil
		for _, r := range runs {
			chs = append(chs, func() <-chan error {
				out := make(chan error, 1)
				go func() { out <- b.q.Ack(b.ctx, r) }()
				return out
			}())
		}
		h.await(t, 4)
		require.Zero(t, b.q.PendingAcks())
		h.open()
		for _, ch := range chs {
			require.NoError(t, <-ch)
		}
		require.Equal(t, []int{1, 1, 1, 1}, h.calls())
		require.Zero(t, queueStats(t, b, "q").InFlight)
	})
}

// Many goroutines at once: every result is the run's own (queued, an
// idempotent retry, a conflict, invalid input, a full queue), and the
// queue holds exactly the runs reported queued.
func TestEnqueueCoalescedResults(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		const goroutines, perG, depth = 8, 40, 250
		b := setup(t, c, func(cfg *runqueue.Config) { cfg.MaxQueueDepth = depth })
		var mu sync.Mutex
		var queued []string
		full := 0
		var wg sync.WaitGroup
		errs := make(chan error, goroutines)
		for g := range goroutines {
			wg.Go(func() {
				for i := range perG {
					id := fmt.Sprintf("g%d-%d", g, i)
					ok, err := b.q.Enqueue(b.ctx, coalesceRun(id))
					switch {
					case errors.Is(err, runqueue.ErrQueueFull):
						mu.Lock()
						full++
						mu.Unlock()
						continue
					case err != nil || !ok:
						errs <- fmt.Errorf("%s: %v %w", id, ok, err)
						return
					}
					mu.Lock()
					queued = append(queued, id)
					mu.Unlock()
					// A retry of the same run is a no-op; the same id with
					// another payload is a conflict; a bad run is refused.
					if ok, err := b.q.Enqueue(b.ctx, coalesceRun(id)); ok || err != nil {
						errs <- fmt.Errorf("retry of %s: %v %v", id, ok, err)
						return
					}
					other := coalesceRun(id)
					other.Payload = []byte("other")
					if _, err := b.q.Enqueue(b.ctx, other); !errors.Is(err, runqueue.ErrConflict) {
						errs <- fmt.Errorf("conflict of %s: %v", id, err)
						return
					}
					bad := coalesceRun("")
					var inv *runqueue.InvalidError
					if _, err := b.q.Enqueue(b.ctx, bad); !errors.As(err, &inv) {
						errs <- fmt.Errorf("invalid: %v", err)
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		require.Len(t, queued, depth)
		require.Equal(t, goroutines*perG-depth, full)
		require.Equal(t, sortedCopy(queued), queuedIDs(t, b))
		require.Eventually(t, func() bool { return b.q.Senders() == 0 }, 5*time.Second, time.Millisecond)
	})
}

// Concurrent Acks coalesce the same way, each with its own result: an ack
// of a stale delivery fails alone, and the runs acked with it are gone.
func TestAckCoalescesConcurrentCalls(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		h := newGateHook(3)
		h.arm(false)
		b := gated(t, c, h, nil)
		for i := range 7 {
			enqueue(t, b, coalesceRun("r"+strconv.Itoa(i)))
		}
		runs := dequeue(t, b, "q", 7)
		require.Len(t, runs, 7)
		h.arm(true)

		ack := func(r *runqueue.Run) <-chan error {
			out := make(chan error, 1)
			go func() { out <- b.q.Ack(b.ctx, r) }()
			return out
		}
		first := holdSenders(t, h, func(i int) <-chan error { return ack(runs[i]) })
		stale := *runs[2]
		stale.Token++
		staleErr := ack(&stale)
		var later []<-chan error
		for _, r := range runs[3:] {
			later = append(later, ack(r))
		}
		require.Eventually(t, func() bool { return b.q.PendingAcks() == 5 }, 5*time.Second, time.Millisecond)
		h.open()
		require.ErrorIs(t, <-staleErr, runqueue.ErrLeaseLost)
		for _, ch := range append(first, later...) {
			require.NoError(t, <-ch)
		}
		require.Equal(t, []int{1, 1, 5}, h.calls(), "the five waiting acks went in one call")
		require.Eventually(t, func() bool { return b.q.Senders() == 0 }, 5*time.Second, time.Millisecond)
		h.arm(false)
		st := queueStats(t, b, "q")
		require.Equal(t, int64(1), st.InFlight, "only the run of the stale ack is still in flight")
		require.NoError(t, b.q.Ack(b.ctx, runs[2]))
		require.NoError(t, b.q.Ack(b.ctx, runs[0]), "acking again: gone already")
		require.Zero(t, queueStats(t, b, "q").InFlight)
	})
}

// A send stops at 4 MiB of payload: twelve runs of almost 1 MiB that wait
// together go in calls of four.
func TestEnqueueCoalescedPayloadBound(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		h := newGateHook(8)
		b := gated(t, c, h, nil)
		first := holdSenders(t, h, func(i int) <-chan error { return enqueueAsync(b.ctx, b.q, coalesceRun(string(rune('a'+i)))) })
		big := make([]byte, 1<<20-2)
		var later []<-chan error
		for i := range 12 {
			p := coalesceRun("big" + strconv.Itoa(i))
			p.Payload = big
			later = append(later, enqueueAsync(b.ctx, b.q, p))
		}
		require.Eventually(t, func() bool { return b.q.PendingEnqueues() == 12 }, 5*time.Second, time.Millisecond)
		h.open()
		for _, ch := range append(first, later...) {
			require.NoError(t, <-ch)
		}
		require.Equal(t, []int{1, 1, 4, 4, 4}, h.calls())
		require.Eventually(t, func() bool { return b.q.Senders() == 0 }, 5*time.Second, time.Millisecond)
		h.arm(false)
		require.Equal(t, int64(14), queueStats(t, b, "q").Ready)
	})
}

// Close waits for the coalesced calls in flight: a run handed to a sender
// before Close is written before Close returns, never after it (a caller
// that cleans up its keys after Close finds nothing written later).
func TestCloseWaitsForCoalescedCalls(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		h := newGateHook(8)
		b := gated(t, c, h, nil)
		ctx, cancel := context.WithCancel(b.ctx)
		calls := holdSenders(t, h, func(i int) <-chan error { return enqueueAsync(ctx, b.q, coalesceRun(string(rune('a'+i)))) })
		cancel() // their runs are at the gate already: the callers wait for their sends
		closed := make(chan error, 1)
		go func() { closed <- b.q.Close() }()
		select {
		case err := <-closed:
			t.Fatalf("Close returned (%v) while two sends were in flight", err)
		case <-time.After(50 * time.Millisecond):
		}
		require.Equal(t, 2, b.q.Senders())
		h.open()
		select {
		case err := <-closed:
			require.NoError(t, err)
		case <-time.After(5 * time.Second):
			t.Fatal("Close did not return once the sends went through")
		}
		require.Zero(t, b.q.Senders())
		for _, ch := range calls {
			require.NoError(t, <-ch, "a cancelled caller whose run was sent learns its result")
		}
		h.arm(false)
		require.Equal(t, []string{"a", "b"}, queuedIDs(t, b), "both runs written, before Close returned")
	})
}

// After Close, Enqueue and Ack still work, each as a call of its own (no
// sender starts, so nothing can keep a Close waiting).
func TestCallsAfterClose(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		h := newGateHook(8)
		b := gated(t, c, h, nil)
		require.NoError(t, b.q.Close())
		h.open()
		ok, err := b.q.Enqueue(b.ctx, coalesceRun("a"))
		require.NoError(t, err)
		require.True(t, ok)
		require.Zero(t, b.q.Senders(), "no sender after Close")
		require.Equal(t, []int{1}, h.calls(), "the enqueue: one script call of one run")
		h.arm(false)
		runs := dequeue(t, b, queueName, 1)
		require.Len(t, runs, 1)
		h.reset(3) // the ack script's n is its ARGV[3]
		h.open()
		require.NoError(t, b.q.Ack(b.ctx, runs[0]))
		require.Zero(t, b.q.Senders())
		require.Equal(t, []int{1}, h.calls(), "the ack: one script call of one run")
	})
}
