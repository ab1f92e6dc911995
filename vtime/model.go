package vtime

import (
	"errors"
	"math"
	"slices"
	"sort"

	"github.com/runqueue/runqueue/keys"
)

// Virtual time is counted in integer units, so that it is exact for any
// history: a serve of a key of weight 1 costs Unit units.
const (
	// Unit is the virtual time of one serve at weight 1.
	Unit = 1_000_000
	// strideNum / milli-weight is the cost of one serve: a key of weight w
	// (milli-weight m = round(w*1000)) pays strideNum/m units per serve,
	// carried exactly as a quotient and a remainder below m.
	strideNum = Unit * 1000
	// MinMilliWeight and MaxMilliWeight bound a weight (0.001..1000).
	MinMilliWeight = 1
	MaxMilliWeight = 1_000_000
	// RebaseAt: when the stored clock reaches it, every stored time is moved
	// down by RebaseBy (one epoch), which keeps every value an exact integer
	// of a double (tags stay below 2^50; Lua numbers are doubles).
	RebaseAt = 1 << 49
	RebaseBy = 1 << 48
	// rebaseFloor: a tag this far below V is worth no more than V itself
	// (E = max(S, V)); a rebase lifts such tags to it so none goes negative.
	rebaseFloor = 1 << 47
	// ReadBudget is the least number of tags one call may read in pass 1
	// (plus 4 x window): entries that turn out stale or at their limit are
	// taken out for good as they are met, and reading stops at the budget.
	ReadBudget = 1000
	// TTLLook is how many runs past their TTL a dequeue call sweeps at
	// most: each that comes to the head of its variant while the call
	// serves is swept there (Served.Swept), not served, until the call
	// swept TTLLook; one past its TTL after that is taken (Served.Expired).
	TTLLook = 100
)

// Limits are concurrency limits; 0 means none.
type Limits struct {
	Env   int // in flight in the env: this queue plus Model.EnvOther
	Queue int // in flight in this queue
	Key   int // in flight per variant
}

// Config mirrors the scheduler fields of runqueue.Config.
type Config struct {
	WindowMultiplier int   // default 3
	IdleMaxEntries   int   // default 10,000
	PriorityStep     int64 // ms, default 30,000
	PromoteLimit     int   // default 100
	MaxAttempts      int   // deliveries before dead letter; 0 = no limit
	// ScanLimit is how many variants a call reads in age order (the age
	// head and the discovery cursor) and how many due delayed variants it
	// promotes, as the flag-off dequeue does; 0 means max(30, 3*maxCount).
	ScanLimit int
	Limits    Limits
}

func (c Config) withDefaults() Config {
	if c.WindowMultiplier == 0 {
		c.WindowMultiplier = 3
	}
	if c.IdleMaxEntries == 0 {
		c.IdleMaxEntries = 10000
	}
	if c.PriorityStep == 0 {
		c.PriorityStep = 30000
	}
	if c.PromoteLimit == 0 {
		c.PromoteLimit = 100
	}
	return c
}

// State of a run.
const (
	Ready    = 'r'
	Delayed  = 'd'
	InFlight = 'f'
	Dead     = 'x'
)

type run struct {
	id       string // encoded id: the member in Redis
	key      string
	priority int
	at       int64 // available_at ms
	state    byte
	attempt  int
	ttl      int64 // TTL deadline (ms) until the first delivery, 0 for none
}

// Reg is a registered variant: its tag, the remainder of its last stride
// (numerator over its milli-weight), its registration order, whether it is
// gated (at its key limit, out of the competition) and, while it is, its
// gating number (the order in which the gated probe visits), and whether
// it waits in the newcomer lane (see the package comment: the lane's head,
// its lowest Seq, competes with its tag; the others wait behind it without
// one, U 0).
type Reg struct {
	U       int64
	R       int64
	Seq     int64
	Gated   bool
	Gate    int64
	Waiting bool
}

// Model is one base queue under the fair scheduler.
type Model struct {
	cfg Config

	// Scheduler state: it lives and expires as a whole (ExpireState).
	v       int64 // stored clock V, units
	epoch   int64 // rebases done: the logical clock is epoch*RebaseBy + v
	cursor  int   // discovery cursor: a rank in ckIndex
	nextSeq int64 // registration order of the next registration, from 1
	gk      int   // key limit the gated variants were gated under (0: none)
	gn      int64 // gating number of the next variant gated, from 1
	gp      int64 // probe cursor: the gating number the probe last looked at
	began   bool  // the state's first discovery read is done (see discover)
	born    int64 // and its call's time (ms)
	marked  bool  // the cold mark is set (see call.promote)
	mark    int64 // and its time (ms)
	reg     map[string]*Reg
	idle    map[string]int64 // variant member -> parked tag

	weights map[string]int64 // variant member -> milli-weight (configuration)

	runs     map[string]*run               // encoded id -> run
	ready    map[string]map[string]float64 // member -> encoded id -> ready score
	delayed  map[string]map[string]float64 // member -> encoded id -> available_at
	inflight map[string]int                // member -> runs in flight
	keyOf    map[string]string             // member -> concurrency key

	// EnvOther counts runs in flight in other queues of the env.
	EnvOther int
	// EnvAhead counts the slots of the env left to the other queues of the
	// env that wait ahead of this one (runqueue's env waiting line: a
	// dequeue leaves a free slot to each that can use one, and takes at
	// most what the lowest limit among them leaves; see
	// runqueue/lua/lib/envwait.lua and runqueue's envAheadOf).
	EnvAhead int
}

// New returns an empty model.
func New(cfg Config) *Model {
	m := &Model{
		cfg:      cfg.withDefaults(),
		weights:  map[string]int64{},
		runs:     map[string]*run{},
		ready:    map[string]map[string]float64{},
		delayed:  map[string]map[string]float64{},
		inflight: map[string]int{},
		keyOf:    map[string]string{},
	}
	m.ExpireState()
	return m
}

// ExpireState drops the whole scheduler state (clock, tags, parked tags,
// anchor, cursor, registration order), as the state TTL does after a
// StateTTL with no scheduler write. Weights are configuration and stay.
func (m *Model) ExpireState() {
	m.v, m.epoch, m.cursor, m.nextSeq, m.gk, m.gn, m.gp = 0, 0, 0, 1, 0, 1, 0
	m.began, m.born = false, 0
	m.marked, m.mark = false, 0
	m.reg = map[string]*Reg{}
	m.idle = map[string]int64{}
}

// Born returns the time (ms) of the state's first discovery read and
// whether it happened (see discover): what Redis stores as the state's b.
func (m *Model) Born() (born int64, began bool) { return m.born, m.began }

// ColdMark returns the cold mark's time (ms) and whether it is set (see
// call.promote): what Redis stores as the state's cm (-1 when unset).
func (m *Model) ColdMark() (mark int64, marked bool) { return m.mark, m.marked }

// SetLimits changes the concurrency limits from the next call on.
func (m *Model) SetLimits(l Limits) { m.cfg.Limits = l }

// V returns the logical virtual clock in serves at weight 1 (computed from
// the exact integer, so it never decreases).
func (m *Model) V() float64 { return (float64(m.epoch)*RebaseBy + float64(m.v)) / Unit }

// Errors of the model's operations (the Lua reports the same conditions).
var (
	ErrExists      = errors.New("vtime: run exists")
	ErrNotFound    = errors.New("vtime: no such run")
	ErrNotInFlight = errors.New("vtime: run not in flight")
	ErrNotDead     = errors.New("vtime: run not dead")
)

// Entry is one member of a sorted set with its score.
type Entry struct {
	Member string
	Score  float64
}

// sortedEntries orders like a Redis ZSET: score, then member bytes.
func sortedEntries(m map[string]float64) []Entry {
	out := make([]Entry, 0, len(m))
	for k, v := range m {
		out = append(out, Entry{k, v})
	}
	sort.Slice(out, func(i, j int) bool { return less(out[i], out[j]) })
	return out
}

func less(a, b Entry) bool {
	return a.Score < b.Score || (a.Score == b.Score && a.Member < b.Member)
}

// RegEntry is a registered variant as Registered reports it.
type RegEntry struct {
	Member string
	Reg
}

// Registered returns the registered variants in competition order (tag,
// then registration order), the gated ones after the others.
func (m *Model) Registered() []RegEntry {
	out := make([]RegEntry, 0, len(m.reg))
	for vm, r := range m.reg {
		out = append(out, RegEntry{vm, *r})
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Gated != b.Gated {
			return !a.Gated
		}
		return regBefore(a.Reg, b.Reg)
	})
	return out
}

