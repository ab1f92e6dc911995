package runqueue_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/runqueue/runqueue/internal/fairness"
	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/internal/schedfmt"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
	"github.com/runqueue/runqueue/vtime"
)

// Tests from the second adversarial review of the fair scheduler (flag
// on); each failed on the version it reviewed and checks the fix. The harness
// below drives one base queue through a flag-on and a flag-off instance on
// the same Redis; before each flag-on call it rebuilds the vtime model
// from what Redis holds (scheduler state, every queued run, the in-flight
// counts), runs the same call on both, and requires the same serves and
// the same scheduler state after. Building the state in Redis (flag-off
// drains, thousands of stale tags) needs no model support for it.

const r2Env, r2Queue = "env", "q"

type r2T interface {
	require.TestingT
	Helper()
	Logf(string, ...any)
}

type r2 struct {
	t       r2T
	ctx     context.Context
	c       redis.UniversalClient
	clock   *fakeClock
	on, off *runqueue.Queue
	qk      keys.Queue
	lim     *runqueue.Limits
	mcfg    vtime.Config
	next    int
	space   keys.Space
	expired int
}

type r2Config struct {
	Scan, WM int
	Limits   runqueue.Limits
}

func newR2(t testing.TB, c redis.UniversalClient, rc r2Config) *r2 {
	ctx := context.Background()
	clock := newFakeClock()
	prefix := redistest.Prefix(t)
	lim := rc.Limits
	h := &r2{t: t, ctx: ctx, c: c, clock: clock, lim: &lim}
	for _, on := range []bool{true, false} {
		scan := rc.Scan
		if !on {
			scan = 0 // the flag-off instance drains stale keys 1000 a call
		}
		cfg := &runqueue.Config{Prefix: prefix, Clock: clock, VtimeScheduling: on, ScanLimit: scan,
			WindowMultiplier: rc.WM, LeaseDuration: time.Hour,
			LimitsFor: func(string, string) runqueue.Limits { return *h.lim }}
		q, err := runqueue.New(ctx, c, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = q.Close() })
		if on {
			h.on = q
		} else {
			h.off = q
		}
	}
	space, err := keys.NewSpace(prefix, h.on.Shards())
	require.NoError(t, err)
	h.qk = space.Env(r2Env).Queue(r2Queue)
	h.space = space
	h.mcfg = vtime.Config{WindowMultiplier: rc.WM, ScanLimit: rc.Scan}
	return h
}

func (h *r2) now() int64 { return h.clock.Now().UnixMilli() }

// enq queues one run of key through q (priority prio, available at now+delay).
func (h *r2) enq(q *runqueue.Queue, key string, prio int, delay time.Duration) string {
	h.t.Helper()
	h.next++
	id := "r" + strconv.Itoa(h.next)
	ok, err := q.Enqueue(h.ctx, runqueue.EnqueueParams{Env: r2Env, Queue: r2Queue, Key: key, ID: id,
		Payload: []byte(id), Priority: prio, Delay: delay})
	require.NoError(h.t, err)
	require.True(h.t, ok)
	return id
}

// enqMany queues one run for each key in one EnqueueMany call through q.
func (h *r2) enqMany(q *runqueue.Queue, ks []string, prio int) []string {
	h.t.Helper()
	var ps []runqueue.EnqueueParams
	var ids []string
	for _, k := range ks {
		h.next++
		id := "r" + strconv.Itoa(h.next)
		ids = append(ids, id)
		ps = append(ps, runqueue.EnqueueParams{Env: r2Env, Queue: r2Queue, Key: k, ID: id, Payload: []byte(id), Priority: prio})
	}
	for i := 0; i < len(ps); i += 1000 {
		res, err := q.EnqueueMany(h.ctx, ps[i:min(i+1000, len(ps))])
		require.NoError(h.t, err)
		for _, r := range res {
			require.NoError(h.t, r.Err)
		}
	}
	return ids
}

