package fairness

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/runqueue/runqueue/internal/redistest"
)

// h197AckedBeforeCall: key limit 1; k is served (weight-1 flag-on drain)
// and held; a and b get 3A weight-1 serves; k registers (eligible) at its
// limit, so not servable; the ack in the NEXT operation makes it servable
// before any dequeue call, so the scheduler never gated it: it waits as
// any newcomer (P = 0, bound 2). plan, when set, serves order after the
// ack (an unfair backend); else the backend's own order (4 calls of 1).
func h197AckedBeforeCall(t *testing.T, drv Driver, plan *planDriver, order ...string) *Oracle {
	t.Helper()
	o := New(drv, Config{Lease: time.Minute, MaxAttempts: 3})
	s := &script{o: o}
	s.do(o.SetLimits(Limits{Key: 1}))
	s.enq("k", 1, 0)
	s.enq("a", 12, 0)
	s.enq("b", 12, 0)
	if plan != nil {
		plan.plan = []string{"k", "a", "b", "a", "b", "a", "b"}
	}
	var held *Served
	for _, x := range s.deq(1, true) {
		held = &x
	}
	require.NotNil(t, held)
	require.Equal(t, "k", held.Key)
	for i := 0; i < 6; i++ {
		s.deq(1, false)
	}
	s.enq("k", 1, 0)     // registers: eligible, at its limit
	s.do(o.Ack(held.ID)) // a later operation: servable, no call between
	if plan != nil {
		plan.plan = order
	}
	for i := 0; i < len(order) || (plan == nil && i < 4); i++ {
		s.deq(1, false)
	}
	require.NoError(t, s.err)
	return o
}

// TestH197AckedBeforeCallCaught: 4751a19 drops every episode not servable
// by the end of its registering operation, so the unfair order (a served
// 4 times before k: work 3 > 2) went unjudged; 4751a19^ caught it. The
// episode now ends only at a dequeue call that begins while k is not
// servable (only a call gates): caught again. The fair order and the
// model's own schedule pass.
func TestH197AckedBeforeCallCaught(t *testing.T) {
	d := newPlanDriver()
	o := h197AckedBeforeCall(t, d, d, "a", "a", "b", "a", "a", "k")
	var reg, servable Event
	for _, e := range o.H.Events {
		if e.Key == "k" && e.Kind == EvRegister {
			reg = e
		}
		if e.Key == "k" && e.Kind == EvServable {
			servable = e
		}
	}
	require.True(t, reg.Eligible && reg.Visible && reg.P == 0, "%s", reg)
	require.Less(t, reg.Op, servable.Op, "servable in a later operation")
	vs := CheckNewcomer(&o.H)
	require.Len(t, vs, 1)
	require.Contains(t, vs[0].Msg, `"a" is served for the 4-th time`)

	d = newPlanDriver()
	o = h197AckedBeforeCall(t, d, d, "a", "b", "k")
	require.Empty(t, CheckNewcomer(&o.H))

	o = h197AckedBeforeCall(t, weightCapModel(), nil)
	require.Empty(t, CheckNewcomer(&o.H))
	require.LessOrEqual(t, servesBeforeLast(&o.H, "a", "k"), 2)

	// the Lua scripts (miniredis): they admit at a key limit as the model
	// does (gating is a dequeue's), and serve k within the bound
	o = h197AckedBeforeCall(t, h197Lua(t, 0), nil)
	require.Empty(t, CheckNewcomer(&o.H))
	t.Logf("Lua: serves of a, b before k: %d, %d", servesBeforeLast(&o.H, "a", "k"), servesBeforeLast(&o.H, "b", "k"))
	require.LessOrEqual(t, servesBeforeLast(&o.H, "a", "k"), 2)
}

