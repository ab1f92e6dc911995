package vtime

import (
	"fmt"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
)

// U is one serve at weight 1 in units, typed for arithmetic on tags.
const U = int64(Unit)

// vm is the variant member of key.
func vm(key string) string { return keys.VariantMember(key) }

// regOf returns key's registration.
func regOf(m *Model, key string) (Reg, bool) {
	r, ok := m.reg[vm(key)]
	if !ok {
		return Reg{}, false
	}
	return *r, true
}

// mustReg returns key's registration and fails when it has none.
func mustReg(t testing.TB, m *Model, key string) Reg {
	t.Helper()
	r, ok := regOf(m, key)
	require.True(t, ok, "%q is not registered", key)
	return r
}

func parkedOf(m *Model, key string) (int64, bool) {
	p, ok := m.idle[vm(key)]
	return p, ok
}

// logical is the logical clock: epoch*RebaseBy + stored V (units).
func logical(m *Model) int64 { return m.epoch*RebaseBy + m.v }

func servedKeys(s []Served) []string {
	out := make([]string, len(s))
	for i, x := range s {
		out[i] = x.Key
	}
	return out
}

// add enqueues n runs of key available at at (ready when at <= now), with
// fresh ids, and returns the ids.
func add(t testing.TB, m *Model, key string, n int, at, now int64) []string {
	t.Helper()
	var ids []string
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("%s#%d", key, len(m.runs))
		for {
			if _, taken := m.runs[keys.Segment(id)]; !taken {
				break
			}
			id += "'"
		}
		require.NoError(t, m.Enqueue(id, key, 0, at, now))
		ids = append(ids, id)
	}
	return ids
}

func decode(t testing.TB, enc string) string {
	t.Helper()
	id, err := keys.DecodeSegment(enc)
	require.NoError(t, err)
	return id
}

// ackAll acks the runs a dequeue served.
func ackAll(t testing.TB, m *Model, served []Served) {
	t.Helper()
	for _, s := range served {
		require.NoError(t, m.Ack(decode(t, s.ID)))
	}
}

// deqAck dequeues maxCount at now and acks what it served.
func deqAck(t testing.TB, m *Model, maxCount int, now int64) []string {
	t.Helper()
	out := m.Dequeue(maxCount, now)
	ackAll(t, m, out)
	return servedKeys(out)
}

// flagOffEnqueue queues a ready run the way a flag-off instance does: in
// its variant and ckIndex, without registering a tag.
func flagOffEnqueue(m *Model, id, key string, at int64) {
	r := &run{id: keys.Segment(id), key: key, at: at, attempt: 1, state: Ready}
	m.runs[r.id] = r
	addTo(m.ready, m.member(r), r.id, m.readyScore(r))
}

// flagOffServe delivers key's ready head the way a flag-off dequeue does:
// in flight, without touching the scheduler state (a drain leaves a stale
// registration). It returns the decoded id.
func flagOffServe(t testing.TB, m *Model, key string) string {
	t.Helper()
	v := vm(key)
	h, ok := head(m.ready[v])
	require.True(t, ok, "%q has no ready run", key)
	delete(m.ready[v], h.Member)
	if len(m.ready[v]) == 0 {
		delete(m.ready, v)
	}
	m.runs[h.Member].state = InFlight
	m.inflight[v]++
	return decode(t, h.Member)
}

// flagOffAck completes an in-flight run without the release hook (a
// flag-off ack): the slot frees, a gated variant stays gated.
func flagOffAck(t testing.TB, m *Model, id string) {
	t.Helper()
	r, err := m.held(id)
	require.NoError(t, err)
	v := vm(r.key)
	m.inflight[v]--
	if m.inflight[v] == 0 {
		delete(m.inflight, v)
	}
	delete(m.runs, r.id)
}

func regMembers(m *Model) []string {
	var out []string
	for _, e := range m.Registered() {
		out = append(out, e.Member)
	}
	return out
}

func gatedCount(m *Model) int {
	n := 0
	for _, r := range m.reg {
		if r.Gated {
			n++
		}
	}
	return n
}

