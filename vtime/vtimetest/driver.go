// Package vtimetest states the fair scheduler's properties once, over a
// small Driver interface, so that each runs on every implementation: the
// model (vtime.Model, in vtime's tests) and the Lua (runqueue's tests, on
// miniredis and on a real Redis).
//
// A property is a function of a *rapid.T and a Factory; those that report
// statistics over all their checks (how many were compared, skipped or
// tight) come as a constructor returning the check and a done func to call
// after rapid.Check. Test names: the model runs property X as
// TestPropX in package vtime, the Lua as TestVtimePropX in package
// runqueue, each with a subtest per backend (Mini, Real) and, where a name
// holds two statements, per statement (e.g. NoDebtWait/Bound and
// NoDebtWait/Discovered).
//
// Times are milliseconds on the driver's clock. A Driver's Dequeue does not
// move the clock: a property moves it with Advance where it means to.
package vtimetest

import (
	"strconv"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/vtime"
)

// T is what a Driver needs of a test: a *rapid.T or a *testing.T.
type T = require.TestingT

// Config is what a property varies between its checks; the zero value of
// a field is the implementation's default (runqueue.Config's).
type Config struct {
	WM           int     // WindowMultiplier
	Quantum      float64 // reporting unit of V in the Lua; scheduling does not depend on it
	IdleMax      int     // IdleMaxEntries
	MaxAttempts  int     // 0: the default (5); -1: no limit
	ScanLimit    int
	PromoteLimit int
	Limits       vtime.Limits // Key and Queue (Env is not used)
}

// Run is a served run: its id as the property's Enqueue returned it.
type Run struct {
	ID      string
	Key     string
	Attempt int
}

// String is the run as key/id/attempt.
func (r Run) String() string { return r.Key + "/" + r.ID + "/" + strconv.Itoa(r.Attempt) }

// Driver is one base queue under the fair scheduler, with a clock.
type Driver interface {
	// Now is the clock in ms; Advance moves it (and every driver sharing it).
	Now() int64
	Advance(ms int64)
	// Enqueue queues one run of key with priority prio, available at at
	// (a flag-on enqueue), and returns its id.
	Enqueue(t T, key string, prio int, at int64) string
	// EnqueueFlagOff queues one run of key available at at the way a
	// flag-off instance does: work without a tag.
	EnqueueFlagOff(t T, key string, at int64) string
	// Dequeue is one flag-on call of maxCount at Now().
	Dequeue(t T, maxCount int) []Run
	Ack(t T, r Run)
	// Nack requeues r at retryAt, or dead-letters it.
	Nack(t T, r Run, retryAt int64, deadLetter bool)
	// SetWeight sets key's weight; 0 clears it.
	SetWeight(t T, key string, w float64)
	// Ready counts key's ready runs; Delayed its delayed runs available at
	// or before due.
	Ready(t T, key string) int
	Delayed(t T, key string, due int64) int
	// InFlight counts the runs in flight of key, or of the queue for "".
	InFlight(t T, key string) int
	// Snapshot is the scheduler state as stored.
	Snapshot(t T) vtime.Snapshot
	// Indexes are ckIndex (variant -> ready head score) and the delay index
	// (variant -> earliest delayed time), in sorted-set order.
	Indexes(t T) (ck, delay []vtime.Entry)
	// ExpireState drops the scheduler state whole, as the state TTL does.
	ExpireState(t T)
}

// Factory makes fresh drivers for one check.
type Factory interface {
	New(rt *rapid.T, cfg Config) Driver
	// Pair returns two drivers under cfg on one clock: Advance on either
	// moves both.
	Pair(rt *rapid.T, cfg Config) (Driver, Driver)
}

const eps = 1e-9

// enq queues n runs of key available delay ms from now.
func enq(t T, d Driver, key string, n int, delay int64, prio int) []string {
	var ids []string
	for i := 0; i < n; i++ {
		ids = append(ids, d.Enqueue(t, key, prio, d.Now()+delay))
	}
	return ids
}

// deq is one dequeue call, then the clock moves 1 ms.
func deq(t T, d Driver, n int) []Run {
	runs := d.Dequeue(t, n)
	d.Advance(1)
	return runs
}

func ack(t T, d Driver, runs ...Run) {
	for _, r := range runs {
		d.Ack(t, r)
	}
}

func topUp(t T, d Driver, key string, n int) {
	if k := d.Ready(t, key); k < n {
		enq(t, d, key, n-k, 0, 0)
	}
}

// V is the logical clock in serves at weight 1.
func V(s vtime.Snapshot) float64 {
	return (float64(s.Epoch)*vtime.RebaseBy + float64(s.V)) / vtime.Unit
}

// Tags lists the registrations in competition order (gated last), score
// the tag in serves at weight 1.
func Tags(s vtime.Snapshot) []vtime.Entry {
	m := vtime.Restore(vtime.Config{}, s)
	var out []vtime.Entry
	for _, r := range m.Registered() {
		out = append(out, vtime.Entry{Member: r.Member, Score: float64(r.U) / vtime.Unit})
	}
	return out
}

// Idle lists the parked tags (serves at weight 1) in sorted-set order.
func Idle(s vtime.Snapshot) []vtime.Entry {
	var out []vtime.Entry
	for _, e := range vtime.Restore(vtime.Config{}, s).Idle() {
		out = append(out, vtime.Entry{Member: e.Member, Score: e.Score / vtime.Unit})
	}
	return out
}

func tag(t T, d Driver, key string) (float64, bool) {
	r, ok := d.Snapshot(t).Reg[keys.VariantMember(key)]
	return float64(r.U) / vtime.Unit, ok
}

// exactTag is key's tag with its stride remainder (U + R/milli-weight, in
// serves at weight 1): U alone is rounded down to a unit, which can
// understate |S_i - S_j| by up to a unit (1e-6 serves), more than the
// properties' tolerance.
func exactTag(t T, d Driver, key string) float64 {
	s := d.Snapshot(t)
	vm := keys.VariantMember(key)
	r := s.Reg[vm]
	mw := vtime.Restore(vtime.Config{}, s).MilliWeight(vm)
	return (float64(r.U) + float64(r.R)/float64(mw)) / vtime.Unit
}

// queuedInLane reports whether key waits in the newcomer lane behind its
// head (registered without a tag).
func queuedInLane(t T, d Driver, key string) bool {
	s := d.Snapshot(t)
	r, ok := s.Reg[keys.VariantMember(key)]
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

func byKeys(runs []Run) []string {
	out := make([]string, len(runs))
	for i, r := range runs {
		out[i] = r.Key
	}
	return out
}

func strs(runs []Run) []string {
	var out []string
	for _, r := range runs {
		out = append(out, r.String())
	}
	return out
}

func keyOf(t T, member string) string {
	k, err := keys.DecodeVariantMember(member)
	require.NoError(t, err)
	return k
}
