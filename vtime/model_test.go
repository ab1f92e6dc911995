package vtime

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
)

// cloneModel deep-copies m, so that a test can compare the whole state
// before and after an operation with require.Equal (reflect.DeepEqual
// follows the run pointers).
func cloneModel(m *Model) *Model {
	c := *m
	c.tags, c.idle, c.weights = clone(m.tags), clone(m.idle), clone(m.weights)
	c.runs = make(map[string]*run, len(m.runs))
	for id, r := range m.runs {
		cp := *r
		c.runs[id] = &cp
	}
	cloneSets := func(in map[string]map[string]float64) map[string]map[string]float64 {
		out := make(map[string]map[string]float64, len(in))
		for k, v := range in {
			out[k] = clone(v)
		}
		return out
	}
	c.ready, c.delayed = cloneSets(m.ready), cloneSets(m.delayed)
	c.inflight = make(map[string]int, len(m.inflight))
	for k, v := range m.inflight {
		c.inflight[k] = v
	}
	c.keyOf = make(map[string]string, len(m.keyOf))
	for k, v := range m.keyOf {
		c.keyOf[k] = v
	}
	return &c
}

// flagOffEnqueue queues a ready run the way a flag-off instance does: in
// its variant and ckIndex, without registering a tag. The model has no
// public way to do this; the Lua gets such variants from flag-off writers.
func flagOffEnqueue(m *Model, id, key string, at int64) {
	r := &run{id: keys.Segment(id), key: key, at: at, attempt: 1, state: Ready}
	m.runs[r.id] = r
	vm := m.member(r)
	if m.ready[vm] == nil {
		m.ready[vm] = map[string]float64{}
	}
	m.ready[vm][r.id] = float64(at)
}

func tagOf(m *Model, key string) (float64, bool) {
	s, ok := m.tags[keys.VariantMember(key)]
	return s, ok
}

func idleOf(m *Model, key string) (float64, bool) {
	s, ok := m.idle[keys.VariantMember(key)]
	return s, ok
}

func servedKeys(s []Served) []string {
	out := make([]string, len(s))
	for i, x := range s {
		out[i] = x.Key
	}
	return out
}

// add enqueues n ready runs of key at time at (ids key#1, key#2, ...
// continuing from what the key already has).
func add(t testing.TB, m *Model, key string, n int, at, now int64) {
	t.Helper()
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("%s#%d", key, len(m.runs)+i)
		for {
			if _, taken := m.runs[keys.Segment(id)]; !taken {
				break
			}
			id += "'"
		}
		require.NoError(t, m.Enqueue(id, key, 0, at, now))
	}
}

