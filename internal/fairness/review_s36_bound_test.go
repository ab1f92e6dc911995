package fairness

import (
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/vtime"
)

// Review s36: the argument of CheckNewcomer's weight cap, checked on the
// model's own state. While a newcomer k waits (an open episode of the
// check), every other key j served w times since k registered must have
// an effective tag E_j = max(tag, V) at least V0 + work_j, where work_j is
// the check's count (sum of 1/w per serve, capped at 1/w' at each weight
// change to w'), up to one unit of rounding per serve. A key with no tag
// (dropped, or queued in the lane behind its head) registers at V or
// above: its E_j is V. The invariant is checked before every driver call
// (the oracle emits an operation's events after the driver acts), so in
// every state the generators reach: competing, gated, parked, in the lane,
// weight changes of any of them, of the waiting newcomer too.

type s36Episode struct {
	key  string
	v0   int64 // logical V (units) when the tracker saw k register
	n    map[string]int
	work map[string]float64
	done bool
}

// s36Tracker follows CheckNewcomer's episodes (the same rules) and checks
// the invariant against the model.
type s36Tracker struct {
	o       *Oracle
	m       *vtime.Model
	seen    int
	eps     []*s36Episode
	open    map[string]*s36Episode // by newcomer key, pending or active
	checked int                    // (episode, key) pairs compared
	capped  int                    // of them, with a count capped by a weight change
	capKeys map[*s36Episode]map[string]bool
	err     error
	states  map[string]int
}

func (tr *s36Tracker) logicalV() int64 {
	v, epoch, _, _, _, _, _ := tr.m.Clock()
	return epoch*vtime.RebaseBy + v
}

func (tr *s36Tracker) endKey(k string) {
	if ep := tr.open[k]; ep != nil {
		ep.done = true
		delete(tr.open, k)
	}
}

func (tr *s36Tracker) step() {
	if tr.err != nil {
		return
	}
	evs := tr.o.H.Events
	for ; tr.seen < len(evs); tr.seen++ {
		e := evs[tr.seen]
		switch e.Kind {
		case EvRegister:
			tr.endKey(e.Key)
			if e.Visible && e.Eligible {
				ep := &s36Episode{key: e.Key, v0: tr.logicalV(), n: map[string]int{}, work: map[string]float64{}}
				tr.open[e.Key] = ep
				tr.eps = append(tr.eps, ep)
			}
		case EvUnservable:
			tr.endKey(e.Key)
		case EvSuspect:
			if e.On {
				tr.endKey(e.Key)
			}
		case EvWeight:
			for _, ep := range tr.eps {
				if w, ok := ep.work[e.Key]; ok && w > stride(e.W) {
					ep.work[e.Key] = stride(e.W)
					if tr.capKeys[ep] == nil {
						tr.capKeys[ep] = map[string]bool{}
					}
					tr.capKeys[ep][e.Key] = true
				}
			}
		case EvFlag, EvReset, EvLapse:
			for _, ep := range tr.eps {
				ep.done = true
			}
			tr.open = map[string]*s36Episode{}
		case EvServe:
			tr.endKey(e.Key)
			for _, ep := range tr.eps {
				if !ep.done {
					ep.n[e.Key]++
					ep.work[e.Key] += stride(e.W)
				}
			}
		}
	}
	var live []*s36Episode
	for _, ep := range tr.eps {
		if !ep.done {
			live = append(live, ep)
		}
	}
	tr.eps = live
	if len(live) == 0 {
		return
	}
	// Effective tags E_j = max(tag, V), logical units.
	v, epoch, _, _, _, _, _ := tr.m.Clock()
	base := epoch * vtime.RebaseBy
	eff := map[string]int64{}
	var headSeq int64 = -1
	for _, r := range tr.m.Registered() {
		if r.Waiting && (headSeq < 0 || r.Seq < headSeq) {
			headSeq = r.Seq
		}
	}
	for _, r := range tr.m.Registered() {
		if r.Waiting && r.Seq != headSeq {
			continue // no tag yet: V
		}
		eff[r.Member] = base + max(r.U, v)
	}
	for _, p := range tr.m.Idle() {
		eff[p.Member] = base + max(int64(p.Score), v)
	}
	for _, ep := range live {
		for j, work := range ep.work {
			e, ok := eff[keys.VariantMember(j)]
			if !ok {
				// No tag: it registers at V or above when it comes back
				// (unless its parked tag was dropped above V: then the
				// registration is checked).
				continue
			}
			tr.checked++
			if tr.capKeys[ep][j] {
				tr.capped++
			}
			have := float64(e - ep.v0)
			need := work*vtime.Unit - float64(ep.n[j]+1)
			if have < need {
				tr.err = fmt.Errorf("newcomer %q (V0 %d): %q served %d times since, counted %.6f, but its tag is only %.6f past V0 (V %d, regs %+v, idle %+v)\n%s",
					ep.key, ep.v0, j, ep.n[j], work, have/vtime.Unit, v, tr.m.Registered(), tr.m.Idle(), s36Tail(tr.o.H.Events))
				return
			}
		}
	}
}