func TestNewcomerRule(t *testing.T) {
	t.Parallel()

	t.Run("ColdStartEveryKeyAtV", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		for _, k := range []string{"c", "a", "b"} {
			add(t, m, k, 2, 0, 0)
		}
		// No tag above V: every newcomer starts at V, in arrival order.
		require.Equal(t, Reg{U: 0, Seq: 1}, mustReg(t, m, "c"))
		require.Equal(t, Reg{U: 0, Seq: 2}, mustReg(t, m, "a"))
		require.Equal(t, Reg{U: 0, Seq: 3}, mustReg(t, m, "b"))
		require.Equal(t, []int64{0, 0, 0, 0, 4, 0, 0}, []int64{m.v, m.epoch, m.l, int64(m.cursor), m.nextSeq, int64(m.gk), int64(m.gs)})
		require.True(t, m.hasL)
		require.Equal(t, []string{vm("c"), vm("a"), vm("b")}, regMembers(m))
	})

	t.Run("ColdStartAfterDrainAtCurrentV", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		add(t, m, "a", 3, 0, 0)
		require.Equal(t, []string{"a", "a", "a"}, servedKeys(m.Dequeue(3, 0))) // E 0, U, 2U
		require.Equal(t, 2*U, m.v)
		p, ok := parkedOf(m, "a")
		require.True(t, ok)
		require.Equal(t, 3*U, p)
		// Nothing is registered: b starts at V, and becomes the anchor.
		add(t, m, "b", 1, 0, 0)
		require.Equal(t, Reg{U: 2 * U, Seq: 2}, mustReg(t, m, "b"))
		require.Equal(t, 2*U, m.l)
	})

	t.Run("NotAboveVStartsAtV", func(t *testing.T) {
		t.Parallel()
		// A registered tag at V (never served) does not push a newcomer back.
		m := New(Config{})
		add(t, m, "a", 1, 0, 0)
		add(t, m, "b", 1, 0, 0)
		require.Equal(t, int64(0), mustReg(t, m, "b").U)
	})

	t.Run("OneUnitBehindThePack", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		add(t, m, "a", 5, 0, 0)
		require.Equal(t, []string{"a"}, servedKeys(m.Dequeue(1, 0))) // V 0, S_a U
		add(t, m, "n", 1, 0, 0)
		// top U (capped at V+U = U), anchor 0: A = U > V, so n is at 2U.
		require.Equal(t, Reg{U: 2 * U, Seq: 2}, mustReg(t, m, "n"))
		require.Equal(t, 2*U, m.l)
		require.True(t, m.hasL)
	})

	t.Run("ChainedNewcomers", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		add(t, m, "a", 5, 0, 0)
		m.Dequeue(1, 0)
		for i, want := range []int64{2 * U, 3 * U, 4 * U, 5 * U} {
			k := fmt.Sprintf("n%d", i)
			add(t, m, k, 1, 0, 0)
			// The cap keeps top at V+U; the chain comes from the anchor,
			// which the previous newcomer (the highest tag) does not cap.
			require.Equal(t, want, mustReg(t, m, k).U, k)
			require.Equal(t, want, m.l, k)
		}
		// They are served one round each, in registration order.
		got := servedKeys(m.Dequeue(8, 0))
		// a has 4 runs left: a (U), a (2U, seq 1 before n0's 2U), n0, a,
		// n1, a (drained), n2, n3.
		require.Equal(t, []string{"a", "a", "n0", "a", "n1", "a", "n2", "n3"}, got)
	})

	t.Run("CapAtVPlusUnitAgainstLowWeightTag", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		m.SetWeight("x", 0.01)
		add(t, m, "x", 5, 0, 0)
		add(t, m, "y", 5, 0, 0)
		require.Equal(t, []string{"x", "y"}, servedKeys(m.Dequeue(2, 0)))
		require.Equal(t, 100*U, mustReg(t, m, "x").U) // 0 + 10^9/10
		require.Equal(t, U, mustReg(t, m, "y").U)
		add(t, m, "n", 1, 0, 0)
		// Anchored on the highest tag n would sit at 101U; capped at V+U it
		// sits one unit behind y.
		require.Equal(t, 2*U, mustReg(t, m, "n").U)
		// y (U) first, then y (2U, seq 2) before n (2U, seq 3).
		require.Equal(t, []string{"y", "y", "n"}, servedKeys(m.Dequeue(3, 0)))
	})

	t.Run("AnchorCappedAfterNewcomersExpire", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		add(t, m, "a", 5, 0, 0)
		m.Dequeue(1, 0) // S_a = U, V = 0
		var ids []string
		for i := 0; i < 300; i++ {
			k := fmt.Sprintf("n%03d", i)
			ids = append(ids, add(t, m, k, 1, 0, 0)...)
			require.Equal(t, int64(i+2)*U, mustReg(t, m, k).U)
		}
		require.Equal(t, 301*U, m.l)
		for _, id := range ids {
			require.True(t, m.Expire(id))
		}
		require.Len(t, m.reg, 1)
		require.Len(t, m.idle, 300, "each expired newcomer parked its tag (above V)")
		add(t, m, "late", 1, 0, 0)
		// The anchor 301U is capped at the highest active tag (U): late is
		// one unit behind the pack, not 300 rounds behind the gone keys.
		require.Equal(t, 2*U, mustReg(t, m, "late").U)
		require.LessOrEqual(t, mustReg(t, m, "late").U, m.v+2*U)
	})

	t.Run("GatedTagsAreNotThePack", func(t *testing.T) {
		t.Parallel()
		m := New(Config{Limits: Limits{Key: 1}})
		m.SetWeight("x", 0.01)
		add(t, m, "x", 3, 0, 0)
		require.Equal(t, []string{"x"}, servedKeys(m.Dequeue(1, 0)))
		require.Equal(t, Reg{U: 100 * U, Seq: 1, Gated: true}, mustReg(t, m, "x"))
		// The only tag is gated: no active tag, n starts at V.
		add(t, m, "n", 1, 0, 0)
		require.Equal(t, int64(0), mustReg(t, m, "n").U)
	})
}

