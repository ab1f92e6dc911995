package runqueue_test

// Review of 3e11d92 (a registration reads only v, s, x, nw, lh; the state
// is "partial" until the next sched_state(S) reads e, c, gk, gn, gp, ng).
// These tests build the states where a script registers a variant and then
// uses or saves the rest of the scalars in the same call, with the rest
// stored at values other than their defaults, and compare the flag-on Lua
// (FCALL library, EVALSHA scripts, miniredis) with the vtime model.

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
	"github.com/runqueue/runqueue/vtime"
)

// partialForms are the three ways the flag-on scripts run.
var partialForms = []struct {
	name        string
	client      func(testing.TB) redis.UniversalClient
	scriptsOnly bool
}{
	{"Mini", redistest.Mini, false},
	{"RealFCALL", redistest.Real, false},
	{"RealEVALSHA", redistest.Real, true},
}

// seedPartialState stores a scheduler state whose scalars that a
// registration does not read (e, c, gk, gn) hold values other than their
// defaults, as the scripts store them (the sentinel, the scalars, TTLs),
// without the fields in drop (s's values for them must be the defaults).
func seedPartialState(t require.TestingT, ctx context.Context, c redis.UniversalClient, qk keys.Queue, s vtime.Snapshot, now int64, drop ...string) {
	day := 24 * time.Hour
	fields := []any{"v", s.V, "e", s.Epoch, "c", s.Cursor, "s", max(1, s.NextSeq),
		"x", now + day.Milliseconds(), "gk", s.GK, "gn", max(1, s.GN), "gp", s.GP, "ng", 0, "nw", -1}
	var kept []any
	for i := 0; i < len(fields); i += 2 {
		if !slices.Contains(drop, fields[i].(string)) {
			kept = append(kept, fields[i], fields[i+1])
		}
	}
	_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAdd(ctx, qk.CkVtime(), redis.Z{Score: 0, Member: ""})
		p.HSet(ctx, qk.CkVtimeState(), kept...)
		p.PExpire(ctx, qk.CkVtime(), day)
		p.PExpire(ctx, qk.CkVtimeState(), day)
		return nil
	})
	require.NoError(t, err)
}

