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

// TestPromotePlanWeighted: a flag-on call's plan shares by weight. Its
// first pass is PromotePlan's with equal weights (nil weights are equal
// weights); every variant reached gains a run; a variant with runs enough
// takes at least its weighted part of the budget, min(limit, budget x w /
// sum), in the first pass; a held variant keeps what it takes with no
// variant held, and the variants not held take the budget whole when they
// hold that much; the bounds of TestPromotePlanHeld hold (fewer than
// budget + variants in the first pass, 2 x (budget + variants) in all).
// And the later passes are weighted water-filling, so no share goes by a
// variant's place: a variant not held that could take more (below its due
// runs and the limit) has, within the rounding up of three shares, as
// many runs per unit of weight as any other: plan[j] < plan[i] x w[j] /
// w[i] + 3. (helper-170: with the third pass in order, 512 plans of
// 200,000 broke the order of weights.)
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
		none, noneFirst := PromotePlanWeighted(limit, maxCount, due, held, nil)
		require.Equal(rt, plan, none, "nil weights are equal weights")
		require.Equal(rt, first, noneFirst, "nil weights are equal weights")
		_, evenFirst := PromotePlan(limit, maxCount, due, held)
		require.Equal(rt, evenFirst, first, "equal weights: PromotePlan's first pass")

		milli := rapid.SliceOfN(rapid.Int64Range(1, 1_000_000), n, n).Draw(rt, "milli")
		plan, first = PromotePlanWeighted(limit, maxCount, due, held, milli)
		unheld, _ := PromotePlanWeighted(limit, maxCount, due, nil, milli)
		budget := max(limit, maxCount)
		var sum int64
		for _, w := range milli {
			sum += w
		}
		firstTotal, total, free, want := 0, 0, 0, 0
		for i := range due {
			require.GreaterOrEqual(rt, first[i], 1, "variant %d gains a run", i)
			require.LessOrEqual(rt, plan[i], min(due[i], limit))
			require.GreaterOrEqual(rt, plan[i], first[i])
			part := min(int64(limit), int64(budget)*milli[i]/sum, int64(due[i]))
			require.GreaterOrEqual(rt, int64(first[i]), part, "variant %d's weighted part", i)
			firstTotal += first[i]
			total += plan[i]
			if held != nil && held[i] {
				require.Equal(rt, unheld[i], plan[i], "held variant %d keeps its plan", i)
				continue
			}
			free += plan[i]
			want += min(due[i], limit)
		}
		require.GreaterOrEqual(rt, free, min(budget, want), "the budget goes whole to the variants not held: %v", plan)
		require.Less(rt, firstTotal, budget+n)
		require.Less(rt, total, 2*(budget+n))
		for i := range due {
			if (held != nil && held[i]) || plan[i] == min(due[i], limit) {
				continue
			}
			for j := range due {
				require.Less(rt, int64(plan[j])*milli[i], int64(plan[i])*milli[j]+3*milli[i],
					"variant %d (weight %d) took %d where %d (weight %d, could take more) took %d: %v", j, milli[j], plan[j], i, milli[i], plan[i], plan)
			}
		}
	})
}

// TestPromotePlanWeightedRunsOut: helper-170's shape. Variants a (weight
// 1), b (weight 3, 25 runs due), d (weight 3) and c (weight 10, 5 runs
// due), budget 100: b fills its first share (18) and runs out in the
// second. With the third pass in order a took all that b left: a 29, d
// 41, where d is due three times a's part of the 70 runs b and c leave.
// By water-filling: a 18, d 53.
func TestPromotePlanWeightedRunsOut(t *testing.T) {
	t.Parallel()
	due := []int{500, 25, 500, 5}
	milli := []int64{1000, 3000, 3000, 10000}
	plan, first := PromotePlanWeighted(100, 100, due, nil, milli)
	require.Equal(t, []int{6, 18, 18, 5}, first)
	require.Equal(t, []int{18, 25, 53, 5}, plan)
	// Flag off, PromotePlan: even shares (25 each), then 7 each of the 20
	// left, then the 6 still left to a, first in order.
	plan, _ = PromotePlan(100, 100, due, nil)
	require.Equal(t, []int{38, 25, 32, 5}, plan)
}
