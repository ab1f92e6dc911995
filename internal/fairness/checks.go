package fairness

import (
	"fmt"
	"math"
	"sort"

	"github.com/runqueue/runqueue/vtime"
)

// Tol is the arithmetic tolerance of the checks, per serve involved: the
// scheduler keeps virtual time in integer units of 1e-6 of a serve at
// weight 1, so each serve's cost 1/w may be rounded by up to one unit, and
// a sum over n serves by up to n units.
const Tol = 1e-6

// A Check judges one guarantee on an observed history.
type Check struct {
	Name string
	Fn   func(h *History) []Violation
}

// Checks are every check, in the order of docs/design.md section 7.
var Checks = []Check{
	{"newcomer", CheckNewcomer},
	{"newcomer-order", CheckNewcomerOrder},
	{"lag", CheckLag},
	{"batch", CheckBatchInvariance},
	{"reachability", CheckReachability},
	{"work", CheckWorkConservation},
	{"exactly-once", CheckExactlyOnce},
	{"clock", CheckClock},
}

// CheckByName returns the check called name.
func CheckByName(name string) (Check, bool) {
	for _, c := range Checks {
		if c.Name == name {
			return c, true
		}
	}
	return Check{}, false
}

// servability tracks, while a check replays a history, which keys are
// servable, which await discovery, their weights and the flag.
type servability struct {
	servable map[string]bool
	suspect  map[string]bool
	weight   map[string]float64
	flagOn   bool
}

func newServability() *servability {
	return &servability{servable: map[string]bool{}, suspect: map[string]bool{}, weight: map[string]float64{},
		flagOn: true}
}

func (s *servability) apply(e Event) {
	switch e.Kind {
	case EvServable:
		s.servable[e.Key] = true
	case EvUnservable:
		delete(s.servable, e.Key)
	case EvSuspect:
		if e.On {
			s.suspect[e.Key] = true
		} else {
			delete(s.suspect, e.Key)
		}
	case EvWeight:
		s.weight[e.Key] = e.W
	case EvFlag:
		s.flagOn = e.On
	}
}

// w is key's weight as the scheduler holds it: its milli-weight over
// 1,000 (0.0014 is 0.001, 2.0004 is 2; none, or 0, is 1).
func (s *servability) w(key string) float64 {
	return float64(milliWeight(s.weight[key])) / 1000
}

// stride is one serve of key in weight-1 serves, as the scheduler counts it.
func (s *servability) stride(key string) float64 {
	return stride(s.weight[key])
}

