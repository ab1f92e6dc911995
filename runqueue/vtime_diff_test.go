package runqueue_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/internal/schedfmt"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
	"github.com/runqueue/runqueue/vtime"
)

// diffSteps counts the operations the differential tests ran, per backend.
var diffSteps sync_counter

type sync_counter struct{ n atomic.Int64 }

// diff drives one random operation sequence through the vtime model and
// through the flag-on Lua on one Redis, comparing after every step. A
// second queue on the same prefix runs with the flag off (same clock, same
// limits): some enqueues, dequeues, acks, nacks and redrives go through it, as
// during a rollout, and the model mirrors them with its flag-off writers.
type diff struct {
	ctx    context.Context
	c      redis.UniversalClient
	q      *runqueue.Queue
	off    *runqueue.Queue // VtimeScheduling false, on q's prefix: made at its first use (offQueue)
	offCfg *runqueue.Config
	m      *vtime.Model
	clock  *fakeClock
	qk     keys.Queue
	env    string
	queue  string
	nextID int
	keys   []string
	lease  time.Duration
	limits *runqueue.Limits

	inflight map[string]*runqueue.Run // id -> run as delivered
	ttl      map[string]int64         // id -> TTL deadline of queued runs
	dead     map[string]string        // id -> key
}

const (
	diffEnv   = "env:1"
	diffQueue = "q*{x}"
)

func newDiff(t *testing.T, rt *rapid.T, c redis.UniversalClient) *diff {
	prefix := redistest.Prefix(t)
	clock := newFakeClock()
	limits := runqueue.Limits{
		Queue: rapid.SampledFrom([]int{0, 0, 4, 9}).Draw(rt, "queueLimit"),
		Key:   rapid.SampledFrom([]int{0, 0, 1, 2}).Draw(rt, "keyLimit"),
	}
	wm := rapid.SampledFrom([]int{1, 2, 3}).Draw(rt, "windowMultiplier")
	idleMax := rapid.SampledFrom([]int{10000, 2}).Draw(rt, "idleMax")
	scan := rapid.SampledFrom([]int{0, 0, 2, 3}).Draw(rt, "scanLimit")
	// A small promote limit keeps due runs behind in the variants a call
	// reaches, so that more are due than a call reaches over several calls,
	// some of them with ready runs and some without (the promotion's
	// starving-first rule).
	promote := rapid.SampledFrom([]int{0, 0, 1, 2}).Draw(rt, "promoteLimit")
	lease := time.Minute
	lim := &limits
	cfg := &runqueue.Config{
		Prefix: prefix, Clock: clock, VtimeScheduling: true, MaxAttempts: 3,
		LimitsFor:        func(string, string) runqueue.Limits { return *lim },
		WindowMultiplier: wm, IdleMaxEntries: idleMax, LeaseDuration: lease, ScanLimit: scan, PromoteLimit: promote,
	}
	ctx := context.Background()
	q, err := runqueue.New(ctx, c, cfg)
	require.NoError(t, err)
	offCfg := *cfg // the same prefix, clock, limits and settings, the flag off
	offCfg.VtimeScheduling = false
	nkeys := rapid.IntRange(1, 9).Draw(rt, "keys")
	ks := []string{"", "a", "b:c", "*", "{d}", "é", "z z", "k7", "k8"}[:nkeys]
	space, err := keys.NewSpace(prefix, q.Shards())
	require.NoError(t, err)
	qk := space.Env(diffEnv).Queue(diffQueue)
	mcfg := vtime.Config{
		WindowMultiplier: wm, IdleMaxEntries: idleMax, MaxAttempts: 3, ScanLimit: scan, PromoteLimit: promote,
		Limits: vtime.Limits{Queue: limits.Queue, Key: limits.Key},
	}
	m := vtime.New(mcfg)
	if rapid.IntRange(0, 3).Draw(rt, "edge") == 0 {
		// Start the clock a few serves before the rebase point: the first
		// calls rebase, and both sides must agree on every value after.
		v := int64(vtime.RebaseAt - rapid.IntRange(1, 40).Draw(rt, "serves before the rebase")*vtime.Unit)
		m = vtime.Restore(mcfg, vtime.Snapshot{V: v})
		seedSchedulerClock(t, ctx, c, qk, v, clock.Now().UnixMilli())
	}
	return &diff{
		ctx: ctx, c: c, q: q, offCfg: &offCfg, clock: clock, env: diffEnv, queue: diffQueue,
		qk:   qk,
		keys: ks, lease: lease, limits: lim,
		m:        m,
		inflight: map[string]*runqueue.Run{}, ttl: map[string]int64{}, dead: map[string]string{},
	}
}