func regBefore(a, b Reg) bool { return a.U < b.U || (a.U == b.U && a.Seq < b.Seq) }

// Idle returns the parked tags in ZSET order (tag, member).
func (m *Model) Idle() []Entry {
	f := make(map[string]float64, len(m.idle))
	for vm, p := range m.idle {
		f[vm] = float64(p)
	}
	return sortedEntries(f)
}

// Clock returns the stored clock V (units), the epoch, the discovery
// cursor, the next registration number and the gating state (gk, gp): what
// Redis stores.
func (m *Model) Clock() (v, epoch int64, cursor int, nextSeq int64, gk int, gn, gp int64) {
	return m.v, m.epoch, m.cursor, m.nextSeq, m.gk, m.gn, m.gp
}

// MilliWeight returns the milli-weight of a variant member (1000: weight 1).
func (m *Model) MilliWeight(vm string) int64 {
	if w, ok := m.weights[vm]; ok {
		return w
	}
	return 1000
}

// Weight returns the weight of key's variant.
func (m *Model) Weight(key string) float64 {
	return float64(m.MilliWeight(keys.VariantMember(key))) / 1000
}

// MilliWeightOf converts a weight to milli-weight, rounding half up (the
// Lua rounds the same way); 0 for 0.
func MilliWeightOf(w float64) int64 {
	if w == 0 {
		return 0
	}
	return min(MaxMilliWeight, max(MinMilliWeight, int64(math.Floor(w*1000+0.5))))
}

// HeldAsDefault reports whether the scheduler holds weight w as 1, the
// default (1 to the nearest 0.001: 1.0004, 0.9996): setting it is no
// override, and SetWeight (here and runqueue's) clears instead.
func HeldAsDefault(w float64) bool { return MilliWeightOf(w) == 1000 }

// SetWeight sets (w > 0) or clears (w == 0, or HeldAsDefault(w): the default
// weight is no override, as runqueue's SetWeight of such a weight stores
// none) the weight of key. The new
// weight prices the serves from now on (the sub-unit remainder of the old
// stride is dropped), and it caps what the key still owes for its serves at
// the old weight: a tag above V plus one serve at the new weight (competing,
// gated or parked; not a newcomer's in the lane, which no serve set) comes
// down to it. A tag below stays: credit is never given. Without the cap, a
// key served once at weight 0.001 owes 1000 serves at weight 1, and raised
// to 1 it would wait for 1000 serves of every other key before its next
// (guarantees 2 and 12).
func (m *Model) SetWeight(key string, w float64) {
	vm := keys.VariantMember(key)
	if w == 0 || HeldAsDefault(w) {
		delete(m.weights, vm)
	} else {
		m.weights[vm] = MilliWeightOf(w)
	}
	// One serve at milli-weight mw leaves a tag at most ceil(strideNum/mw)
	// above its start (the carried remainder adds up to one unit), so the
	// cap never lowers a tag a serve at the new weight could have left.
	mw := m.MilliWeight(vm)
	limit := m.v + (strideNum+mw-1)/mw
	if r, ok := m.reg[vm]; ok {
		r.R = 0 // the remainder was of the old weight's stride
		if !r.Waiting && r.U > limit {
			r.U = limit
		}
	}
	if p, ok := m.idle[vm]; ok && p > limit {
		m.idle[vm] = limit
	}
}

// head returns the lowest (score, member) of a set.
func head(set map[string]float64) (Entry, bool) {
	var best Entry
	found := false
	for id, s := range set {
		e := Entry{id, s}
		if !found || less(e, best) {
			best, found = e, true
		}
	}
	return best, found
}

// CkIndex returns variant -> head ready score, in ZSET order.
func (m *Model) CkIndex() []Entry { return headIndex(m.ready) }

func (m *Model) delayIndex() []Entry { return headIndex(m.delayed) }

// headIndex is variant -> score of its set's head, in ZSET order.
func headIndex(sets map[string]map[string]float64) []Entry {
	idx := map[string]float64{}
	for vm, set := range sets {
		if h, ok := head(set); ok {
			idx[vm] = h.Score
		}
	}
	return sortedEntries(idx)
}

// addTo puts id with score into vm's set of sets, creating it, and reports
// whether the set was empty before.
func addTo(sets map[string]map[string]float64, vm, id string, score float64) bool {
	set := sets[vm]
	if set == nil {
		set = map[string]float64{}
		sets[vm] = set
	}
	set[id] = score
	return len(set) == 1
}

func (m *Model) readyScore(r *run) float64 {
	return float64(r.at - int64(r.priority)*m.cfg.PriorityStep)
}

// Enqueue adds a run. It returns ErrExists when the id is taken.
func (m *Model) Enqueue(id, key string, priority int, at, now int64) error {
	return m.enqueue(id, key, priority, at, now, true)
}

// EnqueueOff adds a run as an instance with the flag off does
// (enqueue.lua with lib/hooks_off): the run is queued, ready or delayed,
// and the scheduler state is not touched: a variant it makes ready stays
// untagged until a flag-on call discovers it (discover, or the age head)
// or another flag-on write registers it. It returns ErrExists when the id
// is taken.
func (m *Model) EnqueueOff(id, key string, priority int, at, now int64) error {
	return m.enqueue(id, key, priority, at, now, false)
}

// enqueue stores a new run (attempt 1) and queues it (requeue).
func (m *Model) enqueue(id, key string, priority int, at, now int64, flagOn bool) error {
	eid := keys.Segment(id)
	if _, ok := m.runs[eid]; ok {
		return ErrExists
	}
	r := &run{id: eid, key: key, priority: priority, at: at, attempt: 1}
	m.runs[eid] = r
	m.requeue(r, now, flagOn)
	return nil
}

func (m *Model) member(r *run) string {
	vm := keys.VariantMember(r.key)
	m.keyOf[vm] = r.key
	return vm
}

// place queues r as ready or delayed. A run that becomes its variant's
// ready head (the first, or earlier than the head: ckIndex changes)
// registers the variant unless it has a tag.
func (m *Model) place(r *run, now int64) {
	if vm, moved := m.put(r, now); moved {
		m.register(vm)
	}
}

// put queues r as ready or delayed, as the flag-off place does (no
// scheduler hook), and reports r's variant and whether r became its ready
// head (its ckIndex entry moved: where the flag-on place registers).
func (m *Model) put(r *run, now int64) (string, bool) {
	vm := m.member(r)
	if r.at <= now {
		r.state = Ready
		rs := m.readyScore(r)
		h, had := head(m.ready[vm])
		addTo(m.ready, vm, r.id, rs)
		return vm, !had || rs < h.Score
	}
	r.state = Delayed
	addTo(m.delayed, vm, r.id, float64(r.at))
	return vm, false
}

// laneHead returns the head of the newcomer lane (its waiting variant with
// the lowest registration number), or nil.
func (m *Model) laneHead() (string, *Reg) {
	var hv string
	var h *Reg
	for vm, r := range m.reg {
		if r.Waiting && (h == nil || r.Seq < h.Seq) {
			hv, h = vm, r
		}
	}
	return hv, h
}

// competing reports whether a registration takes part in pass 1: not
// gated, and not queued in the lane behind its head.
func (m *Model) competing(r *Reg, head *Reg) bool {
	return !r.Gated && (!r.Waiting || r == head)
}

// topActive returns the highest tag among the competing registrations: the
// pack a newcomer queues behind.
func (m *Model) topActive() (int64, bool) {
	_, head := m.laneHead()
	var top int64
	has := false
	for _, r := range m.reg {
		if m.competing(r, head) && (!has || r.U > top) {
			top, has = r.U, true
		}
	}
	return top, has
}

// laneNext gives the lane its next head when the head left it (served,
// gated, drained or collected): at max(V, t), where t is one quantum of the
// new head past the old head's serve at start (served), or the tag of a
// head that left unserved (start), so newcomers that leave without service
// never push later ones back. It returns the new head, if any.
func (m *Model) laneNext(start int64, served bool) regRef {
	vm, r := m.laneHead()
	if r != nil {
		t := start
		if served {
			t += m.quantum(vm)
		}
		r.U, r.R = max(m.v, t), 0
	}
	return regRef{vm, r}
}

// quantum is a newcomer's offset: one serve of vm, at most Unit (a serve
// at weight 1). With equal weights every key's serve costs the same, so a
// newcomer queues one serve of its own behind the pack; a low-weight
// newcomer (a serve above Unit) queues no further back than a weight-1 one.
func (m *Model) quantum(vm string) int64 {
	return min(Unit, strideNum/m.MilliWeight(vm))
}

