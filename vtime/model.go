package vtime

import (
	"errors"
	"math"
	"sort"

	"github.com/runqueue/runqueue/keys"
)

// Limits are concurrency limits; 0 means none.
type Limits struct {
	Env   int // in flight in the env: this queue plus Model.EnvOther
	Queue int // in flight in this queue
	Key   int // in flight per variant
}

// Config mirrors the scheduler fields of runqueue.Config.
type Config struct {
	Quantum          float64 // default 1
	WindowMultiplier int     // default 3
	IdleMaxEntries   int     // default 10,000
	PriorityStep     int64   // ms, default 30,000
	PromoteLimit     int     // default 100
	MaxAttempts      int     // deliveries before dead letter; 0 = no limit
	// ScanLimit is how many variants a call reads in age order (pass 2,
	// discovery) and how many due delayed variants it promotes, as the
	// flag-off dequeue does; 0 means max(30, 3*maxCount).
	ScanLimit int
	Limits    Limits
}

func (c Config) withDefaults() Config {
	if c.Quantum == 0 {
		c.Quantum = 1
	}
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
}

// Model is one base queue under the fair scheduler.
type Model struct {
	cfg Config

	V      float64
	L      float64
	HasL   bool
	Cursor int

	tags    map[string]float64 // variant member -> S
	idle    map[string]float64 // variant member -> parked tag
	weights map[string]float64 // variant member -> weight

	runs     map[string]*run               // encoded id -> run
	ready    map[string]map[string]float64 // member -> encoded id -> ready score
	delayed  map[string]map[string]float64 // member -> encoded id -> available_at
	inflight map[string]int                // member -> runs in flight
	keyOf    map[string]string             // member -> concurrency key

	// EnvOther counts runs in flight in other queues of the env.
	EnvOther int
}

// New returns an empty model.
func New(cfg Config) *Model {
	return &Model{
		cfg:      cfg.withDefaults(),
		tags:     map[string]float64{},
		idle:     map[string]float64{},
		weights:  map[string]float64{},
		runs:     map[string]*run{},
		ready:    map[string]map[string]float64{},
		delayed:  map[string]map[string]float64{},
		inflight: map[string]int{},
		keyOf:    map[string]string{},
	}
}

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

// Tags returns ckVtime in ZSET order.
func (m *Model) Tags() []Entry { return sortedEntries(m.tags) }

// Idle returns ckVtimeIdle in ZSET order.
func (m *Model) Idle() []Entry { return sortedEntries(m.idle) }

// Weight returns the weight of key's variant.
func (m *Model) Weight(key string) float64 { return m.weight(keys.VariantMember(key)) }

func (m *Model) weight(vm string) float64 {
	if w, ok := m.weights[vm]; ok {
		return w
	}
	return 1
}

// SetWeight sets (w > 0) or clears (w == 0) the weight of key.
func (m *Model) SetWeight(key string, w float64) {
	vm := keys.VariantMember(key)
	if w == 0 {
		delete(m.weights, vm)
		return
	}
	m.weights[vm] = w
}

// headScore returns the lowest (score, member) of a set.
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
	eid := keys.Segment(id)
	if _, ok := m.runs[eid]; ok {
		return ErrExists
	}
	r := &run{id: eid, key: key, priority: priority, at: at, attempt: 1}
	m.runs[eid] = r
	m.place(r, now)
	return nil
}

func (m *Model) member(r *run) string {
	vm := keys.VariantMember(r.key)
	m.keyOf[vm] = r.key
	return vm
}

// place queues r as ready or delayed; a variant's first ready run registers it.
func (m *Model) place(r *run, now int64) {
	vm := m.member(r)
	if r.at <= now {
		r.state = Ready
		if addTo(m.ready, vm, r.id, m.readyScore(r)) {
			m.registerNew(vm)
		}
		return
	}
	r.state = Delayed
	addTo(m.delayed, vm, r.id, float64(r.at))
}

// registerNew registers a variant that gained its first ready run.
func (m *Model) registerNew(vm string) {
	if _, ok := m.tags[vm]; ok {
		return
	}
	if p, ok := m.idle[vm]; ok {
		m.tags[vm] = math.Max(m.V, p)
		delete(m.idle, vm)
		return
	}
	q := m.cfg.Quantum
	a, has := 0.0, false
	if len(m.tags) > 0 {
		top := math.Inf(-1)
		for _, s := range m.tags {
			top = math.Max(top, s)
		}
		a, has = math.Min(top, m.V+q), true
	}
	if m.HasL && (!has || m.L > a) {
		a, has = m.L, true
	}
	s := m.V
	if has && a > m.V {
		s = a + q
	}
	m.tags[vm] = s
	m.L, m.HasL = s, true
}