func (d *diff) now() int64 { return d.clock.Now().UnixMilli() }

// offQueue returns the flag-off queue, made at the first call (the callers
// of newDiff that write with the flag on only never make it).
func (d *diff) offQueue(rt *rapid.T) *runqueue.Queue {
	if d.off == nil {
		q, err := runqueue.New(d.ctx, d.c, d.offCfg)
		require.NoError(rt, err)
		d.off = q
	}
	return d.off
}

// close closes the queues newDiff and offQueue made.
func (d *diff) close() {
	d.q.Close()
	if d.off != nil {
		d.off.Close()
	}
}

// seedSchedulerClock creates a queue's scheduler state with clock v, as the
// scripts create it (lua/lib/sched_reg.lua: the sentinel, the scalars).
func seedSchedulerClock(t testing.TB, ctx context.Context, c redis.UniversalClient, qk keys.Queue, v, now int64) {
	day := 24 * time.Hour
	_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAdd(ctx, qk.CkVtime(), redis.Z{Score: 0, Member: schedfmt.SentinelMember})
		p.HSet(ctx, qk.CkVtimeState(), "v", v, "e", 0, "c", 0, "s", 1, "x", now+day.Milliseconds(), "gk", 0, "gp", 0, "ng", 0, "nw", -1)
		p.PExpire(ctx, qk.CkVtime(), day)
		p.PExpire(ctx, qk.CkVtimeState(), day)
		return nil
	})
	require.NoError(t, err)
}

func (d *diff) enqueue(rt *rapid.T) { d.enqueueBy(rt, false) }

// enqueueOff queues one run through the flag-off queue; the model's
// EnqueueOff registers nothing.
func (d *diff) enqueueOff(rt *rapid.T) { d.enqueueBy(rt, true) }

// enqueueBy queues one run through the flag-on queue or, off, through the
// flag-off one.
func (d *diff) enqueueBy(rt *rapid.T, off bool) {
	d.nextID++
	id := "r" + strconv.Itoa(d.nextID)
	key := rapid.SampledFrom(d.keys).Draw(rt, "key")
	prio := rapid.SampledFrom([]int{0, 0, 0, 1, 9}).Draw(rt, "priority")
	delay := time.Duration(rapid.SampledFrom([]int{0, 0, 0, 5, 40}).Draw(rt, "delay")) * time.Second
	ttl := time.Duration(rapid.SampledFrom([]int{0, 0, 0, 20, 90}).Draw(rt, "ttl")) * time.Second
	now := d.now()
	q, enqueue := d.q, d.m.Enqueue
	if off {
		q, enqueue = d.offQueue(rt), d.m.EnqueueOff
	}
	ok, err := q.Enqueue(d.ctx, runqueue.EnqueueParams{Env: d.env, Queue: d.queue, Key: key, ID: id,
		Payload: []byte(id), Priority: prio, Delay: delay, TTL: ttl})
	require.NoError(rt, err)
	require.True(rt, ok)
	require.NoError(rt, enqueue(id, key, prio, now+delay.Milliseconds(), now))
	if ttl > 0 {
		d.ttl[id] = now + ttl.Milliseconds()
		d.m.SetTTL(id, now+ttl.Milliseconds())
	}
}

// enqueueMany queues several runs in one EnqueueMany call (a key may come
// twice; 33 runs take the bulk path): the call registers the keys it makes
// ready together (sched_register_many), which must be what the model's
// enqueues one at a time, in run order, do.
func (d *diff) enqueueMany(rt *rapid.T) {
	n := rapid.SampledFrom([]int{2, 3, 5, 8, 33}).Draw(rt, "runs")
	now := d.now()
	ps := make([]runqueue.EnqueueParams, n)
	for i := range ps {
		d.nextID++
		id := "r" + strconv.Itoa(d.nextID)
		delay := time.Duration(rapid.SampledFrom([]int{0, 0, 0, 5}).Draw(rt, "delay")) * time.Second
		ps[i] = runqueue.EnqueueParams{Env: d.env, Queue: d.queue, Key: rapid.SampledFrom(d.keys).Draw(rt, "key"), ID: id,
			Payload: []byte(id), Priority: rapid.SampledFrom([]int{0, 0, 1, 9}).Draw(rt, "priority"), Delay: delay}
	}
	res, err := d.q.EnqueueMany(d.ctx, ps)
	require.NoError(rt, err)
	for i, p := range ps {
		require.NoError(rt, res[i].Err)
		require.True(rt, res[i].Queued)
		require.NoError(rt, d.m.Enqueue(p.ID, p.Key, p.Priority, now+p.Delay.Milliseconds(), now))
	}
}

