package vtimetest

import (
	"fmt"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/vtime"
)

// op is one operation of a random flag-on workload.
type op struct {
	kind  int
	key   string
	prio  int
	delay int64
	n     int
	pick  int
	kill  bool
	w     float64
}

const (
	opEnqueue = iota
	opDequeue
	opAck
	opNack
	opWeight
	opAdvance
)

func drawOp(rt *rapid.T, nkeys int) op {
	k := rapid.IntRange(0, 99).Draw(rt, "op")
	o := op{key: vpKey(rapid.IntRange(0, nkeys-1).Draw(rt, "key")), pick: rapid.IntRange(0, 1000).Draw(rt, "pick")}
	switch {
	case k < 40:
		o.kind = opEnqueue
		o.prio = rapid.SampledFrom([]int{0, 0, 0, 1, 9}).Draw(rt, "prio")
		o.delay = int64(rapid.SampledFrom([]int{0, 0, 0, 5, 40}).Draw(rt, "delay"))
		o.n = rapid.IntRange(1, 3).Draw(rt, "runs")
	case k < 70:
		o.kind = opDequeue
		o.n = rapid.IntRange(1, 6).Draw(rt, "maxCount")
	case k < 82:
		o.kind = opAck
	case k < 89:
		o.kind = opNack
		o.delay = int64(rapid.SampledFrom([]int{0, 0, 3, 30}).Draw(rt, "retry"))
		o.kill = rapid.IntRange(0, 9).Draw(rt, "kill") == 0
	case k < 93:
		o.kind = opWeight
		o.w = rapid.SampledFrom([]float64{0, 0.01, 0.5, 2, 3, 100}).Draw(rt, "weight")
	default:
		o.kind = opAdvance
		o.delay = int64(rapid.IntRange(1, 45).Draw(rt, "advance"))
	}
	return o
}

// runner applies ops to one driver, keeping the runs it holds.
type runner struct {
	d     Driver
	held  map[string]Run
	still bool // the caller moves the clock, not the dequeues
}

func newRunner(d Driver, still bool) *runner {
	return &runner{d: d, held: map[string]Run{}, still: still}
}

