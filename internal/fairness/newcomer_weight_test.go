package fairness

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// weightCapHistory: a, b backlogged, u registers one serve behind the pack
// (tag V0 + 2), b is served once at weight 1, then raised to weight 2. The
// cap brings b's tag (V0 + 1) down to V0 + 1/2 (one serve at the new
// weight past V), so b's serve before the change no longer counts fully.
func weightCapHistory(t *testing.T, drv Driver, plan *planDriver, reweigh bool) *Oracle {
	t.Helper()
	o := New(drv, Config{Lease: time.Minute, MaxAttempts: 3})
	s := &script{o: o}
	s.enq("a", 12, 0)
	s.enq("b", 12, 0)
	if plan != nil {
		plan.plan = []string{"a", "b", "a"}
	}
	for i := 0; i < 3; i++ {
		s.deq(1, true)
	}
	s.enq("u", 1, 0)
	if plan != nil {
		plan.plan = []string{"b"}
	}
	s.deq(1, true)
	if reweigh {
		s.do(o.SetWeight("b", 2))
	}
	if plan != nil {
		// b's serves after the change: 1/2 each; work before the 7th
		// is 3 > 2 + P.
		plan.plan = []string{"b", "b", "b", "b", "b", "b", "b", "u"}
	}
	s.deq(10, true)
	require.NoError(t, s.err)
	return o
}

// servesBefore counts key's serves after u registered and before u's
// first serve.
func servesBefore(h *History, key, u string) int {
	n, waiting := 0, false
	for _, e := range h.Events {
		switch {
		case e.Kind == EvRegister && e.Key == u:
			waiting = true
		case e.Kind == EvServe && e.Key == u:
			return n
		case e.Kind == EvServe && waiting && e.Key == key:
			n++
		}
	}
	return n
}

// TestNewcomerAfterWeightCap: the model's schedule after a weight change
// that caps a tag. b is served 5 times while u waits (once at weight 1,
// 4 times at weight 2: 2.5 quanta of work, above 2 + P when the serve
// before the change counts in full), and the check, which counts a key's
// serves from its last weight change (the cap forgives the rest), accepts
// it. Rapid found this schedule (CI at 5acc613); the check failed it then.
// Without the weight change b is served 3 times before u.
func TestNewcomerAfterWeightCap(t *testing.T) {
	model := func() Driver {
		return NewModelDriver(ModelConfig{WindowMultiplier: 1, IdleMaxEntries: 10000, MaxAttempts: 3, Lease: time.Minute})
	}
	o := weightCapHistory(t, model(), nil, true)
	require.Equal(t, 5, servesBefore(&o.H, "b", "u"), "the schedule under test")
	require.Zero(t, registerP(&o.H, "u"))
	require.Empty(t, CheckNewcomer(&o.H))

	o = weightCapHistory(t, model(), nil, false)
	require.Equal(t, 3, servesBefore(&o.H, "b", "u"))
	require.Empty(t, CheckNewcomer(&o.H))
}

// TestNewcomerWeightChangeStillCounts: serves after a weight change still
// count. An unfair backend serves b 7 times at weight 2 after the change
// while u waits (work 3 before the 7th): caught. And without the change
// (weight 1), 7 serves of b are caught as before.
func TestNewcomerWeightChangeStillCounts(t *testing.T) {
	for _, reweigh := range []bool{true, false} {
		d := newPlanDriver()
		o := weightCapHistory(t, d, d, reweigh)
		require.Equal(t, 8, servesBefore(&o.H, "b", "u"))
		require.Len(t, CheckNewcomer(&o.H), 1, "reweigh=%v", reweigh)
	}
}