// CheckNewcomer: the no-debt wait and newcomer bound (docs/design.md
// section 7, guarantees 1 and 10).
//
// Statement. Let key k register (gain its first ready run) through a
// flag-on write, with no debt (Event.Eligible: k never had a ready run,
// or the state expired since it last had one, or its last ready run left
// by a serve at weight 1 or more (its tag then at most one weight-1 serve
// past that serve's start, as a weight-1 key's) and at least 3A flag-on
// serves, all at weight 1,
// followed, A the distinct keys they served), and be servable at once.
// Let P be the number of other keys that registered before k (or in the
// same lease recovery or promotion, whose order the oracle does not
// choose), still hold ready runs and were not served by a flag-on call
// since they registered; an undiscovered key (ready runs from a flag-off
// instance) registers when a flag-on write moves its head, which the
// oracle, not knowing ready scores, counts at every flag-on write that
// makes one of its runs ready (an upper bound). These are the newcomers k
// may legitimately queue behind (a
// newcomer queues one quantum behind the previous one; a flag-off serve
// writes nothing of the scheduler, so a newcomer it serves still waits in
// the lane when the flag is on again: scenario LaneAcrossFlip). Then, until k is
// served, every other key j that is served m times while k waits
// satisfies
//
//	sum over j's first m-1 of those serves of s_j(at that serve) <= B + Tol*(m+1)
//
// where s = 1000/mw is a serve's stride at weight w, mw = vtime.MilliWeightOf(w)
// the milli-weight the scheduler rounds w to (a weight of 0 is 1); with
// q = min(1, s_k) k's quantum (one serve of its own, at most a weight-1
// serve; the largest of its weights while it waits), B = 2q when P = 0 and
// B = 1 + P + q when P > 0; B = 2 + P (q taken as 1) when a key a flag-off
// call drained may still wait in the lane (Event.Stale). With equal
// weights (all 1) that is: no other key receives more than 3 + P serves
// before k, and with no
// newcomer ahead of k (P = 0) no more than 3; a newcomer of weight above
// 2 with none ahead, at most one serve of each weight-1 key (at weight 2,
// two: the second a tie).
//
// Why. E_j = max(S_j, V) >= V0 (V when k registered) for every j, and
// each serve of j moves its tag up by s_j, so j's m-th serve starts at
// least the sum above past V0. k's tag is at most V0 + B: with the lane
// empty a newcomer becomes its head at min(highest tag, V + q) + q; behind
// a head, it becomes the head one quantum of its own past the old head's
// serve (at the old head's tag), or at the tag of a head that left
// unserved, or at V when that is later (V is then at most the old head's
// tag); so the first head ahead of k is at most V0 + 2 (its quantum at
// most 1), each next one at most 1 further, and k one quantum of its own
// past the last; newcomers that expire, drain or are served with the flag
// on leave the lane and do not count. A key a flag-off call served and
// drained stays in the lane (flag-off scripts write nothing of the
// scheduler) with no ready run, so P does not count it: as the head it
// leaves only when pass 1 reaches its tag (at most V0 + 2), which the next
// head takes; behind a served head it takes a quantum of its own (at most
// 1) in k's place: hence B = 2 + P then (helper-195). A cold burst's key
// that the cold mark registers at V after k (docs/design.md section 6,
// Cold mark: it counts as
// registered when its work fell due, so it may be served before k, once a
// round) starts at a V >= V0 and is in no lane: it is one of the j above,
// and P need not count it. Ties at k's tag may go to j: the +1 serve.
// The episode ends without a verdict when k is still not servable (at
// its key limit) as a dequeue call begins: the call may gate it, and it
// competes again at max(tag, V), where this bound does not hold
// (helper-195); only a call gates, so one made servable before any call
// (an ack, a nack, a recovery, a raised limit) is judged from its
// registration (helper-197). It also ends when k stops being servable,
// awaits discovery, the flag turns off, or the state expires or may have
// lapsed.
//
// A weight change of k while it waits keeps the largest quantum (a lane
// head's tag above V only comes down at a change, and one waiting behind
// the head takes its quantum at the weight it has when it becomes head).
// A weight change of j to w while k waits caps j's count at s: the
// change brings a tag above V down to V + s (guarantee 3), which
// forgives part of j's serves before it. j's tag is then at least
// V0 + min(count, s) (a tag below the cap stays, and V >= V0), and the
// serves after the change move it by their strides, so the argument holds
// with the capped count.
func CheckNewcomer(h *History) []Violation {
	type episode struct {
		key   string
		p     int
		q     float64            // k's largest quantum while it waits
		start int                // serve index at which k registered
		n     map[string]int     // serves of each other key since start
		work  map[string]float64 // their lower bound on its tag past V0
		live  bool               // servable: judged (before, only counted)
		done  bool
	}
	var out []Violation
	var eps []*episode // pending and active, in registration order
	active := map[string]*episode{}
	pendingStart := map[string]*episode{}
	flagOn := true
	stop := func(ep *episode) {
		if ep != nil {
			ep.done = true
		}
	}
	end := func(k string) {
		stop(active[k])
		delete(active, k)
		stop(pendingStart[k])
		delete(pendingStart, k)
	}
	endAll := func() {
		for _, ep := range eps {
			ep.done = true
		}
		active, pendingStart = map[string]*episode{}, map[string]*episode{}
	}
	for _, e := range h.Events {
		// Not servable when a dequeue call begins: the call may gate it
		// (and only a call can): no verdict (helper-195). One made
		// servable before any call (an ack, a nack, a recovery, a raised
		// key limit) was never gated and waits as any newcomer (helper-197).
		if e.Kind == EvCall {
			for k, ep := range pendingStart {
				stop(ep)
				delete(pendingStart, k)
			}
		}
		switch e.Kind {
		case EvRegister:
			stop(pendingStart[e.Key])
			delete(pendingStart, e.Key)
			if e.Visible && e.Eligible && flagOn {
				q := quantum(e.W)
				if e.Stale {
					q = 1
				}
				ep := &episode{key: e.Key, p: e.P, q: q, start: e.Serve, n: map[string]int{}, work: map[string]float64{}}
				pendingStart[e.Key] = ep
				eps = append(eps, ep)
			}
		case EvServable:
			if ep := pendingStart[e.Key]; ep != nil {
				delete(pendingStart, e.Key)
				active[e.Key] = ep
				ep.live = true
			}
		case EvUnservable:
			end(e.Key)
		case EvSuspect:
			if e.On {
				end(e.Key)
			}
		case EvWeight:
			// The cap: a tag above V comes down to V + s (s: a stride at the new weight).
			for _, ep := range eps {
				if ep.key == e.Key {
					ep.q = max(ep.q, quantum(e.W))
				}
				if w, ok := ep.work[e.Key]; ok && w > stride(e.W) {
					ep.work[e.Key] = stride(e.W)
				}
			}
		case EvFlag:
			flagOn = e.On
			endAll()
		case EvReset, EvLapse:
			endAll()
		case EvServe:
			j := e.Key
			end(j) // served: the wait is over
			for _, ep := range eps {
				if ep.done {
					continue
				}
				m := ep.n[j] + 1 // this serve is j's m-th in the wait
				work := ep.work[j]
				bound := 2*ep.q + Tol*float64(m+1)
				if ep.p > 0 {
					bound = 1 + float64(ep.p) + ep.q + Tol*float64(m+1)
				}
				if m >= 2 && work > bound && ep.live {
					out = append(out, Violation{Check: "newcomer", Op: e.Op, Serve: e.Serve,
						Msg: fmt.Sprintf("%q (P=%d, quantum %.6g) registered after %d serves and still waits; %q is served for the %d-th time since (work before this serve %.6g > %.6g)",
							ep.key, ep.p, ep.q, ep.start, j, m, work, bound)})
					ep.done = true
					if active[ep.key] == ep {
						delete(active, ep.key)
					}
					continue
				}
				ep.n[j] = m
				ep.work[j] = work + stride(e.W)
			}
			// Keep the episode list short: drop finished ones at the front.
			for len(eps) > 0 && eps[0].done {
				eps = eps[1:]
			}
		}
	}
	return out
}

