package vtime

import (
	"fmt"
	"math"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/runqueue/runqueue/keys"
)

// The guarantees of DESIGN section 7 (vtime/doc.go) as properties of the
// model. runqueue/vtime_props_test.go checks the same ones on the Lua.

// eps absorbs float rounding in sums of quanta divided by weights.
const eps = 1e-9

var propWeights = []float64{0.5, 1, 2, 3}

// sim drives one model with a clock and fresh run ids.
type sim struct {
	m    *Model
	now  int64
	next int
}

func newSim(cfg Config) *sim { return &sim{m: New(cfg)} }

// enq queues n runs of key, available after delay (ms), with priority prio.
func (s *sim) enq(t require.TestingT, key string, n int, delay int64, prio int) {
	for i := 0; i < n; i++ {
		s.next++
		require.NoError(t, s.m.Enqueue(fmt.Sprintf("r%d", s.next), key, prio, s.now+delay, s.now))
	}
}

func (s *sim) ready(key string) int { return len(s.m.ready[keys.VariantMember(key)]) }

// topUp keeps key backlogged with at least n ready runs.
func (s *sim) topUp(t require.TestingT, key string, n int) {
	if k := s.ready(key); k < n {
		s.enq(t, key, n-k, 0, 0)
	}
}

// deq runs one call and advances the clock by 1 ms.
func (s *sim) deq(n int) []Served {
	out := s.m.Dequeue(n, s.now)
	s.now++
	return out
}