// model rebuilds the vtime model from what Redis holds now.
func (h *r2) model() *vtime.Model {
	t := h.t
	t.Helper()
	snap, _, err := h.on.SchedulerSnapshot(h.ctx, r2Env, r2Queue)
	require.NoError(t, err)
	vms := map[string]bool{}
	for _, k := range []string{h.qk.CkIndex(), h.qk.DelayIndex()} {
		ms, err := h.c.ZRange(h.ctx, k, 0, -1).Result()
		require.NoError(t, err)
		for _, m := range ms {
			vms[m] = true
		}
	}
	for vm := range vms {
		key, err := keys.DecodeVariantMember(vm)
		require.NoError(t, err)
		v := h.qk.Variant(key)
		for i, set := range []string{v.Ready(), v.Delayed()} {
			ids, err := h.c.ZRange(h.ctx, set, 0, -1).Result()
			require.NoError(t, err)
			if len(ids) == 0 {
				continue
			}
			recs, err := h.c.HMGet(h.ctx, h.qk.Runs(), ids...).Result()
			require.NoError(t, err)
			for j, raw := range recs {
				f := strings.SplitN(raw.(string), "|", 7)
				att, _ := strconv.Atoi(f[1])
				pr, _ := strconv.Atoi(f[2])
				at, _ := strconv.ParseInt(f[3], 10, 64)
				snap.Runs = append(snap.Runs, vtime.SnapshotRun{ID: ids[j], Key: key, Priority: pr, At: at,
					Attempt: att, Delayed: i == 1})
			}
		}
	}
	kin, err := h.c.HGetAll(h.ctx, h.qk.KeyInflight()).Result()
	require.NoError(t, err)
	snap.InFlight = map[string]int{}
	for vm, n := range kin {
		if vm == "~" { // the wide mark (lua/lib/held.lua), no variant
			continue
		}
		snap.InFlight[vm], _ = strconv.Atoi(n)
	}
	cfg := h.mcfg
	cfg.Limits = vtime.Limits{Env: h.lim.Env, Queue: h.lim.Queue, Key: h.lim.Key}
	return vtime.Restore(cfg, snap)
}

// deq runs one flag-on dequeue(n) on Redis and on the model rebuilt from
// Redis, and requires the same serves and the same state after. It
// returns the runs and the served keys.
func (h *r2) deq(n int, step string) ([]*runqueue.Run, []string) {
	t := h.t
	t.Helper()
	m := h.model()
	want := m.Dequeue(n, h.now())
	runs, err := h.on.Dequeue(h.ctx, r2Env, r2Queue, n)
	require.NoError(t, err)
	var got, exp []string
	for _, r := range runs {
		got = append(got, r.Key+"/"+r.ID)
	}
	for _, s := range want {
		id, err := keys.DecodeSegment(s.ID)
		require.NoError(t, err)
		exp = append(exp, s.Key+"/"+id)
	}
	require.Equal(t, exp, got, "%s: dequeue(%d) served (model vs Lua)", step, n)
	after, _, err := h.on.SchedulerSnapshot(h.ctx, r2Env, r2Queue)
	require.NoError(t, err)
	requireSameScheduler(t, m.Snapshot(), after, step)
	h.checkLane(step)
	var ks []string
	for _, r := range runs {
		ks = append(ks, r.Key)
	}
	return runs, ks
}