// CheckNewcomerOrder: newcomers are served in registration order, never
// by name (docs/design.md section 6, ties; the adversarial-names
// scenario of section 8; guarantee 10: "whatever was minted before it").
//
// Statement. Let key h register fresh (it never had a ready run) through
// a flag-on write and be servable. Until h is served, no key that
// registered fresh through a flag-on write in a later operation is
// served, as long as h stays servable, nothing expires the state and the
// flag stays on. A key a promotion registers while the cold mark may be
// set, with due work at or before it (Event.DueOp), registered somewhere
// from the operation at which that work fell due to that promotion: it is
// later than h only when its work fell due after h registered, and h is
// later than it only when h registered after that promotion.
//
// Why. A newcomer queues one quantum behind the previous newcomer's tag
// when that is above V, else at V; so a later newcomer's tag is at least
// h's while h waits (the anchor is never lowered below a registered tag),
// and ties go by registration order, never by name. Keys registering in
// one operation (a promotion, a lease recovery sweep) register in an order
// the oracle does not choose, so only later operations count. Work that
// fell due together by the cold mark registers together, as if the call
// cut short had reached it all (docs/design.md section 6, Cold mark): the
// mark registers the burst's keys that call left at V, ahead of a
// newcomer that came in between, and of the call's own keys, which the
// newcomer rule may have put in the lane (one that returned at a parked
// tag above V makes the state warm for the rest).
func CheckNewcomerOrder(h *History) []Violation {
	// span: registered somewhere in operations lo..hi (lo < hi only for
	// the keys of a cold burst, Event.DueOp)
	type span struct{ lo, hi int }
	type waiting struct {
		key string
		span
	}
	var out []Violation
	var queue []waiting          // fresh newcomers waiting, in registration order
	freshOp := map[string]span{} // key -> its fresh registration, while waiting
	pending := map[string]span{}
	drop := func(k string) {
		delete(freshOp, k)
		for i, w := range queue {
			if w.key == k {
				queue = append(queue[:i], queue[i+1:]...)
				return
			}
		}
	}
	at := func(s span) string {
		if s.lo == s.hi {
			return fmt.Sprintf("op #%d", s.hi)
		}
		return fmt.Sprintf("op #%d, due by the cold mark at op #%d", s.hi, s.lo)
	}
	flagOn := true
	for _, e := range h.Events {
		switch e.Kind {
		case EvRegister:
			delete(pending, e.Key)
			if e.Fresh && e.Visible && flagOn {
				sp := span{e.Op, e.Op}
				if e.DueOp > 0 && e.DueOp < e.Op {
					sp.lo = e.DueOp
				}
				pending[e.Key] = sp
			}
		case EvServable:
			if sp, ok := pending[e.Key]; ok {
				delete(pending, e.Key)
				freshOp[e.Key] = sp
				queue = append(queue, waiting{e.Key, sp})
			}
		case EvUnservable:
			drop(e.Key)
		case EvSuspect:
			if e.On {
				drop(e.Key)
			}
		case EvFlag, EvReset, EvLapse:
			if e.Kind == EvFlag {
				flagOn = e.On
			}
			queue, freshOp, pending = nil, map[string]span{}, map[string]span{}
		case EvServe:
			// (an expired serve is not judged: the Lua driver cannot see
			// where among its call's serves it was taken)
			if sp, ok := freshOp[e.Key]; ok && !e.Expiring {
				// (the one certainly registered first: a cold burst's key
				// may stand in the queue after a later one)
				first := -1
				for i, w := range queue {
					if first < 0 || w.hi < queue[first].hi {
						first = i
					}
				}
				if first >= 0 && queue[first].hi < sp.lo {
					w := queue[first]
					out = append(out, Violation{Check: "newcomer-order", Op: e.Op, Serve: e.Serve,
						Msg: fmt.Sprintf("newcomer %q (registered at %s) served before newcomer %q (registered at %s, still waiting)",
							e.Key, at(sp), w.key, at(w.span))})
				}
			}
			drop(e.Key)
			delete(pending, e.Key)
		}
	}
	return out
}

