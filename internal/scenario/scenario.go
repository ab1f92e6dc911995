// Package scenario is the deterministic step harness of DESIGN section 8:
// every run is enqueued with an explicit available_at on a fixed fake clock,
// then each step is one dequeue call of one base queue followed by the acks
// of the runs whose hold elapsed. There is no wall clock and no randomness,
// so a scenario gives the same numbers on every run and every backend. The
// tests assert the thresholds; the bench prints the numbers.
package scenario

import (
	"context"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// Spec describes one scenario.
type Spec struct {
	Name     string
	EnvLimit int // env concurrency limit (0: none)
	KeyLimit int // per-key concurrency limit (0: none)
	MaxCount int // per dequeue call; default 10
	// Hold is how many steps a served run stays in flight: a run served at
	// step s is acked at the end of step s+Hold.
	Hold int
	// Steps, when > 0, runs exactly that many steps; otherwise the scenario
	// runs until every run is served (bounded by MaxSteps).
	Steps    int
	MaxSteps int // default 5000
	// Light names the keys whose waits are reported as light waits.
	Light []string
	// Setup enqueues the initial runs (before step 0).
	Setup func(h *H) error
	// BeforeStep, when set, runs before each step's dequeue (arrivals).
	BeforeStep func(h *H, step int) error
	// Flip: in the flag-on arm, runs are enqueued by a flag-off instance and
	// served by a flag-on one (turning the flag on over a backlog).
	Flip bool
	// Mixed: in the flag-on arm, a flag-off and a flag-on instance alternate
	// every call, enqueues included (a rolling deploy).
	Mixed bool
	// Weights set before Setup (applied with the flag on only).
	Weights map[string]float64
}

// Serve is one served run.
type Serve struct {
	Step int
	Key  string
	ID   string
}

// Result is what a scenario run measured.
type Result struct {
	Name string `json:"name"`
	Flag string `json:"flag"`
	// FirstLightServeStep is the first step at which a light key was served
	// (-1: never), AllLightFirstServeStep the step by which every light key
	// had been served once.
	FirstLightServeStep    int     `json:"first_light_serve_step"`
	AllLightFirstServeStep int     `json:"all_light_first_serve_step"`
	LightMeanWait          float64 `json:"light_mean_wait"`
	// Jain is Jain's index of the per-key serve counts over the steps in
	// which at least two keys had ready work (1 when there were none).
	Jain       float64 `json:"jain"`
	DrainSteps int     `json:"drain_steps"` // last step that served a run
	Served     int     `json:"served"`
	Enqueued   int     `json:"enqueued"`
	Steps      int     `json:"steps"`
	// KeyMeanWait is the mean serve step per key.
	KeyMeanWait map[string]float64 `json:"key_mean_wait"`
	// FirstServe is the first serve step per key.
	FirstServe map[string]int `json:"first_serve"`
	// Extra holds scenario-specific figures.
	Extra map[string]float64 `json:"extra,omitempty"`
	// Serves is the serve log in order.
	Serves []Serve `json:"-"`
}

// H is the harness a scenario's hooks drive.
type H struct {
	Ctx   context.Context
	T0    time.Time
	Env   string
	Queue string
	Keys  keys.Queue
	Raw   redis.UniversalClient

	spec     *Spec
	on, off  *runqueue.Queue
	clock    *clock
	arm      bool // flag-on arm
	step     int
	queued   map[string]int // key -> queued runs
	ready    map[string]int // key -> queued runs available at the fixed now
	runKey   map[string]string
	nextID   int
	enqueued int
}

type clock struct{ t time.Time }

func (c *clock) Now() time.Time { return c.t }

// Now is the harness's fixed time.
func (h *H) Now() time.Time { return h.clock.t }

// enqueuer picks the instance that enqueues now.
func (h *H) enqueuer() *runqueue.Queue {
	if !h.arm {
		return h.off
	}
	if h.step < 0 && h.flip() {
		return h.off
	}
	if h.mixed() && h.step%2 == 1 {
		return h.off
	}
	return h.on
}

func (h *H) server() *runqueue.Queue {
	if !h.arm {
		return h.off
	}
	if h.mixed() && h.step%2 == 1 {
		return h.off
	}
	return h.on
}

func (h *H) flip() bool  { return h.spec.Flip }
func (h *H) mixed() bool { return h.spec.Mixed }

// Add enqueues n runs of key, run k available at T0 + at(k).
func (h *H) Add(key string, n int, at func(k int) time.Duration) error {
	for k := 0; k < n; k++ {
		h.nextID++
		id := fmt.Sprintf("%s#%d", key, h.nextID)
		when := h.T0.Add(at(k))
		if _, err := h.enqueuer().Enqueue(h.Ctx, runqueue.EnqueueParams{
			Env: h.Env, Queue: h.Queue, Key: key, ID: id, AvailableAt: when,
		}); err != nil {
			return err
		}
		h.runKey[id] = key
		h.queued[key]++
		if !when.After(h.Now()) {
			h.ready[key]++
		}
		h.enqueued++
	}
	return nil
}

// Hold dequeues up to n runs now and keeps them in flight for the whole
// scenario (they count neither as serves nor as enqueued runs).
func (h *H) Hold(n int) error {
	runs, err := h.server().Dequeue(h.Ctx, h.Env, h.Queue, n)
	for _, r := range runs {
		h.queued[r.Key]--
		h.ready[r.Key]--
		h.enqueued--
	}
	return err
}

// SetTags overwrites scheduler tags of registered variants, in the flag-on
// arm only, to build a state that is slow to reach through serves.
func (h *H) SetTags(tags map[string]float64) error {
	if !h.arm {
		return nil
	}
	for k, s := range tags {
		if err := h.Raw.ZAddXX(h.Ctx, h.Keys.CkVtime(), redis.Z{Score: s, Member: keys.VariantMember(k)}).Err(); err != nil {
			return err
		}
	}
	return nil
}

// Queued is how many runs of key wait in the queue.
func (h *H) Queued(key string) int { return h.queued[key] }

// Step is the current step (-1 during Setup).
func (h *H) Step() int { return h.step }

// Run runs spec on client under prefix, with the scheduler flag on or off.
func Run(ctx context.Context, client redis.UniversalClient, prefix string, flagOn bool, spec Spec) (*Result, error) {
	if spec.MaxCount == 0 {
		spec.MaxCount = 10
	}
	if spec.MaxSteps == 0 {
		spec.MaxSteps = 5000
	}
	clk := &clock{t: time.UnixMilli(1_900_000_000_000)}
	mk := func(on bool) (*runqueue.Queue, error) {
		return runqueue.New(ctx, client, &runqueue.Config{
			Prefix: prefix, Clock: clk, VtimeScheduling: on,
			EnvConcurrency: spec.EnvLimit, KeyConcurrency: spec.KeyLimit,
			MaxDequeueCount: 1000,
		})
	}
	off, err := mk(false)
	if err != nil {
		return nil, err
	}
	defer off.Close()
	on, err := mk(true)
	if err != nil {
		return nil, err
	}
	defer on.Close()
	space, err := keys.NewSpace(prefix, off.Shards())
	if err != nil {
		return nil, err
	}
	h := &H{Ctx: ctx, T0: clk.t.Add(-time.Hour), Env: "env", Queue: "queue", Raw: client,
		spec: &spec, on: on, off: off, clock: clk, arm: flagOn, step: -1,
		queued: map[string]int{}, ready: map[string]int{}, runKey: map[string]string{}}
	h.Keys = space.Env(h.Env).Queue(h.Queue)
	if flagOn {
		for k, w := range spec.Weights {
			if err := on.SetWeight(ctx, h.Env, h.Queue, k, w); err != nil {
				return nil, err
			}
		}
	}
	if spec.Setup != nil {
		if err := spec.Setup(h); err != nil {
			return nil, err
		}
	}
	res := &Result{Name: spec.Name, Flag: map[bool]string{true: "on", false: "off"}[flagOn],
		FirstLightServeStep: -1, AllLightFirstServeStep: -1, Extra: map[string]float64{}}
	held := map[int][]*runqueue.Run{}
	contended := map[string]int{}
	for step := 0; ; step++ {
		if spec.Steps > 0 && step >= spec.Steps {
			break
		}
		if spec.Steps == 0 && (step >= spec.MaxSteps || (len(res.Serves) == h.enqueued && len(held) == 0)) {
			break
		}
		h.step = step
		if spec.BeforeStep != nil {
			if err := spec.BeforeStep(h, step); err != nil {
				return nil, err
			}
		}
		active := 0
		for _, n := range h.ready {
			if n > 0 {
				active++
			}
		}
		runs, err := h.server().Dequeue(ctx, h.Env, h.Queue, spec.MaxCount)
		if err != nil {
			return nil, fmt.Errorf("step %d: %w", step, err)
		}
		for _, r := range runs {
			res.Serves = append(res.Serves, Serve{Step: step, Key: r.Key, ID: r.ID})
			h.queued[r.Key]--
			h.ready[r.Key]--
			if active >= 2 {
				contended[r.Key]++
			}
		}
		if len(runs) > 0 {
			held[step+spec.Hold] = append(held[step+spec.Hold], runs...)
		}
		for _, r := range held[step] {
			if err := h.server().Ack(ctx, r); err != nil {
				return nil, fmt.Errorf("step %d ack: %w", step, err)
			}
		}
		delete(held, step)
		res.Steps = step + 1
	}
	res.Enqueued = h.enqueued
	res.Served = len(res.Serves)
	res.summarize(spec, contended)
	return res, nil
}

func (r *Result) summarize(spec Spec, contended map[string]int) {
	light := map[string]bool{}
	for _, k := range spec.Light {
		light[k] = true
	}
	r.FirstServe = map[string]int{}
	sum := map[string]float64{}
	cnt := map[string]int{}
	var lightSum float64
	var lightN int
	for _, s := range r.Serves {
		if _, ok := r.FirstServe[s.Key]; !ok {
			r.FirstServe[s.Key] = s.Step
		}
		sum[s.Key] += float64(s.Step)
		cnt[s.Key]++
		r.DrainSteps = s.Step
		if light[s.Key] {
			lightSum += float64(s.Step)
			lightN++
		}
	}
	r.KeyMeanWait = map[string]float64{}
	for k, s := range sum {
		r.KeyMeanWait[k] = s / float64(cnt[k])
	}
	if lightN > 0 {
		r.LightMeanWait = lightSum / float64(lightN)
	}
	for _, k := range spec.Light {
		f, ok := r.FirstServe[k]
		if !ok {
			r.AllLightFirstServeStep = -1
			break
		}
		if r.FirstLightServeStep < 0 || f < r.FirstLightServeStep {
			r.FirstLightServeStep = f
		}
		if f > r.AllLightFirstServeStep {
			r.AllLightFirstServeStep = f
		}
	}
	r.Jain = jain(contended)
}

// jain is Jain's fairness index of the values of m (1 for none).
func jain(m map[string]int) float64 {
	var s, s2 float64
	for _, v := range m {
		s += float64(v)
		s2 += float64(v) * float64(v)
	}
	if s2 == 0 {
		return 1
	}
	return s * s / (float64(len(m)) * s2)
}

// CumulativeServes returns, for each key, its cumulative serve count after
// each step 0..Steps-1 (for charts).
func (r *Result) CumulativeServes() map[string][]int {
	out := map[string][]int{}
	perStep := map[string]map[int]int{}
	for _, s := range r.Serves {
		if perStep[s.Key] == nil {
			perStep[s.Key] = map[int]int{}
		}
		perStep[s.Key][s.Step]++
	}
	for k, steps := range perStep {
		series := make([]int, r.Steps)
		c := 0
		for i := 0; i < r.Steps; i++ {
			c += steps[i]
			series[i] = c
		}
		out[k] = series
	}
	return out
}

// ServedBy counts serves of keys matching pred in steps [from, to).
func (r *Result) ServedBy(pred func(key string) bool, from, to int) int {
	n := 0
	for _, s := range r.Serves {
		if s.Step >= from && s.Step < to && pred(s.Key) {
			n++
		}
	}
	return n
}

// Keys returns the keys served, sorted.
func (r *Result) Keys() []string {
	var out []string
	for k := range r.FirstServe {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// MaxWeightedLag is the largest |served_a/w_a - served_b/w_b| over every
// prefix of the serve order while both keys are backlogged: it stops at the
// serve that takes the last of totalA runs of a or totalB runs of b.
func (r *Result) MaxWeightedLag(a string, wa float64, totalA int, b string, wb float64, totalB int) float64 {
	var na, nb, worst float64
	for _, s := range r.Serves {
		switch s.Key {
		case a:
			na++
		case b:
			nb++
		}
		worst = math.Max(worst, math.Abs(na/wa-nb/wb))
		if int(na) == totalA || int(nb) == totalB {
			break
		}
	}
	return worst
}
