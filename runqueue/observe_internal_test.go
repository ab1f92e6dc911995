package runqueue

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The default Observer must keep the operations free of per-queue
// bookkeeping: observing is what they check before doing any.
func TestObservingSkipsNop(t *testing.T) {
	t.Parallel()
	require.False(t, observing(nil))
	require.False(t, observing(NopObserver{}))
	require.False(t, observing(&NopObserver{}))
	require.False(t, observing((&Config{}).WithDefaults().Observer))
	type partial struct{ NopObserver } // implements some methods: observed
	require.True(t, observing(partial{}))
}

func TestQueueTallyKeepsFirstSeenOrder(t *testing.T) {
	t.Parallel()
	var tl queueTally
	tl.add("e", "b", 1, 0)
	tl.add("e", "a", 1, 1)
	tl.add("e", "b", 1, 1)
	tl.add("f", "b", 2, 0)
	require.Equal(t, []queueCount{{"e", "b", 2, 1}, {"e", "a", 1, 1}, {"f", "b", 2, 0}}, tl.rows)
}