// newPartialDiff is newDiff with key limits that gate often, the script
// form chosen, and a seeded state whose e, c, gk, gn are not defaults.
func newPartialDiff(t *testing.T, rt *rapid.T, c redis.UniversalClient, scriptsOnly bool) *diff {
	prefix := redistest.Prefix(t)
	clock := newFakeClock()
	limits := runqueue.Limits{
		Queue: rapid.SampledFrom([]int{0, 0, 0, 9}).Draw(rt, "queueLimit"),
		Key:   rapid.SampledFrom([]int{0, 1, 1, 2}).Draw(rt, "keyLimit"),
	}
	wm := rapid.SampledFrom([]int{1, 2}).Draw(rt, "windowMultiplier")
	idleMax := rapid.SampledFrom([]int{10000, 2}).Draw(rt, "idleMax")
	scan := rapid.SampledFrom([]int{0, 2, 3}).Draw(rt, "scanLimit")
	lease := time.Minute
	lim := &limits
	cfg := &runqueue.Config{
		Prefix: prefix, Clock: clock, VtimeScheduling: true, MaxAttempts: 3, ScriptsOnly: scriptsOnly,
		LimitsFor:        func(string, string) runqueue.Limits { return *lim },
		WindowMultiplier: wm, IdleMaxEntries: idleMax, LeaseDuration: lease, ScanLimit: scan,
	}
	ctx := context.Background()
	q, err := runqueue.New(ctx, c, cfg)
	require.NoError(t, err)
	nkeys := rapid.IntRange(2, 9).Draw(rt, "keys")
	ks := []string{"", "a", "b:c", "*", "{d}", "é", "z z", "k7", "k8"}[:nkeys]
	space, err := keys.NewSpace(prefix, q.Shards())
	require.NoError(t, err)
	qk := space.Env(diffEnv).Queue(diffQueue)
	mcfg := vtime.Config{
		WindowMultiplier: wm, IdleMaxEntries: idleMax, MaxAttempts: 3, ScanLimit: scan,
		Limits: vtime.Limits{Queue: limits.Queue, Key: limits.Key},
	}
	seed := vtime.Snapshot{
		V:       int64(rapid.IntRange(0, 50).Draw(rt, "v")) * vtime.Unit,
		Epoch:   int64(rapid.IntRange(1, 5).Draw(rt, "epoch")),
		Cursor:  rapid.IntRange(0, 4).Draw(rt, "cursor"),
		NextSeq: int64(rapid.IntRange(1, 70).Draw(rt, "nextSeq")),
		GK:      rapid.IntRange(0, 3).Draw(rt, "gk"),
		GN:      int64(rapid.IntRange(1, 9).Draw(rt, "gn")),
	}
	if rapid.IntRange(0, 2).Draw(rt, "edge") == 0 {
		// a few serves before the rebase: a call that promotes a new key
		// also rebases, and adds to the stored epoch
		seed.V = int64(vtime.RebaseAt - rapid.IntRange(1, 20).Draw(rt, "serves before the rebase")*vtime.Unit)
	}
	// A hash may lack scalars (a state written by an older version, or by
	// hand): the scripts read each missing one as its default.
	var drop []string
	for _, f := range []string{"e", "c", "s", "x", "gk", "gn", "gp", "ng", "nw"} {
		if rapid.IntRange(0, 4).Draw(rt, "drop "+f) == 0 {
			drop = append(drop, f)
			switch f {
			case "e":
				seed.Epoch = 0
			case "c":
				seed.Cursor = 0
			case "s":
				seed.NextSeq = 1
			case "gk":
				seed.GK = 0
			case "gn":
				seed.GN = 1
			}
		}
	}
	m := vtime.Restore(mcfg, seed)
	seedPartialState(t, ctx, c, qk, seed, clock.Now().UnixMilli(), drop...)
	return &diff{
		ctx: ctx, c: c, q: q, clock: clock, env: diffEnv, queue: diffQueue,
		qk: qk, keys: ks, lease: lease, limits: lim, m: m,
		inflight: map[string]*runqueue.Run{}, ttl: map[string]int64{}, dead: map[string]string{},
	}
}

// enqueueMany queues n runs of random keys in one EnqueueMany (from 32
// runs the script writes them in bulk and registers the keys after), some
// delayed so that a later dequeue promotes them.
func (d *diff) enqueueManyRuns(rt *rapid.T) {
	n := rapid.SampledFrom([]int{2, 5, 31, 32, 40}).Draw(rt, "batch")
	delayed := rapid.Bool().Draw(rt, "some delayed")
	now := d.now()
	params := make([]runqueue.EnqueueParams, n)
	for i := range params {
		d.nextID++
		id := "r" + strconv.Itoa(d.nextID)
		key := rapid.SampledFrom(d.keys).Draw(rt, "key")
		delay := time.Duration(0)
		if delayed {
			delay = time.Duration(rapid.SampledFrom([]int{0, 5}).Draw(rt, "delay")) * time.Second
		}
		params[i] = runqueue.EnqueueParams{Env: d.env, Queue: d.queue, Key: key, ID: id, Payload: []byte(id), Delay: delay}
	}
	res, err := d.q.EnqueueMany(d.ctx, params)
	require.NoError(rt, err)
	for i, p := range params {
		require.NoError(rt, res[i].Err)
		require.True(rt, res[i].Queued)
		require.NoError(rt, d.m.Enqueue(p.ID, p.Key, 0, now+p.Delay.Milliseconds(), now))
	}
}

// pickInflightMany draws up to k distinct runs in flight.
func (d *diff) pickInflightMany(rt *rapid.T, k int) []*runqueue.Run {
	ids := sortedKeys(d.inflight)
	var out []*runqueue.Run
	for _, id := range ids {
		if len(out) < k && rapid.Bool().Draw(rt, "pick "+id) {
			out = append(out, d.inflight[id])
		}
	}
	return out
}