// held lists the ids in flight, sorted.
func (s *sim) held() []string {
	var out []string
	for id, r := range s.m.runs {
		if r.state == InFlight {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

func (s *sim) ackAll(t require.TestingT) {
	for _, id := range s.held() {
		require.NoError(t, s.m.Ack(mustDecodeT(t, id)))
	}
}

func (s *sim) ackKeys(t require.TestingT, served []Served, skip string) {
	for _, x := range served {
		if x.Key != skip {
			require.NoError(t, s.m.Ack(mustDecodeT(t, x.ID)))
		}
	}
}

func mustDecodeT(t require.TestingT, enc string) string {
	id, err := keys.DecodeSegment(enc)
	require.NoError(t, err)
	return id
}

func keyName(i int) string { return fmt.Sprintf("k%02d", i) }

// TestPropNoDebtWait: once a key n is ready with tag S_n, before n is
// served each other key j is served at most floor((T-B_j)*w_j/q)+1 times,
// T = max(S_n, V), B_j = max(S_j, V) (0 times when B_j > T). For a key with
// no debt (S_n <= V) that is at most one serve per other active key.
func TestPropNoDebtWait(t *testing.T) {
	t.Parallel()
	noDebt := 0
	rapid.Check(t, func(rt *rapid.T) {
		wm := rapid.IntRange(1, 3).Draw(rt, "wm")
		q := rapid.SampledFrom([]float64{1, 0.5}).Draw(rt, "quantum")
		keyLimit := rapid.SampledFrom([]int{0, 0, 1, 2}).Draw(rt, "keyLimit")
		// With key limits, gated variants may fill the window and the call
		// falls back to age order: keep every tag inside the window.
		maxOthers := 8
		if keyLimit > 0 {
			maxOthers = 2*wm - 1
		}
		nOthers := rapid.IntRange(1, maxOthers).Draw(rt, "others")
		s := newSim(Config{Quantum: q, WindowMultiplier: wm, Limits: Limits{
			Key: keyLimit, Queue: rapid.SampledFrom([]int{0, 0, 3}).Draw(rt, "queueLimit")}})
		for i := 0; i < nOthers; i++ {
			s.m.SetWeight(keyName(i), rapid.SampledFrom([]float64{0.01, 0.5, 1, 2, 3, 10}).Draw(rt, "w"))
			s.enq(rt, keyName(i), rapid.IntRange(1, 8).Draw(rt, "backlog"), 0, rapid.IntRange(0, 2).Draw(rt, "prio"))
		}
		for c := rapid.IntRange(0, 10).Draw(rt, "prefix"); c > 0; c-- {
			s.deq(rapid.IntRange(1, 4).Draw(rt, "maxCount"))
			s.ackAll(rt)
			if rapid.Bool().Draw(rt, "more") {
				s.enq(rt, keyName(rapid.IntRange(0, nOthers-1).Draw(rt, "k")), 2, 0, 0)
			}
		}
		n := "new"
		if rapid.Bool().Draw(rt, "returning") {
			n = keyName(0) // returns through the idle set, or is still registered
		}
		s.enq(rt, n, rapid.IntRange(1, 3).Draw(rt, "nRuns"), 0, rapid.IntRange(0, 9).Draw(rt, "nPrio"))
		v0 := s.m.V
		sn, ok := tagOf(s.m, n)
		require.True(rt, ok)
		T := math.Max(sn, v0)
		base := map[string]float64{}
		for vm, st := range s.m.tags {
			if k := s.m.KeyOf(vm); k != n {
				base[k] = math.Max(st, v0)
			}
		}
		served := map[string]int{}
		found := false
		for call := 0; call < 500 && !found; call++ {
			out := s.deq(rapid.IntRange(1, 5).Draw(rt, "waitMaxCount"))
			for _, x := range out {
				if x.Key == n {
					found = true
					break
				}
				served[x.Key]++
			}
			s.ackAll(rt)
		}
		require.True(rt, found, "%s never served", n)
		if sn <= v0 {
			noDebt++
		}
		for k, c := range served {
			w := s.m.Weight(k)
			b, ok := base[k]
			require.True(rt, ok, "%s served while waiting but was not registered", k)
			limit := 0
			if b <= T+eps {
				limit = int(math.Floor((T-b)*w/q+eps)) + 1
			}
			require.LessOrEqual(rt, c, limit, "%s (w %v, from %v) served %d times before %s (tag %v, V %v)", k, w, b, c, n, sn, v0)
			if sn <= v0 {
				require.LessOrEqual(rt, c, 1, "no-debt key %s waited %d serves of %s", n, c, k)
			}
		}
	})
	t.Logf("cases with a no-debt key: %d", noDebt)
}

// lagCheck tracks D = served_i/w_i - served_j/w_j over every prefix of a
// serve sequence.
type lagCheck struct {
	i, j       string
	wi, wj     float64
	ni, nj     int
	d          float64
	minD, maxD float64 // over prefixes after both were served once
	started    bool
}

func (l *lagCheck) serve(k string) {
	switch k {
	case l.i:
		l.ni++
		l.d += 1 / l.wi
	case l.j:
		l.nj++
		l.d -= 1 / l.wj
	default:
		return
	}
	if !l.started && l.ni > 0 && l.nj > 0 {
		l.started, l.minD, l.maxD = true, l.d, l.d
	}
	if l.started {
		l.minD, l.maxD = math.Min(l.minD, l.d), math.Max(l.maxD, l.d)
	}
}

// TestPropLagBound: two continuously backlogged keys i, j keep
// |served_i/w_i - served_j/w_j| within 1/w_i + 1/w_j over every interval of
// the serve sequence that starts once both have been served, prefixes
// inside a batch included (the order within the returned slice); and from
// the moment both are registered with tags S_i, S_j, within
// 1/w_i + 1/w_j + |S_i - S_j|/q (0 when they register together at V).
func TestPropLagBound(t *testing.T) {
	t.Parallel()
	checked := 0
	rapid.Check(t, func(rt *rapid.T) {
		wm := rapid.IntRange(1, 3).Draw(rt, "wm")
		q := rapid.SampledFrom([]float64{1, 0.3}).Draw(rt, "quantum")
		s := newSim(Config{Quantum: q, WindowMultiplier: wm, Limits: Limits{
			Queue: rapid.SampledFrom([]int{0, 0, 2, 5}).Draw(rt, "queueLimit")}})
		names := rapid.Permutation([]string{"a", "m", "z"}).Draw(rt, "names")
		l := &lagCheck{i: names[0], j: names[1],
			wi: rapid.SampledFrom(propWeights).Draw(rt, "wi"), wj: rapid.SampledFrom(propWeights).Draw(rt, "wj")}
		s.m.SetWeight(l.i, l.wi)
		s.m.SetWeight(l.j, l.wj)
		others := rapid.IntRange(0, 8).Draw(rt, "others")
		for o := 0; o < others; o++ {
			s.m.SetWeight(keyName(o), rapid.SampledFrom([]float64{0.01, 0.5, 1, 3, 10}).Draw(rt, "wo"))
			s.enq(rt, keyName(o), rapid.IntRange(1, 6).Draw(rt, "ob"), rapid.SampledFrom([]int64{0, 0, 3}).Draw(rt, "od"), 0)
		}
		for c := rapid.IntRange(0, 4).Draw(rt, "before"); c > 0; c-- {
			s.deq(rapid.IntRange(1, 4).Draw(rt, "m0"))
			s.ackAll(rt)
		}
		s.topUp(rt, l.i, 3)
		gap := rapid.IntRange(0, 2).Draw(rt, "gap")
		for c := 0; c < gap; c++ {
			for _, x := range s.deq(rapid.IntRange(1, 4).Draw(rt, "m1")) {
				l.serve(x.Key)
			}
			s.ackAll(rt)
			s.topUp(rt, l.i, 3)
		}
		s.topUp(rt, l.j, 3)
		si, _ := tagOf(s.m, l.i)
		sj, _ := tagOf(s.m, l.j)
		fromReg := &lagCheck{i: l.i, j: l.j, wi: l.wi, wj: l.wj}
		bound := 1/l.wi + 1/l.wj
		regBound := bound + math.Abs(si-sj)/q
		calls := rapid.IntRange(5, 40).Draw(rt, "calls")
		for c := 0; c < calls; c++ {
			n := rapid.IntRange(1, 6).Draw(rt, "maxCount")
			s.topUp(rt, l.i, n+1)
			s.topUp(rt, l.j, n+1)
			if rapid.IntRange(0, 3).Draw(rt, "churn") == 0 {
				o := keyName(rapid.IntRange(0, 9).Draw(rt, "ok"))
				s.enq(rt, o, rapid.IntRange(1, 3).Draw(rt, "on"), rapid.SampledFrom([]int64{0, 0, 2}).Draw(rt, "odl"), 0)
			}
			for pos, x := range s.deq(n) {
				l.serve(x.Key)
				fromReg.serve(x.Key)
				require.LessOrEqual(rt, l.maxD-l.minD, bound+eps,
					"call %d position %d: lag swing %v > %v (i %s w %v: %d, j %s w %v: %d)",
					c, pos, l.maxD-l.minD, bound, l.i, l.wi, l.ni, l.j, l.wj, l.nj)
				require.LessOrEqual(rt, math.Abs(fromReg.d), regBound+eps,
					"call %d position %d: lag %v since registration > %v", c, pos, fromReg.d, regBound)
			}
			if rapid.Bool().Draw(rt, "ack") {
				s.ackAll(rt)
			}
		}
		if l.started {
			checked++
		}
	})
	t.Logf("cases where both keys were served: %d", checked)
}

// TestPropNoCredit: a key c that was idle (drained), gated at its limit or
// whose runs were delayed for a long stretch gets no burst when it comes
// back: from that moment, at every prefix of the serves and for every other
// backlogged key o (served at least once before),
// served_c/w_c - served_o/w_o <= 1/w_c + 1/w_o; so with one other key of
// the same weight, c gets at most ceil(k/2)+1 of the next k serves.
func TestPropNoCredit(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"Idle", "Gated", "Delayed"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			rapid.Check(t, func(rt *rapid.T) { noCredit(rt, mode) })
		})
	}
}

