package fairness

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/vtime"
)

// Config tells an Oracle what it cannot observe: the backend's settings.
type Config struct {
	Lease       time.Duration // lease of a dequeued run
	MaxAttempts int           // deliveries before dead letter; 0: no limit
	// StateTTL, when the scheduler state can run out on its own as the
	// driver's clock moves (miniredis with FastForward). A driver that is
	// a StateProber is asked after every clock move whether the state
	// still exists; for any other, the oracle assumes the state may be
	// gone StateTTL/2 after the last certain scheduler write (a state may
	// refresh its TTL lazily, once half of it has passed). 0: the state
	// only goes by ExpireState.
	StateTTL     time.Duration
	PromoteLimit int // due runs one call promotes per variant; 0: 100
	// ScanLimit is how many due variants one call promotes (and how many
	// variants it reads in age order); 0: max(30, 3*maxCount).
	ScanLimit int
	// VEvery > 0 reads V only after every VEvery-th dequeue call (and
	// after each ExpireState); 0: after every operation; < 0: never (a
	// read may cost one round trip per key). V moves only when
	// a call serves or the state goes, so reading after calls loses no
	// decrease, only its exact moment.
	VEvery int
}

type runState uint8

const (
	stReady runState = iota + 1
	stDelayed
	stHeld
	stAcked
	stDead
	stExpired
)

type opTime struct {
	op  int
	now time.Duration
}

type orun struct {
	id, key  string
	priority int
	at       time.Duration // available at
	state    runState
	attempt  int           // attempt of the next delivery
	ttl      time.Duration // TTL deadline while never dequeued; 0 none
	lease    time.Duration // lease deadline while held
}

type okey struct {
	name            string
	ready, held     int
	delayed         map[string]*orun
	servable        bool
	room            int // servable runs: ready, up to the key limit
	weight          float64
	suspect         bool
	stale           bool
	outOfLane       bool // stale, and a lane probe found it out of the lane (staleInLane)
	everReady       bool
	resetSinceReady bool
	drainServe      int // serve index of the serve that drained it; -1: not by a flag-on serve at weight 1 or more
	pending         bool
	debt            float64
	// offNew: it registered with the flag off after the state's first
	// discovery read may have set b, or, undiscovered, it gained a ready
	// run since then (either flag) that may be or become its head (a
	// priority, a nack, a later run that flag-off serves bring to the
	// head): discovery may find it as a newcomer and put it in the lane
	// (docs/design.md, Discovery), whatever flag-off calls served
	// meanwhile.
	offNew bool
	// unsaid: a flag-off operation freed a slot of the key while it was
	// at its key limit, so the scheduler may hold it gated below its
	// limit until the gated probe reaches it (see Oracle.unsaid).
	unsaid bool
}

// Oracle drives a Driver and records what it observes in a History: every
// serve with what the oracle knows at that moment (which keys are
// servable, awaiting discovery, their weights, when each registered). It
// knows the runs it queued and what became of them, never the scheduler's
// tags: the checks (checks.go) judge the guarantees on the observed
// schedule alone.
type Oracle struct {
	// callExpired: the runs the current dequeue call took past their TTL:
	// each holds its key's slot until the call ends (see serve).
	callExpired []*orun

	d      Driver
	cfg    Config
	H      History
	now    time.Duration
	flagOn bool
	limits Limits
	nextID int

	runs      map[string]*orun
	keys      map[string]*okey
	keyOrder  []string
	held      int
	withReady int // keys with ready runs
	room      int // sum of the keys' room
	suspects  int
	stales    int // keys drained by a flag-off operation: their tags may be stale
	// unsaid counts the keys marked unsaid; probes, the flag-on calls with
	// capacity since the last such release. The gated probe looks at one
	// gated key per such call, each within a lap of as many calls as there
	// are gated keys (docs/design.md, guarantee 6): after len(keys) of
	// them every such key has been looked at.
	unsaid   int
	probes   int
	pendingN int // keys pending: registered, not served by a flag-on call since
	delayedK map[string]*okey

	// batchRegs, while above 0, is how many keys register in the current
	// batch (a lease recovery sweep, a call's promotion), in an order the
	// oracle does not choose: each may queue behind all the others, so
	// each gets P = batchBase + batchRegs - 1.
	batchRegs, batchBase int

	// mark is the cold mark the scheduler may hold (-1: none): the time
	// the last of the due variants fell due at a flag-on promotion cut
	// short by ScanLimit (docs/design.md section 6, Registration, Cold
	// mark). The scripts set it only on a cold state (the lane empty, no
	// tag above V), which the oracle, not knowing tags, cannot tell: it
	// takes every cut as one that may have set it (an upper bound). A key
	// whose first due run is at or before it may register at V when a
	// later promotion reaches it, so it counts as registered when that
	// run fell due (guarantee 10), for CheckNewcomerOrder (its DueOp).
	// (Not in the P of a newcomer that registers meanwhile: a key the
	// mark registers at V starts at or above the V at which the newcomer
	// registered and pushes no newcomer's tag back, which CheckNewcomer's
	// bound on each other key's serves already covers.)
	mark time.Duration
	// markFound, during a promotion, is the reached keys whose first due
	// run is at or before the mark as the call read it, with the
	// operation at which that run fell due (Event.DueOp).
	markFound map[string]int
	// clock is the time after each clock move, with its operation.
	clock []opTime

	lastWrite time.Duration // last certain scheduler write
	lapsed    bool          // no certain write for StateTTL/2 since lastWrite
	dirty     bool          // a certain write since the state last went
	// bMay: a flag-on dequeue since the state last went: its discovery
	// read may have set the state's b (only a flag-on dequeue reads
	// ckIndex for discovery; a key written with the flag off before b,
	// all of whose work is that old, registers at V whenever found).
	bMay      bool
	finishing bool // Finish is draining: no batch probes (each replays the history)
	op        int

	// serve log for the eligibility rule: key, weight 1, flag on
	serveKey []string
	serveW1  []bool
}