// register gives a variant that gained its first ready run a tag (see the
// package comment, Registration), unless it has one.
func (m *Model) register(vm string) {
	if _, ok := m.reg[vm]; ok {
		return
	}
	top, has := m.topActive()
	m.registerAt(vm, top, has, false)
}

// registerAt registers vm with top as the highest competing tag: a
// returning variant (parked tag above V) at its parked tag; a discovered
// one (found untagged in ckIndex with work ready before the state's first
// discovery read, see discover; or by the age head, which looks only when
// nothing registered is servable) at V; any other by the newcomer rule:
// behind the lane's head when the lane is not empty; else, with q its
// quantum and A = min(top, V+q), at V when A <= V (nothing is ahead: cold
// start), or as the lane's head at A+q.
// A parked tag at or below V is worth nothing: it goes, whenever a call
// reaps or not.
func (m *Model) registerAt(vm string, top int64, hasTop, discovered bool) *Reg {
	r := &Reg{Seq: m.nextSeq}
	p, parked := m.idle[vm]
	delete(m.idle, vm)
	switch {
	case parked && p > m.v:
		r.U = p
	case discovered:
		r.U = m.v
	default:
		if _, h := m.laneHead(); h != nil {
			r.Waiting = true
			break
		}
		r.U = m.v
		q := m.quantum(vm)
		if a := min(top, m.v+q); hasTop && a > m.v {
			r.U, r.Waiting = a+q, true
		}
	}
	m.nextSeq++
	m.reg[vm] = r
	return r
}

// park keeps a leaving variant's tag when it is above V (it owes service).
func (m *Model) park(vm string, u int64) bool {
	delete(m.reg, vm)
	if u > m.v {
		m.idle[vm] = u
		return true
	}
	return false
}

// leaveLane takes r out of the lane when it waits there; a head that
// leaves unserved hands its tag to the next head, which it returns.
func (m *Model) leaveLane(r *Reg) regRef {
	if !r.Waiting {
		return regRef{}
	}
	_, head := m.laneHead()
	r.Waiting = false
	if r != head {
		return regRef{}
	}
	return m.laneNext(r.U, false)
}

// drained handles a variant whose last ready run left outside a dequeue.
func (m *Model) drained(vm string) {
	r, ok := m.reg[vm]
	if !ok {
		return
	}
	m.leaveLane(r)
	if m.park(vm, r.U) {
		m.reapIdle()
	}
}

// released handles a freed in-flight slot of vm (ack, nack, recovery, dead
// letter): a gated variant competes again, at max(S, V), whatever the key
// limit is now. (The model is one instance, and it gated the variant; the
// scripts look on an instance that has given a queue a key limit, so an
// instance that never had one frees slots as a flag-off one does.) (Skipping the look when the queue has no key limit lost
// the release when the limit went away and came back between two calls:
// the variant stayed gated below its limit until the probe came to it.)
func (m *Model) released(vm string) {
	if r, ok := m.reg[vm]; ok && r.Gated {
		m.ungate(r)
	}
}

func (m *Model) ungate(r *Reg) {
	r.Gated, r.Gate = false, 0
	if r.U < m.v {
		r.U, r.R = m.v, 0
	}
}

// Served is one run a dequeue took. Expired: its TTL had passed (a run
// never delivered whose deadline is at or before the call's time), and it
// was deleted, not delivered. Swept (Expired too): it came to the head of
// its variant while the call served, and the call had swept fewer than
// TTLLook: the call deleted it there as the TTL sweep would, before
// choosing, so it is no serve (its key is not charged, nothing moves in
// the fair order) and counts neither for the call's capacity nor for its
// key's limit. An expired run not swept (the call had swept TTLLook) was
// taken as any other run (its key is charged for it, and it counts for
// the call's capacity and its key's limit within the call), then deleted
// instead of delivered, its slot freed as an ack frees one (see
// expireTaken).
type Served struct {
	ID      string // encoded id
	Key     string
	Attempt int
	Expired bool
	Swept   bool
}

// call is the working state of one Dequeue.
type call struct {
	m        *Model
	cap      int
	n        int   // runs taken that count for cap (not swept)
	now      int64 // the call's time
	swept    int   // runs swept at their variant's head (sweepHead)
	keyLimit int
	scan     int
	out      []Served
	parked   bool
}

// Dequeue serves up to maxCount runs at time now, in phases that the Lua
// (dequeue_vtime.lua) follows with the same names, each marked there by a
// comment "-- NAME:": capacity, promote, ungate (with the gated probe),
// discover, serve (pass 1 with the age head as fallback), collect and
// persist (here the model writes as it goes), rebase.
func (m *Model) Dequeue(maxCount int, now int64) []Served {
	c := &call{m: m, keyLimit: m.cfg.Limits.Key}
	if c.cap = m.capacity(maxCount); c.cap <= 0 {
		return nil
	}
	c.now = now
	c.scan = m.scanOf(maxCount)
	c.promote(now, maxCount)
	c.ungateRise()
	c.probeGated()
	c.discover()
	c.serve(maxCount)
	if c.parked {
		m.reapIdle()
	}
	m.rebase()
	m.expireTaken(c.out, now, true)
	return c.out
}

// DequeueCalls is a dequeue of maxCount as runqueue's Queue.Dequeue makes
// it: a call (Dequeue, or DequeueOff when !flagOn), and while a call took
// runs past their TTL that it did not sweep (they counted for its
// capacity) and fewer than maxCount were delivered, a call of
// the rest, at most again more. It returns every run the calls took, in
// order (the expired ones marked), and how many calls it made.
func (m *Model) DequeueCalls(maxCount int, now int64, again int, flagOn bool) ([]Served, int) {
	var out []Served
	left := maxCount
	for calls := 1; ; calls++ {
		var got []Served
		if flagOn {
			got = m.Dequeue(left, now)
		} else {
			got = m.DequeueOff(left, now)
		}
		expired := 0
		for _, s := range got {
			switch {
			case s.Swept:
			case s.Expired:
				expired++
			default:
				left--
			}
		}
		out = append(out, got...)
		if left == 0 || expired == 0 || calls > again {
			return out, calls
		}
	}
}

// SetTTL gives queued run id a TTL deadline (ms): a dequeue that takes it
// at or after the deadline expires it (see Served). The deadline binds
// until the run's first delivery.
func (m *Model) SetTTL(id string, deadline int64) {
	if r, ok := m.runs[keys.Segment(id)]; ok && (r.state == Ready || r.state == Delayed) && r.attempt == 1 {
		r.ttl = deadline
	}
}

// expireTaken ends a dequeue: each run it took whose TTL passed by now is
// deleted and its slot freed as an ack of a flag-on (flagOn) or flag-off
// instance frees it (settle); the others are delivered, and their TTL no
// longer binds. As the Lua's dq_finish, which reads the taken runs'
// records to move them in flight; the flag-on script frees the expired
// runs' slots last (after the rebase), as an ack sent right after the
// call would.
func (m *Model) expireTaken(out []Served, now int64, flagOn bool) {
	for i := range out {
		if out[i].Swept {
			continue // deleted where it was swept
		}
		r := m.runs[out[i].ID]
		if r.ttl > 0 && r.ttl <= now {
			out[i].Expired = true
			m.settle(r, flagOn)
			delete(m.runs, r.id)
			continue
		}
		r.ttl = 0
	}
}

// anyDue reports whether a queued run (ready or delayed) has passed its
// TTL by now: a call may sweep then, and reads as far as that may take it
// (the Lua asks the shard's TTL set: lib/dequeue's dq_due).
func (m *Model) anyDue(now int64) bool {
	for _, r := range m.runs {
		if r.ttl > 0 && r.ttl <= now && (r.state == Ready || r.state == Delayed) {
			return true
		}
	}
	return false
}

// sweepHead deletes the head run of vm when its TTL passed by now and the
// call swept fewer than TTLLook (*swept counts them): a sweep, no serve
// (Served.Swept). It reports whether it did.
func (m *Model) sweepHead(vm string, now int64, swept *int) (Served, bool) {
	if *swept >= TTLLook {
		return Served{}, false
	}
	h, _ := head(m.ready[vm])
	r := m.runs[h.Member]
	if r.ttl <= 0 || r.ttl > now {
		return Served{}, false
	}
	*swept++
	delete(m.ready[vm], h.Member)
	delete(m.runs, r.id)
	return Served{ID: r.id, Key: r.key, Attempt: r.attempt, Expired: true, Swept: true}, true
}