func (d *diff) dequeue(rt *rapid.T, n int) []string {
	now := d.now()
	preview, err := d.q.Preview(d.ctx, d.env, d.queue, n)
	require.NoError(rt, err)
	runs, err := d.q.Dequeue(d.ctx, d.env, d.queue, n)
	require.NoError(rt, err)
	var predicted []string
	for _, p := range preview {
		predicted = append(predicted, p.Key+"/"+p.ID+"/"+strconv.Itoa(p.Attempt))
	}
	got := d.served(rt, runs, d.delivered(first(d.m.DequeueCalls(n, now, runqueue.MaxCorruptCalls, true))), fmt.Sprintf("dequeue(%d) served", n))
	require.Equal(rt, got, predicted, "Preview(%d) predicted", n)
	return got
}

// first is the first of two values.
func first[A, B any](a A, _ B) A { return a }

// delivered is the model's side of one Dequeue: the runs served it took
// (DequeueCalls), those it delivered; the expired ones leave d.ttl.
func (d *diff) delivered(served []vtime.Served) []vtime.Served {
	var out []vtime.Served
	for _, s := range served {
		if s.Expired {
			id, _ := keys.DecodeSegment(s.ID)
			delete(d.ttl, id)
			continue
		}
		out = append(out, s)
	}
	return out
}

// dequeueOff serves up to n runs through the flag-off queue (age order,
// no scheduler write) and requires the runs the model's DequeueOff serves,
// in the same order.
func (d *diff) dequeueOff(rt *rapid.T, n int) {
	now := d.now()
	runs, err := d.offQueue(rt).Dequeue(d.ctx, d.env, d.queue, n)
	require.NoError(rt, err)
	d.served(rt, runs, d.delivered(first(d.m.DequeueCalls(n, now, runqueue.MaxCorruptCalls, false))), fmt.Sprintf("flag-off dequeue(%d) served", n))
}

// served records runs, which a dequeue returned, as in flight and requires
// them to be the model's want, in order; it returns them as key/id/attempt.
func (d *diff) served(rt *rapid.T, runs []*runqueue.Run, want []vtime.Served, what string) []string {
	var got, exp []string
	for _, r := range runs {
		got = append(got, r.Key+"/"+r.ID+"/"+strconv.Itoa(r.Attempt))
		d.inflight[r.ID] = r
		delete(d.ttl, r.ID)
	}
	for _, s := range want {
		id, err := keys.DecodeSegment(s.ID)
		require.NoError(rt, err)
		exp = append(exp, s.Key+"/"+id+"/"+strconv.Itoa(s.Attempt))
	}
	require.Equal(rt, exp, got, what)
	return got
}

func (d *diff) pickInflight(rt *rapid.T) *runqueue.Run {
	if len(d.inflight) == 0 {
		return nil
	}
	ids := sortedKeys(d.inflight)
	return d.inflight[rapid.SampledFrom(ids).Draw(rt, "inflight")]
}

func (d *diff) ack(rt *rapid.T) { d.ackBy(rt, false) }

// ackOff acks one run in flight through the flag-off queue; the model's
// AckOff leaves a gated variant gated for the probe.
func (d *diff) ackOff(rt *rapid.T) { d.ackBy(rt, true) }

// ackBy acks one run in flight through the flag-on queue or, off, through
// the flag-off one.
func (d *diff) ackBy(rt *rapid.T, off bool) {
	r := d.pickInflight(rt)
	if r == nil {
		return
	}
	q, ack := d.q, d.m.Ack
	if off {
		q, ack = d.offQueue(rt), d.m.AckOff
	}
	require.NoError(rt, q.Ack(d.ctx, r))
	require.NoError(rt, ack(r.ID))
	delete(d.inflight, r.ID)
}