func noCredit(rt *rapid.T, mode string) {
	wm := rapid.IntRange(1, 3).Draw(rt, "wm")
	q := rapid.SampledFrom([]float64{1, 0.3}).Draw(rt, "quantum")
	cfg := Config{Quantum: q, WindowMultiplier: wm}
	maxCount := func() int { return rapid.IntRange(1, 4).Draw(rt, "maxCount") }
	if mode == "Gated" {
		// One serve per call and acks after each call: only c is ever gated.
		cfg.Limits.Key = 1
		maxCount = func() int { return 1 }
	}
	s := newSim(cfg)
	nOthers := rapid.IntRange(1, 3).Draw(rt, "others")
	sameWeights := rapid.Bool().Draw(rt, "sameWeights")
	w := func(name string) float64 {
		if sameWeights {
			return 1
		}
		return rapid.SampledFrom(propWeights).Draw(rt, name)
	}
	const c = "c"
	wc := w("wc")
	s.m.SetWeight(c, wc)
	others := []string{}
	for i := 0; i < nOthers; i++ {
		others = append(others, keyName(i))
		s.m.SetWeight(keyName(i), w("wo"))
	}
	all := append([]string{c}, others...)
	// Phase 1: everyone backlogged until everyone was served.
	seen := map[string]bool{}
	for call := 0; call < 200 && len(seen) < len(all); call++ {
		n := maxCount()
		for _, k := range all {
			s.topUp(rt, k, n+1)
		}
		for _, x := range s.deq(n) {
			seen[x.Key] = true
		}
		s.ackAll(rt)
	}
	require.Len(rt, seen, len(all))

	// Phase 2: c stays away for a long stretch while the others are served.
	stretch := rapid.IntRange(5, 60).Draw(rt, "stretch")
	switch mode {
	case "Idle", "Delayed":
		for call := 0; call < 500 && s.ready(c) > 0; call++ { // let c drain
			n := maxCount()
			for _, k := range others {
				s.topUp(rt, k, n+1)
			}
			s.deq(n)
			s.ackAll(rt)
		}
		require.Zero(rt, s.ready(c))
		if mode == "Delayed" {
			s.enq(rt, c, 10, int64(stretch), 0) // due after the stretch
		}
	case "Gated":
		for call := 0; call < 500; call++ { // until c holds a run
			s.topUp(rt, c, 5)
			for _, k := range others {
				s.topUp(rt, k, 2)
			}
			out := s.deq(1)
			s.ackKeys(rt, out, c)
			if len(out) == 1 && out[0].Key == c {
				break
			}
		}
		require.Equal(rt, 1, s.m.inflight[keys.VariantMember(c)])
	}
	for call := 0; call < stretch; call++ {
		n := maxCount()
		for _, k := range others {
			s.topUp(rt, k, n+1)
		}
		for _, x := range s.deq(n) {
			require.NotEqual(rt, c, x.Key, "c served while away")
			require.NoError(rt, s.m.Ack(mustDecodeT(rt, x.ID)))
		}
	}
	// Phase 3: c is back.
	if mode == "Gated" {
		s.ackAll(rt)
	}
	wOf := map[string]float64{}
	for _, k := range all {
		wOf[k] = s.m.Weight(k)
	}
	count := map[string]int{}
	total := 0
	calls := rapid.IntRange(3, 30).Draw(rt, "after")
	for call := 0; call < calls; call++ {
		n := maxCount()
		for _, k := range all {
			if mode != "Delayed" || k != c {
				s.topUp(rt, k, n+1)
			}
		}
		for _, x := range s.deq(n) {
			count[x.Key]++
			total++
			for _, o := range others {
				lag := float64(count[c])/wOf[c] - float64(count[o])/wOf[o]
				require.LessOrEqual(rt, lag, 1/wOf[c]+1/wOf[o]+eps,
					"%s after %d serves back: c %d (w %v) vs %s %d (w %v)", mode, total, count[c], wOf[c], o, count[o], wOf[o])
			}
			if len(others) == 1 && sameWeights {
				require.LessOrEqual(rt, count[c], (total+1)/2+1, "%s: c took %d of %d serves", mode, count[c], total)
			}
		}
		s.ackAll(rt)
		if mode == "Delayed" && s.ready(c) == 0 && len(s.m.delayed[keys.VariantMember(c)]) == 0 {
			break // c's runs were all served: it is no longer backlogged
		}
	}
}

