package scenario

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// Verdict is one threshold of docs/design.md section 8, checked on a pair
// of runs.
type Verdict struct {
	Metric    string  `json:"metric"`
	Value     float64 `json:"value"`
	Off       float64 `json:"off"`
	Threshold string  `json:"threshold"`
	OK        bool    `json:"ok"`
}

// Case is a scenario and its thresholds.
type Case struct {
	Spec  Spec
	Check func(off, on *Result) []Verdict
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func keyN(prefix string, i int) string { return fmt.Sprintf("%s%02d", prefix, i) }

func atMost(metric string, v, off, limit float64) Verdict {
	return Verdict{Metric: metric, Value: v, Off: off, Threshold: fmt.Sprintf("<= %g", limit), OK: v >= 0 && v <= limit}
}

func atLeast(metric string, v, off, limit float64) Verdict {
	return Verdict{Metric: metric, Value: v, Off: off, Threshold: fmt.Sprintf(">= %g", limit), OK: v >= limit}
}

func equal(metric string, v, off float64) Verdict {
	return Verdict{Metric: metric, Value: v, Off: off, Threshold: fmt.Sprintf("== %g (flag off)", off), OK: v == off}
}

// conserved checks that every run enqueued was served exactly once.
func conserved(r *Result) Verdict {
	seen := map[string]bool{}
	dup := false
	for _, s := range r.Serves {
		if seen[s.ID] {
			dup = true
		}
		seen[s.ID] = true
	}
	ok := !dup && len(seen) == r.Enqueued
	return Verdict{Metric: "runs served once (" + r.Flag + ")", Value: float64(len(seen)), Off: float64(r.Enqueued),
		Threshold: "every run exactly once", OK: ok}
}

func lightKeys(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = keyN(prefix, i)
	}
	return out
}

