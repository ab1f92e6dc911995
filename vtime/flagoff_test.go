package vtime

// Tests of the flag-off writers (EnqueueOff, DequeueOff, AckOff, NackOff,
// RecoverOff, RedriveOff): what an instance with the flag off writes to the
// state it shares with flag-on instances, and what it leaves alone.

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestEnqueueOff(t *testing.T) {
	t.Parallel()

	t.Run("ReadyNotRegistered", func(t *testing.T) {
		t.Parallel()
		m := clockAt2U(t)
		before := m.Snapshot()
		require.NoError(t, m.EnqueueOff("u1", "u", 0, 0, 0))
		st, att := m.State("u1")
		require.Equal(t, byte(Ready), st)
		require.Equal(t, 1, att)
		_, ok := regOf(m, "u")
		require.False(t, ok, "a flag-off enqueue registers nothing")
		require.Equal(t, before.Reg, m.Snapshot().Reg)
		require.Equal(t, before.Idle, m.Snapshot().Idle)
		require.Contains(t, m.CkIndex(), Entry{Member: vm("u"), Score: 0}, "the run is in ckIndex")
		// The flag-on call discovers u at V (2U); a flag-on enqueue would
		// have made it a newcomer at 4U (top 3U = V + U, plus U).
		require.Equal(t, []string{"u"}, servedKeys(m.Dequeue(1, 0)))
		p, ok := parkedOf(m, "u")
		require.True(t, ok)
		require.Equal(t, 3*U, p, "served at E = 2U: discovered, not a newcomer")

		on := clockAt2U(t)
		require.NoError(t, on.Enqueue("u1", "u", 0, 0, 0))
		require.Equal(t, Reg{U: 4 * U, Seq: 2, Waiting: true}, mustReg(t, on, "u"), "the flag-on enqueue, for contrast")
	})

	t.Run("ParkedTagKeptForDiscovery", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		m.SetWeight("u", 0.5)
		add(t, m, "u", 1, 0, 0)
		add(t, m, "b", 20, 0, 0)
		require.Equal(t, []string{"u"}, deqAck(t, m, 1, 0)) // u parked at 2U
		require.NoError(t, m.EnqueueOff("u2", "u", 0, 0, 0))
		p, ok := parkedOf(m, "u")
		require.True(t, ok, "the parked tag stays until a flag-on call registers u")
		require.Equal(t, 2*U, p)
		_, ok = regOf(m, "u")
		require.False(t, ok)
		require.Equal(t, []string{"b"}, deqAck(t, m, 1, 0))
		require.Equal(t, Reg{U: 2 * U, Seq: 3}, mustReg(t, m, "u"), "discovered at its parked tag")
	})

	t.Run("Delayed", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		require.NoError(t, m.EnqueueOff("d1", "d", 3, 50, 0))
		st, _ := m.State("d1")
		require.Equal(t, byte(Delayed), st)
		require.Empty(t, m.CkIndex())
		require.Equal(t, []Entry{{Member: vm("d"), Score: 50}}, m.DelayIndex())
		require.Empty(t, m.Dequeue(1, 10))
		// Due: a flag-on call promotes it, which registers (cold start: V).
		require.Equal(t, []string{"d"}, servedKeys(m.Dequeue(1, 50)))
	})

	t.Run("PriorityScore", func(t *testing.T) {
		t.Parallel()
		m := New(Config{PriorityStep: 1000})
		require.NoError(t, m.EnqueueOff("p1", "p", 2, 5000, 6000))
		require.Equal(t, []Entry{{Member: vm("p"), Score: 3000}}, m.CkIndex())
	})

	t.Run("Exists", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		require.NoError(t, m.Enqueue("x", "a", 0, 0, 0))
		require.ErrorIs(t, m.EnqueueOff("x", "b", 0, 0, 0), ErrExists)
		require.NoError(t, m.EnqueueOff("y", "b", 0, 0, 0))
		require.ErrorIs(t, m.Enqueue("y", "a", 0, 0, 0), ErrExists)
		require.ErrorIs(t, m.EnqueueOff("y", "a", 0, 0, 0), ErrExists)
	})
}