// s36Driver checks the tracker before every driver call.
type s36Driver struct {
	*ModelDriver
	tr *s36Tracker
}

func (d *s36Driver) Enqueue(key, id string, p int, delay, ttl time.Duration) error {
	d.tr.step()
	return d.ModelDriver.Enqueue(key, id, p, delay, ttl)
}
func (d *s36Driver) Dequeue(n int) ([]Served, error) { d.tr.step(); return d.ModelDriver.Dequeue(n) }
func (d *s36Driver) Ack(id string) error             { d.tr.step(); return d.ModelDriver.Ack(id) }
func (d *s36Driver) Nack(id string, r time.Duration, dl bool) (bool, error) {
	d.tr.step()
	return d.ModelDriver.Nack(id, r, dl)
}
func (d *s36Driver) RecoverLeases() (int, error) { d.tr.step(); return d.ModelDriver.RecoverLeases() }
func (d *s36Driver) SweepTTL() (int, error)      { d.tr.step(); return d.ModelDriver.SweepTTL() }
func (d *s36Driver) SetWeight(k string, w float64) error {
	d.tr.step()
	d.tr.classify(k, w)
	return d.ModelDriver.SetWeight(k, w)
}

// classify counts the state of a key whose weight changes while it has a
// count in an open episode (or is itself a waiting newcomer).
func (tr *s36Tracker) classify(k string, w float64) {
	counted, newcomer := false, tr.open[k] != nil
	for _, ep := range tr.eps {
		if !ep.done {
			if _, ok := ep.work[k]; ok {
				counted = true
			}
		}
	}
	if !counted && !newcomer {
		return
	}
	vm := keys.VariantMember(k)
	state := "untagged"
	var headSeq int64 = -1
	regs := tr.m.Registered()
	for _, r := range regs {
		if r.Waiting && (headSeq < 0 || r.Seq < headSeq) {
			headSeq = r.Seq
		}
	}
	for _, r := range regs {
		if r.Member != vm {
			continue
		}
		switch {
		case r.Gated:
			state = "gated"
		case r.Waiting && r.Seq == headSeq:
			state = "lane head"
		case r.Waiting:
			state = "in lane"
		default:
			state = "competing"
		}
	}
	for _, p := range tr.m.Idle() {
		if p.Member == vm {
			state = "parked"
		}
	}
	old := tr.m.Weight(k)
	dir := "same"
	if w > old {
		dir = "raised"
	} else if w < old {
		dir = "lowered"
	}
	who := "counted"
	if newcomer {
		who = "newcomer"
	}
	tr.states[who+" "+state+" "+dir]++
}
func (d *s36Driver) SetLimits(l Limits) error       { d.tr.step(); return d.ModelDriver.SetLimits(l) }
func (d *s36Driver) Advance(dt time.Duration) error { d.tr.step(); return d.ModelDriver.Advance(dt) }
func (d *s36Driver) ExpireState() error             { d.tr.step(); return d.ModelDriver.ExpireState() }

