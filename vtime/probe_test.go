package vtime

// Tests from the second adversarial review of the scheduler model: each is
// a minimal sequence on which an earlier model broke a statement of doc.go.

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// Gating (doc.go): a gated variant whose slot a flag-off instance freed
// competes again when the gated probe comes to it, within a lap. The probe
// once walked ranks of (tag, registration) order, and a variant gated
// during the lap with a lower tag took a rank before the probe's: every
// later rank moved one up as the probe did. It now walks gating order.
// Here t (weight 0.2, tag 5U) is gated and its slot freed by a flag-off
// ack; g0 and g1 stay at their limit; one newcomer a call is served at V
// and gated at V + 0.1U (weight 10). t must be probed within the lap.
func TestProbeNotStarvedByLowerTaggedJoiners(t *testing.T) {
	t.Parallel()
	m := New(Config{Limits: Limits{Key: 1}})
	m.SetWeight("t", 0.2)
	tIDs := add(t, m, "t", 2, 0, 0)
	add(t, m, "g0", 2, 0, 0)
	add(t, m, "g1", 2, 0, 0)
	require.Equal(t, []string{"t", "g0", "g1"}, servedKeys(m.Dequeue(3, 0)))
	require.Equal(t, 3, gatedCount(m))
	flagOffAck(t, m, tIDs[0]) // t is below its limit now, still gated
	calls := 0
	for i := 0; i < 30; i++ {
		k := fmt.Sprintf("n%02d", i)
		m.SetWeight(k, 10)
		add(t, m, k, 2, 0, 0)
		calls++
		for _, key := range servedKeys(m.Dequeue(1, 0)) {
			if key == "t" {
				return
			}
		}
		require.LessOrEqual(t, calls, 3+i+1, "never more gated variants than this")
	}
	require.Fail(t, "t, below its limit since a flag-off ack, was not probed in 30 calls",
		"gated variants: %d; nothing left the gated set; gp %d", gatedCount(m), m.gp)
}