// opKind is one operation of a random workload.
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
)

type op struct {
	kind  opKind
	key   string
	prio  int
	delay int64
	n     int
	pick  int
	kill  bool
	w     float64
}

func drawOp(rt *rapid.T, nkeys int) op {
	k := rapid.IntRange(0, 99).Draw(rt, "op")
	o := op{key: keyName(rapid.IntRange(0, nkeys-1).Draw(rt, "key")), pick: rapid.IntRange(0, 1000).Draw(rt, "pick")}
	switch {
	case k < 35:
		o.kind = opEnqueue
		o.prio = rapid.SampledFrom([]int{0, 0, 0, 1, 9}).Draw(rt, "prio")
		o.delay = rapid.SampledFrom([]int64{0, 0, 0, 5, 40}).Draw(rt, "delay")
		o.n = rapid.IntRange(1, 3).Draw(rt, "runs")
	case k < 60:
		o.kind = opDequeue
		o.n = rapid.IntRange(1, 6).Draw(rt, "maxCount")
	case k < 70:
		o.kind = opAck
	case k < 77:
		o.kind = opNack
		o.delay = rapid.SampledFrom([]int64{0, 0, 3, 30}).Draw(rt, "retry")
		o.kill = rapid.IntRange(0, 9).Draw(rt, "kill") == 0
	case k < 80:
		o.kind = opRecover
	case k < 85:
		o.kind = opExpire
	case k < 88:
		o.kind = opRedrive
	case k < 92:
		o.kind = opWeight
		o.w = rapid.SampledFrom([]float64{0, 0.01, 0.5, 2, 3, 100}).Draw(rt, "weight")
	default:
		o.kind = opAdvance
		o.delay = int64(rapid.IntRange(1, 45).Draw(rt, "advance"))
	}
	return o
}

