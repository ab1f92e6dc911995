package vtime

import (
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestPromotePlanHeld: the plan's bounds, with variants at their key limit
// (held) among them. A held variant takes its first share and no more, and
// that share is not taken from the budget: the variants not held promote
// exactly what they would with the held ones' runs spent elsewhere, at
// least the budget when they hold that many within the limit, fewer than
// budget + their number in all.
func TestPromotePlanHeld(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		limit := rapid.IntRange(1, 120).Draw(rt, "limit")
		maxCount := rapid.IntRange(1, 150).Draw(rt, "maxCount")
		n := rapid.IntRange(1, 40).Draw(rt, "variants")
		due := rapid.SliceOfN(rapid.IntRange(1, 300), n, n).Draw(rt, "due")
		held := rapid.SliceOfN(rapid.Bool(), n, n).Draw(rt, "held")
		plan, first := PromotePlan(limit, maxCount, due, held)
		budget := max(limit, maxCount)
		share := min(limit, ceilDiv(budget, n))
		free, want := 0, 0
		for i := range due {
			require.LessOrEqual(rt, first[i], plan[i])
			require.LessOrEqual(rt, plan[i], min(due[i], limit))
			require.Equal(rt, min(due[i], share), first[i], "variant %d", i)
			if held[i] {
				require.Equal(rt, first[i], plan[i], "held variant %d takes its first share only", i)
				continue
			}
			free += plan[i]
			want += min(due[i], limit)
		}
		require.GreaterOrEqual(rt, free, min(budget, want), "the budget goes to the variants not held")
		require.Less(rt, free, budget+n)

		// Without held variants the plan of the others is the one they get
		// beside held ones: held variants take nothing from them.
		var rest []int
		for i := range due {
			if !held[i] {
				rest = append(rest, due[i])
			}
		}
		if len(rest) == n || len(rest) == 0 {
			return
		}
		alone, _ := PromotePlan(limit, maxCount, rest, nil)
		total := 0
		for _, p := range alone {
			total += p
		}
		// The first share is fixed by all the variants reached, so the
		// others' plan can differ in shape, not in what it reaches: both
		// promote the budget, or everything within limit.
		require.Equal(rt, min(total, budget), min(free, budget))
	})
}