// New returns an oracle on d, flag on, no limits.
func New(d Driver, cfg Config) *Oracle {
	if cfg.PromoteLimit == 0 {
		cfg.PromoteLimit = 100
	}
	return &Oracle{d: d, cfg: cfg, flagOn: true, runs: map[string]*orun{}, keys: map[string]*okey{},
		delayedK: map[string]*okey{}, H: History{ScanMin: 30}, mark: -1}
}

// Now is the time since the oracle started.
func (o *Oracle) Now() time.Duration { return o.now }

// Config returns the oracle's configuration.
func (o *Oracle) Config() Config { return o.cfg }

func (o *Oracle) emit(e Event) {
	e.Op, e.Serve = o.op, o.H.Serves
	o.H.Events = append(o.H.Events, e)
}

func (o *Oracle) key(name string) *okey {
	k, ok := o.keys[name]
	if !ok {
		k = &okey{name: name, weight: 1, drainServe: -1, delayed: map[string]*orun{}}
		o.keys[name] = k
		o.keyOrder = append(o.keyOrder, name)
	}
	return k
}

// begin starts an operation: the lapse rule runs first, since the clock
// may have moved past StateTTL since the last write.
func (o *Oracle) begin(format string, args ...any) {
	o.op++
	o.H.Ops++
	o.emit(Event{Kind: EvOp, Text: fmt.Sprintf(format, args...)})
	o.checkLapse(false)
}

// checkLapse applies the lapse rule; moved: the clock just moved, when a
// StateProber is asked.
func (o *Oracle) checkLapse(moved bool) {
	if o.cfg.StateTTL <= 0 {
		return
	}
	if p, ok := o.d.(StateProber); ok {
		if !moved {
			return
		}
		exists, err := p.StateExists()
		if err != nil {
			_ = o.fail(err)
			return
		}
		if !exists && o.dirty {
			o.dirty = false
			o.emit(Event{Kind: EvLapse, On: true})
			o.stateGone()
		}
		return
	}
	if o.lapsed || o.now-o.lastWrite < o.cfg.StateTTL/2 {
		return
	}
	o.lapsed = true
	o.emit(Event{Kind: EvLapse})
	for _, name := range o.keyOrder {
		if k := o.keys[name]; k.ready > 0 {
			o.setSuspect(k, true)
		}
	}
}

// stateGone: the scheduler state is gone as a whole; keys with ready runs
// await discovery, the others start anew.
func (o *Oracle) stateGone() {
	o.lapsed, o.bMay = false, false
	o.mark = -1 // (the mark is a field of the state)
	o.lastWrite = o.now
	o.clearUnsaid()
	for _, name := range o.keyOrder {
		k := o.keys[name]
		k.debt, k.offNew = 0, false
		// No lane survives the state: keys with ready runs are found again
		// at V, and no newcomer waits ahead of a later one.
		if k.pending {
			k.pending = false
			o.pendingN--
		}
		if k.ready > 0 {
			o.setSuspect(k, true)
		} else {
			k.resetSinceReady = true
		}
		if k.stale {
			k.stale = false
			o.stales--
		}
	}
}

// wrote notes a certain scheduler write (flag on): a serve, a
// registration or a drain.
func (o *Oracle) wrote() {
	o.lastWrite = o.now
	o.lapsed = false
	o.dirty = true
}

func (o *Oracle) fail(err error) error {
	o.emit(Event{Kind: EvError, Text: err.Error()})
	return err
}

func (o *Oracle) end() {
	if o.cfg.VEvery == 0 {
		o.readV()
	}
}

func (o *Oracle) readV() {
	cr, ok := o.d.(ClockReader)
	if !ok {
		return
	}
	v, err := cr.V()
	if errors.Is(err, ErrVUnavailable) {
		return
	}
	if err != nil {
		_ = o.fail(fmt.Errorf("reading V: %w", err))
		return
	}
	o.emit(Event{Kind: EvV, W: v})
}

// ---- bookkeeping of keys

func (o *Oracle) refresh(k *okey) {
	room := k.ready
	if o.limits.Key > 0 {
		room = max(0, min(room, o.limits.Key-k.held))
	}
	o.room += room - k.room
	k.room = room
	s := room > 0
	if s == k.servable {
		return
	}
	k.servable = s
	if s {
		o.emit(Event{Kind: EvServable, Key: k.name})
	} else {
		o.emit(Event{Kind: EvUnservable, Key: k.name})
	}
}

func (o *Oracle) setSuspect(k *okey, on bool) {
	if k.suspect == on {
		return
	}
	k.suspect = on
	if on {
		o.suspects++
	} else {
		o.suspects--
	}
	o.emit(Event{Kind: EvSuspect, Key: k.name, On: on})
}