// capacity is what the env and queue limits leave of maxCount.
func (m *Model) capacity(maxCount int) int {
	lim := m.cfg.Limits
	queueN := 0
	for _, n := range m.inflight {
		queueN += n
	}
	capacity := maxCount
	if lim.Env > 0 {
		capacity = min(capacity, lim.Env-queueN-m.EnvOther-m.EnvAhead)
	}
	if lim.Queue > 0 {
		capacity = min(capacity, lim.Queue-queueN)
	}
	return capacity
}

// PromoteLook is how many times scan due variants a call looks at when
// more than scan are due (see call.promote).
const PromoteLook = 4

// PromoteLookMore is how many looks of PromoteLook x scan due variants a
// call reads at most while those it read hold fewer than scan below
// their key limit (see call.promote), and PromoteLookCap how many due variants
// the further looks may bring the call's look to (the first look is read
// whatever its size: with a scan of 1,000 or more there is none further).
const (
	PromoteLookMore = 10
	PromoteLookCap  = 4000
)

// PromoteLookMax is how many due variants a call of the given scan looks
// at in all at most: PromoteLookMore looks of PromoteLook*scan, the last
// cut to PromoteLookCap, one look at least. It never falls as the scan
// grows, so a coalesced call (the sum of its calls' scans) reaches as far
// as each of its calls would. (helper-177: whole looks within the cap
// reached 3,600 at a scan of 300 and 2,400 at 600, and two coalesced calls
// of 300 served nothing for 40 calls where each alone served a free key
// behind 2,500 held keys.)
func PromoteLookMax(scan int) int {
	look := PromoteLook * scan
	return max(look, min(PromoteLookCap, PromoteLookMore*look))
}

// promote moves due delayed runs to ready (registering the variants that
// gain a ready run), as many of each variant it reaches as PromotePlan
// gives it. It reaches scan due variants at most: all of them when no more
// are due. Else it looks at the first PromoteLook*scan in the delay
// index's order and reaches first those that hold no ready run (they have
// nothing to serve until a promotion), keeping scan/4 places for the
// others (which the scheduler can serve meanwhile, but whose due runs, a
// retry of higher priority say, must not wait for ever), each group in
// that order, and fills the places one group leaves with the other. So a
// burst of delayed runs of many keys falling due together cannot hold a
// key due behind it: once promoted, the burst's keys have ready runs and
// give way to the keys that have none (docs/design.md, "Dequeue"). The
// variants at their key limit that have a ready run (held: nothing
// promoted for them can be served until a slot frees) come after all the
// others, and those at it without one after the others without one; and
// while the variants looked at hold fewer than scan below their key limit,
// the call looks at PromoteLook*scan more, up to PromoteLookMore looks and
// PromoteLookCap variants in all, so that keys held at their limit with
// due backlogs in front of the delay index no longer shut a free key out
// of the promotion (helper-172: 130 such keys of 500 due runs, key limit
// 1, calls of 10: a free key's run due 1 ms after theirs promoted and
// served after 130 calls, every one of them empty). A held variant's due
// runs wait while free ones fill the places: once a slot frees it is a
// free variant again.
//
// The cold mark: a call that reaches fewer variants than are due (more
// than scan) on a cold state (the lane empty and no competing tag above V,
// where a newcomer registers at V) sets the mark to the time the last of
// them fell due (the latest delay index score at or before its time: not
// its own clock, which may run ahead of the producers', helper-185: a
// dequeuer 60 s ahead marked a minute of new keys' work, which then came
// at V past the lane while other keys were served); a variant a
// later promotion registers whose first due run (its delay index score
// when the call starts) is at or before the mark registers at V, as a
// discovered one (a parked tag above V still first), not through the
// lane: work due together on a cold state registers together, as if the
// call had reached it all, as when the same runs are enqueued ready.
// (helper-165: 100 tenants of 40 runs due together into an idle queue,
// calls of 10: the ScanLimit first by name registered at V and the rest
// came through the lane, one key's share together: the 30 first took 997
// of the first 1,000 serves, the last was first served at call 321.) A
// call that promotes and finds no delayed variant due at or before the
// mark after its promotion drops it. Work due after the mark registers as
// before (a newcomer, at V only on a cold state).
func (c *call) promote(now int64, maxCount int) {
	m := c.m
	cold := m.cold()
	vms, due := m.dueVariants(now, PromoteLook*c.scan)
	if len(vms) == 0 {
		return
	}
	cut, lastDue := len(vms) > c.scan, int64(0)
	if cut {
		lastDue = m.lastDue(now)
		vms, due = m.starvingFirst(now, vms, due, c.scan)
	}
	var found []bool
	if m.marked {
		found = make([]bool, len(vms))
		for i, vm := range vms {
			h, _ := head(m.delayed[vm])
			found[i] = h.Score <= float64(m.mark)
		}
	}
	m.promotePlanned(vms, due, now, maxCount, true, found)
	switch {
	case cut && cold:
		if !m.marked || lastDue > m.mark {
			m.mark = lastDue
		}
		m.marked = true
	case m.marked:
		if h := m.delayIndex(); len(h) == 0 || h[0].Score > float64(m.mark) {
			m.marked, m.mark = false, 0
		}
	}
}

// lastDue is the latest delay index score at or before now: the time the
// last of the due variants fell due.
func (m *Model) lastDue(now int64) int64 {
	var last int64
	for _, e := range m.delayIndex() {
		if e.Score > float64(now) {
			break
		}
		last = int64(e.Score)
	}
	return last
}

// cold reports whether a newcomer would register at V now: the lane is
// empty and no competing tag is above V (registerAt's cold start).
func (m *Model) cold() bool {
	if _, h := m.laneHead(); h != nil {
		return false
	}
	top, has := m.topActive()
	return !has || top <= m.v
}

// promotePlanned promotes the due runs of vms (due: how many each holds)
// as PromotePlan divides them for a call of maxCount, a variant with as
// many runs in flight as the key limit counting as held: each variant's
// first share, then the rest, registering as place does when flagOn, else
// as put does (a flag-off call); a variant of vms with found[i] (its first
// due run at or before the cold mark: see call.promote) registers as a
// discovered one, at V.
func (m *Model) promotePlanned(vms []string, due []int, now int64, maxCount int, flagOn bool, found []bool) {
	plan, first := PromotePlan(m.cfg.PromoteLimit, maxCount, due, m.atKeyLimit(vms))
	if flagOn {
		plan, first = PromotePlanWeighted(m.cfg.PromoteLimit, maxCount, due, m.atKeyLimit(vms), m.promoteWeights(vms))
	}
	at := func(i int) bool { return found != nil && found[i] }
	for i, vm := range vms {
		m.promoteBy(vm, now, first[i], flagOn, at(i))
	}
	for i, vm := range vms {
		if more := plan[i] - first[i]; more > 0 {
			m.promoteBy(vm, now, more, flagOn, at(i))
		}
	}
}

// promoteWeights is the milli-weight of each variant of vms, for a
// flag-on call's promotion (PromotePlanWeighted), as the Lua reads them.
func (m *Model) promoteWeights(vms []string) []int64 {
	out := make([]int64, len(vms))
	for i, vm := range vms {
		out[i] = m.MilliWeight(vm)
	}
	return out
}

// atKeyLimit is, for each variant of vms, whether it has as many runs in
// flight as the key limit (nil without a key limit): PromotePlan's held.
func (m *Model) atKeyLimit(vms []string) []bool {
	k := m.cfg.Limits.Key
	if k <= 0 {
		return nil
	}
	out := make([]bool, len(vms))
	for i, vm := range vms {
		out[i] = m.inflight[vm] >= k
	}
	return out
}

// starvingFirst picks n of the due variants vms (with their due runs, the
// first PromoteLook*n of the delay index at now): those without a ready
// run (starving) first, those below their key limit before those at it,
// n - n/4 of them at most when there are others (fed) below their limit,
// then those fed, then more starving in the room the fed left; then, in
// the room left, those fed at their key limit (held with a ready run:
// nothing promoted for them can be served until a slot frees, and they
// have runs to serve then); each group in the delay index's order. While
// a full look holds fewer than n below their key limit, it looks at the
// next PromoteLook*n due variants too, up to PromoteLookMore looks and
// PromoteLookCap variants in all. (helper-176: with every variant at its
// limit last, free variants with ready runs in front held the starving
// held ones, and with them the whole front, in place: a free key behind
// them served at call 508 against 16 before held variants came last;
// helper-175: the held taken in the delay index's order moved a held front
// past the look 75 due runs a call instead of 121.)
func (m *Model) starvingFirst(now int64, vms []string, due []int, n int) ([]string, []int) {
	var starving, fed, heldStarving, heldFed []int
	classify := func(from int) {
		at := m.atKeyLimit(vms[from:])
		for i := from; i < len(vms); i++ {
			held, ready := at != nil && at[i-from], len(m.ready[vms[i]]) > 0
			switch {
			case held && ready:
				heldFed = append(heldFed, i)
			case held:
				heldStarving = append(heldStarving, i)
			case ready:
				fed = append(fed, i)
			default:
				starving = append(starving, i)
			}
		}
	}
	classify(0)
	look, reach := PromoteLook*n, PromoteLookMax(n)
	for got := look; got < reach && len(vms) == got && len(starving)+len(fed) < n; {
		from := len(vms)
		got = min(reach, got+look)
		vms, due = m.dueVariants(now, got)
		classify(from)
	}
	starving, fed = append(starving, heldStarving...), append(fed, heldFed...)
	s := min(len(starving), n-min(len(fed), n/4))
	picked := slices.Concat(starving[:s], fed[:min(len(fed), n-s)])
	var rv []string
	var rd []int
	for _, i := range picked {
		rv, rd = append(rv, vms[i]), append(rd, due[i])
	}
	return rv, rd
}

