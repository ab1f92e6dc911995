package runqueue_test

import (
	"context"
	"math"
	"math/rand/v2"
	"os"
	"regexp"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/fairness"
	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/internal/schedfmt"
	"github.com/runqueue/runqueue/vtime"
)

// h198Weights: every weight SetWeight accepts that sits at or next to a
// rounding edge (k/1000, (k+0.5)/1000 and the doubles either side), for
// every milli-weight k below 20,000 and a sample above, plus random ones.
func h198Weights() []float64 {
	var ws []float64
	add := func(w float64) {
		if w >= 0.001 && w <= 1000 {
			ws = append(ws, w)
		}
	}
	edge := func(k int) {
		for _, x := range []float64{float64(k) / 1000, (float64(k) + 0.5) / 1000, float64(k)*0.001 + 0.0005} {
			add(x)
			add(math.Nextafter(x, 0))
			add(math.Nextafter(x, 2000))
		}
	}
	for k := 1; k < 20000; k++ {
		edge(k)
	}
	r := rand.New(rand.NewPCG(198, 1))
	for range 20000 {
		edge(r.IntN(1_000_000) + 1)
		add(0.001 + r.Float64()*999.999)
	}
	for _, w := range []float64{0.0014, 0.0015, 0.0016, 0.0025, 0.0035, 2.0004, 2.0005, 0.9995, 1.0005, 333.333, 333.3335, 999.9995} {
		add(w)
	}
	return ws
}

// TestH198MilliWeightLua: the scripts' sched_milli of a stored weight
// (schedfmt.FormatWeight) is vtime.MilliWeightOf of the weight set, for
// every value at a rounding edge, on miniredis and a real Redis: the
// oracle reads a weight as vtime does, so a mismatch would make its
// reading wrong.
func TestH198MilliWeightLua(t *testing.T) {
	src, err := os.ReadFile("lua/lib/sched_reg.lua")
	require.NoError(t, err)
	fn := regexp.MustCompile(`(?s)local function sched_milli\(w\).*?\nend\n`).Find(src)
	require.NotNil(t, fn)
	script := redis.NewScript(string(fn) + `
local out = {}
for i = 1, #ARGV do out[i] = sched_milli(ARGV[i]) end
return out`)
	ws := h198Weights()
	t.Logf("%d weights", len(ws))
	// vtime's w*1000+0.5 is compiled to one fused multiply-add on arm64
	// (and amd64 v3); the scripts' is two roundings: the same milli-weight.
	for _, w := range ws {
		x := float64(w * 1000) // (the conversion rounds: no fusion)
		require.Equal(t, math.Floor(x+0.5), math.Floor(math.FMA(w, 1000, 0.5)), "weight %v", w)
	}
	for _, b := range []struct {
		name string
		c    func(t *testing.T) redis.UniversalClient
	}{{"mini", func(t *testing.T) redis.UniversalClient { return redistest.Mini(t) }},
		{"real", func(t *testing.T) redis.UniversalClient { return redistest.Real(t) }}} {
		t.Run(b.name, func(t *testing.T) {
			c := b.c(t)
			ctx := context.Background()
			bad := 0
			for lo := 0; lo < len(ws); lo += 4000 {
				hi := min(lo+4000, len(ws))
				args := make([]any, 0, hi-lo)
				for _, w := range ws[lo:hi] {
					args = append(args, schedfmt.FormatWeight(w))
				}
				got, err := script.Run(ctx, c, []string{"h198"}, args...).Int64Slice()
				require.NoError(t, err)
				for i, w := range ws[lo:hi] {
					if want := vtime.MilliWeightOf(w); got[i] != want {
						bad++
						if bad <= 10 {
							t.Errorf("weight %s: Lua %d, vtime %d", schedfmt.FormatWeight(w), got[i], want)
						}
					}
				}
			}
			require.Zero(t, bad)
		})
	}
}

// TestH198FairnessOddWeights: the weight-reading checks over the Lua
// scheduler (miniredis and a real Redis) with only odd milli-weights,
// weights the scheduler rounds (0.0025 and 333.3335 half-way) and
// weights a hair from 1, changed before 40% of the steps.
func TestH198FairnessOddWeights(t *testing.T) {
	checkLuaGenAll(t, []string{"newcomer", "newcomer-order", "lag", "reachability"}, fairness.OddWeightGen)
}