// eligible: k has no debt (see Event.Eligible).
func (o *Oracle) eligible(k *okey) bool {
	if !k.everReady || k.resetSinceReady {
		return true
	}
	if k.drainServe < 0 {
		return false
	}
	seen := map[string]bool{}
	m := 0
	for i := k.drainServe + 1; i < len(o.serveKey); i++ {
		if !o.serveW1[i] {
			return false
		}
		seen[o.serveKey[i]] = true
		m++
	}
	return len(seen) > 0 && m >= 3*len(seen)
}

// gainReady makes r ready; the key's first ready run registers it.
func (o *Oracle) gainReady(r *orun) {
	k := o.key(r.key)
	r.state = stReady
	k.ready++
	if k.ready == 1 {
		o.withReady++
		p := o.pendingN
		if o.batchRegs > 0 {
			p = o.batchBase + o.batchRegs - 1
		}
		eligible, fresh := o.eligible(k), !k.everReady
		k.debt = max(k.debt, 2+float64(p))
		if !k.everReady || k.resetSinceReady {
			k.debt = 2 + float64(p)
		}
		k.everReady, k.resetSinceReady, k.drainServe = true, false, -1
		k.offNew = !o.flagOn && o.bMay
		k.pending = true
		o.pendingN++
		o.emit(Event{Kind: EvRegister, Key: k.name, Visible: o.flagOn, Eligible: eligible, Fresh: fresh, P: p, Debt: k.debt,
			W: k.weight, Stale: o.staleInLane(), DueOp: o.markFound[k.name]})
		if o.flagOn {
			o.wrote()
			if k.stale { // the stale tag is the key's tag again
				k.stale = false
				o.stales--
			}
		} else {
			o.setSuspect(k, true)
		}
	} else if k.suspect && (o.flagOn || o.bMay) {
		// A flag-on write that moves an undiscovered key's head (a run
		// ready earlier than its ready runs: a priority, a promotion, a
		// recovery) registers it in the scheduler, by the newcomer rule:
		// later newcomers may queue behind it in the lane. The oracle does
		// not know ready scores, so it counts the key of every such run as
		// one (P may then count keys whose head did not move: an upper
		// bound, as for the keys of one promotion or recovery).
		//
		// After a flag-on dequeue may have set b (bMay), a run written to
		// an undiscovered key, with either flag, may become its head
		// before discovery finds it (a flag-off write that moves the head;
		// or a run behind the head that flag-off serves or a sweep bring
		// to it) and is available after b: discovery then puts the key in
		// the lane as a newcomer (docs/design.md, Discovery: "a key with
		// old work whose first ready run became available after b"), as
		// it does a key registered with the flag off after b. offNew keeps
		// it counted across flag-off serves until a flag-on serve; the
		// same upper bound (helper-190's TestReviewH190HeadMovedByFlagOff).
		if o.bMay {
			k.offNew = true
		}
		if !k.pending {
			k.pending = true
			o.pendingN++
			// Its debt bound too (CheckReachability): a key found at V when
			// the state went waits in the lane behind the P before it, a
			// round each (helper-189).
			p := o.pendingN - 1
			if o.batchRegs > 0 {
				p = o.batchBase + o.batchRegs - 1
			}
			k.debt = max(k.debt, 2+float64(p))
			o.emit(Event{Kind: EvHeadMoved, Key: k.name, P: p, Debt: k.debt})
		}
	}
	o.refresh(k)
}

// staleInLane reports whether a key a flag-off operation drained may
// still wait in the newcomer lane (Event.Stale). With a LaneProber, a
// drained key the probe finds out of the lane is out of it for good
// (outOfLane): with no ready run it cannot come back to the lane but by a
// registration (or, with the flag off, a ready run that makes it pending),
// and P then counts it (helper-197); its tag may still be stale for the
// other checks. Without one, every such key counts until it registers
// again or the state goes.
func (o *Oracle) staleInLane() bool {
	if o.stales == 0 {
		return false
	}
	if _, ok := o.d.(LaneProber); !ok {
		return true
	}
	for _, name := range o.keyOrder {
		k := o.keys[name]
		if !k.stale || k.outOfLane {
			continue
		}
		if k.ready > 0 || o.inLane(name) {
			return true
		}
		k.outOfLane = true
	}
	return false
}

// loseReady takes a ready run away (served or expired).
func (o *Oracle) loseReady(k *okey, byServe bool) {
	k.ready--
	if k.ready == 0 {
		o.withReady--
		if k.pending {
			k.pending = false
			o.pendingN--
		}
		k.drainServe = -1
		// A serve at weight 1 or more leaves a tag at most one weight-1
		// serve past its start (see Event.Eligible).
		if byServe && o.flagOn && milliWeight(k.weight) >= 1000 {
			k.drainServe = o.H.Serves - 1
		}
		if o.flagOn {
			o.wrote()
		} else if !k.stale {
			k.stale, k.outOfLane = true, false
			o.stales++
		}
		o.setSuspect(k, false)
		o.emit(Event{Kind: EvDrain, Key: k.name, On: byServe})
	}
	o.refresh(k)
}

// dueOp is the operation of the clock move at which time t came.
func (o *Oracle) dueOp(t time.Duration) int {
	i := sort.Search(len(o.clock), func(i int) bool { return o.clock[i].now >= t })
	if i == len(o.clock) || t <= 0 {
		return 1
	}
	return max(o.clock[i].op, 1)
}