func (r *runner) pickHeld(o op) (Run, bool) {
	ids := make([]string, 0, len(r.held))
	for id := range r.held {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	if len(ids) == 0 {
		return Run{}, false
	}
	return r.held[ids[o.pick%len(ids)]], true
}

// apply runs o and returns what a dequeue served, as key/id/attempt.
func (r *runner) apply(t T, o op) []string {
	d := r.d
	switch o.kind {
	case opEnqueue:
		enq(t, d, o.key, o.n, o.delay, o.prio)
	case opDequeue:
		runs := d.Dequeue(t, o.n)
		if !r.still {
			d.Advance(1)
		}
		for _, run := range runs {
			r.held[run.ID] = run
		}
		return strs(runs)
	case opAck:
		if run, ok := r.pickHeld(o); ok {
			d.Ack(t, run)
			delete(r.held, run.ID)
		}
	case opNack:
		if run, ok := r.pickHeld(o); ok {
			d.Nack(t, run, d.Now()+o.delay, o.kill)
			delete(r.held, run.ID)
		}
	case opWeight:
		d.SetWeight(t, o.key, o.w)
	case opAdvance:
		if !r.still {
			d.Advance(o.delay)
		}
	}
	return nil
}

// servable reports whether variant member vm can be served now: ready
// runs, below the key limit.
func servable(t T, d Driver, vm string, keyLimit int) bool {
	k := keyOf(t, vm)
	if d.Ready(t, k) == 0 {
		return false
	}
	if keyLimit <= 0 {
		return true
	}
	return d.InFlight(t, k) < keyLimit
}

// schedulerState is what the flag-on scheduler keeps, with the parked tags
// at or below V left out (see BatchInvarianceObserved).
func schedulerState(t T, d Driver) string {
	st := d.Snapshot(t)
	var idle []vtime.Entry
	for _, e := range Idle(st) {
		if e.Score*vtime.Unit > float64(st.V) {
			idle = append(idle, e)
		}
	}
	ck, delay := d.Indexes(t)
	return fmt.Sprintf("V %v cursor %d\ntags %v\nidle %v\nckIndex %v\ndelayIndex %v",
		st.V, st.Cursor, Tags(st), idle, ck, delay)
}

// BatchInvarianceObserved: two queues get the same random operations; then
// one serves dequeue(N), the other N x dequeue(1). Under the conditions of
// vtime/doc.go as seen from outside (at every serve the first
// 2*WindowMultiplier tags hold a servable variant; no discovery pending)
// and the one it omits (the first call of 1 promotes every due run, see
// vtime.TestPromotion and TestPropBatchInvariance), they serve the same runs in
// the same order and keep the same scheduler state.
func BatchInvarianceObserved(rt *rapid.T, f Factory) {
	wm := rapid.IntRange(1, 3).Draw(rt, "wm")
	keyLimit := rapid.SampledFrom([]int{0, 0, 1, 2}).Draw(rt, "keyLimit")
	queueLimit := rapid.SampledFrom([]int{0, 0, 4}).Draw(rt, "queueLimit")
	cfg := Config{WM: wm, Quantum: rapid.SampledFrom([]float64{1, 0.3}).Draw(rt, "quantum"),
		IdleMax: rapid.SampledFrom([]int{10000, 2}).Draw(rt, "idleMax"),
		Limits:  vtime.Limits{Key: keyLimit, Queue: queueLimit}}
	// Both queues share one clock: every operation goes to both at the
	// same time, then the clock moves.
	da, db := f.Pair(rt, cfg)
	a, b := newRunner(da, true), newRunner(db, true)
	nkeys := rapid.IntRange(1, 6).Draw(rt, "keys")
	for i := rapid.IntRange(0, 20).Draw(rt, "prefix"); i > 0; i-- {
		o := drawOp(rt, nkeys)
		require.Equal(rt, a.apply(rt, o), b.apply(rt, o))
		if o.kind == opAdvance {
			da.Advance(o.delay)
		}
		da.Advance(1)
	}
	n := rapid.IntRange(2, 8).Draw(rt, "N")
	now := db.Now()
	_, delay := db.Indexes(rt)
	due := 0
	for _, e := range delay {
		if e.Score <= float64(now) {
			due++
		}
	}
	// The first call of 1 promotes them all, as the call of N does: at
	// most ScanLimit (default 30) due variants, each given all of its due
	// runs by the call's plan (vtime.PromotePlanWeighted, PromoteLimit
	// 100, those at the key limit held, the first pass by weight).
	perVariant := map[string]int{}
	snap := db.Snapshot(rt)
	for _, r := range snap.Runs {
		if r.Delayed && r.At <= now {
			perVariant[keys.VariantMember(r.Key)]++
		}
	}
	var dueRuns []int
	var held []bool // at the key limit: the others take again what such a variant takes
	var milli []int64
	for _, e := range delay {
		if e.Score <= float64(now) {
			dueRuns = append(dueRuns, perVariant[e.Member])
			held = append(held, keyLimit > 0 && db.InFlight(rt, keyOf(rt, e.Member)) >= keyLimit)
			w, ok := snap.Weights[e.Member]
			if !ok {
				w = 1000
			}
			milli = append(milli, w)
		}
	}
	ok := due <= 30
	plan, _ := vtime.PromotePlanWeighted(100, 1, dueRuns, held, milli)
	for i := range dueRuns {
		ok = ok && plan[i] == dueRuns[i]
	}
	batch := a.apply(rt, op{kind: opDequeue, n: n})
	var singles []string
	for i := 0; i < n; i++ {
		if queueLimit == 0 || db.InFlight(rt, "") < queueLimit {
			tags := Tags(db.Snapshot(rt))
			found := false
			for k := 0; k < len(tags) && k < 2*wm; k++ {
				found = found || servable(rt, db, tags[k].Member, keyLimit)
			}
			ck, _ := db.Indexes(rt)
			ok = ok && found && len(ck) == len(tags)
		}
		singles = append(singles, b.apply(rt, op{kind: opDequeue, n: 1})...)
	}
	da.Advance(1)
	if !ok {
		return
	}
	require.Equal(rt, singles, batch, "dequeue(%d) vs %d x dequeue(1)", n, n)
	require.Equal(rt, schedulerState(rt, db), schedulerState(rt, da), "state after dequeue(%d) vs %d x dequeue(1)", n, n)
}

// ReachabilityServed: variants written by a flag-off instance (work but no
// tag; more of them than the window), next to keys registered by flag-on
// enqueues, are each served within ceil(variants/maxCount)+2 calls.
func ReachabilityServed(rt *rapid.T, f Factory) {
	wm := rapid.IntRange(1, 3).Draw(rt, "wm")
	maxCount := rapid.IntRange(1, 5).Draw(rt, "maxCount")
	d := f.New(rt, Config{WM: wm})
	tagged := rapid.IntRange(0, 2).Draw(rt, "tagged")
	for i := 0; i < tagged; i++ {
		enq(rt, d, fmt.Sprintf("t%d", i), 10, 0, 0)
	}
	// More than the window, and often more than the age-order scan (30).
	untagged := rapid.IntRange(maxCount*wm+1, 45).Draw(rt, "untagged")
	keyByKey := rapid.Bool().Draw(rt, "keyByKey")
	t0 := d.Now() - 3_600_000 // an hour ago
	for i := 0; i < untagged; i++ {
		for j := rapid.IntRange(1, 2).Draw(rt, "runs"); j > 0; j-- {
			at := t0 + int64(rapid.IntRange(0, 1000).Draw(rt, "age"))
			if keyByKey {
				at = t0 + int64(100*i+j)
			}
			d.EnqueueFlagOff(rt, fmt.Sprintf("u%02d", i), at)
		}
	}
	variants := tagged + untagged
	bound := (variants+maxCount-1)/maxCount + 2
	first := map[string]int{}
	for call := 1; call <= bound; call++ {
		runs := deq(rt, d, maxCount)
		for _, r := range runs {
			if _, ok := first[r.Key]; !ok {
				first[r.Key] = call
			}
		}
		ack(rt, d, runs...)
		for i := 0; i < tagged; i++ {
			topUp(rt, d, fmt.Sprintf("t%d", i), 5)
		}
	}
	for i := 0; i < untagged; i++ {
		k := fmt.Sprintf("u%02d", i)
		_, ok := first[k]
		require.True(rt, ok, "%s not served within %d calls (%d variants, maxCount %d, window multiplier %d)",
			k, bound, variants, maxCount, wm)
	}
}

// capacity is what the queue limit leaves of maxCount.
func capacity(t T, d Driver, l vtime.Limits, maxCount int) int {
	c := maxCount
	if l.Queue > 0 {
		c = min(c, l.Queue-d.InFlight(t, ""))
	}
	return c
}

// ReachabilityDiscovery is guarantee 5's discovery bound. With ScanLimit S
// above maxCount M, every untagged variant with ready work whose head
// stays put is registered within ceil(variants/(S-M))+1 calls with
// capacity, whatever the serves of other variants (which move their heads
// past it or drain them), flag-on writes and flag-off enqueues do
// meanwhile (the count starts over when the state expires, the cursor
// with it). variants is the most variants the calls' indexes held (due
// delayed variants counted). TTL sweeps and flag-off dequeues, which the
// doc gives a lap each, are left out. done fails the test when no check
// saw a registration.
func ReachabilityDiscovery() (check func(*rapid.T, Factory), done func(testing.TB)) {
	checked, tight := 0, 0
	check = func(rt *rapid.T, f Factory) {
		scan := rapid.IntRange(2, 8).Draw(rt, "scanLimit")
		maxM := rapid.IntRange(1, scan-1).Draw(rt, "maxCount")
		limits := vtime.Limits{
			Key:   rapid.SampledFrom([]int{0, 0, 0, 1, 2}).Draw(rt, "keyLimit"),
			Queue: rapid.SampledFrom([]int{0, 0, 0, 6}).Draw(rt, "queueLimit"),
		}
		d := f.New(rt, Config{ScanLimit: scan, PromoteLimit: 1, MaxAttempts: -1, Limits: limits})
		base := d.Now() - 1000
		score := func(label string) int64 { return int64(rapid.IntRange(0, 1000).Draw(rt, label)) }
		// Registered variants whose heads move when served, and untagged
		// ones (flag-off writes) whose heads stay put.
		nreg := rapid.IntRange(1, 8).Draw(rt, "registered")
		for i := 0; i < nreg; i++ {
			for j := rapid.IntRange(1, 6).Draw(rt, "runs"); j > 0; j-- {
				d.Enqueue(rt, fmt.Sprintf("r%d", i), 0, base+score("at"))
			}
		}
		untagged := 0
		flagOff := func() {
			d.EnqueueFlagOff(rt, fmt.Sprintf("u%d", untagged), base+score("at"))
			untagged++
		}
		for i := rapid.IntRange(1, 12).Draw(rt, "untagged"); i > 0; i-- {
			flagOff()
		}
		type track struct {
			head     float64
			calls    int
			variants int
		}
		tracked := map[string]*track{}
		bound := func(tr *track) int { return (tr.variants+scan-maxM-1)/(scan-maxM) + 1 }
		// reach counts the variants a call's discovery may see: ckIndex and
		// the due delayed variants.
		reach := func() int {
			seen := map[string]bool{}
			ck, delay := d.Indexes(rt)
			for _, e := range ck {
				seen[e.Member] = true
			}
			for _, e := range delay {
				if e.Score <= float64(d.Now()) {
					seen[e.Member] = true
				}
			}
			return len(seen)
		}
		held := map[string]Run{}
		pickInFlight := func() (Run, bool) {
			ids := make([]string, 0, len(held))
			for id := range held {
				ids = append(ids, id)
			}
			if len(ids) == 0 {
				return Run{}, false
			}
			sort.Strings(ids)
			r := held[ids[rapid.IntRange(0, len(ids)-1).Draw(rt, "which")]]
			delete(held, r.ID)
			return r, true
		}
		for i := rapid.IntRange(1, 150).Draw(rt, "ops"); i > 0; i-- {
			// Track the untagged variants with ready work; a head that moved
			// starts over.
			reg := d.Snapshot(rt).Reg
			ck, _ := d.Indexes(rt)
			for _, e := range ck {
				if _, ok := reg[e.Member]; ok {
					delete(tracked, e.Member)
					continue
				}
				if tr, ok := tracked[e.Member]; !ok || tr.head != e.Score {
					tracked[e.Member] = &track{head: e.Score}
				}
			}
			k := rapid.IntRange(0, 99).Draw(rt, "op")
			serve := func(n int) {
				for _, r := range d.Dequeue(rt, n) {
					held[r.ID] = r
				}
			}
			switch {
			case k < 55:
				n := rapid.IntRange(1, maxM).Draw(rt, "n")
				if capacity(rt, d, limits, n) <= 0 {
					serve(n)
					continue
				}
				v := reach()
				for _, tr := range tracked {
					tr.variants = max(tr.variants, v)
				}
				serve(n)
			case k < 70:
				if r, ok := pickInFlight(); ok {
					d.Ack(rt, r)
				}
				continue
			case k < 80:
				key := fmt.Sprintf("r%d", rapid.IntRange(0, nreg-1).Draw(rt, "key"))
				d.Enqueue(rt, key, 0, score("at")+d.Now()-1000)
				continue
			case k < 88:
				flagOff()
				continue
			case k < 93:
				if r, ok := pickInFlight(); ok {
					d.Nack(rt, r, d.Now()+int64(rapid.IntRange(-1000, 50).Draw(rt, "retry")), false)
				}
				continue
			case k < 97:
				d.Advance(int64(rapid.IntRange(1, 50).Draw(rt, "advance")))
				continue
			default:
				d.ExpireState(rt)
				clear(tracked) // the cursor expires with the state: the count starts over
				continue
			}
			reg = d.Snapshot(rt).Reg
			ck, _ = d.Indexes(rt)
			ready := map[string]bool{}
			for _, e := range ck {
				ready[e.Member] = true
			}
			for v, tr := range tracked {
				tr.calls++
				if _, ok := reg[v]; ok || !ready[v] {
					if ok {
						checked++
						if tr.calls == bound(tr) {
							tight++
						}
					}
					require.LessOrEqual(rt, tr.calls, bound(tr), "%s registered after %d calls (variants %d)", v, tr.calls, tr.variants)
					delete(tracked, v)
					continue
				}
				require.Less(rt, tr.calls, bound(tr), "%s untagged after %d calls (variants %d, ScanLimit %d, maxCount %d)",
					v, tr.calls, tr.variants, scan, maxM)
			}
		}
	}
	done = func(t testing.TB) {
		t.Logf("reachability: %d registrations checked, %d at the bound", checked, tight)
		require.Positive(t, checked)
	}
	return check, done
}

// WorkConservation: when the age-order scan (ScanLimit, default
// max(30, 3*maxCount)) covers every variant with work, a call serves
// min(capacity, servable) runs.
func WorkConservation(rt *rapid.T, f Factory) {
	wm := rapid.IntRange(1, 3).Draw(rt, "wm")
	keyLimit := rapid.SampledFrom([]int{0, 0, 1, 2}).Draw(rt, "keyLimit")
	queueLimit := rapid.SampledFrom([]int{0, 0, 4, 9}).Draw(rt, "queueLimit")
	d := f.New(rt, Config{WM: wm, Limits: vtime.Limits{Key: keyLimit, Queue: queueLimit}})
	r := newRunner(d, false)
	nkeys := rapid.IntRange(1, 8).Draw(rt, "keys")
	for i := rapid.IntRange(1, 30).Draw(rt, "ops"); i > 0; i-- {
		o := drawOp(rt, nkeys)
		if o.kind != opDequeue {
			r.apply(rt, o)
			continue
		}
		servable, variants := servableRuns(rt, d, keyLimit)
		capacity := o.n
		if queueLimit > 0 {
			capacity = max(0, min(capacity, queueLimit-d.InFlight(rt, "")))
		}
		got := len(r.apply(rt, o))
		if variants <= max(30, 3*o.n) { // the age-order scan covers every variant
			require.Equal(rt, min(capacity, servable), got, "maxCount %d, capacity %d, servable %d", o.n, capacity, servable)
		}
	}
}

// servableRuns counts what a call may serve now: per variant, its ready
// runs plus its due delayed runs, up to its key limit.
func servableRuns(t T, d Driver, keyLimit int) (servable, variants int) {
	now := d.Now()
	members := map[string]bool{}
	ck, delay := d.Indexes(t)
	for _, e := range ck {
		members[e.Member] = true
	}
	for _, e := range delay {
		if e.Score <= float64(now) {
			members[e.Member] = true
		}
	}
	for m := range members {
		k := keyOf(t, m)
		room := d.Ready(t, k) + d.Delayed(t, k, now)
		if keyLimit > 0 {
			room = min(room, keyLimit-d.InFlight(t, k))
		}
		servable += max(room, 0)
	}
	return servable, len(members)
}
