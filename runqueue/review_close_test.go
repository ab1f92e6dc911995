package runqueue_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// holdClock is a fakeClock whose next Now, once armed, waits until it is
// released: it holds a caller at a chosen point of its call.
type holdClock struct {
	*fakeClock
	mu      sync.Mutex
	entered chan struct{}
	hold    chan struct{}
}

// holdNext arms the clock: the next Now closes entered and waits for
// release.
func (c *holdClock) holdNext() (entered <-chan struct{}, release func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entered, c.hold = make(chan struct{}), make(chan struct{})
	hold := c.hold
	var once sync.Once
	return c.entered, func() { once.Do(func() { close(hold) }) }
}

func (c *holdClock) Now() time.Time {
	c.mu.Lock()
	entered, hold := c.entered, c.hold
	c.entered, c.hold = nil, nil
	c.mu.Unlock()
	if hold != nil {
		close(entered)
		<-hold
	}
	return c.fakeClock.Now()
}

// A call racing with Close: Enqueue (and Ack) once looked at isClosed
// before handing their run to the coalescer, without a lock Close takes. A
// call that looked just before Close, and handed its run over just after
// Close's wait saw no sender, started a sender after Close had returned
// (no Close waits for it: a second one returns at once); when its caller
// gave up, the run was written after Close and the Enqueue both returned.
// The coalescer now refuses runs under its lock once Close began, and the
// call goes as a call of its own. The window is held open here by the
// Config.Clock that checkEnqueue reads.
func TestReviewCloseRacesClosedCheck(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		h := newGateHook(8)
		clk := &holdClock{fakeClock: newFakeClock()}
		b := gated(t, c, h, func(cfg *runqueue.Config) { cfg.Clock = clk })
		open := h.open

		entered, release := clk.holdNext()
		defer release()
		ctx, cancel := context.WithCancel(b.ctx)
		defer cancel()
		res := enqueueAsync(ctx, b.q, coalesceRun("late"))
		select {
		case <-entered: // Enqueue saw the Queue open, and reads the clock
		case <-time.After(5 * time.Second):
			t.Fatal("Enqueue never read the clock")
		}
		closed := make(chan error, 1)
		go func() { closed <- b.q.Close() }()
		select {
		case err := <-closed:
			require.NoError(t, err)
		case <-time.After(5 * time.Second):
			t.Fatal("Close did not return (no sender ran)")
		}
		release()
		h.await(t, 1) // the run's script call, sent after Close returned
		assert.Zero(t, b.q.Senders(), "a sender started after Close returned; no Close waits for it")

		// The caller gives up: it returns at once if its run went to a
		// sender, and the send goes on without it.
		cancel()
		var returned bool
		var err error
		select {
		case err = <-res:
			returned = true
		case <-time.After(300 * time.Millisecond):
		}
		require.NoError(t, b.q.Close(), "a second Close")
		open()
		if !returned {
			err = <-res
		}
		require.Eventually(t, func() bool { return b.q.Senders() == 0 }, 5*time.Second, time.Millisecond)
		h.arm(false)
		written := len(queuedIDs(t, b)) == 1
		t.Logf("Enqueue returned before the write: %v (err %v); run written: %v", returned, err, written)
		require.False(t, returned && written,
			"Close returned, then the Enqueue returned (%v), and its run was written after both", err)
	})
}

// A test that fails while a gate holds senders: setup closes the Queue in
// a t.Cleanup, and Close waits for the senders, so without gated's
// open-on-cleanup such a test hung in Close until go test's -timeout and
// ended in a "test timed out" panic of the whole binary instead of its own
// failure. The test re-runs itself in a child process with a short
// -test.timeout.
func TestReviewCloseFailedAssertionWhileGateHolds(t *testing.T) {
	if os.Getenv("REVIEW_CLOSE_CHILD") == "1" {
		h := newGateHook(8)
		b := gated(t, redistest.Mini(t), h, nil)
		holdSenders(t, h, func(i int) <-chan error { return enqueueAsync(b.ctx, b.q, coalesceRun(string(rune('a'+i)))) })
		t.Fatal("simulated assertion failure while the gate holds both senders")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestReviewCloseFailedAssertionWhileGateHolds$", "-test.count=1",
		"-test.v", "-test.timeout=10s")
	cmd.Env = append(os.Environ(), "REVIEW_CLOSE_CHILD=1")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	head := string(out)
	if len(head) > 1500 {
		head = head[:1500]
	}
	t.Logf("child: err=%v after %v\n%s", err, time.Since(start).Round(time.Millisecond), head)
	require.Contains(t, string(out), "simulated assertion failure")
	require.False(t, strings.Contains(string(out), "test timed out"),
		"the failed test must end with its failure, not hang in setup's Close cleanup (see the child's output above)")
}

