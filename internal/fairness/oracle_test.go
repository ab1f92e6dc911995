package fairness

import (
	"testing"
	"time"

	"pgregory.net/rapid"
)

// modelOracle draws a model configuration and returns an oracle on it.
func modelOracle(t *rapid.T) *Oracle {
	c := ModelConfig{
		WindowMultiplier: rapid.SampledFrom([]int{1, 2, 3}).Draw(t, "windowMultiplier"),
		IdleMaxEntries:   rapid.SampledFrom([]int{10000, 2}).Draw(t, "idleMax"),
		MaxAttempts:      3,
		Lease:            time.Minute,
	}
	return New(NewModelDriver(c), Config{Lease: c.Lease, MaxAttempts: c.MaxAttempts})
}

// checkModel runs the named check over random sequences on the model.
func checkModel(t *testing.T, name string) { checkModelGen(t, name, DefaultGen) }

// checkModelGen is checkModel with sequences drawn by g.
func checkModelGen(t *testing.T, name string, g GenConfig) {
	c, ok := CheckByName(name)
	if !ok {
		t.Fatalf("no check %q", name)
	}
	var cov Coverage
	var watches WatchCount
	rapid.Check(t, func(rt *rapid.T) {
		o := modelOracle(rt)
		if err := Drive(rt, o, g); err != nil {
			rt.Fatalf("driving the model: %v", err)
		}
		cov.Add(&o.H)
		if name == "lag" {
			watches.Add(LagWatches(&o.H))
		}
		if vs := c.Fn(&o.H); len(vs) > 0 {
			rt.Fatalf("%s", Report(&o.H, vs))
		}
	})
	t.Logf("model, check %s: %s", name, cov)
	if name == "lag" {
		t.Logf("model, check lag: %s", watches)
	}
}

// One test per guarantee, so that each can be run (and fail) on its own.

func TestModelNewcomer(t *testing.T) { t.Parallel(); checkModel(t, "newcomer") }
func TestModelLag(t *testing.T)      { t.Parallel(); checkModel(t, "lag") }

// TestModelLagWeights: the lag check over sequences that change a weight
// before a quarter of their steps (GenConfig.WeightBias).
func TestModelLagWeights(t *testing.T) {
	t.Parallel()
	g := DefaultGen
	g.WeightBias = 25
	checkModelGen(t, "lag", g)
}

// TestModelLagIdleWeights: as TestModelLagWeights, with most of those
// weight changes on a key that is parked or at its key limit
// (GenConfig.IdleBias): CheckLag's gated and parked watches.
func TestModelLagIdleWeights(t *testing.T) {
	t.Parallel()
	g := DefaultGen
	g.WeightBias, g.IdleBias = 25, 60
	checkModelGen(t, "lag", g)
}
func TestModelBatchInvariance(t *testing.T)  { t.Parallel(); checkModel(t, "batch") }
func TestModelReachability(t *testing.T)     { t.Parallel(); checkModel(t, "reachability") }
func TestModelWorkConservation(t *testing.T) { t.Parallel(); checkModel(t, "work") }
func TestModelExactlyOnce(t *testing.T)      { t.Parallel(); checkModel(t, "exactly-once") }
func TestModelClockMonotone(t *testing.T)    { t.Parallel(); checkModel(t, "clock") }

func TestModelNewcomerOrder(t *testing.T) { t.Parallel(); checkModel(t, "newcomer-order") }

// checkModelScenario runs a scripted scenario on the model and holds its
// history to every check.
func checkModelScenario(t *testing.T, name string) { runModelScenario(t, name) }

// runModelScenario is checkModelScenario; it returns the history.
func runModelScenario(t *testing.T, name string) *History {
	t.Parallel()
	for _, sc := range Scenarios {
		if sc.Name != name {
			continue
		}
		d := NewModelDriver(ModelConfig{MaxAttempts: 3, Lease: time.Minute})
		o := New(d, Config{Lease: time.Minute, MaxAttempts: 3})
		if err := sc.Run(o); err != nil {
			t.Fatalf("scenario %s: %v", name, err)
		}
		if err := o.Finish(); err != nil {
			t.Fatalf("finishing: %v", err)
		}
		if vs := Run(&o.H, Checks...); len(vs) > 0 {
			t.Fatalf("%s", Report(&o.H, vs))
		}
		if w := LagWatches(&o.H); w.Competing+w.Gated+w.Parked > 0 {
			t.Logf("model, scenario %s: %s", name, w)
		}
		return &o.H
	}
	t.Fatalf("no scenario %q", name)
	return nil
}

// The audit's states (docs/design.md section 8) on the model; the ones
// that need flag flips, a natural state TTL or thousands of keys run on
// the Lua only (runqueue/fairness_oracle_test.go).

func TestModelScenarioExpiredNewcomers(t *testing.T)  { checkModelScenario(t, "ExpiredNewcomers") }
func TestModelScenarioAdversarialNames(t *testing.T)  { checkModelScenario(t, "AdversarialNames") }
func TestModelScenarioGatedWindow(t *testing.T)       { checkModelScenario(t, "GatedWindow") }
func TestModelScenarioResetWhileWaiting(t *testing.T) { checkModelScenario(t, "ResetWhileWaiting") }
func TestModelScenarioExpiredChainSurvivor(t *testing.T) {
	checkModelScenario(t, "ExpiredChainSurvivor")
}
func TestModelScenarioWeightRaised(t *testing.T)   { checkModelScenario(t, "WeightRaised") }
func TestModelScenarioHeavyNewcomers(t *testing.T) { checkModelScenario(t, "HeavyNewcomers") }
func TestModelScenarioRoundedWeights(t *testing.T) { checkModelScenario(t, "RoundedWeights") }

// TestModelLongGen: every check over long sequences (LongGen: light keys'
// serves come round within a sequence), at most 20 of them (about 1.2 s
// each; -rapid.checks below 20 runs fewer).
func TestModelLongGen(t *testing.T) {
	t.Parallel()
	var cov Coverage
	cycles, runs := 0, 0
	rapid.Check(t, func(rt *rapid.T) {
		if runs++; runs > 20 {
			return // rapid has no per-test count; the rest pass trivially
		}
		o := modelOracle(rt)
		if err := Drive(rt, o, LongGen); err != nil {
			rt.Fatalf("driving the model: %v", err)
		}
		cov.Add(&o.H)
		cycles += LightCycles(&o.H)
		if vs := Run(&o.H, Checks...); len(vs) > 0 {
			rt.Fatalf("%s", Report(&o.H, vs))
		}
	})
	t.Logf("model, long sequences, every check: %s; %d whole cycles of keys of weight 0.004 or less", cov, cycles)
}

// TestModelHeavyNewcomerGen: the newcomer checks and the lag bound over
// sequences whose newcomers are often heavier than 1 (HeavyNewcomerGen).
func TestModelHeavyNewcomerGen(t *testing.T) {
	for _, name := range []string{"newcomer", "newcomer-order", "lag", "reachability"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			checkModelGen(t, name, HeavyNewcomerGen)
		})
	}
}
func TestModelScenarioWeightRaisedGated(t *testing.T) {
	if w := LagWatches(runModelScenario(t, "WeightRaisedGated")); w.Gated == 0 {
		t.Fatalf("no gated watch started: %s", w)
	}
}
func TestModelScenarioWeightRaisedParked(t *testing.T) {
	if w := LagWatches(runModelScenario(t, "WeightRaisedParked")); w.Parked == 0 {
		t.Fatalf("no parked watch started: %s", w)
	}
}
