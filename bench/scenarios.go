package main

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/internal/scenario"
)

// ScenarioResult is one scenario on one flag state: scenario.Result (its
// JSON fields) plus wait percentiles.
type ScenarioResult struct {
	*scenario.Result
	// Wait percentiles in steps (a run's wait is its serve step) over every
	// served run, and over the light keys' runs (absent when the scenario
	// has no light keys).
	WaitP50      float64  `json:"wait_p50"`
	WaitP95      float64  `json:"wait_p95"`
	WaitP99      float64  `json:"wait_p99"`
	LightWaitP50 *float64 `json:"light_wait_p50,omitempty"`
	LightWaitP95 *float64 `json:"light_wait_p95,omitempty"`
	LightWaitP99 *float64 `json:"light_wait_p99,omitempty"`
	// Verdicts met / checked for the scenario (on the flag-on entry only:
	// a threshold compares the two arms).
	Met     int `json:"verdicts_met,omitempty"`
	Checked int `json:"verdicts_checked,omitempty"`

	light bool // the scenario names light keys
}

// VerdictRow is one threshold of docs/design.md section 8 on one scenario.
type VerdictRow struct {
	Scenario string `json:"scenario"`
	scenario.Verdict
}

// scenarioPair is the two arms of one scenario.
type scenarioPair struct {
	c       scenario.Case
	off, on *scenario.Result
}

// runnable drops the cases that cannot run on the backend (real-Redis-only
// scenarios on miniredis) and says why in the report's notes.
func runnable(cases []scenario.Case, b scenario.Backend, rep *Report) []scenario.Case {
	var out []scenario.Case
	for _, c := range cases {
		if why := c.Spec.SkipReason(b); why != "" {
			rep.Notes = append(rep.Notes, "scenario skipped: "+why+" (run with -redis)")
			continue
		}
		out = append(out, c)
	}
	return out
}

// runOne runs one arm of a scenario under prefix p. On miniredis a scenario
// that lets server time pass (Spec.StateTTL) gets a miniredis of its own to
// fast-forward, so that the scenarios running beside it keep their clock.
func runOne(ctx context.Context, c redis.UniversalClient, ks *keyspace, mini bool, spec scenario.Spec, on bool) (*scenario.Result, error) {
	if mini && spec.StateTTL > 0 {
		m, err := miniredis.Run()
		if err != nil {
			return nil, fmt.Errorf("starting miniredis: %w", err)
		}
		defer m.Close()
		own := redis.NewClient(&redis.Options{Addr: m.Addr()})
		defer func() { _ = own.Close() }()
		return scenario.RunOn(ctx, own, scenario.Backend{Mini: true, Elapse: m.FastForward}, "bench", on, spec)
	}
	p := ks.prefix()
	res, err := scenario.RunOn(ctx, c, scenario.Backend{Mini: mini}, p, on, spec)
	if err == nil {
		err = ks.cleanup(ctx, p)
	}
	return res, err
}

// selectCases returns the suite's cases named in names (all when empty).
func selectCases(names []string) ([]scenario.Case, error) {
	suite := scenario.Suite()
	if len(names) == 0 {
		return suite, nil
	}
	var out []scenario.Case
	for _, n := range names {
		i := slices.IndexFunc(suite, func(c scenario.Case) bool { return c.Spec.Name == n })
		if i < 0 {
			var have []string
			for _, c := range suite {
				have = append(have, c.Spec.Name)
			}
			return nil, fmt.Errorf("unknown scenario %q (have %s)", n, strings.Join(have, ", "))
		}
		out = append(out, suite[i])
	}
	return out, nil
}

// runScenarios runs each selected scenario with the flag off and on. The
// harness has no clock and no randomness, so the arms run in parallel (one
// prefix each) and give the same numbers as when run alone.
func runScenarios(ctx context.Context, c redis.UniversalClient, ks *keyspace, opts Options, rep *Report, prog *progress) error {
	cases, err := selectCases(opts.Scenarios)
	if err != nil {
		return err
	}
	mini := rep.Backend == "miniredis"
	cases = runnable(cases, scenario.Backend{Mini: mini}, rep)
	pairs := make([]scenarioPair, len(cases))
	type job struct {
		i  int
		on bool
	}
	jobs := make(chan job)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	total, finished := 2*len(cases), 0
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range max(1, runtime.GOMAXPROCS(0)) {
		wg.Go(func() {
			for j := range jobs {
				res, err := runOne(ctx, c, ks, mini, cases[j.i].Spec, j.on)
				mu.Lock()
				finished++
				prog.printf("scenarios %d/%d done: %s, flag %s", finished, total, cases[j.i].Spec.Name, flagName(j.on))
				switch {
				case err != nil && firstErr == nil:
					firstErr = fmt.Errorf("scenario %s (flag %s): %w", cases[j.i].Spec.Name, flagName(j.on), err)
					cancel()
				case j.on:
					pairs[j.i].on = res
				default:
					pairs[j.i].off = res
				}
				mu.Unlock()
			}
		})
	}
feed:
	for i := range cases {
		pairs[i].c = cases[i]
		for _, on := range []bool{false, true} {
			select {
			case jobs <- job{i, on}:
			case <-ctx.Done():
				break feed
			}
		}
	}
	close(jobs)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, p := range pairs {
		vs := p.c.Check(p.off, p.on)
		met := 0
		for _, v := range vs {
			rep.Verdicts = append(rep.Verdicts, VerdictRow{Scenario: p.c.Spec.Name, Verdict: v})
			if v.OK {
				met++
			}
		}
		off, on := newScenarioResult(p.c.Spec, p.off), newScenarioResult(p.c.Spec, p.on)
		on.Met, on.Checked = met, len(vs)
		rep.Scenarios = append(rep.Scenarios, off, on)
		if chart, ok := scenarioCharts[p.c.Spec.Name]; ok {
			svg, err := cumulativeChart(chart, p.off, p.on)
			if err != nil {
				return fmt.Errorf("chart of %s: %w", p.c.Spec.Name, err)
			}
			rep.charts = append(rep.charts, chartFile{name: p.c.Spec.Name + ".svg", title: chart.title, svg: svg})
		}
	}
	return nil
}

func flagName(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

func newScenarioResult(spec scenario.Spec, r *scenario.Result) ScenarioResult {
	light := map[string]bool{}
	for _, k := range spec.Light {
		light[k] = true
	}
	var all, lw []float64
	for _, s := range r.Serves {
		all = append(all, float64(s.Step))
		if light[s.Key] {
			lw = append(lw, float64(s.Step))
		}
	}
	out := ScenarioResult{Result: r, light: len(spec.Light) > 0}
	out.WaitP50, out.WaitP95, out.WaitP99 = percentile(all, 50), percentile(all, 95), percentile(all, 99)
	if len(lw) > 0 {
		p50, p95, p99 := percentile(lw, 50), percentile(lw, 95), percentile(lw, 99)
		out.LightWaitP50, out.LightWaitP95, out.LightWaitP99 = &p50, &p95, &p99
	}
	return out
}

// percentile is the nearest-rank percentile p of v (0 for none); it sorts v.
func percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	sort.Float64s(v)
	i := int(math.Ceil(p/100*float64(len(v)))) - 1
	return v[min(max(i, 0), len(v)-1)]
}
