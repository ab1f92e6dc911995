package runqueue

import (
	"context"

	"github.com/runqueue/runqueue/internal/schedfmt"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/vtime"
)

// Weight bounds for SetWeight.
const (
	MinWeight = 0.001
	MaxWeight = 1000
)

// SetWeight gives a concurrency key of a base queue a scheduler weight: with
// the fair scheduler on, a key of weight w gets w times the share of a key
// of weight 1 while both have work. It applies at the next serve, on every
// instance: a key that was served at a lower weight owes at most one serve
// at the new weight (its tag is capped at the scheduler's clock plus one
// serve), so a mistaken low weight, once corrected, does not hold the key
// back for the cost of its serves at the old one. The scheduler holds a
// weight to the nearest 0.001 (0.0014 is scheduled as 0.001, 2.0004 as 2);
// Weights lists the value set. Weights are configuration: they do not expire with the
// scheduler's state. At most Config.MaxWeightOverrides keys per queue may
// have one (ErrTooManyWeights beyond). Weight 1, the default, is no
// override: SetWeight of 1, or of any weight held as 1 (1 to the nearest
// 0.001, such as 1.0004 or 0.9996), is ClearWeight (Weights does not list
// the key, and it takes none of MaxWeightOverrides).
func (q *Queue) SetWeight(ctx context.Context, env, queue, key string, w float64) error {
	if !(w >= MinWeight && w <= MaxWeight) {
		return invalid("weight", "%v is outside %v..%v", w, MinWeight, MaxWeight)
	}
	if vtime.HeldAsDefault(w) {
		return q.ClearWeight(ctx, env, queue, key)
	}
	return q.setWeight(ctx, env, queue, key, schedfmt.FormatWeight(w))
}

// ClearWeight returns a key to the default weight 1.
func (q *Queue) ClearWeight(ctx context.Context, env, queue, key string) error {
	return q.setWeight(ctx, env, queue, key, "")
}

func (q *Queue) setWeight(ctx context.Context, env, queue, key, w string) error {
	if err := checkVariant(env, queue, key); err != nil {
		return err
	}
	qk := q.space.Env(env).Queue(queue)
	err := run(ctx, q.rdb, q.scripts.setweight, []string{qk.Weights(), qk.CkVtimeState(), qk.CkVtime()},
		qk.Variant(key).Member(), w, q.cfg.MaxWeightOverrides).Err()
	return scriptError(err, nil)
}

// Weights lists the weight overrides of a base queue by concurrency key.
func (q *Queue) Weights(ctx context.Context, env, queue string) (map[string]float64, error) {
	if err := checkQueue(env, queue); err != nil {
		return nil, err
	}
	qk := q.space.Env(env).Queue(queue)
	raw, err := q.rdb.HGetAll(ctx, qk.Weights()).Result()
	if err != nil {
		return nil, err
	}
	out := make(map[string]float64, len(raw))
	for m, v := range raw {
		key, err := keys.DecodeVariantMember(m)
		if err != nil {
			continue
		}
		if out[key], err = schedfmt.Weight(v); err != nil {
			delete(out, key)
		}
	}
	return out, nil
}
