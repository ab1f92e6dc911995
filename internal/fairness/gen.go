package fairness

import (
	"fmt"
	"slices"
	"time"

	"pgregory.net/rapid"
)

// AdversarialNames are concurrency keys that sort first or look special:
// the empty key (no key), "!" and "!!a" (sort before letters), "*" (the
// peer's wildcard).
var AdversarialNames = []string{"!", "!!a", "", "*"}

// GenConfig shapes the random operation sequences of Drive.
type GenConfig struct {
	MinOps, MaxOps int
	// Names are the long-lived keys a sequence draws from (1..all of
	// them); one-run keys ("u1", "u2", ...) are minted on top.
	Names []string
	// Weights are the weights SetWeight draws from.
	Weights []float64
	// Waves, when above 0, adds an operation that mints up to Waves one-run
	// keys at once (some with a TTL that lets them expire unserved).
	Waves int
	// WeightBias, when above 0, sets a long-lived key's weight before a
	// step in WeightBias percent of the steps, on top of the mix: keys
	// served at one weight then compete at another (CheckLag's
	// weight-change watch), which the default mix reaches seldom.
	WeightBias int
	// IdleBias, when above 0, draws the key of such a weight change, in
	// IdleBias percent of them, among the long-lived keys that are not
	// servable (parked, or at their key limit) when there is one: CheckLag
	// then follows a weight changed while the key is gated or parked.
	IdleBias int
	// ColdBurst, when above 0, adds before ColdBurst percent of the steps
	// a burst of delayed work over more keys than a call's promotion
	// reaches (ScanLimit: 30 at maxCount <= 10): 31..120 keys ("c1",
	// "c2", ..., the same pool across a sequence's bursts, so keys come
	// back) with 1..3 runs each due at the same time; half of the time
	// the ready work is served and acked first, so that the burst falls
	// due into an idle queue (a cold state: the first call cut short sets
	// the cold mark, docs/design.md section 6, Registration), otherwise
	// while other keys are being served. The clock then moves to the due
	// time, and a dequeue and a newcomer ("u<n>") may follow at once.
	ColdBurst int
	// MintWeightBias, when above 0, gives a one-run key, in MintWeightBias
	// percent of those minted, a weight drawn from MintWeights before its
	// run is enqueued: a fresh newcomer of its own weight (CheckNewcomer's
	// quantum, min(1, 1/w)).
	MintWeightBias int
	MintWeights    []float64
	// PreWeightBias, when above 0, gives each long-lived key of a sequence,
	// in PreWeightBias percent of them, a weight drawn from Weights before
	// the first step: keys that are heavy (or light) before they ever hold
	// a run.
	PreWeightBias int
}

// DefaultGen is the generator of the oracle tests.
var DefaultGen = GenConfig{
	MinOps: 10, MaxOps: 120,
	Names:   append([]string{"a", "b", "c", "d", "e", "f"}, AdversarialNames...),
	Weights: []float64{0.001, 0.01, 0.5, 1, 1, 1, 2, 3, 100, 1000},
	Waves:   12,
}

// HeavyNewcomerGen is DefaultGen with half of the one-run keys given a
// weight above 1 before their run (fresh newcomers of a quantum below a
// weight-1 serve), three quarters of the long-lived keys weighted before
// they hold a run, and long-lived keys' weights changed before 30% of the
// steps (heavy keys that drain and return; helper-195's generator), with
// two weights that are not whole milli-weights among those drawn (0.0014
// is held as 0.001, 2.0004 as 2).
var HeavyNewcomerGen = func() GenConfig {
	g := DefaultGen
	g.MintWeightBias, g.MintWeights = 50, []float64{1.5, 2, 4, 8, 1000}
	g.PreWeightBias = 75
	g.WeightBias = 30
	g.Weights = append(slices.Clone(DefaultGen.Weights), 0.0014, 2.0004)
	return g
}()

// LongGen is DefaultGen with sequences 10 to 25 times as long (1,500 to
// 3,000 steps: about 2,700 serves) and weights down to 0.001, 0.0014
// (held as 0.001) and 0.004: a serve of such a key costs 1,000 or 250
// weight-1 serves, so its serves come round within a sequence and the
// lag bound is judged over its whole cycles, which DefaultGen's sequences
// (at most 120 steps, a few hundred serves) never finish.
var LongGen = func() GenConfig {
	g := DefaultGen
	g.MinOps, g.MaxOps = 1500, 3000
	g.Weights = []float64{0.001, 0.0014, 0.004, 0.02, 0.5, 1, 1, 2, 7, 100, 1000}
	return g
}()

