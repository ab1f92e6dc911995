package vtime_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/vtime"
	"github.com/runqueue/runqueue/vtime/vtimetest"
)

// The properties of package vtimetest, on the model. runqueue's
// vtime_props_test.go runs the same functions on the Lua.

// modelStart is where a model's clock starts (ms): far enough from 0 for
// properties that enqueue an hour in the past.
const modelStart = 10_000_000

// modelDriver is a vtimetest.Driver over one vtime.Model.
type modelDriver struct {
	m    *vtime.Model
	now  *int64 // shared by the drivers of a Pair
	next int
}

type modelFactory struct{}

func modelConfig(c vtimetest.Config) vtime.Config {
	attempts := c.MaxAttempts
	switch {
	case attempts == 0:
		attempts = 5 // runqueue.Config's default
	case attempts < 0:
		attempts = 0 // none
	}
	return vtime.Config{WindowMultiplier: c.WM, IdleMaxEntries: c.IdleMax, MaxAttempts: attempts,
		ScanLimit: c.ScanLimit, PromoteLimit: c.PromoteLimit, Limits: vtime.Limits{Key: c.Limits.Key, Queue: c.Limits.Queue}}
}

func (modelFactory) New(_ *rapid.T, cfg vtimetest.Config) vtimetest.Driver {
	now := int64(modelStart)
	return &modelDriver{m: vtime.New(modelConfig(cfg)), now: &now}
}

func (modelFactory) Pair(_ *rapid.T, cfg vtimetest.Config) (vtimetest.Driver, vtimetest.Driver) {
	now := int64(modelStart)
	return &modelDriver{m: vtime.New(modelConfig(cfg)), now: &now}, &modelDriver{m: vtime.New(modelConfig(cfg)), now: &now}
}

func (d *modelDriver) Now() int64       { return *d.now }
func (d *modelDriver) Advance(ms int64) { *d.now += ms }

func (d *modelDriver) id() string {
	d.next++
	return fmt.Sprintf("r%d", d.next)
}

func (d *modelDriver) Enqueue(t vtimetest.T, key string, prio int, at int64) string {
	id := d.id()
	require.NoError(t, d.m.Enqueue(id, key, prio, at, *d.now))
	return id
}

func (d *modelDriver) EnqueueFlagOff(_ vtimetest.T, key string, at int64) string {
	id := d.id()
	vtime.FlagOffEnqueue(d.m, id, key, at)
	return id
}

func (d *modelDriver) Dequeue(t vtimetest.T, maxCount int) []vtimetest.Run {
	var out []vtimetest.Run
	for _, s := range d.m.Dequeue(maxCount, *d.now) {
		id, err := keys.DecodeSegment(s.ID)
		require.NoError(t, err)
		out = append(out, vtimetest.Run{ID: id, Key: s.Key, Attempt: s.Attempt})
	}
	return out
}

func (d *modelDriver) Ack(t vtimetest.T, r vtimetest.Run) { require.NoError(t, d.m.Ack(r.ID)) }

func (d *modelDriver) Nack(t vtimetest.T, r vtimetest.Run, retryAt int64, deadLetter bool) {
	_, err := d.m.Nack(r.ID, retryAt, *d.now, deadLetter)
	require.NoError(t, err)
}

func (d *modelDriver) SetWeight(_ vtimetest.T, key string, w float64) { d.m.SetWeight(key, w) }

func (d *modelDriver) Ready(t vtimetest.T, key string) int {
	n := 0
	for _, r := range d.m.Snapshot().Runs {
		if r.Key == key && !r.Delayed {
			n++
		}
	}
	return n
}

func (d *modelDriver) Delayed(t vtimetest.T, key string, due int64) int {
	n := 0
	for _, r := range d.m.Snapshot().Runs {
		if r.Key == key && r.Delayed && r.At <= due {
			n++
		}
	}
	return n
}

func (d *modelDriver) InFlight(_ vtimetest.T, key string) int {
	in := d.m.Snapshot().InFlight
	if key != "" {
		return in[keys.VariantMember(key)]
	}
	n := 0
	for _, c := range in {
		n += c
	}
	return n
}

func (d *modelDriver) Snapshot(vtimetest.T) vtime.Snapshot { return d.m.Snapshot() }

func (d *modelDriver) Indexes(vtimetest.T) (ck, delay []vtime.Entry) {
	return d.m.CkIndex(), d.m.DelayIndex()
}

func (d *modelDriver) ExpireState(vtimetest.T) { d.m.ExpireState() }

// check runs prop as a rapid check on the model.
func check(t *testing.T, prop func(*rapid.T, vtimetest.Factory)) {
	t.Helper()
	rapid.Check(t, func(rt *rapid.T) { prop(rt, modelFactory{}) })
}

// TestPropNoDebtWait: vtimetest.NoDebtWaitBound and NoDebtWaitDiscovered.
func TestPropNoDebtWait(t *testing.T) {
	t.Parallel()
	t.Run("Bound", func(t *testing.T) { t.Parallel(); check(t, vtimetest.NoDebtWaitBound) })
	t.Run("Discovered", func(t *testing.T) { t.Parallel(); check(t, vtimetest.NoDebtWaitDiscovered) })
}

// TestPropReachability: vtimetest.ReachabilityServed and
// ReachabilityDiscovery.
func TestPropReachability(t *testing.T) {
	t.Parallel()
	t.Run("Served", func(t *testing.T) { t.Parallel(); check(t, vtimetest.ReachabilityServed) })
	t.Run("Discovery", func(t *testing.T) {
		t.Parallel()
		prop, done := vtimetest.ReachabilityDiscovery()
		check(t, prop)
		done(t)
	})
}

// TestPropBatchInvarianceObserved: vtimetest.BatchInvarianceObserved (the
// conditions seen from outside); TestPropBatchInvariance checks the exact
// conditions on the model's state.
func TestPropBatchInvarianceObserved(t *testing.T) {
	t.Parallel()
	check(t, vtimetest.BatchInvarianceObserved)
}

// TestPropLagBound: vtimetest.LagBound.
func TestPropLagBound(t *testing.T) {
	t.Parallel()
	check(t, vtimetest.LagBound)
}

// TestPropNoCredit: vtimetest.NoCredit in each mode.
func TestPropNoCredit(t *testing.T) {
	t.Parallel()
	for _, mode := range vtimetest.NoCreditModes {
		t.Run(mode, func(t *testing.T) { t.Parallel(); check(t, vtimetest.NoCredit(mode)) })
	}
}

// TestPropWorkConservation: vtimetest.WorkConservation.
func TestPropWorkConservation(t *testing.T) {
	t.Parallel()
	check(t, vtimetest.WorkConservation)
}