func TestReturnAndPark(t *testing.T) {
	t.Parallel()

	t.Run("ReturnAtParkedAboveV", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		add(t, m, "a", 1, 0, 0)
		add(t, m, "b", 5, 0, 0)
		require.Equal(t, []string{"a"}, servedKeys(m.Dequeue(1, 0)))
		_, ok := regOf(m, "a")
		require.False(t, ok)
		p, ok := parkedOf(m, "a")
		require.True(t, ok, "a drained with S U > V 0: parked")
		require.Equal(t, U, p)
		l := m.l

		add(t, m, "a", 1, 0, 0)
		require.Equal(t, Reg{U: U, Seq: 3}, mustReg(t, m, "a"), "max(V, parked)")
		_, ok = parkedOf(m, "a")
		require.False(t, ok, "the parked entry goes")
		require.Equal(t, l, m.l, "a return is not a newcomer: the anchor stays")
	})

	t.Run("ReturnAtVWhenParkedBelow", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		add(t, m, "a", 1, 0, 0)
		add(t, m, "b", 9, 0, 0)
		require.Equal(t, []string{"a", "b", "b", "b"}, servedKeys(m.Dequeue(4, 0)))
		require.Equal(t, 2*U, m.v)
		// The call parked a at U, and reaped at its end: U <= V.
		_, ok := parkedOf(m, "a")
		require.False(t, ok)

		m2 := New(Config{})
		add(t, m2, "a", 1, 0, 0)
		add(t, m2, "b", 9, 0, 0)
		require.Equal(t, []string{"a"}, servedKeys(m2.Dequeue(1, 0)))
		require.Equal(t, []string{"b", "b", "b"}, servedKeys(m2.Dequeue(3, 0)))
		// This call parked nothing: the worthless entry (U <= V 2U) stays.
		p, ok := parkedOf(m2, "a")
		require.True(t, ok)
		require.Equal(t, U, p)
		add(t, m2, "a", 1, 0, 0)
		require.Equal(t, 2*U, mustReg(t, m2, "a").U, "max(V, parked) = V")
	})

	t.Run("ExpireParksOnlyAboveV", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		idb := add(t, m, "b", 2, 0, 0)
		ida := add(t, m, "a", 1, 0, 0)
		// b (seq 1) is served: b at U > V = 0; a stays at 0 (= V).
		require.Equal(t, []string{"b"}, servedKeys(m.Dequeue(1, 0)))
		require.True(t, m.Expire(ida[0]))
		_, ok := parkedOf(m, "a")
		require.False(t, ok, "a's tag 0 is not above V: not parked")
		require.True(t, m.Expire(idb[1]))
		p, ok := parkedOf(m, "b")
		require.True(t, ok)
		require.Equal(t, U, p)
		require.Empty(t, m.reg)
	})
}

