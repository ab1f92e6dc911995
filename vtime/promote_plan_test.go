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

// TestPromotePlanWeighted: the first pass shares the budget by weight.
// Equal weights give PromotePlan's plan; every variant reached gains a
// run; a variant with runs enough takes at least its weighted part of the
// budget, min(limit, budget x w / sum), in the first pass; the bounds of
// TestPromotePlanHeld hold (fewer than budget + variants in the first
// pass, 2 x (budget + variants) in all).
func TestPromotePlanWeighted(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		limit := rapid.IntRange(1, 120).Draw(rt, "limit")
		maxCount := rapid.IntRange(1, 300).Draw(rt, "maxCount")
		n := rapid.IntRange(1, 40).Draw(rt, "variants")
		due := rapid.SliceOfN(rapid.IntRange(1, 300), n, n).Draw(rt, "due")
		held := rapid.SliceOfN(rapid.Bool(), n, n).Draw(rt, "held")
		if rapid.Bool().Draw(rt, "noneHeld") {
			held = nil
		}
		same := make([]int64, n)
		for i := range same {
			same[i] = 1000
		}
		plan, first := PromotePlanWeighted(limit, maxCount, due, held, same)
		even, evenFirst := PromotePlan(limit, maxCount, due, held)
		require.Equal(rt, even, plan, "equal weights")
		require.Equal(rt, evenFirst, first, "equal weights")

		milli := rapid.SliceOfN(rapid.Int64Range(1, 1_000_000), n, n).Draw(rt, "milli")
		plan, first = PromotePlanWeighted(limit, maxCount, due, held, milli)
		budget := max(limit, maxCount)
		var sum int64
		for _, w := range milli {
			sum += w
		}
		firstTotal, total := 0, 0
		for i := range due {
			require.GreaterOrEqual(rt, first[i], 1, "variant %d gains a run", i)
			require.LessOrEqual(rt, plan[i], min(due[i], limit))
			require.GreaterOrEqual(rt, plan[i], first[i])
			part := min(int64(limit), int64(budget)*milli[i]/sum, int64(due[i]))
			require.GreaterOrEqual(rt, int64(first[i]), part, "variant %d's weighted part", i)
			firstTotal += first[i]
			total += plan[i]
		}
		require.Less(rt, firstTotal, budget+n)
		require.Less(rt, total, 2*(budget+n))
	})
}