// gatedOne builds a model with key limit 1 where a was served once and
// gated (a second run of a is ready) and b competes; it returns a's run
// in flight.
func gatedOne(t *testing.T) (*Model, string) {
	m := New(Config{Limits: Limits{Key: 1}, MaxAttempts: 3})
	add(t, m, "a", 2, 0, 0)
	add(t, m, "b", 20, 0, 0)
	out := m.Dequeue(1, 0)
	require.Equal(t, []string{"a"}, servedKeys(out))
	require.True(t, mustReg(t, m, "a").Gated)
	return m, decode(t, out[0].ID)
}

func TestAckOff(t *testing.T) {
	t.Parallel()

	t.Run("GatedStaysGatedUntilProbe", func(t *testing.T) {
		t.Parallel()
		m, id := gatedOne(t)
		before := mustReg(t, m, "a")
		require.NoError(t, m.AckOff(id))
		st, _ := m.State(id)
		require.Equal(t, byte(0), st, "the run is gone")
		require.Zero(t, m.Snapshot().InFlight[vm("a")], "the slot is free")
		require.Equal(t, before, mustReg(t, m, "a"), "still gated: no word to the scheduler")
		// The next flag-on call's probe finds a below its limit and un-gates
		// it (at max(S, V) = U): b (tag 0) is served first, then a.
		require.Equal(t, []string{"b", "a"}, servedKeys(m.Dequeue(2, 0)))
		_, _, _, _, _, _, gp := m.Clock()
		require.Equal(t, before.Gate, gp, "the probe looked at a")
		_, ok := regOf(m, "a")
		require.False(t, ok, "a drained")
		p, ok := parkedOf(m, "a")
		require.True(t, ok)
		require.Equal(t, 2*U, p, "served at its tag U")
	})

	t.Run("AckUngatesAtOnce", func(t *testing.T) {
		t.Parallel()
		// For contrast: the flag-on ack un-gates a itself.
		m, id := gatedOne(t)
		require.NoError(t, m.Ack(id))
		require.False(t, mustReg(t, m, "a").Gated)
	})

	t.Run("Errors", func(t *testing.T) {
		t.Parallel()
		m, id := gatedOne(t)
		require.ErrorIs(t, m.AckOff("nope"), ErrNotFound)
		queued := ""
		for _, s := range m.Snapshot().Runs {
			if s.Key == "a" {
				queued = decode(t, s.ID)
			}
		}
		require.ErrorIs(t, m.AckOff(queued), ErrNotInFlight)
		require.NoError(t, m.AckOff(id))
		require.ErrorIs(t, m.AckOff(id), ErrNotFound, "acked once")
	})
}

func TestNackOff(t *testing.T) {
	t.Parallel()

	t.Run("GatedStaysGated", func(t *testing.T) {
		t.Parallel()
		m, id := gatedOne(t)
		before := mustReg(t, m, "a")
		ok, err := m.NackOff(id, 0, 0, false)
		require.NoError(t, err)
		require.True(t, ok)
		st, att := m.State(id)
		require.Equal(t, byte(Ready), st)
		require.Equal(t, 2, att)
		require.Zero(t, m.Snapshot().InFlight[vm("a")])
		require.Equal(t, before, mustReg(t, m, "a"), "still gated")

		on, id := gatedOne(t)
		_, err = on.Nack(id, 0, 0, false)
		require.NoError(t, err)
		require.False(t, mustReg(t, on, "a").Gated, "the flag-on nack, for contrast")
	})

	t.Run("UntaggedNotRegistered", func(t *testing.T) {
		t.Parallel()
		// u's only run is in flight and u has parked: the nack makes it
		// ready again without a registration.
		m := New(Config{})
		add(t, m, "b", 20, 0, 0)
		add(t, m, "u", 1, 0, 0)
		out := m.Dequeue(2, 0)
		require.Equal(t, []string{"b", "u"}, servedKeys(out))
		_, ok := regOf(m, "u")
		require.False(t, ok)
		idle := m.Snapshot().Idle
		ok, err := m.NackOff(decode(t, out[1].ID), 0, 0, false)
		require.NoError(t, err)
		require.True(t, ok)
		_, ok = regOf(m, "u")
		require.False(t, ok, "a flag-off nack registers nothing")
		require.Equal(t, idle, m.Snapshot().Idle, "nor takes a parked tag")
		require.Contains(t, m.CkIndex(), Entry{Member: vm("u"), Score: 0})

		on := New(Config{})
		add(t, on, "b", 20, 0, 0)
		add(t, on, "u", 1, 0, 0)
		out = on.Dequeue(2, 0)
		_, err = on.Nack(decode(t, out[1].ID), 0, 0, false)
		require.NoError(t, err)
		_, ok = regOf(on, "u")
		require.True(t, ok, "the flag-on nack registers, for contrast")
	})

	t.Run("DelayedAndDead", func(t *testing.T) {
		t.Parallel()
		m, id := gatedOne(t)
		ok, err := m.NackOff(id, 40, 0, false)
		require.NoError(t, err)
		require.True(t, ok)
		st, att := m.State(id)
		require.Equal(t, byte(Delayed), st)
		require.Equal(t, 2, att)
		require.Equal(t, []Entry{{Member: vm("a"), Score: 40}}, m.DelayIndex())

		m, id = gatedOne(t)
		ok, err = m.NackOff(id, 0, 0, true)
		require.NoError(t, err)
		require.False(t, ok, "dead-lettered on request")
		st, _ = m.State(id)
		require.Equal(t, byte(Dead), st)
		require.True(t, mustReg(t, m, "a").Gated)
		require.NoError(t, m.Redrive(id, 0))

		// Out of attempts (MaxAttempts 3): the third nack dead-letters.
		m = New(Config{MaxAttempts: 3})
		add(t, m, "c", 1, 0, 0)
		for i := 1; ; i++ {
			out := m.Dequeue(1, 0)
			require.Len(t, out, 1)
			require.Equal(t, i, out[0].Attempt)
			ok, err := m.NackOff(decode(t, out[0].ID), 0, 0, false)
			require.NoError(t, err)
			if i == 3 {
				require.False(t, ok)
				break
			}
			require.True(t, ok)
		}
		_, err = m.NackOff("nope", 0, 0, false)
		require.ErrorIs(t, err, ErrNotFound)
	})
}

