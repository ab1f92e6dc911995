package runqueue_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
	"github.com/runqueue/runqueue/vtime"
)

// The guarantees of DESIGN section 7 as properties of the Lua, on miniredis
// and on a real Redis; vtime/props_test.go checks the same ones on the
// model.

const (
	vpEnv = "env:vp"
	vpEps = 1e-9
)

var vpWeights = []float64{0.5, 1, 2, 3}

// vpConfig is what a property varies between its checks.
type vpConfig struct {
	WM          int
	Quantum     float64
	IdleMax     int
	MaxAttempts int
	Limits      runqueue.Limits
}

// vpPool shares Queue instances between the checks of one property on one
// backend (loading the scripts for every check would dominate the run on
// miniredis): each check gets its own base queue, limits per queue.
type vpPool struct {
	t      testing.TB
	c      redis.UniversalClient
	clock  *fakeClock
	prefix string
	mu     sync.Mutex
	limits map[string]runqueue.Limits // queue name -> limits
	inst   map[vpConfig][2]*runqueue.Queue
	n      int
}

func newVPPool(t testing.TB, c redis.UniversalClient) *vpPool {
	pl := &vpPool{t: t, c: c, clock: newFakeClock(), prefix: redistest.Prefix(t),
		limits: map[string]runqueue.Limits{}, inst: map[vpConfig][2]*runqueue.Queue{}}
	t.Cleanup(func() {
		for _, qs := range pl.inst {
			_ = qs[0].Close()
			_ = qs[1].Close()
		}
	})
	return pl
}

// vp is one base queue driven through the public API by a flag-on
// instance and a flag-off instance on the same key space and fake clock (a
// rolling deploy, when a test uses both).
type vp struct {
	ctx     context.Context
	c       redis.UniversalClient
	clock   *fakeClock
	prefix  string
	on, off *runqueue.Queue
	queue   string
	qk      keys.Queue
	next    int
}

// get returns a fresh base queue under cfg.
func (pl *vpPool) get(cfg vpConfig) *vp {
	limits := cfg.Limits
	cfg.Limits = runqueue.Limits{}
	pl.mu.Lock()
	pl.n++
	queue := fmt.Sprintf("q{vp}*%d", pl.n)
	pl.limits[queue] = limits
	qs, ok := pl.inst[cfg]
	pl.mu.Unlock()
	if !ok {
		base := runqueue.Config{Prefix: pl.prefix, Clock: pl.clock, WindowMultiplier: cfg.WM, Quantum: cfg.Quantum,
			IdleMaxEntries: cfg.IdleMax, MaxAttempts: cfg.MaxAttempts, LeaseDuration: time.Minute,
			LimitsFor: func(_, queue string) runqueue.Limits {
				pl.mu.Lock()
				defer pl.mu.Unlock()
				return pl.limits[queue]
			}}
		for i, on := range []bool{true, false} {
			c := base
			c.VtimeScheduling = on
			q, err := runqueue.New(context.Background(), pl.c, &c)
			require.NoError(pl.t, err)
			qs[i] = q
		}
		pl.mu.Lock()
		pl.inst[cfg] = qs
		pl.mu.Unlock()
	}
	space, err := keys.NewSpace(pl.prefix, qs[0].Shards())
	require.NoError(pl.t, err)
	return &vp{ctx: context.Background(), c: pl.c, clock: pl.clock, prefix: pl.prefix, on: qs[0], off: qs[1],
		queue: queue, qk: space.Env(vpEnv).Queue(queue)}
}

func (p *vp) bundle() *testBundle {
	return &testBundle{ctx: p.ctx, client: p.c, clock: p.clock, prefix: p.prefix, q: p.on}
}

// enq queues n runs of key through q, available after delay, and returns
// their ids.
func (p *vp) enq(t require.TestingT, q *runqueue.Queue, key string, n int, delay time.Duration, prio int) []string {
	var ids []string
	for i := 0; i < n; i++ {
		p.next++
		id := "r" + strconv.Itoa(p.next)
		ok, err := q.Enqueue(p.ctx, runqueue.EnqueueParams{Env: vpEnv, Queue: p.queue, Key: key, ID: id,
			Payload: []byte(id), Delay: delay, Priority: prio})
		require.NoError(t, err)
		require.True(t, ok)
		ids = append(ids, id)
	}
	return ids
}

// enqAt queues one run of key available at at (in the past for an old
// backlog).
func (p *vp) enqAt(t require.TestingT, q *runqueue.Queue, key string, at time.Time) string {
	p.next++
	id := "r" + strconv.Itoa(p.next)
	ok, err := q.Enqueue(p.ctx, runqueue.EnqueueParams{Env: vpEnv, Queue: p.queue, Key: key, ID: id,
		Payload: []byte(id), AvailableAt: at})
	require.NoError(t, err)
	require.True(t, ok)
	return id
}

// deq runs one dequeue call through q, then moves the clock 1 ms.
func (p *vp) deq(t require.TestingT, q *runqueue.Queue, n int) []*runqueue.Run {
	runs, err := q.Dequeue(p.ctx, vpEnv, p.queue, n)
	require.NoError(t, err)
	p.clock.Advance(time.Millisecond)
	return runs
}

func (p *vp) ack(t require.TestingT, runs ...*runqueue.Run) {
	for _, r := range runs {
		require.NoError(t, p.on.Ack(p.ctx, r))
	}
}

func (p *vp) ready(t require.TestingT, key string) int {
	n, err := p.c.ZCard(p.ctx, p.qk.Variant(key).Ready()).Result()
	require.NoError(t, err)
	return int(n)
}

func (p *vp) topUp(t require.TestingT, key string, n int) {
	if k := p.ready(t, key); k < n {
		p.enq(t, p.on, key, n-k, 0, 0)
	}
}

func (p *vp) zset(t require.TestingT, key string) []vtime.Entry {
	z, err := p.c.ZRangeWithScores(p.ctx, key, 0, -1).Result()
	require.NoError(t, err)
	out := []vtime.Entry{}
	for _, e := range z {
		out = append(out, vtime.Entry{Member: e.Member.(string), Score: e.Score})
	}
	return out
}

// snap is the scheduler state as stored.
func (p *vp) snap(t require.TestingT) vtime.Snapshot {
	s, _, err := p.on.SchedulerSnapshot(p.ctx, vpEnv, p.queue)
	require.NoError(t, err)
	return s
}

// tags lists the registrations in competition order (gated last), score
// the tag in serves at weight 1.
func (p *vp) tags(t require.TestingT) []vtime.Entry { return snapTags(p.snap(t)) }

func snapTags(s vtime.Snapshot) []vtime.Entry {
	m := vtime.Restore(vtime.Config{}, s)
	var out []vtime.Entry
	for _, r := range m.Registered() {
		out = append(out, vtime.Entry{Member: r.Member, Score: float64(r.U) / vtime.Unit})
	}
	return out
}

