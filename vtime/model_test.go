package vtime

import (
	"fmt"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
)

// tb is what the helpers need of a *testing.T or a *rapid.T.
type tb interface {
	require.TestingT
	Helper()
}

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
func mustReg(t tb, m *Model, key string) Reg {
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
func add(t tb, m *Model, key string, n int, at, now int64) []string {
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

func decode(t tb, enc string) string {
	t.Helper()
	id, err := keys.DecodeSegment(enc)
	require.NoError(t, err)
	return id
}

// ackAll acks the runs a dequeue served.
func ackAll(t tb, m *Model, served []Served) {
	t.Helper()
	for _, s := range served {
		require.NoError(t, m.Ack(decode(t, s.ID)))
	}
}

// deqAck dequeues maxCount at now and acks what it served.
func deqAck(t tb, m *Model, maxCount int, now int64) []string {
	t.Helper()
	out := m.Dequeue(maxCount, now)
	ackAll(t, m, out)
	return servedKeys(out)
}

// clockAt2U returns a model whose clock V has reached 2U, serving and
// acking the runs of one key, b, which still has runs queued.
func clockAt2U(t *testing.T) *Model {
	t.Helper()
	m := New(Config{})
	add(t, m, "b", 20, 0, 0)
	for m.v < 2*U {
		require.Equal(t, []string{"b"}, deqAck(t, m, 1, 0))
	}
	return m
}

// flagOffEnqueue queues a ready run the way a flag-off instance does: in
// its variant and ckIndex, without registering a tag (EnqueueOff, ready at
// at).
func flagOffEnqueue(m *Model, id, key string, at int64) {
	if err := m.EnqueueOff(id, key, 0, at, at); err != nil {
		panic(err)
	}
}

// flagOffServe delivers key's ready head the way a flag-off dequeue does:
// in flight, without touching the scheduler state (a drain leaves a stale
// registration). It returns the decoded id.
func flagOffServe(t tb, m *Model, key string) string {
	t.Helper()
	v := vm(key)
	require.NotEmpty(t, m.ready[v], "%q has no ready run", key)
	s := m.take(v)
	if len(m.ready[v]) == 0 {
		delete(m.ready, v)
	}
	return decode(t, s.ID)
}

// flagOffAck completes an in-flight run without the release hook (a
// flag-off ack): the slot frees, a gated variant stays gated.
func flagOffAck(t tb, m *Model, id string) {
	t.Helper()
	require.NoError(t, m.AckOff(id))
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

// clock is m.Clock() as one slice: V, epoch, cursor, next registration
// number, gk, next gating number, gp.
func clock(m *Model) []int64 {
	v, epoch, cursor, nextSeq, gk, gn, gp := m.Clock()
	return []int64{v, epoch, int64(cursor), nextSeq, int64(gk), gn, gp}
}

// lane lists the newcomer lane in registration order: its head first,
// then the variants queued behind it.
func lane(m *Model) []string {
	var out []string
	for v, r := range m.reg {
		if r.Waiting {
			out = append(out, v)
		}
	}
	sort.Slice(out, func(i, j int) bool { return m.reg[out[i]].Seq < m.reg[out[j]].Seq })
	return out
}

// vms maps keys to their variant members.
func vms(keys ...string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = vm(k)
	}
	return out
}

// expireAll expires the runs with the given ids and requires each did.
func expireAll(t tb, m *Model, ids []string) {
	t.Helper()
	for _, id := range ids {
		require.True(t, m.Expire(id), id)
	}
}

func TestNewcomerRule(t *testing.T) {
	t.Parallel()

	t.Run("ColdStartEveryKeyAtV", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		for _, k := range []string{"c", "a", "b"} {
			add(t, m, k, 2, 0, 0)
		}
		// No tag above V: every newcomer starts at V, in arrival order, and
		// none goes through the lane.
		require.Equal(t, Reg{U: 0, Seq: 1}, mustReg(t, m, "c"))
		require.Equal(t, Reg{U: 0, Seq: 2}, mustReg(t, m, "a"))
		require.Equal(t, Reg{U: 0, Seq: 3}, mustReg(t, m, "b"))
		require.Equal(t, []int64{0, 0, 0, 4, 0, 1, 0}, clock(m))
		require.Equal(t, []string{vm("c"), vm("a"), vm("b")}, regMembers(m))
		require.Empty(t, lane(m))
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
		// Nothing is registered (a parked tag is not the pack): b starts at V.
		add(t, m, "b", 1, 0, 0)
		require.Equal(t, Reg{U: 2 * U, Seq: 2}, mustReg(t, m, "b"))
	})

	t.Run("NotAboveVStartsAtV", func(t *testing.T) {
		t.Parallel()
		// A registered tag at V (never served) does not push a newcomer back.
		m := New(Config{})
		add(t, m, "a", 1, 0, 0)
		add(t, m, "b", 1, 0, 0)
		require.Equal(t, Reg{U: 0, Seq: 2}, mustReg(t, m, "b"))
	})

	t.Run("OneUnitBehindThePack", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		add(t, m, "a", 5, 0, 0)
		require.Equal(t, []string{"a"}, servedKeys(m.Dequeue(1, 0))) // V 0, S_a U
		add(t, m, "n", 1, 0, 0)
		// The lane is empty, top U (capped at V+U = U): A = U > V, so n is
		// the lane's head at 2U.
		require.Equal(t, Reg{U: 2 * U, Seq: 2, Waiting: true}, mustReg(t, m, "n"))
		require.Equal(t, vms("n"), lane(m))
	})

	t.Run("LaneQueuesNewcomersBehindItsHead", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		add(t, m, "a", 5, 0, 0)
		m.Dequeue(1, 0)
		add(t, m, "n0", 1, 0, 0)
		require.Equal(t, Reg{U: 2 * U, Seq: 2, Waiting: true}, mustReg(t, m, "n0"))
		for i := 1; i < 4; i++ {
			k := fmt.Sprintf("n%d", i)
			add(t, m, k, 1, 0, 0)
			// Behind the head, without a tag.
			require.Equal(t, Reg{U: 0, Seq: int64(i + 2), Waiting: true}, mustReg(t, m, k), k)
		}
		require.Equal(t, vms("n0", "n1", "n2", "n3"), lane(m))
		// Only the head competes: pass 1 never sees the others, nor does a
		// newcomer's top.
		top, ok := m.topActive()
		require.True(t, ok)
		require.Equal(t, 2*U, top)
		// Each head is served, and the next competes one quantum past that
		// serve: one round each. a has 4 runs left: a (U), a (2U, seq 1
		// before n0's 2U), n0 (n1 at 3U), a, n1 (n2 at 4U), a (drained),
		// n2 (n3 at 5U), n3.
		got := servedKeys(m.Dequeue(8, 0))
		require.Equal(t, []string{"a", "a", "n0", "a", "n1", "a", "n2", "n3"}, got)
		require.Empty(t, m.reg)
		require.Equal(t, 5*U, m.v)
		require.Equal(t, []Entry{{vm("n3"), float64(6 * U)}}, m.Idle(), "the others parked at or below V: reaped")
	})

	t.Run("NewcomersTogetherGetOneShare", func(t *testing.T) {
		t.Parallel()
		// Two backlogged keys and five newcomers with work: while they wait
		// for their first serve, the newcomers get one key's share between
		// them (minting keys buys nothing); once served they compete as any
		// key.
		m := New(Config{})
		add(t, m, "a", 30, 0, 0)
		add(t, m, "b", 30, 0, 0)
		require.Equal(t, []string{"a", "b"}, deqAck(t, m, 2, 0)) // a, b at U, V 0
		for i := 0; i < 5; i++ {
			add(t, m, fmt.Sprintf("n%d", i), 5, 0, 0)
		}
		require.Equal(t, vms("n0", "n1", "n2", "n3", "n4"), lane(m))
		var got []string
		for len(got) < 19 {
			got = append(got, deqAck(t, m, 1, 0)...)
		}
		require.Equal(t, []string{"a", "b", "a", "b", "n0", "a", "b", "n0", "n1",
			"a", "b", "n0", "n1", "n2", "a", "b", "n0", "n1", "n2"}, got)
		require.Equal(t, vms("n3", "n4"), lane(m))
	})

	t.Run("ServedHeadHandsOnOneQuantumPastItsServe", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		add(t, m, "a", 10, 0, 0)
		m.Dequeue(1, 0) // a at U, V 0
		m.SetWeight("n", 0.5)
		add(t, m, "n", 3, 0, 0)
		add(t, m, "late", 1, 0, 0)
		require.Equal(t, Reg{U: 2 * U, Seq: 2, Waiting: true}, mustReg(t, m, "n"))
		require.Equal(t, Reg{U: 0, Seq: 3, Waiting: true}, mustReg(t, m, "late"))
		require.Equal(t, []string{"a", "a"}, servedKeys(m.Dequeue(2, 0))) // a at 3U, V 2U
		require.Equal(t, 2*U, m.v)
		// n is served at 2U (stride 2U): 4U, out of the lane; late heads
		// it at 2U + U, not behind n's tag.
		require.Equal(t, []string{"n"}, servedKeys(m.Dequeue(1, 0)))
		require.Equal(t, Reg{U: 4 * U, Seq: 2}, mustReg(t, m, "n"))
		require.Equal(t, Reg{U: 3 * U, Seq: 3, Waiting: true}, mustReg(t, m, "late"))
		require.Equal(t, vms("late"), lane(m))
		add(t, m, "later", 1, 0, 0)
		require.Equal(t, Reg{U: 0, Seq: 4, Waiting: true}, mustReg(t, m, "later"))
	})

	t.Run("GatedHeadHandsOnItsTag", func(t *testing.T) {
		t.Parallel()
		m := New(Config{Limits: Limits{Key: 1}})
		add(t, m, "a", 5, 0, 0)
		require.Equal(t, []string{"a"}, deqAck(t, m, 1, 0)) // a at U, V 0
		add(t, m, "n0", 2, 0, 0)
		add(t, m, "n1", 2, 0, 0)
		require.Equal(t, vms("n0", "n1"), lane(m))
		require.Equal(t, 2*U, mustReg(t, m, "n0").U)
		out := m.Dequeue(1, 0) // a (U) served and gated at 2U; V U
		require.Equal(t, []string{"a"}, servedKeys(out))
		// n0 gets a run in flight from a flag-off instance: the next call
		// meets it at its limit and gates it; n1 heads the lane at n0's tag
		// and is served in the same call.
		flagOffServe(t, m, "n0")
		require.Equal(t, []string{"n1"}, servedKeys(m.Dequeue(1, 0)))
		// (a, gated at 2, was found at its limit by this call's probe and
		// moved to the back first: 3.)
		require.Equal(t, Reg{U: 2 * U, Seq: 2, Gated: true, Gate: 4}, mustReg(t, m, "n0"))
		require.Equal(t, Reg{U: 3 * U, Seq: 3, Gated: true, Gate: 5}, mustReg(t, m, "n1"))
		require.Equal(t, int64(3), mustReg(t, m, "a").Gate)
		require.Equal(t, 2*U, m.v)
		require.Empty(t, lane(m))
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
		require.Equal(t, Reg{U: 2 * U, Seq: 3, Waiting: true}, mustReg(t, m, "n"))
		// y (U) first, then y (2U, seq 2) before n (2U, seq 3).
		require.Equal(t, []string{"y", "y", "n"}, servedKeys(m.Dequeue(3, 0)))
	})

	t.Run("ExpiredNewcomersDoNotPushBack", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		add(t, m, "a", 5, 0, 0)
		m.Dequeue(1, 0) // S_a = U, V = 0
		var ids []string
		for i := 0; i < 300; i++ {
			k := fmt.Sprintf("n%03d", i)
			ids = append(ids, add(t, m, k, 1, 0, 0)...)
		}
		require.Equal(t, 2*U, mustReg(t, m, "n000").U)
		require.Len(t, lane(m), 300)
		// Each head expires unserved: the next takes its tag (2U), and the
		// gone one parks it.
		expireAll(t, m, ids)
		require.Len(t, m.reg, 1)
		require.Empty(t, lane(m))
		require.Len(t, m.idle, 300, "each expired head parked its tag (above V)")
		for _, e := range m.Idle() {
			require.Equal(t, float64(2*U), e.Score, e.Member)
		}
		add(t, m, "late", 1, 0, 0)
		// late is one unit behind the pack (U), not 300 rounds behind the
		// gone keys.
		require.Equal(t, Reg{U: 2 * U, Seq: 302, Waiting: true}, mustReg(t, m, "late"))
	})

	t.Run("QueuedNewcomersThatLeaveDoNotPark", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		add(t, m, "a", 5, 0, 0)
		m.Dequeue(1, 0)
		var ids []string
		for i := 0; i < 5; i++ {
			ids = append(ids, add(t, m, fmt.Sprintf("n%d", i), 1, 0, 0)...)
		}
		// The queued ones (no tag) go first: nothing to park; the head last.
		for i := len(ids) - 1; i >= 0; i-- {
			require.True(t, m.Expire(ids[i]))
		}
		require.Equal(t, []Entry{{vm("n0"), float64(2 * U)}}, m.Idle())
		require.Empty(t, lane(m))
	})

	t.Run("ReturnAfterExpiryDoesNotPushBack", func(t *testing.T) {
		t.Parallel()
		// Finding 3's sequence: fifty newcomers expire, one returns at its
		// parked tag (a return: it does not join the lane) and is the
		// highest competing tag. The next newcomer heads the lane one unit
		// behind the pack (the top is capped at V+U).
		m := New(Config{})
		add(t, m, "a", 5, 0, 0)
		require.Equal(t, []string{"a"}, servedKeys(m.Dequeue(1, 0))) // a at U, V 0
		var ids []string
		for i := 0; i < 50; i++ {
			ids = append(ids, add(t, m, fmt.Sprintf("n%02d", i), 1, 0, 0)...)
		}
		expireAll(t, m, ids)
		add(t, m, "n49", 1, 0, 0)
		require.Equal(t, Reg{U: 2 * U, Seq: 52}, mustReg(t, m, "n49"), "a return at its parked tag")
		add(t, m, "late", 1, 0, 0)
		require.Equal(t, Reg{U: 2 * U, Seq: 53, Waiting: true}, mustReg(t, m, "late"))
		require.Equal(t, []string{"a", "a", "n49", "late"}, servedKeys(m.Dequeue(4, 0)))
	})

	t.Run("LowWeightTagAndExpiredNewcomersDoNotPushBack", func(t *testing.T) {
		t.Parallel()
		// Finding 2's sequence: a weight-0.01 key's tag (100U) is the top;
		// fifty newcomers go through the lane and expire. Late heads the
		// lane at 2U, as without them.
		m := New(Config{})
		m.SetWeight("x", 0.01)
		add(t, m, "x", 5, 0, 0)
		add(t, m, "a", 5, 0, 0)
		require.Equal(t, []string{"x", "a"}, servedKeys(m.Dequeue(2, 0))) // x at 100U, a at U, V 0
		var ids []string
		for i := 0; i < 50; i++ {
			ids = append(ids, add(t, m, fmt.Sprintf("n%02d", i), 1, 0, 0)...)
		}
		require.Equal(t, 2*U, mustReg(t, m, "n00").U)
		expireAll(t, m, ids)
		add(t, m, "late", 1, 0, 0)
		require.Equal(t, Reg{U: 2 * U, Seq: 53, Waiting: true}, mustReg(t, m, "late"))
		require.Equal(t, []string{"a", "a", "late"}, servedKeys(m.Dequeue(3, 0)))
	})

	t.Run("DrainedHeadLeavesTheLane", func(t *testing.T) {
		t.Parallel()
		// A head whose ready run expires (its other run is delayed) drains:
		// it leaves the lane, and comes back as a return.
		m := New(Config{})
		add(t, m, "a", 5, 0, 0)
		m.Dequeue(1, 0)
		require.NoError(t, m.Enqueue("n#1", "n", 0, 0, 0))
		require.NoError(t, m.Enqueue("n#2", "n", 0, 9, 0))
		require.Equal(t, Reg{U: 2 * U, Seq: 2, Waiting: true}, mustReg(t, m, "n"))
		require.True(t, m.Expire("n#1"))
		require.Empty(t, lane(m))
		add(t, m, "late", 1, 0, 0)
		require.Equal(t, Reg{U: 2 * U, Seq: 3, Waiting: true}, mustReg(t, m, "late"))
		// n's run comes due: it returns at its parked tag, not in the lane.
		require.Equal(t, []string{"a"}, servedKeys(m.Dequeue(1, 9)))
		require.Equal(t, Reg{U: 2 * U, Seq: 4}, mustReg(t, m, "n"))
		require.Equal(t, vms("late"), lane(m))
	})

	t.Run("GatedTagsAreNotThePack", func(t *testing.T) {
		t.Parallel()
		m := New(Config{Limits: Limits{Key: 1}})
		m.SetWeight("x", 0.01)
		add(t, m, "x", 3, 0, 0)
		require.Equal(t, []string{"x"}, servedKeys(m.Dequeue(1, 0)))
		require.Equal(t, Reg{U: 100 * U, Seq: 1, Gated: true, Gate: 1}, mustReg(t, m, "x"))
		// The only tag is gated: nothing competes, n starts at V.
		add(t, m, "n", 1, 0, 0)
		require.Equal(t, Reg{U: 0, Seq: 2}, mustReg(t, m, "n"))
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
		add(t, m, "a", 1, 0, 0)
		require.Equal(t, Reg{U: U, Seq: 3}, mustReg(t, m, "a"), "at the parked tag, not in the lane")
		_, ok = parkedOf(m, "a")
		require.False(t, ok, "the parked entry goes")
		// A newcomer now: the lane is empty, top U (a's): it heads the lane.
		add(t, m, "n", 1, 0, 0)
		require.Equal(t, Reg{U: 2 * U, Seq: 4, Waiting: true}, mustReg(t, m, "n"))
	})

	t.Run("ParkedAtOrBelowVIsWorthNothing", func(t *testing.T) {
		t.Parallel()
		// Finding 6: whether a call reaped a worthless parked tag (at or
		// below V) or not, the variant registers the same way: the entry is
		// treated as absent.
		reaped := New(Config{})
		add(t, reaped, "a", 1, 0, 0)
		add(t, reaped, "b", 9, 0, 0)
		require.Equal(t, []string{"a", "b", "b", "b"}, servedKeys(reaped.Dequeue(4, 0)))
		require.Equal(t, 2*U, reaped.v)
		// The call parked a at U, and reaped at its end: U <= V.
		_, ok := parkedOf(reaped, "a")
		require.False(t, ok)

		kept := New(Config{})
		add(t, kept, "a", 1, 0, 0)
		add(t, kept, "b", 9, 0, 0)
		require.Equal(t, []string{"a"}, servedKeys(kept.Dequeue(1, 0)))
		require.Equal(t, []string{"b", "b", "b"}, servedKeys(kept.Dequeue(3, 0)))
		// This call parked nothing: the worthless entry (U <= V 2U) stays.
		p, ok := parkedOf(kept, "a")
		require.True(t, ok)
		require.Equal(t, U, p)

		// Discovered: at V in both.
		for _, m := range []*Model{reaped.Clone(), kept.Clone()} {
			flagOffEnqueue(m, "a#9", "a", 0)
			require.Equal(t, []string{"a"}, servedKeys(m.Dequeue(1, 0)), "a at V 2U, b at 3U")
			require.Equal(t, []Entry{{vm("a"), float64(3 * U)}}, m.Idle())
		}
		// A newcomer in both: top 3U (= V+U), nothing waits: 4U.
		for _, m := range []*Model{reaped, kept} {
			add(t, m, "a", 1, 0, 0)
			require.Equal(t, Reg{U: 4 * U, Seq: 3, Waiting: true}, mustReg(t, m, "a"))
			require.Empty(t, m.idle)
		}
		require.Equal(t, normalized(reaped.Snapshot()), normalized(kept.Snapshot()))
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

	t.Run("SameCallRegistrationsInIndexOrder", func(t *testing.T) {
		t.Parallel()
		// Finding 10's sequence, now documented: variants that register in
		// one call register in their index order, exact ties broken by
		// name. b's run was queued first; both come due at 5 and register
		// in delayIndex order ("=%21" before "=b"): "!" is served first.
		m := New(Config{})
		require.NoError(t, m.Enqueue("b#1", "b", 0, 5, 0))
		require.NoError(t, m.Enqueue("!#1", "!", 0, 5, 0))
		require.Equal(t, []string{"!"}, servedKeys(m.Dequeue(1, 5)))
		require.Equal(t, Reg{U: 0, Seq: 2}, mustReg(t, m, "b"))

		// The same through the lane: the first to register heads it.
		m = New(Config{})
		add(t, m, "a", 5, 0, 0)
		require.Equal(t, []string{"a"}, servedKeys(m.Dequeue(1, 0)))
		require.NoError(t, m.Enqueue("b#1", "b", 0, 5, 0))
		require.NoError(t, m.Enqueue("!#1", "!", 0, 5, 0))
		require.Equal(t, []string{"a"}, servedKeys(m.Dequeue(1, 5)))
		require.Equal(t, vms("!", "b"), lane(m))
		require.Equal(t, Reg{U: 2 * U, Seq: 2, Waiting: true}, mustReg(t, m, "!"))

		// Registered at different instants, the earlier wins whatever the
		// name.
		m = New(Config{})
		require.NoError(t, m.Enqueue("b#1", "b", 0, 4, 0))
		require.NoError(t, m.Enqueue("b#2", "b", 0, 4, 0))
		require.NoError(t, m.Enqueue("b#3", "b", 0, 4, 0))
		require.NoError(t, m.Enqueue("!#1", "!", 0, 5, 0))
		require.Equal(t, []string{"b"}, servedKeys(m.Dequeue(1, 4)))
		require.Equal(t, []string{"b"}, servedKeys(m.Dequeue(1, 5)))
		require.Equal(t, int64(1), mustReg(t, m, "b").Seq)
		require.Equal(t, Reg{U: 2 * U, Seq: 2, Waiting: true}, mustReg(t, m, "!"))
	})

	t.Run("NameDecidesWhichTiedVariantACallReaches", func(t *testing.T) {
		t.Parallel()
		// When a call reaches only ScanLimit of the due (or untagged)
		// variants, exact ties in the index are broken by name: "!" and b
		// come due at 5 (b queued first), ScanLimit 1: the first call
		// promotes "!" only, b registers a call later. (doc.go: the name
		// orders "only among variants that registered at the same
		// instant"; here it decides which registers first.)
		m := New(Config{ScanLimit: 1})
		require.NoError(t, m.Enqueue("b#1", "b", 0, 5, 0))
		require.NoError(t, m.Enqueue("!#1", "!", 0, 5, 0))
		require.Equal(t, []string{"!"}, servedKeys(m.Dequeue(1, 5)))
		_, ok := regOf(m, "b")
		require.False(t, ok, "b still delayed")
		require.Equal(t, []string{"b"}, servedKeys(m.Dequeue(1, 5)))

		// Discovery alike: u and "!" untagged with equal heads.
		m = New(Config{ScanLimit: 1})
		flagOffEnqueue(m, "u#1", "u", 0)
		flagOffEnqueue(m, "!#1", "!", 0)
		flagOffEnqueue(m, "!#2", "!", 0)
		require.Equal(t, []string{"!"}, servedKeys(m.Dequeue(1, 0)))
		_, ok = regOf(m, "u")
		require.False(t, ok)
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
		require.Equal(t, Reg{U: U, Seq: 1, Gated: true, Gate: 1}, mustReg(t, m, "a"))
		require.Equal(t, 1, m.gk)
		require.Equal(t, []string{vm("b"), vm("a")}, regMembers(m), "gated after the others")
		require.Equal(t, []string{"b"}, servedKeys(m.Dequeue(5, 0)))
		require.True(t, mustReg(t, m, "b").Gated)
		require.Empty(t, m.Dequeue(5, 0), "every variant at its limit")
		// The tag is kept; the gated probe, which found a at its limit in
		// the last two calls, moved it to the back each time (gating
		// numbers 2, then 4: b was gated at 3 between).
		require.Equal(t, Reg{U: U, Seq: 1, Gated: true, Gate: 4}, mustReg(t, m, "a"), "the tag is kept")
	})

	t.Run("GatedTagsAreNotRead", func(t *testing.T) {
		t.Parallel()
		// Gating takes the entry out of the competition: later newcomers
		// are not pushed behind it and it is not a candidate.
		m := New(Config{Limits: Limits{Key: 2}})
		add(t, m, "a", 5, 0, 0)
		require.Equal(t, []string{"a", "a"}, servedKeys(m.Dequeue(5, 0)))
		require.Equal(t, Reg{U: 2 * U, Seq: 1, Gated: true, Gate: 1}, mustReg(t, m, "a"))
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
			before.Gated, before.Gate = false, 0
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

func TestLimitRise(t *testing.T) {
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
		return m
	}

	t.Run("EveryGatedReturnsAtTheFirstCall", func(t *testing.T) {
		t.Parallel()
		n := 1200
		m := build(t, n)
		// The probe walks the gated variants meanwhile (all at the limit).
		require.Empty(t, m.Dequeue(1, 5000))
		require.Empty(t, m.Dequeue(1, 5000))
		require.Equal(t, int64(2), m.gp, "the probe looked at gating numbers 1 and 2")
		m.SetLimits(Limits{Key: 2})
		out := m.Dequeue(1, 5000)
		// The rise is seen: every gated variant returns at max(S, V) = U,
		// gk = 2, gp = 0; the lowest is served and reaches the new limit.
		require.Equal(t, []string{"k0000"}, servedKeys(out))
		require.Equal(t, 2, m.gk)
		require.Equal(t, int64(0), m.gp)
		// (The two probes moved k0000 and k0001 to 1201 and 1202.)
		require.Equal(t, Reg{U: 2 * U, Seq: 1, Gated: true, Gate: 1203}, mustReg(t, m, "k0000"))
		for i := 1; i < n; i++ {
			require.Equal(t, Reg{U: U, Seq: int64(i + 1)}, mustReg(t, m, fmt.Sprintf("k%04d", i)), i)
		}
		require.Empty(t, gatedBelowLimit(m))
		require.Equal(t, []string{"k0001"}, servedKeys(m.Dequeue(1, 5000)))
		require.True(t, mustReg(t, m, "k0001").Gated)
		require.Equal(t, 2, gatedCount(m))
	})

	t.Run("LimitGoesAway", func(t *testing.T) {
		t.Parallel()
		m := build(t, 5)
		m.SetLimits(Limits{})
		require.Len(t, m.Dequeue(1, 5000), 1)
		require.Equal(t, 0, gatedCount(m))
		require.Equal(t, 0, m.gk)
		require.Equal(t, int64(0), m.gp)
		require.Len(t, m.Dequeue(9, 5000), 9, "no limit: every variant serves")
	})

	t.Run("LimitLoweredOrSameDoesNotUngate", func(t *testing.T) {
		t.Parallel()
		m := build(t, 5)
		m.SetLimits(Limits{Key: 1})
		require.Empty(t, m.Dequeue(1, 5000))
		require.Equal(t, 5, gatedCount(m))
		require.Equal(t, 1, m.gk)

		// Gated under 2 (two in flight), the limit lowered to 1: they stay.
		m2 := New(Config{Limits: Limits{Key: 2}})
		add(t, m2, "x", 5, 0, 0)
		require.Equal(t, []string{"x", "x"}, servedKeys(m2.Dequeue(3, 0)))
		require.Equal(t, 2, m2.gk)
		m2.SetLimits(Limits{Key: 1})
		require.Empty(t, m2.Dequeue(1, 0))
		require.True(t, mustReg(t, m2, "x").Gated)
		require.Equal(t, 2, m2.gk)
	})

	t.Run("StillAtTheNewLimitGatedAgainWhenMet", func(t *testing.T) {
		t.Parallel()
		m := New(Config{Limits: Limits{Key: 2}})
		add(t, m, "x", 5, 0, 0)
		require.Equal(t, []string{"x", "x"}, servedKeys(m.Dequeue(2, 0))) // x gated at 2U, gk 2, V U
		m.SetLimits(Limits{Key: 1})
		add(t, m, "y", 5, 0, 0) // no active tag: at V
		require.Equal(t, []string{"y"}, servedKeys(m.Dequeue(2, 0)))
		require.Equal(t, 1, m.gk, "y gated under 1")
		m.SetLimits(Limits{Key: 2})
		// 2 > gk 1: both return; x, two in flight, is met at the limit and
		// gated again; y is served and reaches it.
		require.Equal(t, []string{"y"}, servedKeys(m.Dequeue(5, 0)))
		// (In the call before, the probe moved x from 1 to 2 and y was
		// gated at 3.)
		require.Equal(t, Reg{U: 2 * U, Seq: 1, Gated: true, Gate: 4}, mustReg(t, m, "x"))
		require.Equal(t, Reg{U: 3 * U, Seq: 2, Gated: true, Gate: 5}, mustReg(t, m, "y"))
		require.Equal(t, 2, m.gk)
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
		// Returned at max(S, V) = V; k0000 then served at V and gated at 2.
		require.Equal(t, Reg{U: v, Seq: 2}, mustReg(t, m, "k0001"))
		require.Equal(t, Reg{U: v, Seq: 3}, mustReg(t, m, "k0002"))
		// (Gating number 12: each call's probe moved a variant at its limit
		// to the back.)
		require.Equal(t, Reg{U: v + U, Seq: 1, Gated: true, Gate: 12}, mustReg(t, m, "k0000"))
	})
}

// TestLimitRiseReturnsEveryGated is finding 1's sequence: variants gated
// under limit 1 with high tags (weight 0.01) and a thousand with low ones;
// after the rise to 2, one call serves 500 of the low ones, which reach the
// new limit and are gated again. The high-tag variants gated under the old
// limit returned at that first call (before, a sweep counted on the lowest
// tags left them gated below the limit for about 500 calls).
func TestLimitRiseReturnsEveryGated(t *testing.T) {
	t.Parallel()
	m := New(Config{Limits: Limits{Key: 1}, ScanLimit: 1})
	var old []string
	for i := 0; i < 5; i++ { // high tags: weight 0.01, served once
		k := fmt.Sprintf("z%d", i)
		m.SetWeight(k, 0.01)
		add(t, m, k, 3, 0, 0)
		old = append(old, k)
	}
	const n = 1000
	for i := 0; i < n; i++ {
		add(t, m, fmt.Sprintf("a%04d", i), 3, 0, 0)
	}
	require.Len(t, m.Dequeue(n+5, 0), n+5)
	require.Equal(t, n+5, gatedCount(m))
	require.Equal(t, 100*U, mustReg(t, m, "z0").U)

	m.SetLimits(Limits{Key: 2})
	out := m.Dequeue(500, 0) // 500 of the a's reach 2 and are gated again
	require.Len(t, out, 500)
	for _, s := range out {
		require.Less(t, s.Key, "a0500")
	}
	require.Equal(t, 500, gatedCount(m))
	require.Empty(t, gatedBelowLimit(m), "no variant is left gated below the new limit")
	for _, k := range old {
		require.Equal(t, Reg{U: 100 * U, Seq: mustReg(t, m, k).Seq}, mustReg(t, m, k), k)
	}
	v, epoch, _, nextSeq, gk, _, gp := m.Clock()
	require.Equal(t, []int64{U, 0, n + 6, 2, 0}, []int64{v, epoch, nextSeq, int64(gk), gp})
	// The other a's, then the z's, are served next.
	out = m.Dequeue(505, 0)
	require.Len(t, out, 505)
	require.Equal(t, old, servedKeys(out[500:]))
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

func TestProbe(t *testing.T) {
	t.Parallel()

	t.Run("FreedByFlagOffReturnsAtMaxSV", func(t *testing.T) {
		t.Parallel()
		m := New(Config{Limits: Limits{Key: 1}})
		add(t, m, "a", 3, 0, 0)
		add(t, m, "b", 30, 0, 0)
		out := m.Dequeue(1, 0)
		require.Equal(t, []string{"a"}, servedKeys(out))
		for m.v <= 2*U {
			require.Equal(t, []string{"b"}, deqAck(t, m, 1, 0))
		}
		flagOffAck(t, m, decode(t, out[0].ID))
		require.True(t, mustReg(t, m, "a").Gated, "a flag-off ack does not un-gate")
		v := m.v
		// The probe finds a below its limit: a competes at V and, with the
		// lowest tag, is served.
		require.Equal(t, []string{"a"}, servedKeys(m.Dequeue(1, 0)))
		// (Gating number 10: while at its limit, a was moved to the back
		// at each of the probe's looks.)
		require.Equal(t, Reg{U: v + U, Seq: 1, Gated: true, Gate: 10}, mustReg(t, m, "a"))
	})

	t.Run("RotatesOverGatedWithinALap", func(t *testing.T) {
		t.Parallel()
		// g0..g3 gated at limit 1, all held; g3 (highest tag, last in age
		// order, out of the one-variant age head) is freed by a flag-off ack.
		m := New(Config{Limits: Limits{Key: 1}, ScanLimit: 1})
		var held []string
		for i := 0; i < 4; i++ {
			k := fmt.Sprintf("g%d", i)
			require.NoError(t, m.Enqueue(k+"#1", k, 0, int64(i), 10))
			require.NoError(t, m.Enqueue(k+"#2", k, 0, int64(i), 10))
			require.NoError(t, m.Enqueue(k+"#3", k, 0, int64(i), 10))
		}
		for i := 0; i < 4; i++ {
			out := m.Dequeue(1, 10)
			require.Len(t, out, 1)
			held = append(held, decode(t, out[0].ID))
		}
		require.Equal(t, 4, gatedCount(m))
		flagOffAck(t, m, held[3])
		gp := m.gp
		for calls := 1; ; calls++ {
			require.LessOrEqual(t, calls, 4, "not returned within a lap of 4 calls (probe started after %d)", gp)
			out := m.Dequeue(1, 10)
			if len(out) > 0 {
				// Returned at max(S, V) = U and served at once.
				require.Equal(t, []string{"g3"}, servedKeys(out))
				// (Gated again at 11: each look at one still at its limit
				// gave it the next number.)
				require.Equal(t, Reg{U: 2 * U, Seq: 4, Gated: true, Gate: 11}, mustReg(t, m, "g3"))
				break
			}
		}
	})

	t.Run("NotPassedOverWhenOneBeforeLeaves", func(t *testing.T) {
		t.Parallel()
		// The probe once kept a rank among the gated variants (in tag
		// order), so a variant was passed over when one before it left the
		// gated set during the lap, and starved while lower-tagged keys kept
		// joining it. It now keeps the gating number it looked at last, and
		// one it finds at its limit goes to the back (the next number): k1,
		// freed by a flag-off ack just as k0 (before it) is acked, is the
		// next the probe looks at.
		m := New(Config{Limits: Limits{Key: 1}, ScanLimit: 1})
		for _, k := range []string{"k0", "k1", "k2"} {
			add(t, m, k, 6, 0, 0)
		}
		inflight := func(key string) string {
			t.Helper()
			for id, r := range m.runs {
				if r.key == key && r.state == InFlight {
					return decode(t, id)
				}
			}
			t.Fatalf("%s has no run in flight", key)
			return ""
		}
		call := func(gp int64, want ...string) {
			t.Helper()
			if want == nil {
				want = []string{}
			}
			require.Equal(t, want, servedKeys(m.Dequeue(2, 0)))
			require.LessOrEqual(t, gatedCount(m), 3)
			require.Equal(t, gp, m.gp)
		}
		call(0, "k0", "k1") // 1: k0 and k1 gated (gating numbers 1, 2)
		call(1, "k2")       // 2: the probe looks at k0 (to 3); k2 gated (4)
		call(2)             // 3: k1 (to 5)
		call(3)             // 4: k0 (to 6)
		call(4)             // 5: k2 (to 7)
		flagOffAck(t, m, inflight("k1"))
		require.NoError(t, m.Ack(inflight("k0")))
		call(5, "k0", "k1") // 6: next after 4: k1 (5), below its limit
	})
}

func TestDiscovery(t *testing.T) {
	t.Parallel()

	t.Run("AtVNotAsNewcomer", func(t *testing.T) {
		t.Parallel()
		m := clockAt2U(t)
		flagOffEnqueue(m, "u#1", "u", 0)
		_, ok := regOf(m, "u")
		require.False(t, ok)
		// Discovered at V = 2U (a newcomer would be at 4U: top 3U = V+U).
		require.Equal(t, []string{"u"}, servedKeys(m.Dequeue(1, 0)))
		p, ok := parkedOf(m, "u")
		require.True(t, ok)
		require.Equal(t, 3*U, p, "served at E = 2U")

		// A discovered variant does not go through the lane: u competes at
		// V while the lane's head n waits.
		m = New(Config{})
		add(t, m, "a", 5, 0, 0)
		require.Equal(t, []string{"a"}, servedKeys(m.Dequeue(1, 0))) // a at U, V 0
		add(t, m, "n", 2, 0, 0)
		require.Equal(t, vms("n"), lane(m))
		flagOffEnqueue(m, "u#1", "u", 0)
		flagOffEnqueue(m, "u#2", "u", 0)
		require.Equal(t, []string{"u"}, servedKeys(m.Dequeue(1, 0)))
		require.Equal(t, Reg{U: U, Seq: 3}, mustReg(t, m, "u"))
		require.Equal(t, Reg{U: 2 * U, Seq: 2, Waiting: true}, mustReg(t, m, "n"))
	})

	t.Run("AfterTheFirstReadAsNewcomer", func(t *testing.T) {
		t.Parallel()
		// clockAt2U's calls (at 0) made the state's first discovery read:
		// born 0. u, written flag off at 5 ms, became ready while the state
		// was there: it registers as the flag-on enqueue registers it (the
		// lane's head at 4U: top 3U = V + U, plus U), and b (3U) goes first.
		m := clockAt2U(t)
		born, began := m.Born()
		require.Equal(t, []any{int64(0), true}, []any{born, began})
		flagOffEnqueue(m, "u#1", "u", 5)
		require.Equal(t, []string{"b"}, servedKeys(m.Dequeue(1, 5)))
		on := clockAt2U(t)
		require.NoError(t, on.Enqueue("u#1", "u", 0, 5, 5))
		require.Equal(t, mustReg(t, on, "u"), mustReg(t, m, "u"), "as the flag-on enqueue registers it")
		require.Equal(t, Reg{U: 4 * U, Seq: 2, Waiting: true}, mustReg(t, m, "u"))
	})

	t.Run("PriorityDoesNotMakeNewWorkOld", func(t *testing.T) {
		t.Parallel()
		// Priority 9 puts u's ready score 9 x PriorityStep before born,
		// but the run became available after it: a newcomer.
		m := clockAt2U(t)
		require.NoError(t, m.EnqueueOff("u#1", "u", 9, 5, 5))
		require.Less(t, m.CkIndex()[0].Score, 0.0, "u's ready score is before born")
		require.Equal(t, []string{"b"}, servedKeys(m.Dequeue(1, 5)))
		require.Equal(t, Reg{U: 4 * U, Seq: 2, Waiting: true}, mustReg(t, m, "u"))
	})

	t.Run("AvailableBeforeTheFirstReadAtV", func(t *testing.T) {
		t.Parallel()
		// A run available at or before born is old work, whenever it was
		// written: also one a flag-off writer dates in the past (the rule's
		// limit: such a writer's new keys compete at V).
		m := clockAt2U(t)
		require.NoError(t, m.EnqueueOff("u#1", "u", 0, -100, 5))
		require.Equal(t, []string{"u"}, servedKeys(m.Dequeue(1, 5)))
		p, ok := parkedOf(m, "u")
		require.True(t, ok)
		require.Equal(t, 3*U, p, "served at E = 2U: at V")
	})

	t.Run("FirstReadSetsBorn", func(t *testing.T) {
		t.Parallel()
		// Only a read that finds some of ckIndex begins the state; its
		// call's time is born until the state expires, and the first read
		// after that sets it again.
		m := New(Config{})
		m.Dequeue(1, 7)
		_, began := m.Born()
		require.False(t, began, "nothing read")
		add(t, m, "a", 3, 0, 0)
		m.Dequeue(1, 10)
		m.Dequeue(1, 20)
		born, began := m.Born()
		require.Equal(t, []any{int64(10), true}, []any{born, began})
		m.ExpireState()
		_, began = m.Born()
		require.False(t, began)
		m.Dequeue(1, 30)
		born, began = m.Born()
		require.Equal(t, []any{int64(30), true}, []any{born, began})
	})

	t.Run("AtParkedTag", func(t *testing.T) {
		t.Parallel()
		m := New(Config{Limits: Limits{Key: 1}})
		m.SetWeight("u", 0.5)
		add(t, m, "u", 1, 0, 0)
		add(t, m, "b", 20, 0, 0)
		require.Equal(t, []string{"u"}, deqAck(t, m, 1, 0)) // parked at 2U
		flagOffEnqueue(m, "u#2", "u", 0)
		require.Equal(t, []string{"b"}, deqAck(t, m, 1, 0))
		require.Equal(t, Reg{U: 2 * U, Seq: 3}, mustReg(t, m, "u"), "max(V, parked)")
		_, ok := parkedOf(m, "u")
		require.False(t, ok)
	})

	t.Run("RotatingCursor", func(t *testing.T) {
		t.Parallel()
		// The cursor moves ScanLimit - cap (cap: the call's capacity, here
		// maxCount or what the queue limit leaves), at least 1, and goes
		// back to 0 once a chunk reaches the end of ckIndex.
		m := New(Config{ScanLimit: 10, Limits: Limits{Queue: 6}})
		for i := 0; i < 25; i++ {
			k := fmt.Sprintf("u%02d", i)
			for j := 0; j < 3; j++ {
				flagOffEnqueue(m, fmt.Sprintf("%s#%d", k, j), k, int64(i)) // head score i whatever is served
			}
		}
		for _, want := range []struct{ maxCount, served, registered, cursor int }{
			{1, 1, 10, 9}, {1, 1, 19, 18}, {1, 1, 25, 0}, {1, 1, 25, 9},
			{4, 2, 25, 17}, // 4 in flight: cap 2
			{4, 0, 25, 17}, // cap 0: the call does nothing
		} {
			require.Len(t, m.Dequeue(want.maxCount, 100), want.served)
			require.Len(t, m.reg, want.registered)
			require.Equal(t, want.cursor, m.cursor)
		}
		// Registered in ckIndex order at V = 0.
		for i := 0; i < 25; i++ {
			require.Equal(t, int64(i+1), mustReg(t, m, fmt.Sprintf("u%02d", i)).Seq)
		}

		// ScanLimit at or below the capacity: the cursor moves 1.
		m = New(Config{ScanLimit: 2})
		for i := 0; i < 5; i++ {
			k := fmt.Sprintf("u%02d", i)
			for j := 0; j < 20; j++ {
				flagOffEnqueue(m, fmt.Sprintf("%s#%d", k, j), k, int64(i))
			}
		}
		for _, cursor := range []int{1, 2, 3, 0, 1} {
			m.Dequeue(3, 100)
			require.Equal(t, cursor, m.cursor)
		}
	})

	t.Run("RegisteredVariantsUntouched", func(t *testing.T) {
		t.Parallel()
		m := New(Config{Limits: Limits{Key: 1}})
		add(t, m, "a", 3, 0, 0)
		m.Dequeue(1, 0)
		want := mustReg(t, m, "a")
		require.Empty(t, m.Dequeue(1, 0))
		want.Gate++ // the gated probe found it at its limit: to the back
		require.Equal(t, want, mustReg(t, m, "a"))
	})

	t.Run("CursorPastTheEnd", func(t *testing.T) {
		t.Parallel()
		// Finding 8's first sequence: ckIndex r0, u0, u1 (equal scores),
		// ScanLimit 2, maxCount 1: the bound is ceil(3/(2-1))+1 = 4 calls.
		// Call 1 reads r0, u0 and serves r0, which drains: u1 moves to rank
		// 1. The cursor moved 2-1 = 1, so call 2 reads u0, u1.
		m := New(Config{ScanLimit: 2})
		add(t, m, "r0", 1, 0, 0)
		flagOffEnqueue(m, "u0#1", "u0", 0)
		flagOffEnqueue(m, "u1#1", "u1", 0)
		require.Equal(t, []string{"r0"}, servedKeys(m.Dequeue(1, 0)))
		require.Equal(t, 1, m.cursor)
		_, ok := regOf(m, "u1")
		require.False(t, ok)
		m.Dequeue(1, 0)
		_, ok = regOf(m, "u1")
		require.True(t, ok, "u1 not reached in 2 calls (bound 4)")
	})

	t.Run("ServeMovesAVariantPastAnUnreadOne", func(t *testing.T) {
		t.Parallel()
		// ckIndex r0 (head 0), x (10), u (20); ScanLimit 2, maxCount 1.
		// Call 1 reads r0, x and serves r0, whose next head (100) moves it
		// past u: x, u, r0. A cursor moved by ScanLimit (2) would read r0
		// and skip u; moved by ScanLimit - cap (1) it reads u.
		m := New(Config{ScanLimit: 2})
		require.NoError(t, m.Enqueue("r0#1", "r0", 0, 0, 100))
		require.NoError(t, m.Enqueue("r0#2", "r0", 0, 100, 100))
		flagOffEnqueue(m, "x#1", "x", 10)
		flagOffEnqueue(m, "u#1", "u", 20)
		require.Equal(t, []string{"r0"}, servedKeys(m.Dequeue(1, 100)))
		require.Equal(t, vms("x", "u", "r0"), []string{m.CkIndex()[0].Member, m.CkIndex()[1].Member, m.CkIndex()[2].Member})
		_, ok := regOf(m, "u")
		require.False(t, ok)
		m.Dequeue(1, 100)
		_, ok = regOf(m, "u")
		require.True(t, ok, "u slipped past the cursor")
	})

	t.Run("ScanLimitAtOrBelowMaxCount", func(t *testing.T) {
		t.Parallel()
		// Finding 8's second sequence, with ScanLimit 1 and maxCount 1: no
		// bound is stated (ScanLimit - maxCount = 0); the cursor moves 1 a
		// call. ckIndex r0, u0, u1. Call 1 reads r0 and serves it; call 2
		// reads u0 (rank 1), serves it and it drains: u1 moves to rank 1,
		// below the cursor (2). Call 3 reads past the end and resets, call 4
		// reads r0, call 5 reaches u1 (registered at V and served).
		m := New(Config{ScanLimit: 1})
		add(t, m, "r0", 9, 0, 0)
		flagOffEnqueue(m, "u0#1", "u0", 0)
		flagOffEnqueue(m, "u1#1", "u1", 0)
		for call, cursor := range []int{1, 2, 0, 1} {
			m.Dequeue(1, 0)
			require.Equal(t, cursor, m.cursor, "call %d", call+1)
			_, ok := regOf(m, "u1")
			require.False(t, ok, "call %d", call+1)
		}
		require.Equal(t, []string{"u1"}, servedKeys(m.Dequeue(1, 0)))
	})
}

func TestReadBudget(t *testing.T) {
	t.Parallel()
	// 1100 entries at tag 0 that cannot be served, interleaved in
	// registration order: stale ones (drained by a flag-off dequeue) and
	// ones at their limit (key limit 1 after a flag-off serve); then u,
	// registered last. One call of 1 reads at most ReadBudget + 4*1*3 of
	// them: each met entry leaves for good (collected or gated), and the
	// next call goes on from there.
	m := New(Config{})
	const n = 1100
	for i := 0; i < n; i++ {
		k := fmt.Sprintf("k%04d", i)
		add(t, m, k, 1+i%2, 0, 0) // odd: one run left after the flag-off serve
		flagOffServe(t, m, k)
	}
	add(t, m, "u", 3, 0, 0)
	m.SetLimits(Limits{Key: 1})
	budget := ReadBudget + 4*1*3

	m.Dequeue(1, 0)
	met := 0
	for i := 0; i < n; i++ {
		r, ok := regOf(m, fmt.Sprintf("k%04d", i))
		if !ok || r.Gated {
			met++
			require.Equal(t, i%2 == 1, ok, "stale entries are collected, those at the limit gated")
			require.Less(t, i, budget, "met in (tag, seq) order")
		}
	}
	require.Equal(t, budget, met, "pass 1 stops at the budget")

	require.Equal(t, []string{"u"}, servedKeys(m.Dequeue(1, 0)), "the next call goes on and serves u")
	require.Equal(t, n/2+1, gatedCount(m), "the odd keys and u (at its limit after its serve)")
	require.Len(t, m.reg, n/2+1, "every stale entry collected")
}

func TestAgeHead(t *testing.T) {
	t.Parallel()

	t.Run("RegistersOncePerCallWhenPassOneRunsDry", func(t *testing.T) {
		t.Parallel()
		m := New(Config{Limits: Limits{Key: 1}, ScanLimit: 2})
		require.NoError(t, m.Enqueue("a#1", "a", 0, 100, 100))
		require.NoError(t, m.Enqueue("a#2", "a", 0, 100, 100))
		require.Equal(t, []string{"a"}, servedKeys(m.Dequeue(1, 100)))
		require.True(t, mustReg(t, m, "a").Gated)
		for i, at := range []int64{-30, -20, -10} {
			k := fmt.Sprintf("u%d", i)
			flagOffEnqueue(m, k+"#1", k, at)
		}
		// ckIndex: u0, u1, u2, a. Discovery reads ranks 2 and 3.
		m.cursor = 2
		out := m.Dequeue(5, 100)
		// u2 (discovered) is served; pass 1 is dry (a is gated); the age
		// head (u0, u1) registers at V and both are served; pass 1 is dry
		// again and the age head is not read twice.
		require.Equal(t, []string{"u2", "u0", "u1"}, servedKeys(out))
		require.Equal(t, 0, m.cursor)
		for _, k := range []string{"u0", "u1", "u2"} {
			p, ok := parkedOf(m, k)
			require.True(t, ok, k)
			require.Equal(t, U, p, "%s served at V = 0", k)
		}
	})

	t.Run("NotReadWhilePassOneServes", func(t *testing.T) {
		t.Parallel()
		m := New(Config{ScanLimit: 1})
		add(t, m, "b", 5, 0, 0)
		flagOffEnqueue(m, "old#1", "old", -50)
		flagOffEnqueue(m, "older#1", "older", -60)
		m.cursor = 2 // discovery reads b only
		require.Equal(t, []string{"b", "b"}, servedKeys(m.Dequeue(2, 0)))
		_, ok := regOf(m, "older")
		require.False(t, ok, "pass 1 never ran dry: the age head was not read")
	})

	t.Run("LeavesGatedToTheProbe", func(t *testing.T) {
		t.Parallel()
		m := New(Config{Limits: Limits{Key: 1}, ScanLimit: 2})
		var held []string
		for _, k := range []string{"g0", "g1"} {
			add(t, m, k, 3, 0, 0)
		}
		for i := 0; i < 2; i++ {
			out := m.Dequeue(1, 0)
			require.Len(t, out, 1)
			held = append(held, decode(t, out[0].ID))
		}
		require.Equal(t, 2, gatedCount(m))
		flagOffAck(t, m, held[1]) // g1's slot freed without un-gating
		m.gp = 0                  // the probe looks at g0 (at its limit)
		g0 := mustReg(t, m, "g0").Gate
		// g1 is in the age head but registered: the age head leaves it.
		require.Empty(t, m.Dequeue(1, 0))
		require.True(t, mustReg(t, m, "g1").Gated)
		require.Equal(t, g0, m.gp)
		require.Greater(t, mustReg(t, m, "g0").Gate, mustReg(t, m, "g1").Gate, "g0, at its limit, went to the back")
		// The probe, on to the next gated (g1), returns it.
		require.Equal(t, []string{"g1"}, servedKeys(m.Dequeue(1, 0)))
	})

	t.Run("JoinsRegisteredPastTheReadBudget", func(t *testing.T) {
		t.Parallel()
		// Finding 5's sequence: more stale entries (flag-off drains) ahead
		// of u than the read budget. Pass 1 stops at the budget; the age
		// head (u, all a flag-off call sees) lets u join although u is
		// registered, at its rank whatever the window's bound: flag on
		// serves u as flag off would.
		m := New(Config{})
		for i := 0; i < ReadBudget+100; i++ {
			k := fmt.Sprintf("s%04d", i)
			add(t, m, k, 1, 0, 0)
			flagOffServe(t, m, k)
		}
		add(t, m, "u", 1, 0, 0)
		require.Equal(t, []Entry{{vm("u"), 0}}, m.CkIndex(), "u is all a flag-off call sees")
		require.Equal(t, []string{"u"}, servedKeys(m.Dequeue(1, 0)))
		budget := ReadBudget + 4*1*3
		require.Len(t, m.reg, ReadBudget+100-budget, "the stale entries past the budget wait for the next call")
		require.Empty(t, m.Dequeue(1, 0))
		require.Empty(t, m.reg)
	})

	t.Run("RegisteredJoinAtTheirRank", func(t *testing.T) {
		t.Parallel()
		// Past the budget, two registered variants with work in the age
		// head join at their rank (tag, then registration), not in age
		// order, and no gated variant joins.
		m := New(Config{Limits: Limits{Key: 2}, ScanLimit: 3})
		add(t, m, "g", 3, 0, 0) // gated at two in flight below
		add(t, m, "lo", 2, 0, 0)
		add(t, m, "hi", 2, 0, 0)
		require.Equal(t, []string{"g", "lo", "hi", "g"}, servedKeys(m.Dequeue(4, 0)))
		require.True(t, mustReg(t, m, "g").Gated)
		require.Equal(t, U, mustReg(t, m, "lo").U)
		m.reg[vm("hi")].U = U / 2 // hi before lo in tag order, after it in age order
		for i := 0; i < ReadBudget+100; i++ {
			k := fmt.Sprintf("s%04d", i)
			add(t, m, k, 1, 0, 0)
			flagOffServe(t, m, k)
		}
		require.Equal(t, []string{"hi", "lo"}, servedKeys(m.Dequeue(3, 0)))
		require.True(t, mustReg(t, m, "g").Gated)
	})
}

func TestPromotion(t *testing.T) {
	t.Parallel()

	t.Run("DueRunRegistersAsNewcomer", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		add(t, m, "a", 5, 0, 0)
		require.NoError(t, m.Enqueue("d#1", "d", 0, 5, 0))
		st, _ := m.State("d#1")
		require.Equal(t, byte(Delayed), st)
		require.Equal(t, []string{"a"}, servedKeys(m.Dequeue(1, 0)))
		require.Equal(t, []string{"a"}, servedKeys(m.Dequeue(1, 4)))
		_, ok := regOf(m, "d")
		require.False(t, ok, "not due")
		// At 5: d registers by the newcomer rule (top 2U, V U: at 3U).
		require.Equal(t, []string{"a"}, servedKeys(m.Dequeue(1, 5)))
		require.Equal(t, Reg{U: 3 * U, Seq: 2, Waiting: true}, mustReg(t, m, "d"))
	})

	t.Run("PromoteLimitPerVariant", func(t *testing.T) {
		t.Parallel()
		m := New(Config{PromoteLimit: 2})
		for i := 0; i < 5; i++ {
			require.NoError(t, m.Enqueue(fmt.Sprintf("d#%d", i), "d", 0, int64(1+i), 0))
		}
		require.Equal(t, []string{"d"}, servedKeys(m.Dequeue(1, 10)))
		require.Len(t, m.ready[vm("d")], 1)
		require.Len(t, m.delayed[vm("d")], 3)
	})

	t.Run("ScanLimitDueVariantsPerCall", func(t *testing.T) {
		t.Parallel()
		m := New(Config{ScanLimit: 2, Limits: Limits{Key: 1}})
		for i := 0; i < 3; i++ {
			k := fmt.Sprintf("d%d", i)
			require.NoError(t, m.Enqueue(k+"#1", k, 0, int64(1+i), 0))
			require.NoError(t, m.Enqueue(k+"#2", k, 0, int64(1+i), 0))
		}
		m.Dequeue(1, 10)
		require.Len(t, m.reg, 2)
		_, ok := regOf(m, "d2")
		require.False(t, ok)
		m.Dequeue(1, 10)
		mustReg(t, m, "d2")
	})

	t.Run("NothingAtZeroCapacity", func(t *testing.T) {
		t.Parallel()
		m := New(Config{Limits: Limits{Queue: 1}})
		add(t, m, "a", 2, 0, 0)
		require.NoError(t, m.Enqueue("d#1", "d", 0, 5, 0))
		require.Len(t, m.Dequeue(1, 0), 1)
		before := m.Snapshot()
		require.Empty(t, m.Dequeue(1, 10))
		require.Equal(t, normalized(before), normalized(m.Snapshot()), "capacity 0: the call does nothing")
	})
}

func TestWeights(t *testing.T) {
	t.Parallel()

	t.Run("ExactLongRunShares", func(t *testing.T) {
		t.Parallel()
		// Milli-weights 3000, 300, 7000 (gcd 100): every 103 serves the
		// counts are exactly 30, 3, 70 and the tags meet, remainders 0.
		for _, batch := range []int{1, 7, 103} {
			m := New(Config{})
			ws := map[string]float64{"a": 3, "b": 0.3, "c": 7}
			want := map[string]int{"a": 30, "b": 3, "c": 70}
			for _, k := range []string{"a", "b", "c"} {
				m.SetWeight(k, ws[k])
				add(t, m, k, 400, 0, 0)
			}
			count := map[string]int{}
			total := 0
			for k := 1; k <= 5; k++ {
				for total < 103*k {
					for _, s := range m.Dequeue(min(batch, 103*k-total), 0) {
						count[s.Key]++
						total++
						require.NoError(t, m.Ack(decode(t, s.ID)))
					}
				}
				for key, n := range want {
					require.Equal(t, n*k, count[key], "batch %d, after %d serves: %s", batch, total, key)
					require.Equal(t, Reg{U: int64(k) * 10 * U, Seq: mustReg(t, m, key).Seq}, mustReg(t, m, key))
				}
			}
		}
	})

	t.Run("RemainderCarried", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		m.SetWeight("a", 0.3)
		add(t, m, "a", 4, 0, 0)
		for _, want := range []Reg{{U: 3333333, R: 100}, {U: 6666666, R: 200}, {U: 10000000, R: 0}} {
			require.Len(t, m.Dequeue(1, 0), 1)
			want.Seq = 1
			require.Equal(t, want, mustReg(t, m, "a"))
		}
	})

	t.Run("ChangeCapsTagDropsRemainder", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		m.SetWeight("a", 0.3)
		add(t, m, "a", 4, 0, 0)
		m.Dequeue(1, 0)
		require.Equal(t, Reg{U: 3333333, R: 100, Seq: 1}, mustReg(t, m, "a"))
		// Raised to 2: the serve at 0.3 is owed as one serve at 2 at most,
		// V (0) + 10^9/2000.
		m.SetWeight("a", 2)
		require.Equal(t, Reg{U: U / 2, R: 0, Seq: 1}, mustReg(t, m, "a"))
		require.Equal(t, 2.0, m.Weight("a"))
		m.Dequeue(1, 0) // E = U/2 = V
		require.Equal(t, Reg{U: U, R: 0, Seq: 1}, mustReg(t, m, "a"))
		// Lowered (cleared: weight 1): a tag below V + one serve stays, no
		// credit, no new debt.
		m.SetWeight("a", 0)
		require.Equal(t, int64(1000), m.MilliWeight(vm("a")))
		require.Equal(t, Reg{U: U, R: 0, Seq: 1}, mustReg(t, m, "a"))
		m.Dequeue(1, 0)
		require.Equal(t, 2*U, mustReg(t, m, "a").U)
	})

	t.Run("ChangeCapsNoLowerThanAServe", func(t *testing.T) {
		t.Parallel()
		// At weight 0.003 a serve costs 333,333,333 units and carries a
		// remainder of 1 (of 3): the third serve costs one unit more. The
		// cap is ceil(10^9/3) above V, what such a serve leaves, so setting
		// the same weight again gives no credit.
		m := New(Config{})
		m.SetWeight("a", 0.003)
		add(t, m, "a", 5, 0, 0)
		for range 3 {
			m.Dequeue(1, 0)
		}
		r := mustReg(t, m, "a")
		v := int64(m.V() * float64(U))
		require.Equal(t, int64(333333334), r.U-v, "the serve that carried")
		m.SetWeight("a", 0.003)
		require.Equal(t, r.U, mustReg(t, m, "a").U)
	})

	t.Run("ChangeCapsParkedAndGatedTags", func(t *testing.T) {
		t.Parallel()
		// x is served once at weight 0.001 (a tag 1000 serves ahead) and
		// drains: its tag is parked. Raised to 1, it comes back one serve
		// ahead of V, not 1000.
		m := New(Config{})
		m.SetWeight("x", 0.001)
		add(t, m, "x", 1, 0, 0)
		add(t, m, "y", 5, 0, 0)
		for range 2 {
			for _, s := range m.Dequeue(1, 0) {
				require.NoError(t, m.Ack(decode(t, s.ID)))
			}
		}
		require.Equal(t, []Entry{{vm("x"), float64(1000 * U)}}, m.Idle())
		m.SetWeight("x", 1)
		limit := float64(int64(m.V()*float64(U)) + U) // V + one serve at weight 1
		require.Equal(t, []Entry{{vm("x"), limit}}, m.Idle())
		m.SetWeight("x", 0.5) // a lower weight does not raise it
		require.Equal(t, []Entry{{vm("x"), limit}}, m.Idle())

		// z, at its key limit, is gated with the tag of its serve at 0.001.
		g := New(Config{Limits: Limits{Key: 1}})
		g.SetWeight("z", 0.001)
		add(t, g, "z", 2, 0, 0)
		add(t, g, "y", 5, 0, 0)
		served := g.Dequeue(1, 0)
		require.Equal(t, "z", served[0].Key)
		g.Dequeue(1, 0) // y; z, at its limit, is gated
		require.True(t, mustReg(t, g, "z").Gated)
		require.Equal(t, 1000*U, mustReg(t, g, "z").U)
		g.SetWeight("z", 1)
		require.Equal(t, int64(g.V()*float64(U))+U, mustReg(t, g, "z").U, "V + one serve at weight 1")
		require.True(t, mustReg(t, g, "z").Gated)
	})

	t.Run("MilliWeightOf", func(t *testing.T) {
		t.Parallel()
		for _, c := range []struct {
			w    float64
			want int64
		}{
			{0, 0}, {0.0001, MinMilliWeight}, {0.0004, 1}, {0.0005, 1}, {0.001, 1}, {0.0015, 2},
			{0.3, 300}, {1, 1000}, {3, 3000}, {7, 7000}, {1000, MaxMilliWeight}, {5000, MaxMilliWeight},
		} {
			require.Equal(t, c.want, MilliWeightOf(c.w), "%v", c.w)
		}
	})

	t.Run("ExtremeStrides", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		m.SetWeight("lo", 0.001)
		m.SetWeight("hi", 1000)
		add(t, m, "lo", 2, 0, 0)
		add(t, m, "hi", 3, 0, 0)
		require.Equal(t, []string{"lo", "hi", "hi"}, servedKeys(m.Dequeue(3, 0)))
		require.Equal(t, 1000*U, mustReg(t, m, "lo").U, "10^9 / 1")
		require.Equal(t, int64(2000), mustReg(t, m, "hi").U)
	})
}

