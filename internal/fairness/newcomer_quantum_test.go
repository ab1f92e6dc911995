package fairness

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// heavyNewcomerHistory: a, b, c backlogged and served once each, then u
// (weight w, fresh, the lane empty) registers; plan, when set, is the
// order of the next serves (an unfair backend), else the backend serves
// a call of 4.
func heavyNewcomerHistory(t *testing.T, drv Driver, plan *planDriver, w float64, order ...string) *Oracle {
	t.Helper()
	o := New(drv, Config{Lease: time.Minute, MaxAttempts: 3})
	s := &script{o: o}
	for _, k := range []string{"a", "b", "c"} {
		s.enq(k, 8, 0)
	}
	if plan != nil {
		plan.plan = []string{"a", "b", "c"}
	}
	s.deq(3, false)
	s.do(o.SetWeight("u", w))
	s.enq("u", 1, 0)
	if plan != nil {
		plan.plan = order
	}
	s.deq(4, false)
	require.NoError(t, s.err)
	return o
}

// TestNewcomerQuantumCaught: a fresh key of weight 8 with no newcomer
// ahead registers one serve of its own behind the pack (lane tag at most
// V0 + 2/8), so a backlogged weight-1 key's second serve before it (its
// tag at least V0 + 1) is a breach. The check now bounds the wait by the
// newcomer's quantum and catches it; the weight-1 bound (2 + P quanta),
// which the check used before and checkNewcomerPrev keeps, does not. At
// weight 1 the same order is within the bound, and at weight 8 the fair
// order (each key once, then u) passes.
func TestNewcomerQuantumCaught(t *testing.T) {
	pushed := []string{"a", "b", "a", "u"}
	for _, tc := range []struct {
		w      float64
		order  []string
		caught bool
	}{
		{8, pushed, true},
		{2, pushed, false}, // tag at most V0 + 1: a's second serve ties it
		{1, pushed, false},
		{8, []string{"a", "b", "c", "u"}, false},
	} {
		d := newPlanDriver()
		o := heavyNewcomerHistory(t, d, d, tc.w, tc.order...)
		require.Zero(t, registerP(&o.H, "u"))
		vs := CheckNewcomer(&o.H)
		require.Empty(t, checkNewcomerPrev(&o.H), "the weight-1 bound allows it")
		if !tc.caught {
			require.Empty(t, vs, "w=%g %v", tc.w, tc.order)
			continue
		}
		require.Len(t, vs, 1, "w=%g %v", tc.w, tc.order)
		require.Contains(t, vs[0].Msg, `"a" is served for the 2-th time`)
	}
}

// TestModelHeavyNewcomerServedWithinQuantum: the model serves a fresh
// weight-8 key after at most one serve of each backlogged key, and the
// HeavyNewcomers scenario holds every check with the tighter bound: its
// weight-8 key registers with no newcomer ahead (P = 0), both times, the
// second time with no debt (eligible: it comes through the lane).
func TestModelHeavyNewcomerServedWithinQuantum(t *testing.T) {
	o := heavyNewcomerHistory(t, weightCapModel(), nil, 8)
	for _, k := range []string{"a", "b", "c"} {
		require.LessOrEqual(t, servesBefore(&o.H, k, "u"), 1, k)
	}
	require.Empty(t, CheckNewcomer(&o.H))

	h := runModelScenario(t, "HeavyNewcomers")
	var regs []Event
	for _, e := range h.Events {
		if e.Kind == EvRegister && e.Key == "h8" {
			regs = append(regs, e)
		}
	}
	require.Len(t, regs, 2)
	for _, e := range regs {
		require.True(t, e.Eligible && e.Visible, "%s", e)
		require.Zero(t, e.P, "%s", e)
		require.Equal(t, 8.0, e.W)
	}
}