func (p *vp) tag(t require.TestingT, key string) (float64, bool) {
	r, ok := p.snap(t).Reg[p.qk.Variant(key).Member()]
	return float64(r.U) / vtime.Unit, ok
}

// queuedInLane reports whether key waits in the newcomer lane behind its
// head (registered without a tag).
func (p *vp) queuedInLane(t require.TestingT, key string) bool {
	s := p.snap(t)
	r, ok := s.Reg[p.qk.Variant(key).Member()]
	if !ok || !r.Waiting {
		return false
	}
	for _, o := range s.Reg {
		if o.Waiting && o.Seq < r.Seq {
			return true
		}
	}
	return false
}

// idle lists the parked tags (serves at weight 1) in ZSET order.
func (p *vp) idle(t require.TestingT) []vtime.Entry { return snapIdle(p.snap(t)) }

func snapIdle(s vtime.Snapshot) []vtime.Entry {
	var out []vtime.Entry
	for _, e := range vtime.Restore(vtime.Config{}, s).Idle() {
		out = append(out, vtime.Entry{Member: e.Member, Score: e.Score / vtime.Unit})
	}
	return out
}

func (p *vp) v(t require.TestingT) float64 {
	s := p.snap(t)
	return (float64(s.Epoch)*vtime.RebaseBy + float64(s.V)) / vtime.Unit
}

func (p *vp) setWeight(t require.TestingT, key string, w float64) {
	require.NoError(t, p.on.SetWeight(p.ctx, vpEnv, p.queue, key, w))
}

func vpKey(i int) string { return fmt.Sprintf("k%02d", i) }

func byKeys(runs []*runqueue.Run) []string {
	out := make([]string, len(runs))
	for i, r := range runs {
		out[i] = r.Key
	}
	return out
}

// vpCheck runs prop as a rapid check on miniredis and on a real Redis.
func vpCheck(t *testing.T, prop func(rt *rapid.T, pl *vpPool)) {
	for _, b := range backends[:2] {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			pl := newVPPool(t, b.client(t))
			rapid.Check(t, func(rt *rapid.T) { prop(rt, pl) })
		})
	}
}

// TestVtimePropNoDebtWait: once a key n is ready with tag S_n, each other
// key j is served at most floor((T-B_j)*w_j/q)+1 times before n, with
// T = max(S_n, V) and B_j = max(S_j, V): for a key with no debt
// (S_n <= V), at most one serve per other active key.
func TestVtimePropNoDebtWait(t *testing.T) {
	t.Parallel()
	vpCheck(t, func(rt *rapid.T, pl *vpPool) {
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
		p := pl.get(vpConfig{WM: wm, Quantum: q, Limits: runqueue.Limits{Key: keyLimit, Queue: queueLimit}})
		var held []*runqueue.Run
		ackAll := func() { p.ack(rt, held...); held = nil }
		wOf := map[string]float64{}
		for i := 0; i < nOthers; i++ {
			wOf[vpKey(i)] = rapid.SampledFrom([]float64{0.01, 0.5, 1, 2, 3, 10}).Draw(rt, "w")
			p.setWeight(rt, vpKey(i), wOf[vpKey(i)])
			p.enq(rt, p.on, vpKey(i), rapid.IntRange(1, 6).Draw(rt, "backlog"), 0, rapid.IntRange(0, 2).Draw(rt, "prio"))
		}
		for c := rapid.IntRange(0, 6).Draw(rt, "prefix"); c > 0; c-- {
			held = append(held, p.deq(rt, p.on, rapid.IntRange(1, 4).Draw(rt, "maxCount"))...)
			ackAll()
			if rapid.Bool().Draw(rt, "more") {
				p.enq(rt, p.on, vpKey(rapid.IntRange(0, nOthers-1).Draw(rt, "k")), 2, 0, 0)
			}
		}
		n := "new"
		if rapid.Bool().Draw(rt, "returning") {
			n = vpKey(0)
		}
		p.enq(rt, p.on, n, rapid.IntRange(1, 3).Draw(rt, "nRuns"), 0, rapid.IntRange(0, 9).Draw(rt, "nPrio"))
		v0 := p.v(rt)
		if p.queuedInLane(rt, n) {
			// n waits in the newcomer lane behind its head, without a tag:
			// the bound below needs one. The oracle's newcomer check
			// (internal/fairness) covers the lane.
			ackAll()
			return
		}
		sn, ok := p.tag(rt, n)
		require.True(rt, ok)
		T := math.Max(sn, v0)
		base := map[string]float64{}
		for _, e := range p.tags(rt) {
			k, err := keys.DecodeVariantMember(e.Member)
			require.NoError(rt, err)
			if k != n {
				base[k] = math.Max(e.Score, v0)
			}
		}
		served := map[string]int{}
		found := false
		for call := 0; call < 300 && !found; call++ {
			runs := p.deq(rt, p.on, rapid.IntRange(1, 5).Draw(rt, "waitMaxCount"))
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
			// A stride is carried as a quotient and a remainder, so k
			// serves move a tag by floor(k*stride) units: up to one unit
			// less than k*stride, which lets one more serve tie at T.
			limit := 0
			if b <= T+vpEps {
				limit = int(math.Floor((T-b+q/vtime.Unit)*w/q+vpEps)) + 1
			}
			require.LessOrEqual(rt, c, limit, "%s (w %v, from %v) served %d times before %s (tag %v, V %v)", k, w, b, c, n, sn, v0)
			if sn <= v0 {
				require.LessOrEqual(rt, c, 1, "no-debt key %s waited %d serves of %s", n, c, k)
			}
		}
	})
}

// vpLag tracks D = served_i/w_i - served_j/w_j over every prefix of a serve
// sequence.
type vpLag struct {
	i, j       string
	wi, wj     float64
	ni, nj     int
	d          float64
	minD, maxD float64 // over prefixes after both were served once
	started    bool
}

