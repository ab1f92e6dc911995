package vtime

// Findings: each test states what doc.go promises and a minimal sequence
// on which the model does otherwise. They fail until the model (or the
// doc) is fixed.

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// Gating: a variant gated under a lower limit competes again "within
// ceil(gated/UngateChunk) calls of its limit rising". The sweep counts the
// variants gated at the rise (gs) but spends that count on the lowest gated
// tags at each call, and variants gated under the new limit in between
// (served after their return) sort before the old ones with high tags: the
// old ones are left gated, below their limit, until the probe walks to
// them (one rank a call, here about 500 calls).
func TestBugSweepStrandsVariantsGatedUnderTheLowerLimit(t *testing.T) {
	t.Parallel()
	m := New(Config{Limits: Limits{Key: 1}, ScanLimit: 1})
	var old []string
	for i := 0; i < 5; i++ { // high tags: weight 0.01, served once
		k := fmt.Sprintf("z%d", i)
		m.SetWeight(k, 0.01)
		add(t, m, k, 3, 0, 0)
		old = append(old, k)
	}
	for i := 0; i < UngateChunk; i++ {
		add(t, m, fmt.Sprintf("a%04d", i), 3, 0, 0)
	}
	require.Len(t, m.Dequeue(UngateChunk+5, 0), UngateChunk+5)
	require.Equal(t, UngateChunk+5, gatedCount(m))
	require.Equal(t, 100*U, mustReg(t, m, "z0").U)

	m.SetLimits(Limits{Key: 2})
	require.Len(t, m.Dequeue(500, 0), 500) // 500 of the a's reach 2 and are gated again
	m.Dequeue(1, 0)
	m.Dequeue(1, 0)
	require.Equal(t, 0, m.gs, "the sweep is over")
	require.Empty(t, gatedBelowLimit(m), "3 calls after the rise, variants gated under limit 1 are still gated below limit 2")
}

// Registration: "a low-weight key's huge tag cannot push [newcomers] back
// (the cap at V+Unit), and the anchor L can never be above a tag registered
// now, so expired ... keys cannot push later newcomers back". Together they
// do: the anchor left by expired newcomers is capped at the highest active
// tag, which is the low-weight key's.
func TestBugNewcomerPushedBackByExpiredNewcomersUnderLowWeightTag(t *testing.T) {
	t.Parallel()
	m := New(Config{})
	m.SetWeight("x", 0.01)
	add(t, m, "x", 5, 0, 0)
	add(t, m, "a", 5, 0, 0)
	require.Equal(t, []string{"x", "a"}, servedKeys(m.Dequeue(2, 0))) // x at 100U, a at U, V 0
	var ids []string
	for i := 0; i < 50; i++ {
		ids = append(ids, add(t, m, fmt.Sprintf("n%02d", i), 1, 0, 0)...)
	}
	for _, id := range ids {
		require.True(t, m.Expire(id))
	}
	add(t, m, "late", 1, 0, 0)
	// Without the expired newcomers late is at 2U; with them at 52U, behind
	// 50 serves of a.
	require.LessOrEqual(t, mustReg(t, m, "late").U, m.v+2*U, "late pushed back by expired keys")
}

// The same with equal weights: one of the expired newcomers returns (at its
// parked tag, which the others inflated) and becomes the highest active
// tag; every later newcomer queues behind it.
func TestBugNewcomerPushedBackByExpiredNewcomersThroughAReturn(t *testing.T) {
	t.Parallel()
	m := New(Config{})
	add(t, m, "a", 5, 0, 0)
	require.Equal(t, []string{"a"}, servedKeys(m.Dequeue(1, 0))) // a at U, V 0
	var ids []string
	for i := 0; i < 50; i++ {
		ids = append(ids, add(t, m, fmt.Sprintf("n%02d", i), 1, 0, 0)...)
	}
	for _, id := range ids {
		require.True(t, m.Expire(id))
	}
	add(t, m, "n49", 1, 0, 0) // returns at its parked tag, 51U
	require.Equal(t, 51*U, mustReg(t, m, "n49").U)
	add(t, m, "late", 1, 0, 0)
	require.LessOrEqual(t, mustReg(t, m, "late").U, m.v+2*U, "late pushed back by expired keys")
}

