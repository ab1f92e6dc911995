package fairness

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
)

// helper-190, review of eb447e4 (offNew).
//
// h190AtV: the first flag-on call is a weight change (it reads no
// ckIndex, so it sets no b); with the flag off c1..c3 arrive and a
// flag-off call serves each once; flag on, u arrives. The first flag-on
// dequeue's read sets b after the c's were written: they register at V
// (design.md, Discovery), never in the lane, so none of them may be ahead
// of u. plan, when set, serves c1 four times before u (unfair).
func h190AtV(o *Oracle, plan *planDriver) (*script, error) {
	s := &script{o: o}
	tick := func() { s.do(o.Advance(time.Millisecond)) }
	s.do(o.SetWeight("z", 1))
	s.do(o.SetFlag(false))
	for _, k := range []string{"c1", "c2", "c3"} {
		tick()
		s.enq(k, 8, 0)
	}
	if plan != nil {
		plan.plan = []string{"c1", "c2", "c3"}
	}
	s.deq(3, false)
	s.do(o.SetFlag(true))
	tick()
	s.enq("u", 1, 0)
	if plan != nil {
		plan.plan = []string{"c1", "c1", "c1", "c1", "u"}
		for i := 0; i < 5 && s.err == nil; i++ {
			s.deq(1, false)
		}
	}
	return s, s.err
}

// TestReviewH190OffNewAtVMissed: the unfair schedule (c1 served 4 times
// while u, registered with no newcomer able to be ahead of it, waits) is
// caught with P = 0 (eb447e4's parent); offNew, set by any flag-on call,
// gives u P = 3 and the schedule passes.
func TestReviewH190OffNewAtVMissed(t *testing.T) {
	d := newPlanDriver()
	o := New(lanePlan{planDriver: d, lane: map[string]bool{}}, Config{Lease: time.Minute, MaxAttempts: 3})
	if _, err := h190AtV(o, d); err != nil {
		t.Fatal(err)
	}
	t.Logf("u registered with P=%d", registerP(&o.H, "u"))
	require.Zero(t, registerP(&o.H, "u"), "no newcomer can be ahead of u")
	require.Len(t, CheckNewcomer(&o.H), 1, "u waited behind 4 serves of c1")
}

// TestReviewH190OffNewAtVLua: the same history on the Lua scripts: the c's
// are in no lane, and u is served within 3 serves of any other key (the
// bound with P = 0).
func TestReviewH190OffNewAtVLua(t *testing.T) {
	m, c := redistest.MiniServer(t)
	p, err := NewLuaPool(context.Background(), LuaConfig{Client: c, Mini: m, Prefix: redistest.Prefix(t),
		Lease: time.Minute, MaxAttempts: 3, StateTTL: 5 * time.Minute})
	require.NoError(t, err)
	t.Cleanup(p.Close)
	d, err := p.NewDriver(context.Background())
	require.NoError(t, err)
	o := New(d, Config{Lease: time.Minute, MaxAttempts: 3, StateTTL: 5 * time.Minute})
	s, err := h190AtV(o, nil)
	require.NoError(t, err)
	counts := map[string]int{}
	var order []string
	for i := 0; i < 12 && s.err == nil; i++ {
		got := s.deq(1, false)
		if len(got) == 0 {
			break
		}
		order = append(order, got[0].Key)
		if i == 0 {
			for _, k := range []string{"c1", "c2", "c3"} {
				in, err := d.InLane(k)
				require.NoError(t, err)
				require.False(t, in, "%s in the lane", k)
			}
		}
		if got[0].Key == "u" {
			break
		}
		counts[got[0].Key]++
	}
	worst := 0
	for _, n := range counts {
		worst = max(worst, n)
	}
	t.Logf("u registered with P=%d; Lua serves after u registered: %s", registerP(&o.H, "u"), strings.Join(order, ","))
	require.LessOrEqual(t, worst, 3, fmt.Sprint(counts))
}