func (l *vpLag) serve(k string) {
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

// TestVtimePropLagBound: two continuously backlogged keys i, j with weights
// from {0.5, 1, 2, 3} keep |served_i/w_i - served_j/w_j| within
// 1/w_i + 1/w_j over every stretch of the serve order that starts once both
// were served, prefixes inside one batch included (the order of the
// returned slice), and within 1/w_i + 1/w_j + |S_i - S_j|/q from the moment
// both are registered with tags S_i, S_j.
func TestVtimePropLagBound(t *testing.T) {
	t.Parallel()
	vpCheck(t, func(rt *rapid.T, pl *vpPool) {
		wm := rapid.IntRange(1, 3).Draw(rt, "wm")
		q := rapid.SampledFrom([]float64{1, 0.3}).Draw(rt, "quantum")
		queueLimit := rapid.SampledFrom([]int{0, 0, 2, 5}).Draw(rt, "queueLimit")
		p := pl.get(vpConfig{WM: wm, Quantum: q, Limits: runqueue.Limits{Queue: queueLimit}})
		var held []*runqueue.Run
		ackAll := func() { p.ack(rt, held...); held = nil }
		names := rapid.Permutation([]string{"a", "m", "z"}).Draw(rt, "names")
		l := &vpLag{i: names[0], j: names[1],
			wi: rapid.SampledFrom(vpWeights).Draw(rt, "wi"), wj: rapid.SampledFrom(vpWeights).Draw(rt, "wj")}
		p.setWeight(rt, l.i, l.wi)
		p.setWeight(rt, l.j, l.wj)
		for o := rapid.IntRange(0, 3).Draw(rt, "others"); o > 0; o-- {
			p.setWeight(rt, vpKey(o), rapid.SampledFrom([]float64{0.01, 0.5, 1, 3, 10}).Draw(rt, "wo"))
			p.enq(rt, p.on, vpKey(o), rapid.IntRange(1, 5).Draw(rt, "ob"),
				time.Duration(rapid.SampledFrom([]int{0, 0, 3}).Draw(rt, "od"))*time.Millisecond, 0)
		}
		for c := rapid.IntRange(0, 3).Draw(rt, "before"); c > 0; c-- {
			held = append(held, p.deq(rt, p.on, rapid.IntRange(1, 4).Draw(rt, "m0"))...)
			ackAll()
		}
		p.topUp(rt, l.i, 3)
		for c := rapid.IntRange(0, 2).Draw(rt, "gap"); c > 0; c-- {
			runs := p.deq(rt, p.on, rapid.IntRange(1, 4).Draw(rt, "m1"))
			held = append(held, runs...)
			for _, r := range runs {
				l.serve(r.Key)
			}
			ackAll()
			p.topUp(rt, l.i, 3)
		}
		p.topUp(rt, l.j, 3)
		si, _ := p.tag(rt, l.i)
		sj, _ := p.tag(rt, l.j)
		fromReg := &vpLag{i: l.i, j: l.j, wi: l.wi, wj: l.wj}
		bound := 1/l.wi + 1/l.wj
		regBound := bound + math.Abs(si-sj)/q
		for c := rapid.IntRange(4, 12).Draw(rt, "calls"); c > 0; c-- {
			n := rapid.IntRange(1, 6).Draw(rt, "maxCount")
			p.topUp(rt, l.i, n+1)
			p.topUp(rt, l.j, n+1)
			if rapid.IntRange(0, 3).Draw(rt, "churn") == 0 {
				p.enq(rt, p.on, vpKey(rapid.IntRange(0, 9).Draw(rt, "ok")), rapid.IntRange(1, 3).Draw(rt, "on"),
					time.Duration(rapid.SampledFrom([]int{0, 0, 2}).Draw(rt, "odl"))*time.Millisecond, 0)
			}
			runs := p.deq(rt, p.on, n)
			held = append(held, runs...)
			for pos, r := range runs {
				l.serve(r.Key)
				fromReg.serve(r.Key)
				require.LessOrEqual(rt, l.maxD-l.minD, bound+vpEps,
					"position %d of %v: lag swing %v > %v (i %s w %v: %d, j %s w %v: %d)",
					pos, byKeys(runs), l.maxD-l.minD, bound, l.i, l.wi, l.ni, l.j, l.wj, l.nj)
				require.LessOrEqual(rt, math.Abs(fromReg.d), regBound+vpEps,
					"position %d of %v: lag %v since registration > %v", pos, byKeys(runs), fromReg.d, regBound)
			}
			if rapid.Bool().Draw(rt, "ack") {
				ackAll()
			}
		}
	})
}

// TestVtimePropNoCredit: a key c that was idle, gated at its key limit, or
// whose runs were delayed for a long stretch gets no burst when it comes
// back: from then on, at every prefix and for every other backlogged key o,
// served_c/w_c - served_o/w_o <= 1/w_c + 1/w_o; with one other key of the
// same weight, c gets at most ceil(k/2)+1 of the next k serves.
func TestVtimePropNoCredit(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"Idle", "Gated", "Delayed"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			vpCheck(t, func(rt *rapid.T, pl *vpPool) { vpNoCredit(rt, pl, mode) })
		})
	}
}

