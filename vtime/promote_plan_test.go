package vtime

import (
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestPromotePlanHeld: the plan's bounds, with variants at their key limit
// (held) among them. A held variant's first share is not taken from the
// budget and it takes more only from what the others left: the variants
// not held promote at least the budget when they hold that many within the
// limit, fewer than budget + their number; a held variant gains beyond
// its first share only when every other is given all it holds within the
// limit; a call promotes fewer than 2 x (budget + variants) in all.
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
		free, want, total := 0, 0, 0
		freeFull, heldMore := true, false
		for i := range due {
			require.LessOrEqual(rt, first[i], plan[i])
			require.LessOrEqual(rt, plan[i], min(due[i], limit))
			require.Equal(rt, min(due[i], share), first[i], "variant %d", i)
			total += plan[i]
			if held[i] {
				heldMore = heldMore || plan[i] > first[i]
				continue
			}
			free += plan[i]
			want += min(due[i], limit)
			freeFull = freeFull && plan[i] == min(due[i], limit)
		}
		require.GreaterOrEqual(rt, free, min(budget, want), "the budget goes to the variants not held first")
		require.Less(rt, free, budget+n)
		require.False(rt, heldMore && !freeFull, "a held variant took budget a variant not held could use: %v", plan)
		require.Less(rt, total, 2*(budget+n))
		// What the others left of the budget goes to the held variants that
		// filled their first share, as far as they hold runs within limit.
		extra, room := 0, 0
		for i := range due {
			if held[i] {
				extra += plan[i] - first[i]
				if first[i] == share {
					room += min(due[i], limit) - first[i]
				}
			}
		}
		require.GreaterOrEqual(rt, extra, min(max(budget-free, 0), room), "held variants left budget unused: %v", plan)

		// Without held variants the plan is the one of before: the same
		// as with every variant not held.
		none, noneFirst := PromotePlan(limit, maxCount, due, nil)
		allFree, allFreeFirst := PromotePlan(limit, maxCount, due, make([]bool, n))
		require.Equal(rt, none, allFree)
		require.Equal(rt, noneFirst, allFreeFirst)
	})
}