// CheckLag: the lag bound (docs/design.md section 7, guarantee 2).
//
// Statement. For two keys i, j that are both servable, not awaiting
// discovery, with the flag on and their weights w_i, w_j unchanged (here
// and below, a weight as the scheduler holds it: its milli-weight over
// 1,000, so 1/w is servability.stride), from the point at which each has
// been served once in that stretch:
// for D(t) = n_i(t)/w_i - n_j(t)/w_j, n(t) the serves since that point
// and t running over every prefix of the serve sequence (inside a batch
// too: each serve is a prefix point),
//
//	max over s <= t of |D(t) - D(s)| <= 1/w_i + 1/w_j + Tol*(2 + n_i + n_j)
//
// The stretch restarts whenever either key stops being servable or
// awaits discovery, a weight of either changes, the flag flips, or the
// state expires or may have lapsed. (Why "served once": before that a
// key may carry debt from before the stretch, e.g. a newcomer two quanta
// past V; after its first serve its tag is at most V + 1/w, the premise
// of start-time fair queuing's lag bound.) Keys followed: the first 64
// that become servable.
//
// A weight change restarts the stretch, and the changed key may then owe
// more than one serve at its new weight for its serves at the old one,
// which the stretch's start leaves unseen (it waits for both keys to be
// served). So each weight change is followed on its own, by a watch. Let
// key k's weight become w_k, with the flag on and k not awaiting
// discovery. The scheduler caps k's tag at V + 1/w_k (one serve at the new
// weight, rounded up to a unit) whether k competes, is gated or is parked
// (docs/design.md section 6, virtual time), but not a newcomer's in the
// lane, which no serve set. A watch of k starts, with D what k may owe:
//
//   - competing: at the change, when k is servable and was served with the
//     flag on since it last became servable (it competes with a tag: not
//     in the lane, nor held gated by a slot a flag-off instance freed).
//     D = 1/w_k.
//   - gated: when k, at the change, has ready runs but is at its key limit,
//     and was served with the flag on since it last registered (gained its
//     first ready run) or awaited discovery (its tag is a serve's: not in
//     the lane), and since it last became servable (else a flag-off
//     instance may have freed a slot without a word: the key stays gated
//     below its limit until the gated probe reaches it, guarantee 6's
//     exception, and a key limit lowered then raised back to the one it
//     was gated under, with no call between, makes it servable for the
//     oracle but not for the scheduler: runqueue's
//     TestS25UnsaidGatedWatch); the watch starts when
//     k is servable again (a flag-on release un-gates it at once, a key
//     limit raised or lifted at the next call, before any serve), and k
//     competes at max(tag, V). D = 1/w_k.
//   - parked: when k, at the change, has no ready run and its last ready
//     run left with the flag on (its tag, when above V, was parked: not a
//     stale tag of a flag-off drain), or a gated one drains before it is
//     servable again; the watch starts when k returns: a flag-on
//     registration outside a dequeue call that makes k servable at once.
//     D = max(1/w_k, 2 + P), P the registration's (Event.P): k returns at
//     its parked tag when that is above V, at most V + 1/w_k; else the tag
//     is dropped (or was reaped) and k registers by the newcomer rule, in
//     the lane, whose tags are at most V + 2 + P (CheckNewcomer): the watch
//     claims no more than what the newcomer bound gives.
//
// Then for every other followed key j servable when the watch starts, over
// j's serves before k's next serve, while k stays servable, j keeps ready
// runs (it may reach its key limit: a gated tag is kept and comes back at
// max(tag, V), never lower), neither awaits discovery and neither weight
// changes again,
//
//	n_j/w_j <= D + 1/w_j + Tol*(2 + n_j)
//
// Why: when the watch starts, at clock V_s, k's effective start is at most
// V_s + D (its capped tag, at most V_c + 1/w_k with V_c <= V_s the clock at
// the change; or V_s; or a newcomer's), and V cannot pass it while k
// competes unserved; j's n-th serve from there starts at V_s + (n-1)/w_j
// or later (E = max(S, V) >= V, and each serve moves j's tag 1/w_j on),
// and j is served only while that is at most k's effective start (ties
// may go to j). A j that drains may come back as a newcomer at V, below
// its old tag: it leaves the watch. A watch ends without a verdict when k
// stops being servable or awaits discovery, k's weight changes again
// (which may start another), the flag flips, or the state expires or may
// have lapsed; one not started yet (gated or parked) also ends when k
// awaits discovery, is served, or registers otherwise (with the flag off,
// inside a dequeue call, or at its key limit). LagWatches counts the
// watches started.
func CheckLag(h *History) []Violation { return checkLag(h, nil) }

// WatchCount counts CheckLag's weight-change watches started in a history,
// by the state k was in when its weight changed, and the serves of other
// keys they judged.
type WatchCount struct {
	Competing, Gated, Parked, Judged int
}

func (c WatchCount) String() string {
	return fmt.Sprintf("%d weight-change watches started (%d competing, %d gated, %d parked), %d serves judged by them",
		c.Competing+c.Gated+c.Parked, c.Competing, c.Gated, c.Parked, c.Judged)
}

// Add adds d's counts to c.
func (c *WatchCount) Add(d WatchCount) {
	c.Competing += d.Competing
	c.Gated += d.Gated
	c.Parked += d.Parked
	c.Judged += d.Judged
}

// LagWatches replays CheckLag over h and counts its weight-change watches.
func LagWatches(h *History) WatchCount {
	var c WatchCount
	checkLag(h, &c)
	return c
}