// normalized orders a snapshot's runs (Snapshot lists them in map order).
func normalized(s Snapshot) Snapshot {
	s.Runs = append([]SnapshotRun(nil), s.Runs...)
	sort.Slice(s.Runs, func(i, j int) bool { return s.Runs[i].ID < s.Runs[j].ID })
	return s
}

// storedInRange checks what the rebase promises between calls: the stored
// clock below RebaseAt, and every stored time an exact integer of a double
// that the next rebase keeps non-negative, below 2^50 (model.go: tags stay
// below 2^50).
func storedInRange(t require.TestingT, m *Model) {
	const limit = int64(1) << 50
	in := func(what string, x int64) {
		require.True(t, x >= 0 && x < limit, "%s = %d outside [0, 2^50)", what, x)
	}
	in("V", m.v)
	require.Less(t, m.v, int64(RebaseAt), "V at or past RebaseAt after a call")
	for v, r := range m.reg {
		in("tag of "+v, r.U)
		require.True(t, r.R >= 0 && r.R < max(m.MilliWeight(v), 1000*1000), "remainder of %s = %d", v, r.R)
	}
	for v, p := range m.idle {
		in("parked tag of "+v, p)
	}
}

func TestRebase(t *testing.T) {
	t.Parallel()

	t.Run("TranslationInvariantAcrossTheEdge", func(t *testing.T) {
		t.Parallel()
		// The same workload from V = 0 and from V = RebaseAt - 1.5 units:
		// the same serves, and logical tags that differ by the offset,
		// across the rebase. The weight-1000 key's tag keeps moving by 1000
		// units a serve.
		const offset = RebaseAt - 3*U/2
		ref, edge := New(Config{}), New(Config{})
		edge.v = offset
		ws := map[string]float64{"h": 1000, "b": 1, "c": 0.5}
		for _, m := range []*Model{ref, edge} {
			for _, k := range []string{"h", "b", "c"} {
				m.SetWeight(k, ws[k])
				add(t, m, k, 3, 0, 0)
			}
		}
		lastV, lastF := logical(edge), edge.V()
		for i := 0; i < 2500; i++ {
			hBefore, hadH := regOf(edge, "h")
			hLogical, vLogical := edge.epoch*RebaseBy+hBefore.U, logical(edge)
			got, want := deqAck(t, edge, 1, 0), deqAck(t, ref, 1, 0)
			require.Equal(t, want, got, "serve %d", i)
			storedInRange(t, edge)
			require.GreaterOrEqual(t, logical(edge), lastV)
			require.GreaterOrEqual(t, edge.V(), lastF, "V() decreased at serve %d", i)
			lastV, lastF = logical(edge), edge.V()
			if got[0] == "h" && hadH {
				h := mustReg(t, edge, "h")
				require.Equal(t, max(hLogical, vLogical)+1000, edge.epoch*RebaseBy+h.U, "h's tag moves by its stride")
			}
			for _, m := range []*Model{ref, edge} {
				for _, k := range []string{"h", "b", "c"} {
					if len(m.ready[vm(k)]) < 2 {
						add(t, m, k, 2, 0, 0)
					}
				}
				if i%250 == 0 { // newcomers, two in a row: the second waits behind the first
					add(t, m, fmt.Sprintf("n%d", i), 1, 0, 0)
					add(t, m, fmt.Sprintf("o%d", i), 1, 0, 0)
				}
			}
			require.Equal(t, ref.v+offset, logical(edge))
			require.Len(t, edge.reg, len(ref.reg))
			refLane := lane(ref)
			require.Equal(t, refLane, lane(edge))
			for v, r := range ref.reg {
				e, ok := edge.reg[v]
				require.True(t, ok, v)
				if r.Waiting && v != refLane[0] {
					require.Zero(t, e.U, "%s queued in the lane: no tag", v)
				} else {
					require.Equal(t, r.U+offset, edge.epoch*RebaseBy+e.U, v)
				}
				r2 := *r
				r2.U = e.U
				require.Equal(t, r2, *e, v)
			}
			require.Len(t, edge.idle, len(ref.idle))
			for v, p := range ref.idle {
				require.Equal(t, p+offset, edge.epoch*RebaseBy+edge.idle[v], v)
			}
		}
		require.Equal(t, int64(1), edge.epoch, "the edge model rebased")
		require.Less(t, edge.v, int64(RebaseAt))
	})

	t.Run("ShiftsAndLifts", func(t *testing.T) {
		t.Parallel()
		m := Restore(Config{Limits: Limits{Key: 1}}, Snapshot{
			V: RebaseAt - 1, NextSeq: 4,
			Reg: map[string]Reg{
				vm("x"): {U: RebaseAt, Seq: 1},
				vm("g"): {U: 5, R: 7, Seq: 2, Gated: true},
				vm("w"): {U: RebaseAt + 2*U, Seq: 3, Waiting: true},
			},
			Idle:     map[string]int64{vm("p"): RebaseAt + 3*U, vm("q"): 17},
			InFlight: map[string]int{vm("g"): 1},
			Runs: []SnapshotRun{
				{ID: "x1", Key: "x", Attempt: 1}, {ID: "x2", Key: "x", Attempt: 1},
				{ID: "g1", Key: "g", Attempt: 1}, {ID: "w1", Key: "w", Attempt: 1},
			},
		})
		require.Equal(t, []string{"x"}, servedKeys(m.Dequeue(1, 0)))
		lo := int64(RebaseAt - rebaseFloor)
		require.Equal(t, int64(1), m.epoch)
		require.Equal(t, int64(RebaseAt-RebaseBy), m.v)
		// (The probe found g at its limit and moved it to the back: 1; x
		// was gated after it.)
		require.Equal(t, Reg{U: RebaseAt + U - RebaseBy, Seq: 1, Gated: true, Gate: 2}, mustReg(t, m, "x"))
		require.Equal(t, Reg{U: lo - RebaseBy, Seq: 2, Gated: true, Gate: 1}, mustReg(t, m, "g"), "lifted to V - 2^47, remainder dropped")
		require.Equal(t, Reg{U: RebaseAt + 2*U - RebaseBy, Seq: 3, Waiting: true}, mustReg(t, m, "w"), "shifted, still waiting")
		require.Equal(t, []Entry{{vm("p"), float64(RebaseAt + 3*U - RebaseBy)}}, m.Idle(), "q (<= V) reaped, p shifted")
		storedInRange(t, m)
	})

	t.Run("NoRebaseBelowTheEdge", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		m.v = RebaseAt - U - 1
		add(t, m, "a", 3, 0, 0)
		m.Dequeue(2, 0)
		require.Equal(t, int64(0), m.epoch)
		require.Equal(t, int64(RebaseAt-1), m.v)
	})

	t.Run("VNeverDecreasesAcrossLateRebase", func(t *testing.T) {
		t.Parallel()
		// Finding 7's sequence: V() is computed from the exact integer
		// epoch*RebaseBy + v, so a one-unit step across a rebase never reads
		// as a decrease, at any epoch where that integer fits.
		for _, epoch := range []int64{31, 32, 1000, 1 << 14} {
			m := Restore(Config{}, Snapshot{
				Epoch: epoch, V: RebaseAt - 1, NextSeq: 2,
				Reg:  map[string]Reg{vm("x"): {U: RebaseAt, Seq: 1}},
				Runs: []SnapshotRun{{ID: "x1", Key: "x", Attempt: 1}, {ID: "x2", Key: "x", Attempt: 1}},
			})
			before, lBefore := m.V(), logical(m)
			require.Len(t, m.Dequeue(1, 0), 1)
			require.Equal(t, epoch+1, m.epoch)
			require.Equal(t, lBefore+1, logical(m), "the logical clock moved up one unit")
			require.GreaterOrEqual(t, m.V(), before, "V() decreased at epoch %d", epoch)
		}
	})
}

