package vtime_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/vtime"
)

// TestReviewNewcomerBoundWithEqualWeights: guarantee 7 (doc.go) says that
// "with equal weights, a key that registers when the lane is empty is
// served within 3 serves per other active key". The lane's quantum is a
// fixed Unit (one serve at weight 1), whatever the weights: the newcomer
// registers at min(top, V+Unit) + Unit. With every key at weight 10 (a
// serve costs Unit/10), the pack's top is V + Unit/10 and the newcomer
// sits a whole Unit past it: each other key is served about 10 more times
// before it. (The oracle's CheckNewcomer measures work in 1/w and says
// "with equal weights (all 1)"; doc.go promises it for any equal weights.)
func TestReviewNewcomerBoundWithEqualWeights(t *testing.T) {
	const now = int64(1_000_000)
	m := vtime.New(vtime.Config{})
	for _, k := range []string{"x", "y", "n"} {
		m.SetWeight(k, 10)
	}
	for _, k := range []string{"x", "y"} {
		for i := 0; i < 100; i++ {
			require.NoError(t, m.Enqueue(fmt.Sprintf("%s%d", k, i), k, 0, now, now))
		}
	}
	for i := 0; i < 4; i++ {
		require.Len(t, m.Dequeue(1, now), 1)
	}
	require.NoError(t, m.Enqueue("n0", "n", 0, now, now)) // the lane is empty
	before := map[string]int{}
	for i := 0; i < 100; i++ {
		s := m.Dequeue(1, now)
		require.Len(t, s, 1)
		if s[0].Key == "n" {
			break
		}
		before[s[0].Key]++
	}
	for k, n := range before {
		require.LessOrEqual(t, n, 3, "%s served %d times before the newcomer n (all weights 10): %v", k, n, before)
	}
}