// drained handles a variant whose last ready run left outside a dequeue:
// its tag is parked when above V, and parking reaps the idle set.
func (m *Model) drained(vm string) {
	s, ok := m.tags[vm]
	if !ok {
		return
	}
	delete(m.tags, vm)
	if s > m.V {
		m.idle[vm] = s
		m.reapIdle()
	}
}

// Served is one run a dequeue returned.
type Served struct {
	ID      string // encoded id
	Key     string
	Attempt int
}

// Dequeue serves up to maxCount runs at time now.
func (m *Model) Dequeue(maxCount int, now int64) []Served {
	lim := m.cfg.Limits
	queueN := 0
	for _, n := range m.inflight {
		queueN += n
	}
	capacity := maxCount
	if lim.Env > 0 {
		capacity = min(capacity, lim.Env-queueN-m.EnvOther)
	}
	if lim.Queue > 0 {
		capacity = min(capacity, lim.Queue-queueN)
	}
	if capacity <= 0 {
		return nil
	}
	wc := maxCount * m.cfg.WindowMultiplier
	scanN := m.cfg.ScanLimit
	if scanN == 0 {
		scanN = max(30, 3*maxCount)
	}

	// Promotion of due delayed runs: persists even if nothing is served.
	for i, e := range m.delayIndex() {
		if i >= scanN || e.Score > float64(now) {
			break
		}
		m.promote(e.Member, now)
	}

	// Working copies: a call that serves nothing writes nothing more.
	V := m.V
	cursor := m.Cursor
	tags := clone(m.tags)
	idle := clone(m.idle)

	index := m.CkIndex()
	repair := len(index) != len(m.tags)
	if repair {
		discover := func(e Entry) {
			if _, ok := tags[e.Member]; ok {
				return
			}
			s := V
			if p, ok := idle[e.Member]; ok {
				s = math.Max(V, p)
				delete(idle, e.Member)
			}
			tags[e.Member] = s
		}
		for i := 0; i < scanN && i < len(index); i++ {
			discover(index[i])
		}
		for i := cursor; i < cursor+scanN && i < len(index); i++ {
			discover(index[i])
		}
		cursor += scanN
		if cursor >= len(index) {
			cursor = 0
		}
	}

	scan := newWindow(sortedEntries(tags), 2*wc)
	if repair {
		scan.addSpare(sortedEntries(tags), 2*wc, 2*wc)
	}
	age := newWindow(index, scanN)
	q := m.cfg.Quantum
	var out []Served
	parked := 0
	servable := func(vm string) bool {
		return len(m.ready[vm]) > 0 && (lim.Key <= 0 || m.inflight[vm] < lim.Key)
	}
	// A tag whose variant has no ready run is stale (only a flag-off drain
	// leaves one): it leaves the window, a spare entry takes its place, and
	// it is collected like a drained variant, even by a call that serves
	// nothing.
	var stale []string
	pass1 := func() (string, bool) {
		for i := 0; i < len(scan.list); {
			vm := scan.list[i].Member
			if servable(vm) {
				return vm, true
			}
			if len(m.ready[vm]) == 0 && (lim.Key <= 0 || m.inflight[vm] < lim.Key) {
				stale = append(stale, vm)
				scan.drop(vm)
				continue
			}
			i++
		}
		return "", false
	}
	for len(out) < capacity {
		vm, ok := pass1()
		if !ok {
			if vm, ok = age.first(servable); !ok {
				break
			}
		}
		s, ok := tags[vm]
		if !ok {
			s = V
		}
		e := math.Max(s, V)
		V = math.Max(V, e)
		s = e + q/m.weight(vm)
		tags[vm] = s

		h, _ := head(m.ready[vm])
		delete(m.ready[vm], h.Member)
		r := m.runs[h.Member]
		r.state = InFlight
		m.inflight[vm]++
		out = append(out, Served{ID: r.id, Key: r.key, Attempt: r.attempt})

		if nh, ok := head(m.ready[vm]); ok {
			scan.move(vm, s)
			age.move(vm, nh.Score)
			continue
		}
		delete(m.ready, vm)
		scan.remove(vm)
		age.remove(vm)
		if s > V {
			idle[vm] = s
			parked++
		}
		delete(tags, vm)
	}
	for _, vm := range stale {
		if s := tags[vm]; s > V {
			idle[vm] = s
			parked++
		}
		delete(tags, vm)
	}
	if len(out) == 0 && len(stale) == 0 {
		return nil
	}
	m.V, m.Cursor, m.tags, m.idle = V, cursor, tags, idle
	if parked > 0 {
		m.reapIdle()
	}
	return out
}

