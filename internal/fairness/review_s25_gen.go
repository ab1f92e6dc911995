package fairness

import (
	"fmt"
	"time"

	"pgregory.net/rapid"
)

// Review 25: CheckLag's gated and parked weight-change watches, on the
// model, by a driver biased toward the states they follow: few keys, key
// limits that go down and back up between calls, runs held, weight
// changes (to the same weight too) on keys at their limit or drained,
// TTL expiry of gated keys, nacks with backoff, lease recovery, waves of
// newcomers ahead of a returning key, priorities; flag flips (acks with
// the flag off: a gated key's slot freed without a word) and state expiry
// when the driver has them.
func DriveS25(t *rapid.T, o *Oracle) error {
	names := []string{"a", "b", "c", "d"}[:rapid.IntRange(2, 4).Draw(t, "names")]
	weights := []float64{0.001, 0.5, 1, 1, 3, 1000}
	mint := 0
	steps := rapid.IntRange(20, 150).Draw(t, "steps")
	if err := o.SetLimits(Limits{Key: rapid.SampledFrom([]int{1, 2}).Draw(t, "firstKeyLimit")}); err != nil {
		return err
	}
	var err error
	for i := 0; i < steps && err == nil; i++ {
		switch op := rapid.IntRange(0, 99).Draw(t, "op"); {
		case op < 15:
			key := rapid.SampledFrom(names).Draw(t, "key")
			for c := rapid.IntRange(1, 4).Draw(t, "runs"); c > 0 && err == nil; c-- {
				_, err = o.Enqueue(key, rapid.SampledFrom([]int{0, 0, 1, 9}).Draw(t, "priority"),
					time.Duration(rapid.SampledFrom([]int{0, 0, 0, 5}).Draw(t, "delay"))*time.Second,
					time.Duration(rapid.SampledFrom([]int{0, 0, 10, 30}).Draw(t, "ttl"))*time.Second)
			}
		case op < 20: // a wave of newcomers
			for c := rapid.IntRange(1, 6).Draw(t, "wave"); c > 0 && err == nil; c-- {
				mint++
				_, err = o.Enqueue(fmt.Sprintf("u%d", mint), 0, 0,
					time.Duration(rapid.SampledFrom([]int{0, 10}).Draw(t, "waveTTL"))*time.Second)
			}
		case op < 45:
			var served []Served
			served, err = o.Dequeue(rapid.IntRange(1, 6).Draw(t, "maxCount"))
			for _, s := range served {
				if err == nil && rapid.IntRange(0, 2).Draw(t, "ackNow") == 0 {
					err = o.Ack(s.ID)
				}
			}
		case op < 53:
			if held := o.Held(); len(held) > 0 {
				err = o.Ack(rapid.SampledFrom(held).Draw(t, "ack"))
			}
		case op < 58:
			if held := o.Held(); len(held) > 0 {
				err = o.Nack(rapid.SampledFrom(held).Draw(t, "nack"),
					time.Duration(rapid.SampledFrom([]int{0, 0, 3, 30}).Draw(t, "retry"))*time.Second,
					rapid.IntRange(0, 7).Draw(t, "kill") == 0)
			}
		case op < 75: // a weight change, mostly of a key that is not servable
			pool := o.unservable(names)
			if len(pool) == 0 || rapid.IntRange(0, 3).Draw(t, "anyKey") == 0 {
				pool = names
			}
			key := rapid.SampledFrom(pool).Draw(t, "weightKey")
			w := rapid.SampledFrom(weights).Draw(t, "weight")
			if k := o.keys[key]; k != nil && rapid.IntRange(0, 4).Draw(t, "sameWeight") == 0 {
				w = k.weight
			}
			err = o.SetWeight(key, w)
		case op < 83: // key limit down and back up, with no call in between
			l := rapid.SampledFrom([]int{0, 1, 2, 3}).Draw(t, "keyLimit")
			if err = o.SetLimits(Limits{Key: l}); err == nil && rapid.Bool().Draw(t, "back") {
				err = o.SetLimits(Limits{Key: rapid.SampledFrom([]int{0, 1, 2, 3}).Draw(t, "keyLimit2"),
					Queue: rapid.SampledFrom([]int{0, 0, 3}).Draw(t, "queueLimit")})
			}
		case op < 88:
			err = o.Advance(time.Duration(rapid.SampledFrom([]int{1, 5, 20, 45}).Draw(t, "advance")) * time.Second)
		case op < 92:
			err = o.SweepTTL()
		case op < 95:
			err = o.RecoverLeases()
		case op < 97 && o.CanFlip():
			err = o.SetFlag(!o.FlagOn())
		default:
			if o.CanExpire() && rapid.IntRange(0, 3).Draw(t, "expire") == 0 {
				err = o.ExpireState()
			} else {
				for _, k := range names {
					if err == nil && o.Ready(k) < 3 {
						_, err = o.Enqueue(k, 0, 0, 0)
					}
				}
			}
		}
	}
	if err != nil {
		return err
	}
	return o.Finish()
}
