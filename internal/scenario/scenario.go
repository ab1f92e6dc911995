// Package scenario is the deterministic step harness of docs/design.md
// section 8: every run is enqueued with an explicit available_at on a fake
// clock, then each step is one dequeue call of one base queue followed by
// the acks of the runs whose hold elapsed. The fake clock moves only when a
// scenario says so (H.Advance, H.Elapse). There is no wall clock and no
// randomness, so a scenario gives the same numbers on every run and every
// backend; the one exception is H.Elapse on a real Redis, which sleeps so
// that the server's key TTLs run out (see Spec.StateTTL). The tests assert
// the thresholds; the bench prints the numbers.
package scenario

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/internal/schedfmt"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
	"github.com/runqueue/runqueue/vtime"
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
	// Until, when set, is asked at the end of every step: true ends the
	// scenario there, before Steps or the drain (the figure it measures is
	// known; the rest of the run would only cost time).
	Until func(h *H) bool
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

	// StateTTL, when set, is Config.StateTTL and lets the scenario pass
	// server time with H.Elapse. On a server that keeps the wall clock
	// (Backend.Elapse nil: a real Redis) the queue runs with a StateTTL of
	// RealStateTTL instead, and H.Elapse sleeps d scaled by RealStateTTL /
	// StateTTL, so the scheduler state ages in the same proportion.
	StateTTL time.Duration
	// WatchV samples the scheduler's clock V and whether any scheduler
	// state exists (both through Schedule) after Setup, at the end of every
	// step and after every H.Elapse and H.ExpireTTL. Result.Extra[ExtraVDrop]
	// is the largest decrease of V between two samples taken while state
	// existed.
	WatchV bool
	// CountErrors: a dequeue call that fails is counted
	// (Result.Extra[ExtraFailedCalls], Result.FirstError) and the scenario
	// goes on, instead of ending the run with the error.
	CountErrors bool
	// RealRedisOnly: the scenario shows a limit that only a real Redis
	// enforces; SkipReason reports it on miniredis.
	RealRedisOnly bool
}

// RealStateTTL is Config.StateTTL of a scenario with Spec.StateTTL set that
// runs on a real Redis (Backend.Elapse nil).
const RealStateTTL = 2 * time.Second

// Names of Result.Extra figures the harness records.
const (
	ExtraVDrop       = "V drop"
	ExtraFailedCalls = "failed calls"
)

// Backend tells the harness what it may do to the server besides running
// the queue. The zero value is a real Redis.
type Backend struct {
	// Mini is true for an embedded miniredis.
	Mini bool
	// Elapse moves the server's clock on by d, so that keys with a Redis
	// TTL age by d (miniredis's FastForward). nil: the server keeps the wall
	// clock, and H.Elapse sleeps (see Spec.StateTTL). A miniredis needs it
	// for a scenario with Spec.StateTTL set. A server shared by scenarios
	// that run at the same time must not be fast-forwarded: give such a
	// scenario a server of its own.
	Elapse func(d time.Duration)
}

// SkipReason is why spec cannot run on b, or "" when it can.
func (s *Spec) SkipReason(b Backend) string {
	if s.RealRedisOnly && b.Mini {
		return s.Name + " runs on a real Redis only: miniredis does not enforce the Lua limits it checks"
	}
	return ""
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
	// FirstError is the first failed dequeue call (Spec.CountErrors).
	FirstError string `json:"first_error,omitempty"`
	// Serves is the serve log in order.
	Serves []Serve `json:"-"`
	// Arrival is the order in which keys were first enqueued (0 first).
	Arrival map[string]int `json:"-"`
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
	backend  Backend
	on, off  *runqueue.Queue
	clock    *clock
	arm      bool  // flag-on arm
	offAdd   bool  // AddOff is enqueueing
	phase    *bool // SetFlag: the flag of the current phase (nil: none set)
	step     int
	queued   map[string]int // key -> queued runs
	ready    map[string]int // key -> queued runs available when enqueued
	added    map[string]int // key -> runs ever enqueued
	arrival  map[string]int // key -> order of its first enqueue
	ttl      map[string]ttlRun
	runKey   map[string]string
	nextID   int
	enqueued int
	res      *Result

	// WatchV state: the last sample's V while state existed; on a real
	// Redis also when it was taken and the state's lifetime left then.
	vPrev float64
	vHas  bool
	vDrop float64
	vWall time.Time
	vLeft time.Duration
}

// ttlRun is a queued run enqueued with a TTL.
type ttlRun struct {
	key      string
	deadline time.Time
	ready    bool
}

type clock struct{ t time.Time }

func (c *clock) Now() time.Time { return c.t }

// Now is the harness's time: fixed unless Advance or Elapse moves it.
func (h *H) Now() time.Time { return h.clock.t }