// idsIn lists the ids of runs in one state, sorted.
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

// apply runs o on the model; it returns what a dequeue served.
func (s *sim) apply(t require.TestingT, o op) []Served {
	pickFrom := func(ids []string) (string, bool) {
		if len(ids) == 0 {
			return "", false
		}
		return mustDecodeT(t, ids[o.pick%len(ids)]), true
	}
	switch o.kind {
	case opEnqueue:
		s.enq(t, o.key, o.n, o.delay, o.prio)
	case opDequeue:
		return s.deq(o.n)
	case opAck:
		if id, ok := pickFrom(s.idsIn(InFlight)); ok {
			require.NoError(t, s.m.Ack(id))
		}
	case opNack:
		if id, ok := pickFrom(s.idsIn(InFlight)); ok {
			_, err := s.m.Nack(id, s.now+o.delay, s.now, o.kill)
			require.NoError(t, err)
		}
	case opRecover:
		for _, id := range s.idsIn(InFlight) {
			_, err := s.m.Recover(mustDecodeT(t, id), s.now)
			require.NoError(t, err)
		}
	case opExpire:
		queued := append(s.idsIn(Ready), s.idsIn(Delayed)...)
		sort.Strings(queued)
		if id, ok := pickFrom(queued); ok {
			require.True(t, s.m.Expire(id))
		}
	case opRedrive:
		if id, ok := pickFrom(s.idsIn(Dead)); ok {
			require.NoError(t, s.m.Redrive(id, s.now))
		}
	case opWeight:
		s.m.SetWeight(o.key, o.w)
	case opAdvance:
		s.now += o.delay
	}
	return nil
}

// scanOf is how many variants a call of maxCount n reads in age order
// (pass 2 and discovery) and how many due variants it promotes.
func scanOf(c Config, n int) int {
	if c.ScanLimit > 0 {
		return c.ScanLimit
	}
	return max(30, 3*n)
}

// randomConfig draws the scheduler settings of a workload.
func randomConfig(rt *rapid.T) Config {
	return Config{
		Quantum:          rapid.SampledFrom([]float64{1, 1, 0.3}).Draw(rt, "quantum"),
		WindowMultiplier: rapid.IntRange(1, 3).Draw(rt, "wm"),
		ScanLimit:        rapid.SampledFrom([]int{0, 0, 1, 2}).Draw(rt, "scanLimit"),
		IdleMaxEntries:   rapid.SampledFrom([]int{10000, 2, 1}).Draw(rt, "idleMax"),
		MaxAttempts:      3,
		Limits: Limits{
			Queue: rapid.SampledFrom([]int{0, 0, 4, 9}).Draw(rt, "queueLimit"),
			Key:   rapid.SampledFrom([]int{0, 0, 1, 2}).Draw(rt, "keyLimit"),
		},
	}
}

