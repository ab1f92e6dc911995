package fairness

import (
	"testing"

	"pgregory.net/rapid"
)

// TestS25ModelLagBiased: CheckLag over histories of DriveS25 on the model.
func TestS25ModelLagBiased(t *testing.T) {
	t.Parallel()
	var watches WatchCount
	rapid.Check(t, func(rt *rapid.T) {
		o := modelOracle(rt)
		if err := DriveS25(rt, o); err != nil {
			rt.Fatalf("driving the model: %v", err)
		}
		watches.Add(LagWatches(&o.H))
		if vs := CheckLag(&o.H); len(vs) > 0 {
			rt.Fatalf("%s", Report(&o.H, vs))
		}
	})
	t.Logf("model, biased: %s", watches)
}