// servedIDs is the decoded ids of s, in serve order.
func servedIDs(t *testing.T, s []Served) []string {
	var out []string
	for _, x := range s {
		out = append(out, decode(t, x.ID))
	}
	return out
}

func TestDequeueOff(t *testing.T) {
	t.Parallel()

	t.Run("AgeOrderWithinTheWindow", func(t *testing.T) {
		t.Parallel()
		// Scan 2, no key limit, capacity 3: the window is a10, b20 and the
		// bound c30. a's next head (40) sorts after the bound: a leaves the
		// window, b is served and emptied, and the call ends with c and a's
		// second run still ready (two runs of three).
		m := New(Config{ScanLimit: 2})
		for _, r := range []struct {
			id, key string
			at      int64
		}{{"a1", "a", 10}, {"a2", "a", 40}, {"b1", "b", 20}, {"c1", "c", 30}} {
			require.NoError(t, m.EnqueueOff(r.id, r.key, 0, r.at, 100))
		}
		require.Equal(t, []string{"a1", "b1"}, servedIDs(t, m.DequeueOff(3, 100)))
		require.Equal(t, []Entry{{Member: vm("c"), Score: 30}, {Member: vm("a"), Score: 40}}, m.CkIndex())
		// The next call reads both: c, then a.
		require.Equal(t, []string{"c1", "a2"}, servedIDs(t, m.DequeueOff(3, 100)))
		require.Empty(t, m.CkIndex())
	})

	t.Run("PriorityAndResort", func(t *testing.T) {
		t.Parallel()
		// Age order is the ready score: a priority-1 run enqueued last comes
		// first; a variant re-sorts at its next head within the window.
		m := New(Config{PriorityStep: 1000})
		require.NoError(t, m.EnqueueOff("a1", "a", 0, 10, 5000))
		require.NoError(t, m.EnqueueOff("a2", "a", 0, 30, 5000))
		require.NoError(t, m.EnqueueOff("b1", "b", 0, 20, 5000))
		require.NoError(t, m.EnqueueOff("p1", "p", 1, 5000, 5000)) // score 4000
		require.Equal(t, []string{"a1", "b1", "a2"}, servedIDs(t, m.DequeueOff(3, 5000)))
		require.Equal(t, []string{"p1"}, servedIDs(t, m.DequeueOff(3, 5000)), "4000 after 10, 20 and 30")
	})

	t.Run("KeyLimit", func(t *testing.T) {
		t.Parallel()
		// A variant at its key limit is passed over, not taken out: a's
		// second run waits while b is served.
		m := New(Config{Limits: Limits{Key: 1}})
		require.NoError(t, m.EnqueueOff("a1", "a", 0, 10, 100))
		require.NoError(t, m.EnqueueOff("a2", "a", 0, 11, 100))
		require.NoError(t, m.EnqueueOff("b1", "b", 0, 20, 100))
		require.Equal(t, []string{"a1", "b1"}, servedIDs(t, m.DequeueOff(3, 100)))
		require.Empty(t, m.DequeueOff(3, 100), "both at their limit")
		require.NoError(t, m.AckOff("a1"))
		require.Equal(t, []string{"a2"}, servedIDs(t, m.DequeueOff(3, 100)))
	})

	t.Run("QueueLimit", func(t *testing.T) {
		t.Parallel()
		m := New(Config{Limits: Limits{Queue: 2}})
		for i, k := range []string{"a", "b", "c"} {
			require.NoError(t, m.EnqueueOff(k+"1", k, 0, int64(i), 100))
		}
		require.Equal(t, []string{"a1", "b1"}, servedIDs(t, m.DequeueOff(5, 100)))
		require.Empty(t, m.DequeueOff(5, 100))
	})

	t.Run("NoSchedulerWrite", func(t *testing.T) {
		t.Parallel()
		// x is registered by a flag-on enqueue; d falls due and is
		// promoted by a later flag-off call; the two calls serve both and
		// write nothing to the scheduler: x keeps its (now stale) registration,
		// d is not registered.
		m := New(Config{})
		require.NoError(t, m.Enqueue("x1", "x", 0, 0, 0))
		require.NoError(t, m.EnqueueOff("d1", "d", 0, 50, 0))
		before := m.Snapshot()
		require.Equal(t, []string{"x1"}, servedIDs(t, m.DequeueOff(5, 49)), "d not due yet")
		require.Equal(t, []string{"d1"}, servedIDs(t, m.DequeueOff(5, 50)))
		after := m.Snapshot()
		require.Equal(t, before.Reg, after.Reg)
		require.Equal(t, before.Idle, after.Idle)
		require.Equal(t, before.V, after.V)
		require.Equal(t, before.Cursor, after.Cursor)
		require.Equal(t, before.NextSeq, after.NextSeq)
		_, ok := regOf(m, "d")
		require.False(t, ok)
		// A flag-on call meets x's stale registration and collects it.
		require.Empty(t, m.Dequeue(1, 50))
		_, ok = regOf(m, "x")
		require.False(t, ok, "collected")
	})
}

