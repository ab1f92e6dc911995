package vtime

import (
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestPromotePlanHeld: the plan's bounds, with variants at their key limit
// (held) among them. A held variant takes what it took when held variants
// counted in the budget (so its due runs leave the delay index's front as
// fast), and the others take as much again: each at least its plan of
// before, together at least the budget when they hold that many within the
// limit, fewer than budget + their number beyond what they took before; a
// call promotes fewer than 2 x (budget + variants) in all.
func TestPromotePlanHeld(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		limit := rapid.IntRange(1, 120).Draw(rt, "limit")
		maxCount := rapid.IntRange(1, 150).Draw(rt, "maxCount")
		n := rapid.IntRange(1, 40).Draw(rt, "variants")
		due := rapid.SliceOfN(rapid.IntRange(1, 300), n, n).Draw(rt, "due")
		held := rapid.SliceOfN(rapid.Bool(), n, n).Draw(rt, "held")
		plan, first := PromotePlan(limit, maxCount, due, held)
		before, beforeFirst := PromotePlan(limit, maxCount, due, nil)
		require.Equal(rt, beforeFirst, first)
		budget := max(limit, maxCount)
		free, freeBefore, want, total, tookHeld := 0, 0, 0, 0, 0
		for i := range due {
			require.LessOrEqual(rt, plan[i], min(due[i], limit))
			total += plan[i]
			if held[i] {
				require.Equal(rt, before[i], plan[i], "held variant %d", i)
				tookHeld += plan[i]
				continue
			}
			require.GreaterOrEqual(rt, plan[i], before[i], "variant %d", i)
			free += plan[i]
			freeBefore += before[i]
			want += min(due[i], limit)
		}
		require.GreaterOrEqual(rt, free, min(budget, want), "the budget goes whole to the variants not held: %v", plan)
		require.GreaterOrEqual(rt, free, min(freeBefore+tookHeld, want), "the held variants' runs go again: %v", plan)
		require.Less(rt, free-freeBefore, tookHeld+n)
		require.Less(rt, total, 2*(budget+n))

		// With no variant held the plan is the one of before.
		allFree, _ := PromotePlan(limit, maxCount, due, make([]bool, n))
		require.Equal(rt, before, allFree)
	})
}