func TestExpireState(t *testing.T) {
	t.Parallel()
	m := New(Config{Limits: Limits{Key: 1}})
	m.SetWeight("a", 2)
	add(t, m, "a", 3, 0, 0)
	add(t, m, "b", 1, 0, 0)
	add(t, m, "c", 3, 0, 0)
	require.NoError(t, m.Enqueue("d#1", "d", 0, 50, 0))
	out := m.Dequeue(3, 0) // a gated, b parked, c gated
	require.Len(t, out, 3)
	m.epoch, m.cursor, m.gp = 2, 1, 1
	runs := m.Snapshot().Runs

	m.ExpireState()
	require.Empty(t, m.reg)
	require.Empty(t, m.idle)
	require.Equal(t, []int64{0, 0, 0, 1, 0, 1, 0}, clock(m))
	require.Equal(t, 0.0, m.V())
	require.Equal(t, 2.0, m.Weight("a"), "weights are configuration")
	require.ElementsMatch(t, runs, m.Snapshot().Runs, "runs stay")
	require.Equal(t, map[string]int{vm("a"): 1, vm("b"): 1, vm("c"): 1}, m.inflight)
	// Discovery registers the variants with ready runs at V = 0 again.
	require.NoError(t, m.Ack(decode(t, out[0].ID)))
	m.Dequeue(1, 0)
	mustReg(t, m, "a")
	mustReg(t, m, "c")
}

