package runqueue

import (
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
)

// helper-220 F1: passAbove wakes a waiter that joined on a free look
// (lineHeld false: its look found the env below its limit, it waits for
// acks on their way), which pass never does ("two such would pass it back
// and forth while acks flow"). a (limit 1) held at 2 passes to b (limit 3,
// joined free, key-held); b, woken, takes nothing, finds the env free and
// passes (pass) back to a, the held waiter; a passes above again to b, who
// rejoined free while acks of the line were on their way: a loop.
func TestH220PassAboveSkipsFreeJoinedWaiter(t *testing.T) {
	t.Parallel()
	ss := lineSources(3)
	a, b := ss[0], ss[1]
	line := a.line
	mustJoin(t, a, false, 1, "a joins held (count 2 of its 1)")
	line.acks(1) // a call with acks of the line on its way (c's)
	mustJoin(t, b, true, 3, "b joins on a free look while acks are on their way")

	for round := range 3 {
		// a, woken (say), is held at 2 of its 1 and passes above.
		line.leave(a)
		at := line.leave(a)
		line.passAbove(a, 2)
		woke := nudgedNow(b)
		if woke {
			// b takes nothing (key-held), finds the env free: pass, to a,
			// which rejoined held; b rejoins free (acks still on their way).
			require.Equal(t, lineCrossed, line.join(a, at, false, 1))
			mustJoin(t, a, false, 1)
			bt := line.leave(b)
			line.pass(b, false)
			require.True(t, nudgedNow(a), "pass wakes a, the held waiter")
			require.Equal(t, lineCrossed, line.join(b, bt, true, 3))
			bt = line.leave(b)
			require.Equal(t, lineJoined, line.join(b, bt, true, 3))
		}
		require.False(t, woke, "round %d: passAbove woke b, which joined on a free look (a<->b ping-pong while acks flow)", round)
	}
}

// helper-220 F2: a Worker's call that succeeded (its dequeue read the
// limits), whose finish's read of LimitsFor panics (a flaky limits
// store), skips lineStep: the slots its acks freed wake nobody in the
// line, which waits for its poll.
func TestH220FinishLimitsPanicStillReleases(t *testing.T) {
	t.Parallel()
	var boom atomic.Bool
	w := lineWorkerOf(t, redistest.Mini(t), func(string, string) Limits {
		if boom.Load() {
			panic("the limits store is down")
		}
		return Limits{Env: 2}
	})
	a, b := w.sources[0], w.sources[1]
	la, lb := handLoop(w, a), handLoop(w, b)
	j1, j2, cb := aHoldsBothSlots(t, w, la, lb)
	lb.finish(cb)
	require.True(t, inEnvLine(b), "b, held at 2 of 2, waits in the line")

	ca2 := &fetchCall{acks: []*job{j1, j2}, ks: w.slots.take(a, 1, 1, nil), hints: la.hints,
		released: a.line.leave(a), lineAcks: true}
	a.line.acks(1)
	a.fetch(ca2)
	require.NoError(t, ca2.err)
	require.Empty(t, ca2.runs, "a is empty: its acks freed both slots")
	boom.Store(true) // LimitsFor fails between the call and its finish
	la.finish(ca2)
	require.True(t, nudgedNow(b), "a's acks freed two slots: b is woken")
}

// helper-220 F3: with GODEBUG panicnil=1 (a main module may set it), a
// LimitsFor that panics with nil is recovered as nil: limitsFor returns
// no limits and no error, and the dequeue goes on with none.
func TestH220LimitsForPanicNil(t *testing.T) {
	t.Setenv("GODEBUG", "panicnil=1")
	c := &Config{LimitsFor: func(string, string) Limits { panic(nil) }}
	_, err := c.limitsFor("e", "q")
	require.Error(t, err, "a panic(nil) is no answer of LimitsFor")
}

// All queues of the env with one limit: a woken source held at it passes
// nothing above and counts no release (a call on its way does not cross:
// as before 6b3ce10).
func TestH220PassAboveSameLimitChangesNothing(t *testing.T) {
	t.Parallel()
	ss := lineSources(3)
	a, b, c := ss[0], ss[1], ss[2]
	line := a.line
	for _, s := range []*source{a, b} {
		mustJoin(t, s, false, 2)
	}
	at := line.leave(c)
	line.passAbove(a, 2)
	line.passAbove(a, 3)
	require.False(t, nudgedNow(a) || nudgedNow(b))
	require.Equal(t, lineJoined, line.join(c, at, false, 2), "no release counted")
}