// Suite returns the scenarios of docs/design.md section 8.
func Suite() []Case {
	hasPrefix := func(p string) func(string) bool { return func(k string) bool { return strings.HasPrefix(k, p) } }
	return append([]Case{
		{
			Spec: Spec{Name: "skew", EnvLimit: 1, Hold: 3, Light: lightKeys("light", 4),
				Setup: func(h *H) error {
					if err := h.Add("heavy", 120, func(int) time.Duration { return 0 }); err != nil {
						return err
					}
					for i := 0; i < 4; i++ {
						if err := h.Add(keyN("light", i), 10, func(k int) time.Duration { return ms(10000 + 4*i + k) }); err != nil {
							return err
						}
					}
					return nil
				}},
			Check: func(off, on *Result) []Verdict {
				return []Verdict{
					atMost("first light serve step", float64(on.FirstLightServeStep), float64(off.FirstLightServeStep), 4),
					atMost("every light key served by step", float64(on.AllLightFirstServeStep), float64(off.AllLightFirstServeStep), 16),
					atMost("light mean wait", on.LightMeanWait, off.LightMeanWait, 0.2*off.LightMeanWait),
					atLeast("Jain over contended serves", on.Jain, off.Jain, 0.99),
					equal("drain steps", float64(on.DrainSteps), float64(off.DrainSteps)),
					conserved(off), conserved(on),
				}
			},
		},
		{
			Spec: Spec{Name: "trickle", EnvLimit: 1, Hold: 3, Light: lightKeys("trickle", 2),
				Setup: func(h *H) error {
					if err := h.Add("bulk", 120, func(int) time.Duration { return 0 }); err != nil {
						return err
					}
					for i := 0; i < 2; i++ {
						if err := h.Add(keyN("trickle", i), 15, func(k int) time.Duration { return ms(10000 + 2*i + k) }); err != nil {
							return err
						}
					}
					return nil
				}},
			Check: func(off, on *Result) []Verdict {
				return []Verdict{
					atMost("first trickle serve step", float64(on.FirstLightServeStep), float64(off.FirstLightServeStep), 4),
					atMost("trickle mean wait", on.LightMeanWait, off.LightMeanWait, 0.2*off.LightMeanWait),
					conserved(off), conserved(on),
				}
			},
		},
		{
			Spec: Spec{Name: "sybil", EnvLimit: 25, Hold: 3, Light: []string{"light"},
				Setup: func(h *H) error {
					for i := 0; i < 20; i++ {
						if err := h.Add(keyN("att", i), 8, func(k int) time.Duration { return ms(20*i + k) }); err != nil {
							return err
						}
					}
					return h.Add("light", 10, func(k int) time.Duration { return ms(50000 + k) })
				}},
			Check: func(off, on *Result) []Verdict {
				return []Verdict{
					atMost("light first serve step", float64(on.FirstLightServeStep), float64(off.FirstLightServeStep), 2),
					conserved(off), conserved(on),
				}
			},
		},
		{
			Spec: Spec{Name: "many-keys", EnvLimit: 25, Hold: 3, Light: []string{"light"},
				Setup: func(h *H) error {
					for i := 0; i < 60; i++ {
						if err := h.Add(keyN("att", i), 8, func(int) time.Duration { return 0 }); err != nil {
							return err
						}
					}
					return h.Add("light", 10, func(k int) time.Duration { return ms(50000 + k) })
				}},
			Check: func(off, on *Result) []Verdict {
				return []Verdict{
					atMost("light first serve step", float64(on.FirstLightServeStep), float64(off.FirstLightServeStep), 9),
					atMost("drain steps", float64(on.DrainSteps), float64(off.DrainSteps), float64(off.DrainSteps)),
					conserved(off), conserved(on),
				}
			},
		},
		{
			Spec: Spec{Name: "balanced", EnvLimit: 4, Hold: 3,
				Setup: func(h *H) error {
					for i := 0; i < 4; i++ {
						if err := h.Add(keyN("key", i), 25, func(k int) time.Duration { return ms(4*k + i) }); err != nil {
							return err
						}
					}
					return nil
				}},
			Check: func(off, on *Result) []Verdict {
				var out []Verdict
				for i := 0; i < 4; i++ {
					k := keyN("key", i)
					o, n := off.KeyMeanWait[k], on.KeyMeanWait[k]
					out = append(out, Verdict{Metric: "mean wait " + k, Value: n, Off: o, Threshold: "within 5% of flag off",
						OK: math.Abs(n-o) <= 0.05*o})
				}
				return append(out, conserved(off), conserved(on))
			},
		},
		{
			Spec: Spec{Name: "heavy-idle", EnvLimit: 25, Hold: 3,
				Setup: func(h *H) error {
					return h.Add("heavy", 60, ms)
				}},
			Check: func(off, on *Result) []Verdict {
				return []Verdict{equal("drain steps", float64(on.DrainSteps), float64(off.DrainSteps)), conserved(off), conserved(on)}
			},
		},
		{
			Spec: Spec{Name: "stalled-newcomer", EnvLimit: 1, Hold: 0, Steps: 50,
				Setup: func(h *H) error {
					stall := h.Now().Add(time.Hour).Sub(h.T0)
					if err := h.Add("stalled", 1, func(int) time.Duration { return stall }); err != nil {
						return err
					}
					for i := 0; i < 3; i++ {
						if err := h.Add(keyN("inc", i), 40, ms); err != nil {
							return err
						}
					}
					return nil
				},
				BeforeStep: func(h *H, step int) error {
					if step != 30 {
						return nil
					}
					return h.Add("latecomer", 20, func(k int) time.Duration { return ms(5000 + k) })
				}},
			Check: func(off, on *Result) []Verdict {
				total := on.ServedBy(func(string) bool { return true }, 30, 50)
				late := on.ServedBy(func(k string) bool { return k == "latecomer" }, 30, 50)
				lateOff := off.ServedBy(func(k string) bool { return k == "latecomer" }, 30, 50)
				limit := math.Ceil(float64(total)/4) + 1
				return []Verdict{atMost("latecomer serves in steps 30..49", float64(late), float64(lateOff), limit)}
			},
		},
		{
			Spec: Spec{Name: "drain-and-return", EnvLimit: 20, MaxCount: 5, Hold: 0, Steps: 120,
				Setup: func(h *H) error {
					return h.Add("backlog", 400, ms)
				},
				BeforeStep: func(h *H, step int) error {
					for i := 0; i < 5; i++ {
						k := keyN("trickle", i)
						if h.Queued(k) == 0 {
							if err := h.Add(k, 1, func(int) time.Duration { return ms(100000 + step) }); err != nil {
								return err
							}
						}
					}
					return nil
				}},
			Check: func(off, on *Result) []Verdict {
				b := on.ServedBy(hasPrefix("backlog"), 0, 120)
				bo := off.ServedBy(hasPrefix("backlog"), 0, 120)
				return []Verdict{atLeast("backlog serves of 600", float64(b), float64(bo), 90)}
			},
		},
		{
			Spec: Spec{Name: "fresh-key-flood", EnvLimit: 20, MaxCount: 5, Hold: 0, Steps: 120,
				Setup: func(h *H) error {
					return h.Add("backlog", 400, ms)
				},
				BeforeStep: func(h *H, step int) error {
					for i := 0; i < 8; i++ {
						if err := h.Add(fmt.Sprintf("fresh-%03d-%d", step, i), 1, func(int) time.Duration { return ms(100000 + step) }); err != nil {
							return err
						}
					}
					return nil
				}},
			Check: func(off, on *Result) []Verdict {
				b := on.ServedBy(hasPrefix("backlog"), 0, 120)
				bo := off.ServedBy(hasPrefix("backlog"), 0, 120)
				return []Verdict{atLeast("backlog serves of 600", float64(b), float64(bo), 270)}
			},
		},
		{
			Spec: Spec{Name: "low-weight-anchor", MaxCount: 1, Hold: 0, Steps: 60,
				Weights: map[string]float64{"x": 0.01},
				Setup: func(h *H) error {
					if err := h.Add("x", 50, ms); err != nil {
						return err
					}
					return h.Add("y", 50, ms)
				},
				BeforeStep: func(h *H, step int) error {
					if step != 20 {
						return nil
					}
					return h.Add("n", 5, func(k int) time.Duration { return ms(200000 + k) })
				}},
			Check: func(off, on *Result) []Verdict {
				wait := func(r *Result) float64 {
					if f, ok := r.FirstServe["n"]; ok {
						return float64(f - 20 + 1)
					}
					return -1
				}
				return []Verdict{atMost("serves until the new key is served", wait(on), wait(off), 3)}
			},
		},
		{
			Spec: Spec{Name: "weights", EnvLimit: 10, Hold: 0,
				Weights: map[string]float64{"a": 1, "b": 3},
				Setup: func(h *H) error {
					if err := h.Add("a", 300, func(k int) time.Duration { return ms(2 * k) }); err != nil {
						return err
					}
					return h.Add("b", 300, func(k int) time.Duration { return ms(2*k + 1) })
				}},
			Check: func(off, on *Result) []Verdict {
				lag := on.MaxWeightedLag("a", 1, 300, "b", 3, 300)
				lagOff := off.MaxWeightedLag("a", 1, 300, "b", 3, 300)
				return []Verdict{
					atMost("max |a/1 - b/3| while both backlogged", lag, lagOff, 1+1.0/3),
					conserved(off), conserved(on),
				}
			},
		},
		{
			Spec: Spec{Name: "retry-storm", MaxCount: 10, Hold: 0, Steps: 1,
				Setup: func(h *H) error {
					later := h.Now().Add(time.Hour).Sub(h.T0)
					for i := 0; i < 200; i++ {
						if err := h.Add(fmt.Sprintf("storm%03d", i), 1, func(int) time.Duration { return later }); err != nil {
							return err
						}
					}
					return h.Add("zready", 1, func(int) time.Duration { return ms(500000) })
				}},
			Check: func(off, on *Result) []Verdict {
				f := func(r *Result) float64 {
					if s, ok := r.FirstServe["zready"]; ok {
						return float64(s)
					}
					return -1
				}
				return []Verdict{atMost("ready key first serve step", f(on), f(off), 0)}
			},
		},
		{
			// Eight keys at their limit hold the lowest tags; the owed key has
			// the next tag and the newest head, the old key the oldest head.
			Spec: Spec{Name: "gated-window", MaxCount: 2, KeyLimit: 1, Hold: 0, Steps: 1,
				Setup: func(h *H) error {
					tags := map[string]float64{"owed": 1, "old": 5}
					for i := 0; i < 8; i++ {
						if err := h.Add(keyN("block", i), 1, func(int) time.Duration { return ms(100 + i) }); err != nil {
							return err
						}
						tags[keyN("block", i)] = 0
					}
					if err := h.Hold(8); err != nil {
						return err
					}
					for i := 0; i < 8; i++ {
						if err := h.Add(keyN("block", i), 1, func(int) time.Duration { return ms(200 + i) }); err != nil {
							return err
						}
					}
					if err := h.Add("old", 1, func(int) time.Duration { return 0 }); err != nil {
						return err
					}
					if err := h.Add("owed", 1, func(int) time.Duration { return ms(1000) }); err != nil {
						return err
					}
					return h.SetTags(tags)
				}},
			Check: func(off, on *Result) []Verdict {
				first := func(r *Result) float64 {
					if len(r.Serves) > 0 && r.Serves[0].Key == "owed" {
						return 1
					}
					return 0
				}
				return []Verdict{{Metric: "owed key served first", Value: first(on), Off: first(off), Threshold: "== 1", OK: first(on) == 1}}
			},
		},
		{
			Spec: Spec{Name: "flag-flip", MaxCount: 5, Hold: 0, Flip: true, Light: keysFlip(),
				Setup: func(h *H) error {
					// Key by key: every run of key i is older than any of key
					// i+1, the shape age-order discovery alone cannot reach.
					for i := 0; i < 50; i++ {
						if err := h.Add(keyN("k", i), 10, func(k int) time.Duration { return ms(100*i + k) }); err != nil {
							return err
						}
					}
					return nil
				}},
			Check: func(off, on *Result) []Verdict {
				return []Verdict{
					atMost("calls until every key served", float64(on.AllLightFirstServeStep+1), float64(off.AllLightFirstServeStep+1), 11),
					conserved(off), conserved(on),
				}
			},
		},
		{
			Spec: Spec{Name: "mixed-deploy", MaxCount: 5, Hold: 1, Mixed: true, Light: keysFlip()[:20],
				Setup: func(h *H) error {
					for i := 0; i < 20; i++ {
						if err := h.Add(keyN("k", i), 6, func(k int) time.Duration { return ms(50*i + k) }); err != nil {
							return err
						}
					}
					return nil
				},
				BeforeStep: func(h *H, step int) error {
					if step < 10 {
						return h.Add(fmt.Sprintf("late%02d", step), 2, func(k int) time.Duration { return ms(300000 + k) })
					}
					return nil
				}},
			Check: func(off, on *Result) []Verdict {
				reach := 1.0
				for i := 0; i < 10; i++ {
					if _, ok := on.FirstServe[fmt.Sprintf("late%02d", i)]; !ok {
						reach = 0
					}
				}
				return []Verdict{
					conserved(off), conserved(on),
					{Metric: "every key reachable", Value: reach, Off: 1, Threshold: "== 1", OK: reach == 1 && on.AllLightFirstServeStep >= 0},
				}
			},
		},
	}, defectCases()...)
}

func keysFlip() []string { return lightKeys("k", 50) }
