package vtime

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
)

// TestDequeueCallsExpired: a dequeue sweeps the runs past their TTL that
// come to the head of their variant (Swept: no serve, their key not
// charged, no slot, not counted for maxCount), the first TTLLook due in
// deadline order; one past its TTL beyond those is taken as any run (its
// key charged, its key's limit counted within the call), marked Expired,
// deleted and its slot freed, and DequeueCalls calls again for the rest
// while a call took such runs, within again; a run delivered once is not
// bound by its TTL any more.
func TestDequeueCallsExpired(t *testing.T) {
	ids := func(ss []Served) (out []string) {
		for _, s := range ss {
			x := s.ID
			switch {
			case s.Swept:
				x += "~"
			case s.Expired:
				x += "!"
			}
			out = append(out, x)
		}
		return out
	}
	for _, on := range []bool{true, false} {
		m := New(Config{Limits: Limits{Key: 1}})
		enq := func(id, key string, at int64) {
			if on {
				require.NoError(t, m.Enqueue(id, key, 0, at, at))
			} else {
				require.NoError(t, m.EnqueueOff(id, key, 0, at, at))
			}
		}
		enq("a1", "a", 0)
		m.SetTTL("a1", 10)
		enq("a2", "a", 1)
		enq("b1", "b", 2)
		enq("b2", "b", 3)
		m.SetTTL("b2", 10)
		got, calls := m.DequeueCalls(2, 10, 64, on)
		// a1 is swept at a's head: a2 is served in a's place (a's slot
		// free), then b1; no call again.
		require.Equal(t, []string{keys.Segment("a1") + "~", keys.Segment("a2"), keys.Segment("b1")}, ids(got), "flag on %v", on)
		require.Equal(t, 1, calls)
		st, _ := m.State("a1")
		require.Zero(t, st, "a1 deleted")
		// b2 (past its TTL) waits behind b1's slot (b at its limit is not
		// picked); once b1 is acked a dequeue sweeps it.
		require.NoError(t, m.Ack("b1"))
		got, calls = m.DequeueCalls(5, 10, 0, on)
		require.Equal(t, []string{keys.Segment("b2") + "~"}, ids(got))
		require.Equal(t, 1, calls)
		// A run delivered once is served after its old deadline.
		enq("c1", "c", 20)
		m.SetTTL("c1", 30)
		got, _ = m.DequeueCalls(1, 20, 64, on)
		require.Equal(t, []string{keys.Segment("c1")}, ids(got))
		_, err := m.Nack("c1", 20, 20, false)
		require.NoError(t, err)
		got, _ = m.DequeueCalls(1, 40, 64, on)
		require.Equal(t, []string{keys.Segment("c1")}, ids(got))
	}
	// More than TTLLook due: the call sweeps the first TTLLook at d's head,
	// then takes the next as a run (expired, d charged, counted for the
	// call's maxCount of 1), and the call again serves e's run.
	for _, on := range []bool{true, false} {
		m := New(Config{})
		enq := func(id, key string, at int64) {
			if on {
				require.NoError(t, m.Enqueue(id, key, 0, at, at))
			} else {
				require.NoError(t, m.EnqueueOff(id, key, 0, at, at))
			}
		}
		var want []string
		for i := range TTLLook + 1 {
			id := fmt.Sprintf("d%03d", i)
			enq(id, "d", int64(i))
			m.SetTTL(id, 500)
			if i < TTLLook {
				want = append(want, keys.Segment(id)+"~")
			}
		}
		want = append(want, keys.Segment(fmt.Sprintf("d%03d", TTLLook))+"!")
		enq("d-live", "d", 200)
		enq("e1", "e", 300)
		want = append(want, keys.Segment("e1"))
		if !on {
			want[len(want)-1] = keys.Segment("d-live") // age order
		}
		got, calls := m.DequeueCalls(1, 1000, 64, on)
		require.Equal(t, want, ids(got), "flag on %v", on)
		require.Equal(t, 2, calls)
	}
}
