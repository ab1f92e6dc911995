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

// Gating (doc.go): a gated variant whose slot was freed without a word is
// probed within as many calls as there are gated variants ahead of it,
// however often other keys are gated again. The probe once took the next
// gating number after the one it looked at last and went back to the
// first only past the end; busy keys gated again at every call (served,
// met at their limit, acked by a flag-on instance with a key limit, which
// un-gates them) always left one ahead of it, so it never went back: g0,
// looked at just before a flag-off ack freed its slot, waited for ever (a
// review on a real Redis: 20,000 calls). Now a variant the probe finds at
// its limit takes the next number, behind every other.
func TestProbeNotStarvedByKeysGatedAgain(t *testing.T) {
	t.Parallel()
	m := New(Config{Limits: Limits{Key: 1}})
	const gated, busy = 20, 5
	held := map[string]string{}
	for i := 0; i < gated; i++ {
		add(t, m, fmt.Sprintf("g%02d", i), 2, 0, 0)
	}
	for _, s := range m.Dequeue(gated, 0) {
		held[s.Key] = decode(t, s.ID)
	}
	require.Len(t, held, gated)
	require.Empty(t, m.Dequeue(gated, 0), "every g at its limit")
	require.Equal(t, gated, gatedCount(m))
	require.Equal(t, int64(1), m.gp, "the probe looked at g00 (gating number 1)")
	flagOffAck(t, m, held["g00"]) // just after: its slot freed without a word
	for i := 0; i < busy; i++ {
		add(t, m, fmt.Sprintf("c%d", i), 4, 0, 0)
	}
	type hold struct {
		id, key string
		call    int
	}
	var hs []hold
	for call := 0; call < 10*(gated+busy); call++ {
		for len(hs) > 0 && hs[0].call+3 <= call {
			require.NoError(t, m.Ack(hs[0].id)) // flag on, with the limit: un-gates
			add(t, m, hs[0].key, 1, 0, 0)
			hs = hs[1:]
		}
		for _, s := range m.Dequeue(1, 0) {
			if s.Key == "g00" {
				// Within one lap of the gated variants (and the busy keys
				// gated meanwhile) after the release.
				require.LessOrEqual(t, call, 1+gated+busy, "g00 probed too late")
				return
			}
			hs = append(hs, hold{decode(t, s.ID), s.Key, call})
		}
	}
	require.Fail(t, "g00, below its limit since a flag-off ack, was never probed",
		"gated %d, gp %d, gn %d", gatedCount(m), m.gp, m.gn)
}

// Gating: a state the earlier probe wrote heals. That probe went on from
// the gating number it looked at last (gp) and moved nothing, so after an
// upgrade the variants it had looked at lie at or below gp. Taking the
// first after gp would come back to them only once every variant above gp
// left the gated set, never while one there stays at its limit; the probe
// takes the front of the queue instead.
func TestProbeHealsAStateTheCursorRuleWrote(t *testing.T) {
	t.Parallel()
	m := New(Config{Limits: Limits{Key: 1}})
	held := map[string]string{}
	add(t, m, "g00", 2, 0, 0)
	add(t, m, "g01", 2, 0, 0)
	for _, s := range m.Dequeue(2, 0) {
		held[s.Key] = decode(t, s.ID)
	}
	require.Empty(t, m.Dequeue(2, 0))
	require.Equal(t, int64(1), m.gp, "the probe looked at g00")
	m.reg[vm("g00")].Gate = m.gp // as the cursor rule left it: not moved
	m.gn--
	require.Less(t, m.reg[vm("g00")].Gate, m.reg[vm("g01")].Gate)
	flagOffAck(t, m, held["g00"]) // freed without a word; g01 stays held
	require.Equal(t, []string{"g00"}, servedKeys(m.Dequeue(1, 0)), "g00 at the front: probed and served at once")
}