func TestNewcomerRule(t *testing.T) {
	t.Parallel()

	t.Run("ColdStartAllAtV", func(t *testing.T) {
		t.Parallel()
		// With no tag and no previous newcomer above V, every key starts at
		// V: plain SFQ at cold start, whatever the arrival order.
		m := New(Config{})
		for _, k := range []string{"c", "a", "b"} {
			add(t, m, k, 2, 0, 0)
		}
		require.Equal(t, []Entry{{"=a", 0}, {"=b", 0}, {"=c", 0}}, m.Tags())
		require.Equal(t, 0.0, m.V)
	})

	t.Run("ColdStartAfterDrainAtCurrentV", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		add(t, m, "a", 3, 0, 0)
		require.Len(t, m.Dequeue(3, 0), 3) // a: tags 0 -> 1 -> 2 -> 3, V = 2
		require.Equal(t, 2.0, m.V)
		require.Empty(t, m.Tags())
		// The previous newcomer tag (0) is below V: a new key starts at V.
		add(t, m, "b", 1, 0, 0)
		s, ok := tagOf(m, "b")
		require.True(t, ok)
		require.Equal(t, 2.0, s)
	})

	t.Run("OneQuantumBehindHighestCappedTag", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		add(t, m, "a", 5, 0, 0)
		require.Equal(t, []string{"a"}, servedKeys(m.Dequeue(1, 0))) // V 0, S_a 1
		add(t, m, "n", 1, 0, 0)
		// highest tag 1 (capped at V+1 = 1), previous newcomer 0: A = 1 > V.
		s, _ := tagOf(m, "n")
		require.Equal(t, 2.0, s)
		require.Equal(t, 2.0, m.L)
	})

	t.Run("ChainedBehindPreviousNewcomer", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		add(t, m, "a", 5, 0, 0)
		m.Dequeue(1, 0)
		for i, want := range []float64{2, 3, 4} {
			k := fmt.Sprintf("n%d", i)
			add(t, m, k, 1, 0, 0)
			s, _ := tagOf(m, k)
			// The cap keeps the highest tag at V+1 = 1; the chain comes from L.
			require.Equal(t, want, s, k)
		}
	})

	t.Run("LowWeightKeyDoesNotPushNewcomersBack", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		m.SetWeight("x", 0.01)
		add(t, m, "x", 5, 0, 0)
		add(t, m, "y", 5, 0, 0)
		require.Equal(t, []string{"x", "y"}, servedKeys(m.Dequeue(2, 0)))
		sx, _ := tagOf(m, "x")
		require.Equal(t, 100.0, sx) // 0 + 1/0.01
		add(t, m, "n", 1, 0, 0)
		sn, _ := tagOf(m, "n")
		// Anchored on the highest tag, n would sit at 101; capped, it sits
		// one quantum behind y.
		require.Equal(t, 2.0, sn)
		got := servedKeys(m.Dequeue(3, 0))
		// y (S 1) first, then n and y tie at 2: name order.
		require.Equal(t, []string{"y", "n", "y"}, got, "n served within 3 serves")
	})

	t.Run("NotAboveVStartsAtV", func(t *testing.T) {
		t.Parallel()
		// Registered tags at or below V (never served) do not push a
		// newcomer back.
		m := New(Config{})
		add(t, m, "a", 1, 0, 0)
		add(t, m, "b", 1, 0, 0)
		s, _ := tagOf(m, "b")
		require.Equal(t, 0.0, s)
	})

	t.Run("QuantumScales", func(t *testing.T) {
		t.Parallel()
		m := New(Config{Quantum: 0.5})
		add(t, m, "a", 5, 0, 0)
		m.Dequeue(1, 0) // S_a = 0.5
		add(t, m, "n", 1, 0, 0)
		s, _ := tagOf(m, "n")
		require.Equal(t, 1.0, s)
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
		p, ok := idleOf(m, "a")
		require.True(t, ok, "a drained with S 1 > V 0: parked")
		require.Equal(t, 1.0, p)
		_, ok = tagOf(m, "a")
		require.False(t, ok)

		add(t, m, "a", 1, 0, 0)
		s, _ := tagOf(m, "a")
		require.Equal(t, 1.0, s, "returns at max(V 0, parked 1)")
		_, ok = idleOf(m, "a")
		require.False(t, ok, "the idle entry is removed on return")
	})

	t.Run("ReturnAtVWhenParkedBelow", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		add(t, m, "a", 1, 0, 0)
		add(t, m, "b", 5, 0, 0)
		m.Dequeue(1, 0) // a parked at 1
		// b: E 0 -> S 1; E 1 -> S 2; E 2 -> S 3: V = 2 > parked 1.
		require.Equal(t, []string{"b", "b", "b"}, servedKeys(m.Dequeue(3, 0)))
		require.Equal(t, 2.0, m.V)
		// No call parked anything since, so the worthless entry is still there.
		_, ok := idleOf(m, "a")
		require.True(t, ok)
		add(t, m, "a", 1, 0, 0)
		s, _ := tagOf(m, "a")
		require.Equal(t, 2.0, s, "returns at max(V 2, parked 1)")
		_, ok = idleOf(m, "a")
		require.False(t, ok)
	})

	t.Run("ExpireParksOnlyAboveV", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		require.NoError(t, m.Enqueue("a1", "a", 0, 0, 0))
		require.NoError(t, m.Enqueue("b1", "b", 0, 0, 0))
		require.NoError(t, m.Enqueue("b2", "b", 0, 0, 0))
		require.NoError(t, m.Enqueue("c1", "c", 0, 0, 0))
		require.NoError(t, m.Enqueue("c2", "c", 0, 0, 0))
		// All at V 0; by name, a then b are served (S 1 each).
		require.Equal(t, []string{"a", "b"}, servedKeys(m.Dequeue(2, 0)))
		// a drained by the serve: S 1 > V 0, parked. b has b2 left, S_b 1.
		require.True(t, m.Expire("b2"))
		p, ok := idleOf(m, "b")
		require.True(t, ok, "b drained by expiry with S 1 > V 0: parked")
		require.Equal(t, 1.0, p)
		// c never served: S_c = 0 = V; its drain by expiry parks nothing.
		require.True(t, m.Expire("c1"))
		require.True(t, m.Expire("c2"))
		_, ok = idleOf(m, "c")
		require.False(t, ok)
		_, ok = tagOf(m, "c")
		require.False(t, ok, "a drained variant leaves the tags")
	})
}