// TestH197StaleShare: how many eligible flag-on registrations of a heavy
// key (weight above 1: a quantum below 1) are judged with Event.Stale
// (the weight-1 bound), on the Lua scripts (miniredis: the fairness
// model driver has no flag flips), HeavyNewcomerGen; and how many of
// those a stale mark kept only for keys the lane probe finds in the lane
// (helper-197's proposal) would keep.
func TestH197StaleShare(t *testing.T) {
	if testing.Short() {
		t.Skip("miniredis sequences")
	}
	m, c := redistest.MiniServer(t)
	p, err := NewLuaPool(context.Background(), LuaConfig{Client: c, Mini: m, Prefix: redistest.Prefix(t),
		Lease: time.Minute, MaxAttempts: 3, StateTTL: 5 * time.Minute})
	require.NoError(t, err)
	t.Cleanup(p.Close)
	newcomer, ok := CheckByName("newcomer")
	require.True(t, ok)
	var heavy, stale, seqs, withStale, anyStale, offDrains, flips, regsOn, resets int
	runs := 0
	rapid.Check(t, func(rt *rapid.T) {
		if runs++; runs > h197Seqs {
			return
		}
		d, err := p.NewDriver(context.Background())
		require.NoError(rt, err)
		o := New(d, Config{Lease: time.Minute, MaxAttempts: 3, StateTTL: 5 * time.Minute})
		require.NoError(rt, Drive(rt, o, HeavyNewcomerGen))
		seqs++
		if vs := Run(&o.H, newcomer); len(vs) > 0 {
			rt.Fatalf("%s", Report(&o.H, vs))
		}
		any := false
		on := true
		for _, e := range o.H.Events {
			if e.Kind == EvFlag {
				on = e.On
				flips++
			}
			if e.Kind == EvReset || e.Kind == EvLapse {
				resets++
			}
			if e.Kind == EvDrain && !on {
				offDrains++
			}
			if e.Kind == EvRegister && on && e.Visible {
				regsOn++
				if e.Stale {
					anyStale++
				}
			}
			if e.Kind == EvRegister && e.Visible && e.Eligible && on && quantum(e.W) < 1 {
				heavy++
				if e.Stale {
					stale++
					any = true
				}
			}
		}
		if any {
			withStale++
		}
	})
	t.Logf("flips %d, flag-off drains %d, resets/lapses %d, flag-on registrations %d, with Stale %d", flips, offDrains, resets, regsOn, anyStale)
	t.Logf("eligible heavy flag-on registrations: %d, judged with Stale: %d (%.0f%%); sequences %d, with one: %d",
		heavy, stale, 100*float64(stale)/float64(max(heavy, 1)), seqs, withStale)
}

// h197Seqs is how many sequences TestH197StaleShare drives.
const h197Seqs = 20 // 100 for the numbers in helper-197's report

// servesBeforeLast counts key's serves after u's last registration and
// before u's next serve.
func servesBeforeLast(h *History, key, u string) int {
	last := -1
	for i, e := range h.Events {
		if e.Kind == EvRegister && e.Key == u {
			last = i
		}
	}
	n := 0
	for _, e := range h.Events[last+1:] {
		switch {
		case e.Kind == EvServe && e.Key == u:
			return n
		case e.Kind == EvServe && e.Key == key:
			n++
		}
	}
	return n
}

// h197Unprobed hides the LuaDriver's LaneProber (and its other probes).
type h197Unprobed struct {
	Driver
	f FlagFlipper
}

func (d h197Unprobed) SetFlag(on bool) error { return d.f.SetFlag(on) }

// TestH197StaleOutOfLane: x registers at V (the state cold: no lane),
// is served with the flag on, and a flag-off call drains it: 4751a19
// marks every later registration Stale (the weight-1 bound) until x
// registers again or the state goes, though x never waited in the lane.
// With the lane probe, x is found out of the lane and u (weight 8) is
// judged at its own quantum; without a probe the mark stays.
func TestH197StaleOutOfLane(t *testing.T) {
	for _, probe := range []bool{true, false} {
		ld := h197Lua(t, 0)
		var drv Driver = ld
		if !probe {
			drv = h197Unprobed{ld, ld}
		}
		o := New(drv, Config{Lease: time.Minute, MaxAttempts: 3})
		s := &script{o: o}
		s.enq("x", 2, 0)
		s.do(o.Advance(time.Second)) // x's work is the oldest
		s.enq("a", 6, 0)
		s.enq("b", 6, 0)
		require.Equal(t, "x", s.deq(1, false)[0].Key)
		s.deq(2, false)
		s.do(o.SetFlag(false))
		require.Equal(t, "x", s.deq(1, false)[0].Key) // drains x, flag off
		s.do(o.SetFlag(true))
		s.do(o.SetWeight("u", 8))
		s.enq("u", 1, 0)
		require.NoError(t, s.err)
		var reg Event
		for _, e := range o.H.Events {
			if e.Kind == EvRegister && e.Key == "u" {
				reg = e
			}
		}
		require.True(t, reg.Eligible && reg.Visible, "%s", reg)
		require.Equal(t, !probe, reg.Stale, "probe=%v", probe)
	}
}

// h197Lua is a driver of the Lua scripts on a miniredis of the test's own
// (stateTTL 0: the pool's default).
func h197Lua(t *testing.T, stateTTL time.Duration) *LuaDriver {
	t.Helper()
	m, c := redistest.MiniServer(t)
	p, err := NewLuaPool(context.Background(), LuaConfig{Client: c, Mini: m, Prefix: redistest.Prefix(t),
		Lease: time.Minute, MaxAttempts: 3, StateTTL: stateTTL})
	require.NoError(t, err)
	t.Cleanup(p.Close)
	ld, err := p.NewDriver(context.Background())
	require.NoError(t, err)
	return ld
}