func TestSnapshotRestore(t *testing.T) {
	t.Parallel()
	cfg := Config{Limits: Limits{Key: 2}, IdleMaxEntries: 3, ScanLimit: 2}
	build := func() *Model {
		m := New(cfg)
		m.SetWeight("a", 0.3)
		m.SetWeight("z", 7)
		for i, k := range []string{"a", "b", "c", "z", "y"} {
			add(t, m, k, 1+i, 0, 0)
		}
		require.NoError(t, m.Enqueue("d#1", "d", 2, 40, 0))
		for i := 0; i < 4; i++ {
			m.Dequeue(2, int64(i))
		}
		m.EnvOther, m.EnvAhead = 1, 2
		m.epoch = 3
		return m
	}
	m := build()
	s := m.Snapshot()
	require.NotEmpty(t, s.Reg)
	require.NotEmpty(t, s.InFlight)

	r := Restore(cfg, s)
	require.Equal(t, normalized(s), normalized(r.Snapshot()), "round trip")

	// The restored model schedules as the original from here.
	o := m.Clone()
	for i := 0; i < 12; i++ {
		now := int64(10 * i)
		require.Equal(t, servedKeys(o.Dequeue(2, now)), servedKeys(r.Dequeue(2, now)), "call %d", i)
		require.Equal(t, normalized(o.Snapshot()), normalized(r.Snapshot()), "call %d", i)
	}

	t.Run("NextSeqDefaultsToOne", func(t *testing.T) {
		t.Parallel()
		r := Restore(Config{}, Snapshot{})
		require.Equal(t, int64(1), r.nextSeq)
	})
}