func vpNoCredit(rt *rapid.T, pl *vpPool, mode string) {
	wm := rapid.IntRange(1, 3).Draw(rt, "wm")
	q := rapid.SampledFrom([]float64{1, 0.3}).Draw(rt, "quantum")
	maxCount := func() int { return rapid.IntRange(1, 4).Draw(rt, "maxCount") }
	keyLimit := 0
	if mode == "Gated" {
		// One serve per call and acks after each call: only c is gated.
		keyLimit = 1
		maxCount = func() int { return 1 }
	}
	p := pl.get(vpConfig{WM: wm, Quantum: q, Limits: runqueue.Limits{Key: keyLimit}})
	sameWeights := rapid.Bool().Draw(rt, "sameWeights")
	wOf := map[string]float64{}
	weigh := func(k string) {
		wOf[k] = 1
		if !sameWeights {
			wOf[k] = rapid.SampledFrom(vpWeights).Draw(rt, "w")
			p.setWeight(rt, k, wOf[k])
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
	call := func(n int, topUp []string) []*runqueue.Run {
		for _, k := range topUp {
			p.topUp(rt, k, n+1)
		}
		return p.deq(rt, p.on, n)
	}
	// Phase 1: everyone backlogged until everyone was served.
	seen := map[string]bool{}
	for i := 0; i < 100 && len(seen) < len(all); i++ {
		runs := call(maxCount(), all)
		for _, r := range runs {
			seen[r.Key] = true
		}
		p.ack(rt, runs...)
	}
	require.Len(rt, seen, len(all))

	// Phase 2: c stays away for a stretch while the others are served.
	stretch := rapid.IntRange(3, 10).Draw(rt, "stretch")
	var gatedRun *runqueue.Run
	switch mode {
	case "Idle", "Delayed":
		for i := 0; i < 200 && p.ready(rt, ck) > 0; i++ {
			p.ack(rt, call(maxCount(), others)...)
		}
		require.Zero(rt, p.ready(rt, ck))
		if mode == "Delayed" {
			p.enq(rt, p.on, ck, 6, time.Duration(stretch)*time.Millisecond, 0)
		}
	case "Gated":
		for i := 0; i < 200 && gatedRun == nil; i++ {
			p.topUp(rt, ck, 5)
			for _, r := range call(1, others) {
				if r.Key == ck {
					gatedRun = r
				} else {
					p.ack(rt, r)
				}
			}
		}
		require.NotNil(rt, gatedRun)
	}
	for i := 0; i < stretch; i++ {
		for _, r := range call(maxCount(), others) {
			require.NotEqual(rt, ck, r.Key, "c served while away")
			p.ack(rt, r)
		}
	}
	// Phase 3: c is back.
	if gatedRun != nil {
		p.ack(rt, gatedRun)
	}
	count := map[string]int{}
	total := 0
	for i := rapid.IntRange(3, 8).Draw(rt, "after"); i > 0; i-- {
		topUp := all
		if mode == "Delayed" {
			topUp = others
		}
		runs := call(maxCount(), topUp)
		for _, r := range runs {
			count[r.Key]++
			total++
			for _, o := range others {
				lag := float64(count[ck])/wOf[ck] - float64(count[o])/wOf[o]
				require.LessOrEqual(rt, lag, 1/wOf[ck]+1/wOf[o]+vpEps,
					"%s, %d serves back: c %d (w %v) vs %s %d (w %v)", mode, total, count[ck], wOf[ck], o, count[o], wOf[o])
			}
			if len(others) == 1 && sameWeights {
				require.LessOrEqual(rt, count[ck], (total+1)/2+1, "%s: c took %d of %d serves", mode, count[ck], total)
			}
		}
		p.ack(rt, runs...)
		if mode == "Delayed" && p.ready(rt, ck) == 0 {
			st, err := p.on.KeyStats(p.ctx, vpEnv, p.queue, ck)
			require.NoError(rt, err)
			if st.Delayed == 0 {
				break // c's runs are all served: no longer backlogged
			}
		}
	}
}

// vpOp is one operation of a random workload on a vp.
type vpOp struct {
	kind  int
	key   string
	prio  int
	delay time.Duration
	n     int
	pick  int
	kill  bool
	w     float64
}

const (
	vpEnqueue = iota
	vpDequeue
	vpAck
	vpNack
	vpWeight
	vpAdvance
)

func drawVPOp(rt *rapid.T, nkeys int) vpOp {
	k := rapid.IntRange(0, 99).Draw(rt, "op")
	o := vpOp{key: vpKey(rapid.IntRange(0, nkeys-1).Draw(rt, "key")), pick: rapid.IntRange(0, 1000).Draw(rt, "pick")}
	switch {
	case k < 40:
		o.kind = vpEnqueue
		o.prio = rapid.SampledFrom([]int{0, 0, 0, 1, 9}).Draw(rt, "prio")
		o.delay = time.Duration(rapid.SampledFrom([]int{0, 0, 0, 5, 40}).Draw(rt, "delay")) * time.Millisecond
		o.n = rapid.IntRange(1, 3).Draw(rt, "runs")
	case k < 70:
		o.kind = vpDequeue
		o.n = rapid.IntRange(1, 6).Draw(rt, "maxCount")
	case k < 82:
		o.kind = vpAck
	case k < 89:
		o.kind = vpNack
		o.delay = time.Duration(rapid.SampledFrom([]int{0, 0, 3, 30}).Draw(rt, "retry")) * time.Millisecond
		o.kill = rapid.IntRange(0, 9).Draw(rt, "kill") == 0
	case k < 93:
		o.kind = vpWeight
		o.w = rapid.SampledFrom([]float64{0, 0.01, 0.5, 2, 3, 100}).Draw(rt, "weight")
	default:
		o.kind = vpAdvance
		o.delay = time.Duration(rapid.IntRange(1, 45).Draw(rt, "advance")) * time.Millisecond
	}
	return o
}

// vpRunner applies vpOps to one vp through its flag-on instance, keeping
// the runs it holds.
type vpRunner struct {
	p     *vp
	held  map[string]*runqueue.Run
	still bool // the caller moves the clock, not the dequeues
}

func (r *vpRunner) pickHeld(o vpOp) *runqueue.Run {
	ids := sortedKeys(r.held)
	if len(ids) == 0 {
		return nil
	}
	return r.held[ids[o.pick%len(ids)]]
}

// apply runs o and returns what a dequeue served, as key/id/attempt.
func (r *vpRunner) apply(t require.TestingT, o vpOp) []string {
	p := r.p
	switch o.kind {
	case vpEnqueue:
		p.enq(t, p.on, o.key, o.n, o.delay, o.prio)
	case vpDequeue:
		runs, err := p.on.Dequeue(p.ctx, vpEnv, p.queue, o.n)
		require.NoError(t, err)
		if !r.still {
			p.clock.Advance(time.Millisecond)
		}
		var out []string
		for _, run := range runs {
			r.held[run.ID] = run
			out = append(out, run.Key+"/"+run.ID+"/"+strconv.Itoa(run.Attempt))
		}
		return out
	case vpAck:
		if run := r.pickHeld(o); run != nil {
			p.ack(t, run)
			delete(r.held, run.ID)
		}
	case vpNack:
		if run := r.pickHeld(o); run != nil {
			_, err := p.on.Nack(p.ctx, run, &runqueue.NackOptions{RetryAt: p.clock.Now().Add(o.delay), DeadLetter: o.kill})
			require.NoError(t, err)
			delete(r.held, run.ID)
		}
	case vpWeight:
		if o.w == 0 {
			require.NoError(t, p.on.ClearWeight(p.ctx, vpEnv, p.queue, o.key))
		} else {
			p.setWeight(t, o.key, o.w)
		}
	case vpAdvance:
		if !r.still {
			p.clock.Advance(o.delay)
		}
	}
	return nil
}

// servable reports whether variant member vm can be served now by the
// flag-on instance: ready runs, below the key limit.
func (p *vp) servable(t require.TestingT, vm string, keyLimit int) bool {
	k, err := keys.DecodeVariantMember(vm)
	require.NoError(t, err)
	v := p.qk.Variant(k)
	n, err := p.c.ZCard(p.ctx, v.Ready()).Result()
	require.NoError(t, err)
	if n == 0 {
		return false
	}
	if keyLimit <= 0 {
		return true
	}
	in, err := p.on.KeyInflight(p.ctx, vpEnv, p.queue, k)
	require.NoError(t, err)
	return in < keyLimit
}

// schedulerState is what the flag-on scripts keep, with the parked tags at
// or below V left out (see TestVtimePropBatchInvariance).
func (p *vp) schedulerState(t require.TestingT) string {
	st := p.snap(t)
	var idle []vtime.Entry
	for _, e := range snapIdle(st) {
		if e.Score*vtime.Unit > float64(st.V) {
			idle = append(idle, e)
		}
	}
	return fmt.Sprintf("V %v cursor %d\ntags %v\nidle %v\nckIndex %v\ndelayIndex %v",
		st.V, st.Cursor, snapTags(st), idle, p.zset(t, p.qk.CkIndex()), p.zset(t, p.qk.DelayIndex()))
}

// TestVtimePropBatchInvariance: two queues (two prefixes) get the same
// random operations; then one serves dequeue(N), the other N x dequeue(1).
// Under the conditions of vtime/doc.go (at every serve the first
// 2*WindowMultiplier tags hold a servable variant; no discovery pending)
// and the one it omits (the first call of 1 promotes every due run, see
// vtime.TestBatchInvarianceWithDuePromotions), they serve the same runs in
// the same order and keep the same scheduler state.
func TestVtimePropBatchInvariance(t *testing.T) {
	t.Parallel()
	vpCheck(t, func(rt *rapid.T, pl *vpPool) {
		wm := rapid.IntRange(1, 3).Draw(rt, "wm")
		keyLimit := rapid.SampledFrom([]int{0, 0, 1, 2}).Draw(rt, "keyLimit")
		queueLimit := rapid.SampledFrom([]int{0, 0, 4}).Draw(rt, "queueLimit")
		cfg := vpConfig{WM: wm, Quantum: rapid.SampledFrom([]float64{1, 0.3}).Draw(rt, "quantum"),
			IdleMax: rapid.SampledFrom([]int{10000, 2}).Draw(rt, "idleMax"),
			Limits:  runqueue.Limits{Key: keyLimit, Queue: queueLimit}}
		// Both queues share the pool's clock: every operation goes to both
		// at the same time, then the clock moves.
		a := &vpRunner{p: pl.get(cfg), held: map[string]*runqueue.Run{}, still: true}
		b := &vpRunner{p: pl.get(cfg), held: map[string]*runqueue.Run{}, still: true}
		nkeys := rapid.IntRange(1, 6).Draw(rt, "keys")
		for i := rapid.IntRange(0, 20).Draw(rt, "prefix"); i > 0; i-- {
			o := drawVPOp(rt, nkeys)
			require.Equal(rt, a.apply(rt, o), b.apply(rt, o))
			if o.kind == vpAdvance {
				pl.clock.Advance(o.delay)
			}
			pl.clock.Advance(time.Millisecond)
		}
		n := rapid.IntRange(2, 8).Draw(rt, "N")
		now := b.p.clock.Now().UnixMilli()
		due, err := b.p.c.ZRangeByScoreWithScores(b.p.ctx, b.p.qk.DelayIndex(),
			&redis.ZRangeBy{Min: "-inf", Max: strconv.FormatInt(now, 10)}).Result()
		require.NoError(rt, err)
		// The first call of 1 promotes them all, as the call of N does: at
		// most ScanLimit (default 30) due variants (PromoteLimit, 100 runs
		// each, is never reached here).
		ok := len(due) <= 30
		batch := a.apply(rt, vpOp{kind: vpDequeue, n: n})
		var singles []string
		for i := 0; i < n; i++ {
			inflight, err := b.p.c.HLen(b.p.ctx, b.p.qk.Held()).Result()
			require.NoError(rt, err)
			if queueLimit == 0 || int(inflight) < queueLimit {
				tags := b.p.tags(rt)
				found := false
				for k := 0; k < len(tags) && k < 2*wm; k++ {
					found = found || b.p.servable(rt, tags[k].Member, keyLimit)
				}
				nIndex, err := b.p.c.ZCard(b.p.ctx, b.p.qk.CkIndex()).Result()
				require.NoError(rt, err)
				ok = ok && found && int(nIndex) == len(tags)
			}
			runs, err := b.p.on.Dequeue(b.p.ctx, vpEnv, b.p.queue, 1)
			require.NoError(rt, err)
			for _, run := range runs {
				b.held[run.ID] = run
				singles = append(singles, run.Key+"/"+run.ID+"/"+strconv.Itoa(run.Attempt))
			}
		}
		pl.clock.Advance(time.Millisecond)
		if !ok {
			return
		}
		require.Equal(rt, singles, batch, "dequeue(%d) vs %d x dequeue(1)", n, n)
		require.Equal(rt, b.p.schedulerState(rt), a.p.schedulerState(rt), "state after dequeue(%d) vs %d x dequeue(1)", n, n)
	})
}

// TestVtimePropReachability: variants written by a flag-off instance (work
// but no tag; more of them than the window), next to keys registered by
// flag-on enqueues, are each served by the flag-on instance within
// ceil(variants/maxCount)+2 calls.
func TestVtimePropReachability(t *testing.T) {
	t.Parallel()
	vpCheck(t, func(rt *rapid.T, pl *vpPool) {
		wm := rapid.IntRange(1, 3).Draw(rt, "wm")
		maxCount := rapid.IntRange(1, 5).Draw(rt, "maxCount")
		p := pl.get(vpConfig{WM: wm})
		tagged := rapid.IntRange(0, 2).Draw(rt, "tagged")
		for i := 0; i < tagged; i++ {
			p.enq(rt, p.on, fmt.Sprintf("t%d", i), 10, 0, 0)
		}
		// More than the window, and often more than the age-order scan (30).
		untagged := rapid.IntRange(maxCount*wm+1, 45).Draw(rt, "untagged")
		keyByKey := rapid.Bool().Draw(rt, "keyByKey")
		t0 := p.clock.Now().Add(-time.Hour)
		for i := 0; i < untagged; i++ {
			for j := rapid.IntRange(1, 2).Draw(rt, "runs"); j > 0; j-- {
				at := t0.Add(time.Duration(rapid.IntRange(0, 1000).Draw(rt, "age")) * time.Millisecond)
				if keyByKey {
					at = t0.Add(time.Duration(100*i+j) * time.Millisecond)
				}
				p.enqAt(rt, p.off, fmt.Sprintf("u%02d", i), at)
			}
		}
		variants := tagged + untagged
		bound := (variants+maxCount-1)/maxCount + 2
		first := map[string]int{}
		for call := 1; call <= bound; call++ {
			runs := p.deq(rt, p.on, maxCount)
			for _, r := range runs {
				if _, ok := first[r.Key]; !ok {
					first[r.Key] = call
				}
			}
			p.ack(rt, runs...)
			for i := 0; i < tagged; i++ {
				p.topUp(rt, fmt.Sprintf("t%d", i), 5)
			}
		}
		for i := 0; i < untagged; i++ {
			k := fmt.Sprintf("u%02d", i)
			_, ok := first[k]
			require.True(rt, ok, "%s not served within %d calls (%d variants, maxCount %d, window multiplier %d)",
				k, bound, variants, maxCount, wm)
		}
	})
}

// vpServable counts what a flag-on call may serve now: per variant, its
// ready runs plus its due delayed runs, up to its key limit.
func (p *vp) vpServable(t require.TestingT, keyLimit int) (servable, variants int) {
	now := strconv.FormatInt(p.clock.Now().UnixMilli(), 10)
	members := map[string]bool{}
	for _, e := range p.zset(t, p.qk.CkIndex()) {
		members[e.Member] = true
	}
	due, err := p.c.ZRangeByScore(p.ctx, p.qk.DelayIndex(), &redis.ZRangeBy{Min: "-inf", Max: now}).Result()
	require.NoError(t, err)
	for _, m := range due {
		members[m] = true
	}
	for m := range members {
		k, err := keys.DecodeVariantMember(m)
		require.NoError(t, err)
		v := p.qk.Variant(k)
		r, err := p.c.ZCard(p.ctx, v.Ready()).Result()
		require.NoError(t, err)
		d, err := p.c.ZCount(p.ctx, v.Delayed(), "-inf", now).Result()
		require.NoError(t, err)
		room := int(r + d)
		if keyLimit > 0 {
			in, err := p.c.HGet(p.ctx, p.qk.KeyInflight(), v.Member()).Int()
			if errors.Is(err, redis.Nil) {
				err = nil
			}
			require.NoError(t, err)
			room = min(room, keyLimit-in)
		}
		servable += max(room, 0)
	}
	return servable, len(members)
}

// TestVtimePropWorkConservation: when the age-order scan (ScanLimit,
// default max(30, 3*maxCount)) covers every variant with work, a flag-on
// call serves min(capacity, servable) runs.
func TestVtimePropWorkConservation(t *testing.T) {
	t.Parallel()
	vpCheck(t, func(rt *rapid.T, pl *vpPool) {
		wm := rapid.IntRange(1, 3).Draw(rt, "wm")
		keyLimit := rapid.SampledFrom([]int{0, 0, 1, 2}).Draw(rt, "keyLimit")
		queueLimit := rapid.SampledFrom([]int{0, 0, 4, 9}).Draw(rt, "queueLimit")
		p := pl.get(vpConfig{WM: wm, Limits: runqueue.Limits{Key: keyLimit, Queue: queueLimit}})
		r := &vpRunner{p: p, held: map[string]*runqueue.Run{}}
		nkeys := rapid.IntRange(1, 8).Draw(rt, "keys")
		for i := rapid.IntRange(1, 30).Draw(rt, "ops"); i > 0; i-- {
			o := drawVPOp(rt, nkeys)
			if o.kind != vpDequeue {
				r.apply(rt, o)
				continue
			}
			servable, variants := p.vpServable(rt, keyLimit)
			inflight, err := p.c.HLen(p.ctx, p.qk.Held()).Result()
			require.NoError(rt, err)
			capacity := o.n
			if queueLimit > 0 {
				capacity = max(0, min(capacity, queueLimit-int(inflight)))
			}
			got := len(r.apply(rt, o))
			if variants <= max(30, 3*o.n) { // the age-order scan covers every variant
				require.Equal(rt, min(capacity, servable), got, "maxCount %d, capacity %d, servable %d", o.n, capacity, servable)
			}
		}
	})
}

// TestVtimePropDrainNoSlower: the same backlog (random keys, sizes, ages
// and priorities, runs held for a few calls; no per-key limit) is drained by
// a flag-on and by a flag-off instance on two prefixes; flag on never
// needs more calls.
func TestVtimePropDrainNoSlower(t *testing.T) {
	t.Parallel()
	vpCheck(t, func(rt *rapid.T, pl *vpPool) {
		maxCount := rapid.IntRange(1, 5).Draw(rt, "maxCount")
		// No per-key limit: with one, the fair order cannot promise to drain
		// as fast as age order. Fairness serves the key with the longest
		// backlog later, and its runs, a few per call at most, then become
		// the critical path (A with 3 runs and B, C, D with 1, limit 1, held
		// one call: age order drains in 6 calls, the fair order in 7; with
		// maxCount 2 and acks after each call, a 6-run key next to four
		// 1-2-run keys: 6 calls against 8). vtime/doc.go states it.
		cfg := vpConfig{Limits: runqueue.Limits{
			Queue: rapid.SampledFrom([]int{0, 0, 3}).Draw(rt, "queueLimit"),
		}}
		hold := rapid.IntRange(0, 2).Draw(rt, "hold")
		on, off := pl.get(cfg), pl.get(cfg)
		t0 := on.clock.Now().Add(-time.Hour)
		total := 0
		for k := rapid.IntRange(1, 6).Draw(rt, "keys"); k > 0; k-- {
			for n := rapid.IntRange(1, 8).Draw(rt, "runs"); n > 0; n-- {
				at := t0.Add(time.Duration(rapid.IntRange(0, 100000).Draw(rt, "age")) * time.Millisecond)
				on.enqAt(rt, on.on, vpKey(k), at)
				off.enqAt(rt, off.off, vpKey(k), at)
				total++
			}
		}
		drain := func(p *vp, q *runqueue.Queue) int {
			var held [][]*runqueue.Run
			served := 0
			for call := 1; call <= 10*total+10; call++ {
				runs := p.deq(rt, q, maxCount)
				served += len(runs)
				held = append(held, runs)
				if len(held) > hold {
					p.ack(rt, held[0]...)
					held = held[1:]
				}
				if served == total {
					return call
				}
			}
			rt.Fatalf("drain did not finish")
			return 0
		}
		callsOff := drain(off, off.off)
		callsOn := drain(on, on.on)
		require.LessOrEqual(rt, callsOn, callsOff, "flag on drained %d runs in %d calls, flag off in %d", total, callsOn, callsOff)
	})
}

// TestVtimePropExactlyOneHolder: two instances (both flag on, or one flag
// on and one flag off) dequeue concurrently from one queue, each with two
// workers that ack or nack what they get; no run is ever held twice at
// once and every run ends acked exactly once.
func TestVtimePropExactlyOneHolder(t *testing.T) {
	t.Parallel()
	for _, pair := range []struct {
		name     string
		secondOn bool
	}{{"OnOn", true}, {"OnOff", false}} {
		for _, b := range backends[:2] {
			t.Run(pair.name+"/"+b.name, func(t *testing.T) {
				t.Parallel()
				vpOneHolder(t, b.client(t), pair.secondOn)
			})
		}
	}
}

func vpOneHolder(t *testing.T, c redis.UniversalClient, secondOn bool) {
	const total, nkeys = 300, 12
	p := newVPPool(t, c).get(vpConfig{WM: 1, MaxAttempts: -1, Limits: runqueue.Limits{Key: 2}})
	second := p.off
	if secondOn {
		cfgOn := p.on.Config()
		var err error
		second, err = runqueue.New(p.ctx, otherClient(t, c), &cfgOn)
		require.NoError(t, err)
		defer second.Close()
	}
	for i := 0; i < total; i++ {
		p.enq(t, p.on, vpKey(i%nkeys), 1, 0, i%3)
	}
	var mu sync.Mutex
	holding := map[string]bool{}
	acked := map[string]int{}
	var failures []string
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(failures) < 10 {
			failures = append(failures, fmt.Sprintf(format, args...))
		}
	}
	done := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(acked) == total
	}
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		q := p.on
		if w%2 == 1 {
			q = second
		}
		wg.Add(1)
		go func(w int, q *runqueue.Queue) {
			defer wg.Done()
			for i := 0; i < 20000 && !done(); i++ {
				runs, err := q.Dequeue(p.ctx, vpEnv, p.queue, 1+(i+w)%4)
				if err != nil {
					fail("worker %d: dequeue: %v", w, err)
					return
				}
				for j, r := range runs {
					mu.Lock()
					if holding[r.ID] {
						failures = append(failures, fmt.Sprintf("worker %d got %s while another holds it", w, r.ID))
					}
					holding[r.ID] = true
					mu.Unlock()
					nack := (i+j+w)%5 == 0
					// Released before the call: once the script runs, the run
					// may be dequeued again at once.
					mu.Lock()
					delete(holding, r.ID)
					mu.Unlock()
					if nack {
						if _, err := q.Nack(p.ctx, r, &runqueue.NackOptions{RetryAt: p.clock.Now()}); err != nil {
							fail("worker %d: nack %s: %v", w, r.ID, err)
						}
						continue
					}
					if err := q.Ack(p.ctx, r); err != nil {
						fail("worker %d: ack %s: %v", w, r.ID, err)
						continue
					}
					mu.Lock()
					acked[r.ID]++
					mu.Unlock()
				}
			}
		}(w, q)
	}
	wg.Wait()
	require.Empty(t, failures)
	require.Len(t, acked, total)
	for id, n := range acked {
		require.Equal(t, 1, n, "%s acked %d times", id, n)
	}
	st, err := p.on.QueueStats(p.ctx, vpEnv, p.queue)
	require.NoError(t, err)
	require.Equal(t, runqueue.Stats{}, st)
}