func TestReaping(t *testing.T) {
	t.Parallel()

	t.Run("IdleCapKeepsHighestTiesByMember", func(t *testing.T) {
		t.Parallel()
		m := New(Config{IdleMaxEntries: 2})
		for _, k := range []string{"c", "a", "b"} {
			add(t, m, k, 1, 0, 0)
		}
		add(t, m, "z", 9, 0, 0)
		require.Equal(t, []string{"c", "a", "b"}, servedKeys(m.Dequeue(3, 0)))
		// All three parked at U; the cap keeps two, dropping the lowest
		// (tag, member): =a.
		require.Equal(t, []Entry{{vm("b"), float64(U)}, {vm("c"), float64(U)}}, m.Idle())
	})

	t.Run("IdleCapKeepsHighestTags", func(t *testing.T) {
		t.Parallel()
		m := New(Config{IdleMaxEntries: 2})
		for k, w := range map[string]float64{"a": 0.5, "b": 1, "c": 0.25} {
			m.SetWeight(k, w)
		}
		for _, k := range []string{"a", "b", "c"} {
			add(t, m, k, 1, 0, 0)
		}
		require.Len(t, m.Dequeue(3, 0), 3)
		require.Equal(t, []Entry{{vm("a"), float64(2 * U)}, {vm("c"), float64(4 * U)}}, m.Idle())
	})

	t.Run("AtOrBelowVReapedByParkingCall", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		add(t, m, "a", 1, 0, 0)
		add(t, m, "b", 9, 0, 0)
		require.Equal(t, []string{"a"}, servedKeys(m.Dequeue(1, 0))) // a parked at U
		require.Equal(t, []string{"b", "b"}, servedKeys(m.Dequeue(2, 0)))
		require.Equal(t, U, m.v)
		_, ok := parkedOf(m, "a")
		require.True(t, ok, "a call that parks nothing does not reap")
		add(t, m, "c", 1, 0, 0) // newcomer: top 2U capped at V+U = 2U: at 3U
		require.Equal(t, 3*U, mustReg(t, m, "c").U)
		// b (2U), b (3U, seq 2 before c's seq 3), c (3U): V = 3U.
		require.Equal(t, []string{"b", "b", "c"}, servedKeys(m.Dequeue(3, 0)))
		// c drained and parked: the call reaps a (U <= V).
		_, ok = parkedOf(m, "a")
		require.False(t, ok)
		require.Equal(t, []Entry{{vm("c"), float64(4 * U)}}, m.Idle())
	})

	t.Run("ExpireThatParksReaps", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		add(t, m, "a", 1, 0, 0)
		add(t, m, "b", 9, 0, 0)
		m.Dequeue(1, 0) // a parked at U
		m.Dequeue(2, 0) // V = U: a's entry is worthless but stays
		idc := add(t, m, "c", 2, 0, 0)
		require.True(t, m.Expire(idc[0]), "not c's last run: no park")
		_, ok := parkedOf(m, "a")
		require.True(t, ok)
		require.True(t, m.Expire(idc[1]), "c drains: parks at 3U, reaps a")
		_, ok = parkedOf(m, "a")
		require.False(t, ok)
		require.Equal(t, []Entry{{vm("c"), float64(3 * U)}}, m.Idle())
	})
}