// reapIdle drops parked tags at or below V, then all but the highest
// IdleMaxEntries.
func (m *Model) reapIdle() {
	for vm, s := range m.idle {
		if s <= m.V {
			delete(m.idle, vm)
		}
	}
	if extra := len(m.idle) - m.cfg.IdleMaxEntries; extra > 0 {
		for _, e := range sortedEntries(m.idle)[:extra] {
			delete(m.idle, e.Member)
		}
	}
}

// promote moves up to PromoteLimit due delayed runs of vm to ready.
func (m *Model) promote(vm string, now int64) {
	set := m.delayed[vm]
	due := sortedEntries(set)
	for i, e := range due {
		if i >= m.cfg.PromoteLimit || e.Score > float64(now) {
			break
		}
		delete(set, e.Member)
		m.place(m.runs[e.Member], now) // due: it goes to ready
	}
	if len(set) == 0 {
		delete(m.delayed, vm)
	}
}

func clone(in map[string]float64) map[string]float64 {
	out := make(map[string]float64, len(in))
	for k, v := range in {
		out[k] = v
	}
	return out
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

// Ack completes an in-flight run.
func (m *Model) Ack(id string) error {
	r, err := m.held(id)
	if err != nil {
		return err
	}
	m.inflight[keys.VariantMember(r.key)]--
	delete(m.runs, r.id)
	return nil
}

// Nack requeues an in-flight run at retryAt with attempt + 1, or dead-letters
// it (kill, or no attempts left). It reports whether the run was requeued.
func (m *Model) Nack(id string, retryAt, now int64, kill bool) (bool, error) {
	r, err := m.held(id)
	if err != nil {
		return false, err
	}
	m.inflight[keys.VariantMember(r.key)]--
	r.attempt++
	if kill || (m.cfg.MaxAttempts > 0 && r.attempt > m.cfg.MaxAttempts) {
		r.state = Dead
		return false, nil
	}
	r.at = retryAt
	m.place(r, now)
	return true, nil
}

// Recover is lease recovery: Nack ready now.
func (m *Model) Recover(id string, now int64) (bool, error) { return m.Nack(id, now, now, false) }

// Redrive puts a dead run back, ready now, attempts reset.
func (m *Model) Redrive(id string, now int64) error {
	r, ok := m.runs[keys.Segment(id)]
	if !ok {
		return ErrNotFound
	}
	if r.state != Dead {
		return ErrNotDead
	}
	r.attempt, r.at = 1, now
	m.place(r, now)
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

// window is the part of a sorted set a dequeue call read: its first n
// entries, kept sorted as scores change. An entry whose new score sorts
// after the last entry read leaves the window, since unread entries may
// sort before it; a set read whole has no such bound.
type window struct {
	list  []Entry
	bound *Entry
	spare []Entry
	more  bool // entries exist after the spare ones
}

// addSpare keeps up to k entries after the first n of sorted aside, to
// refill the window when drop takes an entry out.
func (w *window) addSpare(sorted []Entry, n, k int) {
	if len(sorted) <= n {
		return
	}
	end := min(len(sorted), n+k)
	w.spare = append([]Entry(nil), sorted[n:end]...)
	w.more = len(sorted) > end
}

// drop takes member out of the window for good and appends the next spare
// entry (which sorts after every entry of the window).
func (w *window) drop(member string) {
	if !w.remove(member) || len(w.spare) == 0 {
		return
	}
	nxt := w.spare[0]
	w.spare = w.spare[1:]
	w.list = append(w.list, nxt)
	if len(w.spare) == 0 && !w.more {
		w.bound = nil
	} else {
		w.bound = &nxt
	}
}

func newWindow(sorted []Entry, n int) *window {
	w := &window{}
	if len(sorted) > n {
		sorted = sorted[:n]
		last := sorted[n-1]
		w.bound = &last
	}
	w.list = append([]Entry(nil), sorted...)
	return w
}

func (w *window) first(ok func(string) bool) (string, bool) {
	for _, e := range w.list {
		if ok(e.Member) {
			return e.Member, true
		}
	}
	return "", false
}

func (w *window) remove(member string) bool {
	for i, e := range w.list {
		if e.Member == member {
			w.list = append(w.list[:i], w.list[i+1:]...)
			return true
		}
	}
	return false
}

// move re-sorts member with its new score, if it was in the window.
func (w *window) move(member string, score float64) {
	if !w.remove(member) {
		return
	}
	e := Entry{member, score}
	if w.bound != nil && less(*w.bound, e) {
		return
	}
	i := sort.Search(len(w.list), func(i int) bool { return less(e, w.list[i]) })
	w.list = append(w.list, Entry{})
	copy(w.list[i+1:], w.list[i:])
	w.list[i] = e
}
