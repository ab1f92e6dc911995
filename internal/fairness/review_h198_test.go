package fairness

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestH198OddWeightGen: every weight-reading check over histories with
// odd milli-weights and weight changes between them.
func TestH198OddWeightGen(t *testing.T) {
	for _, name := range []string{"newcomer", "lag", "reachability", "newcomer-order"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			checkModelGen(t, name, OddWeightGen)
		})
	}
}

// TestH198OddMilliWeightsLong: a at an odd milli-weight (its stride
// 1000/mw weight-1 serves is not a whole number of units: the model
// carries a remainder) beside b backlogged at weight 1, long enough that
// an error of a unit per serve would pass Tol; then a's weight moves
// between odd weights twice mid-run (the remainder is dropped). Every
// check holds the model's schedule, and b's serves between two of a's
// are 1000/mw within one.
func TestH198OddMilliWeightsLong(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		wa, wb float64
		n      int
	}{{0.003, 1, 2000}, {0.007, 1, 2000}, {0.0025, 1, 2000}, {333.333, 1, 400}, {0.003, 333.333, 3000}, {0.007, 0.003, 40}} {
		o := h195Model()
		s := &script{o: o}
		s.do(o.SetWeight("a", tc.wa))
		if tc.wb != 1 {
			s.do(o.SetWeight("b", tc.wb))
		}
		s.enq("a", tc.n, 0)
		s.enq("b", tc.n, 0)
		for i := 0; i < tc.n/2 && s.err == nil; i++ {
			s.deq(1, false)
			if i == tc.n/6 {
				s.do(o.SetWeight("a", 0.0016)) // 2: from an odd one
			}
			if i == tc.n/3 {
				s.do(o.SetWeight("a", tc.wa))
			}
		}
		s.do(o.Finish())
		require.NoError(t, s.err)
		vs := Run(&o.H, Checks...)
		for _, v := range vs {
			t.Logf("wa=%g wb=%g: %s: %s", tc.wa, tc.wb, v.Check, v.Msg)
		}
		require.Empty(t, vs, "wa=%g wb=%g", tc.wa, tc.wb)
		w := LagWatches(&o.H)
		t.Logf("wa=%g wb=%g: %d serves, watches %s", tc.wa, tc.wb, o.H.Serves, w)
	}
}

// TestH198LagCatchesOddUnfair: a history in which a (weight 0.003, a
// stride of 333.33 weight-1 serves) is served once too often against b
// at weight 1 -- 332 of b's serves between two of a's where the
// scheduler would give 333 or 334 -- kept up: the lag check must flag it.
// The history is the model's fair one with b's serves thinned.
func TestH198LagCatchesOddUnfair(t *testing.T) {
	t.Parallel()
	o := h195Model()
	s := &script{o: o}
	s.do(o.SetWeight("a", 0.003))
	s.enq("a", 10, 0)
	s.enq("b", 4000, 0)
	for i := 0; i < 3000 && s.err == nil; i++ {
		s.deq(1, false)
	}
	require.NoError(t, s.err)
	require.Empty(t, CheckLag(&o.H))
	// Drop two of b's serves in every gap between a's serves after the
	// second: a then gains 2 weight-1 serves per gap over b, so the swing
	// passes stride_a + 1 after a few gaps.
	h := o.H
	h.Events = slices.Clone(h.Events)
	var out []Event
	aSeen, drop := 0, 0
	for _, e := range h.Events {
		if e.Kind == EvServe {
			if e.Key == "a" {
				aSeen++
				drop = 2
			} else if aSeen >= 2 && drop > 0 {
				drop--
				continue
			}
		}
		out = append(out, e)
	}
	h.Events = out
	vs := CheckLag(&h)
	require.NotEmpty(t, vs, "lag missed a (0.003) served 2 weight-1 serves early per gap")
	t.Logf("%s", vs[0].Msg)
}

// h198MisroundDriver is the model holding every weight rounded by round
// (a scheduler that rounds unlike vtime.MilliWeightOf).
type h198MisroundDriver struct {
	*ModelDriver
	round func(float64) float64
}

func (d h198MisroundDriver) SetWeight(key string, w float64) error {
	return d.ModelDriver.SetWeight(key, d.round(w))
}

// TestH198MisroundedSchedulerCaught: a scheduler that truncates (0.0016
// held as 0.001) or rounds up (0.0014 held as 0.002) serves a key at the
// wrong rate; the checks, reading the milli-weight vtime holds, flag it.
func TestH198MisroundedSchedulerCaught(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		w     float64
		round func(float64) float64
	}{
		{"trunc", 0.0016, func(w float64) float64 { return max(0.001, float64(int(w*1000))/1000) }},
		{"ceil", 0.0014, func(w float64) float64 { return float64(int(w*1000)+1) / 1000 }},
	} {
		drv := h198MisroundDriver{NewModelDriver(ModelConfig{MaxAttempts: 3, Lease: time.Minute}), tc.round}
		o := New(drv, Config{Lease: time.Minute, MaxAttempts: 3})
		s := &script{o: o}
		s.do(o.SetWeight("a", tc.w))
		s.enq("a", 8, 0)
		s.enq("b", 6000, 0)
		for i := 0; i < 5000 && s.err == nil; i++ {
			s.deq(1, false)
		}
		require.NoError(t, s.err)
		vs := Run(&o.H, Checks...)
		require.NotEmpty(t, vs, tc.name)
		t.Logf("%s: %s: %s", tc.name, vs[0].Check, vs[0].Msg)
	}
}