// servableNow reports whether variant vm can be served (ready head, below
// its key limit).
func (m *Model) servableNow(vm string) bool {
	return len(m.ready[vm]) > 0 && (m.cfg.Limits.Key <= 0 || m.inflight[vm] < m.cfg.Limits.Key)
}

func (m *Model) capacity(maxCount int) int {
	queueN := 0
	for _, n := range m.inflight {
		queueN += n
	}
	c := maxCount
	if m.cfg.Limits.Env > 0 {
		c = min(c, m.cfg.Limits.Env-queueN-m.EnvOther)
	}
	if m.cfg.Limits.Queue > 0 {
		c = min(c, m.cfg.Limits.Queue-queueN)
	}
	return max(c, 0)
}

// TestPropBatchInvariance: on two identical states, dequeue(N) serves the
// same runs in the same order as N calls of dequeue(1), and leaves the same
// state, whenever the conditions of vtime/doc.go hold: at every serve the
// first 2*WindowMultiplier tags hold a servable variant, and no discovery
// is pending (always so when every writer is flag-on, as here); plus one
// the doc omits: the first call of 1 promotes every due delayed run, as the
// call of N does (see TestBatchInvarianceWithDuePromotions for why).
func TestPropBatchInvariance(t *testing.T) {
	t.Parallel()
	compared, skipped := 0, 0
	rapid.Check(t, func(rt *rapid.T) {
		cfg := randomConfig(rt)
		a, b := newSim(cfg), newSim(cfg)
		nkeys := rapid.IntRange(1, 9).Draw(rt, "keys")
		for i := rapid.IntRange(0, 40).Draw(rt, "prefix"); i > 0; i-- {
			o := drawOp(rt, nkeys)
			require.Equal(rt, a.apply(rt, o), b.apply(rt, o))
		}
		n := rapid.IntRange(2, 8).Draw(rt, "N")
		// Due delayed runs the first dequeue(1) promotes: up to
		// scanOf(1) variants, PromoteLimit runs each.
		promotedAtOnce := true
		for i, e := range b.m.delayIndex() {
			if e.Score > float64(b.now) {
				break
			}
			due := 0
			for _, at := range b.m.delayed[e.Member] {
				if at <= float64(b.now) {
					due++
				}
			}
			promotedAtOnce = promotedAtOnce && i < scanOf(cfg, 1) && due <= b.m.cfg.PromoteLimit
		}
		batch := a.deq(n)
		var singles []Served
		ok := promotedAtOnce
		for i := 0; i < n; i++ {
			if b.m.capacity(1) > 0 {
				tags := b.m.Tags()
				found := false
				for k := 0; k < len(tags) && k < 2*cfg.WindowMultiplier; k++ {
					found = found || b.m.servableNow(tags[k].Member)
				}
				ok = ok && found && len(b.m.CkIndex()) == len(tags)
			}
			singles = append(singles, b.m.Dequeue(1, b.now)...)
		}
		b.now++
		if !ok {
			skipped++
			return
		}
		compared++
		require.Equal(rt, singles, batch, "dequeue(%d) vs %d x dequeue(1)", n, n)
		// The states agree but for parked tags at or below V, which a call
		// reaps only when it parks something: one call of N reaps once, at
		// its end, N calls of 1 after each parking serve. (Such an entry is
		// not quite worthless: while it exists its key returns at V rather
		// than as a newcomer, so later registrations may differ.)
		require.Equal(rt, withoutWorthless(b.m), withoutWorthless(a.m), "state after dequeue(%d) vs %d x dequeue(1)", n, n)
	})
	t.Logf("batch invariance: %d compared, %d outside the conditions", compared, skipped)
	require.Greater(t, compared, skipped/4, "too few cases met the conditions")
}

// withoutWorthless is a copy of m without the parked tags at or below V.
func withoutWorthless(m *Model) *Model {
	c := cloneModel(m)
	for vm, p := range c.idle {
		if p <= c.V {
			delete(c.idle, vm)
		}
	}
	return c
}

