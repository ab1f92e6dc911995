package runqueue_test

import (
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/runqueue/runqueue/runqueue"
	"github.com/runqueue/runqueue/vtime"
	"github.com/runqueue/runqueue/vtime/vtimetest"
)

// vpDriver is a vtimetest.Driver over one base queue of a vpPool: the
// flag-on instance serves, the flag-off instance writes untagged work.
type vpDriver struct {
	p    *vp
	held map[string]*runqueue.Run // id -> run in flight
}

// vpFactory makes the drivers of one property on one backend from its
// pool.
type vpFactory struct{ pl *vpPool }

func vpConfigOf(c vtimetest.Config) vpConfig {
	return vpConfig{WM: c.WM, Quantum: c.Quantum, IdleMax: c.IdleMax, MaxAttempts: c.MaxAttempts,
		ScanLimit: c.ScanLimit, PromoteLimit: c.PromoteLimit,
		Limits: runqueue.Limits{Key: c.Limits.Key, Queue: c.Limits.Queue}}
}

func (f vpFactory) New(_ *rapid.T, cfg vtimetest.Config) vtimetest.Driver {
	return &vpDriver{p: f.pl.get(vpConfigOf(cfg)), held: map[string]*runqueue.Run{}}
}

// Pair: the queues of one pool share its clock.
func (f vpFactory) Pair(rt *rapid.T, cfg vtimetest.Config) (vtimetest.Driver, vtimetest.Driver) {
	return f.New(rt, cfg), f.New(rt, cfg)
}

func (d *vpDriver) Now() int64       { return d.p.clock.Now().UnixMilli() }
func (d *vpDriver) Advance(ms int64) { d.p.clock.Advance(time.Duration(ms) * time.Millisecond) }

func (d *vpDriver) Enqueue(t vtimetest.T, key string, prio int, at int64) string {
	p := d.p
	if delay := at - d.Now(); delay >= 0 {
		return p.enq(t, p.on, key, 1, time.Duration(delay)*time.Millisecond, prio)[0]
	}
	p.next++
	id := "r" + strconv.Itoa(p.next)
	ok, err := p.on.Enqueue(p.ctx, runqueue.EnqueueParams{Env: vpEnv, Queue: p.queue, Key: key, ID: id,
		Payload: []byte(id), AvailableAt: time.UnixMilli(at), Priority: prio})
	require.NoError(t, err)
	require.True(t, ok)
	return id
}

func (d *vpDriver) EnqueueFlagOff(t vtimetest.T, key string, at int64) string {
	return d.p.enqAt(t, d.p.off, key, time.UnixMilli(at))
}

func (d *vpDriver) Dequeue(t vtimetest.T, maxCount int) []vtimetest.Run {
	runs, err := d.p.on.Dequeue(d.p.ctx, vpEnv, d.p.queue, maxCount)
	require.NoError(t, err)
	var out []vtimetest.Run
	for _, r := range runs {
		d.held[r.ID] = r
		out = append(out, vtimetest.Run{ID: r.ID, Key: r.Key, Attempt: r.Attempt})
	}
	return out
}

func (d *vpDriver) run(t vtimetest.T, r vtimetest.Run) *runqueue.Run {
	run, ok := d.held[r.ID]
	require.True(t, ok, "%s is not in flight", r.ID)
	delete(d.held, r.ID)
	return run
}

func (d *vpDriver) Ack(t vtimetest.T, r vtimetest.Run) { d.p.ack(t, d.run(t, r)) }

func (d *vpDriver) Nack(t vtimetest.T, r vtimetest.Run, retryAt int64, deadLetter bool) {
	_, err := d.p.on.Nack(d.p.ctx, d.run(t, r), &runqueue.NackOptions{RetryAt: time.UnixMilli(retryAt), DeadLetter: deadLetter})
	require.NoError(t, err)
}

func (d *vpDriver) SetWeight(t vtimetest.T, key string, w float64) {
	if w == 0 {
		require.NoError(t, d.p.on.ClearWeight(d.p.ctx, vpEnv, d.p.queue, key))
		return
	}
	d.p.setWeight(t, key, w)
}

func (d *vpDriver) Ready(t vtimetest.T, key string) int { return d.p.ready(t, key) }

func (d *vpDriver) Delayed(t vtimetest.T, key string, due int64) int {
	upTo := "+inf"
	if due != math.MaxInt64 {
		upTo = strconv.FormatInt(due, 10)
	}
	n, err := d.p.c.ZCount(d.p.ctx, d.p.qk.Variant(key).Delayed(), "-inf", upTo).Result()
	require.NoError(t, err)
	return int(n)
}

func (d *vpDriver) InFlight(t vtimetest.T, key string) int {
	if key == "" {
		// (the queue's count: the held hash less its wide mark)
		s, err := d.p.on.QueueStats(d.p.ctx, vpEnv, d.p.queue)
		require.NoError(t, err)
		return int(s.InFlight)
	}
	n, err := d.p.on.KeyInflight(d.p.ctx, vpEnv, d.p.queue, key)
	require.NoError(t, err)
	return n
}

func (d *vpDriver) Snapshot(t vtimetest.T) vtime.Snapshot { return d.p.snap(t) }

func (d *vpDriver) Indexes(t vtimetest.T) (ck, delay []vtime.Entry) {
	return d.p.zset(t, d.p.qk.CkIndex()), d.p.zset(t, d.p.qk.DelayIndex())
}

func (d *vpDriver) ExpireState(t vtimetest.T) {
	require.NoError(t, d.p.c.Del(d.p.ctx, d.p.qk.CkVtime(), d.p.qk.CkVtimeState()).Err())
}

// vpProp runs a vtimetest property as a rapid check on miniredis and on
// a real Redis.
func vpProp(t *testing.T, prop func(*rapid.T, vtimetest.Factory)) {
	t.Helper()
	vpPropDone(t, func() (func(*rapid.T, vtimetest.Factory), func(testing.TB)) { return prop, nil })
}

// vpPropDone is vpProp for a property with a done func, made afresh per
// backend.
func vpPropDone(t *testing.T, mk func() (func(*rapid.T, vtimetest.Factory), func(testing.TB))) {
	t.Helper()
	for _, b := range backends[:2] {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			f := vpFactory{pl: newVPPool(t, b.Client(t))}
			prop, done := mk()
			rapid.Check(t, func(rt *rapid.T) { prop(rt, f) })
			if done != nil {
				done(t)
			}
		})
	}
}

var (
	_ vtimetest.Driver  = (*vpDriver)(nil)
	_ vtimetest.Factory = vpFactory{}
)
