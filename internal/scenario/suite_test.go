package scenario_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/internal/scenario"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// TestScenarios runs every scenario of DESIGN section 8 with the flag off
// and on, logs its numbers and asserts its thresholds, on miniredis and on
// a real Redis.
func TestScenarios(t *testing.T) {
	backends := []struct {
		name   string
		client func(testing.TB) redis.UniversalClient
	}{{"Mini", redistest.Mini}, {"Real", redistest.Real}}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			cl := b.client(t)
			for _, c := range scenario.Suite() {
				t.Run(c.Spec.Name, func(t *testing.T) {
					ctx := context.Background()
					off, err := scenario.Run(ctx, cl, redistest.Prefix(t), false, c.Spec)
					require.NoError(t, err)
					on, err := scenario.Run(ctx, cl, redistest.Prefix(t), true, c.Spec)
					require.NoError(t, err)
					for _, v := range c.Check(off, on) {
						t.Logf("%-18s %-40s on=%-9.4g off=%-9.4g %s", c.Spec.Name, v.Metric, v.Value, v.Off, v.Threshold)
						require.True(t, v.OK, "%s: %s = %v, want %s (flag off %v)", c.Spec.Name, v.Metric, v.Value, v.Threshold, v.Off)
					}
				})
			}
		})
	}
}
