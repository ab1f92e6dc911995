package runqueue_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/runqueue/runqueue/internal/fairness"
	"github.com/runqueue/runqueue/internal/redistest"
)

// The fairness oracle of internal/fairness on the Lua scripts: random
// operation sequences (flag flips and state expiry included) through
// runqueue's public API on miniredis and on a real Redis, every guarantee
// judged on the observed schedule alone. One test per guarantee, so that
// each runs (and fails) on its own; see internal/fairness for the exact
// statements.

// foMiniStateTTL is the scheduler state's TTL on miniredis, where the
// driver moves miniredis's clock with the fake one, so the state can run
// out on its own (and piece by piece, if it is not refreshed whole).
const foMiniStateTTL = 5 * time.Minute

// foSequences is how many random sequences a check runs per backend;
// RUNQUEUE_FAIRNESS_SEQUENCES raises it for a deeper search.
func foSequences() int {
	if n, err := strconv.Atoi(os.Getenv("RUNQUEUE_FAIRNESS_SEQUENCES")); err == nil && n > 0 {
		return n
	}
	return 15
}

type foBackend struct {
	name string
	open func(t testing.TB) (redis.UniversalClient, *miniredis.Miniredis)
}

var foBackends = []foBackend{
	{"Mini", func(t testing.TB) (redis.UniversalClient, *miniredis.Miniredis) {
		m, c := redistest.MiniServer(t)
		return c, m
	}},
	{"Real", func(t testing.TB) (redis.UniversalClient, *miniredis.Miniredis) { return redistest.Real(t), nil }},
}

func foPool(t *testing.T, b foBackend, wm int) (*fairness.LuaPool, bool) {
	c, mini := b.open(t)
	cfg := fairness.LuaConfig{Client: c, Mini: mini, Prefix: redistest.Prefix(t), Lease: time.Minute,
		MaxAttempts: 3, WindowMultiplier: wm}
	if mini != nil {
		cfg.StateTTL = foMiniStateTTL
	}
	p, err := fairness.NewLuaPool(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p, mini != nil
}

func foOracleOn(t require.TestingT, p *fairness.LuaPool, mini bool, vEvery int) *fairness.Oracle {
	d, err := p.NewDriver(context.Background())
	require.NoError(t, err)
	cfg := fairness.Config{Lease: time.Minute, MaxAttempts: 3, VEvery: vEvery}
	if mini {
		cfg.StateTTL = foMiniStateTTL
	}
	return fairness.New(d, cfg)
}

// checkLua runs foSequences random sequences per backend and holds each
// to the named check.
func checkLua(t *testing.T, name string) { checkLuaGen(t, name, fairness.DefaultGen) }

// checkLuaGen is checkLua with sequences drawn by g.
func checkLuaGen(t *testing.T, name string, g fairness.GenConfig) {
	checkLuaGenAll(t, []string{name}, g)
}

// checkLuaGenAll is checkLuaGen holding each sequence to every check of
// names (one drive per sequence for all of them).
func checkLuaGenAll(t *testing.T, names []string, g fairness.GenConfig) {
	checkLuaGenN(t, names, g, foSequences())
}

// checkLuaGenN is checkLuaGenAll with limit sequences per backend.
func checkLuaGenN(t *testing.T, names []string, g fairness.GenConfig, limit int) {
	// Parallel: each backend's pool is under a prefix of its own (miniredis
	// of its own for Mini), on a fake clock; nothing server-wide.
	t.Parallel()
	var checks []fairness.Check
	lag := false
	for _, name := range names {
		c, ok := fairness.CheckByName(name)
		require.True(t, ok, name)
		checks = append(checks, c)
		lag = lag || name == "lag"
	}
	name := strings.Join(names, ",")
	for _, b := range foBackends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			p, mini := foPool(t, b, 1)
			var cov fairness.Coverage
			var watches fairness.WatchCount
			runs, cycles := 0, 0
			rapid.Check(t, func(rt *rapid.T) {
				if runs++; runs > limit {
					return // rapid has no per-test count; the rest pass trivially
				}
				o := foOracleOn(rt, p, mini, 1)
				require.NoError(rt, fairness.Drive(rt, o, g))
				cov.Add(&o.H)
				cycles += fairness.LightCycles(&o.H)
				if lag {
					watches.Add(fairness.LagWatches(&o.H))
				}
				if vs := fairness.Run(&o.H, checks...); len(vs) > 0 {
					rt.Fatalf("%s", fairness.Report(&o.H, vs))
				}
			})
			t.Logf("Lua on %s, check %s: %s", b.name, name, cov)
			if cycles > 0 {
				t.Logf("Lua on %s: %d whole cycles of keys of weight 0.004 or less", b.name, cycles)
			}
			if lag {
				t.Logf("Lua on %s, check lag: %s", b.name, watches)
			}
		})
	}
}

