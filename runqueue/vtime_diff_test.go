package runqueue_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
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

// diffSteps counts the operations the differential tests ran, per backend.
var diffSteps sync_counter

type sync_counter struct{ n atomic.Int64 }

// diff drives one random operation sequence through the vtime model and
// through the flag-on Lua on one Redis, comparing after every step.
type diff struct {
	ctx    context.Context
	c      redis.UniversalClient
	q      *runqueue.Queue
	m      *vtime.Model
	clock  *fakeClock
	qk     keys.Queue
	env    string
	queue  string
	nextID int
	keys   []string
	lease  time.Duration

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
	quantum := rapid.SampledFrom([]float64{1, 1, 0.3}).Draw(rt, "quantum")
	idleMax := rapid.SampledFrom([]int{10000, 2}).Draw(rt, "idleMax")
	lease := time.Minute
	cfg := &runqueue.Config{
		Prefix: prefix, Clock: clock, VtimeScheduling: true, MaxAttempts: 3,
		QueueConcurrency: limits.Queue, KeyConcurrency: limits.Key,
		WindowMultiplier: wm, Quantum: quantum, IdleMaxEntries: idleMax, LeaseDuration: lease,
	}
	ctx := context.Background()
	q, err := runqueue.New(ctx, c, cfg)
	require.NoError(t, err)
	nkeys := rapid.IntRange(1, 9).Draw(rt, "keys")
	ks := []string{"", "a", "b:c", "*", "{d}", "é", "z z", "k7", "k8"}[:nkeys]
	space, err := keys.NewSpace(prefix, q.Shards())
	require.NoError(t, err)
	return &diff{
		ctx: ctx, c: c, q: q, clock: clock, env: diffEnv, queue: diffQueue,
		qk:   space.Env(diffEnv).Queue(diffQueue),
		keys: ks, lease: lease,
		m: vtime.New(vtime.Config{
			Quantum: quantum, WindowMultiplier: wm, IdleMaxEntries: idleMax, MaxAttempts: 3,
			Limits: vtime.Limits{Queue: limits.Queue, Key: limits.Key},
		}),
		inflight: map[string]*runqueue.Run{}, ttl: map[string]int64{}, dead: map[string]string{},
	}
}

func (d *diff) now() int64 { return d.clock.Now().UnixMilli() }