func TestClone(t *testing.T) {
	t.Parallel()
	m := New(Config{Limits: Limits{Key: 1}})
	m.SetWeight("a", 3)
	add(t, m, "a", 3, 0, 0)
	add(t, m, "b", 1, 0, 0)
	out := m.Dequeue(2, 0)
	before := normalized(m.Snapshot())
	states := map[string]byte{}
	for id, r := range m.runs {
		states[id] = r.state
	}

	c := m.Clone()
	require.NoError(t, c.Ack(decode(t, out[0].ID)))
	add(t, c, "a", 2, 0, 0)
	add(t, c, "n", 2, 0, 0)
	c.SetWeight("a", 0.5)
	c.SetLimits(Limits{Key: 3})
	c.Dequeue(5, 0)
	c.EnvOther = 4
	c.ExpireState()

	require.Equal(t, before, normalized(m.Snapshot()), "the original is untouched")
	require.Equal(t, Limits{Key: 1}, m.cfg.Limits)
	for id, r := range m.runs {
		require.Equal(t, states[id], r.state, id)
	}
	// And the other way round.
	c2 := m.Clone()
	snap := normalized(c2.Snapshot())
	add(t, m, "x", 1, 0, 0)
	m.Dequeue(3, 0)
	require.Equal(t, snap, normalized(c2.Snapshot()))
}