// checkLane requires ckVtime's lane region to hold exactly the variants
// the state hash marks waiting ("w"), and every competing or gated member
// to belong to a registration with that seq code.
func (h *r2) checkLane(step string) {
	t := h.t
	t.Helper()
	snap, exists, err := h.on.SchedulerSnapshot(h.ctx, r2Env, r2Queue)
	require.NoError(t, err)
	if !exists {
		return
	}
	z, err := h.c.ZRangeWithScores(h.ctx, h.qk.CkVtime(), 0, -1).Result()
	require.NoError(t, err)
	var lane, waiting []string
	for _, e := range z {
		m := e.Member.(string)
		switch s := e.Score; {
		case s < -(1 << 52):
		case s < -(1 << 51):
		case s < 0:
			lane = append(lane, m)
		case m == schedfmt.SentinelMember && s == 0:
		case m == schedfmt.WideMember && s == schedfmt.WideScore:
		default:
			require.Greater(t, len(m), 15, "%s: member %q", step, m)
			vm := m[15:]
			r, ok := snap.Reg[vm]
			require.True(t, ok, "%s: ckVtime holds %q (score %v) without a registration", step, m, s)
			require.Equal(t, fmt.Sprintf("%015d", r.Seq), m[:15], "%s: %q's seq code", step, vm)
		}
	}
	for vm, r := range snap.Reg {
		if r.Waiting {
			waiting = append(waiting, vm)
		}
	}
	sort.Slice(waiting, func(i, j int) bool { return snap.Reg[waiting[i]].Seq < snap.Reg[waiting[j]].Seq })
	if lane == nil {
		lane = []string{}
	}
	if waiting == nil {
		waiting = []string{}
	}
	require.Equal(t, waiting, lane, "%s: the lane region vs the waiting registrations", step)
	hs, err := h.c.HGetAll(h.ctx, h.qk.CkVtimeState()).Result()
	require.NoError(t, err)
	lh := ""
	if len(waiting) > 0 {
		lh = waiting[0]
	}
	require.Equal(t, lh, hs["lh"], "%s: lh", step)
	gated := 0
	for _, r := range snap.Reg {
		if r.Gated {
			gated++
		}
	}
	ng, _ := strconv.Atoi(hs["ng"])
	require.Equal(t, gated, ng, "%s: ng", step)
	nw, err := h.c.HLen(h.ctx, h.qk.Weights()).Result()
	require.NoError(t, err)
	if hs["nw"] != "-1" {
		require.Equal(t, strconv.FormatInt(nw, 10), hs["nw"], "%s: nw", step)
	}
}

// stale registers n keys flag on (priority 9: the oldest work) and drains
// them flag off, leaving n stale tags at V.
func (h *r2) stale(prefix string, n int) {
	h.t.Helper()
	var ks []string
	for i := 0; i < n; i++ {
		ks = append(ks, fmt.Sprintf("%s%05d", prefix, i))
	}
	h.enqMany(h.on, ks, 9)
	got := 0
	for got < n {
		runs, err := h.off.Dequeue(h.ctx, r2Env, r2Queue, min(1000, n-got))
		require.NoError(h.t, err)
		require.NotEmpty(h.t, runs)
		for _, r := range runs {
			require.True(h.t, strings.HasPrefix(r.Key, prefix), "flag-off served %q", r.Key)
		}
		got += len(runs)
	}
}

// r2Real runs fn on a real Redis (and miniredis when mini).
func r2Backends(t *testing.T, mini bool, fn func(t *testing.T, c redis.UniversalClient)) {
	bs := backends[1:2]
	if mini {
		bs = backends[:2]
	}
	for _, b := range bs {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			fn(t, b.Client(t))
		})
	}
}

// TestAgeHeadLaneLua: the Lua of the age head meeting keys queued in the
// lane (the lane's head joins) and of the lane's hand-off by rank, against
// the model, after pass 1 spent its read budget on stale tags.
func TestAgeHeadLaneLua(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	for _, scan := range []int{1, 2, 3, 5} {
		for _, n := range []int{1, 2, 3, 5} {
			t.Run(fmt.Sprintf("scan%d/n%d", scan, n), func(t *testing.T) {
				t.Parallel()
				r2Backends(t, false, func(t *testing.T, c redis.UniversalClient) {
					h := newR2(t, c, r2Config{Scan: scan, WM: 1})
					for i := 0; i < 3; i++ {
						h.enq(h.on, "a", 0, 0)
					}
					h.stale("s", 1100)
					_, ks := h.deq(1, "first")
					require.Equal(t, []string{"a"}, ks)
					h.enq(h.on, "h", 1, 0)
					h.enq(h.on, "h", 1, 0)
					h.enq(h.on, "q1", 3, 0)
					h.enq(h.on, "q2", 2, 0)
					h.enq(h.on, "q3", 4, 0)
					h.enq(h.on, "q3", 4, 0)
					for i := 0; i < 6; i++ {
						_, ks := h.deq(n, fmt.Sprintf("call %d", i))
						t.Logf("call %d: %v", i, ks)
					}
				})
			})
		}
	}
}