func (d *diff) nack(rt *rapid.T) { d.nackBy(rt, false) }

// nackOff nacks one run in flight through the flag-off queue (the model's
// NackOff).
func (d *diff) nackOff(rt *rapid.T) { d.nackBy(rt, true) }

// nackBy nacks one run in flight through the flag-on queue or, off,
// through the flag-off one.
func (d *diff) nackBy(rt *rapid.T, off bool) {
	r := d.pickInflight(rt)
	if r == nil {
		return
	}
	retry := d.clock.Now().Add(time.Duration(rapid.SampledFrom([]int{0, 0, 3, 30}).Draw(rt, "retry")) * time.Second)
	kill := rapid.IntRange(0, 9).Draw(rt, "kill") == 0
	q, nack := d.q, d.m.Nack
	if off {
		q, nack = d.offQueue(rt), d.m.NackOff
	}
	res, err := q.Nack(d.ctx, r, &runqueue.NackOptions{RetryAt: retry, DeadLetter: kill})
	require.NoError(rt, err)
	requeued, err := nack(r.ID, retry.UnixMilli(), d.now(), kill)
	require.NoError(rt, err)
	require.Equal(rt, requeued, res.Requeued)
	delete(d.inflight, r.ID)
	if !requeued {
		d.dead[r.ID] = r.Key
	}
}

// recoverLeases expires every lease, in the order Redis sweeps them.
func (d *diff) recoverLeases(rt *rapid.T) { d.recoverLeasesBy(rt, false) }

// recoverLeasesOff is recoverLeases through the flag-off queue (the
// model's RecoverOff).
func (d *diff) recoverLeasesOff(rt *rapid.T) { d.recoverLeasesBy(rt, true) }

// recoverLeasesBy expires every lease and recovers them through the
// flag-on queue or, off, through the flag-off one.
func (d *diff) recoverLeasesBy(rt *rapid.T, off bool) {
	d.clock.Advance(d.lease + time.Second)
	now := d.now()
	type held struct{ member, id string }
	var order []held
	for id, r := range d.inflight {
		order = append(order, held{keys.RunMember(keys.Ref{Env: r.Env, Queue: r.Queue, Key: r.Key, ID: r.ID}), id})
	}
	// Every lease has a distinct or equal deadline; Redis orders by
	// (deadline, member).
	sort.Slice(order, func(i, j int) bool {
		a, b := d.inflight[order[i].id].LeaseDeadline, d.inflight[order[j].id].LeaseDeadline
		if !a.Equal(b) {
			return a.Before(b)
		}
		return order[i].member < order[j].member
	})
	q, recover := d.q, d.m.Recover
	if off {
		q, recover = d.offQueue(rt), d.m.RecoverOff
	}
	n, err := q.RecoverLeases(d.ctx, q.ShardOf(d.env), 1000)
	require.NoError(rt, err)
	require.Equal(rt, len(order), n)
	for _, h := range order {
		requeued, err := recover(h.id, now)
		require.NoError(rt, err)
		if !requeued {
			d.dead[h.id] = d.inflight[h.id].Key
		}
		delete(d.inflight, h.id)
	}
}

func (d *diff) expire(rt *rapid.T) {
	now := d.now()
	type due struct {
		member, id string
		at         int64
	}
	var order []due
	for id, at := range d.ttl {
		if at <= now {
			st, _ := d.m.State(id)
			if st == vtime.Ready || st == vtime.Delayed {
				key := d.keyOf(id)
				order = append(order, due{keys.RunMember(keys.Ref{Env: d.env, Queue: d.queue, Key: key, ID: id}), id, at})
			}
		}
	}
	sort.Slice(order, func(i, j int) bool {
		if order[i].at != order[j].at {
			return order[i].at < order[j].at
		}
		return order[i].member < order[j].member
	})
	n, err := d.q.ExpireTTL(d.ctx, d.q.ShardOf(d.env), 1000)
	require.NoError(rt, err)
	require.Equal(rt, len(order), n, "expired")
	for _, e := range order {
		require.True(rt, d.m.Expire(e.id))
		delete(d.ttl, e.id)
	}
}