// beginBatch announces that the runs rs become ready together.
func (o *Oracle) beginBatch(rs []*orun) {
	fresh := map[string]bool{}
	for _, r := range rs {
		// (an undiscovered key may register in the batch too: see gainReady)
		if k := o.keys[r.key]; k == nil || k.ready == 0 || (o.flagOn && k.suspect && !k.pending) {
			fresh[r.key] = true
		}
	}
	o.batchRegs, o.batchBase = len(fresh), o.pendingN
}

func (o *Oracle) endBatch() { o.batchRegs, o.markFound = 0, nil }

func (o *Oracle) place(r *orun) {
	if r.at <= o.now {
		o.gainReady(r)
		return
	}
	r.state = stDelayed
	k := o.key(r.key)
	k.delayed[r.id] = r
	o.delayedK[k.name] = k
}

func (o *Oracle) unDelay(r *orun) {
	k := o.keys[r.key]
	delete(k.delayed, r.id)
	if len(k.delayed) == 0 {
		delete(o.delayedK, k.name)
	}
}

func (o *Oracle) scan(maxCount int) int {
	if o.cfg.ScanLimit > 0 {
		return o.cfg.ScanLimit
	}
	return max(30, 3*maxCount)
}

type dueVariant struct {
	k    *okey
	head time.Duration
	vm   string
	due  []*orun
}

// dueVariants lists the variants with due delayed runs in delay-index
// order: head time, then variant member.
func (o *Oracle) dueVariants() []dueVariant {
	var out []dueVariant
	for _, k := range o.delayedK {
		var head time.Duration = -1
		var due []*orun
		for _, r := range k.delayed {
			if head < 0 || r.at < head {
				head = r.at
			}
			if r.at <= o.now {
				due = append(due, r)
			}
		}
		if head >= 0 && head <= o.now {
			out = append(out, dueVariant{k, head, keys.VariantMember(k.name), due})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].head < out[j].head || (out[i].head == out[j].head && out[i].vm < out[j].vm)
	})
	return out
}

// promote applies a call's promotion and reports whether it was certain
// for a call of maxCount and for a call of 1: every due run promoted. A
// call reaches scan due variants at most and spends a budget of
// max(PromoteLimit, maxCount) runs on them (promotePlan): all of them when
// no more are due; else, with the flag off, the first scan; with it on,
// among the first vtime.PromoteLook x scan, those with no ready run first
// (below their key limit before at it), keeping scan/4 places for those
// with one below their limit, each group in the delay index's order, one
// filling the places the other leaves, then those at their limit with a
// ready run in the room left, looking vtime.PromoteLook x scan further
// while fewer than scan of those looked at are below their limit, up to
// vtime.PromoteLookMax (docs/design.md, "Dequeue").
func (o *Oracle) promote(maxCount int) (certain, certain1 bool) {
	dv := o.dueVariants()
	scan := o.scan(maxCount)
	reached, reached1 := min(len(dv), scan), min(len(dv), o.scan(1))
	window := dv[:reached]
	if o.flagOn && len(dv) > scan {
		// [held][ready]: below their limit without and with a ready run,
		// then at their limit without and with one
		var g [2][2][]dueVariant
		for i, v := range dv[:min(len(dv), vtime.PromoteLookMax(scan))] {
			h, r := b2i(o.atKeyLimit(v.k)), b2i(v.k.ready > 0)
			g[h][r] = append(g[h][r], v)
			if (i+1)%(vtime.PromoteLook*scan) == 0 && len(g[0][0])+len(g[0][1]) >= scan {
				break // (a look ends with enough below their limit)
			}
		}
		starving, fed := slices.Concat(g[0][0], g[1][0]), slices.Concat(g[0][1], g[1][1])
		s := min(len(starving), scan-min(len(fed), scan/4))
		window = slices.Concat(starving[:s], fed[:min(len(fed), scan-s)])
	}
	due, held, milli := make([]int, reached), make([]bool, reached), make([]int64, reached)
	for i, v := range window {
		held[i] = o.atKeyLimit(v.k)
		milli[i] = milliWeight(v.k.weight)
		sort.Slice(v.due, func(a, b int) bool {
			x, y := v.due[a], v.due[b]
			return x.at < y.at || (x.at == y.at && keys.Segment(x.id) < keys.Segment(y.id))
		})
		due[i] = len(v.due)
	}
	plan, plan1 := o.promotePlan(maxCount, due, held, milli), o.promotePlan(1, due[:reached1], held[:reached1], milli[:reached1])
	certain, certain1 = len(dv) == reached, len(dv) == reached1
	var batch []*orun
	for i, v := range window {
		batch = append(batch, v.due[:plan[i]]...)
		certain = certain && plan[i] == due[i]
		certain1 = certain1 && (i >= reached1 || plan1[i] == due[i])
	}
	// The cold mark this call may set, and the keys registered by the
	// mark: those it registers at V (due at or before the mark as the call
	// read it), and those of the call that sets it, which fell due with
	// the rest of the burst (on a cold state the newcomer rule registers
	// them at V too, or, when a key of the call returns at a parked tag
	// above V, through the lane, where the burst's later keys, found at
	// V, may pass them): each counts from when its work fell due.
	if o.flagOn && len(dv) > reached {
		o.mark = max(o.mark, dv[len(dv)-1].head)
	}
	if o.flagOn && o.mark >= 0 {
		o.markFound = map[string]int{}
		for _, v := range window {
			if v.head <= o.mark {
				o.markFound[v.k.name] = o.dueOp(v.head)
			}
		}
	}
	o.beginBatch(batch)
	defer o.endBatch()
	for _, r := range batch {
		o.unDelay(r)
		o.gainReady(r)
	}
	// (a call that promotes and leaves nothing due by the mark drops it;
	// no operation of the oracle dates delayed work at or before now)
	if o.mark >= 0 && len(batch) > 0 {
		left := false
		for _, k := range o.delayedK {
			for _, r := range k.delayed {
				left = left || r.at <= o.mark
			}
		}
		if !left {
			o.mark = -1
		}
	}
	return certain, certain1
}

