package fairness

import "github.com/runqueue/runqueue/vtime"

// The calls of the model that changed while this package was written land
// here, and only here.

// setModelLimits changes the model's concurrency limits from its next call on.
func setModelLimits(m *vtime.Model, l vtime.Limits) error { m.SetLimits(l); return nil }

// expireModelState drops the model's scheduler state as a whole.
func expireModelState(m *vtime.Model) error { m.ExpireState(); return nil }

// modelV is the model's virtual clock V in serves at weight 1.
func modelV(m *vtime.Model) float64 { return m.V() }
