package vtime

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/runqueue/runqueue/keys"
)

// TestPropPromoteStarvingFirst: more variants due than a call reaches, each
// with a burst of delayed runs (due at once or a millisecond apart: a
// promoted variant's head then moves later but stays ahead of keys due
// after its burst), and a late key whose one run is due in the middle of
// the bursts. Calls of 1 serve and ack one run each. Every variant (the
// late one too) gains its first ready run within ceil(variants / (scan -
// maxCount)) calls, however long the bursts before it last: a call reaches
// the variants without a ready run first, and a call of maxCount serves
// out at most maxCount variants, which then have none again. (Before, a
// call reached the first scan due variants, so the late key waited until
// the bursts due before it had been promoted.)
func TestPropPromoteStarvingFirst(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		scan := rapid.IntRange(2, 5).Draw(rt, "scan")
		m := New(Config{ScanLimit: scan, PromoteLimit: rapid.IntRange(1, 3).Draw(rt, "promoteLimit")})
		n := rapid.IntRange(scan+1, PromoteLook*scan-1).Draw(rt, "bursts")
		spread := rapid.SampledFrom([]int64{0, 1}).Draw(rt, "ms between a burst's runs")
		runs := rapid.IntRange(20, 60).Draw(rt, "runs per burst")
		total := map[string]int{}
		for k := range n {
			key := fmt.Sprintf("k%02d", k)
			for i := range runs {
				require.NoError(t, m.Enqueue(fmt.Sprintf("%s-%d", key, i), key, 0, 1000+int64(i)*spread, 0))
			}
			total[key] = runs
		}
		require.NoError(t, m.Enqueue("late", "late", 0, 1000+int64(runs/2)*spread+1, 0))
		total["late"] = 1
		now := int64(1_000_000)
		per := scan - scan/4 - 1 // starving variants reached per call, net of the one a call of 1 serves out
		bound := (n + 1 + per - 1) / per
		reached := map[string]int{}
		for call := 1; call <= bound; call++ {
			for _, s := range m.Dequeue(1, now) {
				require.NoError(t, m.Ack(s.ID))
			}
			for key, k := range total {
				if _, ok := reached[key]; !ok && len(m.delayed[keys.VariantMember(key)]) < k {
					reached[key] = call
				}
			}
		}
		for key := range total {
			_, ok := reached[key]
			require.True(t, ok, "%s not reached within %d calls (%d bursts of %d runs, spread %d ms, scan %d)",
				key, bound, n, runs, spread, scan)
		}
	})
}

// TestPromoteLookMaxNeverFalls: how far a call's promotion looks never
// falls as its scan grows, so a coalesced call (its calls' scans summed)
// reaches as far as each of its calls would. helper-177 (stop 54): whole
// looks within the cap reached 3,600 due variants at a scan of 300 and
// 2,400 at 600, and two coalesced calls of ScanLimit 300 served nothing
// for 40 calls where each alone served a free key behind 2,500 held keys.
// It is 10 looks of 4 x scan up to a scan of 100, then the cap, then one
// look of 4 x scan from a scan of 1,000.
func TestPromoteLookMaxNeverFalls(t *testing.T) {
	for scan := 1; scan <= 10000; scan++ {
		got := PromoteLookMax(scan)
		if scan > 1 && got < PromoteLookMax(scan-1) {
			t.Fatalf("scan %d: reach %d below scan %d's %d", scan, got, scan-1, PromoteLookMax(scan-1))
		}
		if got < PromoteLook*scan || got > max(PromoteLook*scan, PromoteLookCap) {
			t.Fatalf("scan %d: reach %d outside [one look, max(one look, the cap)]", scan, got)
		}
	}
	for _, c := range []struct{ scan, reach int }{{30, 1200}, {100, 4000}, {300, 4000}, {600, 4000}, {1000, 4000}, {2000, 8000}} {
		if got := PromoteLookMax(c.scan); got != c.reach {
			t.Errorf("scan %d: reach %d, want %d", c.scan, got, c.reach)
		}
	}
}