func s36Oracle(t *rapid.T) (*Oracle, *s36Tracker) {
	c := ModelConfig{
		WindowMultiplier: rapid.SampledFrom([]int{1, 2, 3}).Draw(t, "windowMultiplier"),
		IdleMaxEntries:   10000, // 2 drops parked tags above V: see the report
		MaxAttempts:      3,
		Lease:            time.Minute,
	}
	md := NewModelDriver(c)
	tr := &s36Tracker{m: md.Model(), open: map[string]*s36Episode{}, capKeys: map[*s36Episode]map[string]bool{}, states: map[string]int{}}
	o := New(&s36Driver{ModelDriver: md, tr: tr}, Config{Lease: c.Lease, MaxAttempts: c.MaxAttempts})
	tr.o = o
	return o, tr
}

// TestS36NewcomerCapBound: the invariant on the model, with weight
// changes drawn often.
func TestS36NewcomerCapBound(t *testing.T) {
	gens := map[string]func(*rapid.T, *Oracle) error{}
	g := DefaultGen
	gens["default"] = func(t *rapid.T, o *Oracle) error { return Drive(t, o, g) }
	gb := DefaultGen
	gb.WeightBias, gb.IdleBias = 30, 50
	gens["bias"] = func(t *rapid.T, o *Oracle) error { return Drive(t, o, gb) }
	gs := DefaultGen
	gs.WeightBias, gs.Weights = 25, []float64{0.5, 1, 2, 3}
	gens["small"] = func(t *rapid.T, o *Oracle) error { return Drive(t, o, gs) }
	gens["s25"] = DriveS25
	for name, drive := range gens {
		t.Run(name, func(t *testing.T) {
			checked, capped := 0, 0
			states := map[string]int{}
			rapid.Check(t, func(rt *rapid.T) {
				o, tr := s36Oracle(rt)
				if err := drive(rt, o); err != nil {
					rt.Fatalf("driving the model: %v", err)
				}
				tr.step()
				if tr.err != nil {
					rt.Fatalf("%v", tr.err)
				}
				checked += tr.checked
				capped += tr.capped
				for k, n := range tr.states {
					states[k] += n
				}
			})
			t.Logf("%s: %d (episode, key, state) bounds compared, %d of them with a capped count; weight changes by state: %v", name, checked, capped, states)
		})
	}
}

func s36Tail(evs []Event) string {
	out := ""
	for i := max(0, len(evs)-40); i < len(evs); i++ {
		out += fmt.Sprintf("%+v\n", evs[i])
	}
	return out
}

// s36ChangesHistory: a and b backlogged, u registers one serve behind the
// pack, b is served once at weight 1; then b's weight is lowered to 0.001
// (a cap at 1000: nothing forgiven), the waiting u's own weight changes to
// 0.5, and b is raised to 2 (a cap at 1/2); then b is served after more
// times (plan) or the model serves.
func s36ChangesHistory(t *testing.T, drv Driver, plan *planDriver, after int) *Oracle {
	t.Helper()
	return weightCapHistory(t, drv, plan, after, reweight{"b", 0.001}, reweight{"u", 0.5}, reweight{"b", 2})
}

// TestS36NewcomerSeveralChanges: on the model the schedule passes (b is
// served 5 times before u, as with one change); an unfair backend serving
// b 5 times at weight 2 after the changes is caught (1/2 + 4 x 1/2 = 2.5
// before the 5th), 4 times is not (2): the cap is the last change's, a
// lowering in between forgives nothing.
func TestS36NewcomerSeveralChanges(t *testing.T) {
	o := s36ChangesHistory(t, weightCapModel(), nil, 0)
	if n := servesBefore(&o.H, "b", "u"); n != 5 {
		t.Fatalf("model: b served %d times before u, want 5", n)
	}
	if vs := CheckNewcomer(&o.H); len(vs) > 0 {
		t.Fatalf("model schedule failed:\n%s", Report(&o.H, vs))
	}
	for after, want := range map[int]int{4: 0, 5: 1} {
		d := newPlanDriver()
		o := s36ChangesHistory(t, d, d, after)
		if vs := CheckNewcomer(&o.H); len(vs) != want {
			t.Fatalf("after=%d: %d violations, want %d\n%s", after, len(vs), want, Report(&o.H, vs))
		}
	}
}