// keyOf finds the concurrency key of a queued run from its enqueue.
func (d *diff) keyOf(id string) string {
	k, _, _, err := d.q.RecordOf(d.ctx, d.env, d.queue, id)
	if err != nil {
		return ""
	}
	return k
}

func (d *diff) redrive(rt *rapid.T) { d.redriveBy(rt, false) }

// redriveOff puts a dead run back through the flag-off queue (the model's
// RedriveOff: no registration).
func (d *diff) redriveOff(rt *rapid.T) { d.redriveBy(rt, true) }

// redriveBy puts a dead run back through the flag-on queue or, off,
// through the flag-off one.
func (d *diff) redriveBy(rt *rapid.T, off bool) {
	if len(d.dead) == 0 {
		return
	}
	id := rapid.SampledFrom(sortedKeys(d.dead)).Draw(rt, "dead")
	q, redrive := d.q, d.m.Redrive
	if off {
		q, redrive = d.offQueue(rt), d.m.RedriveOff
	}
	require.NoError(rt, q.Redrive(d.ctx, d.env, d.queue, d.dead[id], id))
	require.NoError(rt, redrive(id, d.now()))
	delete(d.dead, id)
}

// setLimits changes the queue and key limits from the next dequeue on.
func (d *diff) setLimits(rt *rapid.T) {
	l := runqueue.Limits{
		Queue: rapid.SampledFrom([]int{0, 0, 4, 9}).Draw(rt, "queueLimit"),
		Key:   rapid.SampledFrom([]int{0, 0, 1, 2, 3}).Draw(rt, "keyLimit"),
	}
	*d.limits = l
	d.m.SetLimits(vtime.Limits{Queue: l.Queue, Key: l.Key})
}

// expireState makes the scheduler's state expire whole, as StateTTL with
// no scheduler write does.
func (d *diff) expireState(rt *rapid.T) {
	require.NoError(rt, d.c.Del(d.ctx, d.qk.CkVtime(), d.qk.CkVtimeState()).Err())
	d.m.ExpireState()
}

func (d *diff) setWeight(rt *rapid.T) {
	key := rapid.SampledFrom(d.keys).Draw(rt, "weightKey")
	// (0.9996 and 1.0004 are held as 1: SetWeight clears, as the model does)
	w := rapid.SampledFrom([]float64{0, 0.001, 0.01, 0.3, 0.5, 0.9996, 1.0004, 2, 3, 7, 100, 1000}).Draw(rt, "weight")
	if w == 0 {
		require.NoError(rt, d.q.ClearWeight(d.ctx, d.env, d.queue, key))
	} else {
		require.NoError(rt, d.q.SetWeight(d.ctx, d.env, d.queue, key, w))
	}
	d.m.SetWeight(key, w)
}

// compare checks that Redis holds exactly the model's scheduler state:
// clock, epoch, anchor, cursor, registration counter, gating state, the
// time of the state's first discovery read, every
// registration (tag, remainder, order, gated), every parked tag, the
// weights, and ckIndex.
func (d *diff) compare(rt *rapid.T, step string) {
	got, exists, err := d.q.SchedulerSnapshot(d.ctx, d.env, d.queue)
	require.NoError(rt, err)
	if exists {
		// The state hash counts the gated variants (a dequeue skips its
		// gated probe when there are none): the count must be exact.
		ng, err := d.c.HGet(d.ctx, d.qk.CkVtimeState(), "ng").Int()
		if errors.Is(err, redis.Nil) {
			ng, err = 0, nil
		}
		require.NoError(rt, err)
		gated := 0
		for _, r := range got.Reg {
			if r.Gated {
				gated++
			}
		}
		require.Equal(rt, gated, ng, "gated count after %s", step)
	}
	if os.Getenv("DIFF_DEBUG") != "" {
		z, _ := d.c.ZRangeWithScores(d.ctx, d.qk.CkVtime(), 0, -1).Result()
		h, _ := d.c.HGetAll(d.ctx, d.qk.CkVtimeState()).Result()
		rt.Logf("DEBUG %s: z=%v h=%v", step, z, h)
	}
	requireSameScheduler(rt, d.m.Snapshot(), got, step)
	z, err := d.c.ZRangeWithScores(d.ctx, d.qk.CkIndex(), 0, -1).Result()
	require.NoError(rt, err)
	idx := []vtime.Entry{}
	for _, e := range z {
		idx = append(idx, vtime.Entry{Member: e.Member.(string), Score: e.Score})
	}
	want := d.m.CkIndex()
	if want == nil {
		want = []vtime.Entry{}
	}
	require.Equal(rt, want, idx, "ckIndex after %s", step)
}

