package vtime

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
)

// TestDequeueCallsExpired: a dequeue takes runs past their TTL as any
// (their key charged, a key limit counted within the call), marks them
// Expired, deletes them and frees their slots; DequeueCalls calls again
// for the rest while a call took such runs, within again; a run
// delivered once is not bound by its TTL any more.
func TestDequeueCallsExpired(t *testing.T) {
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
		ids := func(ss []Served) (out []string) {
			for _, s := range ss {
				x := s.ID
				if s.Expired {
					x += "!"
				}
				out = append(out, x)
			}
			return out
		}
		// a1 expires (a at its limit within the call), b1 is served; the
		// call again takes a2 (a's slot freed).
		require.Equal(t, []string{keys.Segment("a1") + "!", keys.Segment("b1"), keys.Segment("a2")}, ids(got), "flag on %v", on)
		require.Equal(t, 2, calls)
		st, _ := m.State("a1")
		require.Zero(t, st, "a1 deleted")
		// b2 (past its TTL) waits behind b1's slot; once b1 is acked a
		// dequeue takes and expires it.
		require.NoError(t, m.Ack("b1"))
		got, calls = m.DequeueCalls(5, 10, 0, on)
		require.Equal(t, []string{keys.Segment("b2") + "!"}, ids(got))
		require.Equal(t, 1, calls, "again 0: no call again")
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
}