func TestTiesByRegistrationOrder(t *testing.T) {
	t.Parallel()

	t.Run("AdversarialNameDoesNotWinTie", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		add(t, m, "b", 3, 0, 0)
		add(t, m, "!", 3, 0, 0) // "=%21" sorts before "=b"
		add(t, m, "", 3, 0, 0)  // "=" sorts before both
		require.Less(t, vm(""), vm("!"))
		require.Less(t, vm("!"), vm("b"))
		for _, k := range []string{"b", "!", ""} {
			require.Equal(t, int64(0), mustReg(t, m, k).U)
		}
		require.Equal(t, []string{"b", "!", "", "b", "!", ""}, servedKeys(m.Dequeue(6, 0)))
	})

	t.Run("StoredTagBeforeRegistrationOrder", func(t *testing.T) {
		t.Parallel()
		// E = max(S, V) ties at V: the lower stored tag goes first, then the
		// earlier registration.
		m := New(Config{})
		add(t, m, "a", 3, 0, 0)
		add(t, m, "b", 3, 0, 0)
		m.reg[vm("a")].U, m.reg[vm("b")].U = 5, 3
		m.v = 10
		require.Equal(t, []string{"b", "a"}, servedKeys(m.Dequeue(2, 0)))
		require.Equal(t, Reg{U: 10 + U, Seq: 2}, mustReg(t, m, "b"))
		require.Equal(t, Reg{U: 10 + U, Seq: 1}, mustReg(t, m, "a"))
		require.Equal(t, []string{vm("a"), vm("b")}, regMembers(m))
	})

	t.Run("ManyNamesServeInArrivalOrder", func(t *testing.T) {
		t.Parallel()
		names := []string{"zz", "~", "!", "a", "", " ", "%", "é", "0", "Z"}
		m := New(Config{})
		for _, k := range names {
			add(t, m, k, 1, 0, 0)
		}
		require.Equal(t, names, servedKeys(m.Dequeue(len(names), 0)))
	})
}

func TestGating(t *testing.T) {
	t.Parallel()

	t.Run("GatedAtServe", func(t *testing.T) {
		t.Parallel()
		m := New(Config{Limits: Limits{Key: 1}})
		add(t, m, "a", 3, 0, 0)
		add(t, m, "b", 3, 0, 0)
		require.Equal(t, []string{"a"}, servedKeys(m.Dequeue(1, 0)))
		require.Equal(t, Reg{U: U, Seq: 1, Gated: true}, mustReg(t, m, "a"))
		require.Equal(t, 1, m.gk)
		require.Equal(t, []string{vm("b"), vm("a")}, regMembers(m), "gated after the others")
		require.Equal(t, []string{"b"}, servedKeys(m.Dequeue(5, 0)))
		require.True(t, mustReg(t, m, "b").Gated)
		require.Empty(t, m.Dequeue(5, 0), "every variant at its limit")
		require.Equal(t, Reg{U: U, Seq: 1, Gated: true}, mustReg(t, m, "a"), "the tag is kept")
	})

	t.Run("GatedTagsAreNotRead", func(t *testing.T) {
		t.Parallel()
		// Gating takes the entry out of the competition: later newcomers
		// are not pushed behind it and it is not a candidate.
		m := New(Config{Limits: Limits{Key: 2}})
		add(t, m, "a", 5, 0, 0)
		require.Equal(t, []string{"a", "a"}, servedKeys(m.Dequeue(5, 0)))
		require.Equal(t, Reg{U: 2 * U, Seq: 1, Gated: true}, mustReg(t, m, "a"))
		require.Equal(t, U, m.v)
	})

	t.Run("GatedOnEncounter", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		add(t, m, "a", 3, 0, 0)
		add(t, m, "b", 3, 0, 0)
		add(t, m, "c", 3, 0, 0)
		require.Equal(t, []string{"a", "b"}, servedKeys(m.Dequeue(2, 0)))
		m.SetLimits(Limits{Key: 1})
		// c (tag 0) is served and gated at its serve; a and b (U) are then
		// met at their limit (in flight 1) and gated.
		require.Equal(t, []string{"c"}, servedKeys(m.Dequeue(3, 0)))
		require.True(t, mustReg(t, m, "a").Gated)
		require.True(t, mustReg(t, m, "b").Gated)
		require.True(t, mustReg(t, m, "c").Gated, "c reached its limit at its serve")
		require.Equal(t, U, mustReg(t, m, "a").U)
		require.Equal(t, 1, m.gk)
	})

	t.Run("UnderLimitNotGated", func(t *testing.T) {
		t.Parallel()
		m := New(Config{Limits: Limits{Key: 3}})
		add(t, m, "a", 5, 0, 0)
		require.Equal(t, []string{"a", "a"}, servedKeys(m.Dequeue(2, 0)))
		require.False(t, mustReg(t, m, "a").Gated)
		require.Equal(t, 0, m.gk)
	})
}

