package fairness

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// RoundedWeights drives a history of two keys served one a call: a at
// weight wa, b at weight 1 with a backlog of n runs (a: 3 runs).
func roundedWeightsHistory(t *testing.T, drv Driver, wa float64, n int) *Oracle {
	t.Helper()
	o := New(drv, Config{Lease: time.Minute, MaxAttempts: 3})
	s := &script{o: o}
	s.do(o.SetWeight("a", wa))
	s.enq("a", 3, 0)
	s.enq("b", n, 0)
	for i := 0; i < n+3 && s.err == nil; i++ {
		s.deq(1, false)
	}
	s.do(o.Finish())
	require.NoError(t, s.err)
	return o
}

// rawLagSwing is CheckLag's pair statistic for a and b read with the raw
// weight (a serve of a costs 1/wa), as the check read it before: the
// largest swing of D = n_a/wa - n_b once both were served, and its bound
// 1/wa + 1.
func rawLagSwing(h *History, wa float64) (swing, bound float64) {
	var d, lo, hi float64
	var sa, sb bool
	for _, e := range h.Events {
		if e.Kind != EvServe {
			continue
		}
		if !(sa && sb) {
			sa, sb = sa || e.Key == "a", sb || e.Key == "b"
			continue
		}
		if e.Key == "a" {
			d += 1 / wa
		} else {
			d--
		}
		lo, hi = math.Min(lo, d), math.Max(hi, d)
		swing = math.Max(swing, math.Max(d-lo, hi-d))
	}
	return swing, 1/wa + 1
}

// TestLagRoundedWeights: the scheduler holds a weight as a milli-weight
// (0.0014 is 0.001, a serve 1,000 weight-1 serves; 0.0016 is 0.002, 500),
// so it serves b 1,000 (500) times between a's serves. CheckLag and
// CheckReachability read the raw weight (a serve of a cost 1/0.0014 = 714
// in the pair's swing and in a's debt) and flagged that fair schedule;
// helper-195's F2 mended only the newcomer check. Every check now reads
// the milli-weight, and the model's schedule passes them all; the raw
// reading of the same history breaks the lag bound (rawLagSwing), so the
// history is one the old reading failed.
func TestLagRoundedWeights(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		wa  float64
		gap int // b's serves between two of a's
		raw bool
	}{
		{0.0014, 1000, true},
		{0.0016, 500, true},
		{0.002, 500, false},
	} {
		drv := NewModelDriver(ModelConfig{MaxAttempts: 3, Lease: time.Minute})
		o := roundedWeightsHistory(t, drv, tc.wa, 2*tc.gap+10)
		var at []int
		i := 0
		for _, e := range o.H.Events {
			if e.Kind == EvServe {
				if e.Key == "a" {
					at = append(at, i)
				}
				i++
			}
		}
		require.GreaterOrEqual(t, len(at), 3, "wa=%g", tc.wa)
		require.Equal(t, tc.gap+1, at[2]-at[1], "wa=%g: b's serves between a's second and third, plus one", tc.wa)
		vs := Run(&o.H, Checks...)
		for _, v := range vs {
			t.Logf("wa=%g: %s: %s", tc.wa, v.Check, v.Msg)
		}
		require.Empty(t, vs, "wa=%g", tc.wa)
		swing, bound := rawLagSwing(&o.H, tc.wa)
		t.Logf("wa=%g: raw reading's swing %.4g, bound %.4g", tc.wa, swing, bound)
		require.Equal(t, tc.raw, swing > bound+1e-6, "wa=%g: the raw reading breaks the lag bound", tc.wa)
	}
}

// TestZeroWeightCleared: a weight of 0 clears a key's weight in the model
// (vtime.SetWeight; runqueue's SetWeight refuses it, ClearWeight is
// its clear): the checks read it as 1, not as an infinite stride (the lag
// check read 1/0 and judged nothing; reachability's debt was infinite).
func TestZeroWeightCleared(t *testing.T) {
	t.Parallel()
	o := h195Model()
	s := &script{o: o}
	s.do(o.SetWeight("a", 0.5))
	s.enq("a", 20, 0)
	s.enq("b", 20, 0)
	s.deq(4, false)
	s.do(o.SetWeight("a", 0))
	for i := 0; i < 10 && s.err == nil; i++ {
		s.deq(3, false)
	}
	s.do(o.Finish())
	require.NoError(t, s.err)
	require.Empty(t, Run(&o.H, Checks...))
	st := newServability()
	for _, e := range o.H.Events {
		st.apply(e)
	}
	require.Equal(t, 1.0, st.w("a"))
	require.Equal(t, 1.0, st.stride("a"))
	require.Equal(t, 1.0, st.w("b"))
}