// ackAndDequeue acks some runs and dequeues in one call (the dequeue script
// with acks: released slots un-gate, then promotion registers).
func (d *diff) ackAndDequeue(rt *rapid.T) {
	acks := d.pickInflightMany(rt, 4)
	n := rapid.IntRange(1, 6).Draw(rt, "maxCount")
	now := d.now()
	runs, errs, err := d.q.AckAndDequeue(d.ctx, acks, d.env, d.queue, n)
	require.NoError(rt, err)
	for i, r := range acks {
		require.NoError(rt, errs[i])
		require.NoError(rt, d.m.Ack(r.ID))
		delete(d.inflight, r.ID)
	}
	want := d.delivered(first(d.m.DequeueCalls(n, now, runqueue.MaxCorruptCalls, true)))
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
	require.Equal(rt, exp, got, "ackAndDequeue(%d acks, %d) served", len(acks), n)
}

// ackMany acks some runs in one ack call.
func (d *diff) ackMany(rt *rapid.T) {
	acks := d.pickInflightMany(rt, 5)
	if len(acks) == 0 {
		return
	}
	errs, err := d.q.AckMany(d.ctx, acks)
	require.NoError(rt, err)
	for i, r := range acks {
		require.NoError(rt, errs[i])
		require.NoError(rt, d.m.Ack(r.ID))
		delete(d.inflight, r.ID)
	}
}

// nackAll nacks every run in flight, one call each, retry now: keys that
// drained register again (new to the state) in calls that also release
// gated slots.
func (d *diff) nackAll(rt *rapid.T) {
	for _, id := range sortedKeys(d.inflight) {
		r := d.inflight[id]
		res, err := d.q.Nack(d.ctx, r, &runqueue.NackOptions{RetryAt: d.clock.Now()})
		require.NoError(rt, err)
		requeued, err := d.m.Nack(r.ID, d.now(), d.now(), false)
		require.NoError(rt, err)
		require.Equal(rt, requeued, res.Requeued)
		delete(d.inflight, r.ID)
		if !requeued {
			d.dead[r.ID] = r.Key
		}
	}
}

// requireScalars checks every stored scalar the model has against the
// state hash as stored (not through SchedulerSnapshot's defaults: a field
// a script dropped or never wrote back shows here).
func (d *diff) requireScalars(rt *rapid.T, step string) {
	h, err := d.c.HGetAll(d.ctx, d.qk.CkVtimeState()).Result()
	require.NoError(rt, err)
	if len(h) == 0 {
		return
	}
	v, epoch, cursor, nextSeq, gk, gn, gp := d.m.Clock()
	gated := 0
	for _, r := range d.m.Snapshot().Reg {
		if r.Gated {
			gated++
		}
	}
	want := map[string]int64{"v": v, "e": epoch, "c": int64(cursor), "s": nextSeq, "gk": int64(gk), "gn": gn, "gp": gp, "ng": int64(gated)}
	defaults := map[string]int64{"v": 0, "e": 0, "c": 0, "s": 1, "gk": 0, "gn": 1, "gp": 0, "ng": 0}
	for f, w := range want {
		raw, ok := h[f]
		got := defaults[f]
		if ok {
			got, err = strconv.ParseInt(raw, 10, 64)
			require.NoError(rt, err, "field %s = %q", f, raw)
		}
		require.Equal(rt, w, got, "stored %s after %s (hash %v)", f, step, h)
	}
}