func (d *diff) enqueue(rt *rapid.T) {
	d.nextID++
	id := "r" + strconv.Itoa(d.nextID)
	key := rapid.SampledFrom(d.keys).Draw(rt, "key")
	prio := rapid.SampledFrom([]int{0, 0, 0, 1, 9}).Draw(rt, "priority")
	delay := time.Duration(rapid.SampledFrom([]int{0, 0, 0, 5, 40}).Draw(rt, "delay")) * time.Second
	ttl := time.Duration(rapid.SampledFrom([]int{0, 0, 0, 20, 90}).Draw(rt, "ttl")) * time.Second
	now := d.now()
	ok, err := d.q.Enqueue(d.ctx, runqueue.EnqueueParams{Env: d.env, Queue: d.queue, Key: key, ID: id,
		Payload: []byte(id), Priority: prio, Delay: delay, TTL: ttl})
	require.NoError(rt, err)
	require.True(rt, ok)
	require.NoError(rt, d.m.Enqueue(id, key, prio, now+delay.Milliseconds(), now))
	if ttl > 0 {
		d.ttl[id] = now + ttl.Milliseconds()
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
	want := d.m.Dequeue(n, now)
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
	require.Equal(rt, exp, got, "dequeue(%d) served", n)
	require.Equal(rt, got, predicted, "Preview(%d) predicted", n)
	return got
}

func (d *diff) pickInflight(rt *rapid.T) *runqueue.Run {
	if len(d.inflight) == 0 {
		return nil
	}
	ids := sortedKeys(d.inflight)
	return d.inflight[rapid.SampledFrom(ids).Draw(rt, "inflight")]
}

func (d *diff) ack(rt *rapid.T) {
	r := d.pickInflight(rt)
	if r == nil {
		return
	}
	require.NoError(rt, d.q.Ack(d.ctx, r))
	require.NoError(rt, d.m.Ack(r.ID))
	delete(d.inflight, r.ID)
}

func (d *diff) nack(rt *rapid.T) {
	r := d.pickInflight(rt)
	if r == nil {
		return
	}
	retry := d.clock.Now().Add(time.Duration(rapid.SampledFrom([]int{0, 0, 3, 30}).Draw(rt, "retry")) * time.Second)
	kill := rapid.IntRange(0, 9).Draw(rt, "kill") == 0
	res, err := d.q.Nack(d.ctx, r, &runqueue.NackOptions{RetryAt: retry, DeadLetter: kill})
	require.NoError(rt, err)
	requeued, err := d.m.Nack(r.ID, retry.UnixMilli(), d.now(), kill)
	require.NoError(rt, err)
	require.Equal(rt, requeued, res.Requeued)
	delete(d.inflight, r.ID)
	if !requeued {
		d.dead[r.ID] = r.Key
	}
}

// recoverLeases expires every lease, in the order Redis sweeps them.
func (d *diff) recoverLeases(rt *rapid.T) {
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
	n, err := d.q.RecoverLeases(d.ctx, d.q.ShardOf(d.env), 1000)
	require.NoError(rt, err)
	require.Equal(rt, len(order), n)
	for _, h := range order {
		requeued, err := d.m.Recover(h.id, now)
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
	raw, err := d.c.HGet(d.ctx, d.qk.Meta(), keys.Segment(id)).Result()
	if err != nil {
		return ""
	}
	vm := strings.Split(raw, "|")[4]
	k, _ := keys.DecodeVariantMember(vm)
	return k
}

func (d *diff) redrive(rt *rapid.T) {
	if len(d.dead) == 0 {
		return
	}
	id := rapid.SampledFrom(sortedKeys(d.dead)).Draw(rt, "dead")
	require.NoError(rt, d.q.Redrive(d.ctx, d.env, d.queue, d.dead[id], id))
	require.NoError(rt, d.m.Redrive(id, d.now()))
	delete(d.dead, id)
}

func (d *diff) setWeight(rt *rapid.T) {
	key := rapid.SampledFrom(d.keys).Draw(rt, "weightKey")
	w := rapid.SampledFrom([]float64{0, 0.01, 0.5, 2, 3, 100}).Draw(rt, "weight")
	if w == 0 {
		require.NoError(rt, d.q.ClearWeight(d.ctx, d.env, d.queue, key))
	} else {
		require.NoError(rt, d.q.SetWeight(d.ctx, d.env, d.queue, key, w))
	}
	d.m.SetWeight(key, w)
}

// compare checks that Redis holds exactly the model's scheduler state.
func (d *diff) compare(rt *rapid.T, step string) {
	zs := func(key string) []vtime.Entry {
		z, err := d.c.ZRangeWithScores(d.ctx, key, 0, -1).Result()
		require.NoError(rt, err)
		out := []vtime.Entry{}
		for _, e := range z {
			out = append(out, vtime.Entry{Member: e.Member.(string), Score: e.Score})
		}
		return out
	}
	orEmpty := func(e []vtime.Entry) []vtime.Entry {
		if e == nil {
			return []vtime.Entry{}
		}
		return e
	}
	require.Equal(rt, orEmpty(d.m.Tags()), zs(d.qk.CkVtime()), "ckVtime after %s", step)
	require.Equal(rt, orEmpty(d.m.Idle()), zs(d.qk.CkVtimeIdle()), "ckVtimeIdle after %s", step)
	require.Equal(rt, orEmpty(d.m.CkIndex()), zs(d.qk.CkIndex()), "ckIndex after %s", step)
	v, l, c := readFloor(rt, d.ctx, d.c, d.qk.CkVtimeFloor())
	require.Equal(rt, d.m.V, v, "V after %s", step)
	require.Equal(rt, d.m.Cursor, c, "cursor after %s", step)
	if d.m.HasL {
		require.Equal(rt, strconv.FormatFloat(d.m.L, 'g', 17, 64), l, "L after %s", step)
	} else {
		require.Equal(rt, "", l, "L after %s", step)
	}
}

// readFloor parses ckVtimeFloor "V|L|c|nw"; a missing key is V 0, no L.
func readFloor(t require.TestingT, ctx context.Context, c redis.UniversalClient, key string) (float64, string, int) {
	raw, err := c.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		return 0, "", 0
	}
	require.NoError(t, err)
	f := strings.Split(raw, "|")
	require.Len(t, f, 4, raw)
	v, err := strconv.ParseFloat(f[0], 64)
	require.NoError(t, err)
	l := ""
	if f[1] != "" {
		lf, err := strconv.ParseFloat(f[1], 64)
		require.NoError(t, err)
		l = strconv.FormatFloat(lf, 'g', 17, 64)
	}
	cur, err := strconv.Atoi(f[2])
	require.NoError(t, err)
	return v, l, cur
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestVtimeDifferential runs random operation sequences through the model
// and the flag-on Lua and requires identical serves, tags, V, cursor, last
// newcomer tag, idle entries and ckIndex after every step.
func TestVtimeDifferential(t *testing.T) {
	for _, b := range backends[:2] {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			c := b.client(t)
			var steps int
			rapid.Check(t, func(rt *rapid.T) {
				d := newDiff(t, rt, c)
				defer d.q.Close()
				n := rapid.IntRange(5, 60).Draw(rt, "steps")
				for i := 0; i < n; i++ {
					op := rapid.IntRange(0, 99).Draw(rt, "op")
					name := ""
					switch {
					case op < 35:
						name = "enqueue"
						d.enqueue(rt)
					case op < 60:
						name = "dequeue"
						d.dequeue(rt, rapid.IntRange(1, 6).Draw(rt, "maxCount"))
					case op < 70:
						name = "ack"
						d.ack(rt)
					case op < 78:
						name = "nack"
						d.nack(rt)
					case op < 86:
						name = "advance"
						d.clock.Advance(time.Duration(rapid.IntRange(1, 45).Draw(rt, "advance")) * time.Second)
					case op < 89:
						name = "recover"
						d.recoverLeases(rt)
					case op < 93:
						name = "expire"
						d.expire(rt)
					case op < 96:
						name = "redrive"
						d.redrive(rt)
					default:
						name = "weight"
						d.setWeight(rt)
					}
					d.compare(rt, fmt.Sprintf("step %d (%s)", i, name))
					steps++
				}
			})
			diffSteps.n.Add(int64(steps))
			t.Logf("%s: %d differential steps", b.name, steps)
		})
	}
}
