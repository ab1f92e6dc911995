package vtimetest

import (
	"fmt"
	"math"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/vtime"
)

// The guarantees of docs/design.md section 7 (vtime/doc.go numbers them)
// as properties over a Driver.

var lagWeights = []float64{0.5, 1, 2, 3}

func vpKey(i int) string { return fmt.Sprintf("k%02d", i) }

func keyName(i int) string { return fmt.Sprintf("k%d", i) }

// NoDebtWaitBound: once a key n is ready with tag S_n, each other key j is
// served at most floor((T-B_j)*w_j/q)+1 times before n, with
// T = max(S_n, V) and B_j = max(S_j, V): for a key with no debt
// (S_n <= V), at most one serve per other active key.
func NoDebtWaitBound(rt *rapid.T, f Factory) {
	wm := rapid.IntRange(1, 3).Draw(rt, "wm")
	q := rapid.SampledFrom([]float64{1, 0.5}).Draw(rt, "quantum")
	keyLimit := rapid.SampledFrom([]int{0, 0, 1, 2}).Draw(rt, "keyLimit")
	// With key limits, gated variants may fill the window and a call
	// falls back to age order: keep every tag inside the window.
	maxOthers := 6
	if keyLimit > 0 {
		maxOthers = 2*wm - 1
	}
	nOthers := rapid.IntRange(1, maxOthers).Draw(rt, "others")
	queueLimit := rapid.SampledFrom([]int{0, 0, 3}).Draw(rt, "queueLimit")
	d := f.New(rt, Config{WM: wm, Quantum: q, Limits: vtime.Limits{Key: keyLimit, Queue: queueLimit}})
	var held []Run
	ackAll := func() { ack(rt, d, held...); held = nil }
	wOf := map[string]float64{}
	for i := 0; i < nOthers; i++ {
		wOf[vpKey(i)] = rapid.SampledFrom([]float64{0.01, 0.5, 1, 2, 3, 10}).Draw(rt, "w")
		d.SetWeight(rt, vpKey(i), wOf[vpKey(i)])
		enq(rt, d, vpKey(i), rapid.IntRange(1, 6).Draw(rt, "backlog"), 0, rapid.IntRange(0, 2).Draw(rt, "prio"))
	}
	for c := rapid.IntRange(0, 6).Draw(rt, "prefix"); c > 0; c-- {
		held = append(held, deq(rt, d, rapid.IntRange(1, 4).Draw(rt, "maxCount"))...)
		ackAll()
		if rapid.Bool().Draw(rt, "more") {
			enq(rt, d, vpKey(rapid.IntRange(0, nOthers-1).Draw(rt, "k")), 2, 0, 0)
		}
	}
	n := "new"
	if rapid.Bool().Draw(rt, "returning") {
		n = vpKey(0)
	}
	enq(rt, d, n, rapid.IntRange(1, 3).Draw(rt, "nRuns"), 0, rapid.IntRange(0, 9).Draw(rt, "nPrio"))
	snap := d.Snapshot(rt)
	v0 := V(snap)
	if queuedInLane(rt, d, n) {
		// n waits in the newcomer lane behind its head, without a tag:
		// the bound below needs one. The oracle's newcomer check
		// (internal/fairness) covers the lane.
		ackAll()
		return
	}
	sn, ok := tag(rt, d, n)
	require.True(rt, ok)
	T := math.Max(sn, v0)
	base := map[string]float64{}
	for _, e := range Tags(snap) {
		if k := keyOf(rt, e.Member); k != n {
			base[k] = math.Max(e.Score, v0)
		}
	}
	served := map[string]int{}
	found := false
	for call := 0; call < 300 && !found; call++ {
		runs := deq(rt, d, rapid.IntRange(1, 5).Draw(rt, "waitMaxCount"))
		held = append(held, runs...)
		for _, r := range runs {
			if r.Key == n {
				found = true
				break
			}
			served[r.Key]++
		}
		ackAll()
	}
	require.True(rt, found, "%s never served", n)
	for k, c := range served {
		w, ok := wOf[k]
		require.True(rt, ok, "%s is not a key of this test", k)
		b, ok := base[k]
		require.True(rt, ok, "%s served while waiting but was not registered", k)
		// A stride is carried as a quotient and a remainder, so k serves
		// move a tag by floor(k*stride) units: up to one unit less than
		// k*stride, which lets one more serve tie at T.
		limit := 0
		if b <= T+eps {
			limit = int(math.Floor((T-b+q/vtime.Unit)*w/q+eps)) + 1
		}
		require.LessOrEqual(rt, c, limit, "%s (w %v, from %v) served %d times before %s (tag %v, V %v)", k, w, b, c, n, sn, v0)
		if sn <= v0 {
			require.LessOrEqual(rt, c, 1, "no-debt key %s waited %d serves of %s", n, c, k)
		}
	}
}