func TestCapacity(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		limits   Limits
		envOther int
		envAhead int
		maxCount int
		want     int
	}{
		{"none", Limits{}, 5, 0, 4, 4},
		{"queue", Limits{Queue: 3}, 0, 0, 4, 2},
		{"env", Limits{Env: 5}, 2, 0, 4, 2},
		{"envAndQueue", Limits{Env: 10, Queue: 2}, 1, 0, 4, 1},
		{"envFull", Limits{Env: 3}, 2, 0, 4, 0},
		{"envOverfull", Limits{Env: 3}, 7, 0, 4, 0},
		{"queueFull", Limits{Queue: 1}, 0, 0, 4, 0},
		{"maxCountZero", Limits{}, 0, 0, 0, 0},
		// Free slots of the env left to queues waiting ahead.
		{"envAhead", Limits{Env: 5}, 1, 2, 4, 1},
		{"envAheadAll", Limits{Env: 5}, 1, 3, 4, 0},
		{"envAheadMore", Limits{Env: 5}, 1, 9, 4, 0},
		{"envAheadNoEnvLimit", Limits{}, 1, 9, 4, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			m := New(Config{})
			add(t, m, "held", 1, 0, 0)
			require.Len(t, m.Dequeue(1, 0), 1) // one run in flight in this queue
			for _, k := range []string{"a", "b", "c", "d", "e"} {
				add(t, m, k, 1, 0, 0)
			}
			require.NoError(t, m.Enqueue("late#1", "late", 0, 5, 0))
			m.EnvOther, m.EnvAhead = c.envOther, c.envAhead
			m.SetLimits(c.limits)
			require.Equal(t, c.want, max(m.capacity(c.maxCount), 0))
			before := normalized(m.Snapshot())
			out := m.Dequeue(c.maxCount, 10)
			require.Len(t, out, c.want)
			if c.want == 0 {
				require.Nil(t, out)
				require.Equal(t, before, normalized(m.Snapshot()), "a call without capacity does nothing")
			}
		})
	}
}

