package fairness

// Review s36 (8121bbf..a1091db): CheckNewcomer rewritten to per-episode
// counters with the weight-change cap. The previous version (5acc613) is
// kept here as checkNewcomerPrev; on histories without a weight change the
// two must agree exactly.

import (
	"fmt"
	"reflect"
	"sort"
	"testing"
	"time"

	"pgregory.net/rapid"
)

func checkNewcomerPrev(h *History) []Violation {
	type episode struct {
		key   string
		p     int
		start int // serve index at which k registered
		done  bool
	}
	// Per key: serve indices and the cumulative sum of 1/w after each.
	idx := map[string][]int{}
	cum := map[string][]float64{}
	cumBefore := func(j string, serve int) (float64, int) {
		ix := idx[j]
		n := sort.SearchInts(ix, serve) // serves of j before index serve
		if n == 0 {
			return 0, 0
		}
		return cum[j][n-1], n
	}
	var out []Violation
	var eps []*episode
	active := map[string]*episode{}
	pendingStart := map[string]*episode{}
	flagOn := true
	end := func(k string) {
		if e := active[k]; e != nil {
			e.done = true
			delete(active, k)
		}
		delete(pendingStart, k)
	}
	endAll := func() {
		for k := range active {
			end(k)
		}
		pendingStart = map[string]*episode{}
	}
	for _, e := range h.Events {
		switch e.Kind {
		case EvRegister:
			delete(pendingStart, e.Key)
			if e.Visible && e.Eligible && flagOn {
				pendingStart[e.Key] = &episode{key: e.Key, p: e.P, start: e.Serve}
			}
		case EvServable:
			if ep := pendingStart[e.Key]; ep != nil {
				delete(pendingStart, e.Key)
				active[e.Key] = ep
				eps = append(eps, ep)
			}
		case EvUnservable:
			end(e.Key)
		case EvSuspect:
			if e.On {
				end(e.Key)
			}
		case EvFlag:
			flagOn = e.On
			endAll()
		case EvReset, EvLapse:
			endAll()
		case EvServe:
			j := e.Key
			if active[j] != nil {
				end(j) // served: the wait is over
			}
			delete(pendingStart, j)
			jx := idx[j]
			if len(jx) > 0 {
				last := jx[len(jx)-1]
				prev := cum[j][len(jx)-1]
				for _, ep := range eps {
					if ep.start > last {
						break // j not served since this episode began
					}
					if ep.done {
						continue
					}
					base, nb := cumBefore(j, ep.start)
					m := len(jx) - nb + 1 // this serve is j's m-th in the wait
					work := prev - base
					bound := 2 + float64(ep.p) + Tol*float64(m+1)
					if m >= 2 && work > bound {
						out = append(out, Violation{Check: "newcomer", Op: e.Op, Serve: e.Serve,
							Msg: fmt.Sprintf("%q (P=%d) registered after %d serves and still waits; %q is served for the %d-th time since (work before this serve %.6g > 2+P)",
								ep.key, ep.p, ep.start, j, m, work)})
						ep.done = true
						delete(active, ep.key)
					}
				}
			}
			c := 0.0
			if n := len(cum[j]); n > 0 {
				c = cum[j][n-1]
			}
			idx[j] = append(idx[j], e.Serve)
			cum[j] = append(cum[j], c+1/e.W)
			// Keep the episode list short: drop finished ones at the front.
			for len(eps) > 0 && eps[0].done {
				eps = eps[1:]
			}
		}
	}
	return out
}

// withoutWeight returns h with its EvWeight events left out and its
// registrations at weight 1 (the serves keep the weights they were
// recorded with): the previous check knew neither.
func withoutWeight(h *History) *History {
	c := *h
	c.Events = nil
	for _, e := range h.Events {
		if e.Kind == EvRegister {
			e.W = 0
		}
		if e.Kind != EvWeight {
			c.Events = append(c.Events, e)
		}
	}
	return &c
}

func hasWeight(h *History) bool {
	for _, e := range h.Events {
		if e.Kind == EvWeight {
			return true
		}
	}
	return false
}

func sameNewcomer(t *rapid.T, h *History, what string) int {
	prev, cur := checkNewcomerPrev(h), CheckNewcomer(h)
	// Compared where and when (the new message also gives the quantum).
	where := func(vs []Violation) []Violation {
		out := make([]Violation, len(vs))
		for i, v := range vs {
			out[i] = Violation{Check: v.Check, Op: v.Op, Serve: v.Serve}
		}
		return out
	}
	if !reflect.DeepEqual(where(prev), where(cur)) {
		t.Fatalf("%s: previous check %d violations, new %d\nprevious:\n%s\nnew:\n%s", what, len(prev), len(cur),
			Report(h, prev), Report(h, cur))
	}
	return len(prev)
}

type s36Stats struct{ histories, natural, violations, serves int }

func (s s36Stats) String() string {
	return fmt.Sprintf("%d histories compared (%d with no weight change as generated), %d serves, %d violations (both agree)",
		s.histories, s.natural, s.serves, s.violations)
}

// compare counts h and compares both checks on it, weight events stripped.
func (s *s36Stats) compare(t *rapid.T, h *History) {
	if !hasWeight(h) {
		s.natural++
	}
	s.histories++
	s.serves += h.Serves
	s.violations += sameNewcomer(t, withoutWeight(h), "weight events stripped")
}

// TestS36NewcomerSameWithoutWeightModel: the model, DefaultGen.
func TestS36NewcomerSameWithoutWeightModel(t *testing.T) {
	var st s36Stats
	rapid.Check(t, func(rt *rapid.T) {
		o := modelOracle(rt)
		if err := Drive(rt, o, DefaultGen); err != nil {
			rt.Fatalf("driving the model: %v", err)
		}
		st.compare(rt, &o.H)
	})
	t.Logf("model: %s", st)
}