// TestReviewPartialBatchDifferential: TestVtimeDifferential's operations
// plus the batch ones (EnqueueMany in bulk and one by one, AckAndDequeue,
// AckMany, a nack of every run in flight), on a state whose e, c, gk, gn
// start away from their defaults, with key limits that gate, on the three
// script forms; every stored scalar is compared with the model after every
// step.
func TestReviewPartialBatchDifferential(t *testing.T) {
	for _, f := range partialForms {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			c := f.client(t)
			steps := 0
			rapid.Check(t, func(rt *rapid.T) {
				d := newPartialDiff(t, rt, c, f.scriptsOnly)
				defer d.q.Close()
				d.requireScalars(rt, "seed")
				n := rapid.IntRange(5, 40).Draw(rt, "steps")
				for i := 0; i < n; i++ {
					op := rapid.IntRange(0, 99).Draw(rt, "op")
					name := ""
					switch {
					case op < 15:
						name = "enqueue"
						d.enqueue(rt)
					case op < 30:
						name = "enqueueMany"
						d.enqueueManyRuns(rt)
					case op < 42:
						name = "dequeue"
						d.dequeue(rt, rapid.IntRange(1, 6).Draw(rt, "maxCount"))
					case op < 55:
						name = "ackAndDequeue"
						d.ackAndDequeue(rt)
					case op < 60:
						name = "ack"
						d.ack(rt)
					case op < 66:
						name = "ackMany"
						d.ackMany(rt)
					case op < 71:
						name = "nack"
						d.nack(rt)
					case op < 74:
						name = "nackAll"
						d.nackAll(rt)
					case op < 84:
						name = "advance"
						d.clock.Advance(time.Duration(rapid.IntRange(1, 10).Draw(rt, "advance")) * time.Second)
					case op < 87:
						name = "recover"
						d.recoverLeases(rt)
					case op < 89:
						name = "redrive"
						d.redrive(rt)
					case op < 92:
						name = "weight"
						d.setWeight(rt)
					case op < 97:
						name = "limits"
						d.setLimits(rt)
					case op < 99:
						name = "expire"
						d.expire(rt)
					default:
						name = "expire state"
						d.expireState(rt)
					}
					step := fmt.Sprintf("step %d (%s)", i, name)
					d.compare(rt, step)
					d.requireScalars(rt, step)
					steps++
				}
			})
			t.Logf("%s: %d steps", f.name, steps)
		})
	}
}

