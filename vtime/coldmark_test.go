package vtime_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/vtime"
)

// burst enqueues runs delayed runs for each of tenants keys t000.., all due
// at due, written at now.
func burst(t *testing.T, m *vtime.Model, tenants, runs int, now, due int64) {
	t.Helper()
	for k := range tenants {
		for i := range runs {
			key := fmt.Sprintf("t%03d", k)
			require.NoError(t, m.Enqueue(fmt.Sprintf("%s-%d-%d", key, due, i), key, 0, due, now))
		}
	}
}

// TestColdMarkBurstShares: a burst of delayed work of many tenants falling
// due together into an idle queue is shared evenly, as when the same runs
// are enqueued ready. Without the cold mark the ScanLimit first by name
// registered at V and the rest came through the newcomer lane, one key's
// share together (helper-165: the 30 first of 100 tenants took 997 of the
// first 1,000 serves of calls of 10, the last was first served at call
// 321).
func TestColdMarkBurstShares(t *testing.T) {
	for _, ready := range []bool{false, true} {
		t.Run(fmt.Sprintf("ready=%v", ready), func(t *testing.T) {
			const tenants, runs, now, due = 100, 40, int64(1_000), int64(5_000)
			m := vtime.New(vtime.Config{})
			at := due
			if ready {
				at = now // the same runs ready at once: the shares to match
			}
			burst(t, m, tenants, runs, now, at)
			served, first := map[string]int{}, map[string]int{}
			for call := 0; call < 100; call++ {
				out := m.Dequeue(10, due+int64(call))
				require.Len(t, out, 10, "call %d", call)
				for _, s := range out {
					if _, ok := first[s.Key]; !ok {
						first[s.Key] = call
					}
					served[s.Key]++
				}
			}
			require.Len(t, served, tenants)
			lo, hi, last := runs, 0, 0
			for k, n := range served {
				lo, hi, last = min(lo, n), max(hi, n), max(last, first[k])
			}
			// 1,000 serves among 100 backlogged tenants: 10 each, one
			// round of 10 calls each.
			require.LessOrEqual(t, hi-lo, 1, "serves per tenant in the first 1,000: %d..%d", lo, hi)
			require.Less(t, last, 11, "the last tenant was first served at call %d", last)
		})
	}
}

// TestColdMarkOnlyCold: the mark is set only by a call that reaches fewer
// variants than are due on a cold state, so a burst falling due while other
// keys are served still comes through the lane as newcomers, one key's
// share together (minting keys buys nothing); and it is dropped once no
// delayed variant due at or before it is left, and with the state.
func TestColdMarkOnlyCold(t *testing.T) {
	const now, due = int64(1_000), int64(5_000)
	t.Run("Busy", func(t *testing.T) {
		m := vtime.New(vtime.Config{})
		for i := range 2000 {
			require.NoError(t, m.Enqueue(fmt.Sprintf("inc-%d", i), "inc", 0, now, now))
		}
		require.Len(t, m.Dequeue(10, now), 10) // inc is served: the state is not cold
		burst(t, m, 100, 40, now, due)
		inc, first := 0, map[string]int{}
		for call := range 100 {
			for _, s := range m.Dequeue(10, due+int64(call)) {
				if s.Key == "inc" {
					inc++
				} else if _, ok := first[s.Key]; !ok {
					first[s.Key] = call
				}
			}
		}
		_, marked := m.ColdMark()
		require.False(t, marked, "a burst due on a busy state sets no mark")
		// The newcomers enter one at a time, each a competitor once served:
		// 43 of the 100 tenants were first served in 100 calls, the
		// incumbent keeping 45 serves (with the mark all 100 would be served
		// within 11 calls, as on a cold state).
		require.Less(t, len(first), 60, "tenants first served in 100 calls (the incumbent kept %d serves)", inc)
	})
	t.Run("Lifecycle", func(t *testing.T) {
		m := vtime.New(vtime.Config{ScanLimit: 30})
		burst(t, m, 31, 2, now, due)
		m.Dequeue(1, due) // cold, 31 due, 30 reached: marked at due
		mark, marked := m.ColdMark()
		require.Equal(t, []any{due, true}, []any{mark, marked})
		m.Dequeue(1, due+1) // the last one promoted: nothing due by the mark left
		_, marked = m.ColdMark()
		require.False(t, marked, "no delayed variant due by the mark is left")

		burst(t, m, 40, 1, due+2, due+10)
		for _, s := range m.Dequeue(100, due+10) {
			_ = s
		}
		_, marked = m.ColdMark()
		require.False(t, marked, "40 due at a scan of 30, but the state is not cold: the keys served have tags above V")
		m.ExpireState()
		burst(t, m, 40, 1, due+20, due+30)
		m.Dequeue(1, due+30)
		mark, marked = m.ColdMark()
		require.Equal(t, []any{due + 30, true}, []any{mark, marked}, "cold again once the state expired")
		m.ExpireState()
		_, marked = m.ColdMark()
		require.False(t, marked, "the mark goes with the state")
	})
}
