package vtime

import (
	"fmt"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// Properties of the model under random operation sequences that need its
// internals: the state invariants, the newcomer lane and batch invariance
// under its exact conditions. The fairness bounds themselves (no-debt
// wait, lag, newcomer, reachability) are checked on observed schedules by
// internal/fairness; those stated as properties are written once in
// vtime/vtimetest and run on the model by shared_props_test.go (package
// vtime_test) and on the Lua by runqueue/vtime_props_test.go.

type opKind int

const (
	opEnqueue opKind = iota
	opDequeue
	opAck
	opNack
	opRecover
	opExpire
	opRedrive
	opWeight
	opAdvance
	opLimits
	opExpireState
	opFlagOffEnqueue
	opFlagOffServe
	opFlagOffAck
	opFlagOffDequeue
)

var opNames = [...]string{"enqueue", "dequeue", "ack", "nack", "recover", "expire", "redrive", "weight",
	"advance", "limits", "expireState", "flagOffEnqueue", "flagOffServe", "flagOffAck", "flagOffDequeue"}

func (k opKind) String() string { return opNames[k] }

type op struct {
	kind   opKind
	key    string
	prio   int
	delay  int64
	n      int
	pick   int
	kill   bool
	w      float64
	limits Limits
}

func (o op) String() string { return fmt.Sprintf("%v(%s n=%d)", o.kind, o.key, o.n) }

// opSet says which kinds beyond the model's own operations may be drawn.
type opSet struct {
	expireState bool // the state TTL
	flagOff     bool // writers with the flag off
}

func keyName(i int) string { return fmt.Sprintf("k%d", i) }

func drawOp(rt *rapid.T, nkeys int, set opSet) op {
	o := op{key: keyName(rapid.IntRange(0, nkeys-1).Draw(rt, "key")), pick: rapid.IntRange(0, 1000).Draw(rt, "pick")}
	for {
		k := rapid.IntRange(0, 99).Draw(rt, "op")
		switch {
		case k < 30:
			o.kind = opEnqueue
			o.prio = rapid.SampledFrom([]int{0, 0, 0, 1, 9}).Draw(rt, "prio")
			o.delay = rapid.SampledFrom([]int64{0, 0, 0, 5, 40}).Draw(rt, "delay")
			o.n = rapid.IntRange(1, 3).Draw(rt, "runs")
		case k < 55:
			o.kind = opDequeue
			o.n = rapid.IntRange(1, 6).Draw(rt, "maxCount")
		case k < 64:
			o.kind = opAck
		case k < 70:
			o.kind = opNack
			o.delay = rapid.SampledFrom([]int64{0, 0, 3, 30}).Draw(rt, "retry")
			o.kill = rapid.IntRange(0, 9).Draw(rt, "kill") == 0
		case k < 72:
			o.kind = opRecover
		case k < 76:
			o.kind = opExpire
		case k < 78:
			o.kind = opRedrive
		case k < 81:
			o.kind = opWeight
			o.w = rapid.SampledFrom([]float64{0, 0.001, 0.3, 0.5, 2, 3, 7, 1000}).Draw(rt, "weight")
		case k < 85:
			o.kind = opAdvance
			o.delay = int64(rapid.IntRange(1, 45).Draw(rt, "advance"))
		case k < 88:
			o.kind = opLimits
			o.limits = Limits{
				Queue: rapid.SampledFrom([]int{0, 0, 3, 8}).Draw(rt, "queueLimit"),
				Key:   rapid.SampledFrom([]int{0, 0, 1, 2, 3}).Draw(rt, "keyLimit"),
				Env:   rapid.SampledFrom([]int{0, 0, 0, 6}).Draw(rt, "envLimit"),
			}
		case k < 90:
			if !set.expireState {
				continue
			}
			o.kind = opExpireState
		default:
			if !set.flagOff {
				continue
			}
			o.kind = []opKind{opFlagOffEnqueue, opFlagOffServe, opFlagOffAck, opFlagOffDequeue}[k%4]
			o.n = 1 + o.pick%6 // a flag-off dequeue's maxCount
		}
		return o
	}
}

// sim drives one model with a clock and fresh run ids.
type sim struct {
	m    *Model
	now  int64
	next int
}

func (s *sim) idsIn(st byte) []string {
	var out []string
	for id, r := range s.m.runs {
		if r.state == st {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

// apply runs o; it returns what a dequeue served.
func (s *sim) apply(t *rapid.T, o op) []Served {
	pickFrom := func(ids []string) (string, bool) {
		if len(ids) == 0 {
			return "", false
		}
		return decode(t, ids[o.pick%len(ids)]), true
	}
	m := s.m
	switch o.kind {
	case opEnqueue:
		for i := 0; i < o.n; i++ {
			s.next++
			require.NoError(t, m.Enqueue(fmt.Sprintf("r%d", s.next), o.key, o.prio, s.now+o.delay, s.now))
		}
	case opDequeue:
		out := m.Dequeue(o.n, s.now)
		s.now++
		return out
	case opAck:
		if id, ok := pickFrom(s.idsIn(InFlight)); ok {
			require.NoError(t, m.Ack(id))
		}
	case opNack:
		if id, ok := pickFrom(s.idsIn(InFlight)); ok {
			_, err := m.Nack(id, s.now+o.delay, s.now, o.kill)
			require.NoError(t, err)
		}
	case opRecover:
		if id, ok := pickFrom(s.idsIn(InFlight)); ok {
			_, err := m.Recover(id, s.now)
			require.NoError(t, err)
		}
	case opExpire:
		queued := append(s.idsIn(Ready), s.idsIn(Delayed)...)
		sort.Strings(queued)
		if id, ok := pickFrom(queued); ok {
			require.True(t, m.Expire(id))
		}
	case opRedrive:
		if id, ok := pickFrom(s.idsIn(Dead)); ok {
			require.NoError(t, m.Redrive(id, s.now))
		}
	case opWeight:
		m.SetWeight(o.key, o.w)
	case opAdvance:
		s.now += o.delay
	case opLimits:
		m.SetLimits(o.limits)
	case opExpireState:
		m.ExpireState()
	case opFlagOffEnqueue:
		s.next++
		flagOffEnqueue(m, fmt.Sprintf("r%d", s.next), o.key, s.now-int64(o.pick%50))
	case opFlagOffServe:
		if len(m.ready[vm(o.key)]) > 0 {
			flagOffServe(t, m, o.key)
		}
	case opFlagOffAck:
		if id, ok := pickFrom(s.idsIn(InFlight)); ok {
			flagOffAck(t, m, id)
		}
	case opFlagOffDequeue:
		// Age order, no scheduler write: not a fair dequeue's serves.
		m.DequeueOff(o.n, s.now)
	}
	return nil
}

// randomConfig draws the scheduler settings of a workload.
func randomConfig(rt *rapid.T) Config {
	return Config{
		WindowMultiplier: rapid.IntRange(1, 3).Draw(rt, "wm"),
		ScanLimit:        rapid.SampledFrom([]int{0, 0, 1, 2, 3}).Draw(rt, "scanLimit"),
		IdleMaxEntries:   rapid.SampledFrom([]int{10000, 2, 1}).Draw(rt, "idleMax"),
		PromoteLimit:     rapid.SampledFrom([]int{0, 0, 1, 2}).Draw(rt, "promoteLimit"),
		MaxAttempts:      3,
		Limits: Limits{
			Queue: rapid.SampledFrom([]int{0, 0, 4, 9}).Draw(rt, "queueLimit"),
			Key:   rapid.SampledFrom([]int{0, 0, 1, 2}).Draw(rt, "keyLimit"),
		},
	}
}

func scanOf(c Config, maxCount int) int {
	if c.ScanLimit > 0 {
		return c.ScanLimit
	}
	return max(30, 3*maxCount)
}

// batchConditions reports whether the conditions of guarantee 4 hold for
// a dequeue(n) at now: no discovery pending (every variant of ckIndex is
// registered), no un-gating pending (no rise of the key limit above gk, or
// to none, with gated variants present; no gated variant below its limit
// for the probe), the pass-1 reads within the budget (nor, therefore,
// registered variants for the age head) and the due delayed runs promoted
// whole by one call of 1.
func batchConditions(m *Model, n int, now int64) (bool, string) {
	for _, e := range m.CkIndex() {
		if _, ok := m.reg[e.Member]; !ok {
			return false, "discovery pending"
		}
	}
	k := m.cfg.Limits.Key
	gated := gatedCount(m)
	if gated > 0 && m.gk > 0 && (k == 0 || k > m.gk) {
		return false, "rise pending"
	}
	if len(gatedBelowLimit(m)) > 0 {
		return false, "probe pending"
	}
	if len(m.reg)-gated > ReadBudget {
		return false, "budget"
	}
	// The first call of 1 promotes every due run: at most its scan of due
	// variants, each given all of its due runs by the call's plan.
	vms, due := m.dueVariants(now, scanOf(m.cfg, 1)+1)
	if len(due) > scanOf(m.cfg, 1) {
		return false, "promotion"
	}
	plan, _ := PromotePlanWeighted(m.cfg.PromoteLimit, 1, due, m.atKeyLimit(vms), m.promoteWeights(vms))
	for i := range due {
		if plan[i] < due[i] {
			return false, "promotion"
		}
	}
	return true, ""
}

// batchComparable is m's snapshot without what a call of N and N calls of 1
// legitimately leave different: the discovery cursor and the gated probe's
// place (they advance per call) and parked tags at or below V (a call reaps
// only when it parks something). The probe's place is gp and the gating
// numbers: each call's probe gives the variant at the front that it finds
// still at its limit the next number, the back of the queue, so N calls of
// 1 move up to N variants back where a call of N moves one. Which variants
// are gated is compared here, and their order but for those the probes
// moved by gatedOrder.
func batchComparable(m *Model) Snapshot {
	s := normalized(m.Snapshot())
	s.Cursor, s.GP, s.GN = 0, 0, 0
	for v, r := range s.Reg {
		r.Gate = 0
		s.Reg[v] = r
	}
	for v, p := range s.Idle {
		if p <= s.V {
			delete(s.Idle, v)
		}
	}
	return s
}

// gatedOrder lists m's gated variants in gating order but for those in
// skip.
func gatedOrder(m *Model, skip map[string]bool) []string {
	var out []string
	for _, g := range m.gatedSorted() {
		if !skip[g.vm] {
			out = append(out, g.vm)
		}
	}
	return out
}

// TestPropBatchInvariance: guarantee 4. On two copies of one state,
// dequeue(N) serves the same runs in the same order as N calls of
// dequeue(1), and leaves the same state (but for the cursor, the probe rank
// and worthless parked tags), whenever the conditions of doc.go hold. Any
// operation may come before, flag-off writers and the state TTL included:
// the conditions must catch what they leave pending.
func TestPropBatchInvariance(t *testing.T) {
	t.Parallel()
	compared, skipped := 0, map[string]int{}
	rapid.Check(t, func(rt *rapid.T) {
		cfg := randomConfig(rt)
		a := &sim{m: New(cfg)}
		nkeys := rapid.IntRange(1, 8).Draw(rt, "keys")
		set := opSet{expireState: true, flagOff: rapid.Bool().Draw(rt, "flagOff")}
		for i := rapid.IntRange(0, 40).Draw(rt, "prefix"); i > 0; i-- {
			a.apply(rt, drawOp(rt, nkeys, set))
		}
		n := rapid.IntRange(2, 8).Draw(rt, "N")
		ok, why := batchConditions(a.m, n, a.now)
		if !ok {
			skipped[why]++
			return
		}
		b := a.m.Clone()
		probed := map[string]bool{} // the variants a probe looked at, in either run
		front := func(m *Model) {
			if g := m.gatedSorted(); len(g) > 0 {
				probed[g[0].vm] = true
			}
		}
		front(a.m)
		batch := a.m.Dequeue(n, a.now)
		var singles []Served
		for i := 0; i < n; i++ {
			front(b)
			singles = append(singles, b.Dequeue(1, a.now)...)
		}
		require.Equal(rt, servedKeys(singles), servedKeys(batch), "dequeue(%d) vs %d x dequeue(1)", n, n)
		require.Equal(rt, singles, batch)
		require.Equal(rt, batchComparable(b), batchComparable(a.m), "state after dequeue(%d) vs %d x dequeue(1)", n, n)
		require.Equal(rt, gatedOrder(b, probed), gatedOrder(a.m, probed), "gating order but for what the probes moved")
		compared++
	})
	t.Logf("batch invariance: %d compared, skipped %v", compared, skipped)
	require.Positive(t, compared)
}

// registration is what the rules of doc.go give a variant that registers
// outside a dequeue (enqueue, nack, recovery, redrive): a return at its
// parked tag when that is above V, else the newcomer rule: behind the
// lane's head (no tag, waiting) when the lane is not empty; else, with
// A = min(top, V+Unit) over the competing tags, at V when A <= V, or as
// the lane's head at A+Unit.
func registration(m *Model, v string) Reg {
	r := Reg{Seq: m.nextSeq}
	if p, ok := m.idle[v]; ok && p > m.v {
		r.U = p
		return r
	}
	if len(lane(m)) > 0 {
		r.Waiting = true
		return r
	}
	top, has := int64(0), false
	for _, x := range m.reg {
		if !x.Gated && (!has || x.U > top) {
			top, has = x.U, true
		}
	}
	r.U = m.v
	q := min(Unit, strideNum/m.MilliWeight(v))
	if a := min(top, m.v+q); has && a > m.v {
		r.U, r.Waiting = a+q, true
	}
	return r
}

// checkLane checks the newcomer lane across one operation o from before to
// m: a lane member is never gated, and those queued behind the head have
// no tag (U and R 0); a registration joins the lane only when it
// registers, at its end; the lane loses members only from its front in a
// dequeue (the head served, gated or collected hands on to the next), and
// anywhere outside one (a drain); when the head leaves outside a dequeue
// (its last ready run expired), the next head takes its tag, at least V;
// and the head is never more than two quanta past V (the pack capped at
// V+Unit, plus one), so nothing that left the lane pushes it back.
func checkLane(t *rapid.T, before, m *Model, o op) {
	was, now := lane(before), lane(m)
	if len(now) > 0 {
		head := now[0]
		require.LessOrEqual(t, m.reg[head].U, m.v+2*Unit, "lane head %s past V+2U (%v)", head, o)
		for _, v := range now {
			r := m.reg[v]
			require.False(t, r.Gated, "%s gated in the lane (%v)", v, o)
			if v != head {
				require.Zero(t, r.U, "%s queued with a tag (%v)", v, o)
				require.Zero(t, r.R, "%s queued with a remainder (%v)", v, o)
			}
		}
	}
	// Members still in the lane, in their old order, then the new ones.
	stayed := map[string]bool{}
	var kept []string
	for _, v := range was {
		if r, ok := m.reg[v]; ok && r.Waiting && r.Seq == before.reg[v].Seq {
			stayed[v] = true
			kept = append(kept, v)
		}
	}
	for _, v := range now {
		if stayed[v] {
			continue
		}
		_, old := before.reg[v]
		require.False(t, old && before.reg[v].Seq == m.reg[v].Seq, "%s rejoined the lane without registering (%v)", v, o)
	}
	strs := func(x []string) []string { return append([]string{}, x...) }
	require.Equal(t, strs(kept), strs(now[:len(kept)]), "lane order (%v)", o)
	if o.kind == opDequeue {
		require.Equal(t, strs(was[len(was)-len(kept):]), strs(kept), "a dequeue takes from the lane's front only")
	}
	if len(was) > 0 && len(kept) > 0 && kept[0] != was[0] && o.kind != opDequeue {
		oldHead := before.reg[was[0]]
		if _, gone := m.reg[was[0]]; !gone || !m.reg[was[0]].Waiting {
			require.Equal(t, max(m.v, oldHead.U), m.reg[kept[0]].U, "next head at max(V, the old head's tag) (%v)", o)
		}
	}
}

// TestPropInvariants: over random workloads of the model's own operations
// (limits and weights changing included), after every operation: the
// logical clock and V() never decrease; a variant is registered exactly
// while it has ready runs; registration numbers are unique and below the
// next; a registration outside a dequeue follows the return or newcomer
// rule; the newcomer lane keeps its order (see checkLane); a variant is
// gated only at its limit, and stays at it while gated; after a call with
// capacity, no gated variant is below the limit; after an operation that
// parked, every parked tag is above V and the idle set is within its cap;
// every stored time is in [0, 2^50).
func TestPropInvariants(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		cfg := randomConfig(rt)
		s := &sim{m: New(cfg)}
		m := s.m
		nkeys := rapid.IntRange(1, 9).Draw(rt, "keys")
		freedUngated := map[string]bool{} // gated variants whose slot freed without a key limit
		for i := rapid.IntRange(1, 80).Draw(rt, "ops"); i > 0; i-- {
			o := drawOp(rt, nkeys, opSet{})
			before := m.Clone()
			limit := m.cfg.Limits.Key
			capacity := m.capacity(max(o.n, 1))
			s.apply(rt, o)

			require.GreaterOrEqual(rt, logical(m), logical(before), "V decreased (%v)", o)
			require.GreaterOrEqual(rt, m.V(), before.V(), "V() decreased (%v)", o)
			storedInRange(rt, m)

			var registered, indexed []string
			seqs := map[int64]string{}
			for v, r := range m.reg {
				registered = append(registered, v)
				require.Less(rt, r.Seq, m.nextSeq)
				_, dup := seqs[r.Seq]
				require.False(rt, dup, "seq %d twice", r.Seq)
				seqs[r.Seq] = v
				_, parked := m.idle[v]
				require.False(rt, parked, "%s registered and parked", v)
			}
			for _, e := range m.CkIndex() {
				indexed = append(indexed, e.Member)
			}
			sort.Strings(registered)
			sort.Strings(indexed)
			require.Equal(rt, indexed, registered, "registered <=> ready runs (%v)", o)

			if o.kind != opDequeue {
				for v, r := range m.reg {
					if _, was := before.reg[v]; !was {
						require.Equal(rt, registration(before, v), *r, "%s registered by %v", v, o)
					}
				}
			}
			checkLane(rt, before, m, o)

			for v, r := range m.reg {
				if !r.Gated {
					continue
				}
				br, was := before.reg[v]
				switch {
				case !was || !br.Gated || (o.kind == opDequeue && m.inflight[v] > before.inflight[v]):
					// Gated by this operation (perhaps after a return to the
					// competition and a serve): only a dequeue gates, at the
					// limit.
					require.Equal(rt, opDequeue, o.kind, "%s gated by %v", v, o)
					require.Positive(rt, limit)
					require.GreaterOrEqual(rt, m.inflight[v], limit, "%s gated below its limit", v)
				case m.inflight[v] != before.inflight[v]:
					// A release un-gates at once, but for one without a key
					// limit (the sweep of the next call does it): see
					// TestBugReleaseWithoutKeyLimitLeavesGated.
					require.Zero(rt, limit, "%s's slots changed while gated (%v)", v, o)
					freedUngated[v] = true
				}
			}
			if o.kind == opDequeue && capacity > 0 {
				for _, v := range gatedBelowLimit(m) {
					require.True(rt, freedUngated[v], "%s gated below the limit after a call", v)
				}
			}
			for v := range freedUngated {
				if r, ok := m.reg[v]; !ok || !r.Gated {
					delete(freedUngated, v)
				}
			}

			parked := false
			for v, p := range m.idle {
				if bp, was := before.idle[v]; !was || bp != p {
					parked = true
				}
			}
			if parked {
				for v, p := range m.idle {
					require.Greater(rt, p, m.v, "%s parked at or below V after %v", v, o)
				}
				require.LessOrEqual(rt, len(m.idle), cfg.IdleMaxEntries)
			}
		}
	})
}

// laneKey draws a key in the lane with a ready run, the head half the
// time, or "" when there is none.
func laneKey(rt *rapid.T, m *Model) string {
	var keys []string
	for i, v := range lane(m) {
		if len(m.ready[v]) > 0 {
			keys = append(keys, m.KeyOf(v))
			if i == 0 && rapid.Bool().Draw(rt, "head") {
				return keys[0]
			}
		}
	}
	if len(keys) == 0 {
		return ""
	}
	return keys[rapid.IntRange(0, len(keys)-1).Draw(rt, "lane key")]
}

// TestPropLane: the invariants of checkLane and the registration rule
// under workloads that keep the newcomer lane busy: newcomers (fresh keys
// with one or two runs) arrive while older keys are backlogged, and expire,
// are served, gated (key limits, flag-off serves) or left stale (flag-off
// drains) in any order.
func TestPropLane(t *testing.T) {
	t.Parallel()
	stats := map[string]int{}
	rapid.Check(t, func(rt *rapid.T) {
		cfg := randomConfig(rt)
		s := &sim{m: New(cfg)}
		m := s.m
		old := rapid.IntRange(1, 4).Draw(rt, "backlogged")
		for i := 0; i < old; i++ {
			m.SetWeight(keyName(i), rapid.SampledFrom([]float64{0.01, 0.5, 1, 3}).Draw(rt, "w"))
			add(rt, m, keyName(i), 20, 0, 0)
		}
		fresh := 0
		for i := rapid.IntRange(1, 100).Draw(rt, "ops"); i > 0; i-- {
			var o op
			switch k := rapid.IntRange(0, 99).Draw(rt, "lane op"); {
			case k < 30:
				o = op{kind: opEnqueue, key: fmt.Sprintf("n%d", fresh), n: rapid.IntRange(1, 2).Draw(rt, "runs")}
				fresh++
			case k < 50:
				o = op{kind: opExpire, key: laneKey(rt, m)}
			case k < 75:
				o = op{kind: opDequeue, n: rapid.IntRange(1, 4).Draw(rt, "maxCount")}
			case k < 85:
				o = op{kind: opAck, pick: rapid.IntRange(0, 1000).Draw(rt, "pick")}
			case k < 92:
				o = op{kind: opFlagOffServe, key: laneKey(rt, m)}
			default:
				o = op{kind: opLimits, limits: Limits{Key: rapid.SampledFrom([]int{0, 1, 2}).Draw(rt, "keyLimit")}}
			}
			if o.key == "" && (o.kind == opExpire || o.kind == opFlagOffServe) {
				continue
			}
			before := m.Clone()
			if o.kind == opExpire {
				h, _ := head(m.ready[vm(o.key)])
				require.True(rt, m.Expire(decode(rt, h.Member)))
			} else {
				s.apply(rt, o)
			}
			storedInRange(rt, m)
			if o.kind != opDequeue && o.kind != opFlagOffServe {
				for v, r := range m.reg {
					if _, was := before.reg[v]; !was {
						require.Equal(rt, registration(before, v), *r, "%s registered by %v", v, o)
					}
				}
			}
			checkLane(rt, before, m, o)
			if l := lane(m); len(l) >= 2 {
				stats["lane of 2 or more"]++
			}
			if bl, l := lane(before), lane(m); len(bl) > 0 && (len(l) == 0 || bl[0] != l[0]) {
				stats["head left by "+o.kind.String()]++
			}
			for i := 0; i < old; i++ {
				if len(m.ready[vm(keyName(i))]) < 5 {
					add(rt, m, keyName(i), 5, 0, s.now)
				}
			}
		}
	})
	t.Logf("lane: %v", stats)
}

// TestPropNoPanics: every operation, flag-off writers, the state TTL, limit
// and weight changes included, in any order, keeps the stored times in
// range, the registrations and parked tags disjoint, and the state through
// a Snapshot/Restore round trip.
func TestPropNoPanics(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		cfg := randomConfig(rt)
		s := &sim{m: New(cfg)}
		nkeys := rapid.IntRange(1, 9).Draw(rt, "keys")
		for i := rapid.IntRange(1, 80).Draw(rt, "ops"); i > 0; i-- {
			o := drawOp(rt, nkeys, opSet{expireState: true, flagOff: true})
			before := normalized(s.m.Snapshot())
			s.apply(rt, o)
			storedInRange(rt, s.m)
			if o.kind == opFlagOffDequeue {
				// No scheduler write: only the runs and in-flight counts move.
				after := normalized(s.m.Snapshot())
				before.Runs, before.InFlight = after.Runs, after.InFlight
				require.Equal(rt, before, after, "the scheduler state across a flag-off dequeue")
			}
			for v := range s.m.reg {
				_, parked := s.m.idle[v]
				require.False(rt, parked, "%s registered and parked", v)
			}
			snap := normalized(s.m.Snapshot())
			require.Equal(rt, snap, normalized(Restore(s.m.cfg, snap).Snapshot()))
		}
		// Whatever was left, the scheduler drains every ready run once the
		// limits go and the in-flight runs are acked.
		s.m.SetLimits(Limits{})
		for _, id := range s.idsIn(InFlight) {
			flagOffAck(rt, s.m, decode(rt, id))
		}
		for i := 0; len(s.m.CkIndex()) > 0; i++ {
			require.Less(rt, i, 1000, "ready runs never drained")
			s.m.Dequeue(3, s.now)
		}
	})
}