// TestStaleBudgetDiff: random sequences over a queue whose pass 1
// runs out of its read budget (thousands of stale tags, refreshed by
// flag-off drains), with the newcomer lane, weights, key limits and
// flag-off serves: every flag-on dequeue equals the model rebuilt from
// Redis just before it, serves and state.
func TestStaleBudgetDiff(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	r2Backends(t, false, func(t *testing.T, c redis.UniversalClient) {
		var deqs, stales, served int
		defer func() { t.Logf("%d dequeues (%d served), %d stale batches", deqs, served, stales) }()
		rapid.Check(t, func(rt *rapid.T) {
			rc := r2Config{Scan: rapid.SampledFrom([]int{0, 1, 2, 3}).Draw(rt, "scan"), WM: 1}
			h := newR2(t, c, rc)
			h.t = rt
			nkeys := rapid.IntRange(2, 8).Draw(rt, "keys")
			var held []*runqueue.Run
			staleN := 0
			steps := rapid.IntRange(5, 40).Draw(rt, "steps")
			for i := 0; i < steps; i++ {
				step := fmt.Sprintf("step %d", i)
				switch op := rapid.IntRange(0, 99).Draw(rt, "op"); {
				case op < 35:
					k := fmt.Sprintf("k%d", rapid.IntRange(0, nkeys-1).Draw(rt, "key"))
					h.enq(h.on, k, rapid.IntRange(0, 8).Draw(rt, "prio"), 0)
				case op < 60:
					runs, _ := h.deq(rapid.IntRange(1, 6).Draw(rt, "n"), step)
					held = append(held, runs...)
					deqs++
					served += len(runs)
				case op < 70:
					if len(held) > 0 {
						j := rapid.IntRange(0, len(held)-1).Draw(rt, "ack")
						require.NoError(rt, h.on.Ack(h.ctx, held[j]))
						held = append(held[:j], held[j+1:]...)
					}
				case op < 78:
					// Stale tags: more than a call's read budget.
					staleN++
					stales++
					h.stale(fmt.Sprintf("s%d-", staleN), rapid.SampledFrom([]int{1030, 1100, 1500}).Draw(rt, "stale"))
				case op < 84:
					// A flag-off serve of the oldest work (a real key: the
					// stale ones are all gone): in flight without gating.
					runs, err := h.off.Dequeue(h.ctx, r2Env, r2Queue, rapid.IntRange(1, 3).Draw(rt, "offN"))
					require.NoError(rt, err)
					held = append(held, runs...)
				case op < 90:
					*h.lim = runqueue.Limits{Key: rapid.SampledFrom([]int{0, 1, 2}).Draw(rt, "keyLimit")}
				case op < 95:
					k := fmt.Sprintf("k%d", rapid.IntRange(0, nkeys-1).Draw(rt, "wkey"))
					w := rapid.SampledFrom([]float64{0.5, 1, 2, 3, 10}).Draw(rt, "w")
					require.NoError(rt, h.on.SetWeight(h.ctx, r2Env, r2Queue, k, w))
				default:
					h.clock.Advance(time.Second)
				}
			}
		})
	})
}

// r2Preview returns the keys Preview(n) predicts.
func (h *r2) preview(n int) []string {
	h.t.Helper()
	p, err := h.on.Preview(h.ctx, r2Env, r2Queue, n)
	require.NoError(h.t, err)
	var out []string
	for _, r := range p {
		out = append(out, r.Key)
	}
	return out
}