// Gating: a gated variant "competes again ... when a slot frees (ack, nack,
// lease recovery, dead letter: at once)". A release while the key limit is
// off does nothing (the sweep of the next call is meant to), but when the
// limit is back before that call the sweep does not run (the limit did not
// rise from gk): x, with a free slot, stays gated until the probe reaches
// its rank.
func TestBugReleaseWithoutKeyLimitLeavesGated(t *testing.T) {
	t.Parallel()
	m := New(Config{Limits: Limits{Key: 1}})
	for _, k := range []string{"y", "z", "x"} {
		add(t, m, k, 2, 0, 0)
	}
	out := m.Dequeue(3, 0)
	require.Equal(t, []string{"y", "z", "x"}, servedKeys(out))
	require.Equal(t, 3, gatedCount(m))
	m.SetLimits(Limits{})
	require.NoError(t, m.Ack(decode(t, out[2].ID)))
	m.SetLimits(Limits{Key: 1})
	require.Equal(t, []string{"x"}, servedKeys(m.Dequeue(1, 0)), "x's slot is free since the ack")
}

// Guarantee 6: "a call stops early only when nothing it can reach is
// servable; the age-head fallback reads what a flag-off call reads. Flag on
// therefore serves whenever flag off would". With more stale entries
// (flag-off drains) ahead of u than the read budget, pass 1 stops at the
// budget, and the age head (u, the only variant with work) is passed over
// because u is registered: the call serves nothing; a flag-off call would
// serve u.
func TestBugBudgetStopsCallThatFlagOffWouldServe(t *testing.T) {
	t.Parallel()
	m := New(Config{})
	for i := 0; i < ReadBudget+100; i++ {
		k := fmt.Sprintf("s%04d", i)
		add(t, m, k, 1, 0, 0)
		flagOffServe(t, m, k)
	}
	add(t, m, "u", 1, 0, 0)
	require.Equal(t, []Entry{{vm("u"), 0}}, m.CkIndex(), "u is all a flag-off call sees")
	require.Equal(t, []string{"u"}, servedKeys(m.Dequeue(1, 0)))
}

// Collect and persist: "parked tags at or below V are reaped". The model
// reaps only in a call that parked something, so a worthless entry
// outlives calls that pass it; while it lives its key comes back at V (a
// return) rather than behind the pack (a newcomer), and a call of N and N
// calls of 1 leave different states.
func TestBugParkedTagAtOrBelowVOutlivesCall(t *testing.T) {
	t.Parallel()
	m := New(Config{})
	add(t, m, "a", 1, 0, 0)
	add(t, m, "b", 9, 0, 0)
	require.Equal(t, []string{"a"}, servedKeys(m.Dequeue(1, 0))) // a parked at U
	require.Equal(t, []string{"b", "b"}, servedKeys(m.Dequeue(2, 0)))
	require.Equal(t, U, m.v)
	for v, p := range m.idle {
		require.Greater(t, p, m.v, "%s's parked tag %d <= V %d after a call", v, p, m.v)
	}
}

// Virtual time: the logical clock "never decreases while the state
// exists". V() adds two rounded quotients (epoch*2^50/Unit and v/Unit), so
// across a rebase from epoch 31 a one-unit step reads as a decrease.
// (float64(epoch*RebaseBy+v)/Unit would round once, but overflows int64
// past epoch 8191.)
func TestBugVFloatDecreasesAcrossLateRebase(t *testing.T) {
	t.Parallel()
	m := Restore(Config{}, Snapshot{
		Epoch: 31, V: RebaseAt - 1, NextSeq: 2,
		Reg:  map[string]Reg{vm("x"): {U: RebaseAt, Seq: 1}},
		Runs: []SnapshotRun{{ID: "x1", Key: "x", Attempt: 1}, {ID: "x2", Key: "x", Attempt: 1}},
	})
	before, lBefore := m.V(), logical(m)
	require.Len(t, m.Dequeue(1, 0), 1)
	require.Equal(t, int64(32), m.epoch)
	require.Equal(t, lBefore+1, logical(m), "the logical clock moved up one unit")
	require.GreaterOrEqual(t, m.V(), before, "V() decreased")
}