func checkLag(h *History, count *WatchCount) []Violation {
	if count == nil {
		count = &WatchCount{}
	}
	const maxKeys = 64
	type pair struct {
		i, j           string
		active         bool
		si, sj         bool
		started        bool
		d, minD, maxD  float64
		ni, nj         int
		reported       bool
		startOp, start int
	}
	st := newServability()
	var followed []string
	isFollowed := map[string]bool{}
	pairs := map[string][]*pair{} // key -> its pairs
	var out []Violation
	ok := func(k string) bool { return st.servable[k] && !st.suspect[k] && st.flagOn }
	update := func(p *pair, e Event) {
		want := ok(p.i) && ok(p.j)
		if want == p.active {
			return
		}
		*p = pair{i: p.i, j: p.j, active: want, startOp: e.Op, start: e.Serve}
	}
	restart := func(p *pair, e Event) {
		*p = pair{i: p.i, j: p.j, active: false}
		update(p, e)
	}
	// The weight-change watches. watch: changed key -> its watch, started;
	// pending: changed key -> its watch not started yet (gated or parked).
	// served: keys served with the flag on since they last became
	// servable; tagged: since they last registered or awaited discovery;
	// hasReady: keys with ready runs; drainedOn: keys whose last ready run
	// left with the flag on.
	type weightWatch struct {
		kind string
		owed float64        // D, in serves at weight 1
		n    map[string]int // other key -> its serves since the start
	}
	type pendingWatch struct {
		parked   bool
		returned bool // parked: it registered (flag on, outside a call) at op, serve
		op, serv int
		p        int
	}
	watch := map[string]*weightWatch{}
	pending := map[string]*pendingWatch{}
	served := map[string]bool{}
	tagged := map[string]bool{}
	hasReady := map[string]bool{}
	drainedOn := map[string]bool{}
	inCall := false
	unwatch := func(k string) {
		delete(watch, k)
		for _, w := range watch {
			delete(w.n, k)
		}
	}
	start := func(k, kind string, owed float64) {
		w := &weightWatch{kind: kind, owed: owed, n: map[string]int{}}
		for _, j := range followed {
			if j != k && ok(j) {
				w.n[j] = 0
			}
		}
		watch[k] = w
	}
	for _, e := range h.Events {
		wasServable := st.servable[e.Key]
		st.apply(e)
		switch e.Kind {
		case EvCall:
			inCall = true
		case EvCallEnd:
			inCall = false
		case EvRegister:
			hasReady[e.Key], tagged[e.Key] = true, false
			if pw := pending[e.Key]; pw != nil {
				if pw.parked && !pw.returned && e.Visible && st.flagOn && !inCall {
					pw.returned, pw.op, pw.serv, pw.p = true, e.Op, e.Serve, e.P
				} else {
					delete(pending, e.Key)
				}
			}
		case EvDrain:
			unwatch(e.Key)
			hasReady[e.Key], drainedOn[e.Key] = false, st.flagOn
			if pw := pending[e.Key]; pw != nil {
				pw.parked, pw.returned = true, false // a gated key drained: its tag is parked
			}
		case EvServable:
			if !wasServable {
				served[e.Key] = false
			}
			if pw := pending[e.Key]; pw != nil {
				delete(pending, e.Key)
				s := st.stride(e.Key)
				switch {
				case !ok(e.Key) || !isFollowed[e.Key]:
				case !pw.parked:
					start(e.Key, "gated", s)
					count.Gated++
				case pw.returned && pw.op == e.Op && pw.serv == e.Serve:
					start(e.Key, "parked", math.Max(s, 2+float64(pw.p)))
					count.Parked++
				}
			}
		case EvUnservable:
			// k's watch ends; as another key, one at its key limit stays
			// (its tag is kept, and comes back at max(tag, V)), one that
			// drained went at its EvDrain.
			delete(watch, e.Key)
		case EvSuspect, EvWeight:
			unwatch(e.Key)
			if e.Kind == EvSuspect && e.On {
				delete(pending, e.Key)
				tagged[e.Key] = false
			}
			if e.Kind != EvWeight {
				break
			}
			delete(pending, e.Key)
			switch {
			case !st.flagOn || st.suspect[e.Key]:
			case st.servable[e.Key]:
				if served[e.Key] && isFollowed[e.Key] {
					start(e.Key, "competing", st.stride(e.Key))
					count.Competing++
				}
			case hasReady[e.Key]:
				// served: not held gated by a slot a flag-off instance
				// freed (that slot made k servable, with the flag off,
				// and k could not be served since).
				if tagged[e.Key] && served[e.Key] {
					pending[e.Key] = &pendingWatch{}
				}
			case drainedOn[e.Key]:
				pending[e.Key] = &pendingWatch{parked: true}
			}
		case EvFlag, EvReset, EvLapse:
			clear(watch)
			clear(pending)
			if e.Kind != EvFlag {
				clear(tagged)
			}
		case EvServe:
			if e.On {
				served[e.Key], tagged[e.Key] = true, true
			}
			delete(watch, e.Key)
			delete(pending, e.Key)
			for k, w := range watch {
				n, in := w.n[e.Key]
				if !in {
					continue
				}
				w.n[e.Key] = n + 1
				count.Judged++
				lhs := float64(n+1) * st.stride(e.Key)
				bound := w.owed + st.stride(e.Key) + Tol*float64(2+n+1)
				if lhs > bound {
					out = append(out, Violation{Check: "lag", Op: e.Op, Serve: e.Serve,
						Msg: fmt.Sprintf("%q (w %g) served %d times since %q's weight became %g (%s; owes at most %.6g), and %q not once: %.6g > bound %.6g",
							e.Key, st.w(e.Key), n+1, k, st.w(k), w.kind, w.owed, k, lhs, bound)})
					delete(watch, k)
				}
			}
		}
		switch e.Kind {
		case EvServable:
			if !isFollowed[e.Key] && len(followed) < maxKeys {
				isFollowed[e.Key] = true
				for _, o := range followed {
					p := &pair{i: o, j: e.Key}
					pairs[o] = append(pairs[o], p)
					pairs[e.Key] = append(pairs[e.Key], p)
				}
				followed = append(followed, e.Key)
			}
			for _, p := range pairs[e.Key] {
				update(p, e)
			}
		case EvUnservable, EvSuspect:
			for _, p := range pairs[e.Key] {
				update(p, e)
			}
		case EvWeight:
			for _, p := range pairs[e.Key] {
				restart(p, e)
			}
		case EvFlag, EvReset, EvLapse:
			for _, k := range followed {
				for _, p := range pairs[k] {
					if p.i == k {
						restart(p, e)
					}
				}
			}
		case EvServe:
			for _, p := range pairs[e.Key] {
				if !p.active {
					continue
				}
				if !p.started {
					if e.Key == p.i {
						p.si = true
					} else {
						p.sj = true
					}
					p.started = p.si && p.sj
					continue
				}
				if e.Key == p.i {
					p.ni++
					p.d += st.stride(p.i)
				} else {
					p.nj++
					p.d -= st.stride(p.j)
				}
				p.minD, p.maxD = math.Min(p.minD, p.d), math.Max(p.maxD, p.d)
				bound := st.stride(p.i) + st.stride(p.j) + Tol*float64(2+p.ni+p.nj)
				if !p.reported && (p.d-p.minD > bound || p.maxD-p.d > bound) {
					p.reported = true
					out = append(out, Violation{Check: "lag", Op: e.Op, Serve: e.Serve,
						Msg: fmt.Sprintf("%q (w %g) and %q (w %g), both servable since op #%d: served %d and %d times since both were served once; swing %.6g > bound %.6g",
							p.i, st.w(p.i), p.j, st.w(p.j), p.startOp, p.ni, p.nj, math.Max(p.d-p.minD, p.maxD-p.d), bound)})
				}
			}
		}
	}
	return out
}