func TestFairnessOracleNewcomer(t *testing.T)      { checkLua(t, "newcomer") }
func TestFairnessOracleNewcomerOrder(t *testing.T) { checkLua(t, "newcomer-order") }
func TestFairnessOracleLag(t *testing.T)           { checkLua(t, "lag") }

// TestFairnessOracleLagWeights: the lag check over sequences that change a
// weight before a quarter of their steps (fairness.GenConfig.WeightBias).
func TestFairnessOracleLagWeights(t *testing.T) {
	g := fairness.DefaultGen
	g.WeightBias = 25
	checkLuaGen(t, "lag", g)
}

// TestFairnessOracleLagIdleWeights: as TestFairnessOracleLagWeights, with
// most of those weight changes on a key that is parked or at its key limit
// (fairness.GenConfig.IdleBias): CheckLag's gated and parked watches.
func TestFairnessOracleLagIdleWeights(t *testing.T) {
	g := fairness.DefaultGen
	g.WeightBias, g.IdleBias = 25, 60
	checkLuaGen(t, "lag", g)
}
func TestFairnessOracleReachability(t *testing.T) { checkLua(t, "reachability") }

// TestFairnessOracleHeavyNewcomers: the newcomer checks, the lag bound and
// reachability over sequences whose newcomers are often heavier than 1
// (fairness.HeavyNewcomerGen: CheckNewcomer's quantum, min(1, 1/w)).
func TestFairnessOracleHeavyNewcomers(t *testing.T) {
	checkLuaGenAll(t, []string{"newcomer", "newcomer-order", "lag", "reachability"}, fairness.HeavyNewcomerGen)
}

// TestFairnessOracleColdBurst: sequences with bursts of delayed work over
// more keys than a call's promotion reaches (31..120 keys due together,
// fairness.GenConfig.ColdBurst), into an idle queue (a cold state: the
// cold mark, docs/design.md section 6, Registration) or while other keys
// are served, with newcomers minted right after; each sequence held to
// the newcomer bound and order, reachability, the lag bound, work
// conservation and exactly-once (guarantees 10, 5, 2, 6, 7).
func TestFairnessOracleColdBurst(t *testing.T) {
	g := fairness.DefaultGen
	g.ColdBurst = 4
	checkLuaGenAll(t, []string{"newcomer", "newcomer-order", "reachability", "lag", "work", "exactly-once"}, g)
}

// TestFairnessOracleLong: every check over long sequences
// (fairness.LongGen: 1,500 to 3,000 steps, weights down to 0.001, so a
// light key's serves come round within a sequence), a fifth as many as
// the other oracle tests (3 by default: 6 to 10 s each).
func TestFairnessOracleLong(t *testing.T) {
	var names []string
	for _, c := range fairness.Checks {
		names = append(names, c.Name)
	}
	checkLuaGenN(t, names, fairness.LongGen, max(1, foSequences()/5))
}
func TestFairnessOracleWorkConservation(t *testing.T) {
	checkLua(t, "work")
}
func TestFairnessOracleExactlyOnce(t *testing.T)   { checkLua(t, "exactly-once") }
func TestFairnessOracleClockMonotone(t *testing.T) { checkLua(t, "clock") }

// TestFairnessOracleScale: one long random sequence on a real Redis that
// mints 10,000+ one-run keys in waves (some expiring unserved) next to
// backlogged keys, with flips and state expiry, every check applied.
func TestFairnessOracleScale(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	p, mini := foPool(t, foBackends[1], 0)
	var cov fairness.Coverage
	var failed []string
	runs := 0
	rapid.Check(t, func(rt *rapid.T) {
		if runs++; runs > 1 {
			return
		}
		o := foOracleOn(rt, p, mini, 50)
		start := time.Now()
		require.NoError(rt, fairness.DriveScale(rt, o, 10000))
		cov.Add(&o.H)
		t.Logf("scale run: %d keys, %v", o.Keys(), time.Since(start))
		for _, c := range fairness.Checks {
			if vs := c.Fn(&o.H); len(vs) > 0 {
				failed = append(failed, fmt.Sprintf("%s: %d violations, first: %s", c.Name, len(vs), vs[0]))
			}
		}
	})
	t.Logf("Lua on Real, scale, every check: %s", cov)
	for _, f := range failed {
		t.Error(f)
	}
}