// dueVariants is the first n variants of the delay index with a due run
// at now, in its order, and how many due runs each holds.
func (m *Model) dueVariants(now int64, n int) (vms []string, due []int) {
	for i, e := range m.delayIndex() {
		if i >= n || e.Score > float64(now) {
			break
		}
		k := 0
		for _, at := range m.delayed[e.Member] {
			if at <= float64(now) {
				k++
			}
		}
		vms, due = append(vms, e.Member), append(due, k)
	}
	return vms, due
}

// PromotePlan is how many due delayed runs a flag-off dequeue call of
// maxCount promotes of each due variant it reaches, given their due runs
// in the delay index's order, where one variant gives at most limit, and
// which of them are held (held[i]: at its key limit, so that the call
// cannot serve it; nil: none). The call's budget is max(limit, maxCount),
// spent in three passes (the Lua makes the same three). First every
// variant takes up to the same share, fixed when the call starts:
// min(limit, ceil(budget / variants)). Then, of what they left of the
// budget, those that filled their share take up to the same share again:
// ceil(left / those variants), within limit. Then those that filled that
// second share take what is still left, in order, within limit. Only the
// third pass, which takes what the second left unused, goes by a variant's
// place in the order (the delay index's: due time, then member). (A share
// of what was left, given in turn, handed each variant's unused runs, and
// the rounding up, to the variants after it, the same ones in every call
// while their due times were equal: 60 variants and a budget of 100
// promoted 2 runs a call to the first 40 and 1 to the others.) A flag-on
// call follows PromotePlanWeighted, whose later passes go by weight, not
// by order; the flag-off scripts are pinned.
//
// Then the variants at their key limit (held: the call cannot serve them)
// keep what they took, and the others take as much again among them, in a
// second and a third pass as above over those not held that filled their
// first share: the budget goes whole to the variants the call can serve
// (counted in it, five keys at their limit among ten with due runs took
// half of every call of 100: 50 runs served a call), while a held
// variant's due runs leave the front of the delay index exactly as fast
// as when they counted. (helper-131, helper-132: a held variant given less
// than that, its first share only or what the others left, made a fed
// key's retry due behind held keys wait 151-251 calls instead of 92.) So
// every variant reached gains a run, a call promotes fewer than 2 x
// (budget + len(due)) runs however many are due (fewer than budget +
// len(due) before the held variants' runs go again: a pass's shares,
// rounded up, exceed what it shares by less than the variants it shares
// among), and at least the budget on the variants not held when they hold
// that many within limit each. plan is the total of each, first what the
// first pass took.
func PromotePlan(limit, maxCount int, due []int, held []bool) (plan, first []int) {
	return promotePlan(limit, maxCount, due, held, nil, spreadLeft)
}

// PromotePlanWeighted is the plan of a flag-on call, PromotePlan's with
// shares by the variants' milli-weights (milli[i]; nil: a queue without
// weights, every variant alike). The first pass gives each min(limit,
// ceil(budget x milli[i] / the variants' sum)). What it leaves then goes
// to those that filled their share by weighted water-filling
// (fillByWeight): each takes its part of it by weight, up to what it has
// due within limit, and what a variant cannot take goes to the others by
// weight again, so no part goes by a variant's place in the order; the
// held variants' runs go again to the variants not held in the same way.
// So, within the rounding up of two or three shares, every variant that
// could take more has as many runs per unit of weight as any other:
// plan[j] < plan[i] x milli[j] / milli[i] + 3 for such an i and every j.
// (helper-168: with an even second pass, what a heavy key left, with few
// runs due or at its key limit, went evenly to the others: w3's share of
// w1 + w3 0.579 where 0.750 is due; helper-170: with the third pass in
// order, a heavy key that ran out of due runs left its part to the keys
// first in the delay index, 0.407 where 0.750 is due, 512 inversions in
// 200,000 random plans.) Weights hold only while each key's part, budget
// x w / the sum, is within limit: a key capped there leaves the rest to
// the others, which raises the lighter keys towards the limit too. Where a
// call serves about as many runs as it promotes (every key's work delayed
// and due, maxCount near the budget), the promotion decides the serves:
// with even shares a key of weight 10 among 29 of weight 1 was served as
// one of them (helper-165: 0.040 of the serves at maxCount 100, against 10
// / 39 = 0.256). The bounds are PromotePlan's: every variant reached gains
// a run, fewer than 2 x (budget + len(due)) in all, the budget whole to
// the variants not held when they hold that many.
func PromotePlanWeighted(limit, maxCount int, due []int, held []bool, milli []int64) (plan, first []int) {
	if milli == nil {
		milli = make([]int64, len(due))
		for i := range milli {
			milli[i] = 1000
		}
	}
	return promotePlan(limit, maxCount, due, held, milli, fillByWeight)
}

// promotePlan is PromotePlan's and PromotePlanWeighted's plan: the first
// pass by shareOf (milli nil: even), then spread over those that filled
// their share with what the first pass left, then the held variants'
// runs spread again over those of them not held.
func promotePlan(limit, maxCount int, due []int, held []bool, milli []int64,
	spread func(limit int, due, plan, among []int, total int, milli []int64)) (plan, first []int) {
	budget := max(limit, maxCount)
	plan, first = make([]int, len(due)), make([]int, len(due))
	if len(due) == 0 {
		return plan, first
	}
	all := make([]int, len(due))
	for i := range all {
		all[i] = i
	}
	part := shareOf(budget, milli, all)
	left := budget
	var filled []int
	for i, d := range due {
		share := min(limit, part(i))
		first[i] = min(d, share)
		left -= first[i]
		if first[i] == share {
			filled = append(filled, i)
		}
	}
	copy(plan, first)
	if left > 0 {
		spread(limit, due, plan, filled, left, milli)
	}
	if held == nil {
		return plan, first
	}
	// What the held variants took goes again to the others.
	more, free := 0, []int(nil)
	for _, i := range filled {
		if !held[i] {
			free = append(free, i)
		}
	}
	for i := range due {
		if held[i] {
			more += plan[i]
		}
	}
	if more > 0 {
		spread(limit, due, plan, free, more, milli)
	}
	return plan, first
}

// spreadLeft is PromotePlan's second and third passes over the variants
// among (those that filled their first share), adding to plan: each takes
// up to the same share of left, ceil(left / len(among)), within limit;
// those that filled that take what is still left, in order, within limit.
// (milli is unused: PromotePlan's shares are even.)
func spreadLeft(limit int, due, plan, among []int, left int, _ []int64) {
	if len(among) == 0 {
		return
	}
	second := ceilDiv(left, len(among))
	var again []int
	for _, i := range among {
		want := min(second, limit-plan[i])
		more := min(want, due[i]-plan[i])
		plan[i] += more
		left -= more
		if more == want && want > 0 {
			again = append(again, i)
		}
	}
	for _, i := range again {
		if left <= 0 {
			break
		}
		more := min(limit-plan[i], left, due[i]-plan[i])
		plan[i] += more
		left -= more
	}
}

