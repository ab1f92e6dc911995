package fairness

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// reweight is a weight change of weightCapHistory.
type reweight struct {
	key string
	w   float64
}

// weightCapHistory: a, b backlogged, u registers one serve behind the pack
// (tag V0 + 2), b is served once at weight 1, then the changes apply (b
// raised to 2: the cap brings b's tag, V0 + 1, down to V0 + 1/2, one serve
// at the new weight past V, so b's serve before the change no longer
// counts fully). With plan, b is then served after times and u next;
// without, the backend serves a call of 10.
func weightCapHistory(t *testing.T, drv Driver, plan *planDriver, after int, changes ...reweight) *Oracle {
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
	for _, c := range changes {
		s.do(o.SetWeight(c.key, c.w))
	}
	if plan != nil {
		plan.plan = nil
		for i := 0; i < after; i++ {
			plan.plan = append(plan.plan, "b")
		}
		plan.plan = append(plan.plan, "u")
	}
	s.deq(10, true)
	require.NoError(t, s.err)
	return o
}

// raiseB is the change of TestNewcomerAfterWeightCap: b to weight 2.
var raiseB = []reweight{{"b", 2}}

// weightCapModel is the model the weight-cap histories run on.
func weightCapModel() Driver {
	return NewModelDriver(ModelConfig{WindowMultiplier: 1, IdleMaxEntries: 10000, MaxAttempts: 3, Lease: time.Minute})
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
// before the change counts in full), and the check, which caps b's count
// at one serve at the new weight when the weight changes (as the model
// caps its tag), accepts it: 1/2 + 3 x 1/2 = 2 before the 5th. Rapid found this schedule (CI at 5acc613); the check failed it then.
// Without the weight change b is served 3 times before u.
func TestNewcomerAfterWeightCap(t *testing.T) {
	o := weightCapHistory(t, weightCapModel(), nil, 0, raiseB...)
	require.Equal(t, 5, servesBefore(&o.H, "b", "u"), "the schedule under test")
	require.Zero(t, registerP(&o.H, "u"))
	require.Empty(t, CheckNewcomer(&o.H))

	o = weightCapHistory(t, weightCapModel(), nil, 0)
	require.Equal(t, 3, servesBefore(&o.H, "b", "u"))
	require.Empty(t, CheckNewcomer(&o.H))
}

// TestNewcomerWeightChangeStillCounts: the change caps b's count at one
// serve at the new weight (1/2), it does not forget it. An unfair backend
// serves b once at weight 1, then 5 or 7 times at weight 2, while u
// waits. Before b's 5th serve after the change its count is 1/2 + 4 x 1/2
// = 2.5 > 2 + P: caught (counting only the serves after the change, 2,
// would miss it); with 7, 3.5. Without the change (weight 1) both are
// caught as before.
func TestNewcomerWeightChangeStillCounts(t *testing.T) {
	for _, after := range []int{5, 7} {
		for _, reweigh := range []bool{true, false} {
			d := newPlanDriver()
			var changes []reweight
			if reweigh {
				changes = raiseB
			}
			o := weightCapHistory(t, d, d, after, changes...)
			require.Equal(t, after+1, servesBefore(&o.H, "b", "u"))
			require.Len(t, CheckNewcomer(&o.H), 1, "after=%d reweigh=%v", after, reweigh)
		}
	}
}
