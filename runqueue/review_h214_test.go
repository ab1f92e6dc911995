package runqueue

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
)

// lookHook counts queueNext pipelines (ZSCORE first) that name a queue.
type lookHook struct {
	queue string
	n     atomic.Int64
	gets  atomic.Int64 // GETs of an in-flight count in those looks
}

func (h *lookHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *lookHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}
func (h *lookHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() == "zscore" && strings.Contains(fmt.Sprint(cmds[0].Args()...), h.queue) {
			h.n.Add(1)
			for _, c := range cmds {
				if c.Name() == "get" {
					h.gets.Add(1)
				}
			}
		}
		return next(ctx, cmds)
	}
}

// H214-1: W1 (qa) drains (Shutdown began, its handlers hold both env
// slots). Had it left the line's members at its stop, W2's lone qb source
// would look without counts and not join, and W1's acks (released during
// the drain) would wake nobody: b1 waited for qb's poll (30 s). A draining
// source counts until its loop ends.
func TestH214DrainingWorkersReleaseWakesHeldQueue(t *testing.T) {
	t.Parallel()
	redistest.ForEachBackend(t, lineBackends, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		hook := &lookHook{queue: "qb"}
		c.AddHook(hook)
		g := newGatedQa(t, c, func() int { return 2 })
		q, handler, gate, started, served := g.q, g.handler, g.gate, g.started, g.served
		w1, err := NewWorker(q, handler, &WorkerConfig{Queues: []WorkerQueue{{Env: "e", Queue: "qa"}}, Concurrency: 2})
		require.NoError(t, err)
		require.NoError(t, w1.Start(ctx))
		w2 := startedWorker(t, q, handler, &WorkerConfig{Queues: []WorkerQueue{{Env: "e", Queue: "qb"}}, Concurrency: 1})
		<-started
		<-started
		require.Eventually(t, func() bool { return hook.n.Load() > 0 }, 10*time.Second, 5*time.Millisecond, "qb's first look")
		line := w2.sources[0].line
		require.Same(t, line, w1.sources[0].line)
		stopped := make(chan error, 1)
		go func() {
			sctx, cancel := context.WithTimeout(ctx, 25*time.Second)
			defer cancel()
			stopped <- w1.Shutdown(sctx)
		}()
		require.Eventually(t, func() bool {
			w1.slots.mu.Lock()
			defer w1.slots.mu.Unlock()
			return w1.slots.fetching == 0
		}, 10*time.Second, 5*time.Millisecond, "W1's qa calls for runs no more (it drains)")
		looks := hook.n.Load()
		_, err = q.Enqueue(ctx, EnqueueParams{Env: "e", Queue: "qb", Key: "k", ID: "b1"})
		require.NoError(t, err)
		require.Eventually(t, func() bool { return hook.n.Load() > looks }, 10*time.Second, 5*time.Millisecond,
			"qb's call is held and it looks")
		require.Eventually(t, func() bool { return inEnvLine(w2.sources[0]) }, 10*time.Second, 5*time.Millisecond,
			"qb's look read the env's counts (W1 still counts while it drains): qb waits in the line")
		close(gate) // W1's handlers end; its draining acks free both env slots
		waitServed(t, served, "b1", func() string {
			return fmt.Sprintf("qb in line: %v, members %d", inEnvLine(w2.sources[0]), lineMembers(line))
		})
		require.NoError(t, <-stopped)
	})
}

// H214-2: quitLine drained nudged, then took s out of the waiting line: a
// release between the two nudged s (still waiting) and the wake-up was
// lost with it. Driven by hand at that window: quit takes the nudge under
// the line's lock, after s left.
func TestH214QuitTakesANudgeThatCameBeforeIt(t *testing.T) {
	t.Parallel()
	ss := lineSources(3)
	a, b, c := ss[0], ss[1], ss[2]
	line := a.line
	for _, s := range []*source{b, c} {
		mustJoin(t, s, false, 0)
	}
	lb := &fetchLoop{s: b, lineIn: true}
	require.False(t, nudgedNow(b)) // (what quitLine looked at first)
	line.release(a, 1)             // a's release runs now, b still in the waiting line
	lb.quitLine()
	require.True(t, nudgedNow(c), "the release for one slot woke b, which left: it should go on to c")
}

// H214-3: d joined on a free look, acks on their way (their release may
// be what it missed); that release (one slot) wakes b, the longest held,
// whose Worker then stops: b passes the wake-up only to a waiter that
// joined on a held look, so d, the only other waiter, is left to its poll
// with the slot free. (Passing back and forth, pass's reason to skip
// free joiners, cannot happen here: b never calls again.)
func TestH214QuitterPassesToFreeJoiner(t *testing.T) {
	t.Parallel()
	ss := lineSources(4)
	a, b, d := ss[0], ss[1], ss[3]
	line := a.line
	mustJoin(t, b, false, 0)
	line.acks(1) // a's acks on their way
	mustJoin(t, d, true, 0, "d joins on a free look")
	line.release(a, 1) // a's acks free one slot
	line.acks(-1)
	require.False(t, inEnvLine(b), "b is woken")
	(&fetchLoop{s: b, lineIn: true}).quitLine() // b's Worker stops before b's loop saw it
	require.True(t, nudgedNow(d), "the slot b was woken for goes on to d")
}