// randDriver is an unfair backend: each Dequeue serves keys drawn at
// random among those with runs, often the same key again.
type randDriver struct {
	fifoDriver
	t *rapid.T
}

func (d *randDriver) Dequeue(n int) ([]Served, error) {
	var out []Served
	last := ""
	for c := rapid.IntRange(0, n).Draw(d.t, "serveN"); c > 0; c-- {
		var avail []string
		for k, ids := range d.fifo {
			if len(ids) > 0 {
				avail = append(avail, k)
			}
		}
		sort.Strings(avail)
		if len(avail) == 0 {
			break
		}
		k := rapid.SampledFrom(avail).Draw(d.t, "pick")
		if last != "" && len(d.fifo[last]) > 0 && rapid.Bool().Draw(d.t, "again") {
			k = last
		}
		last = k
		out = append(out, d.serveHead(k))
	}
	return out, nil
}

// driveRand: backlogged keys, newcomers one at a time and in waves,
// dequeues of the unfair driver, acks, flag flips, and (weights) weight
// changes.
func driveRand(t *rapid.T, o *Oracle, weights []float64) error {
	names := []string{"a", "b", "c", "d"}[:rapid.IntRange(1, 4).Draw(t, "names")]
	mint := 0
	var err error
	for i, steps := 0, rapid.IntRange(5, 80).Draw(t, "steps"); i < steps && err == nil; i++ {
		switch op := rapid.IntRange(0, 99).Draw(t, "op"); {
		case op < 20:
			key := rapid.SampledFrom(names).Draw(t, "key")
			for c := rapid.IntRange(1, 8).Draw(t, "runs"); c > 0 && err == nil; c-- {
				_, err = o.Enqueue(key, 0, 0, 0)
			}
		case op < 32:
			for c := rapid.IntRange(1, 3).Draw(t, "wave"); c > 0 && err == nil; c-- {
				mint++
				_, err = o.Enqueue(fmt.Sprintf("u%d", mint), 0, 0, 0)
			}
		case op < 75:
			var served []Served
			served, err = o.Dequeue(rapid.IntRange(1, 4).Draw(t, "maxCount"))
			for _, s := range served {
				if err == nil && rapid.Bool().Draw(t, "ack") {
					err = o.Ack(s.ID)
				}
			}
		case op < 80:
			err = o.SetFlag(!o.FlagOn())
		case op < 90 && len(weights) > 0:
			key := rapid.SampledFrom(names).Draw(t, "weightKey")
			if mint > 0 && rapid.Bool().Draw(t, "weightMinted") {
				key = fmt.Sprintf("u%d", rapid.IntRange(1, mint).Draw(t, "minted"))
			}
			err = o.SetWeight(key, rapid.SampledFrom(weights).Draw(t, "weight"))
		}
	}
	return err
}

// TestS36NewcomerSameWithoutWeightUnfair: an unfair backend, no weight
// changes (weights stay 1), and weights set before anything is served
// stripped (serves then at other weights, no EvWeight): the two versions
// agree, violations included.
func TestS36NewcomerSameWithoutWeightUnfair(t *testing.T) {
	var st s36Stats
	rapid.Check(t, func(rt *rapid.T) {
		d := &randDriver{fifoDriver: fifoDriver{fifo: map[string][]string{}}, t: rt}
		o := New(d, Config{Lease: time.Hour, MaxAttempts: 3})
		var ws []float64
		if rapid.Bool().Draw(rt, "weighted") {
			ws = []float64{0.5, 1, 2, 3}
		}
		if err := driveRand(rt, o, ws); err != nil {
			rt.Fatalf("driving: %v", err)
		}
		st.compare(rt, &o.H)
	})
	t.Logf("unfair: %s", st)
}

// TestS36ModelNewcomerWeights: the new check on the model with weight
// changes drawn often (of keys competing, gated, parked, of newcomers),
// to the same weight too, and on the review-25 driver.
func TestS36ModelNewcomerWeights(t *testing.T) {
	gens := map[string]GenConfig{}
	g := DefaultGen
	g.WeightBias, g.IdleBias = 30, 50
	gens["bias"] = g
	g = DefaultGen
	g.WeightBias, g.Weights = 25, []float64{0.5, 1, 2}
	gens["small"] = g
	g = DefaultGen
	g.WeightBias, g.Weights = 25, []float64{1}
	gens["same"] = g
	for name, g := range gens {
		t.Run(name, func(t *testing.T) {
			n, w, capped := 0, 0, 0
			rapid.Check(t, func(rt *rapid.T) {
				o := modelOracle(rt)
				if err := Drive(rt, o, g); err != nil {
					rt.Fatalf("driving the model: %v", err)
				}
				n++
				for _, e := range o.H.Events {
					if e.Kind == EvWeight {
						w++
					}
				}
				if vs := CheckNewcomer(&o.H); len(vs) > 0 {
					rt.Fatalf("%s", Report(&o.H, vs))
				}
				if len(checkNewcomerPrev(&o.H)) > 0 {
					capped++ // the previous check failed the model here
				}
			})
			t.Logf("%s: %d histories, %d weight changes, %d failed by the previous check", name, n, w, capped)
		})
	}
	t.Run("s25", func(t *testing.T) {
		rapid.Check(t, func(rt *rapid.T) {
			o := modelOracle(rt)
			if err := DriveS25(rt, o); err != nil {
				rt.Fatalf("driving the model: %v", err)
			}
			if vs := CheckNewcomer(&o.H); len(vs) > 0 {
				rt.Fatalf("%s", Report(&o.H, vs))
			}
		})
	})
}