// checkLuaScenario runs a scripted scenario of internal/fairness on the
// backends it fits (natural state TTL: miniredis; thousands of keys: a
// real Redis) and holds its history to every check.
func checkLuaScenario(t *testing.T, name string) {
	t.Parallel() // as checkLuaGen: own prefix or own miniredis, fake clock
	var sc *fairness.Scenario
	for i := range fairness.Scenarios {
		if fairness.Scenarios[i].Name == name {
			sc = &fairness.Scenarios[i]
		}
	}
	require.NotNil(t, sc, name)
	for _, b := range foBackends {
		if (sc.NaturalTTL && b.name != "Mini") || (sc.Big && b.name != "Real") {
			continue
		}
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			p, mini := foPool(t, b, 0)
			vEvery := 1
			if sc.Big {
				vEvery = -1 // a read of V costs one round trip per key
			}
			o := foOracleOn(t, p, mini, vEvery)
			err := sc.Run(o)
			if err == nil {
				err = o.Finish()
			}
			t.Logf("Lua on %s, scenario %s: %d operations, %d calls, %d serves", b.name, name, o.H.Ops, o.H.Calls, o.H.Serves)
			if err != nil {
				t.Errorf("scenario %s stopped: %v", name, err)
			}
			if vs := fairness.Run(&o.H, fairness.Checks...); len(vs) > 0 {
				t.Fatalf("%s", fairness.Report(&o.H, vs))
			}
			w := fairness.LagWatches(&o.H)
			if w.Competing+w.Gated+w.Parked > 0 {
				t.Logf("Lua on %s, scenario %s: %s", b.name, name, w)
			}
			if (sc.Name == "WeightRaisedGated" && w.Gated == 0) || (sc.Name == "WeightRaisedParked" && w.Parked == 0) {
				t.Fatalf("scenario %s started no watch of its kind: %s", name, w)
			}
		})
	}
}

// The audit's states (docs/design.md section 8) as scripted sequences.

func TestFairnessScenarioExpiredNewcomers(t *testing.T) { checkLuaScenario(t, "ExpiredNewcomers") }
func TestFairnessScenarioAdversarialNames(t *testing.T) { checkLuaScenario(t, "AdversarialNames") }
func TestFairnessScenarioEqualCountsFlip(t *testing.T)  { checkLuaScenario(t, "EqualCountsFlip") }
func TestFairnessScenarioGatedWindow(t *testing.T)      { checkLuaScenario(t, "GatedWindow") }
func TestFairnessScenarioLaneAcrossFlip(t *testing.T)   { checkLuaScenario(t, "LaneAcrossFlip") }
func TestFairnessScenarioServedBeforeDiscovery(t *testing.T) {
	checkLuaScenario(t, "ServedBeforeDiscovery")
}
func TestFairnessScenarioResetWhileWaiting(t *testing.T) { checkLuaScenario(t, "ResetWhileWaiting") }
func TestFairnessScenarioOutagePastTTL(t *testing.T)     { checkLuaScenario(t, "OutagePastTTL") }
func TestFairnessScenarioStaleCleanup10k(t *testing.T)   { checkLuaScenario(t, "StaleCleanup10k") }
func TestFairnessScenarioExpiredChainSurvivor(t *testing.T) {
	checkLuaScenario(t, "ExpiredChainSurvivor")
}
func TestFairnessScenarioUnsaidRelease(t *testing.T) { checkLuaScenario(t, "UnsaidRelease") }
func TestFairnessScenarioUnsaidReleaseRegated(t *testing.T) {
	checkLuaScenario(t, "UnsaidReleaseRegated")
}
func TestFairnessScenarioWeightRaised(t *testing.T)   { checkLuaScenario(t, "WeightRaised") }
func TestFairnessScenarioHeavyNewcomers(t *testing.T) { checkLuaScenario(t, "HeavyNewcomers") }
func TestFairnessScenarioRoundedWeights(t *testing.T) { checkLuaScenario(t, "RoundedWeights") }
func TestFairnessScenarioWeightRaisedGated(t *testing.T) {
	checkLuaScenario(t, "WeightRaisedGated")
}
func TestFairnessScenarioWeightRaisedParked(t *testing.T) {
	checkLuaScenario(t, "WeightRaisedParked")
}