// CheckBatchInvariance: dequeue(N) == N x dequeue(1) (docs/design.md
// section 7, guarantee 4), on a driver that can probe (the model clones
// itself).
//
// Statement. When a call of N >= 2 starts with the flag on, nothing
// awaiting discovery, and every due delayed run fits in the promotion of
// a call of 1 (at most ScanLimit due variants, each with at most its
// share of the call's promotion), it serves the same runs, in the same order, with the same
// attempts, as N calls of dequeue(1) from the same state.
func CheckBatchInvariance(h *History) []Violation {
	var out []Violation
	var probe *Event
	var got []Served
	for i := range h.Events {
		e := h.Events[i]
		switch e.Kind {
		case EvProbe:
			probe, got = &h.Events[i], nil
		case EvServe:
			got = append(got, Served{Key: e.Key, ID: e.ID, Attempt: e.Attempt})
		case EvCallEnd:
			if probe != nil && !sameServes(probe.Singles, got) {
				out = append(out, Violation{Check: "batch", Op: e.Op, Serve: e.Serve,
					Msg: fmt.Sprintf("dequeue(%d) served %v; %d x dequeue(1) serve %v", probe.MaxCount, got, probe.MaxCount, probe.Singles)})
			}
			probe = nil
		}
	}
	return out
}