// Discover: "every variant with ready work is reached within
// ceil(variants/ScanLimit) calls". The cursor is a rank: when variants
// before it leave ckIndex, a variant can move below it (skipped until the
// next pass), and a cursor left past the end of a shrunk index reads
// nothing in its call.
func TestBugDiscoveryCursorMissesReachabilityBound(t *testing.T) {
	t.Parallel()

	t.Run("CursorPastTheEnd", func(t *testing.T) {
		t.Parallel()
		// ckIndex r0, u0, u1 (equal scores): bound ceil(3/2) = 2 calls.
		m := New(Config{ScanLimit: 2})
		add(t, m, "r0", 1, 0, 0)
		flagOffEnqueue(m, "u0#1", "u0", 0)
		flagOffEnqueue(m, "u1#1", "u1", 0)
		m.Dequeue(1, 0) // reads r0, u0; serves r0, which drains: u1 moves to rank 1
		m.Dequeue(1, 0) // cursor 2 >= 2: reads nothing
		_, ok := regOf(m, "u1")
		require.True(t, ok, "u1 not reached in ceil(3/2) calls")
	})

	t.Run("ShiftBelowTheCursor", func(t *testing.T) {
		t.Parallel()
		// ckIndex r0, u0, u1: bound ceil(3/1) = 3 calls.
		m := New(Config{ScanLimit: 1})
		add(t, m, "r0", 2, 0, 0)
		flagOffEnqueue(m, "u0#1", "u0", 0)
		flagOffEnqueue(m, "u1#1", "u1", 0)
		// Call 1 reads r0 and serves it; call 2 reads u0 (rank 1), serves
		// it and it drains: u1 moves from rank 2 to rank 1, below the
		// cursor (2). Call 3 reads nothing (past the end of r0, u1); reset
		// to rank 0 first it would read r0: u1 is skipped either way.
		for i := 0; i < 3; i++ {
			m.Dequeue(1, 0)
		}
		_, ok := regOf(m, "u1")
		require.True(t, ok || len(m.ready[vm("u1")]) == 0, "u1 not reached in ceil(3/1) calls")
	})
}

// Serving: ties are broken "by registration order (never by name: a tenant
// chooses names, not when its keys registered)". Variants registered in one
// call (promotion here; discovery and the age head alike) register in
// delayIndex (ckIndex) order: due time, then name. b's run was queued
// first, both come due at 5: "!" registers first and is served first.
func TestBugSameCallRegistrationsOrderedByName(t *testing.T) {
	t.Parallel()
	m := New(Config{})
	require.NoError(t, m.Enqueue("b#1", "b", 0, 5, 0))
	require.NoError(t, m.Enqueue("!#1", "!", 0, 5, 0))
	out := m.Dequeue(1, 5)
	require.Equal(t, []string{"b"}, servedKeys(out), "registration order decided by name")
}

// Gating: a gated variant whose slot a flag-off instance freed returns
// "when the probe ... finds it below its limit (within gated+1 calls)". The
// probe's position is a rank among the gated variants: releases below the
// target move it under the probe, and a probe past the end of a shrunk list
// spends its call resetting. Here at most 3 variants are gated at any time
// and k2, freed before call 5, returns at call 10 (6 calls).
func TestBugProbeMissesItsBound(t *testing.T) {
	t.Parallel()
	m := New(Config{Limits: Limits{Key: 1}, ScanLimit: 1})
	for _, k := range []string{"k0", "k1", "k2"} {
		add(t, m, k, 6, 0, 0)
	}
	ack := func(key string) {
		for id, r := range m.runs {
			if r.key == key && r.state == InFlight {
				require.NoError(t, m.Ack(decode(t, id)))
				return
			}
		}
		t.Fatalf("%s has no run in flight", key)
	}
	call := func(want ...string) {
		t.Helper()
		if want == nil {
			want = []string{}
		}
		require.Equal(t, want, servedKeys(m.Dequeue(2, 0)))
		require.LessOrEqual(t, gatedCount(m), 3)
	}
	call("k0", "k1") // 1
	call("k2")       // 2: the probe looks at rank 0 (k0)
	call()           // 3: rank 1 (k1)
	call()           // 4: rank 2 (k2, at its limit)
	for id, r := range m.runs {
		if r.key == "k2" && r.state == InFlight {
			flagOffAck(t, m, decode(t, id)) // k2's slot freed, k2 still gated
		}
	}
	call() // 5: rank 3 past the end: reset, no look
	ack("k0")
	call("k0") // 6: gated k1, k2: rank 0 (k1); k0 served and gated (after k2)
	ack("k1")
	call("k1") // 7: gated k2, k0: rank 1 (k0): k2 moved under the probe
	call()     // 8: gated k2, k0, k1: rank 2 (k1)
	require.False(t, mustReg(t, m, "k2").Gated, "k2 still gated 4 calls after its slot freed, with at most 3 gated")
}