func TestErrors(t *testing.T) {
	t.Parallel()
	m := New(Config{MaxAttempts: 2})
	add(t, m, "a", 1, 0, 0)
	ids := add(t, m, "b", 1, 5, 0) // delayed
	require.ErrorIs(t, m.Enqueue("a#0", "a", 0, 0, 0), ErrExists)
	require.ErrorIs(t, m.Ack("nope"), ErrNotFound)
	require.ErrorIs(t, m.Ack("a#0"), ErrNotInFlight)
	_, err := m.Nack("a#0", 0, 0, false)
	require.ErrorIs(t, err, ErrNotInFlight)
	_, err = m.Recover("nope", 0)
	require.ErrorIs(t, err, ErrNotFound)
	require.ErrorIs(t, m.Redrive("a#0", 0), ErrNotDead)
	require.ErrorIs(t, m.Redrive("nope", 0), ErrNotFound)
	require.False(t, m.Expire("nope"))

	// Attempts: two deliveries, then the dead letter; redrive resets.
	require.Len(t, m.Dequeue(1, 0), 1)
	ok, err := m.Nack("a#0", 0, 0, false)
	require.NoError(t, err)
	require.True(t, ok)
	require.Len(t, m.Dequeue(1, 0), 1)
	ok, err = m.Nack("a#0", 0, 0, false)
	require.NoError(t, err)
	require.False(t, ok)
	st, attempt := m.State("a#0")
	require.Equal(t, byte(Dead), st)
	require.Equal(t, 3, attempt)
	require.False(t, m.Expire("a#0"), "a dead run is not queued")
	require.NoError(t, m.Redrive("a#0", 0))
	st, attempt = m.State("a#0")
	require.Equal(t, []any{byte(Ready), 1}, []any{st, attempt})
	mustReg(t, m, "a")
	require.True(t, m.Expire(ids[0]), "a delayed run expires")
	st, _ = m.State(ids[0])
	require.Equal(t, byte(0), st)
}