// promotePlan is how many of its due runs (due, in the delay index's
// order) each reached variant promotes in a call of maxCount, those at
// their key limit held, milli their milli-weights: the plan the scripts
// follow, vtime.PromotePlanWeighted with the flag on (shares by weight),
// vtime.PromotePlan with it off (docs/design.md, "Dequeue").
func (o *Oracle) promotePlan(maxCount int, due []int, held []bool, milli []int64) []int {
	if !o.flagOn {
		plan, _ := vtime.PromotePlan(o.cfg.PromoteLimit, maxCount, due, held)
		return plan
	}
	plan, _ := vtime.PromotePlanWeighted(o.cfg.PromoteLimit, maxCount, due, held, milli)
	return plan
}

func (o *Oracle) capacity(maxCount int) int {
	c := maxCount
	if o.limits.Env > 0 {
		c = min(c, o.limits.Env-o.held)
	}
	if o.limits.Queue > 0 {
		c = min(c, o.limits.Queue-o.held)
	}
	return max(c, 0)
}

// ---- operations

// Enqueue queues a run of key and returns its id.
func (o *Oracle) Enqueue(key string, priority int, delay, ttl time.Duration) (string, error) {
	o.nextID++
	id := fmt.Sprintf("r%d", o.nextID)
	o.begin("enqueue %q %s prio=%d delay=%v ttl=%v", key, id, priority, delay, ttl)
	defer o.end()
	if err := o.d.Enqueue(key, id, priority, delay, ttl); err != nil {
		return "", o.fail(err)
	}
	r := &orun{id: id, key: key, priority: priority, at: o.now + delay, attempt: 1}
	if ttl > 0 {
		r.ttl = o.now + max(ttl, time.Millisecond)
	}
	o.runs[id] = r
	o.emit(Event{Kind: EvEnqueue, Key: key, ID: id})
	o.place(r)
	return id, nil
}

// Dequeue runs one dequeue call and returns the runs it delivered (those
// it took past their TTL are recorded, not returned).
func (o *Oracle) Dequeue(maxCount int) ([]Served, error) {
	o.begin("dequeue %d", maxCount)
	if o.flagOn {
		o.bMay = true // its discovery read may set the state's b, seen or not
	}
	defer o.end()
	capacity := o.capacity(maxCount)
	certain, certain1 := true, true
	if capacity > 0 {
		certain, certain1 = o.promote(maxCount)
	}
	clean := o.flagOn && o.suspects == 0 && !o.lapsed
	// A tag left by a flag-off drain is cleaned up lazily, a bounded
	// number per call: a call may read only such tags and serve nothing
	// (docs/design.md section 8, stale-cleanup-10k: a fresh key is served
	// within 3 calls, not at once). Work conservation is exact without.
	if o.unsaid > 0 && o.probes >= len(o.keys) {
		o.clearUnsaid()
	}
	// A gated key whose slot a flag-off operation freed waits for the
	// gated probe (guarantee 6's exception): not exact either.
	exact := clean && o.stales == 0 && o.unsaid == 0
	if o.flagOn && capacity > 0 {
		o.probes++
	}
	// The runs past their TTL: a call sweeps each that comes to its
	// key's head (no serve, no slot, not counted for maxCount) while no
	// more than vtime.TTLLook are due; past that, one it did not sweep is
	// taken and deleted: within the call it counts for its key's limit,
	// after it frees its slot, so N calls of one may serve what one call
	// of N does not (guarantee 4 holds for calls without such runs), and a
	// call that delivered fewer than maxCount for that takes again (work
	// conservation: at least the servable). The servable runs are the
	// live ones (expect).
	due := 0
	dueReady := map[*okey]int{}
	for _, r := range o.runs {
		if r.ttl > 0 && r.ttl <= o.now && (r.state == stReady || r.state == stDelayed) {
			due++
			if r.state == stReady {
				dueReady[o.keys[r.key]]++
			}
		}
	}
	expiring := due > vtime.TTLLook
	expect := o.room
	for k, n := range dueReady {
		room := k.ready - n
		if o.limits.Key > 0 {
			room = max(0, min(room, o.limits.Key-k.held))
		}
		expect += room - k.room
	}
	if bp, ok := o.d.(BatchProber); ok && !o.finishing && maxCount >= 2 && capacity > 0 && exact && certain1 && !expiring {
		singles, err := bp.ProbeSingles(maxCount)
		if err != nil {
			return nil, o.fail(err)
		}
		o.emit(Event{Kind: EvProbe, MaxCount: maxCount, Singles: singles})
	}
	o.H.Calls++
	o.emit(Event{Kind: EvCall, MaxCount: maxCount, Capacity: capacity, Expect: expect, N: o.withReady,
		On: o.flagOn, Clean: exact, Certain: certain, Certain1: certain1, Expiring: expiring})
	served, err := o.d.Dequeue(maxCount)
	if err != nil {
		return nil, o.fail(err)
	}
	delivered := served[:0:0]
	taken := 0
	for _, s := range served {
		if s.Swept {
			o.swept(s)
			continue
		}
		taken++
		o.serve(s)
		if !s.Expired {
			delivered = append(delivered, s)
		}
	}
	o.emit(Event{Kind: EvCallEnd, N: taken})
	for _, r := range o.callExpired {
		o.release(r)
		o.refresh(o.keys[r.key])
	}
	o.callExpired = nil
	if o.cfg.VEvery > 0 && o.H.Calls%o.cfg.VEvery == 0 {
		o.readV()
	}
	return delivered, nil
}