func sameServes(a, b []Served) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// CheckReachability: every servable key is served within a bounded number
// of calls (docs/design.md section 7, guarantee 5), whatever expired,
// drained, flipped or lost its state before.
//
// Statement. Count, for a key k, the flag-on dequeue calls with capacity
// (the env and queue limits leave room) at whose start k is servable and
// which do not serve k; the count restarts when k is served (by any call)
// or stops being servable, and when the state expires or a probe finds it
// gone (every key is then found again at V, and the derivation below
// starts again from there). After a possible lapse (no probe: StateTTL/2
// without a certain write) the count goes on, and a wait breaks the bound
// only if it also breaks the bound of a fresh start (D = 0) counted from
// the lapse. It never exceeds
//
//	B = ceil(N/30) + 2 + A * (floor(D*W) + 1)
//
// where, over the calls counted: N is the most keys with ready runs at a
// call's start and A = N - 1; W the largest weight of a key servable at
// a call's start (at least 1);
// D the debt bound of k: an upper bound on its tag minus V, tracked by the
// oracle from what it saw (Event.Debt): 1/w (a stride, at the
// milli-weight) after a flag-on serve at weight w, max(previous, 2 + P)
// when it registers, 0 when the state
// expired while it had ready runs (it is discovered at V), and max(that,
// 2 + P) when, still undiscovered, a flag-on write moves its head (a
// promotion of a run due earlier than its ready ones: EvHeadMoved): it
// then registers by the newcomer rule and may wait in the lane behind the
// P before it, a round each, also when its wait began before.
//
// Why. Discovery reaches every untagged variant within ceil(N/30) + 1
// calls (the cursor moves 30 or more variants per call); once k has a tag
// at most V + D, each other key j can be served at most floor(D*w_j) + 1
// times before k, and a call with capacity that does not serve k serves
// another key (work conservation), so at most A*(floor(D*W)+1) such calls.
// The bound is loose on purpose: it catches starvation, not unfairness.
func CheckReachability(h *History) []Violation {
	type wait struct {
		calls    int
		n        int
		maxW     float64
		debt     float64
		reported bool
		// After a possible lapse: the calls, keys and weight since it,
		// judged against the bound of a fresh start (D = 0).
		lapsed bool
		since  int
		nF     int
	}
	st := newServability()
	debt := map[string]float64{}
	waits := map[string]*wait{}
	var out []Violation
	var callW float64
	var counting bool
	var callN int
	var atStart []string
	servedInCall := map[string]bool{}
	for _, e := range h.Events {
		st.apply(e)
		switch e.Kind {
		case EvRegister:
			debt[e.Key] = e.Debt
		case EvHeadMoved:
			// (an undiscovered key a flag-on write put in the lane: a wait
			// that began before keeps going, with the bound of the lane)
			debt[e.Key] = math.Max(debt[e.Key], e.Debt)
			if w := waits[e.Key]; w != nil {
				w.debt = math.Max(w.debt, e.Debt)
			}
		case EvReset, EvLapse:
			if e.Kind == EvReset || e.On {
				// The state is gone: every key is found again at V and the
				// tie order starts afresh, so the count restarts with the
				// derivation (scenario ResetWhileWaiting).
				for k := range debt {
					debt[k] = 0
				}
				clear(waits)
				continue
			}
			// It may be gone: a wait breaks the bound only if it breaks
			// both the one of the state that stayed and the one of a fresh
			// start counted from here.
			for _, w := range waits {
				w.lapsed, w.since, w.nF = true, 0, 0
			}
		case EvUnservable:
			delete(waits, e.Key)
		case EvCall:
			counting = e.On && e.Capacity > 0
			callN = e.N
			atStart = atStart[:0]
			clear(servedInCall)
			callW = 1
			if counting {
				for k := range st.servable {
					atStart = append(atStart, k)
					callW = math.Max(callW, st.w(k))
				}
			}
		case EvServe:
			delete(waits, e.Key)
			servedInCall[e.Key] = true
			if e.On {
				debt[e.Key] = stride(e.W)
			}
		case EvCallEnd:
			if !counting {
				continue
			}
			sort.Strings(atStart)
			for _, k := range atStart {
				if servedInCall[k] || !st.servable[k] {
					continue
				}
				w := waits[k]
				if w == nil {
					w = &wait{debt: debt[k]}
					waits[k] = w
				}
				w.calls++
				w.n = max(w.n, callN)
				w.maxW = math.Max(w.maxW, callW)
				a := max(w.n-1, 0)
				bound := (w.n+29)/30 + 2 + a*(int(math.Floor(w.debt*w.maxW+1e-9))+1)
				over := w.calls > bound
				if w.lapsed {
					w.since++
					w.nF = max(w.nF, callN)
					over = over && w.since > (w.nF+29)/30+2+max(w.nF-1, 0)
				}
				if over && !w.reported {
					w.reported = true
					out = append(out, Violation{Check: "reachability", Op: e.Op, Serve: e.Serve,
						Msg: fmt.Sprintf("%q servable and unserved for %d calls with capacity (bound %d: %d keys with work, debt %.4g, max weight %g)",
							k, w.calls, bound, w.n, w.debt, w.maxW)})
				}
			}
		}
	}
	return out
}

// CheckWorkConservation: a call serves all it may (docs/design.md section
// 7, guarantee 6).
//
// Statement. A flag-on call that starts with nothing awaiting discovery,
// no tag left behind by a flag-off drain (stale tags are cleaned up a
// bounded number per call, and a call may meet only those), no possible
// lapse of the state, and every due delayed run within its promotion,
// takes exactly min(maxCount, what the env and queue limits leave, the
// servable runs), the servable runs being each key's ready runs not past
// their TTL up to its key limit (a call sweeps those past it at its key's
// head: no take, EvExpire); when more than vtime.TTLLook are past it, the
// runs it takes past their TTL beyond those (deleted, not delivered)
// count, and when it delivered fewer for that and took again (Dequeue's
// second script call), it takes at least that many.
func CheckWorkConservation(h *History) []Violation {
	var out []Violation
	var call *Event
	for i := range h.Events {
		e := h.Events[i]
		switch e.Kind {
		case EvCall:
			call = nil
			if e.On && e.Clean && e.Certain {
				call = &h.Events[i]
			}
		case EvCallEnd:
			if call == nil {
				continue
			}
			want := min(call.Capacity, call.Expect)
			// (a call with runs past their TTL takes again when it
			// delivered none: at least the servable then)
			if e.N != want && !(call.Expiring && e.N > want) {
				out = append(out, Violation{Check: "work", Op: e.Op, Serve: e.Serve,
					Msg: fmt.Sprintf("dequeue(%d) served %d; capacity %d, servable runs %d: want %d",
						call.MaxCount, e.N, call.Capacity, call.Expect, want)})
			}
			call = nil
		}
	}
	return out
}