// gateExitHook holds every pipeline of script calls at a gate and then
// ends those among the first `left` to reach it with runtime.Goexit (as
// t.FailNow in a go-redis hook of a test would). By arrival, not by the
// order they leave the gate in: once it opens, a send that started after
// it (a sender taking over pending runs) may pass before a held one, and
// counting at the exit ended it instead (a CI run: the pending run's
// caller panicked, "a coalesced call ended without results", and a held
// run was written).
type gateExitHook struct {
	gate    chan struct{}
	reached atomic.Int64
	left    atomic.Int64
}

func (h *gateExitHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *gateExitHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *gateExitHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		scripts := false
		for _, c := range cmds {
			if name := fmt.Sprint(c.Args()[0]); name == "evalsha" || name == "eval" || name == "fcall" {
				scripts = true
			}
		}
		if scripts {
			n := h.reached.Add(1)
			<-h.gate
			if n <= h.left.Load() {
				runtime.Goexit()
			}
		}
		return next(ctx, cmds)
	}
}

// Close waits while the senders are held, and returns once they are gone
// even when their sends end their goroutines (runtime.Goexit in a hook):
// the deferred path of run() must wake Close when it counts its sender
// out (one sender, nothing pending), and when it hands the runs still
// pending to a new sender, Close returns once that one has sent them. No
// existing test has Close waiting while a sender takes that path.
func TestReviewCloseAfterSenderGoexit(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		for _, pending := range []bool{false, true} {
			t.Run(fmt.Sprintf("pending=%v", pending), func(t *testing.T) {
				o := otherClient(t, c)
				b := setup(t, o, nil)
				h := &gateExitHook{gate: make(chan struct{})}
				var once sync.Once
				open := func() { once.Do(func() { close(h.gate) }) }
				t.Cleanup(open)
				o.AddHook(h)

				ctx, cancel := context.WithCancel(b.ctx)
				defer cancel()
				// A caller whose run was sent waits for its send (even once
				// its context ends); a send that ends its goroutine reaches
				// it as a panic, recovered here as an error.
				enqueueRecover := func(ctx context.Context, p runqueue.EnqueueParams) <-chan error {
					out := make(chan error, 1)
					go func() {
						defer func() {
							if v := recover(); v != nil {
								out <- fmt.Errorf("panic: %v", v)
							}
						}()
						_, err := b.q.Enqueue(ctx, p)
						out <- err
					}()
					return out
				}
				held := []<-chan error{enqueueRecover(ctx, coalesceRun("a"))}
				require.Eventually(t, func() bool { return h.reached.Load() == 1 }, 5*time.Second, time.Millisecond)
				var cc <-chan error
				if pending {
					held = append(held, enqueueRecover(ctx, coalesceRun("b")))
					require.Eventually(t, func() bool { return h.reached.Load() == 2 }, 5*time.Second, time.Millisecond)
					cc = enqueueAsync(b.ctx, b.q, coalesceRun("c")) // waits in the pending list
					require.Eventually(t, func() bool { return b.q.PendingEnqueues() == 1 }, 5*time.Second, time.Millisecond)
				}
				h.left.Store(int64(len(held)))
				cancel()

				closed := make(chan error, 1)
				go func() { closed <- b.q.Close() }()
				select {
				case err := <-closed:
					t.Fatalf("Close returned (%v) while sends were held", err)
				case <-time.After(50 * time.Millisecond):
				}
				open() // the held sends end their goroutines; a new sender sends c
				select {
				case err := <-closed:
					require.NoError(t, err)
				case <-time.After(5 * time.Second):
					t.Fatalf("Close did not return once the senders were gone (senders=%d pending=%d)",
						b.q.Senders(), b.q.PendingEnqueues())
				}
				require.Zero(t, b.q.Senders())
				for _, ch := range held {
					require.ErrorContains(t, <-ch, "ended without results", "the held callers learn that their sends ended")
				}
				var want []string
				if pending {
					require.NoError(t, <-cc, "c, pending when its senders ended, went with the sender that took over")
					want = []string{"c"}
				}
				require.Equal(t, want, queuedIDs(t, b), "the ended sends wrote nothing")
			})
		}
	})
}
