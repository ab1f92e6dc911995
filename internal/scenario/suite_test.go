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

// TestScenarios runs every scenario of docs/design.md section 8 with the
// flag off and on, logs its numbers and asserts its thresholds, on miniredis
// and on a real Redis. Each scenario gets a miniredis of its own, which it
// may fast-forward (Backend.Elapse).
func TestScenarios(t *testing.T) {
	backends := []struct {
		name   string
		client func(testing.TB) (redis.UniversalClient, scenario.Backend)
	}{
		{"Mini", func(t testing.TB) (redis.UniversalClient, scenario.Backend) {
			m, c := redistest.MiniServer(t)
			return c, scenario.Backend{Mini: true, Elapse: m.FastForward}
		}},
		{"Real", func(t testing.TB) (redis.UniversalClient, scenario.Backend) {
			return redistest.Real(t), scenario.Backend{}
		}},
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			for _, c := range scenario.Suite() {
				t.Run(c.Spec.Name, func(t *testing.T) {
					cl, be := b.client(t)
					if why := c.Spec.SkipReason(be); why != "" {
						t.Skip(why)
					}
					ctx := context.Background()
					off, err := scenario.RunOn(ctx, cl, be, redistest.Prefix(t), false, c.Spec)
					require.NoError(t, err)
					on, err := scenario.RunOn(ctx, cl, be, redistest.Prefix(t), true, c.Spec)
					require.NoError(t, err)
					if on.FirstError != "" {
						t.Logf("%s: first failed call (flag on): %s", c.Spec.Name, on.FirstError)
					}
					for _, v := range c.Check(off, on) {
						t.Logf("%-18s %-40s on=%-9.4g off=%-9.4g %s", c.Spec.Name, v.Metric, v.Value, v.Off, v.Threshold)
						if !v.OK {
							t.Errorf("%s: %s = %v, want %s (flag off %v)", c.Spec.Name, v.Metric, v.Value, v.Threshold, v.Off)
						}
					}
				})
			}
		})
	}
}