// TestPreviewOfBrokenState: "In Redis the state is two keys; a
// writer that finds one without the other ... starts the state again as if
// it had expired" (vtime/doc.go). The dequeue does (sched_state), but
// Preview replays the half it finds: with the hash and no ckVtime it
// keeps the old registration order (every tag read as 0); with ckVtime
// and no hash it keeps ckVtime's parked tags. Preview then predicts
// another run than the dequeue it claims to predict serves.
func TestPreviewOfBrokenState(t *testing.T) {
	t.Run("HashWithoutCkVtime", func(t *testing.T) {
		r2Backends(t, true, func(t *testing.T, c redis.UniversalClient) {
			h := newR2(t, c, r2Config{})
			h.enq(h.on, "a", 0, 0)
			h.enq(h.on, "a", 0, 0)
			h.enq(h.on, "b", 5, 0) // older work, registered after a
			h.enq(h.on, "b", 5, 0)
			require.NoError(t, c.Del(h.ctx, h.qk.CkVtime()).Err())
			predicted := h.preview(1)
			_, served := h.deq1(1)
			require.Equal(t, served, predicted, "Preview(1) over a state hash without ckVtime")
		})
	})
	t.Run("CkVtimeWithoutHash", func(t *testing.T) {
		r2Backends(t, true, func(t *testing.T, c redis.UniversalClient) {
			h := newR2(t, c, r2Config{})
			h.enq(h.on, "x", 0, 0)
			for i := 0; i < 3; i++ {
				h.enq(h.on, "a", 0, 0)
			}
			_, served := h.deq1(2) // x (drains, parks its tag above V), a
			require.Equal(t, []string{"x", "a"}, served)
			require.NoError(t, c.Del(h.ctx, h.qk.CkVtimeState()).Err())
			h.enq(h.off, "x", 9, 0) // flag off: no hook, x is untagged
			predicted := h.preview(1)
			_, served = h.deq1(1)
			require.Equal(t, served, predicted, "Preview(1) over a ckVtime without its state hash")
		})
	})
}

// deq1 is one flag-on dequeue without the model comparison.
func (h *r2) deq1(n int) ([]*runqueue.Run, []string) {
	h.t.Helper()
	runs, err := h.on.Dequeue(h.ctx, r2Env, r2Queue, n)
	require.NoError(h.t, err)
	var ks []string
	for _, r := range runs {
		ks = append(ks, r.Key)
	}
	return runs, ks
}

// r2Run is one run to queue.
type r2Run struct {
	key  string
	prio int
	ttl  time.Duration
}

// enqCmp queues runs through the flag-on instance in one EnqueueMany call
// (one Enqueue call when there is one) and through the model rebuilt just
// before, and requires the same scheduler state after.
func (h *r2) enqCmp(rs []r2Run, step string) {
	t := h.t
	t.Helper()
	m := h.model()
	now := h.now()
	var ps []runqueue.EnqueueParams
	for _, r := range rs {
		h.next++
		id := "r" + strconv.Itoa(h.next)
		ps = append(ps, runqueue.EnqueueParams{Env: r2Env, Queue: r2Queue, Key: r.key, ID: id, Payload: []byte(id),
			Priority: r.prio, TTL: r.ttl})
		require.NoError(t, m.Enqueue(id, r.key, r.prio, now, now))
	}
	if len(ps) == 1 {
		ok, err := h.on.Enqueue(h.ctx, ps[0])
		require.NoError(t, err)
		require.True(t, ok)
	} else {
		res, err := h.on.EnqueueMany(h.ctx, ps)
		require.NoError(t, err)
		for _, r := range res {
			require.True(t, r.Queued)
		}
	}
	after, _, err := h.on.SchedulerSnapshot(h.ctx, r2Env, r2Queue)
	require.NoError(t, err)
	requireSameScheduler(t, m.Snapshot(), after, step)
	h.checkLane(step)
}

// expireCmp runs a TTL sweep and the model's Expire of the same runs in
// the sweep's order, and requires the same state after.
func (h *r2) expireCmp(step string) {
	t := h.t
	t.Helper()
	m := h.model()
	sh := h.on.ShardOf(r2Env)
	due, err := h.c.ZRangeByScore(h.ctx, h.space.Shard(sh).TTL(), &redis.ZRangeBy{Min: "-inf",
		Max: strconv.FormatInt(h.now(), 10)}).Result()
	require.NoError(t, err)
	n, err := h.on.ExpireTTL(h.ctx, sh, 1000)
	require.NoError(t, err)
	expired := 0
	for _, member := range due {
		ref, err := keys.DecodeRunMember(member)
		require.NoError(t, err)
		if m.Expire(ref.ID) {
			expired++
		}
	}
	require.Equal(t, expired, n, "%s: expired", step)
	h.expired += n
	after, _, err := h.on.SchedulerSnapshot(h.ctx, r2Env, r2Queue)
	require.NoError(t, err)
	requireSameScheduler(t, m.Snapshot(), after, step)
	h.checkLane(step)
}