// vpShadow is the flag-off reference: the queued runs with their ready
// scores, to predict age-order serves.
type vpShadow struct {
	step   time.Duration
	queued map[string]*vpShadowRun // id -> queued run
}

type vpShadowRun struct {
	key  string
	at   int64
	prio int
}

// expect lists, in serve order, the runs a flag-off dequeue(n) takes at
// now: lowest ready score, then variant member, then encoded id, skipping
// variants at their key limit.
func (s *vpShadow) expect(now int64, n, keyLimit int, inflight map[string]int) []string {
	type cand struct {
		id, vm, enc string
		rs          int64
	}
	var cs []cand
	for id, r := range s.queued {
		if r.at <= now {
			cs = append(cs, cand{id, keys.VariantMember(r.key), keys.Segment(id), r.at - int64(r.prio)*s.step.Milliseconds()})
		}
	}
	sort.Slice(cs, func(i, j int) bool {
		a, b := cs[i], cs[j]
		if a.rs != b.rs {
			return a.rs < b.rs
		}
		if a.vm != b.vm {
			return a.vm < b.vm
		}
		return a.enc < b.enc
	})
	taken := map[string]int{}
	var out []string
	for _, c := range cs {
		if len(out) == n {
			break
		}
		if keyLimit > 0 && inflight[c.vm]+taken[c.vm] >= keyLimit {
			continue
		}
		taken[c.vm]++
		out = append(out, c.id)
	}
	return out
}