// CheckExactlyOnce: one holder per delivered run, and every run ends
// acked, dead-lettered or expired exactly once (docs/design.md section 7,
// guarantee 7).
//
// Statement. A run is served only while queued (never while held, never
// after it ended, never unknown), with attempt 1 + the times it was
// requeued; acking a held run succeeds; a nack requeues exactly when
// attempts remain and no dead letter was asked; lease recovery takes back
// exactly the held runs whose lease passed and the TTL sweep expires
// exactly the queued runs whose TTL passed (by count); at the end every
// run has ended.
func CheckExactlyOnce(h *History) []Violation {
	type life struct {
		state   runState
		attempt int
		key     string
	}
	runs := map[string]*life{}
	var out []Violation
	bad := func(e Event, format string, args ...any) {
		out = append(out, Violation{Check: "exactly-once", Op: e.Op, Serve: e.Serve, Msg: fmt.Sprintf(format, args...)})
	}
	terminal := func(e Event, id string, l *life, s runState) {
		if l.state == stAcked || l.state == stDead || l.state == stExpired {
			bad(e, "run %s ended twice", id)
		}
		l.state = s
	}
	for _, e := range h.Events {
		switch e.Kind {
		case EvEnqueue:
			if runs[e.ID] != nil {
				bad(e, "run %s queued twice", e.ID)
			}
			runs[e.ID] = &life{state: stReady, attempt: 1, key: e.Key}
		case EvServe:
			l := runs[e.ID]
			switch {
			case l == nil:
				bad(e, "served unknown run %s", e.ID)
				continue
			case l.state == stHeld:
				bad(e, "run %s served while held: two holders", e.ID)
			case l.state != stReady:
				bad(e, "run %s served after it ended", e.ID)
			}
			if l.key != e.Key {
				bad(e, "run %s of %q served as %q", e.ID, l.key, e.Key)
			}
			if e.Attempt != l.attempt {
				bad(e, "run %s served as attempt %d, want %d", e.ID, e.Attempt, l.attempt)
			}
			if e.Expiring {
				if l.state == stReady {
					terminal(e, e.ID, l, stExpired)
				}
				continue
			}
			l.state = stHeld
		case EvAck:
			l := runs[e.ID]
			if e.Text != "" {
				bad(e, "ack of held run %s failed: %s", e.ID, e.Text)
				continue
			}
			if l == nil || l.state != stHeld {
				bad(e, "ack of %s succeeded but it was not held", e.ID)
				continue
			}
			terminal(e, e.ID, l, stAcked)
		case EvNack:
			l := runs[e.ID]
			if l == nil || l.state != stHeld {
				bad(e, "nack of %s succeeded but it was not held", e.ID)
				continue
			}
			if e.On != e.Eligible {
				bad(e, "nack of %s requeued=%v, want %v", e.ID, e.On, e.Eligible)
			}
			l.attempt++
			if e.On {
				l.state = stReady
			} else {
				terminal(e, e.ID, l, stDead)
			}
		case EvRecover:
			if e.N != len(e.IDs)+len(e.Dead) {
				bad(e, "lease recovery took back %d runs, %d were due", e.N, len(e.IDs)+len(e.Dead))
			}
			for _, id := range e.IDs {
				if l := runs[id]; l != nil {
					l.attempt++
					l.state = stReady
				}
			}
			for _, id := range e.Dead {
				if l := runs[id]; l != nil {
					l.attempt++
					terminal(e, id, l, stDead)
				}
			}
		case EvExpire:
			if e.N != len(e.IDs) {
				bad(e, "TTL sweep expired %d runs, %d were due", e.N, len(e.IDs))
			}
			for _, id := range e.IDs {
				if l := runs[id]; l != nil {
					terminal(e, id, l, stExpired)
				}
			}
		case EvEnd:
			if len(e.IDs) > 0 {
				bad(e, "%d runs never ended (queue did not drain): %v", len(e.IDs), head(e.IDs, 10))
			}
		case EvError:
			bad(e, "driver error: %s", e.Text)
		}
	}
	return out
}

func head(s []string, n int) []string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// CheckClock: V never decreases while the scheduler state exists
// (docs/design.md section 6, one lifetime).
//
// Statement. Between two reads of V with no whole-state expiry in between
// (ExpireState, or a StateProber finding none of the state left, or, on a
// driver without one, StateTTL/2 without a certain scheduler write: a
// flag-on serve, registration or drain), the second read is not below the
// first. A V that restarts while part of the state lives (state expiring
// piece by piece) fails it.
func CheckClock(h *History) []Violation {
	var out []Violation
	last, has := 0.0, false
	for _, e := range h.Events {
		switch e.Kind {
		case EvReset, EvLapse:
			has = false
		case EvV:
			if has && e.W < last {
				out = append(out, Violation{Check: "clock", Op: e.Op, Serve: e.Serve,
					Msg: fmt.Sprintf("V went from %.17g down to %.17g with the state alive", last, e.W)})
			}
			last, has = e.W, true
		}
	}
	return out
}

// milliWeight is the milli-weight the scheduler holds for weight w
// (vtime.MilliWeightOf; a weight of 0 clears it: 1,000), so 2.0004 is
// 2,000 and 0.9996 is 1,000 (helper-195).
func milliWeight(w float64) int64 {
	if mw := vtime.MilliWeightOf(w); mw != 0 {
		return mw
	}
	return 1000
}

// stride is one serve at weight w in weight-1 serves, as the scheduler
// counts it: at its milli-weight.
func stride(w float64) float64 { return 1000 / float64(milliWeight(w)) }

// quantum is a newcomer's offset in the lane at weight w: one serve of its
// own, at most a weight-1 serve (vtime's quantum).
func quantum(w float64) float64 { return min(1, stride(w)) }
