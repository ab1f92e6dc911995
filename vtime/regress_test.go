package vtime

// Regressions: each test is a minimal sequence on which an earlier model
// broke a promise of doc.go, and checks the promise.

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// Gating: "when a flag-off instance freed the slot, when the gated probe
// comes to it (one rank per call; a lap takes as many calls as there are
// gated variants ...)". The probe once spent a call of its own going back
// to rank 0 (a lap took gated+1 calls). g0 and g1 are gated and held; g1's
// slot is freed by a flag-off ack just after the probe looked at it:
// within the next 2 calls (a lap) it returns.
func TestProbeLapTakesGatedCalls(t *testing.T) {
	t.Parallel()
	m := New(Config{Limits: Limits{Key: 1}})
	add(t, m, "g0", 3, 0, 0)
	add(t, m, "g1", 3, 0, 0)
	out := m.Dequeue(2, 0)
	require.Equal(t, []string{"g0", "g1"}, servedKeys(out))
	require.Equal(t, 2, gatedCount(m))
	require.Empty(t, m.Dequeue(1, 0)) // rank 0: g0, at its limit
	require.Empty(t, m.Dequeue(1, 0)) // rank 1: g1, at its limit
	flagOffAck(t, m, decode(t, out[1].ID))
	var got []string
	for call := 0; call < 2; call++ { // one lap: 2 gated variants
		got = append(got, servedKeys(m.Dequeue(1, 0))...)
	}
	require.Equal(t, []string{"g1"}, got, "g1, below its limit, not returned within a lap of the probe")
}

// Virtual time: "The logical clock (V) is epoch*2^48 + stored V; it never
// decreases while the state exists." V() once computed epoch*RebaseBy + v
// in an int64, which overflows when the logical clock reaches 2^63 units
// (epoch 2^15; at 10^9 units a serve, the most a serve costs, some 9.2
// billion serves of weight-0.001 keys).
func TestVPast2To63Units(t *testing.T) {
	t.Parallel()
	m := Restore(Config{}, Snapshot{
		Epoch: 1<<15 - 2, V: RebaseAt - 1, NextSeq: 2,
		Reg:  map[string]Reg{vm("x"): {U: RebaseAt, Seq: 1}},
		Runs: []SnapshotRun{{ID: "x1", Key: "x", Attempt: 1}, {ID: "x2", Key: "x", Attempt: 1}},
	})
	before := m.V()
	require.Positive(t, before)
	require.Len(t, m.Dequeue(1, 0), 1)
	require.Equal(t, int64(1<<15-1), m.epoch)
	require.GreaterOrEqual(t, m.V(), before, "V() decreased when the logical clock reached 2^63 units")
}

// Guarantee 6: "a call stops early only when nothing it can reach is
// servable; the age-head fallback reads what a flag-off call reads. Flag on
// therefore serves whenever flag off would (but for a gated variant whose
// slot a flag-off instance freed, until the probe comes to it)". When pass
// 1 stopped at its read budget, the age head once passed over the
// variants queued in the newcomer lane, and a head handed on during the
// call went to the window's overflow, which the spent budget never read
// again. Now a queued variant among the oldest work brings the lane's head
// in, and once the budget is spent an entry goes to the list.
func TestAgeHeadTakesFromTheLane(t *testing.T) {
	t.Parallel()
	// build: a served once (at U, V 0); more stale entries (flag-off
	// drains, tag 0) than the read budget; then h heads the lane (2U) and
	// q waits behind it; q's run is the oldest, then h's.
	build := func(t *testing.T, scan int) *Model {
		m := New(Config{ScanLimit: scan})
		add(t, m, "a", 2, 0, 0)
		for i := 0; i < ReadBudget+100; i++ {
			k := fmt.Sprintf("s%04d", i)
			add(t, m, k, 1, 0, 0)
			flagOffServe(t, m, k)
		}
		require.Equal(t, []string{"a"}, servedKeys(m.Dequeue(1, 0)))
		require.Equal(t, U, mustReg(t, m, "a").U)
		require.NoError(t, m.Enqueue("h#1", "h", 0, -10, 0))
		require.NoError(t, m.Enqueue("q#1", "q", 0, -20, 0))
		require.Equal(t, vms("h", "q"), lane(m))
		require.Equal(t, vms("q", "h", "a"), []string{m.CkIndex()[0].Member, m.CkIndex()[1].Member, m.CkIndex()[2].Member})
		return m
	}

	t.Run("QueuedInTheAgeHead", func(t *testing.T) {
		t.Parallel()
		// A flag-off call (ScanLimit 1) serves q; flag on once served
		// nothing. The age head meets q, queued in the lane: the lane's
		// head h joins and is served (the lane keeps its order), and q
		// heads the lane after it.
		m := build(t, 1)
		require.Equal(t, []string{"h"}, servedKeys(m.Dequeue(1, 0)))
		require.Equal(t, vms("q"), lane(m))
	})

	t.Run("HeadHandedOnPastTheBudget", func(t *testing.T) {
		t.Parallel()
		// A flag-off call (ScanLimit 2) serves q and h; flag on serves h
		// (it joins from the age head) and hands the lane to q, which waits
		// in the overflow.
		m := build(t, 2)
		require.ElementsMatch(t, []string{"q", "h"}, servedKeys(m.Dequeue(2, 0)))
	})
}
