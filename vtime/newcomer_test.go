package vtime_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/vtime"
)

// TestNewcomerBoundAtEqualWeights: guarantee 7 (doc.go) says that "with
// equal weights, a key that registers when the lane is empty is served
// within 3 serves per other active key", for any equal weights. The lane's
// quantum was once a fixed Unit (one serve at weight 1): with every key at
// weight 10 (a serve costs Unit/10) the newcomer sat a whole Unit past the
// pack and each other key was served about 10 times before it. Now the
// quantum is one serve of the newcomer, at most Unit.
func TestNewcomerBoundAtEqualWeights(t *testing.T) {
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