// fillByWeight is PromotePlanWeighted's later passes: total goes to the
// variants among (their indexes), adding to plan, by weighted
// water-filling. Each can take cap = min(limit, due) - plan more; in
// increasing order of cap / milli, a variant whose cap is within its part
// by weight of what is still to give, cap <= total x milli / the sum of
// milli over those not yet given, takes its cap, and the others take their
// part of what is left then, ceil(total x milli / sum), which is within
// their cap (their cap / milli is larger). The result does not depend on
// how ties in that order are broken (a variant within its part leaves the
// others a larger part each); the Lua promotes the variants in the order
// the call reached them. It gives all of total when the caps hold that
// much, and less than total + len(among) in all.
func fillByWeight(limit int, due, plan, among []int, total int, milli []int64) {
	var cand []int
	capOf := make(map[int]int64, len(among))
	for _, i := range among {
		if c := min(limit, due[i]) - plan[i]; c > 0 {
			cand = append(cand, i)
			capOf[i] = int64(c)
		}
	}
	sort.SliceStable(cand, func(a, b int) bool {
		i, j := cand[a], cand[b]
		return capOf[i]*milli[j] < capOf[j]*milli[i]
	})
	var sum int64
	for _, i := range cand {
		sum += milli[i]
	}
	t, k := int64(total), 0
	for ; k < len(cand); k++ {
		i := cand[k]
		if capOf[i]*sum > t*milli[i] {
			break
		}
		plan[i] += int(capOf[i])
		t -= capOf[i]
		sum -= milli[i]
	}
	for _, i := range cand[k:] {
		plan[i] += int(ceilDiv64(t*milli[i], sum))
	}
}

// shareOf is each variant's share of total among the variants among (their
// indexes): ceil(total / len(among)), or with milli a share by weight,
// ceil(total x milli[i] / their sum over among).
func shareOf(total int, milli []int64, among []int) func(i int) int {
	if milli == nil {
		even := ceilDiv(total, len(among))
		return func(int) int { return even }
	}
	var sum int64
	for _, i := range among {
		sum += milli[i]
	}
	return func(i int) int { return int(ceilDiv64(int64(total)*milli[i], sum)) }
}

// ceilDiv is a / b rounded up, for a >= 0 and b > 0.
func ceilDiv(a, b int) int { return (a + b - 1) / b }

// ceilDiv64 is ceilDiv for int64.
func ceilDiv64(a, b int64) int64 { return (a + b - 1) / b }

// promoteBy moves up to limit due delayed runs of vm to ready, registering
// as place does when flagOn, else as put does (no scheduler hook); found:
// vm registers, when it does, as a discovered variant (the cold mark).
func (m *Model) promoteBy(vm string, now int64, limit int, flagOn, found bool) {
	set := m.delayed[vm]
	due := sortedEntries(set)
	for i, e := range due {
		if i >= limit || e.Score > float64(now) {
			break
		}
		delete(set, e.Member)
		r := m.runs[e.Member]
		if !flagOn || !found {
			m.requeue(r, now, flagOn) // due: it goes to ready
			continue
		}
		if _, moved := m.put(r, now); moved {
			if _, ok := m.reg[vm]; !ok {
				m.registerAt(vm, 0, false, true)
			}
		}
	}
	if len(set) == 0 {
		delete(m.delayed, vm)
	}
}

// requeue queues r (ready or delayed) as a flag-on instance does (place:
// a variant that gains a ready head registers) when flagOn, else as a
// flag-off one does (put).
func (m *Model) requeue(r *run, now int64, flagOn bool) {
	if flagOn {
		m.place(r, now)
	} else {
		m.put(r, now)
	}
}

// settle frees r's in-flight slot as a flag-on instance does (release: a
// gated variant competes again) when flagOn, else as a flag-off one does
// (free).
func (m *Model) settle(r *run, flagOn bool) {
	if flagOn {
		m.release(r)
	} else {
		m.free(r)
	}
}

// ungateRise returns every gated variant to the competition when the key
// limit rose above the one they were gated under (or went away): each
// competes again at max(S, V); those still at the new limit are gated
// again when a call meets them.
func (c *call) ungateRise() {
	m := c.m
	k := c.keyLimit
	if m.gk == 0 || (k > 0 && k <= m.gk) {
		return
	}
	for _, g := range m.gatedSorted() {
		m.ungate(g.r)
	}
	m.gk, m.gp = k, 0
}

// regRef is a registration and its variant.
type regRef struct {
	vm string
	r  *Reg
}

// gatedSorted returns the gated registrations in gating order.
func (m *Model) gatedSorted() []regRef {
	var out []regRef
	for vm, r := range m.reg {
		if r.Gated {
			out = append(out, regRef{vm, r})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].r.Gate < out[j].r.Gate })
	return out
}

// probeGated looks at one gated variant per call: the first in gating
// order (gp keeps the number it looked at). One below its limit (its slot
// was freed by an instance that does not un-gate: flag off) competes
// again; one still at its limit takes the next gating number, behind every
// gated variant. So the gated variants are a queue that the probe takes
// from the front and that variants gated since join at the back: each is
// looked at within as many calls as there are gated variants ahead of it,
// however often other keys are gated again meanwhile. (The probe once went
// on from the number it looked at last, back to the first only past the
// end, and moved nothing: keys gated again at every call kept a variant
// ahead of it, which then never went back, and a variant looked at just
// before its slot was freed without a word waited for ever. Taking the
// front, not the first after gp, also heals a state that rule wrote, whose
// looked-at variants lie at or below gp.) One look per call keeps the cost
// of a call the same whatever the number of gated variants.
func (c *call) probeGated() {
	m := c.m
	all := m.gatedSorted()
	if len(all) == 0 {
		m.gp = 0
		return
	}
	g := all[0]
	m.gp = g.r.Gate
	if !c.atLimit(g.vm) {
		m.ungate(g.r)
		return
	}
	g.r.Gate = m.gn
	m.gn++
}

// atLimit reports whether vm's in-flight runs (this call's serves
// included) reach the key limit.
func (c *call) atLimit(vm string) bool {
	return c.keyLimit > 0 && c.m.inflight[vm] >= c.keyLimit
}

// discover reads scan variants of ckIndex at the rotating cursor and
// registers those with no tag. Every call does this, so every variant with
// ready work is reached within ceil(variants/scan) calls whatever stale
// state exists.
//
// A variant found untagged registers at V (registerAt's discovered) when
// its work was ready before the state could see it (written with the flag
// off, or before the state expired), at any scale; else by the newcomer
// rule, as a flag-on writer's enqueue would have registered it: its work
// became ready while the state was there (a flag-off producer's new key,
// a key written while the flag was off and the state kept). Registered at
// V whenever found, an endless supply of such keys took every serve: each
// serve started at V, V never moved, and the tagged keys and the lane
// waited for as long as they kept coming (helper-154: a backlogged key
// served once in 1,500 serves beside 5 new keys a call written flag off).
//
// "Before" is by time: the state's first discovery read (the first that
// reads any of ckIndex since the state began: a flag flip, the state's
// expiry) records its call's time, born, and a variant is old when its
// head run (the first of its ready runs) became available (at) at or
// before born. The run's available time, not its ready score, which a
// priority moves earlier by up to 9 x PriorityStep. Counts and positions
// cannot tell old from new: a first lap ended when a read first reached
// ckIndex's end never ended under a flood that grew ckIndex as fast as the
// cursor moved (helper-156); a bounded first read left the keys past it,
// after an expiry over more keys, waiting in the lane (helper-157); a lap
// counted in the positions there were missed old keys that flag-off
// serves or prioritised runs moved behind the cursor, which then waited
// in the lane (helper-159).
func (c *call) discover() {
	m := c.m
	index := m.CkIndex()
	end := min(len(index), m.cursor+c.scan)
	if !m.began && end > m.cursor {
		m.began, m.born = true, c.now
	}
	for i := m.cursor; i < end; i++ {
		vm := index[i].Member
		if _, ok := m.reg[vm]; ok {
			continue
		}
		if h, _ := head(m.ready[vm]); m.runs[h.Member].at <= m.born {
			m.registerAt(vm, 0, false, true)
		} else {
			top, has := m.topActive()
			m.registerAt(vm, top, has, false)
		}
	}
	// The next call starts cap entries before the end of this chunk: a
	// serve moves at most one variant from before an unread one to after
	// it, so no variant whose head stays put slips past the cursor.
	if m.cursor+c.scan >= len(index) {
		m.cursor = 0
	} else {
		m.cursor += max(1, c.scan-c.cap)
	}
}

// window is the part of the active tags one call has read: the first
// entries in (tag, registration) order, kept sorted as tags change. An
// entry whose new tag sorts after the last entry read waits in overflow
// until a further read passes it.
type window struct {
	snap     []*wentry // the active tags as they stood when serving began
	read     int       // entries of snap read so far
	last     Reg       // the last entry read, as it was read
	list     []*wentry
	overflow []*wentry
	budget   int
	first    int             // size of the first read
	seen     map[string]bool // variants read or added by this call
}

type wentry struct {
	vm string
	Reg
}

func (w *window) more() bool { return w.read < len(w.snap) }