// OddWeightGen is HeavyNewcomerGen drawing only weights that are odd
// milli-weights, weights the scheduler rounds (half-way ones too) and
// weights a hair from 1, with weight changes before 40% of the steps
// (helper-198): every check reads a weight as the scheduler holds it.
var OddWeightGen = func() GenConfig {
	g := HeavyNewcomerGen
	g.Weights = []float64{0.0014, 0.0016, 0.0025, 0.0015, 0.003, 0.007, 0.9996, 1.0004, 1, 2.0004,
		333.333, 333.3335, 1000}
	g.MintWeights = []float64{1.0004, 2.0004, 333.3335, 0.0025}
	g.WeightBias = 40
	return g
}()

// LightCycles counts, in h, the serves of a key of milli-weight 4 or less
// (weight 0.004 or less, as the scheduler holds it) that came at least 200
// serves of other keys after its previous serve: whole cycles of a light
// key, which the lag bound judges only in long sequences.
func LightCycles(h *History) int {
	weight := map[string]float64{}
	last := map[string]int{}
	n, serves := 0, 0
	for _, e := range h.Events {
		switch e.Kind {
		case EvWeight:
			weight[e.Key] = e.W
			delete(last, e.Key)
		case EvServe:
			if w, ok := weight[e.Key]; ok && milliWeight(w) <= 4 {
				if at, ok := last[e.Key]; ok && serves-at > 200 {
					n++
				}
				last[e.Key] = serves
			}
			serves++
		}
	}
	return n
}