// requireSameScheduler compares the scheduler parts of two snapshots.
func requireSameScheduler(t require.TestingT, want, got vtime.Snapshot, step string) {
	type sched struct {
		V, Epoch      int64
		Cursor        int
		NextSeq       int64
		GK            int
		GN, GP        int64
		Began         bool
		Born          int64
		Marked        bool
		Mark          int64
		Reg           map[string]vtime.Reg
		Idle, Weights map[string]int64
	}
	pick := func(s vtime.Snapshot) sched {
		out := sched{s.V, s.Epoch, s.Cursor, max(1, s.NextSeq), s.GK, max(1, s.GN), s.GP, s.Began, s.Born, s.Marked, s.Mark, s.Reg, s.Idle, s.Weights}
		for _, m := range []*map[string]int64{&out.Idle, &out.Weights} {
			if *m == nil {
				*m = map[string]int64{}
			}
		}
		if out.Reg == nil {
			out.Reg = map[string]vtime.Reg{}
		}
		return out
	}
	require.Equal(t, pick(want), pick(got), "scheduler state after %s", step)
}

// TestVtimeDifferential runs random operation sequences through the model
// and the flag-on Lua and requires identical serves, tags, V, cursor, last
// newcomer tag, idle entries and ckIndex after every step. A few percent of
// the enqueues, dequeues, acks, nacks and redrives go through a flag-off instance (a
// rollout): untagged work for discovery and the age head, slots freed
// without a word for the gated probe, variants drained or served past
// their tag without the scheduler's knowledge (stale and gated
// registrations for a flag-on call to meet).
func TestVtimeDifferential(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	runDifferential(t, func(d *diff, rt *rapid.T, op int) string {
		switch {
		case op < 24:
			d.enqueue(rt)
			return "enqueue"
		case op < 28:
			d.enqueueOff(rt)
			return "flag-off enqueue"
		case op < 35:
			d.enqueueMany(rt)
			return "enqueue many"
		case op < 57:
			d.dequeue(rt, rapid.IntRange(1, 6).Draw(rt, "maxCount"))
			return "dequeue"
		case op < 60:
			d.dequeueOff(rt, rapid.IntRange(1, 6).Draw(rt, "maxCount"))
			return "flag-off dequeue"
		case op < 67:
			d.ack(rt)
			return "ack"
		case op < 70:
			d.ackOff(rt)
			return "flag-off ack"
		case op < 75:
			d.nack(rt)
			return "nack"
		case op < 78:
			d.nackOff(rt)
			return "flag-off nack"
		case op < 86:
			d.clock.Advance(time.Duration(rapid.IntRange(1, 45).Draw(rt, "advance")) * time.Second)
			return "advance"
		case op < 88:
			d.recoverLeases(rt)
			return "recover"
		case op < 89:
			d.recoverLeasesOff(rt)
			return "flag-off recover"
		case op < 93:
			d.expire(rt)
			return "expire"
		case op < 94:
			d.redrive(rt)
			return "redrive"
		case op < 95:
			d.redriveOff(rt)
			return "flag-off redrive"
		case op < 97:
			d.setWeight(rt)
			return "weight"
		case op < 99:
			d.setLimits(rt)
			return "limits"
		default:
			d.expireState(rt)
			return "expire state"
		}
	})
}

// TestVtimeDifferentialWeights runs the differential with weight changes
// a fifth of the steps: keys served at one weight and then given another
// while they compete, are gated or are parked (a weight change caps the
// tag: vtime's SetWeight), which the general mix reaches seldom.
func TestVtimeDifferentialWeights(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	runDifferential(t, func(d *diff, rt *rapid.T, op int) string {
		switch {
		case op < 30:
			d.enqueue(rt)
			return "enqueue"
		case op < 60:
			d.dequeue(rt, rapid.IntRange(1, 3).Draw(rt, "maxCount"))
			return "dequeue"
		case op < 75:
			d.ack(rt)
			return "ack"
		case op < 95:
			d.setWeight(rt)
			return "weight"
		default:
			d.clock.Advance(time.Duration(rapid.IntRange(1, 45).Draw(rt, "advance")) * time.Second)
			return "advance"
		}
	})
}

