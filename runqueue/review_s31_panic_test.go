package runqueue_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// s31PanicObs panics in Enqueued and Dequeued for queue "boom" and in
// every Acked; it counts what it heard.
type s31PanicObs struct {
	runqueue.NopObserver
	enq, deq, ack atomic.Int64
}

func (o *s31PanicObs) Enqueued(_, queue string, n int) {
	o.enq.Add(int64(n))
	if queue == "boom" {
		panic("observer: enqueued boom")
	}
}

func (o *s31PanicObs) Dequeued(runs []*runqueue.Run, _ time.Time) {
	o.deq.Add(int64(len(runs)))
	if len(runs) > 0 && runs[0].Queue == "boom" {
		panic("observer: dequeued boom")
	}
}

func (o *s31PanicObs) Acked(_, _ string, n int) {
	o.ack.Add(int64(n))
	panic("observer: acked")
}

// A panicking Observer under coalescing: many goroutines enqueue and
// dequeue runs of "boom" (whose Observer calls panic) and "ok" at once.
// Only the callers of "boom" panic, each in its own goroutine, after its
// run was queued (or served for it); callers of "ok" coalesced in the same
// sends get their results; the senders survive and exit. (Passes.)
func TestS31ObserverPanicStaysWithItsCaller(t *testing.T) {
	s31EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		obs := &s31PanicObs{}
		b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = on; cfg.Observer = obs })
		ctx := context.Background()
		const g, per = 20, 10
		var mu sync.Mutex
		panics := map[string]int{}
		var okRuns atomic.Int64
		call := func(queue string, f func()) {
			defer func() {
				if v := recover(); v != nil {
					mu.Lock()
					panics[fmt.Sprintf("%s %v", queue, v)]++
					mu.Unlock()
				}
			}()
			f()
		}
		var wg sync.WaitGroup
		for w := range g {
			wg.Go(func() {
				queue := []string{"ok", "boom"}[w%2]
				for i := range per {
					id := fmt.Sprintf("w%d-%d", w, i)
					call(queue, func() {
						ok, err := b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: env, Queue: queue, ID: id})
						if queue == "ok" && (err != nil || !ok) {
							t.Errorf("enqueue %s: %v %v", id, ok, err)
						}
					})
				}
			})
		}
		wg.Wait()
		require.Equal(t, map[string]int{"boom observer: enqueued boom": g / 2 * per}, panics)
		require.EqualValues(t, g*per, obs.enq.Load())
		for w := range g {
			wg.Go(func() {
				queue := []string{"ok", "boom"}[w%2]
				for range per {
					call(queue, func() {
						runs, err := b.q.Dequeue(ctx, env, queue, 1)
						if queue == "ok" {
							if err != nil || len(runs) != 1 {
								t.Errorf("dequeue ok: %d %v", len(runs), err)
							}
							okRuns.Add(int64(len(runs)))
						}
					})
				}
			})
		}
		wg.Wait()
		require.EqualValues(t, g/2*per, okRuns.Load())
		require.Equal(t, g/2*per, panics["boom observer: dequeued boom"])
		require.EqualValues(t, g*per, obs.deq.Load())
		require.Eventually(t, func() bool { return b.q.Senders() == 0 }, 5*time.Second, time.Millisecond)
		for _, q := range []string{"ok", "boom"} {
			st := queueStats(t, b, q)
			require.Zero(t, st.Ready+st.Delayed, "%s: %+v", q, st)
			require.EqualValues(t, g/2*per, st.InFlight, q)
		}
	})
}

// An Ack whose caller stopped waiting after its send was taken is told to
// the Observer in the sender, whose panic is logged: the process survives,
// the run is acked, and the next Ack on the Queue works. (Passes.)
func TestS31AckOrphanObserverPanicSurvives(t *testing.T) {
	s31EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		obs := &s31PanicObs{}
		h := newGateHook(8)
		h.arm(false)
		b := gated(t, c, h, func(cfg *runqueue.Config) { cfg.VtimeScheduling = on; cfg.Observer = obs })
		ctx := context.Background()
		for i := range 2 {
			ok, err := b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: env, Queue: "q", ID: fmt.Sprint("a", i)})
			require.NoError(t, err)
			require.True(t, ok)
		}
		runs := dequeue(t, b, "q", 2)
		require.Len(t, runs, 2)
		h.reset(3)
		actx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- b.q.Ack(actx, runs[0]) }()
		h.await(t, 1)
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
		h.open()
		require.Eventually(t, func() bool { return b.q.Senders() == 0 }, 5*time.Second, time.Millisecond)
		require.EqualValues(t, 1, obs.ack.Load(), "the orphan's ack is observed once")
		h.arm(false)
		func() {
			defer func() { require.NotNil(t, recover(), "the caller's own Observer panic") }()
			_ = b.q.Ack(ctx, runs[1])
		}()
		require.Zero(t, queueStats(t, b, "q").InFlight)
		require.False(t, errors.Is(b.q.Ack(ctx, runs[0]), runqueue.ErrLeaseLost))
	})
}