// TestLaneDiff: random sequences rich in newcomers (the lane),
// batches of registrations in one EnqueueMany, TTL expiry of lane members,
// flag-off serves and drains, stale tags past the read budget, weights
// and key limits; every flag-on write equals the model rebuilt from Redis
// just before it.
func TestLaneDiff(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	r2Backends(t, false, func(t *testing.T, c redis.UniversalClient) {
		var deqs, served, expired int
		defer func() { t.Logf("%d dequeues (%d served), %d expired", deqs, served, expired) }()
		rapid.Check(t, func(rt *rapid.T) {
			rc := r2Config{Scan: rapid.SampledFrom([]int{0, 1, 2, 3}).Draw(rt, "scan"), WM: rapid.IntRange(1, 3).Draw(rt, "wm")}
			h := newR2(t, c, rc)
			h.t = rt
			nkeys := rapid.IntRange(2, 12).Draw(rt, "keys")
			key := func() string { return fmt.Sprintf("k%d", rapid.IntRange(0, nkeys-1).Draw(rt, "key")) }
			var held []*runqueue.Run
			staleN := 0
			steps := rapid.IntRange(5, 60).Draw(rt, "steps")
			for i := 0; i < steps; i++ {
				step := fmt.Sprintf("step %d", i)
				switch op := rapid.IntRange(0, 99).Draw(rt, "op"); {
				case op < 30:
					var rs []r2Run
					for j := rapid.IntRange(1, 4).Draw(rt, "batch"); j > 0; j-- {
						rs = append(rs, r2Run{key(), rapid.IntRange(0, 8).Draw(rt, "prio"),
							time.Duration(rapid.SampledFrom([]int{0, 0, 2, 5}).Draw(rt, "ttl")) * time.Second})
					}
					h.enqCmp(rs, step+" (enqueue)")
				case op < 55:
					runs, _ := h.deq(rapid.IntRange(1, 6).Draw(rt, "n"), step+" (dequeue)")
					held = append(held, runs...)
					deqs++
					served += len(runs)
				case op < 65:
					if len(held) > 0 {
						j := rapid.IntRange(0, len(held)-1).Draw(rt, "ack")
						require.NoError(rt, h.on.Ack(h.ctx, held[j]))
						held = append(held[:j], held[j+1:]...)
					}
				case op < 68:
					staleN++
					h.stale(fmt.Sprintf("s%d-", staleN), rapid.SampledFrom([]int{1030, 1100}).Draw(rt, "stale"))
				case op < 74:
					runs, err := h.off.Dequeue(h.ctx, r2Env, r2Queue, rapid.IntRange(1, 3).Draw(rt, "offN"))
					require.NoError(rt, err)
					held = append(held, runs...)
				case op < 80:
					*h.lim = runqueue.Limits{Key: rapid.SampledFrom([]int{0, 1, 2}).Draw(rt, "keyLimit")}
				case op < 84:
					w := rapid.SampledFrom([]float64{0.5, 1, 2, 3, 10}).Draw(rt, "w")
					require.NoError(rt, h.on.SetWeight(h.ctx, r2Env, r2Queue, key(), w))
				case op < 92:
					h.clock.Advance(time.Duration(rapid.IntRange(1, 3).Draw(rt, "adv")) * time.Second)
					h.expireCmp(step + " (expire)")
					expired += h.expired
					h.expired = 0
				default:
					// A flag-off ack: the slot frees without the hook.
					if len(held) > 0 {
						j := rapid.IntRange(0, len(held)-1).Draw(rt, "offAck")
						require.NoError(rt, h.off.Ack(h.ctx, held[j]))
						held = append(held[:j], held[j+1:]...)
					}
				}
			}
		})
	})
}

