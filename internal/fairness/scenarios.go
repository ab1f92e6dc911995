package fairness

import (
	"fmt"
	"time"
)

// Scenario is a scripted sequence that builds one of the states an audit
// found the scheduler starving keys in (docs/design.md section 8). The
// checks judge its history like any random one: a scenario asserts
// nothing itself.
type Scenario struct {
	Name string
	// Flip: needs a FlagFlipper. NaturalTTL: needs the state to run out
	// by its own TTL as the clock moves (miniredis). MaxCount: the largest
	// dequeue it makes (a driver must allow it).
	// Big: thousands of keys, for a real Redis only.
	Flip, NaturalTTL, Big bool
	Run                   func(o *Oracle) error
}

// script runs the steps of a scenario, stopping at the first error.
type script struct {
	o   *Oracle
	err error
}

func (s *script) enq(key string, n int, ttl time.Duration) {
	for i := 0; i < n && s.err == nil; i++ {
		_, s.err = s.o.Enqueue(key, 0, 0, ttl)
	}
}

// topUp keeps key at n ready runs or more.
func (s *script) topUp(key string, n int) {
	if r := s.o.Ready(key); r < n {
		s.enq(key, n-r, 0)
	}
}

// deq runs one call and acks what it served unless hold.
func (s *script) deq(n int, hold bool) []Served {
	if s.err != nil {
		return nil
	}
	var served []Served
	served, s.err = s.o.Dequeue(n)
	for _, x := range served {
		if !hold && s.err == nil {
			s.err = s.o.Ack(x.ID)
		}
	}
	return served
}

// backlogged runs calls dequeue calls of batch runs (acked), each after
// topping every one of keys up to 2 ready runs: keys that stay backlogged.
func (s *script) backlogged(calls, batch int, keys ...string) {
	for i := 0; i < calls && s.err == nil; i++ {
		for _, k := range keys {
			s.topUp(k, 2)
		}
		s.deq(batch, false)
	}
}

func (s *script) do(err error) {
	if s.err == nil {
		s.err = err
	}
}