// SetFlag starts a phase: from now on, in the flag-on arm, the instance with
// the scheduler flag on (true) or off (false) enqueues, serves, acks and
// sweeps, whatever Flip and Mixed say. The flag-off arm keeps the flag off.
func (h *H) SetFlag(on bool) { h.phase = &on }

// enqueuer picks the instance that enqueues now.
func (h *H) enqueuer() *runqueue.Queue {
	if !h.arm || h.offAdd {
		return h.off
	}
	if h.phase != nil {
		return h.pick(*h.phase)
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
	if h.phase != nil {
		return h.pick(*h.phase)
	}
	if h.mixed() && h.step%2 == 1 {
		return h.off
	}
	return h.on
}

func (h *H) pick(on bool) *runqueue.Queue {
	if on {
		return h.on
	}
	return h.off
}

func (h *H) flip() bool  { return h.spec.Flip }
func (h *H) mixed() bool { return h.spec.Mixed }

// Add enqueues n runs of key, run k available at T0 + at(k).
func (h *H) Add(key string, n int, at func(k int) time.Duration) error {
	return h.AddTTL(key, n, 0, at)
}

// AddOff is Add through the flag-off instance in both arms, whatever Flip,
// Mixed and SetFlag say: a producer still on a flag-off build while the
// consumers run with the flag on.
func (h *H) AddOff(key string, n int, at func(k int) time.Duration) error {
	h.offAdd = true
	defer func() { h.offAdd = false }()
	return h.Add(key, n, at)
}

// AddTTL is Add with a TTL (0: none): a run not served within ttl of now
// expires at the next H.ExpireTTL after that.
func (h *H) AddTTL(key string, n int, ttl time.Duration, at func(k int) time.Duration) error {
	for k := 0; k < n; k++ {
		h.nextID++
		id := fmt.Sprintf("%s#%d", key, h.nextID)
		when := h.T0.Add(at(k))
		if _, err := h.enqueuer().Enqueue(h.Ctx, runqueue.EnqueueParams{
			Env: h.Env, Queue: h.Queue, Key: key, ID: id, AvailableAt: when, TTL: ttl,
		}); err != nil {
			return err
		}
		h.runKey[id] = key
		if _, ok := h.arrival[key]; !ok {
			h.arrival[key] = len(h.arrival)
		}
		h.added[key]++
		h.queued[key]++
		ready := !when.After(h.Now())
		if ready {
			h.ready[key]++
		}
		if ttl > 0 {
			h.ttl[id] = ttlRun{key: key, deadline: h.Now().Add(ttl), ready: ready}
		}
		h.enqueued++
	}
	return nil
}

// forget takes a run dequeued outside the measured steps off the books: it
// counts neither as a serve nor as an enqueued run.
func (h *H) forget(r *runqueue.Run) {
	h.queued[r.Key]--
	h.ready[r.Key]--
	h.enqueued--
	delete(h.ttl, r.ID)
}

// Hold dequeues up to n runs now and keeps them in flight for the whole
// scenario (they count neither as serves nor as enqueued runs).
func (h *H) Hold(n int) error {
	runs, err := h.server().Dequeue(h.Ctx, h.Env, h.Queue, n)
	for _, r := range runs {
		h.forget(r)
	}
	return err
}

// Consume dequeues up to n runs now, in calls of at most 1,000, and acks
// each at once: work done before the measured steps (they count neither as
// serves nor as enqueued runs). It returns how many runs it took.
func (h *H) Consume(n int) (int, error) {
	got := 0
	for got < n {
		runs, err := h.server().Dequeue(h.Ctx, h.Env, h.Queue, min(n-got, 1000))
		if err != nil {
			return got, err
		}
		if len(runs) == 0 {
			break
		}
		for _, r := range runs {
			h.forget(r)
			if err := h.server().Ack(h.Ctx, r); err != nil {
				return got, err
			}
		}
		got += len(runs)
	}
	return got, nil
}

// Advance moves the fake clock (what the queue sees as now) on by d. The
// server's clock does not move: keys with a Redis TTL do not age (Elapse).
func (h *H) Advance(d time.Duration) { h.clock.t = h.clock.t.Add(d) }

// Elapse lets d pass for the queue and for the server: the fake clock moves
// on by d, and keys with a Redis TTL (the scheduler's state) age by d, by
// Backend.Elapse or, on a real Redis, by sleeping d scaled by RealStateTTL /
// Spec.StateTTL. The scenario needs Spec.StateTTL.
func (h *H) Elapse(d time.Duration) error {
	if h.spec.StateTTL <= 0 {
		return fmt.Errorf("scenario %s: H.Elapse needs Spec.StateTTL", h.spec.Name)
	}
	h.Advance(d)
	if h.backend.Elapse != nil {
		h.backend.Elapse(d)
	} else {
		t := time.NewTimer(time.Duration(float64(d) * float64(RealStateTTL) / float64(h.spec.StateTTL)))
		select {
		case <-t.C:
		case <-h.Ctx.Done():
			t.Stop()
			return h.Ctx.Err()
		}
	}
	return h.watchV()
}

// ExpireTTL runs the TTL sweep of the queue's shard now, with the instance
// of the current phase, until nothing is due, and returns how many runs
// expired. Every run enqueued with a TTL that is due and still queued must
// expire: the expired runs leave the books (they count as neither serves
// nor enqueued), and the queue's depth must then equal the runs the books
// hold queued. (The sweep's own count can fall short: go-redis retries a
// pipeline that timed out, and the runs the first attempt expired are gone
// by the second.)
func (h *H) ExpireTTL() (int, error) {
	q := h.server()
	for {
		n, err := q.ExpireTTL(h.Ctx, q.ShardOf(h.Env), 100000)
		if err != nil {
			return 0, err
		}
		if n == 0 {
			break
		}
	}
	due := 0
	for id, t := range h.ttl {
		if t.deadline.After(h.Now()) {
			continue
		}
		due++
		h.queued[t.key]--
		if t.ready {
			h.ready[t.key]--
		}
		h.enqueued--
		delete(h.ttl, id)
	}
	st, err := q.QueueStats(h.Ctx, h.Env, h.Queue)
	if err != nil {
		return due, err
	}
	queued := 0
	for _, n := range h.queued {
		queued += n
	}
	if got := st.Ready + st.Delayed; got != int64(queued) {
		return due, fmt.Errorf("after the TTL sweep the queue holds %d runs, want %d (%d were due)", got, queued, due)
	}
	return due, h.watchV()
}

// watchV takes one sample of the scheduler's clock (Spec.WatchV). It reads
// through the public Schedule, so it does not depend on how the state is
// stored, and it changes nothing. State exists when V is not 0 or some key
// has a tag or a parked tag.
//
// On a real Redis the state expires by the server's wall clock, which
// runs on while the scenario's clock does not: a slow machine can outlive
// the state (RealStateTTL) between two samples, and the state then starts
// again, V at 0, unseen. Two samples compare only when the state provably
// lived from one to the other: less wall time passed between them than
// the state's lifetime left (PTTL) at the first; writes only lengthen it.
func (h *H) watchV() error {
	if !h.spec.WatchV {
		return nil
	}
	wall := time.Now()
	s, err := h.on.Schedule(h.Ctx, h.Env, h.Queue, 1)
	if err != nil {
		return err
	}
	exists := s.V != 0
	for _, k := range s.Keys {
		exists = exists || k.Registered || k.HasParked
	}
	if !exists {
		h.vHas = false
		return nil
	}
	if h.backend.Elapse == nil {
		if h.vHas && wall.Sub(h.vWall) >= h.vLeft {
			h.vHas = false // it may have expired and started again since
		}
		left, err := h.Raw.PTTL(h.Ctx, h.Keys.CkVtimeState()).Result()
		if err != nil {
			return err
		}
		switch {
		case left == -1: // no lifetime: it cannot expire
			left = time.Duration(math.MaxInt64)
		case left < 0: // gone since the read
			left = 0
		}
		h.vWall, h.vLeft = wall, left
	}
	if h.vHas && s.V < h.vPrev {
		h.vDrop = max(h.vDrop, h.vPrev-s.V)
	}
	h.vPrev, h.vHas = s.V, true
	return nil
}

// SetTags overwrites the scheduler tags (in serves at weight 1) of
// registered variants, in the flag-on arm only, to build a state that is
// slow to reach through serves. It writes the layout of the flag-on
// scripts (runqueue/lua/lib/sched_reg.lua): the member is the variant's seq
// code and member, in the competing or the gated region. A variant waiting
// in the newcomer lane leaves it to take its tag; the lane must then empty
// whole (a harness limit: it does not pick a new head).
func (h *H) SetTags(tags map[string]float64) error {
	if !h.arm {
		return nil
	}
	state := h.Keys.CkVtimeState()
	for k, s := range tags {
		vm := keys.VariantMember(k)
		reg, err := h.Raw.HGet(h.Ctx, state, vm).Result()
		if errors.Is(err, redis.Nil) {
			continue // not registered
		}
		if err != nil {
			return err
		}
		r, ok := schedfmt.ParseReg(reg)
		if !ok {
			return fmt.Errorf("scenario: malformed registration %q of %s", reg, k)
		}
		score := s * vtime.Unit
		if r.Gated {
			// A gated tag lives in the state hash (its score is its gating
			// number): rewrite it there, remainder kept.
			r.Tag = int64(score)
			if err := h.Raw.HSet(h.Ctx, state, vm, r.String()).Err(); err != nil {
				return err
			}
			continue
		}
		if r.Waiting {
			if err := h.Raw.ZRem(h.Ctx, h.Keys.CkVtime(), vm).Err(); err != nil {
				return err
			}
			r.Waiting = false
			if err := h.Raw.HSet(h.Ctx, state, vm, r.String(), schedfmt.FieldLaneHead, "").Err(); err != nil {
				return err
			}
		}
		if err := h.Raw.ZAdd(h.Ctx, h.Keys.CkVtime(), redis.Z{Score: score, Member: r.Code + vm}).Err(); err != nil {
			return err
		}
	}
	lane, err := h.Raw.ZCount(h.Ctx, h.Keys.CkVtime(), schedfmt.LaneMin, schedfmt.LaneEnd).Result()
	if err != nil {
		return err
	}
	if lh, _ := h.Raw.HGet(h.Ctx, state, schedfmt.FieldLaneHead).Result(); lane > 0 && lh == "" {
		return fmt.Errorf("scenario: SetTags took the lane's head out but %d newcomers still wait", lane)
	}
	return nil
}

// Queued is how many runs of key wait in the queue.
func (h *H) Queued(key string) int { return h.queued[key] }

// Enqueued is how many runs of key were ever enqueued.
func (h *H) Enqueued(key string) int { return h.added[key] }

// Served is how many runs the measured steps have served so far.
func (h *H) Served() int { return len(h.res.Serves) }

// Mark records a scenario-specific figure in Result.Extra.
func (h *H) Mark(name string, v float64) { h.res.Extra[name] = v }

// Step is the current step (-1 during Setup).
func (h *H) Step() int { return h.step }

// Run runs spec on client under prefix, with the scheduler flag on or off:
// RunOn with the zero Backend (a real Redis). A scenario that neither lets
// server time pass nor needs a real Redis runs the same on miniredis.
func Run(ctx context.Context, client redis.UniversalClient, prefix string, flagOn bool, spec Spec) (*Result, error) {
	return RunOn(ctx, client, Backend{}, prefix, flagOn, spec)
}

// RunOn is Run on a backend b.
func RunOn(ctx context.Context, client redis.UniversalClient, b Backend, prefix string, flagOn bool, spec Spec) (*Result, error) {
	if why := spec.SkipReason(b); why != "" {
		return nil, errors.New(why)
	}
	if spec.StateTTL > 0 && b.Mini && b.Elapse == nil {
		return nil, fmt.Errorf("scenario %s lets server time pass: on miniredis Backend.Elapse must fast-forward it", spec.Name)
	}
	if spec.MaxCount == 0 {
		spec.MaxCount = 10
	}
	if spec.MaxSteps == 0 {
		spec.MaxSteps = 5000
	}
	stateTTL := spec.StateTTL
	if stateTTL > 0 && b.Elapse == nil {
		stateTTL = RealStateTTL
	}
	clk := &clock{t: time.UnixMilli(1_900_000_000_000)}
	mk := func(on bool) (*runqueue.Queue, error) {
		return runqueue.New(ctx, client, &runqueue.Config{
			Prefix: prefix, Clock: clk, VtimeScheduling: on,
			EnvConcurrency: spec.EnvLimit, KeyConcurrency: spec.KeyLimit,
			MaxDequeueCount: 1000, StateTTL: stateTTL,
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
	res := &Result{Name: spec.Name, Flag: map[bool]string{true: "on", false: "off"}[flagOn],
		FirstLightServeStep: -1, AllLightFirstServeStep: -1, Extra: map[string]float64{}}
	h := &H{Ctx: ctx, T0: clk.t.Add(-time.Hour), Env: "env", Queue: "queue", Raw: client,
		spec: &spec, backend: b, on: on, off: off, clock: clk, arm: flagOn, step: -1,
		queued: map[string]int{}, ready: map[string]int{}, runKey: map[string]string{},
		added: map[string]int{}, arrival: map[string]int{}, ttl: map[string]ttlRun{}, res: res}
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
	if err := h.watchV(); err != nil {
		return nil, err
	}
	failed := 0
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
			if !spec.CountErrors {
				return nil, fmt.Errorf("step %d: %w", step, err)
			}
			if failed == 0 {
				res.FirstError = fmt.Sprintf("step %d: %v", step, err)
			}
			failed++
			runs = nil
		}
		for _, r := range runs {
			res.Serves = append(res.Serves, Serve{Step: step, Key: r.Key, ID: r.ID})
			delete(h.ttl, r.ID)
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
		if err := h.watchV(); err != nil {
			return nil, fmt.Errorf("step %d: %w", step, err)
		}
		if spec.Until != nil && spec.Until(h) {
			break
		}
	}
	if spec.WatchV {
		res.Extra[ExtraVDrop] = h.vDrop
	}
	if spec.CountErrors {
		res.Extra[ExtraFailedCalls] = float64(failed)
	}
	res.Arrival = h.arrival
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