// insert puts e in the list when it sorts before the bound (the last
// entry read), else in overflow until a read passes it; once the read
// budget is spent, no read will, and e goes to the list at its rank.
func (w *window) insert(e *wentry) {
	if w.more() && w.read > 0 && w.read < w.budget && regBefore(w.last, e.Reg) {
		w.overflow = append(w.overflow, e)
		return
	}
	w.place(e)
}

// place puts e in the list at its rank, whatever the bound.
func (w *window) place(e *wentry) {
	i := sort.Search(len(w.list), func(i int) bool { return regBefore(e.Reg, w.list[i].Reg) })
	w.list = append(w.list, nil)
	copy(w.list[i+1:], w.list[i:])
	w.list[i] = e
}

// extend reads the next chunk: the first read takes w.first entries, each
// further one as many as were read so far, never past the budget. Every
// entry read sorts after every entry of the list.
func (w *window) extend() bool {
	if !w.more() || w.read >= w.budget {
		return false
	}
	n := w.first
	if w.read > 0 {
		n = w.read
	}
	n = min(n, w.budget-w.read, len(w.snap)-w.read)
	for _, e := range w.snap[w.read : w.read+n] {
		w.seen[e.vm] = true
	}
	w.list = append(w.list, w.snap[w.read:w.read+n]...)
	w.read += n
	w.last = w.snap[w.read-1].Reg
	// Overflow entries the new bound passes join the list.
	over := w.overflow
	w.overflow = nil
	for _, e := range over {
		w.insert(e)
	}
	return true
}

func (w *window) remove(e *wentry) {
	for i, x := range w.list {
		if x == e {
			w.list = append(w.list[:i], w.list[i+1:]...)
			return
		}
	}
}

// serve runs the serves of one call: each picks the first servable variant
// of the window (pass 1); entries met on the way that have no ready run
// (stale: only a flag-off drain leaves them) are collected, those at their
// key limit are gated, both for good. When pass 1 runs dry, the first scan
// variants of ckIndex in age order are registered if they have no tag (the
// age head, what a flag-off call would serve), once per call.
func (c *call) serve(maxCount int) {
	m := c.m
	w := &window{first: c.cap + 1, budget: ReadBudget + 4*maxCount*m.cfg.WindowMultiplier, seen: map[string]bool{}}
	_, head := m.laneHead()
	for vm, r := range m.reg {
		if m.competing(r, head) {
			w.snap = append(w.snap, &wentry{vm, *r})
		}
	}
	sort.Slice(w.snap, func(i, j int) bool { return regBefore(w.snap[i].Reg, w.snap[j].Reg) })
	w.extend()
	index := m.CkIndex() // the age head as it stood when serving began
	ageDone := false
	for c.n < c.cap {
		e := c.pick(w)
		if e == nil && !ageDone {
			ageDone = true
			c.ageHead(w, index)
			e = c.pick(w)
		}
		if e == nil {
			break
		}
		if !c.sweepOne(w, e) {
			c.serveOne(w, e)
		}
	}
}

// sweepOne sweeps the head run of e's variant when its TTL passed
// (sweepHead): nothing of the scheduler moves, and the
// variant stays in the window with its tag, or, when that was its last
// ready run, leaves it as a stale entry does (pick).
func (c *call) sweepOne(w *window, e *wentry) bool {
	m := c.m
	s, ok := m.sweepHead(e.vm, c.now, &c.swept)
	if !ok {
		return false
	}
	c.out = append(c.out, s)
	if len(m.ready[e.vm]) == 0 {
		delete(m.ready, e.vm)
		w.remove(e)
		c.leave(w, e.vm)
	}
	return true
}

// leave takes vm, which has no ready run left and was not served (stale,
// or its last run swept), out of the competition: it leaves the lane,
// handing it on, and its tag parks when above V (the Lua's leave).
func (c *call) leave(w *window, vm string) {
	r := c.m.reg[vm]
	c.newHead(w, c.m.leaveLane(r))
	if c.m.park(vm, r.U) {
		c.parked = true
	}
}

// pick returns the first servable entry of the window, collecting stale
// entries and gating those at their limit on the way, reading further
// while the budget lasts.
func (c *call) pick(w *window) *wentry {
	m := c.m
	for {
		for i := 0; i < len(w.list); {
			e := w.list[i]
			switch {
			case len(m.ready[e.vm]) == 0:
				w.list = append(w.list[:i], w.list[i+1:]...)
				c.leave(w, e.vm)
			case c.atLimit(e.vm):
				w.list = append(w.list[:i], w.list[i+1:]...)
				c.gate(w, e.vm)
			default:
				return e
			}
		}
		if !w.extend() {
			return nil
		}
	}
}

// gate takes vm out of the competition at its key limit, keeping its tag
// (out of the lane too).
func (c *call) gate(w *window, vm string) {
	r := c.m.reg[vm]
	r.Gated, r.Gate = true, c.m.gn
	c.m.gn++
	c.m.gk = c.keyLimit
	c.newHead(w, c.m.leaveLane(r))
}

// newHead puts the lane's new head (if any) in the window.
func (c *call) newHead(w *window, h regRef) {
	if h.r != nil {
		w.seen[h.vm] = true
		w.insert(&wentry{h.vm, *h.r})
	}
}

// ageHead, when pass 1 finds nothing servable, looks at the first scan
// variants of ckIndex in age order as it stood when serving began (what a
// flag-off call would serve): untagged ones register (at V or their parked
// tag), competing ones that pass 1 did not reach (it stopped at its read
// budget) join as they are, and for one queued in the newcomer lane the
// lane's head joins. All take their place in the window whatever its
// bound. Variants this call drained and gated ones (the probe
// looks after those) are passed over, so a call whose keys are all gated
// costs the same whatever their number.
func (c *call) ageHead(w *window, index []Entry) {
	m := c.m
	for i := 0; i < c.scan && i < len(index); i++ {
		vm := index[i].Member
		if len(m.ready[vm]) == 0 || w.seen[vm] {
			continue
		}
		hv, head := m.laneHead()
		r, ok := m.reg[vm]
		switch {
		case !ok:
			r = m.registerAt(vm, 0, false, true)
		case r.Gated:
			continue // the probe looks after those
		case !m.competing(r, head):
			// Queued in the lane, and the oldest work: the lane's head
			// joins as it is, so the lane keeps its order and the call
			// serves whenever a flag-off call would.
			if !w.seen[hv] {
				w.seen[hv] = true
				w.place(&wentry{hv, *head})
			}
			continue
		}
		w.seen[vm] = true
		w.place(&wentry{vm, *r})
	}
}

// serveOne serves the head run of e's variant: E = max(S, V), V = max(V, E),
// S = E + stride.
func (c *call) serveOne(w *window, e *wentry) {
	m := c.m
	w.remove(e) // out of the window while its tag changes
	r := m.reg[e.vm]
	eu, er := r.U, r.R
	if eu < m.v {
		eu, er = m.v, 0
	}
	m.v = max(m.v, eu)
	mw := m.MilliWeight(e.vm)
	if er >= mw {
		er = 0
	}
	total := er + strideNum
	r.U, r.R = eu+total/mw, total%mw
	if r.Waiting {
		// The lane's head is served: it leaves the lane, and the next
		// newcomer competes one quantum behind this serve.
		r.Waiting = false
		c.newHead(w, m.laneNext(eu, true))
	}

	c.out = append(c.out, m.take(e.vm))
	c.n++

	switch {
	case len(m.ready[e.vm]) == 0:
		delete(m.ready, e.vm)
		if m.park(e.vm, r.U) {
			c.parked = true
		}
	case c.atLimit(e.vm):
		c.gate(w, e.vm)
	default:
		e.Reg = *r
		w.insert(e)
	}
}

// take moves the ready head of vm (it has one) in flight and returns it;
// vm's ready set may be left empty (the caller drops it).
func (m *Model) take(vm string) Served {
	h, _ := head(m.ready[vm])
	delete(m.ready[vm], h.Member)
	run := m.runs[h.Member]
	run.state = InFlight
	m.inflight[vm]++
	return Served{ID: run.id, Key: run.key, Attempt: run.attempt}
}

// scanOf is how many variants a call of maxCount reads in age order and
// how many due variants it promotes (Config.ScanLimit).
func (m *Model) scanOf(maxCount int) int {
	if m.cfg.ScanLimit > 0 {
		return m.cfg.ScanLimit
	}
	return max(30, 3*maxCount)
}