// gatedBehind builds a model with key limit 1 where a (weight w) was
// served once and gated, and b was served (and acked) until V passed a's
// tag when pastV: a's run in flight is returned.
func gatedBehind(t *testing.T, w float64, pastV bool) (*Model, string) {
	m := New(Config{Limits: Limits{Key: 1}, MaxAttempts: 5})
	m.SetWeight("a", w)
	add(t, m, "a", 2, 0, 0)
	add(t, m, "b", 20, 0, 0)
	out := m.Dequeue(1, 0)
	require.Equal(t, []string{"a"}, servedKeys(out))
	require.True(t, mustReg(t, m, "a").Gated)
	for pastV && m.v <= mustReg(t, m, "a").U {
		require.Equal(t, []string{"b"}, deqAck(t, m, 1, 0))
	}
	return m, decode(t, out[0].ID)
}

func TestRelease(t *testing.T) {
	t.Parallel()
	release := map[string]func(t *testing.T, m *Model, id string){
		"ack": func(t *testing.T, m *Model, id string) { require.NoError(t, m.Ack(id)) },
		"nack": func(t *testing.T, m *Model, id string) {
			ok, err := m.Nack(id, 0, 0, false)
			require.NoError(t, err)
			require.True(t, ok)
		},
		"nackDelayed": func(t *testing.T, m *Model, id string) {
			ok, err := m.Nack(id, 50, 0, false)
			require.NoError(t, err)
			require.True(t, ok)
		},
		"recover": func(t *testing.T, m *Model, id string) {
			ok, err := m.Recover(id, 0)
			require.NoError(t, err)
			require.True(t, ok)
		},
		"deadLetter": func(t *testing.T, m *Model, id string) {
			ok, err := m.Nack(id, 0, 0, true)
			require.NoError(t, err)
			require.False(t, ok)
			st, _ := m.State(id)
			require.Equal(t, byte(Dead), st)
		},
	}
	for name, rel := range release {
		t.Run(name+"/BelowV", func(t *testing.T) {
			t.Parallel()
			m, id := gatedBehind(t, 0.3, true)
			before := mustReg(t, m, "a")
			require.Equal(t, int64(1_000_000_000/300), before.U)
			require.Equal(t, int64(100), before.R)
			require.Less(t, before.U, m.v)
			rel(t, m, id)
			// Gated time earns no credit: back at V, remainder dropped.
			require.Equal(t, Reg{U: m.v, R: 0, Seq: before.Seq}, mustReg(t, m, "a"))
		})
		t.Run(name+"/AboveV", func(t *testing.T) {
			t.Parallel()
			m, id := gatedBehind(t, 0.3, false)
			before := mustReg(t, m, "a")
			require.Greater(t, before.U, m.v)
			rel(t, m, id)
			before.Gated = false
			require.Equal(t, before, mustReg(t, m, "a"), "max(S, V) = S: tag and remainder kept")
		})
	}

	t.Run("ReleaseOfUngatedKeepsTag", func(t *testing.T) {
		t.Parallel()
		m := New(Config{Limits: Limits{Key: 2}})
		add(t, m, "a", 20, 0, 0)
		add(t, m, "b", 20, 0, 0)
		out := m.Dequeue(1, 0)
		for m.v <= 2*U {
			deqAck(t, m, 1, 0)
		}
		before := mustReg(t, m, "a")
		require.False(t, before.Gated)
		require.NoError(t, m.Ack(decode(t, out[0].ID)))
		require.Equal(t, before, mustReg(t, m, "a"), "only a gated variant is lifted")
	})
}