// NoDebtWaitDiscovered is guarantee 1 for a variant found by discovery
// (work without a tag, as a flag-off instance writes it) whose run became
// available at or before the state's first discovery read (the clock
// stands still, or the state expired since): discovered at V, it is served
// before any other key is served twice, whatever the weights of the
// backlogged keys. Written after that read (the clock moved on), such a
// variant registers by the newcomer rule (guarantee 10), as a flag-on
// enqueue would have: the lane's head at most two serves of its own (at
// weight 1) past V, so a backlogged key of weight w is served at most 2w +
// 2 times before it (the tags at or above V, a stride carried as a
// quotient and a remainder, a tie).
func NoDebtWaitDiscovered(rt *rapid.T, f Factory) {
	d := f.New(rt, Config{WM: rapid.IntRange(1, 3).Draw(rt, "wm")})
	nkeys := rapid.IntRange(1, 8).Draw(rt, "keys")
	weights := map[string]float64{}
	for i := 0; i < nkeys; i++ {
		w := rapid.SampledFrom([]float64{0.001, 0.3, 1, 3, 7, 1000}).Draw(rt, "w")
		d.SetWeight(rt, keyName(i), w)
		weights[keyName(i)] = w
		enq(rt, d, keyName(i), 30, 0, 0)
	}
	maxCount := rapid.IntRange(1, 5).Draw(rt, "maxCount")
	for c := rapid.IntRange(0, 20).Draw(rt, "prefix"); c > 0; c-- {
		ack(rt, d, d.Dequeue(rt, maxCount)...)
	}
	switch rapid.IntRange(0, 2).Draw(rt, "when") {
	case 1: // later than the first read, if there was one
		d.Advance(1)
	case 2: // later, and the state expired: found again as old work
		d.Advance(1)
		d.ExpireState(rt)
	}
	d.EnqueueFlagOff(rt, "new", d.Now())
	st := d.Snapshot(rt)
	atV := !st.Began || d.Now() <= st.Born
	limit := func(k string) int {
		if atV {
			return 1
		}
		return int(math.Floor(2*weights[k]+1e-9)) + 2
	}
	most := 1 // calls: new is served within the sum of the limits
	for k := range weights {
		most += limit(k)
	}
	counts := map[string]int{}
	for call := 0; ; call++ {
		require.Less(rt, call, most, "new not served (at V %v)", atV)
		out := d.Dequeue(rt, maxCount)
		if call == 0 && atV {
			s := d.Snapshot(rt)
			if r, ok := s.Reg[keys.VariantMember("new")]; ok {
				require.LessOrEqual(rt, r.U, s.V, "discovered at V")
			}
		}
		for _, s := range out {
			if s.Key == "new" {
				return
			}
			counts[s.Key]++
			require.LessOrEqual(rt, counts[s.Key], limit(s.Key), "%s (w %v) served %d times before new (at V %v)",
				s.Key, weights[s.Key], counts[s.Key], atV)
			d.Ack(rt, s)
		}
		for i := 0; i < nkeys; i++ {
			if d.Ready(rt, keyName(i)) < 10 {
				enq(rt, d, keyName(i), 10, 0, 0)
			}
		}
	}
}

// lag tracks D = served_i/w_i - served_j/w_j over every prefix of a serve
// sequence.
type lag struct {
	i, j       string
	wi, wj     float64
	ni, nj     int
	d          float64
	minD, maxD float64 // over prefixes after both were served once
	started    bool
}