func TestReaping(t *testing.T) {
	t.Parallel()

	t.Run("RankCapKeepsHighest", func(t *testing.T) {
		t.Parallel()
		m := New(Config{IdleMaxEntries: 2})
		ws := map[string]float64{"p1": 0.5, "p2": 1, "p3": 0.25, "p4": 2}
		for k, w := range ws {
			m.SetWeight(k, w)
			add(t, m, k, 1, 0, 0)
		}
		// One call serves all four at E 0 and parks 1/w: 2, 1, 4, 0.5.
		require.Len(t, m.Dequeue(4, 0), 4)
		require.Equal(t, 0.0, m.V)
		require.Equal(t, []Entry{{"=p1", 2}, {"=p3", 4}}, m.Idle())
	})

	t.Run("AtOrBelowVReapedByParkingCall", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		m.SetWeight("p", 0.5)
		add(t, m, "p", 1, 0, 0) // parked at 2
		add(t, m, "q", 1, 0, 0) // parked at 1
		add(t, m, "z", 10, 0, 0)
		require.Equal(t, []string{"p", "q"}, servedKeys(m.Dequeue(2, 0)))
		require.Equal(t, []Entry{{"=q", 1}, {"=p", 2}}, m.Idle())
		// z: E 0,1,2 -> V 2. No parking: nothing reaped yet.
		require.Equal(t, []string{"z", "z", "z"}, servedKeys(m.Dequeue(3, 0)))
		require.Equal(t, 2.0, m.V)
		require.Len(t, m.Idle(), 2)
		// y (discovered at V 2) is served and parks at 3, V stays 2: the
		// call reaps q (1, below V) and p (2, equal to V), keeps y.
		flagOffEnqueue(m, "y1", "y", 0)
		require.Equal(t, []string{"y"}, servedKeys(m.Dequeue(1, 0)))
		require.Equal(t, 2.0, m.V)
		require.Equal(t, []Entry{{"=y", 3}}, m.Idle())
	})
}

// TestIdleCapOnExpiry: the idle set is rank-capped only by dequeue calls
// that park; variants drained by TTL expiry park without any cap, so the
// set grows past IdleMaxEntries by one entry per expired variant until the
// next parking dequeue.
func TestIdleCapOnExpiry(t *testing.T) {
	t.Parallel()
	m := New(Config{IdleMaxEntries: 1})
	for _, k := range []string{"a", "b", "c"} {
		require.NoError(t, m.Enqueue(k+"1", k, 0, 0, 0))
		require.NoError(t, m.Enqueue(k+"2", k, 0, 0, 0))
	}
	require.Equal(t, []string{"a", "b", "c"}, servedKeys(m.Dequeue(3, 0))) // S 1 each, V 0
	for _, id := range []string{"a2", "b2", "c2"} {
		require.True(t, m.Expire(id)) // drains its variant with S 1 > V 0: parks
		require.LessOrEqual(t, len(m.Idle()), 1+1, "after expiring %s: idle %v, cap 1, one entry parked by the call", id, m.Idle())
	}
}

func TestVNeverDecreases(t *testing.T) {
	t.Parallel()
	m := New(Config{Limits: Limits{Key: 2}})
	for i, k := range []string{"a", "b", "c", "d"} {
		m.SetWeight(k, []float64{0.5, 1, 2, 3}[i])
		add(t, m, k, 20, int64(i), 0)
	}
	prev := m.V
	now := int64(0)
	for step := 0; step < 200; step++ {
		served := m.Dequeue(1+step%4, now)
		for i, s := range served {
			if i%2 == 0 {
				require.NoError(t, m.Ack(mustDecode(t, s.ID)))
			} else {
				_, err := m.Nack(mustDecode(t, s.ID), now+int64(step%5), now, false)
				require.NoError(t, err)
			}
		}
		if step%7 == 0 {
			add(t, m, fmt.Sprintf("n%d", step), 1, now, now)
		}
		now++
		require.GreaterOrEqual(t, m.V, prev, "step %d", step)
		prev = m.V
	}
	require.Greater(t, m.V, 0.0)
}