// TestBatchInvarianceWithDuePromotions: promotions that one call of 1 can
// make whole (at most ScanLimit due variants, max(30, 3*maxCount)) leave
// dequeue(11) == 11 x dequeue(1). With 31 due variants it would not: the
// call of 11 promotes all 31 and a (due last, first by name) registers at V
// with the others and is served first, while the first call of 1 promotes
// 30 and serves k00 before the second registers a; vtime/doc.go states that
// condition.
func TestBatchInvarianceWithDuePromotions(t *testing.T) {
	t.Parallel()
	build := func() *Model {
		m := New(Config{})
		for i := 0; i < 29; i++ {
			require.NoError(t, m.Enqueue(fmt.Sprintf("k%02d#1", i), fmt.Sprintf("k%02d", i), 0, 5, 0))
		}
		require.NoError(t, m.Enqueue("a#1", "a", 0, 6, 0))
		return m
	}
	one, batch := build(), build()
	var singles []Served
	for i := 0; i < 11; i++ {
		out := one.Dequeue(1, 10)
		require.Len(t, out, 1)
		tags := one.Tags()
		require.True(t, one.servableNow(tags[0].Member), "a servable variant among the first tags")
		require.Equal(t, len(one.CkIndex()), len(tags), "no discovery pending")
		singles = append(singles, out...)
	}
	require.Equal(t, servedKeys(singles), servedKeys(batch.Dequeue(11, 10)), "dequeue(11) vs 11 x dequeue(1)")
}

// TestPropReachability: variants written by a flag-off instance (work but
// no tag) next to registered backlogged keys are each served within
// ceil(variants/maxCount)+2 calls of the flag-on scheduler.
func TestPropReachability(t *testing.T) {
	t.Parallel()
	worst := 0
	rapid.Check(t, func(rt *rapid.T) {
		wm := rapid.IntRange(1, 3).Draw(rt, "wm")
		keyLimit := rapid.SampledFrom([]int{0, 0, 1}).Draw(rt, "keyLimit")
		// The default ScanLimit, max(30, 3*maxCount): with one close to
		// maxCount, discovery cannot keep up with the serves.
		s := newSim(Config{WindowMultiplier: wm, Limits: Limits{Key: keyLimit}})
		tagged := rapid.IntRange(0, 3).Draw(rt, "tagged")
		for i := 0; i < tagged; i++ {
			k := fmt.Sprintf("t%d", i)
			s.m.SetWeight(k, rapid.SampledFrom([]float64{0.5, 1, 3}).Draw(rt, "w"))
			s.enq(rt, k, 40, 0, 0)
		}
		untagged := rapid.IntRange(1, 80).Draw(rt, "untagged")
		keyByKey := rapid.Bool().Draw(rt, "keyByKey")
		for i := 0; i < untagged; i++ {
			k := fmt.Sprintf("u%02d", i)
			runs := rapid.IntRange(1, 4).Draw(rt, "runs")
			for j := 0; j < runs; j++ {
				at := int64(rapid.IntRange(-1000, 0).Draw(rt, "age"))
				if keyByKey {
					at = int64(-10000 + 100*i + j)
				}
				flagOffEnqueue(s.m, fmt.Sprintf("%s#%d", k, j), k, at)
			}
		}
		maxCount := rapid.IntRange(1, 5).Draw(rt, "maxCount")
		variants := tagged + untagged
		bound := (variants+maxCount-1)/maxCount + 2
		first := map[string]int{}
		for call := 0; call < bound+5; call++ {
			for _, x := range s.deq(maxCount) {
				if _, ok := first[x.Key]; !ok {
					first[x.Key] = call + 1
				}
			}
			s.ackAll(rt)
			for i := 0; i < tagged; i++ {
				s.topUp(rt, fmt.Sprintf("t%d", i), 10)
			}
		}
		for i := 0; i < untagged; i++ {
			k := fmt.Sprintf("u%02d", i)
			c, ok := first[k]
			require.True(rt, ok, "%s never served in %d calls", k, bound+5)
			worst = max(worst, c-(variants+maxCount-1)/maxCount)
			require.LessOrEqual(rt, c, bound, "%s first served at call %d; %d variants, maxCount %d", k, c, variants, maxCount)
		}
	})
	t.Logf("worst first serve: ceil(variants/maxCount) + %d calls", worst)
}