// runDifferential runs rapid sequences of 5 to 60 steps on miniredis and
// a real Redis: step does operation op (0..99) on both sides and names
// it, and the two states are compared after every step.
func runDifferential(t *testing.T, step func(d *diff, rt *rapid.T, op int) string) {
	for _, b := range backends[:2] {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			c := b.Client(t)
			var steps int
			rapid.Check(t, func(rt *rapid.T) {
				d := newDiff(t, rt, c)
				defer d.close()
				n := rapid.IntRange(5, 60).Draw(rt, "steps")
				for i := 0; i < n; i++ {
					name := step(d, rt, rapid.IntRange(0, 99).Draw(rt, "op"))
					d.compare(rt, fmt.Sprintf("step %d (%s)", i, name))
					steps++
				}
			})
			diffSteps.n.Add(int64(steps))
			t.Logf("%s: %d differential steps", b.Name, steps)
		})
	}
}

// TestVtimeRebaseAtTheEdge starts a queue's clock a few serves before the
// rebase point, with keys of weight 1000, 1 and 0.001 backlogged: the
// weight-1000 key's tag keeps moving across the rebase (no precision
// horizon), the Lua and the model agree on every stored value after every
// call, the logical clock never decreases, and every stored value stays
// an exact integer below 2^52.
func TestVtimeRebaseAtTheEdge(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	for _, b := range backends[:2] {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			c := b.Client(t)
			ctx := context.Background()
			clock := newFakeClock()
			prefix := redistest.Prefix(t)
			q, err := runqueue.New(ctx, c, &runqueue.Config{Prefix: prefix, Clock: clock, VtimeScheduling: true})
			require.NoError(t, err)
			defer q.Close()
			space, err := keys.NewSpace(prefix, q.Shards())
			require.NoError(t, err)
			qk := space.Env(diffEnv).Queue(diffQueue)
			start := int64(vtime.RebaseAt - 3*vtime.Unit)
			m := vtime.Restore(vtime.Config{}, vtime.Snapshot{V: start})
			seedSchedulerClock(t, ctx, c, qk, start, clock.Now().UnixMilli())
			weights := map[string]float64{"fast": 1000, "one": 1, "slow": 0.001}
			for k, w := range weights {
				require.NoError(t, q.SetWeight(ctx, diffEnv, diffQueue, k, w))
				m.SetWeight(k, w)
				for i := 0; i < 400; i++ {
					id := fmt.Sprintf("%s-%d", k, i)
					now := clock.Now().UnixMilli()
					_, err := q.Enqueue(ctx, runqueue.EnqueueParams{Env: diffEnv, Queue: diffQueue, Key: k, ID: id})
					require.NoError(t, err)
					require.NoError(t, m.Enqueue(id, k, 0, now, now))
				}
			}
			lastV := m.V()
			var fastTags []int64
			served := map[string]int{}
			for call := 0; call < 100; call++ {
				now := clock.Now().UnixMilli()
				want := m.Dequeue(10, now)
				runs, err := q.Dequeue(ctx, diffEnv, diffQueue, 10)
				require.NoError(t, err)
				require.Len(t, runs, len(want))
				for i, r := range runs {
					require.Equal(t, want[i].Key, r.Key, "call %d serve %d", call, i)
					if call < 40 {
						served[r.Key]++
					}
					require.NoError(t, q.Ack(ctx, r))
					id, err := keys.DecodeSegment(want[i].ID)
					require.NoError(t, err)
					require.NoError(t, m.Ack(id))
				}
				got, _, err := q.SchedulerSnapshot(ctx, diffEnv, diffQueue)
				require.NoError(t, err)
				requireSameScheduler(t, m.Snapshot(), got, fmt.Sprintf("call %d", call))
				require.GreaterOrEqual(t, m.V(), lastV, "the clock went back at call %d", call)
				lastV = m.V()
				for vm, r := range got.Reg {
					require.Less(t, r.U, int64(1)<<52, "%s's tag", vm)
				}
				if r, ok := got.Reg[keys.VariantMember("fast")]; ok {
					fastTags = append(fastTags, r.U)
				}
			}
			s := m.Snapshot()
			require.Positive(t, s.Epoch, "the clock passed the rebase point")
			for i := 1; i < len(fastTags); i++ {
				require.NotEqual(t, fastTags[i-1], fastTags[i], "the weight-1000 key's tag stopped moving")
			}
			// Shares over the first 400 serves: fast (weight 1000) takes all
			// but about one per 1,000 (one and slow register at about the same
			// time, so each may get its first serve).
			require.GreaterOrEqual(t, served["fast"], 398)
			require.LessOrEqual(t, served["one"], 1)
			require.LessOrEqual(t, served["slow"], 1)
			t.Logf("epoch %d, V %.3f, served %v", s.Epoch, m.V(), served)
		})
	}
}