// vtimeKeysOf lists the keys under the bundle's prefix that belong to the
// fair scheduler.
func vtimeKeysOf(t testing.TB, b *testBundle) []string {
	var out []string
	for _, k := range b.keysUnder(t) {
		if strings.Contains(k, "ckVtime") || strings.HasSuffix(k, ":weights") {
			out = append(out, k)
		}
	}
	return out
}

// TestVtimePropFlagOffNeverWritesVtime: a random flag-off workload
// (enqueue, dequeue, ack, nack, dead letter, redrive, lease recovery, TTL
// expiry, clock steps) never creates a key of the fair scheduler, and every
// dequeue serves in age order (ready score, then variant, then id).
func TestVtimePropFlagOffNeverWritesVtime(t *testing.T) {
	t.Parallel()
	for _, b := range backends[:2] {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			c := b.client(t)
			rapid.Check(t, func(rt *rapid.T) {
				keyLimit := rapid.SampledFrom([]int{0, 0, 1, 2}).Draw(rt, "keyLimit")
				// A key space of its own: lease recovery and TTL sweeps work
				// per shard.
				p := newVPPool(t, c).get(vpConfig{MaxAttempts: 3, Limits: runqueue.Limits{Key: keyLimit}})
				bundle := p.bundle()
				vtimeKeys := []string{p.qk.CkVtime(), p.qk.CkVtimeState(), p.qk.Weights()}
				sh := &vpShadow{step: 30 * time.Second, queued: map[string]*vpShadowRun{}}
				held := map[string]*runqueue.Run{}
				ttl := map[string]int64{}
				dead := map[string]string{}
				nkeys := rapid.IntRange(1, 6).Draw(rt, "keys")
				for i := rapid.IntRange(1, 30).Draw(rt, "ops"); i > 0; i-- {
					now := p.clock.Now().UnixMilli()
					k := rapid.IntRange(0, 99).Draw(rt, "op")
					key := vpKey(rapid.IntRange(0, nkeys-1).Draw(rt, "key"))
					pick := func(ids []string) string { return ids[rapid.IntRange(0, len(ids)-1).Draw(rt, "pick")] }
					switch {
					case k < 35:
						prio := rapid.SampledFrom([]int{0, 0, 1, 9}).Draw(rt, "prio")
						delay := time.Duration(rapid.SampledFrom([]int{0, 0, 5, 40}).Draw(rt, "delay")) * time.Second
						life := time.Duration(rapid.SampledFrom([]int{0, 0, 20}).Draw(rt, "ttl")) * time.Second
						p.next++
						id := "r" + strconv.Itoa(p.next)
						_, err := p.off.Enqueue(p.ctx, runqueue.EnqueueParams{Env: vpEnv, Queue: p.queue, Key: key, ID: id,
							Priority: prio, Delay: delay, TTL: life})
						require.NoError(rt, err)
						sh.queued[id] = &vpShadowRun{key: key, at: now + delay.Milliseconds(), prio: prio}
						if life > 0 {
							ttl[id] = now + life.Milliseconds()
						}
					case k < 60:
						n := rapid.IntRange(1, 6).Draw(rt, "maxCount")
						inflight := map[string]int{}
						for _, r := range held {
							inflight[keys.VariantMember(r.Key)]++
						}
						want := sh.expect(now, n, keyLimit, inflight)
						runs := p.deq(rt, p.off, n)
						var got []string
						for _, r := range runs {
							got = append(got, r.ID)
							held[r.ID] = r
							delete(sh.queued, r.ID)
							delete(ttl, r.ID)
						}
						require.Equal(rt, want, got, "flag-off dequeue(%d) in age order", n)
					case k < 70:
						if len(held) > 0 {
							id := pick(sortedKeys(held))
							require.NoError(rt, p.off.Ack(p.ctx, held[id]))
							delete(held, id)
						}
					case k < 80:
						if len(held) > 0 {
							id := pick(sortedKeys(held))
							r := held[id]
							retry := p.clock.Now().Add(time.Duration(rapid.SampledFrom([]int{0, 3, 30}).Draw(rt, "retry")) * time.Second)
							res, err := p.off.Nack(p.ctx, r, &runqueue.NackOptions{RetryAt: retry,
								DeadLetter: rapid.IntRange(0, 4).Draw(rt, "kill") == 0})
							require.NoError(rt, err)
							delete(held, id)
							if res.Requeued {
								sh.queued[id] = &vpShadowRun{key: r.Key, at: retry.UnixMilli(), prio: shadowPrio(rt, p, id)}
							} else {
								dead[id] = r.Key
							}
						}
					case k < 85:
						if len(dead) > 0 {
							id := pick(sortedKeys(dead))
							require.NoError(rt, p.off.Redrive(p.ctx, vpEnv, p.queue, dead[id], id))
							sh.queued[id] = &vpShadowRun{key: dead[id], at: now, prio: shadowPrio(rt, p, id)}
							delete(dead, id)
						}
					case k < 90:
						p.clock.Advance(time.Minute + time.Second) // every lease passes
						now = p.clock.Now().UnixMilli()
						n, err := p.off.RecoverLeases(p.ctx, p.off.ShardOf(vpEnv), 1000)
						require.NoError(rt, err)
						require.Equal(rt, len(held), n)
						for id, r := range held {
							if st, err := p.off.DeadLetter(p.ctx, vpEnv, p.queue, r.Key, id); err == nil && st.ID == id {
								dead[id] = r.Key
							} else {
								sh.queued[id] = &vpShadowRun{key: r.Key, at: now, prio: shadowPrio(rt, p, id)}
							}
						}
						held = map[string]*runqueue.Run{}
					case k < 95:
						n, err := p.off.ExpireTTL(p.ctx, p.off.ShardOf(vpEnv), 1000)
						require.NoError(rt, err)
						expired := 0
						for id, at := range ttl {
							if _, queued := sh.queued[id]; queued && at <= now {
								delete(sh.queued, id)
								delete(ttl, id)
								expired++
							}
						}
						require.Equal(rt, expired, n)
					default:
						p.clock.Advance(time.Duration(rapid.IntRange(1, 45).Draw(rt, "advance")) * time.Second)
					}
					n, err := c.Exists(p.ctx, vtimeKeys...).Result()
					require.NoError(rt, err)
					require.Zero(rt, n, "a flag-off instance wrote a vtime key")
				}
				if b.name == "Mini" {
					// The whole key space (a private miniredis: a SCAN is cheap).
					require.Empty(rt, vtimeKeysOf(t, bundle), "a flag-off instance wrote a vtime key")
				}
			})
		})
	}
}