// TestNewcomerOrderPastTheBudget: the oracle's newcomer-order
// check (docs/design.md section 7, guarantee 10 and the adversarial-names
// scenario: "no key registered after h is served before h") on the Lua,
// when pass 1 spends its read budget on stale tags (a rolling deploy's
// flag-off drains). The age head once took q, queued in the lane behind
// h and registered after it, out of the lane at V because its run is
// older (priority): q was served while h, the lane's head, waited. Now
// the age head brings h in for q.
func TestNewcomerOrderPastTheBudget(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	p, mini := foPool(t, foBackends[1], 1)
	o := foOracleOn(t, p, mini, 1)
	step := func(err error) { t.Helper(); require.NoError(t, err) }
	for i := 0; i < 3; i++ {
		_, err := o.Enqueue("a", 0, 0, 0)
		step(err)
	}
	for i := 0; i < 1100; i++ {
		_, err := o.Enqueue(fmt.Sprintf("s%04d", i), 9, 0, 0)
		step(err)
	}
	step(o.SetFlag(false))
	for o.Queued() > 3 {
		served, err := o.Dequeue(min(1000, o.Queued()-3))
		step(err)
		for _, s := range served {
			step(o.Ack(s.ID))
		}
	}
	step(o.SetFlag(true))
	served, err := o.Dequeue(1)
	step(err)
	require.Len(t, served, 1)
	_, err = o.Enqueue("h", 1, 0, 0) // the lane's head
	step(err)
	_, err = o.Enqueue("q", 2, 0, 0) // queued behind h, older work
	step(err)
	for i := 0; i < 3; i++ {
		served, err := o.Dequeue(1)
		step(err)
		for _, s := range served {
			step(o.Ack(s.ID))
		}
	}
	step(o.Finish())
	if vs := fairness.Run(&o.H, fairness.Checks...); len(vs) > 0 {
		t.Fatalf("%s", fairness.Report(&o.H, vs))
	}
}

// TestProbeWrapLua: the gated probe past the end of the gated set
// wraps to rank 0 in the same call; rank 0 is below its limit (a flag-off
// ack freed its slot) and returns. Lua against the model, every call.
func TestProbeWrapLua(t *testing.T) {
	r2Backends(t, true, func(t *testing.T, c redis.UniversalClient) {
		h := newR2(t, c, r2Config{Limits: runqueue.Limits{Key: 1}})
		for _, k := range []string{"g0", "g1", "g2"} {
			for i := 0; i < 3; i++ {
				h.enq(h.on, k, 0, 0)
			}
		}
		runs, ks := h.deq(3, "gate all")
		require.Equal(t, []string{"g0", "g1", "g2"}, ks)
		for i := 0; i < 3; i++ { // the probe walks ranks 0, 1, 2: all at their limit
			_, ks := h.deq(1, fmt.Sprintf("probe %d", i))
			require.Empty(t, ks)
		}
		require.NoError(t, h.off.Ack(h.ctx, runs[0])) // g0's slot frees, flag off: no hook
		_, ks = h.deq(1, "wrap")
		require.Equal(t, []string{"g0"}, ks, "gp past the end wraps to rank 0 in the same call")
	})
}

// TestProbeNotStarvedByJoinersLua: the Lua twin of vtime's
// TestProbeNotStarvedByLowerTaggedJoiners (each call checked against
// the model): t's slot is freed by a flag-off ack while it is gated, and
// one newcomer a call is gated with a tag below t's; the probe, walking
// ranks of tag order, once never reached t. It now walks gating order.
func TestProbeNotStarvedByJoinersLua(t *testing.T) {
	r2Backends(t, false, func(t *testing.T, c redis.UniversalClient) {
		h := newR2(t, c, r2Config{Limits: runqueue.Limits{Key: 1}})
		require.NoError(t, h.on.SetWeight(h.ctx, r2Env, r2Queue, "t", 0.2))
		for _, k := range []string{"t", "g0", "g1"} {
			h.enq(h.on, k, 0, 0)
			h.enq(h.on, k, 0, 0)
		}
		runs, ks := h.deq(3, "gate t, g0, g1")
		require.Equal(t, []string{"t", "g0", "g1"}, ks)
		require.NoError(t, h.off.Ack(h.ctx, runs[0])) // t's slot frees without the hook
		for i := 0; i < 30; i++ {
			k := fmt.Sprintf("n%02d", i)
			require.NoError(t, h.on.SetWeight(h.ctx, r2Env, r2Queue, k, 10))
			h.enq(h.on, k, 0, 0)
			h.enq(h.on, k, 0, 0)
			_, ks := h.deq(1, fmt.Sprintf("call %d", i))
			for _, key := range ks {
				if key == "t" {
					return
				}
			}
		}
		require.Fail(t, "t, below its limit since a flag-off ack, was not probed in 30 calls")
	})
}

