package runqueue_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/runqueue/runqueue/internal/fairness"
)

// Review 25: CheckLag's gated and parked weight-change watches on the Lua.

// s25Run runs fn on a fresh oracle per backend, finishes the history,
// holds it to every check and hands it to after.
func s25Run(t *testing.T, fn func(o *fairness.Oracle) error, after func(t *testing.T, h *fairness.History)) {
	for _, b := range foBackends {
		t.Run(b.name, func(t *testing.T) {
			p, mini := foPool(t, b, 0)
			o := foOracleOn(t, p, mini, 1)
			err := fn(o)
			if err == nil {
				err = o.Finish()
			}
			require.NoError(t, err)
			t.Logf("%s: %s", b.name, fairness.LagWatches(&o.H))
			if vs := fairness.Run(&o.H, fairness.Checks...); len(vs) > 0 {
				t.Fatalf("%s", fairness.Report(&o.H, vs))
			}
			if after != nil {
				after(t, &o.H)
			}
		})
	}
}

// TestS25UnsaidGatedWatch: a key k gated at key limit 2 has a slot freed by
// a flag-off ack, which does not un-gate it: it waits for the gated probe
// (guarantee 6's exception). With the flag on again the key limit drops to
// 1 (k is at its limit again for the oracle), k's weight changes, and the
// limit goes back to 2 with no call in between: k is servable for the
// oracle, but the limit did not rise above the one k was gated under, so
// only the probe un-gates it, one gated key per call, five gated keys
// before it. j is served twice before k. CheckLag's gated watch used to
// follow k from there with D = 1/w_k = 0.001 and failed ("j served 2
// times since k's weight became 1000 (gated; owes at most 0.001)"); it
// follows a gated key only when it was served since it last became
// servable (not held gated by a slot a flag-off instance freed).
func TestS25UnsaidGatedWatch(t *testing.T) {
	var change int // op of the key limit's return to 2
	s25Run(t, func(o *fairness.Oracle) error {
		var err error
		do := func(e error) {
			if err == nil {
				err = e
			}
		}
		enq := func(key string, n int) {
			for i := 0; i < n && err == nil; i++ {
				_, e := o.Enqueue(key, 0, 0, 0)
				do(e)
			}
		}
		deq := func(n int) []fairness.Served {
			if err != nil {
				return nil
			}
			s, e := o.Dequeue(n)
			do(e)
			return s
		}
		do(o.SetLimits(fairness.Limits{Key: 2}))
		for _, g := range []string{"g1", "g2", "g3", "g4", "g5"} {
			enq(g, 3)
			deq(2) // g served twice (held): at its limit
			deq(1) // the call meets g at its limit: gated
		}
		enq("k", 3)
		held := deq(2)
		deq(1) // k gated, after every g
		do(o.SetFlag(false))
		if len(held) > 0 {
			do(o.Ack(held[0].ID)) // flag off: the scheduler is not told
		}
		do(o.SetFlag(true))
		do(o.SetLimits(fairness.Limits{Key: 1}))
		do(o.SetWeight("k", 1000))
		enq("j", 12)
		do(o.SetLimits(fairness.Limits{Key: 2}))
		change = o.H.Ops
		for i := 0; i < 6 && err == nil; i++ {
			for _, x := range deq(5) {
				if x.Key == "j" {
					do(o.Ack(x.ID))
				}
			}
		}
		return err
	}, func(t *testing.T, h *fairness.History) {
		// The state the test is about: j served at least twice after the
		// limit's return and before k's next serve.
		nj := 0
		for _, e := range h.Events {
			if e.Op <= change || e.Kind != fairness.EvServe {
				continue
			}
			if e.Key == "k" {
				break
			}
			if e.Key == "j" {
				nj++
			}
		}
		require.GreaterOrEqual(t, nj, 2, "k was un-gated before j's second serve: the test no longer builds its state")
	})
}

// TestS25LuaLagBiased: CheckLag over histories of fairness.DriveS25 (few
// keys, key limits down and back up, runs held, weight changes mostly of
// keys at their limit or drained, flag flips) on the Lua: foSequences per
// backend.
func TestS25LuaLagBiased(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	for _, b := range foBackends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			p, mini := foPool(t, b, 1)
			var watches fairness.WatchCount
			runs, limit := 0, foSequences()
			rapid.Check(t, func(rt *rapid.T) {
				if runs++; runs > limit {
					return
				}
				o := foOracleOn(rt, p, mini, 1)
				require.NoError(rt, fairness.DriveS25(rt, o))
				watches.Add(fairness.LagWatches(&o.H))
				if vs := fairness.CheckLag(&o.H); len(vs) > 0 {
					rt.Fatalf("%s", fairness.Report(&o.H, vs))
				}
			})
			t.Logf("Lua on %s, biased: %s", b.name, watches)
		})
	}
}
