package runqueue_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/fairness"
	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// TestS28FWeightRaisedAtScale: 500 keys at weight 1 stay backlogged next
// to key K at weight 0.001. K is served once (it now owes 1,000 serves at
// its old weight), then its weight is raised to 1000 under load, by the
// flag-on or the flag-off instance (guarantee 8: flag-off SetWeight keeps
// the cap in step), while K is competing, gated (key limit 1, its run
// held, acked by the flag-on instance after the raise) or parked (drained,
// then one new run). Guarantee 2's weight-change bound: before K's next
// serve another servable key j gets n_j/w_j <= D + 1/w_j with D = 1/w_K
// (competing, gated) or max(1/w_K, 2 + P) (parked; P = 0 newcomers ahead),
// so no other key is served more than once (competing, gated) or three
// times (parked) before K. Every call serves one run; the others' runs are
// acked at once.
func TestS28FWeightRaisedAtScale(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	for _, state := range []string{"competing", "gated", "parked"} {
		for _, by := range []string{"on", "off"} {
			t.Run(state+"/"+by, func(t *testing.T) { s28fWeightRaised(t, state, by) })
		}
	}
}

func s28fWeightRaised(t *testing.T, state, by string) {
	c := redistest.Real(t)
	ctx := context.Background()
	clock := fairness.NewClock()
	prefix := redistest.Prefix(t)
	on, off := s28fPair(t, c, runqueue.Config{Prefix: prefix, Clock: clock, KeyConcurrency: 1})
	const n = 500
	batch := s28fRounds(4, n, "j%03d")
	kRuns := 5
	if state == "parked" {
		kRuns = 1
	}
	for j := 0; j < kRuns; j++ {
		batch = append(batch, "K")
	}
	require.NoError(t, on.SetWeight(ctx, s28fEnv, s28fQueue, "K", 0.001))
	s28fEnqueue(t, on, batch, "a")
	var kHeld *runqueue.Run
	serve := func() *runqueue.Run {
		runs, err := on.Dequeue(ctx, s28fEnv, s28fQueue, 1)
		require.NoError(t, err)
		require.Len(t, runs, 1, "a call served nothing")
		r := runs[0]
		if r.Key == "K" && state == "gated" && kHeld == nil {
			kHeld = r
		} else {
			require.NoError(t, on.Ack(ctx, r))
		}
		return r
	}
	for i := 0; ; i++ {
		require.Less(t, i, 3*n, "K never served at weight 0.001")
		if serve().Key == "K" {
			break
		}
	}
	// Let the others catch up a little: K stays behind (gated, parked or
	// owing).
	for i := 0; i < 50; i++ {
		require.NotEqual(t, "K", serve().Key, "K served twice in 50 serves at weight 0.001")
	}
	q := on
	if by == "off" {
		q = off
	}
	require.NoError(t, q.SetWeight(ctx, s28fEnv, s28fQueue, "K", 1000))
	switch state {
	case "gated":
		require.NotNil(t, kHeld)
		require.NoError(t, on.Ack(ctx, kHeld))
	case "parked":
		s28fEnqueue(t, on, []string{"K"}, "back")
	}
	counts := map[string]int{}
	most, who := 0, ""
	for i := 0; ; i++ {
		require.Less(t, i, 3*n, "K not served within %d serves after its raise", 3*n)
		r := serve()
		if r.Key == "K" {
			break
		}
		if counts[r.Key]++; counts[r.Key] > most {
			most, who = counts[r.Key], r.Key
		}
	}
	bound := 1
	if state == "parked" {
		bound = 3
	}
	t.Logf("%s, raised by flag %s: K served after %d serves of others; most served other key %q: %d (bound %d)",
		state, by, len(counts), who, most, bound)
	require.LessOrEqual(t, most, bound, "another key served past guarantee 2's bound before K's next serve")
}

// TestS28FChurnNoCredit: 1,000 keys that drain and return: each holds
// one run, and a key served is given a new run right after the call
// (acked at once), next to key A, backlogged throughout; equal weights,
// flag on. Guarantee 3 (no credit for idle time; a parked tag is at most
// as good as when it was parked) with guarantee 2: a churning key never
// gets ahead of A by more than 1/w_j + 1/w_A = 2 serves at any prefix,
// and over the whole run A gets at least as many serves as any churning
// key, less 2.
func TestS28FChurnNoCredit(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	c := redistest.Real(t)
	ctx := context.Background()
	clock := fairness.NewClock()
	cfg := runqueue.Config{Prefix: redistest.Prefix(t), VtimeScheduling: true, Clock: clock}
	on, err := runqueue.New(ctx, c, &cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = on.Close() })
	const n = 1000
	var batch []string
	for i := 0; i < n; i++ {
		batch = append(batch, fmt.Sprintf("c%04d", i))
	}
	for j := 0; j < 300; j++ {
		batch = append(batch, "A")
	}
	s28fEnqueue(t, on, batch, "a")
	counts := map[string]int{}
	worst, who, at := 0, "", 0
	serves := 0
	for call := 0; call < 1500; call++ {
		runs, err := on.Dequeue(ctx, s28fEnv, s28fQueue, 10)
		require.NoError(t, err)
		require.Len(t, runs, 10, "call %d not full", call)
		var back []string
		for _, r := range runs {
			serves++
			require.NoError(t, on.Ack(ctx, r))
			counts[r.Key]++
			if r.Key == "A" {
				back = append(back, "A")
				continue
			}
			back = append(back, r.Key)
			if d := counts[r.Key] - counts["A"]; d > worst {
				worst, who, at = d, r.Key, serves
			}
		}
		s28fEnqueue(t, on, back, fmt.Sprintf("b%d", call))
		clock.Advance(time.Millisecond)
	}
	t.Logf("%d serves: A %d; worst lead of a churning key over A: %d (%s at serve %d)", serves, counts["A"], worst, who, at)
	require.LessOrEqual(t, worst, 2, "a draining and returning key got ahead of the backlogged key")
}