// Drive runs one random operation sequence on o and finishes it (drain,
// final sweep). Flag flips and state expiry are drawn only when the
// driver supports them.
func Drive(t *rapid.T, o *Oracle, g GenConfig) error {
	n := rapid.IntRange(1, len(g.Names)).Draw(t, "names")
	names := rapid.Permutation(g.Names).Draw(t, "order")[:n]
	var minted []string
	mint := 0
	steps := rapid.IntRange(g.MinOps, g.MaxOps).Draw(t, "ops")
	dur := func(label string, secs ...int) time.Duration {
		return time.Duration(rapid.SampledFrom(secs).Draw(t, label)) * time.Second
	}
	// Styles. autoAck: every run is acked right after its dequeue, which
	// keeps keys below their limits; otherwise runs stay held until an
	// ack, nack or lease recovery, which fills the key limits (gated keys).
	// sustained: keys topped up before every dequeue, so that they stay
	// backlogged for many calls (long waits show).
	for _, k := range names {
		if g.PreWeightBias > 0 && rapid.IntRange(0, 99).Draw(t, "preWeightBias") < g.PreWeightBias {
			if err := o.SetWeight(k, rapid.SampledFrom(g.Weights).Draw(t, "preWeight")); err != nil {
				return err
			}
		}
	}
	autoAck := rapid.Bool().Draw(t, "autoAck")
	sustained := names[:rapid.IntRange(0, min(3, len(names))).Draw(t, "sustained")]
	if rapid.Bool().Draw(t, "limitsFirst") {
		if err := o.SetLimits(Limits{Key: rapid.SampledFrom([]int{1, 2}).Draw(t, "firstKeyLimit")}); err != nil {
			return err
		}
	}
	dequeue := func() error {
		maxCount := rapid.IntRange(1, 10).Draw(t, "maxCount")
		for _, k := range sustained {
			for o.Ready(k) <= maxCount {
				if _, err := o.Enqueue(k, 0, 0, 0); err != nil {
					return err
				}
			}
		}
		served, err := o.Dequeue(maxCount)
		for _, s := range served {
			if autoAck && err == nil {
				err = o.Ack(s.ID)
			}
		}
		return err
	}
	burst := func() error {
		if rapid.Bool().Draw(t, "burstIdle") {
			// serve and ack what is ready (held runs stay held, delayed
			// ones delayed): the burst then falls due into an idle queue
			for c := 0; c < 200 && o.withReady > 0; c++ {
				served, err := o.Dequeue(10)
				for _, s := range served {
					if err == nil {
						err = o.Ack(s.ID)
					}
				}
				if err != nil {
					return err
				}
				if len(served) == 0 {
					break // (what is left is gated: not idle, a warm burst)
				}
			}
		}
		delay := dur("burstDelay", 1, 5, 20)
		runs := rapid.IntRange(1, 3).Draw(t, "burstRuns")
		for c := rapid.IntRange(31, 120).Draw(t, "burstKeys"); c > 0; c-- {
			for r := 0; r < runs; r++ {
				if _, err := o.Enqueue(fmt.Sprintf("c%d", c), 0, delay, 0); err != nil {
					return err
				}
			}
		}
		if err := o.Advance(delay); err != nil {
			return err
		}
		if rapid.Bool().Draw(t, "burstCall") {
			if err := dequeue(); err != nil {
				return err
			}
		}
		if rapid.Bool().Draw(t, "burstNewcomer") {
			mint++
			key := fmt.Sprintf("u%d", mint)
			minted = append(minted, key)
			if _, err := o.Enqueue(key, 0, 0, 0); err != nil {
				return err
			}
		}
		return nil
	}
	mintWeight := func(key string) error {
		if g.MintWeightBias == 0 || rapid.IntRange(0, 99).Draw(t, "mintWeightBias") >= g.MintWeightBias {
			return nil
		}
		return o.SetWeight(key, rapid.SampledFrom(g.MintWeights).Draw(t, "mintWeight"))
	}
	for i := 0; i < steps; i++ {
		if g.ColdBurst > 0 && rapid.IntRange(0, 99).Draw(t, "coldBurst") < g.ColdBurst {
			if err := burst(); err != nil {
				return err
			}
		}
		if g.WeightBias > 0 && rapid.IntRange(0, 99).Draw(t, "weightBias") < g.WeightBias {
			pool := names
			if g.IdleBias > 0 && rapid.IntRange(0, 99).Draw(t, "idleBias") < g.IdleBias {
				if idle := o.unservable(names); len(idle) > 0 {
					pool = idle
				}
			}
			if err := o.SetWeight(rapid.SampledFrom(pool).Draw(t, "biasKey"), rapid.SampledFrom(g.Weights).Draw(t, "biasWeight")); err != nil {
				return err
			}
		}
		var err error
		switch op := rapid.IntRange(0, 99).Draw(t, "op"); {
		case op < 14: // backlog on a long-lived key
			key := rapid.SampledFrom(names).Draw(t, "key")
			for c := rapid.IntRange(1, 8).Draw(t, "runs"); c > 0 && err == nil; c-- {
				_, err = o.Enqueue(key, rapid.SampledFrom([]int{0, 0, 0, 1, 9}).Draw(t, "priority"),
					dur("delay", 0, 0, 0, 5, 40), dur("ttl", 0, 0, 0, 20, 90))
			}
		case op < 20: // a one-run key appears (and may expire unserved)
			mint++
			key := fmt.Sprintf("u%d", mint)
			minted = append(minted, key)
			err = mintWeight(key)
			if err == nil {
				_, err = o.Enqueue(key, 0, dur("mintDelay", 0, 0, 0, 5), dur("mintTTL", 0, 0, 10, 30))
			}
		case op < 23 && g.Waves > 0:
			ttl := dur("waveTTL", 0, 0, 10)
			for c := rapid.IntRange(1, g.Waves).Draw(t, "wave"); c > 0 && err == nil; c-- {
				mint++
				key := fmt.Sprintf("u%d", mint)
				minted = append(minted, key)
				if err = mintWeight(key); err == nil {
					_, err = o.Enqueue(key, 0, 0, ttl)
				}
			}
		case op < 50:
			err = dequeue()
		case op < 58:
			if held := o.Held(); len(held) > 0 {
				for c := rapid.IntRange(1, 3).Draw(t, "acks"); c > 0 && len(held) > 0 && err == nil; c-- {
					id := rapid.SampledFrom(held).Draw(t, "ack")
					err = o.Ack(id)
					held = o.Held()
				}
			}
		case op < 63:
			if held := o.Held(); len(held) > 0 {
				err = o.Nack(rapid.SampledFrom(held).Draw(t, "nack"), dur("retry", 0, 0, 3, 30),
					rapid.IntRange(0, 7).Draw(t, "kill") == 0)
			}
		case op < 68:
			err = o.Advance(dur("advance", 1, 5, 20, 45, 180))
		case op < 71:
			err = o.RecoverLeases()
		case op < 75:
			err = o.SweepTTL()
		case op < 78:
			pool := names
			if len(minted) > 0 && rapid.Bool().Draw(t, "weightMinted") {
				pool = minted
			}
			err = o.SetWeight(rapid.SampledFrom(pool).Draw(t, "weightKey"), rapid.SampledFrom(g.Weights).Draw(t, "weight"))
		case op < 83:
			err = o.SetLimits(Limits{
				Env:   rapid.SampledFrom([]int{0, 0, 0, 3, 8}).Draw(t, "envLimit"),
				Queue: rapid.SampledFrom([]int{0, 0, 2, 5, 9}).Draw(t, "queueLimit"),
				Key:   rapid.SampledFrom([]int{0, 0, 1, 2}).Draw(t, "keyLimit"),
			})
		case op < 89:
			if o.CanFlip() {
				err = o.SetFlag(!o.FlagOn())
			} else {
				err = dequeue()
			}
		case op < 93: // an outage: no dequeue for minutes while the sweepers run
			for c := 0; c < 3 && err == nil; c++ {
				if err = o.Advance(2 * time.Minute); err == nil {
					err = o.SweepTTL()
				}
			}
		default:
			if o.CanExpire() {
				err = o.ExpireState()
			} else {
				err = o.Advance(dur("advance", 1, 5, 20, 45, 180))
			}
		}
		if err != nil {
			return err
		}
	}
	return o.Finish()
}