func mustDecode(t testing.TB, enc string) string {
	t.Helper()
	id, err := keys.DecodeSegment(enc)
	require.NoError(t, err)
	return id
}

func TestEmptyCallChangesNothing(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		cfg   Config
		build func(t *testing.T, m *Model)
	}{
		{"Empty", Config{}, func(*testing.T, *Model) {}},
		{"AllKeysGated", Config{Limits: Limits{Key: 1}}, func(t *testing.T, m *Model) {
			add(t, m, "a", 3, 0, 0)
			add(t, m, "b", 3, 0, 0)
			require.Len(t, m.Dequeue(5, 0), 2)
		}},
		{"QueueLimitReached", Config{Limits: Limits{Queue: 2}}, func(t *testing.T, m *Model) {
			add(t, m, "a", 3, 0, 0)
			require.Len(t, m.Dequeue(5, 0), 2)
		}},
		{"EnvLimitReachedByOtherQueues", Config{Limits: Limits{Env: 3}}, func(t *testing.T, m *Model) {
			add(t, m, "a", 3, 0, 0)
			require.Len(t, m.Dequeue(1, 0), 1)
			m.EnvOther = 2
		}},
		{"HeadsInTheFuture", Config{}, func(t *testing.T, m *Model) {
			require.NoError(t, m.Enqueue("a1", "a", 0, 100, 0))
			require.NoError(t, m.Enqueue("b1", "b", 0, 200, 0))
		}},
		{"DiscoveryPendingButGated", Config{Limits: Limits{Key: 1}, WindowMultiplier: 1}, func(t *testing.T, m *Model) {
			add(t, m, "a", 2, 0, 0)
			require.Len(t, m.Dequeue(1, 0), 1)
			// Untagged variants written by a flag-off instance, all gated.
			for i := 0; i < 4; i++ {
				k := fmt.Sprintf("u%d", i)
				flagOffEnqueue(m, k+"#1", k, int64(i))
				flagOffEnqueue(m, k+"#2", k, int64(i))
				m.inflight[keys.VariantMember(k)] = 1
			}
			m.Cursor = 1
		}},
		{"ParkedAndStaleState", Config{Limits: Limits{Key: 1}}, func(t *testing.T, m *Model) {
			m.SetWeight("w", 3)
			add(t, m, "p", 1, 0, 0)
			add(t, m, "w", 2, 0, 0)
			require.Len(t, m.Dequeue(2, 0), 2) // p parked; w gated
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := New(tc.cfg)
			tc.build(t, m)
			before := cloneModel(m)
			for _, n := range []int{1, 3, 10} {
				require.Empty(t, m.Dequeue(n, 50))
				require.Equal(t, before, m, "dequeue(%d) served nothing but changed the state", n)
			}
		})
	}
}