// DequeueOff serves up to maxCount runs at time now as an instance with
// the flag off does (dequeue.lua with lib/hooks_off), writing nothing to
// the scheduler state (registrations, gating, parked tags, clock, cursor):
// a variant it drains keeps a stale registration for a flag-on call to
// collect, a gated one it serves stays gated. Steps, as the Lua's:
//
//   - capacity: what the env and queue limits leave of maxCount (none:
//     nothing is promoted either);
//   - promotion: the first scan due variants in the delay index's order,
//     as PromotePlan gives (no starving-first pick, no registration);
//   - age order: the first reach entries of ckIndex as it stands then
//     (reach: scan, or min(scan, capacity) without a key limit, capacity +
//     TTLLook when a run has passed its TTL), the next one, if any, kept as
//     the bound. Each serve takes the head run of the first entry not at
//     its key limit (or sweeps it, when its TTL passed: see Served, not
//     counted for capacity); the variant re-sorts at its new
//     head score, and leaves the window when it has no ready run left or
//     when it sorts after the bound (unread entries may come before it).
//     The call ends when no entry of the window is servable.
func (m *Model) DequeueOff(maxCount int, now int64) []Served {
	capacity := m.capacity(maxCount)
	if capacity <= 0 {
		return nil
	}
	sweeps := m.anyDue(now)
	scan := m.scanOf(maxCount)
	vms, due := m.dueVariants(now, scan)
	m.promotePlanned(vms, due, now, maxCount, false, nil)
	keyLimit := m.cfg.Limits.Key
	reach := scan
	if keyLimit <= 0 {
		reach = min(scan, capacity)
		if sweeps {
			reach = min(scan, capacity+TTLLook)
		}
	}
	index := m.CkIndex()
	var bound *Entry
	if len(index) > reach {
		bound = &index[reach]
		index = index[:reach]
	}
	list := append([]Entry(nil), index...)
	var out []Served
	swept := 0
	for n := 0; n < capacity; {
		i := 0
		for i < len(list) && keyLimit > 0 && m.inflight[list[i].Member] >= keyLimit {
			i++
		}
		if i == len(list) {
			break
		}
		vm := list[i].Member
		if s, ok := m.sweepHead(vm, now, &swept); ok {
			out = append(out, s)
		} else {
			out = append(out, m.take(vm))
			n++
		}
		list = slices.Delete(list, i, i+1)
		h, ok := head(m.ready[vm])
		if !ok {
			delete(m.ready, vm)
			continue
		}
		e := Entry{vm, h.Score}
		if bound != nil && less(*bound, e) {
			continue // sorts after the bound: out of the window
		}
		j := sort.Search(len(list), func(j int) bool { return less(e, list[j]) })
		list = slices.Insert(list, j, e)
	}
	m.expireTaken(out, now, false)
	return out
}

// reapIdle drops parked tags at or below V, then all but the highest
// IdleMaxEntries (ties: member order).
func (m *Model) reapIdle() {
	for vm, p := range m.idle {
		if p <= m.v {
			delete(m.idle, vm)
		}
	}
	if extra := len(m.idle) - m.cfg.IdleMaxEntries; extra > 0 {
		for _, e := range m.Idle()[:extra] {
			delete(m.idle, e.Member)
		}
	}
}

// rebase moves every stored time down by RebaseBy once the clock reaches
// RebaseAt; tags more than rebaseFloor below V are lifted to V - rebaseFloor
// first (they are worth V either way). Order and differences are kept, so
// nothing a key is owed changes; the logical clock goes on from the epoch.
func (m *Model) rebase() {
	if m.v < RebaseAt {
		return
	}
	m.reapIdle()
	lo := m.v - rebaseFloor
	_, head := m.laneHead()
	for _, r := range m.reg {
		if r.Waiting && r != head {
			continue // queued in the lane: no tag yet
		}
		if r.U < lo {
			r.U, r.R = lo, 0
		}
		r.U -= RebaseBy
	}
	for vm, p := range m.idle {
		m.idle[vm] = p - RebaseBy
	}
	m.v -= RebaseBy
	m.epoch++
}

func (m *Model) held(id string) (*run, error) {
	r, ok := m.runs[keys.Segment(id)]
	if !ok {
		return nil, ErrNotFound
	}
	if r.state != InFlight {
		return nil, ErrNotInFlight
	}
	return r, nil
}

// release frees r's in-flight slot as a flag-on instance does: a gated
// variant of its key competes again (released).
func (m *Model) release(r *run) {
	m.released(m.free(r))
}

// free frees r's in-flight slot and nothing else (a flag-off instance: the
// variant's gated registration, if any, stays for the gated probe). It
// returns r's variant.
func (m *Model) free(r *run) string {
	vm := keys.VariantMember(r.key)
	m.inflight[vm]--
	if m.inflight[vm] == 0 {
		delete(m.inflight, vm)
	}
	return vm
}

// Ack completes an in-flight run.
func (m *Model) Ack(id string) error { return m.ack(id, true) }

// AckOff completes an in-flight run as an instance with the flag off does
// (ack.lua with lib/hooks_off): the slot frees without a word to the
// scheduler, so a gated variant of the key stays gated until the gated
// probe of a flag-on call finds it below its limit.
func (m *Model) AckOff(id string) error { return m.ack(id, false) }

func (m *Model) ack(id string, flagOn bool) error {
	r, err := m.held(id)
	if err != nil {
		return err
	}
	m.settle(r, flagOn)
	delete(m.runs, r.id)
	return nil
}

// Nack requeues an in-flight run at retryAt with attempt + 1, or dead-letters
// it (kill, or no attempts left). It reports whether the run was requeued.
func (m *Model) Nack(id string, retryAt, now int64, kill bool) (bool, error) {
	return m.nack(id, retryAt, now, kill, true)
}

// NackOff is Nack as an instance with the flag off does it (requeue.lua
// with lib/hooks_off): the slot frees as in AckOff (a gated variant stays
// gated), and the run goes back as in EnqueueOff (no registration: an
// untagged variant it makes ready waits for discovery).
func (m *Model) NackOff(id string, retryAt, now int64, kill bool) (bool, error) {
	return m.nack(id, retryAt, now, kill, false)
}

func (m *Model) nack(id string, retryAt, now int64, kill, flagOn bool) (bool, error) {
	r, err := m.held(id)
	if err != nil {
		return false, err
	}
	m.settle(r, flagOn)
	r.attempt++
	if kill || (m.cfg.MaxAttempts > 0 && r.attempt > m.cfg.MaxAttempts) {
		r.state = Dead
		return false, nil
	}
	r.at = retryAt
	m.requeue(r, now, flagOn)
	return true, nil
}

// Recover is lease recovery: Nack ready now.
func (m *Model) Recover(id string, now int64) (bool, error) { return m.Nack(id, now, now, false) }

// RecoverOff is Recover as an instance with the flag off does it: NackOff
// ready now (the slot frees without un-gating, the run goes back without
// registering).
func (m *Model) RecoverOff(id string, now int64) (bool, error) { return m.NackOff(id, now, now, false) }

// Redrive puts a dead run back, ready now, attempts reset.
func (m *Model) Redrive(id string, now int64) error { return m.redrive(id, now, true) }

// RedriveOff is Redrive as an instance with the flag off does it
// (redrive.lua with lib/hooks_off): the run goes back as in EnqueueOff, so
// an untagged variant it makes ready waits for discovery.
func (m *Model) RedriveOff(id string, now int64) error { return m.redrive(id, now, false) }

func (m *Model) redrive(id string, now int64, flagOn bool) error {
	r, ok := m.runs[keys.Segment(id)]
	if !ok {
		return ErrNotFound
	}
	if r.state != Dead {
		return ErrNotDead
	}
	r.attempt, r.at = 1, now
	m.requeue(r, now, flagOn)
	return nil
}

// Expire removes a queued run (TTL sweep). It reports whether it did.
func (m *Model) Expire(id string) bool {
	r, ok := m.runs[keys.Segment(id)]
	if !ok || (r.state != Ready && r.state != Delayed) {
		return false
	}
	vm := keys.VariantMember(r.key)
	delete(m.runs, r.id)
	if r.state == Delayed {
		delete(m.delayed[vm], r.id)
		if len(m.delayed[vm]) == 0 {
			delete(m.delayed, vm)
		}
		return true
	}
	delete(m.ready[vm], r.id)
	if len(m.ready[vm]) == 0 {
		delete(m.ready, vm)
		m.drained(vm)
	}
	return true
}

// State reports a run's state (0 when unknown) and attempt.
func (m *Model) State(id string) (byte, int) {
	r, ok := m.runs[keys.Segment(id)]
	if !ok {
		return 0, 0
	}
	return r.state, r.attempt
}

// KeyOf returns the concurrency key of a variant member seen by the model.
func (m *Model) KeyOf(member string) string { return m.keyOf[member] }
