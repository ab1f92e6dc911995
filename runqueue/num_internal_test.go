package runqueue

import (
	"context"
	"math"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
)

// TestNumReadsScores: lib/record's num reads every score a dequeue meets
// as the number ZADD stored, on Redis's Lua and on miniredis's gopher-lua
// (whose server prints some scores with an exponent, "1e+08"), and a
// missing one (ZSCORE's false) as nil. The scores: the regions of ckVtime
// (tags, the lane, the parked and gated offsets, the wide mark), ready
// scores in ms, a fraction a hand edit could leave, and the infinities.
func TestNumReadsScores(t *testing.T) {
	record, err := luaFS.ReadFile("lua/lib/record.lua")
	require.NoError(t, err)
	script := string(record) + `
local out = {}
for i, m in ipairs(ARGV) do
  local x = num(redis.call('ZSCORE', KEYS[1], m))
  if x == nil then out[i] = 'nil'
  elseif x == 1 / 0 then out[i] = 'inf'
  elseif x == -1 / 0 then out[i] = '-inf'
  else out[i] = string.format('%.17g', x) end
end
return out
`
	scores := []float64{0, 1, -1, 1e8, 123456789, 1764700000000, 1764700000000 - 9*30000, 0.5, -2.25,
		1 << 50, -(1 << 52), -(1 << 51) + 7, 1<<52 + 3, 1 << 51, 1<<53 - 1, -(1<<53 - 1),
		math.Inf(1), math.Inf(-1)}
	redistest.ForEachBackend(t, []redistest.Backend{
		{Name: "Mini", Client: redistest.Mini},
		{Name: "Real", Client: redistest.Real},
	}, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		key := redistest.Prefix(t) + ":num"
		t.Cleanup(func() { c.Del(context.Background(), key) })
		var zs []redis.Z
		members := []any{}
		for i, s := range scores {
			m := "m" + strconv.Itoa(i)
			zs = append(zs, redis.Z{Score: s, Member: m})
			members = append(members, m)
		}
		require.NoError(t, c.ZAdd(ctx, key, zs...).Err())
		members = append(members, "missing")
		got, err := c.Eval(ctx, script, []string{key}, members...).StringSlice()
		require.NoError(t, err)
		require.Len(t, got, len(scores)+1)
		for i, s := range scores {
			if math.IsInf(s, 1) || math.IsInf(s, -1) {
				want := "inf"
				if s < 0 {
					want = "-inf"
				}
				require.Equal(t, want, got[i], "score %v", s)
				continue
			}
			v, err := strconv.ParseFloat(got[i], 64)
			require.NoError(t, err, "score %v read as %q", s, got[i])
			require.Equal(t, s, v, "score %v", s)
		}
		require.Equal(t, "nil", got[len(scores)])
	})
}