// shadowPrio reads a run's priority back (nack and redrive keep it).
func shadowPrio(t require.TestingT, p *vp, id string) int {
	_, prio, _, err := p.on.RecordOf(p.ctx, vpEnv, p.queue, id)
	require.NoError(t, err)
	return prio
}

// TestVtimeIdleCapOnExpiry: the idle set is rank-capped only by dequeue
// calls that park; variants drained by TTL expiry park without any cap, so
// with IdleMaxEntries 1 three expiry sweeps leave three entries, more than
// the cap plus what one call parked.
func TestVtimeIdleCapOnExpiry(t *testing.T) {
	t.Parallel()
	rolloutBackends(t, func(t *testing.T, c redis.UniversalClient, _ *miniredis.Miniredis) {
		p := newVPPool(t, c).get(vpConfig{IdleMax: 1})
		for i, k := range []string{"a", "b", "c"} {
			p.enq(t, p.on, k, 1, 0, 0)
			_, err := p.on.Enqueue(p.ctx, runqueue.EnqueueParams{Env: vpEnv, Queue: p.queue, Key: k, ID: "zz-" + k, // sorts after r..., so the dequeue below leaves it
				TTL: time.Duration(10*(i+1)) * time.Second})
			require.NoError(t, err)
		}
		require.Equal(t, []string{"a", "b", "c"}, byKeys(p.deq(t, p.on, 3))) // tags 1, V 0; each keeps its TTL run
		for i := 0; i < 3; i++ {
			p.clock.Advance(10 * time.Second)
			n, err := p.on.ExpireTTL(p.ctx, p.on.ShardOf(vpEnv), 100)
			require.NoError(t, err)
			require.Equal(t, 1, n) // drains one variant, which parks at 1 > V
			idle := p.idle(t)
			require.LessOrEqual(t, len(idle), 1+1, "after sweep %d: idle %v, cap 1, one entry parked by the call", i+1, idle)
		}
	})
}