// TestVtimeDifferentialHeldPromotion runs the differential where delayed
// runs pile up behind keys held at their limit: many enqueues (two in
// five delayed), dequeues that are seldom acked, and clock moves past the
// delays, so that a call's promotion reaches keys at their limit beside
// keys it can serve (vtime.PromotePlan's held), which the general mix
// reaches seldom. Against a model of an earlier version of the rule (held
// keys' first shares outside the budget, c97e761), a Lua that counted held
// keys in the budget as before failed it after 313 sequences
// (-rapid.checks=1500), the general mix after 1,172 (helper-131); at the
// default 100 a run of it may not meet a difference: the targeted tests
// (promote_held_test.go) do.
func TestVtimeDifferentialHeldPromotion(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	runDifferential(t, func(d *diff, rt *rapid.T, op int) string {
		switch {
		case op < 45:
			d.enqueue(rt)
			return "enqueue"
		case op < 50:
			d.enqueueOff(rt)
			return "flag-off enqueue"
		case op < 78:
			d.dequeue(rt, rapid.IntRange(1, 6).Draw(rt, "maxCount"))
			return "dequeue"
		case op < 83:
			d.dequeueOff(rt, rapid.IntRange(1, 6).Draw(rt, "maxCount"))
			return "flag-off dequeue"
		case op < 88:
			d.ack(rt)
			return "ack"
		default:
			d.clock.Advance(time.Duration(rapid.IntRange(5, 45).Draw(rt, "advance")) * time.Second)
			return "advance"
		}
	})
}

// burst queues one delayed run for each of several keys, all due at the
// same moment (the ones before it may be due already).
func (d *diff) burst(rt *rapid.T) {
	delay := time.Duration(rapid.SampledFrom([]int{1, 5, 40}).Draw(rt, "burstDelay")) * time.Second
	now := d.now()
	for _, key := range d.keys {
		if rapid.IntRange(0, 3).Draw(rt, "skip") == 0 {
			continue
		}
		d.nextID++
		id := "r" + strconv.Itoa(d.nextID)
		prio := rapid.SampledFrom([]int{0, 0, 0, 1}).Draw(rt, "priority")
		ok, err := d.q.Enqueue(d.ctx, runqueue.EnqueueParams{Env: d.env, Queue: d.queue, Key: key, ID: id,
			Payload: []byte(id), Priority: prio, Delay: delay})
		require.NoError(rt, err)
		require.True(rt, ok)
		require.NoError(rt, d.m.Enqueue(id, key, prio, now+delay.Milliseconds(), now))
	}
}

// TestVtimeDifferentialColdBurst runs the differential with bursts of
// delayed runs of many keys falling due together, often on a cold state
// (the state expired, or every key drained), so that promotions cut short
// by ScanLimit set the cold mark and later ones register what was due by
// it at V (vtime's call.promote), which the general mix reaches seldom: a
// Lua that never registered by the mark passed TestVtimeDifferential.
func TestVtimeDifferentialColdBurst(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	runDifferential(t, func(d *diff, rt *rapid.T, op int) string {
		switch {
		case op < 25:
			d.burst(rt)
			return "burst"
		case op < 32:
			d.enqueue(rt)
			return "enqueue"
		case op < 65:
			d.dequeue(rt, rapid.IntRange(1, 4).Draw(rt, "maxCount"))
			return "dequeue"
		case op < 80:
			d.ack(rt)
			return "ack"
		case op < 94:
			d.clock.Advance(time.Duration(rapid.IntRange(1, 45).Draw(rt, "advance")) * time.Second)
			return "advance"
		default:
			d.expireState(rt)
			return "expire state"
		}
	})
}