// swept books a run a dequeue call swept at its key's head: a TTL sweep
// of that run (EvExpire), no serve.
func (o *Oracle) swept(s Served) {
	r, ok := o.runs[s.ID]
	if !ok || r.key != s.Key || (r.state != stReady && r.state != stDelayed) {
		o.emit(Event{Kind: EvError, Text: fmt.Sprintf("run %s of %q swept at a dequeue but not queued", s.ID, s.Key)})
		return
	}
	if r.ttl <= 0 || r.ttl > o.now {
		o.emit(Event{Kind: EvError, Text: fmt.Sprintf("run %s swept at a dequeue before its TTL (deadline %v, now %v)",
			s.ID, r.ttl, o.now)})
	}
	o.emit(Event{Kind: EvExpire, N: 1, IDs: []string{s.ID}})
	o.expire(r) // (a delayed one was due, promoted where the oracle did not expect it)
}

// expire ends queued run r by a TTL sweep.
func (o *Oracle) expire(r *orun) {
	if r.state == stDelayed {
		o.unDelay(r)
		r.state = stExpired
		return
	}
	r.state = stExpired
	o.loseReady(o.keys[r.key], false)
}

func (o *Oracle) serve(s Served) {
	k := o.key(s.Key)
	o.emit(Event{Kind: EvServe, Key: s.Key, ID: s.ID, Attempt: s.Attempt, W: k.weight, On: o.flagOn,
		Expiring: s.Expired})
	if r, ok := o.runs[s.ID]; ok && r.key == s.Key {
		switch due := r.ttl > 0 && r.ttl <= o.now; {
		case s.Expired && !due:
			o.emit(Event{Kind: EvError, Text: fmt.Sprintf("run %s expired at a dequeue before its TTL (deadline %v, now %v)",
				s.ID, r.ttl, o.now)})
		case !s.Expired && due:
			o.emit(Event{Kind: EvError, Text: fmt.Sprintf("run %s delivered past its TTL (deadline %v, now %v)",
				s.ID, r.ttl, o.now)})
		}
	}
	o.H.Serves++
	o.serveKey = append(o.serveKey, s.Key)
	o.serveW1 = append(o.serveW1, o.flagOn && milliWeight(k.weight) == 1000)
	r, ok := o.runs[s.ID]
	if ok && r.state == stDelayed && r.key == s.Key {
		if r.at > o.now {
			o.emit(Event{Kind: EvError, Text: fmt.Sprintf("run %s served %v before it was due", s.ID, r.at-o.now)})
			return
		}
		// Due, and promoted where the oracle did not expect it: take the
		// backend's word for it.
		o.unDelay(r)
		o.gainReady(r)
	}
	if !ok || r.state != stReady || r.key != s.Key {
		return // the lifecycle check reports it; the oracle keeps its books
	}
	r.ttl, k.held, o.held = 0, k.held+1, o.held+1
	if s.Expired {
		// Taken and deleted: the scheduler saw a serve, and within the
		// call the run counts for its key's limit; the call frees its
		// slot as it ends, as an ack right after it would (Dequeue).
		r.state = stExpired
		o.callExpired = append(o.callExpired, r)
	} else {
		r.state, r.lease = stHeld, o.now+o.cfg.Lease
	}
	// A flag-off serve writes nothing of the scheduler: a newcomer it
	// serves that waits in the scheduler's lane stays there, ahead of
	// later newcomers, when the flag is on again (scenario LaneAcrossFlip).
	// One that registered at V is in no lane: the serve ends its wait.
	// One registered with the flag off is in no lane either: when all its
	// work predates the state's b, discovery finds it at V; when it
	// registered after a flag-on dequeue may have set b, or a flag-off
	// write since may have moved its head (offNew), discovery may put it
	// in the lane when the flag is on again, ahead of later newcomers,
	// and a flag-off serve before that leaves it waiting (scenario
	// ServedBeforeDiscovery; helper-190's TestReviewH190HeadMovedByFlagOff).
	// Without a LaneProber, every other serve ends the wait.
	if k.pending && (o.flagOn || (!(k.suspect && k.offNew) && !o.inLane(k.name))) {
		k.pending = false
		o.pendingN--
	}
	if o.flagOn {
		k.debt = stride(k.weight)
		o.setSuspect(k, false)
		o.wrote()
	}
	o.loseReady(k, true)
}