func TestRecoverOff(t *testing.T) {
	t.Parallel()
	m, id := gatedOne(t)
	before := mustReg(t, m, "a")
	ok, err := m.RecoverOff(id, 0)
	require.NoError(t, err)
	require.True(t, ok)
	after := mustReg(t, m, "a")
	require.True(t, after.Gated, "a flag-off recovery leaves the variant gated for the probe")
	require.Equal(t, before, after, "nor does it touch the registration")
	st, att := m.State(id)
	require.Equal(t, byte(Ready), st)
	require.Equal(t, 2, att)
}

func TestRedriveOff(t *testing.T) {
	t.Parallel()
	// u's only run dies while u has parked: a flag-off redrive makes it
	// ready again without a registration; a flag-on one registers u.
	for _, flagOn := range []bool{false, true} {
		m := New(Config{})
		add(t, m, "b", 20, 0, 0)
		add(t, m, "u", 1, 0, 0)
		out := m.Dequeue(2, 0)
		require.Equal(t, []string{"b", "u"}, servedKeys(out))
		id := decode(t, out[1].ID)
		ok, err := m.Nack(id, 0, 0, true)
		require.NoError(t, err)
		require.False(t, ok, "dead-lettered")
		idle := m.Snapshot().Idle
		redrive := m.RedriveOff
		if flagOn {
			redrive = m.Redrive
		}
		require.NoError(t, redrive(id, 5))
		st, att := m.State(id)
		require.Equal(t, byte(Ready), st)
		require.Equal(t, 1, att, "attempts reset")
		require.Contains(t, m.CkIndex(), Entry{Member: vm("u"), Score: 5})
		_, ok = regOf(m, "u")
		require.Equal(t, flagOn, ok, "registered only by the flag-on redrive (flag on: %v)", flagOn)
		if !flagOn {
			require.Equal(t, idle, m.Snapshot().Idle, "nor takes a parked tag")
		}
		require.ErrorIs(t, m.RedriveOff(id, 5), ErrNotDead)
	}
}