// TestReviewPartialPromoteThenProbe builds, on each script form, the call
// the change splits: a dequeue whose promotion registers a new key (the
// state read partially) and that then probes the gated keys, gates, and
// saves, with e, gn, gk, ng, gp stored away from their defaults; then a
// dequeue that carries acks of gated keys and promotes another new key, a
// nack and a lease recovery that register drained keys, and a bulk
// EnqueueMany of 40 new keys. After each call the stored scalars and the
// whole scheduler state must be the model's.
func TestReviewPartialPromoteThenProbe(t *testing.T) {
	for _, f := range partialForms {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			c := f.client(t)
			ctx := context.Background()
			rapid.Check(t, func(rt *rapid.T) {
				prefix := redistest.Prefix(t)
				clock := newFakeClock()
				limits := runqueue.Limits{Key: 1}
				lim := &limits
				q, err := runqueue.New(ctx, c, &runqueue.Config{Prefix: prefix, Clock: clock, VtimeScheduling: true,
					MaxAttempts: 5, ScriptsOnly: f.scriptsOnly, LeaseDuration: time.Minute,
					LimitsFor: func(string, string) runqueue.Limits { return *lim }})
				require.NoError(rt, err)
				defer q.Close()
				space, err := keys.NewSpace(prefix, q.Shards())
				require.NoError(rt, err)
				qk := space.Env(diffEnv).Queue(diffQueue)
				seed := vtime.Snapshot{V: 7 * vtime.Unit, Epoch: int64(rapid.IntRange(0, 5).Draw(rt, "epoch")),
					NextSeq: int64(rapid.IntRange(1, 70).Draw(rt, "nextSeq")), GN: int64(rapid.IntRange(1, 9).Draw(rt, "gn"))}
				if rapid.Bool().Draw(rt, "at the rebase point") {
					seed.V = vtime.RebaseAt // the first dequeue rebases
				}
				gn := seed.GN
				m := vtime.Restore(vtime.Config{MaxAttempts: 5, Limits: vtime.Limits{Key: 1}}, seed)
				seedPartialState(rt, ctx, c, qk, seed, clock.Now().UnixMilli())
				d := &diff{ctx: ctx, c: c, q: q, clock: clock, env: diffEnv, queue: diffQueue, qk: qk,
					lease: time.Minute, limits: lim, m: m,
					inflight: map[string]*runqueue.Run{}, ttl: map[string]int64{}, dead: map[string]string{}}
				enq := func(key string, delay time.Duration) {
					d.nextID++
					id := "r" + strconv.Itoa(d.nextID)
					now := d.now()
					ok, err := q.Enqueue(ctx, runqueue.EnqueueParams{Env: d.env, Queue: d.queue, Key: key, ID: id, Payload: []byte(id), Delay: delay})
					require.NoError(rt, err)
					require.True(rt, ok)
					require.NoError(rt, m.Enqueue(id, key, 0, now+delay.Milliseconds(), now))
				}
				stored := func() map[string]string {
					h, err := c.HGetAll(ctx, qk.CkVtimeState()).Result()
					require.NoError(rt, err)
					return h
				}
				step := func(name string) {
					d.compare(rt, name)
					d.requireScalars(rt, name)
				}
				for _, k := range []string{"a", "a", "b", "b"} {
					enq(k, 0)
				}
				require.Len(rt, d.dequeue(rt, 2), 2)
				step("serve a and b")
				h := stored()
				require.Equal(rt, "2", h["ng"], "a and b gated: %v", h)
				require.Equal(rt, strconv.FormatInt(gn+2, 10), h["gn"], "%v", h)

				// The promotion registers c first: its call reads v, s, x,
				// nw, lh; the probe needs ng, gp, gk read after.
				enq("c", 5*time.Second)
				clock.Advance(6 * time.Second)
				require.Equal(rt, []string{"c/r5/1"}, d.dequeue(rt, 1))
				step("promote c, probe")
				h = stored()
				require.Equal(rt, strconv.FormatInt(gn, 10), h["gp"], "the probe looked at a (gated first): %v", h)
				require.Equal(rt, "2", h["ng"], "%v", h)
				require.Equal(rt, "1", h["gk"], "%v", h)

				// Once more: the probe moves to b.
				enq("d", 5*time.Second)
				clock.Advance(6 * time.Second)
				require.Equal(rt, []string{"d/r6/1"}, d.dequeue(rt, 1))
				step("promote d, probe")
				require.Equal(rt, strconv.FormatInt(gn+1, 10), stored()["gp"])

				// Acks of a and b (released: un-gated) carried by a dequeue
				// that promotes the new key e.
				enq("e", 5*time.Second)
				clock.Advance(6 * time.Second)
				var acks []*runqueue.Run
				for _, id := range sortedKeys(d.inflight) {
					if r := d.inflight[id]; r.Key == "a" || r.Key == "b" {
						acks = append(acks, r)
					}
				}
				require.Len(rt, acks, 2)
				runs, errs, err := q.AckAndDequeue(ctx, acks, d.env, d.queue, 3)
				require.NoError(rt, err)
				for i, r := range acks {
					require.NoError(rt, errs[i])
					require.NoError(rt, m.Ack(r.ID))
					delete(d.inflight, r.ID)
				}
				want := m.Dequeue(3, d.now())
				require.Len(rt, runs, len(want))
				for i, r := range runs {
					require.Equal(rt, want[i].Key, r.Key)
					d.inflight[r.ID] = r
				}
				step("acks, promote e")

				// Nacks: the drained keys register again (new to the state).
				d.nackAll(rt)
				step("nack all")
				require.NotEmpty(rt, d.dequeue(rt, 6))
				step("serve again")
				d.recoverLeases(rt)
				step("recover")

				// 40 runs of 40 new keys in bulk: 40 registrations in one call.
				before := stored()
				now := d.now()
				params := make([]runqueue.EnqueueParams, 40)
				for i := range params {
					d.nextID++
					id := "r" + strconv.Itoa(d.nextID)
					params[i] = runqueue.EnqueueParams{Env: d.env, Queue: d.queue, Key: "n" + strconv.Itoa(i), ID: id, Payload: []byte(id)}
				}
				res, err := q.EnqueueMany(ctx, params)
				require.NoError(rt, err)
				for i, p := range params {
					require.True(rt, res[i].Queued)
					require.NoError(rt, m.Enqueue(p.ID, p.Key, 0, now, now))
				}
				step("bulk enqueue")
				after := stored()
				for _, f := range []string{"v", "e", "c", "gk", "gn", "gp", "ng"} {
					require.Equal(rt, before[f], after[f], "a registration changed %s", f)
				}
				bs, _ := strconv.Atoi(before["s"])
				require.Equal(rt, strconv.Itoa(bs+40), after["s"])
				require.NotEmpty(rt, d.dequeue(rt, 6))
				step("serve the new keys")
			})
		})
	}
}