func (l *lag) serve(k string) {
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

// LagBound: two continuously backlogged keys i, j with weights from
// {0.5, 1, 2, 3} keep |served_i/w_i - served_j/w_j| within 1/w_i + 1/w_j
// over every stretch of the serve order that starts once both were
// served, prefixes inside one batch included (the order of the returned
// slice), and within 1/w_i + 1/w_j + |S_i - S_j| from the first call
// that both begin with tags S_i, S_j (exact: with their stride
// remainders; a key queued in the newcomer lane has no tag yet).
func LagBound(rt *rapid.T, f Factory) {
	wm := rapid.IntRange(1, 3).Draw(rt, "wm")
	q := rapid.SampledFrom([]float64{1, 0.3}).Draw(rt, "quantum")
	queueLimit := rapid.SampledFrom([]int{0, 0, 2, 5}).Draw(rt, "queueLimit")
	d := f.New(rt, Config{WM: wm, Quantum: q, Limits: vtime.Limits{Queue: queueLimit}})
	var held []Run
	ackAll := func() { ack(rt, d, held...); held = nil }
	names := rapid.Permutation([]string{"a", "m", "z"}).Draw(rt, "names")
	l := &lag{i: names[0], j: names[1],
		wi: rapid.SampledFrom(lagWeights).Draw(rt, "wi"), wj: rapid.SampledFrom(lagWeights).Draw(rt, "wj")}
	d.SetWeight(rt, l.i, l.wi)
	d.SetWeight(rt, l.j, l.wj)
	for o := rapid.IntRange(0, 3).Draw(rt, "others"); o > 0; o-- {
		d.SetWeight(rt, vpKey(o), rapid.SampledFrom([]float64{0.01, 0.5, 1, 3, 10}).Draw(rt, "wo"))
		enq(rt, d, vpKey(o), rapid.IntRange(1, 5).Draw(rt, "ob"), int64(rapid.SampledFrom([]int{0, 0, 3}).Draw(rt, "od")), 0)
	}
	for c := rapid.IntRange(0, 3).Draw(rt, "before"); c > 0; c-- {
		held = append(held, deq(rt, d, rapid.IntRange(1, 4).Draw(rt, "m0"))...)
		ackAll()
	}
	topUp(rt, d, l.i, 3)
	for c := rapid.IntRange(0, 2).Draw(rt, "gap"); c > 0; c-- {
		runs := deq(rt, d, rapid.IntRange(1, 4).Draw(rt, "m1"))
		held = append(held, runs...)
		for _, r := range runs {
			l.serve(r.Key)
		}
		ackAll()
		topUp(rt, d, l.i, 3)
	}
	topUp(rt, d, l.j, 3)
	bound := 1/l.wi + 1/l.wj
	// The bound since registration starts at the first call both keys
	// begin with tags: a key queued in the newcomer lane behind its head
	// has none yet (its U reads 0), so |S_i - S_j| would mean nothing.
	var fromReg *lag
	var regBound float64
	start := func() {
		if fromReg != nil || queuedInLane(rt, d, l.i) || queuedInLane(rt, d, l.j) {
			return
		}
		si, sj := exactTag(rt, d, l.i), exactTag(rt, d, l.j)
		fromReg = &lag{i: l.i, j: l.j, wi: l.wi, wj: l.wj}
		regBound = bound + math.Abs(si-sj) // tags in serves: the quantum only scales reporting
	}
	for c := rapid.IntRange(4, 12).Draw(rt, "calls"); c > 0; c-- {
		n := rapid.IntRange(1, 6).Draw(rt, "maxCount")
		topUp(rt, d, l.i, n+1)
		topUp(rt, d, l.j, n+1)
		start()
		if rapid.IntRange(0, 3).Draw(rt, "churn") == 0 {
			enq(rt, d, vpKey(rapid.IntRange(0, 9).Draw(rt, "ok")), rapid.IntRange(1, 3).Draw(rt, "on"),
				int64(rapid.SampledFrom([]int{0, 0, 2}).Draw(rt, "odl")), 0)
		}
		runs := deq(rt, d, n)
		held = append(held, runs...)
		for pos, r := range runs {
			l.serve(r.Key)
			require.LessOrEqual(rt, l.maxD-l.minD, bound+eps,
				"position %d of %v: lag swing %v > %v (i %s w %v: %d, j %s w %v: %d)",
				pos, byKeys(runs), l.maxD-l.minD, bound, l.i, l.wi, l.ni, l.j, l.wj, l.nj)
			if fromReg != nil {
				fromReg.serve(r.Key)
				require.LessOrEqual(rt, math.Abs(fromReg.d), regBound+eps,
					"position %d of %v: lag %v since registration > %v", pos, byKeys(runs), fromReg.d, regBound)
			}
		}
		if rapid.Bool().Draw(rt, "ack") {
			ackAll()
		}
	}
}

// NoCredit modes: how the key c stays away.
var NoCreditModes = []string{"Idle", "Gated", "Delayed"}

// NoCredit: a key c that was idle, gated at its key limit, or whose runs
// were delayed for a long stretch (mode) gets no burst when it comes back:
// from then on, at every prefix and for every other backlogged key o,
// served_c/w_c - served_o/w_o <= 1/w_c + 1/w_o; with one other key of the
// same weight, c gets at most ceil(k/2)+1 of the next k serves.
func NoCredit(mode string) func(*rapid.T, Factory) {
	return func(rt *rapid.T, f Factory) { noCredit(rt, f, mode) }
}

func noCredit(rt *rapid.T, f Factory, mode string) {
	wm := rapid.IntRange(1, 3).Draw(rt, "wm")
	q := rapid.SampledFrom([]float64{1, 0.3}).Draw(rt, "quantum")
	maxCount := func() int { return rapid.IntRange(1, 4).Draw(rt, "maxCount") }
	keyLimit := 0
	if mode == "Gated" {
		// One serve per call and acks after each call: only c is gated.
		keyLimit = 1
		maxCount = func() int { return 1 }
	}
	d := f.New(rt, Config{WM: wm, Quantum: q, Limits: vtime.Limits{Key: keyLimit}})
	sameWeights := rapid.Bool().Draw(rt, "sameWeights")
	wOf := map[string]float64{}
	weigh := func(k string) {
		wOf[k] = 1
		if !sameWeights {
			wOf[k] = rapid.SampledFrom(lagWeights).Draw(rt, "w")
			d.SetWeight(rt, k, wOf[k])
		}
	}
	const ck = "c"
	weigh(ck)
	var others []string
	for i := rapid.IntRange(1, 2).Draw(rt, "others"); i > 0; i-- {
		others = append(others, vpKey(i))
		weigh(vpKey(i))
	}
	all := append([]string{ck}, others...)
	call := func(n int, up []string) []Run {
		for _, k := range up {
			topUp(rt, d, k, n+1)
		}
		return deq(rt, d, n)
	}
	// Phase 1: everyone backlogged until everyone was served.
	seen := map[string]bool{}
	for i := 0; i < 100 && len(seen) < len(all); i++ {
		runs := call(maxCount(), all)
		for _, r := range runs {
			seen[r.Key] = true
		}
		ack(rt, d, runs...)
	}
	require.Len(rt, seen, len(all))

	// Phase 2: c stays away for a stretch while the others are served.
	stretch := rapid.IntRange(3, 10).Draw(rt, "stretch")
	var gatedRun *Run
	switch mode {
	case "Idle", "Delayed":
		for i := 0; i < 200 && d.Ready(rt, ck) > 0; i++ {
			ack(rt, d, call(maxCount(), others)...)
		}
		require.Zero(rt, d.Ready(rt, ck))
		if mode == "Delayed" {
			enq(rt, d, ck, 6, int64(stretch), 0)
		}
	case "Gated":
		for i := 0; i < 200 && gatedRun == nil; i++ {
			topUp(rt, d, ck, 5)
			for _, r := range call(1, others) {
				if r.Key == ck {
					gatedRun = &r
				} else {
					ack(rt, d, r)
				}
			}
		}
		require.NotNil(rt, gatedRun)
	}
	for i := 0; i < stretch; i++ {
		for _, r := range call(maxCount(), others) {
			require.NotEqual(rt, ck, r.Key, "c served while away")
			ack(rt, d, r)
		}
	}
	// Phase 3: c is back.
	if gatedRun != nil {
		ack(rt, d, *gatedRun)
	}
	count := map[string]int{}
	total := 0
	for i := rapid.IntRange(3, 8).Draw(rt, "after"); i > 0; i-- {
		up := all
		if mode == "Delayed" {
			up = others
		}
		runs := call(maxCount(), up)
		for _, r := range runs {
			count[r.Key]++
			total++
			for _, o := range others {
				lag := float64(count[ck])/wOf[ck] - float64(count[o])/wOf[o]
				require.LessOrEqual(rt, lag, 1/wOf[ck]+1/wOf[o]+eps,
					"%s, %d serves back: c %d (w %v) vs %s %d (w %v)", mode, total, count[ck], wOf[ck], o, count[o], wOf[o])
			}
			if len(others) == 1 && sameWeights {
				require.LessOrEqual(rt, count[ck], (total+1)/2+1, "%s: c took %d of %d serves", mode, count[ck], total)
			}
		}
		ack(rt, d, runs...)
		if mode == "Delayed" && d.Ready(rt, ck) == 0 && d.Delayed(rt, ck, math.MaxInt64) == 0 {
			break // c's runs are all served: no longer backlogged
		}
	}
}