// Run checks h with checks and returns the violations.
func Run(h *History, checks ...Check) []Violation {
	var out []Violation
	for _, c := range checks {
		out = append(out, c.Fn(h)...)
	}
	return out
}

// DriveScale runs a long sequence on o that mints at least keys one-run
// keys in waves of 100..800 (some with a TTL that expires them unserved)
// next to backlogged long-lived keys, with dequeues of 1..10 acked at
// once, TTL sweeps, limit and weight changes, flag flips and state
// expiry when the driver has them; then finishes it.
func DriveScale(t *rapid.T, o *Oracle, keys int) error {
	names := append([]string{"a", "b", "c"}, AdversarialNames...)
	minted := 0
	for minted < keys {
		var err error
		for _, k := range names {
			if rapid.IntRange(0, 2).Draw(t, "topUp") == 0 {
				for c := rapid.IntRange(1, 6).Draw(t, "runs"); c > 0 && err == nil; c-- {
					_, err = o.Enqueue(k, 0, 0, 0)
				}
			}
		}
		ttl := time.Duration(rapid.SampledFrom([]int{0, 0, 5}).Draw(t, "waveTTL")) * time.Second
		for c := rapid.IntRange(100, 800).Draw(t, "wave"); c > 0 && err == nil; c-- {
			minted++
			_, err = o.Enqueue(fmt.Sprintf("u%d", minted), 0, 0, ttl)
		}
		for c := rapid.IntRange(1, 60).Draw(t, "calls"); c > 0 && err == nil; c-- {
			var served []Served
			served, err = o.Dequeue(rapid.IntRange(1, 10).Draw(t, "maxCount"))
			for _, s := range served {
				if err == nil {
					err = o.Ack(s.ID)
				}
			}
		}
		if err != nil {
			return err
		}
		switch rapid.IntRange(0, 9).Draw(t, "event") {
		case 0, 1:
			if err = o.Advance(10 * time.Second); err == nil {
				err = o.SweepTTL()
			}
		case 2:
			if o.CanFlip() {
				err = o.SetFlag(!o.FlagOn())
			}
		case 3:
			err = o.ExpireState()
		case 4:
			err = o.SetLimits(Limits{Queue: rapid.SampledFrom([]int{0, 5}).Draw(t, "queueLimit")})
		case 5:
			err = o.SetWeight(rapid.SampledFrom(names).Draw(t, "weightKey"),
				rapid.SampledFrom([]float64{0.5, 1, 2}).Draw(t, "weight"))
		}
		if err != nil {
			return err
		}
	}
	return o.Finish()
}

// unservable is the keys of names the oracle knows and holds not servable
// (parked, or at a limit).
func (o *Oracle) unservable(names []string) []string {
	var out []string
	for _, n := range names {
		if k := o.keys[n]; k != nil && !k.servable {
			out = append(out, n)
		}
	}
	return out
}