// TestReleaseWithoutKeyLimitReturnsAtOnce is finding 4's sequence: x's
// slot frees while the limit is off, and the limit is back (not above gk)
// before the next call, so no call sees a rise. The release looks whatever
// the limit: x competes again at once. (It used to wait for the gated
// probe, the third call here, which broke batch invariance: dequeue(3)
// probed y only and served nothing where 3 x dequeue(1) served x.)
func TestReleaseWithoutKeyLimitReturnsAtOnce(t *testing.T) {
	t.Parallel()
	m := New(Config{Limits: Limits{Key: 1}})
	for _, k := range []string{"y", "z", "x"} {
		add(t, m, k, 3, 0, 0)
	}
	out := m.Dequeue(3, 0)
	require.Equal(t, []string{"y", "z", "x"}, servedKeys(out))
	require.Equal(t, 3, gatedCount(m))
	m.SetLimits(Limits{})
	require.NoError(t, m.Ack(decode(t, out[2].ID)))
	require.False(t, mustReg(t, m, "x").Gated, "the release looks without a key limit too")
	m.SetLimits(Limits{Key: 1})
	require.Equal(t, []string{"x"}, servedKeys(m.Dequeue(1, 0)), "x, below its limit, at the first call")
	// (The call's probe moved y, at its limit, from 1 to the back, 4.)
	require.Equal(t, Reg{U: 2 * U, Seq: 3, Gated: true, Gate: 5}, mustReg(t, m, "x"))

	// Had a call run while the limit was off, every gated variant would
	// have returned at it.
	m = New(Config{Limits: Limits{Key: 1}})
	for _, k := range []string{"y", "z", "x"} {
		add(t, m, k, 3, 0, 0)
	}
	out = m.Dequeue(3, 0)
	m.SetLimits(Limits{})
	require.NoError(t, m.Ack(decode(t, out[2].ID)))
	require.Equal(t, []string{"y", "z", "x"}, servedKeys(m.Dequeue(3, 0)))
	require.Zero(t, gatedCount(m))
}