// TestAgeHeadLaneMembersGatedAndDrained: the age head meets lane members
// while keys are gated (key limit 1) or drained in the same call, the
// lane's head is served and hands the lane on, by rank.
func TestAgeHeadLaneMembersGatedAndDrained(t *testing.T) {
	for _, n := range []int{2, 3, 4, 6} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			t.Parallel()
			r2Backends(t, false, func(t *testing.T, c redis.UniversalClient) {
				h := newR2(t, c, r2Config{Scan: 3, WM: 1, Limits: runqueue.Limits{Key: 1}})
				for i := 0; i < 3; i++ {
					h.enq(h.on, "a", 0, 0)
				}
				h.stale("s", 1100)
				_, ks := h.deq(1, "first")
				require.Equal(t, []string{"a"}, ks)
				h.enq(h.on, "h", 1, 0) // the lane's head; not among the 3 oldest
				h.enq(h.on, "q1", 5, 0)
				h.enq(h.on, "q1", 5, 0) // gated after one serve
				h.enq(h.on, "q2", 4, 0) // drained by its serve
				h.enq(h.on, "q3", 3, 0)
				h.enq(h.on, "q4", 2, 0)
				h.enq(h.on, "q5", 2, 0)
				for i := 0; i < 5; i++ {
					_, ks := h.deq(n, fmt.Sprintf("call %d", i))
					t.Logf("call %d: %v", i, ks)
				}
			})
		})
	}
}

// TestFlagOffTieOrderIgnoresServerLocale: the flag-off dequeue
// serves "in age order (lowest ready score first across its variants;
// ties by variant member)", ckIndex's order. Within a call it re-sorts a
// served variant in memory with lib/window's entry_before, which compares
// members with Lua's "<" (strcoll under the server's LC_COLLATE): the same
// locale dependence the flag-on dequeue was rid of. Keys "a" and "B":
// a's second run ties with B's head; ckIndex (bytes) puts "=B" first, the
// en_US collation "=a". One dequeue(2) serves a, a; two dequeue(1) serve
// a, B.
func TestFlagOffTieOrderIgnoresServerLocale(t *testing.T) {
	t.Parallel() // servers of its own (spawned for it), and no tight wall-clock bound
	if os.Getenv("RUNQUEUE_REQUIRE_REDIS") == "" {
		if _, err := exec.LookPath("redis-server"); err != nil {
			t.Skip("no redis-server")
		}
	}
	c := startLocaleRedis(t)
	serve := func(batch bool) []string {
		clock := newFakeClock()
		ctx := context.Background()
		q, err := runqueue.New(ctx, c, &runqueue.Config{Prefix: redistest.Prefix(t), Clock: clock})
		require.NoError(t, err)
		defer q.Close()
		t0 := clock.Now().Add(-time.Minute)
		for _, r := range []struct {
			key, id string
			at      time.Time
		}{{"a", "a1", t0}, {"a", "a2", t0.Add(time.Second)}, {"B", "B1", t0.Add(time.Second)}} {
			_, err := q.Enqueue(ctx, runqueue.EnqueueParams{Env: r2Env, Queue: r2Queue, Key: r.key, ID: r.id, AvailableAt: r.at})
			require.NoError(t, err)
		}
		var out []string
		calls := 2
		n := 1
		if batch {
			calls, n = 1, 2
		}
		for i := 0; i < calls; i++ {
			runs, err := q.Dequeue(ctx, r2Env, r2Queue, n)
			require.NoError(t, err)
			for _, r := range runs {
				out = append(out, r.ID)
			}
		}
		return out
	}
	require.Equal(t, []string{"a1", "B1"}, serve(false), "two dequeue(1), flag off")
	require.Equal(t, []string{"a1", "B1"}, serve(true), "one dequeue(2), flag off, LC_COLLATE=en_US.UTF-8")
}