// inLane asks the driver whether the scheduler holds key in its newcomer
// lane; false without a LaneProber or when the probe fails (an error is
// recorded).
func (o *Oracle) inLane(key string) bool {
	lp, ok := o.d.(LaneProber)
	if !ok {
		return false
	}
	in, err := lp.InLane(key)
	if err != nil {
		o.emit(Event{Kind: EvError, Text: fmt.Sprintf("lane probe of %q: %v", key, err)})
		return false
	}
	return in
}

// Held lists the runs in flight, sorted.
func (o *Oracle) Held() []string {
	var out []string
	for id, r := range o.runs {
		if r.state == stHeld {
			out = append(out, id)
		}
	}
	sort.Slice(out, func(i, j int) bool { return idLess(out[i], out[j]) })
	return out
}

func idLess(a, b string) bool { return len(a) < len(b) || (len(a) == len(b) && a < b) }

// atKeyLimit reports whether k holds as many runs as the key limit.
func (o *Oracle) atKeyLimit(k *okey) bool { return o.limits.Key > 0 && k.held >= o.limits.Key }

func (o *Oracle) release(r *orun) {
	k := o.keys[r.key]
	atLimit := o.atKeyLimit(k)
	r.lease = 0
	o.held--
	k.held--
	switch {
	case o.flagOn:
		// A flag-on release un-gates the key at once (its hooks look
		// for a gated key whenever the queue has a key limit; without
		// one, the next call un-gates every key).
		if k.unsaid {
			k.unsaid = false
			o.unsaid--
		}
	case atLimit:
		if !k.unsaid {
			k.unsaid = true
			o.unsaid++
		}
		o.probes = 0
	}
}

// clearUnsaid: every key a flag-off release left gated has been looked
// at by the probe, or the state that gated it is gone.
func (o *Oracle) clearUnsaid() {
	for _, name := range o.keyOrder {
		o.keys[name].unsaid = false
	}
	o.unsaid = 0
}

// Ack completes a held run.
func (o *Oracle) Ack(id string) error {
	o.begin("ack %s", id)
	defer o.end()
	r := o.runs[id]
	err := o.d.Ack(id)
	e := Event{Kind: EvAck, ID: id, Key: r.key}
	if err != nil {
		e.Text = err.Error()
	}
	o.emit(e)
	if err != nil {
		return nil // the lifecycle check reports it
	}
	o.release(r)
	r.state = stAcked
	o.refresh(o.keys[r.key])
	return nil
}

// Nack gives a held run back, retried after retryAfter or dead-lettered.
func (o *Oracle) Nack(id string, retryAfter time.Duration, deadLetter bool) error {
	o.begin("nack %s retry=%v dead=%v", id, retryAfter, deadLetter)
	defer o.end()
	r := o.runs[id]
	requeued, err := o.d.Nack(id, retryAfter, deadLetter)
	if err != nil {
		return o.fail(err)
	}
	r.attempt++
	expected := !deadLetter && (o.cfg.MaxAttempts <= 0 || r.attempt <= o.cfg.MaxAttempts)
	o.emit(Event{Kind: EvNack, ID: id, Key: r.key, On: requeued, Eligible: expected})
	o.release(r)
	if !requeued {
		r.state = stDead
		o.refresh(o.keys[r.key])
		return nil
	}
	r.at = o.now + retryAfter
	o.refresh(o.keys[r.key])
	o.place(r)
	return nil
}

// RecoverLeases moves the clock past every lease deadline and recovers
// the held runs.
func (o *Oracle) RecoverLeases() error {
	if err := o.advance(o.cfg.Lease + time.Second); err != nil {
		return err
	}
	o.begin("recover leases")
	defer o.end()
	var due []*orun
	for _, r := range o.runs {
		if r.state == stHeld && r.lease <= o.now {
			due = append(due, r)
		}
	}
	sort.Slice(due, func(i, j int) bool {
		return due[i].lease < due[j].lease || (due[i].lease == due[j].lease && idLess(due[i].id, due[j].id))
	})
	n, err := o.d.RecoverLeases()
	if err != nil {
		return o.fail(err)
	}
	e := Event{Kind: EvRecover, N: n}
	for _, r := range due {
		r.attempt++
		if o.cfg.MaxAttempts > 0 && r.attempt > o.cfg.MaxAttempts {
			e.Dead = append(e.Dead, r.id)
		} else {
			e.IDs = append(e.IDs, r.id)
		}
	}
	o.emit(e)
	var back []*orun
	for _, r := range due {
		if !(o.cfg.MaxAttempts > 0 && r.attempt > o.cfg.MaxAttempts) {
			back = append(back, r)
		}
	}
	o.beginBatch(back)
	defer o.endBatch()
	for _, r := range due {
		o.release(r)
		if o.cfg.MaxAttempts > 0 && r.attempt > o.cfg.MaxAttempts {
			r.state = stDead
			o.refresh(o.keys[r.key])
			continue
		}
		r.at = o.now
		o.refresh(o.keys[r.key])
		o.gainReady(r)
	}
	return nil
}