func TestPromotion(t *testing.T) {
	t.Parallel()

	t.Run("DueRunIsPromotedAndServed", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		require.NoError(t, m.Enqueue("a1", "a", 0, 100, 0))
		st, _ := m.State("a1")
		require.Equal(t, byte(Delayed), st)
		require.Empty(t, m.Dequeue(1, 99))
		require.Empty(t, m.Tags(), "a delayed run does not register its variant")
		require.Equal(t, []string{"a"}, servedKeys(m.Dequeue(1, 100)))
	})

	t.Run("PromotionPersistsWhenNothingIsServed", func(t *testing.T) {
		t.Parallel()
		m := New(Config{Limits: Limits{Key: 1}})
		add(t, m, "a", 1, 0, 0)
		require.Len(t, m.Dequeue(1, 0), 1) // a gated from now on; parked at 1
		require.NoError(t, m.Enqueue("a2", "a", 0, 10, 0))
		require.Empty(t, m.Dequeue(1, 10))
		st, _ := m.State("a2")
		require.Equal(t, byte(Ready), st)
		s, ok := tagOf(m, "a")
		require.True(t, ok, "the promoted run registered its variant")
		require.Equal(t, 1.0, s, "at max(V 0, parked 1)")
	})

	t.Run("PromoteLimitPerVariant", func(t *testing.T) {
		t.Parallel()
		m := New(Config{PromoteLimit: 2, Limits: Limits{Key: 1}})
		add(t, m, "a", 1, 0, 0)
		require.Len(t, m.Dequeue(1, 0), 1) // gate a so nothing is served
		for i := 0; i < 5; i++ {
			require.NoError(t, m.Enqueue(fmt.Sprintf("d%d", i), "a", 0, int64(10+i), 0))
		}
		require.Empty(t, m.Dequeue(1, 100))
		require.Len(t, m.ready[keys.VariantMember("a")], 2)
		require.Empty(t, m.Dequeue(1, 100))
		require.Len(t, m.ready[keys.VariantMember("a")], 4)
	})

	t.Run("PromotesScanLimitVariantsPerCall", func(t *testing.T) {
		t.Parallel()
		m := New(Config{ScanLimit: 2, Limits: Limits{Key: 1}})
		for i := 0; i < 5; i++ {
			k := fmt.Sprintf("k%d", i)
			require.NoError(t, m.Enqueue(k+"#1", k, 0, int64(10+i), 0))
			m.inflight[keys.VariantMember(k)] = 1 // gated: promotion only
		}
		// ScanLimit 2: the two earliest variants per call.
		require.Empty(t, m.Dequeue(1, 100))
		require.Equal(t, []Entry{{"=k0", 0}, {"=k1", 0}}, m.Tags())
		require.Empty(t, m.Dequeue(2, 100))
		require.Len(t, m.Tags(), 4)
		require.Empty(t, m.Dequeue(1, 100))
		require.Len(t, m.Tags(), 5)
	})
}

func TestWeights(t *testing.T) {
	t.Parallel()
	m := New(Config{})
	require.Equal(t, 1.0, m.Weight("a"))
	m.SetWeight("a", 2)
	require.Equal(t, 2.0, m.Weight("a"))
	add(t, m, "a", 20, 0, 0)
	add(t, m, "b", 20, 0, 0)
	// a: tags 0, .5, 1, 1.5 ...; b: 0, 1, 2 ... ties by (S, name).
	require.Equal(t, []string{"a", "b", "a", "a", "b", "a"}, servedKeys(m.Dequeue(6, 0)))
	m.SetWeight("a", 0) // clear
	require.Equal(t, 1.0, m.Weight("a"))
	sa, _ := tagOf(m, "a")
	sb, _ := tagOf(m, "b")
	require.Equal(t, 2.0, sa)
	require.Equal(t, 2.0, sb)
	require.Equal(t, []string{"a", "b", "a", "b"}, servedKeys(m.Dequeue(4, 0)))
	// A weight applies at the next serve, also to a key already registered.
	m.SetWeight("b", 0.5)
	require.Equal(t, []string{"a", "b", "a", "a"}, servedKeys(m.Dequeue(4, 0)))
}