func TestLimitRiseSweep(t *testing.T) {
	t.Parallel()

	build := func(t *testing.T, n int) *Model {
		// n variants, 3 runs each, all served once under key limit 1 and
		// gated at U; ckIndex order = registration order.
		m := New(Config{Limits: Limits{Key: 1}, ScanLimit: 1})
		for i := 0; i < n; i++ {
			k := fmt.Sprintf("k%04d", i)
			require.NoError(t, m.Enqueue(k+"#1", k, 0, int64(i), 5000))
			require.NoError(t, m.Enqueue(k+"#2", k, 0, int64(i), 5000))
			require.NoError(t, m.Enqueue(k+"#3", k, 0, int64(i), 5000))
		}
		require.Len(t, m.Dequeue(n, 5000), n)
		require.Equal(t, n, gatedCount(m))
		require.Equal(t, 1, m.gk)
		require.Equal(t, 0, m.gs)
		return m
	}

	t.Run("MoreThanUngateChunk", func(t *testing.T) {
		t.Parallel()
		n := UngateChunk + 200
		m := build(t, n)
		m.SetLimits(Limits{Key: 2})
		out := m.Dequeue(1, 5000)
		// The rise is seen: gs = n, gk = 2; the lowest UngateChunk return,
		// one of them is served and reaches the new limit.
		require.Equal(t, []string{"k0000"}, servedKeys(out))
		require.Equal(t, 200, m.gs)
		require.Equal(t, 2, m.gk)
		for i := 0; i < UngateChunk; i++ {
			r := mustReg(t, m, fmt.Sprintf("k%04d", i))
			require.Equal(t, i == 0, r.Gated, i)
		}
		// k1000 returned too, by the probe (below its limit at rank 0).
		require.False(t, mustReg(t, m, "k1000").Gated)
		for i := UngateChunk + 1; i < n; i++ {
			require.True(t, mustReg(t, m, fmt.Sprintf("k%04d", i)).Gated, i)
		}
		// Second call: the remaining ones return; none is left gated below
		// the new limit.
		require.Equal(t, []string{"k0001"}, servedKeys(m.Dequeue(1, 5000)))
		require.Equal(t, 0, m.gs)
		require.Empty(t, gatedBelowLimit(m))
		require.True(t, mustReg(t, m, "k0001").Gated)
	})

	t.Run("LimitGoesAway", func(t *testing.T) {
		t.Parallel()
		m := build(t, 5)
		m.SetLimits(Limits{})
		require.Len(t, m.Dequeue(1, 5000), 1)
		require.Equal(t, 0, gatedCount(m))
		require.Equal(t, 0, m.gk)
		require.Equal(t, 0, m.gs)
	})

	t.Run("LimitLoweredOrSameDoesNotSweep", func(t *testing.T) {
		t.Parallel()
		m := build(t, 5)
		m.SetLimits(Limits{Key: 1})
		require.Empty(t, m.Dequeue(1, 5000))
		require.Equal(t, 5, gatedCount(m))
		require.Equal(t, 0, m.gs)
	})

	t.Run("UngatedAtMaxSV", func(t *testing.T) {
		t.Parallel()
		m := build(t, 3)
		add(t, m, "free", 9, 0, 5000) // no active tag: at V = 0
		for m.v < 3*U {
			require.Equal(t, []string{"free"}, deqAck(t, m, 1, 5000))
		}
		v := m.v
		m.SetLimits(Limits{Key: 2})
		require.Equal(t, []string{"k0000"}, servedKeys(m.Dequeue(1, 5000)))
		// Swept at max(S, V) = V; k0000 then served at V and gated at 2.
		require.Equal(t, Reg{U: v, Seq: 2}, mustReg(t, m, "k0001"))
		require.Equal(t, Reg{U: v, Seq: 3}, mustReg(t, m, "k0002"))
		require.Equal(t, Reg{U: v + U, Seq: 1, Gated: true}, mustReg(t, m, "k0000"))
	})
}

// gatedBelowLimit lists the gated variants below the current key limit.
func gatedBelowLimit(m *Model) []string {
	var out []string
	k := m.cfg.Limits.Key
	for v, r := range m.reg {
		if r.Gated && (k == 0 || m.inflight[v] < k) {
			out = append(out, v)
		}
	}
	sort.Strings(out)
	return out
}

func sumInflight(m *Model) int {
	n := 0
	for _, k := range m.inflight {
		n += k
	}
	return n
}