// TestVtimePropMemory: over random flag-on workloads (the differential
// harness: enqueue, dequeue, ack, nack, lease recovery, TTL expiry,
// redrive, weights, clock steps), after every step: ckVtime holds exactly
// the variants with ready runs; the idle set holds at most IdleMaxEntries
// plus the entries parked by the last call that parked any; every vtime key
// but the weights hash has a TTL.
func TestVtimePropMemory(t *testing.T) {
	t.Parallel()
	for _, b := range backends[:2] {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			c := b.client(t)
			rapid.Check(t, func(rt *rapid.T) {
				d := newDiff(t, rt, c)
				defer d.q.Close()
				idleMax := d.q.Config().IdleMaxEntries
				members := func(key string) []string {
					m, err := c.ZRange(d.ctx, key, 0, -1).Result()
					require.NoError(rt, err)
					sort.Strings(m)
					return m
				}
				lastParked := 0
				for i := rapid.IntRange(5, 25).Draw(rt, "steps"); i > 0; i-- {
					before := map[string]float64{}
					for _, e := range d.idle(rt) {
						before[e.Member] = e.Score
					}
					op := rapid.IntRange(0, 99).Draw(rt, "op")
					switch {
					case op < 35:
						d.enqueue(rt)
					case op < 60:
						d.dequeue(rt, rapid.IntRange(1, 6).Draw(rt, "maxCount"))
					case op < 70:
						d.ack(rt)
					case op < 78:
						d.nack(rt)
					case op < 86:
						d.clock.Advance(time.Duration(rapid.IntRange(1, 45).Draw(rt, "advance")) * time.Second)
					case op < 89:
						d.recoverLeases(rt)
					case op < 95:
						d.expire(rt)
					default:
						d.redrive(rt)
					}
					reg := []string{}
					for _, e := range d.m.Registered() {
						reg = append(reg, e.Member)
					}
					sort.Strings(reg)
					require.Equal(rt, members(d.qk.CkIndex()), reg, "registrations vs variants with ready runs")
					idle := d.idle(rt)
					parked := 0
					for _, e := range idle {
						if s, ok := before[e.Member]; !ok || s != e.Score {
							parked++
						}
					}
					if parked > 0 {
						lastParked = parked
					}
					require.LessOrEqual(rt, len(idle), idleMax+lastParked,
						"idle set %d entries, cap %d, parked by the last call that parked %d", len(idle), idleMax, lastParked)
					for _, k := range []string{d.qk.CkVtime(), d.qk.CkVtimeState()} {
						ttl, err := c.PTTL(d.ctx, k).Result()
						require.NoError(rt, err)
						require.NotEqual(rt, time.Duration(-1), ttl, "%s has no TTL", k)
					}
				}
			})
		})
	}
}

func (d *diff) zsetEntries(t require.TestingT, key string) []vtime.Entry {
	z, err := d.c.ZRangeWithScores(d.ctx, key, 0, -1).Result()
	require.NoError(t, err)
	var out []vtime.Entry
	for _, e := range z {
		out = append(out, vtime.Entry{Member: e.Member.(string), Score: e.Score})
	}
	return out
}

func (d *diff) idle(t require.TestingT) []vtime.Entry {
	s, _, err := d.q.SchedulerSnapshot(d.ctx, d.env, d.queue)
	require.NoError(t, err)
	return snapIdle(s)
}