// SweepTTL expires the queued runs whose TTL passed.
func (o *Oracle) SweepTTL() error {
	o.begin("sweep ttl")
	defer o.end()
	var due []*orun
	for _, r := range o.runs {
		if (r.state == stReady || r.state == stDelayed) && r.ttl > 0 && r.ttl <= o.now {
			due = append(due, r)
		}
	}
	sort.Slice(due, func(i, j int) bool {
		return due[i].ttl < due[j].ttl || (due[i].ttl == due[j].ttl && idLess(due[i].id, due[j].id))
	})
	n, err := o.d.SweepTTL()
	if err != nil {
		return o.fail(err)
	}
	e := Event{Kind: EvExpire, N: n}
	for _, r := range due {
		e.IDs = append(e.IDs, r.id)
	}
	o.emit(e)
	for _, r := range due {
		o.expire(r)
	}
	return nil
}

// SetWeight sets key's weight.
func (o *Oracle) SetWeight(key string, w float64) error {
	o.begin("weight %q %g", key, w)
	defer o.end()
	if err := o.d.SetWeight(key, w); err != nil {
		return o.fail(err)
	}
	o.key(key).weight = w
	o.emit(Event{Kind: EvWeight, Key: key, W: w})
	return nil
}

// SetLimits changes the limits from the next dequeue on.
func (o *Oracle) SetLimits(l Limits) error {
	o.begin("limits env=%d queue=%d key=%d", l.Env, l.Queue, l.Key)
	defer o.end()
	if err := o.d.SetLimits(l); err != nil {
		return o.fail(err)
	}
	o.limits = l
	o.emit(Event{Kind: EvLimits, Text: fmt.Sprintf("%+v", l)})
	for _, name := range o.keyOrder {
		o.refresh(o.keys[name])
	}
	return nil
}

// Advance moves the clock.
func (o *Oracle) Advance(d time.Duration) error {
	return o.advance(d)
}

func (o *Oracle) advance(d time.Duration) error {
	o.begin("advance %v", d)
	defer o.end()
	if err := o.d.Advance(d); err != nil {
		return o.fail(err)
	}
	o.now += d
	o.clock = append(o.clock, opTime{o.op, o.now})
	o.checkLapse(true)
	return nil
}

// CanFlip reports whether the driver can turn the flag off and on.
func (o *Oracle) CanFlip() bool { _, ok := o.d.(FlagFlipper); return ok }

// CanExpire reports whether the driver's scheduler state can expire.
func (o *Oracle) CanExpire() bool { _, ok := o.d.(StateExpirer); return ok }

// FlagOn reports the flag state.
func (o *Oracle) FlagOn() bool { return o.flagOn }

// SetFlag turns the scheduler flag on or off.
func (o *Oracle) SetFlag(on bool) error {
	f, ok := o.d.(FlagFlipper)
	if !ok || on == o.flagOn {
		return nil
	}
	o.begin("flag %v", on)
	defer o.end()
	if err := f.SetFlag(on); err != nil {
		return o.fail(err)
	}
	o.flagOn = on
	o.emit(Event{Kind: EvFlag, On: on})
	return nil
}

// ExpireState lets the scheduler state expire as a whole.
func (o *Oracle) ExpireState() error {
	x, ok := o.d.(StateExpirer)
	if !ok {
		return nil
	}
	o.begin("expire state")
	if o.cfg.VEvery >= 0 {
		defer o.readV()
	}
	if err := x.ExpireState(); err != nil {
		return o.fail(err)
	}
	o.emit(Event{Kind: EvReset})
	o.dirty = false
	o.stateGone()
	return nil
}

// Keys is the number of keys the oracle has seen.
func (o *Oracle) Keys() int { return len(o.keys) }

// Ready is the number of ready runs of key.
func (o *Oracle) Ready(key string) int {
	if k := o.keys[key]; k != nil {
		return k.ready
	}
	return 0
}

// Queued is the number of runs ready or delayed.
func (o *Oracle) Queued() int {
	n := 0
	for _, r := range o.runs {
		if r.state == stReady || r.state == stDelayed {
			n++
		}
	}
	return n
}

// Finish drains the queue with the flag on and no limits (recovering
// leases, letting delayed runs come due, acking every serve), sweeps the
// TTLs and records the end of the history.
func (o *Oracle) Finish() error {
	o.finishing = true
	if err := o.SetFlag(true); err != nil {
		return err
	}
	if err := o.SetLimits(Limits{}); err != nil {
		return err
	}
	if err := o.RecoverLeases(); err != nil {
		return err
	}
	budget := o.Queued() + 30
	for idle := 0; o.Queued() > 0 && budget > 0 && idle < 5; budget-- {
		served, err := o.Dequeue(10)
		if err != nil {
			return err
		}
		for _, s := range served {
			if r := o.runs[s.ID]; r != nil && r.state == stHeld {
				if err := o.Ack(s.ID); err != nil {
					return err
				}
			}
		}
		if len(served) == 0 {
			idle++
			if err := o.Advance(time.Minute); err != nil {
				return err
			}
		}
	}
	if err := o.SweepTTL(); err != nil {
		return err
	}
	o.begin("end")
	var open []string
	for id, r := range o.runs {
		if r.state != stAcked && r.state != stDead && r.state != stExpired {
			open = append(open, id)
		}
	}
	sort.Slice(open, func(i, j int) bool { return idLess(open[i], open[j]) })
	o.emit(Event{Kind: EvEnd, IDs: open})
	return nil
}

// b2i is 1 for true, 0 for false.
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