// Scenarios are the audit's states, each as a script.
var Scenarios = []Scenario{
	{Name: "ExpiredNewcomers", Run: func(o *Oracle) error {
		// Three keys backlogged; 20 one-run keys arrive, queue behind one
		// another as newcomers, and expire unserved; an honest key arrives
		// and must not queue behind the expired ones (newcomer check:
		// served before any backlogged key gets more than 3 serves).
		s := &script{o: o}
		for _, k := range []string{"a", "b", "c"} {
			s.enq(k, 4, 0)
		}
		s.deq(3, false)
		for i := 0; i < 20; i++ {
			s.enq(fmt.Sprintf("u%d", i), 1, time.Second)
		}
		s.do(o.Advance(2 * time.Second))
		s.do(o.SweepTTL())
		s.enq("honest", 1, 0)
		s.backlogged(40, 1, "a", "b", "c")
		return s.err
	}},
	{Name: "AdversarialNames", Run: func(o *Oracle) error {
		// Every key holds one run; a tenant mints keys named "!..." (they
		// sort first) at twice the drain rate; an honest one-run key "h"
		// arrives: no key registered after h may be served before it
		// (newcomer-order check).
		s := &script{o: o}
		for i := 0; i < 6; i++ {
			s.enq(fmt.Sprintf("k%d", i), 1, 0)
		}
		s.enq("h", 1, 0)
		for i := 0; i < 30 && s.err == nil; i++ {
			s.enq(fmt.Sprintf("!%03d", 2*i), 1, 0)
			s.enq(fmt.Sprintf("!%03d", 2*i+1), 1, 0)
			s.deq(1, false)
		}
		return s.err
	}},
	{Name: "EqualCountsFlip", Flip: true, Run: func(o *Oracle) error {
		// Flag on: x (weight 0.001) is served once, its tag far ahead; flag
		// off: x drains (its tag stays, stale) and y arrives (no tag); flag
		// on again: as many stale tags as untagged keys. y must be reached
		// within a bounded number of calls (reachability check) while a and
		// b stay backlogged.
		s := &script{o: o}
		s.do(o.SetWeight("x", 0.001))
		s.enq("x", 2, 0)
		s.enq("a", 3, 0)
		s.enq("b", 3, 0)
		s.deq(3, false)
		s.do(o.SetFlag(false))
		for i := 0; i < 10 && o.Ready("x") > 0 && s.err == nil; i++ {
			s.deq(1, false)
		}
		s.enq("y", 1, 0)
		s.do(o.SetFlag(true))
		for i := 0; i < 40 && s.err == nil; i++ {
			s.topUp("a", 3)
			s.topUp("b", 3)
			s.deq(1, false)
		}
		return s.err
	}},
	{Name: "LaneAcrossFlip", Flip: true, Run: func(o *Oracle) error {
		// Flag on: b is served once (its tag moves past V), then c, e and
		// a arrive and queue in the newcomer lane, c at its head. Flag
		// off: age order serves c (it drains), e twice and a once; the
		// lane is the scheduler's and stays as it was. Flag on again: u arrives
		// and queues behind e and a, which still count as newcomers ahead
		// of it; calls of 10 serve b, e and a before u (first version of
		// the oracle: the flag-off serves ended e's and a's wait, so u had
		// P = 0 and this schedule read as a violation of its bound).
		s := &script{o: o}
		tick := func() { s.do(o.Advance(time.Millisecond)) } // runs age in enqueue order
		s.enq("b", 3, 0)
		s.deq(1, false)
		tick()
		s.enq("c", 1, 0)
		for i := 0; i < 4; i++ {
			tick()
			s.enq("e", 1, 0)
			if i < 3 {
				tick()
				s.enq("a", 1, 0)
			}
		}
		s.do(o.SetFlag(false))
		tick()
		s.enq("b", 8, 0)
		s.deq(6, false) // b, b, c, e, a, e: age order
		s.do(o.SetFlag(true))
		s.enq("u", 1, 0)
		for i := 0; i < 3 && s.err == nil; i++ {
			s.deq(10, false)
		}
		return s.err
	}},
	{Name: "ServedBeforeDiscovery", Flip: true, Run: func(o *Oracle) error {
		// From a random sequence (rapid seed 303203007562882286): flag on,
		// b is served once and keeps a backlog, its tag in the state. Flag
		// off: c and e arrive (after the state began: newcomers when
		// discovery finds them), each with a priority-9 run that a
		// flag-off call serves before b's older ones; both keep runs. Flag
		// on again: the first call's discovery puts c and e in the
		// newcomer lane, u arrives behind them, and calls of 10 serve b
		// several times before u (first version of the oracle: the
		// flag-off serves ended c's and e's wait, as if the scheduler
		// knew them, so u had P = 0 and b's third serve read as a
		// violation of its bound).
		s := &script{o: o}
		tick := func() { s.do(o.Advance(time.Millisecond)) } // runs age in enqueue order
		s.enq("b", 12, 0)
		s.deq(1, false)
		s.do(o.SetFlag(false))
		for _, k := range []string{"c", "e", "f"} {
			tick()
			if s.err == nil {
				_, s.err = o.Enqueue(k, 9, 0, 0)
			}
			s.enq(k, 3, 0)
		}
		s.deq(3, false) // the priority-9 runs
		s.do(o.SetFlag(true))
		s.deq(1, false)
		s.enq("u", 1, 0)
		for i := 0; i < 3 && s.err == nil; i++ {
			s.deq(10, false)
		}
		return s.err
	}},
	{Name: "ResetWhileWaiting", Run: func(o *Oracle) error {
		// From a random sequence (rapid seed 4865173080621460690): u1
		// registers behind a; the state expires; c, d, e and b register as
		// newcomers before discovery finds a and u1 (at V, after them);
		// they are served, then a; the state expires again and every key
		// is found at V once more, u1 last by name (all runs are equally
		// old). u1 waits 5 calls before the second reset and 4 after: the
		// reachability bound (8 here) holds on each side of the reset, and
		// a count across it would mix two starts (first version of the
		// check).
		s := &script{o: o}
		s.enq("a", 3, 0)
		s.enq("u1", 1, 0)
		s.enq("a", 12, 0)
		s.do(o.ExpireState())
		s.enq("a", 4, 0)
		s.enq("c", 2, 0)
		s.enq("d", 4, 0)
		s.enq("e", 2, 0)
		s.enq("b", 1, 0)
		s.enq("a", 2, 0)
		for i := 0; i < 4; i++ {
			s.deq(1, true)
		}
		s.enq("a", 4, 0)
		s.deq(1, true)
		s.enq("a", 5, 0)
		s.do(o.ExpireState())
		s.deq(1, true)
		s.enq("a", 4, 0)
		s.enq("u2", 1, 0)
		s.deq(1, true)
		s.enq("a", 4, 0)
		s.enq("b", 1, 0)
		for i := 0; i < 6 && s.err == nil; i++ {
			s.deq(1, true)
		}
		return s.err
	}},
	{Name: "GatedWindow", Run: func(o *Oracle) error {
		// Key limit 1: eight keys hold a run each and wait at their limit
		// with low tags; "old" has a backlog with the oldest heads; "owed"
		// arrives with no debt. Gated keys must leave the competition:
		// owed is served before old gets more than 3 serves (newcomer
		// check), whatever the window.
		s := &script{o: o}
		s.enq("old", 30, 0)
		s.do(o.Advance(time.Second))
		for i := 0; i < 8; i++ {
			s.enq(fmt.Sprintf("g%d", i), 2, 0)
		}
		s.do(o.SetLimits(Limits{Key: 1}))
		for i := 0; i < 9 && s.err == nil; i++ {
			for _, x := range s.deq(1, true) {
				if x.Key == "old" && s.err == nil {
					s.err = o.Ack(x.ID)
				}
			}
		}
		s.enq("owed", 3, 0)
		for i := 0; i < 20 && s.err == nil; i++ {
			for _, x := range s.deq(1, true) {
				if x.Key != "owed" && x.Key[0] != 'g' && s.err == nil {
					s.err = o.Ack(x.ID)
				}
			}
		}
		return s.err
	}},
	{Name: "OutagePastTTL", NaturalTTL: true, Run: func(o *Oracle) error {
		// a and b backlogged; x is served last and drains, its tag parked
		// above V; an outage longer than the state TTL follows, during
		// which the TTL sweeper still expires a run (y, a newcomer); then
		// x returns. The state must expire whole (clock check: V never
		// decreases while any of it exists) and x must not carry its old
		// tag into a fresh clock (reachability).
		s := &script{o: o}
		for i := 0; i < 20 && s.err == nil; i++ {
			s.topUp("a", 3)
			s.topUp("b", 3)
			s.deq(1, false)
		}
		s.enq("x", 1, 0)
		for i := 0; i < 10 && o.Ready("x") > 0 && s.err == nil; i++ {
			s.deq(1, false)
		}
		s.enq("y", 1, time.Minute)
		ttl := o.cfg.StateTTL
		s.do(o.Advance(ttl / 2))
		s.do(o.SweepTTL())
		s.do(o.Advance(ttl/2 + 30*time.Second))
		s.do(o.SweepTTL())
		s.enq("x", 3, 0)
		for i := 0; i < 40 && s.err == nil; i++ {
			s.topUp("a", 3)
			s.topUp("b", 3)
			s.deq(1, false)
		}
		return s.err
	}},
	{Name: "StaleCleanup10k", Flip: true, Big: true, Run: func(o *Oracle) error {
		// 10,000 keys registered with the flag on and drained with it off
		// leave 10,000 stale tags; with the flag on again, calls of 700
		// must succeed (exactly-once reports driver errors) and a fresh
		// key must be reached (reachability).
		s := &script{o: o}
		for i := 0; i < 10000 && s.err == nil; i++ {
			s.enq(fmt.Sprintf("s%d", i), 1, 0)
		}
		s.do(o.SetFlag(false))
		for i := 0; i < 30 && o.Queued() > 0 && s.err == nil; i++ {
			s.deq(700, false)
		}
		s.do(o.SetFlag(true))
		s.enq("fresh", 1, 0)
		for i := 0; i < 5 && s.err == nil; i++ {
			s.enq(fmt.Sprintf("t%d", i), 1, 0)
			s.deq(700, false)
		}
		return s.err
	}},
	{Name: "ExpiredChainSurvivor", Run: func(o *Oracle) error {
		// As ExpiredNewcomers, but one newcomer (c) registers behind the
		// chain of one-run keys and survives them: when they expire, c
		// keeps the tag the chain gave it, and an honest key arriving
		// next must not queue behind that tag (newcomer check: P counts
		// only c, so h is served before a or b gets more than 4 serves).
		s := &script{o: o}
		for _, k := range []string{"a", "b"} {
			s.enq(k, 4, 0)
		}
		s.deq(2, false)
		for i := 0; i < 15; i++ {
			s.enq(fmt.Sprintf("u%d", i), 1, time.Second)
		}
		s.enq("c", 1, 0)
		s.do(o.Advance(2 * time.Second))
		s.do(o.SweepTTL())
		s.enq("h", 1, 0)
		for i := 0; i < 40 && s.err == nil; i++ {
			s.topUp("a", 2)
			s.topUp("b", 2)
			s.deq(1, false)
		}
		return s.err
	}},
	{Name: "WeightRaised", Run: func(o *Oracle) error {
		// x is served once at weight 0.001 (a tag 1,000 serves ahead),
		// then its weight is corrected to 1 while x, y and z stay
		// backlogged: x owes at most one serve at its new weight, so y and
		// z are served at most twice each before x (CheckLag's
		// weight-change watch); before the fix x waited for 1,000.
		s := &script{o: o}
		s.do(o.SetWeight("x", 0.001))
		for _, k := range []string{"x", "y", "z"} {
			s.enq(k, 3, 0)
		}
		for i := 0; i < 4 && s.err == nil; i++ {
			if served := s.deq(1, false); len(served) == 1 && served[0].Key == "x" {
				break
			}
		}
		s.do(o.SetWeight("x", 1))
		s.backlogged(30, 1, "x", "y", "z")
		return s.err
	}},
	{Name: "WeightRaisedGated", Run: func(o *Oracle) error {
		// As WeightRaised, but x is at its key limit (1) when its weight is
		// corrected: served once at weight 0.001 and held, it is gated with
		// a tag 1,000 serves ahead. The change caps the gated tag; once
		// x's run is acked, x competes again and owes at most one serve at
		// weight 1, so y and z are served at most twice each before x
		// (CheckLag's gated watch). Without the cap x waits for 1,000.
		s := &script{o: o}
		s.do(o.SetLimits(Limits{Key: 1}))
		s.do(o.SetWeight("x", 0.001))
		for _, k := range []string{"x", "y", "z"} {
			s.enq(k, 3, 0)
		}
		var held string
		for i := 0; i < 4 && s.err == nil && held == ""; i++ {
			for _, x := range s.deq(1, true) {
				if x.Key == "x" {
					held = x.ID
				} else {
					s.do(o.Ack(x.ID))
				}
			}
		}
		for i := 0; i < 2 && s.err == nil; i++ { // x stays at its limit
			s.deq(1, false)
		}
		s.do(o.SetWeight("x", 1))
		if held != "" {
			s.do(o.Ack(held))
		}
		s.backlogged(30, 1, "x", "y", "z")
		return s.err
	}},
	{Name: "WeightRaisedParked", Run: func(o *Oracle) error {
		// As WeightRaised, but x has drained when its weight is corrected:
		// served once at weight 0.001, its tag, 1,000 serves ahead, is
		// parked. The change caps the parked tag; when x returns it owes at
		// most one serve at weight 1 (or registers as a newcomer, at most
		// 2 + P ahead), so y and z are served at most three times each
		// before x (CheckLag's parked watch). Without the cap x waits for
		// 1,000.
		s := &script{o: o}
		s.do(o.SetWeight("x", 0.001))
		s.enq("x", 1, 0)
		for _, k := range []string{"y", "z"} {
			s.enq(k, 3, 0)
		}
		for i := 0; i < 4 && s.err == nil && o.Ready("x") > 0; i++ {
			s.deq(1, false)
		}
		for i := 0; i < 2 && s.err == nil; i++ {
			s.topUp("y", 2)
			s.topUp("z", 2)
			s.deq(1, false)
		}
		s.do(o.SetWeight("x", 1))
		s.backlogged(30, 1, "x", "y", "z")
		return s.err
	}},
	{Name: "UnsaidRelease", Flip: true, Run: func(o *Oracle) error {
		// From a random sequence (rapid seed 2626902137343668273): key
		// limit 1; flag on, a call serves one run of each of four keys,
		// which are gated at their limit; flag off, the four runs are
		// acked, which frees their slots without telling the scheduler;
		// flag on again. The gated probe un-gates one key per call, so
		// the first calls serve fewer than they could (guarantee 6's
		// exception), and within a lap of four calls every key competes
		// again: from then on each call serves all four (work check),
		// and no key waits past its bounds (reachability check).
		s := &script{o: o}
		s.do(o.SetLimits(Limits{Key: 1}))
		keys := []string{"g0", "g1", "g2", "g3"}
		for _, k := range keys {
			s.enq(k, 4, 0)
		}
		held := s.deq(4, true)
		s.do(o.SetFlag(false))
		for _, x := range held {
			if s.err == nil {
				s.err = o.Ack(x.ID)
			}
		}
		s.do(o.SetFlag(true))
		s.backlogged(10, 4, keys...)
		return s.err
	}},
	{Name: "UnsaidReleaseRegated", Flip: true, Run: func(o *Oracle) error {
		// A review on a real Redis (2026-12-05): key limit 1; ten keys
		// g0..g9 held at their limit (gated), a call that serves nothing
		// (its probe looks at g0), then a flag-off ack frees g0's slot
		// without telling the scheduler. Three busy keys at their limit
		// are served one a call, held three calls, acked by the flag-on
		// instance (which un-gates them) and gated again at their next
		// serve: a new gating number at every call. The probe once went
		// on from the number it looked at last and went back to the first
		// only past the end; the busy keys' numbers always lay ahead, so
		// g0 was never served (reachability check). Now a key the probe
		// finds at its limit moves to the back, and g0 is probed within a
		// lap of the gated keys.
		s := &script{o: o}
		s.do(o.SetLimits(Limits{Key: 1}))
		for i := 0; i < 10; i++ {
			s.enq(fmt.Sprintf("g%d", i), 2, 0)
		}
		held := s.deq(10, true)
		s.deq(10, false) // nothing: every g at its limit
		s.do(o.SetFlag(false))
		for _, x := range held {
			if x.Key == "g0" && s.err == nil {
				s.err = o.Ack(x.ID)
			}
		}
		s.do(o.SetFlag(true))
		type hold struct {
			id, key string
			call    int
		}
		var hs []hold
		for _, k := range []string{"c0", "c1", "c2"} {
			s.enq(k, 4, 0)
		}
		for call := 0; call < 60 && s.err == nil; call++ {
			for len(hs) > 0 && hs[0].call+3 <= call && s.err == nil {
				s.err = o.Ack(hs[0].id)
				s.enq(hs[0].key, 1, 0)
				hs = hs[1:]
			}
			for _, x := range s.deq(1, true) {
				if x.Key != "g0" {
					hs = append(hs, hold{x.ID, x.Key, call})
				}
			}
		}
		return s.err
	}},
	{Name: "HeavyNewcomers", Run: func(o *Oracle) error {
		// Six weight-1 keys stay backlogged. A fresh key of weight 8
		// registers with the lane empty: one serve of its own behind the
		// pack (a lane tag at most V + 2/8), so no backlogged key is
		// served twice before it (CheckNewcomer's quantum, not the
		// weight-1 bound of 2 quanta that would allow three serves each).
		// It drains, and once the backlogged keys were served 3 times
		// each it comes again (no debt: through the lane, its parked tag
		// passed). Then three fresh keys at once, weights 4, 1 and 8 (the
		// later ones behind the lane's head).
		s := &script{o: o}
		keys := []string{"a", "b", "c", "d", "e", "f"}
		s.backlogged(4, 2, keys...)
		s.do(o.SetWeight("h8", 8))
		s.enq("h8", 3, 0)
		s.backlogged(30, 1, keys...)
		s.enq("h8", 2, 0)
		s.backlogged(12, 1, keys...)
		s.do(o.SetWeight("h4", 4))
		s.do(o.SetWeight("g8", 8))
		s.enq("h4", 2, 0)
		s.enq("w1", 2, 0)
		s.enq("g8", 2, 0)
		s.backlogged(30, 1, keys...)
		return s.err
	}},
	{Name: "RoundedWeights", Run: func(o *Oracle) error {
		// Weights that are not whole milli-weights: the scheduler holds
		// 0.0014 as 0.001 (a serve costs 1,000 weight-1 serves) and 0.0016
		// as 0.002 (500), so b, backlogged at weight 1, is served 1,000
		// times between a's serves and 500 between c's. Every check reads
		// the weight as the scheduler does; one that read the raw weight
		// (a serve of a 714 weight-1 serves) flagged this fair schedule.
		s := &script{o: o}
		s.do(o.SetWeight("a", 0.0014))
		s.do(o.SetWeight("c", 0.0016))
		s.enq("a", 2, 0)
		s.enq("c", 3, 0)
		s.enq("b", 1100, 0)
		for i := 0; i < 111 && s.err == nil; i++ {
			s.deq(10, false)
		}
		return s.err
	}},
}