func TestDiscovery(t *testing.T) {
	t.Parallel()

	t.Run("RotatingCursorReachesEveryVariant", func(t *testing.T) {
		t.Parallel()
		// 20 variants written key by key by a flag-off instance (every run
		// of u00 older than any of u01, ...): the oldest-first part of
		// discovery alone would only ever see the first window.
		m := New(Config{ScanLimit: 2})
		const n = 20
		for i := 0; i < n; i++ {
			k := fmt.Sprintf("u%02d", i)
			for j := 0; j < 3; j++ {
				flagOffEnqueue(m, fmt.Sprintf("%s#%d", k, j), k, int64(100*i+j))
			}
		}
		first := map[string]int{}
		cursors := []int{}
		for call := 0; call < 60 && len(first) < n; call++ {
			for _, s := range m.Dequeue(2, 10_000) {
				if _, ok := first[s.Key]; !ok {
					first[s.Key] = call
				}
			}
			cursors = append(cursors, m.Cursor)
		}
		require.Len(t, first, n)
		// ScanLimit 2: the cursor advances 2 per call and wraps past the end.
		require.Equal(t, []int{2, 4, 6, 8}, cursors[:4])
		for k, c := range first {
			// The flag-flip bound: ceil(variants/maxCount) + 1 calls.
			require.Less(t, c, n/2+1, k)
		}
	})

	t.Run("DiscoveredAtVOrParked", func(t *testing.T) {
		t.Parallel()
		m := New(Config{})
		add(t, m, "z", 10, 0, 0)
		require.Len(t, m.Dequeue(3, 0), 3) // V 2, S_z 3
		m.idle[keys.VariantMember("p")] = 7
		m.idle[keys.VariantMember("q")] = 1
		flagOffEnqueue(m, "p1", "p", 0)
		flagOffEnqueue(m, "q1", "q", 0)
		flagOffEnqueue(m, "u1", "u", 0)
		// The call discovers p at max(V, 7) = 7, q at max(V 2, 1) = 2 and u
		// at V = 2; it serves q and u (tags 2, by name) before z (3).
		require.Equal(t, []string{"q", "u", "z"}, servedKeys(m.Dequeue(3, 0)))
		require.Equal(t, []Entry{{"=z", 4}, {"=p", 7}}, m.Tags())
		_, ok := idleOf(m, "p")
		require.False(t, ok, "discovery consumed the parked tag")
	})

	t.Run("FlagFlipWithSingleRunKeys", func(t *testing.T) {
		t.Parallel()
		// The flag-flip shape (50 keys written key by key with the flag
		// off), every other key with a single run, maxCount 2, default
		// window: every key should be served within ceil(50/2)+1 calls.
		// The discovery cursor is a rank in ckIndex: each single-run key
		// served ahead of it leaves ckIndex, the ranks behind shift down,
		// and the cursor jumps over untagged keys, which wait for later
		// sweeps.
		m := New(Config{})
		const n = 50
		for i := 0; i < n; i++ {
			k := fmt.Sprintf("k%02d", i)
			for j := 0; j < 1+i%2; j++ {
				flagOffEnqueue(m, fmt.Sprintf("%s#%d", k, j), k, int64(100*i+j))
			}
		}
		first := map[string]int{}
		for call := 1; call <= 60 && len(first) < n; call++ {
			for _, s := range m.Dequeue(2, 10_000) {
				if _, ok := first[s.Key]; !ok {
					first[s.Key] = call
				}
			}
		}
		require.Len(t, first, n)
		for i := 0; i < n; i++ {
			k := fmt.Sprintf("k%02d", i)
			require.LessOrEqual(t, first[k], n/2+1, "%s first served at call %d", k, first[k])
		}
	})

	t.Run("NoDiscoveryWhenEveryVariantIsTagged", func(t *testing.T) {
		t.Parallel()
		m := New(Config{WindowMultiplier: 1})
		for i := 0; i < 5; i++ {
			add(t, m, fmt.Sprintf("k%d", i), 2, int64(i), 0)
		}
		m.Dequeue(1, 0)
		require.Equal(t, 0, m.Cursor, "the cursor only moves when discovery runs")
	})
}

func TestLimits(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		limits   Limits
		envOther int
		held     int // runs already in flight in the queue (key a)
		want     []string
	}{
		{"None", Limits{}, 0, 0, []string{"a", "b", "c", "a", "b", "c"}},
		{"Env", Limits{Env: 5}, 2, 0, []string{"a", "b", "c"}},
		{"EnvCountsThisQueue", Limits{Env: 5}, 1, 2, []string{"a", "b"}},
		{"EnvFull", Limits{Env: 3}, 3, 0, nil},
		{"Queue", Limits{Queue: 4}, 0, 1, []string{"a", "b", "c"}},
		{"QueueIgnoresOtherQueues", Limits{Queue: 4}, 100, 0, []string{"a", "b", "c", "a"}},
		{"Key", Limits{Key: 2}, 0, 0, []string{"a", "b", "c", "a", "b", "c"}},
		{"KeyCountsHeld", Limits{Key: 2}, 0, 2, []string{"b", "c", "b", "c"}},
		{"KeyOne", Limits{Key: 1}, 0, 0, []string{"a", "b", "c"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := New(Config{})
			add(t, m, "a", 10, 0, 0)
			add(t, m, "b", 10, 0, 0)
			add(t, m, "c", 10, 0, 0)
			// Runs of a already in flight: only their count matters to the
			// limits.
			m.inflight[keys.VariantMember("a")] = tc.held
			m.cfg.Limits = tc.limits
			m.EnvOther = tc.envOther
			got := servedKeys(m.Dequeue(6, 0))
			if tc.want == nil {
				require.Empty(t, got)
				return
			}
			require.Equal(t, tc.want, got)
		})
	}
}
