package runqueue_test

import (
	"context"
	"fmt"
	"maps"
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
	"github.com/runqueue/runqueue/vtime/vtimetest"
)

// The guarantees of docs/design.md section 7 as properties of the Lua, on
// miniredis and on a real Redis. Those that hold for the model too are
// written once in package vtimetest and run here through vpDriver; the
// ones tied to Redis (two instances racing, flag-off key writes, key
// TTLs, the drain against the flag-off age order) stay here.

const (
	vpEnv = "env:vp"
	vpEps = 1e-9
)

// vpConfig is what a property varies between its checks.
type vpConfig struct {
	WM          int
	Quantum     float64
	IdleMax     int
	MaxAttempts int
	ScanLimit   int
	// PromoteLimit 0 is runqueue's default.
	PromoteLimit int
	Limits       runqueue.Limits
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
			ScanLimit: cfg.ScanLimit, PromoteLimit: cfg.PromoteLimit,
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
func (p *vp) tags(t require.TestingT) []vtime.Entry { return vtimetest.Tags(p.snap(t)) }

// idle lists the parked tags (serves at weight 1) in ZSET order.
func (p *vp) idle(t require.TestingT) []vtime.Entry { return vtimetest.Idle(p.snap(t)) }

func (p *vp) v(t require.TestingT) float64 { return vtimetest.V(p.snap(t)) }

func (p *vp) setWeight(t require.TestingT, key string, w float64) {
	require.NoError(t, p.on.SetWeight(p.ctx, vpEnv, p.queue, key, w))
}

// vpCheck runs prop as a rapid check on miniredis and on a real Redis,
// with a pool of queues per backend.
func vpCheck(t *testing.T, prop func(rt *rapid.T, pl *vpPool)) {
	for _, b := range backends[:2] {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			pl := newVPPool(t, b.Client(t))
			rapid.Check(t, func(rt *rapid.T) { prop(rt, pl) })
		})
	}
}

func vpKey(i int) string { return fmt.Sprintf("k%02d", i) }

func byKeys(runs []*runqueue.Run) []string {
	out := make([]string, len(runs))
	for i, r := range runs {
		out[i] = r.Key
	}
	return out
}

// The properties of package vtimetest, on the Lua (vtime_driver_test.go
// is the Driver); vtime/shared_props_test.go runs the same functions on
// the model.

// TestVtimePropNoDebtWait: vtimetest.NoDebtWaitBound (a tagged key waits
// at most its bound) and NoDebtWaitDiscovered (a variant discovered at V
// waits at most one serve of each other key).
func TestVtimePropNoDebtWait(t *testing.T) {
	t.Parallel()
	t.Run("Bound", func(t *testing.T) { t.Parallel(); vpProp(t, vtimetest.NoDebtWaitBound) })
	t.Run("Discovered", func(t *testing.T) { t.Parallel(); vpProp(t, vtimetest.NoDebtWaitDiscovered) })
}

// TestVtimePropLagBound: vtimetest.LagBound.
func TestVtimePropLagBound(t *testing.T) {
	t.Parallel()
	vpProp(t, vtimetest.LagBound)
}

// TestVtimePropNoCredit: vtimetest.NoCredit, a key back from idle, from
// its key limit or from a delay gets no burst.
func TestVtimePropNoCredit(t *testing.T) {
	t.Parallel()
	for _, mode := range vtimetest.NoCreditModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			vpProp(t, vtimetest.NoCredit(mode))
		})
	}
}

// TestVtimePropBatchInvariance: vtimetest.BatchInvarianceObserved, on two
// queues of one pool (one clock).
func TestVtimePropBatchInvariance(t *testing.T) {
	t.Parallel()
	vpProp(t, vtimetest.BatchInvarianceObserved)
}

// TestVtimePropReachability: vtimetest.ReachabilityServed (untagged
// variants served within ceil(variants/maxCount)+2 calls) and
// ReachabilityDiscovery (registered within the discovery bound).
func TestVtimePropReachability(t *testing.T) {
	t.Parallel()
	t.Run("Served", func(t *testing.T) { t.Parallel(); vpProp(t, vtimetest.ReachabilityServed) })
	t.Run("Discovery", func(t *testing.T) {
		t.Parallel()
		vpPropDone(t, vtimetest.ReachabilityDiscovery)
	})
}

// TestVtimePropWorkConservation: vtimetest.WorkConservation.
func TestVtimePropWorkConservation(t *testing.T) {
	t.Parallel()
	vpProp(t, vtimetest.WorkConservation)
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
			t.Run(pair.name+"/"+b.Name, func(t *testing.T) {
				t.Parallel()
				vpOneHolder(t, b.Client(t), pair.secondOn)
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

// dequeueTTL is a flag-off Dequeue(n) at now: the runs expect gives, in
// age order, where each past its TTL (ttl: the deadlines of the runs never
// delivered) that a serve comes to is swept (deleted, not delivered, not
// counted for n or its key's limit), as runqueue's dequeue does while no
// more than vtime.TTLLook are due (the workload queues fewer). It returns
// the runs delivered and those expired, both out of s.queued.
func (s *vpShadow) dequeueTTL(now int64, n, keyLimit int, inflight map[string]int,
	ttl map[string]int64) (delivered, expired []string) {
	inflight = maps.Clone(inflight)
	for _, id := range s.expect(now, len(s.queued), 0, nil) {
		if len(delivered) == n {
			break
		}
		r := s.queued[id]
		vm := keys.VariantMember(r.key)
		if keyLimit > 0 && inflight[vm] >= keyLimit {
			continue
		}
		delete(s.queued, id)
		if d, ok := ttl[id]; ok && d <= now {
			expired = append(expired, id)
			continue
		}
		delivered = append(delivered, id)
		inflight[vm]++
	}
	return delivered, expired
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
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			c := b.Client(t)
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
						want, gone := sh.dequeueTTL(now, n, keyLimit, inflight, ttl)
						for _, id := range gone {
							delete(ttl, id)
						}
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
				if b.Name == "Mini" {
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
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			c := b.Client(t)
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

func (d *diff) idle(t require.TestingT) []vtime.Entry {
	s, _, err := d.q.SchedulerSnapshot(d.ctx, d.env, d.queue)
	require.NoError(t, err)
	return vtimetest.Idle(s)
}