// TestPropWorkConservation: when the age-order window (ScanLimit) covers
// every variant with work, a call serves min(capacity, servable) runs,
// where servable counts each variant's ready (and due) runs up to its key
// limit; in general a call serves something whenever a variant among the
// first ScanLimit in age order or the first 2 x window tags is servable.
func TestPropWorkConservation(t *testing.T) {
	t.Parallel()
	exact := 0
	rapid.Check(t, func(rt *rapid.T) {
		cfg := randomConfig(rt)
		s := newSim(cfg)
		nkeys := rapid.IntRange(1, 12).Draw(rt, "keys")
		for i := rapid.IntRange(1, 50).Draw(rt, "ops"); i > 0; i-- {
			o := drawOp(rt, nkeys)
			if o.kind != opDequeue {
				s.apply(rt, o)
				continue
			}
			wc := o.n * cfg.WindowMultiplier
			scan := scanOf(cfg, o.n)
			// What the call will see after promoting due runs.
			after := cloneModel(s.m)
			for i, e := range after.delayIndex() {
				if i >= scan || e.Score > float64(s.now) {
					break
				}
				after.promote(e.Member, s.now)
			}
			servable := 0
			for vm, set := range after.ready {
				room := len(set)
				if cfg.Limits.Key > 0 {
					room = min(room, cfg.Limits.Key-after.inflight[vm])
				}
				servable += max(room, 0)
			}
			visible := false
			for i, e := range after.CkIndex() {
				visible = visible || (i < scan && after.servableNow(e.Member))
			}
			for i, e := range after.Tags() {
				visible = visible || (i < 2*wc && after.servableNow(e.Member))
			}
			capacity := s.m.capacity(o.n)
			got := len(s.apply(rt, o))
			if len(after.CkIndex()) <= scan {
				exact++
				require.Equal(rt, min(capacity, servable), got, "maxCount %d, capacity %d, servable %d", o.n, capacity, servable)
			}
			if visible && capacity > 0 {
				require.Positive(rt, got, "a servable variant in the windows, nothing served")
			}
		}
	})
	t.Logf("calls checked exactly: %d", exact)
}

// TestPropInvariants: over random workloads (flag-on writers only),
// after every operation: V never decreases; a variant has a tag exactly
// while it has ready runs; the idle set holds at most IdleMaxEntries plus
// the entries parked by the last operation that parked any; a dequeue that serves nothing
// changes nothing but the promotion of due runs.
func TestPropInvariants(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		cfg := randomConfig(rt)
		s := newSim(cfg)
		nkeys := rapid.IntRange(1, 9).Draw(rt, "keys")
		lastParked := 0
		for i := rapid.IntRange(1, 60).Draw(rt, "ops"); i > 0; i-- {
			o := drawOp(rt, nkeys)
			before := cloneModel(s.m)
			served := s.apply(rt, o)

			require.GreaterOrEqual(rt, s.m.V, before.V, "V decreased")
			var tagged, indexed []string
			for _, e := range s.m.Tags() {
				tagged = append(tagged, e.Member)
			}
			for _, e := range s.m.CkIndex() {
				indexed = append(indexed, e.Member)
			}
			sort.Strings(tagged)
			sort.Strings(indexed)
			require.Equal(rt, indexed, tagged, "tags vs variants with ready runs after op %d", o.kind)
			parked := 0
			for vm := range s.m.idle {
				if _, was := before.idle[vm]; !was || before.idle[vm] != s.m.idle[vm] {
					parked++
				}
			}
			if parked > 0 {
				lastParked = parked
			}
			require.LessOrEqual(rt, len(s.m.idle), cfg.IdleMaxEntries+lastParked,
				"idle set %d entries, cap %d, parked by the last operation that parked %d (op %d)",
				len(s.m.idle), cfg.IdleMaxEntries, lastParked, o.kind)

			if o.kind == opDequeue && len(served) == 0 {
				want := before
				if want.capacity(o.n) > 0 {
					for i, e := range want.delayIndex() {
						if i >= scanOf(cfg, o.n) || e.Score > float64(s.now-1) {
							break
						}
						want.promote(e.Member, s.now-1)
					}
				}
				require.Equal(rt, want, s.m, "a dequeue that served nothing changed the state")
			}
		}
	})
}
