package runqueue_test

// Review of 03a32c9 (integers printed with '%d' instead of the '%.17g'
// Redis gives a Lua number argument). Its first version printed every
// value reaching the helper with '%d', which changed what a hand-edited
// state stored: a shard token counter at or past 10^17, a key-inflight
// count that is not an integer or is out of range. num_arg now keeps
// '%.17g' for anything but an integer below 2^53 in magnitude; these tests
// pin the strings Redis made before.

import (
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

var intArgRealOnly = []backend{{Name: "Real", Client: redistest.Real}}

// intArgKey is the one key of the bundle's prefix whose name ends with
// suffix (":tokens", ":kin", ":held": keysUnder leaves tokens out).
func intArgKey(t *testing.T, b *testBundle, suffix string) string {
	t.Helper()
	ks, err := b.client.Keys(b.ctx, "*"+b.prefix+"*"+suffix).Result()
	require.NoError(t, err)
	require.Len(t, ks, 1, "keys ending %q: %v", suffix, ks)
	return ks[0]
}

// oldArg is what Redis 7.0 makes of a Lua number argument of redis.call
// ('%.17g'), i.e. what the scripts sent before 03a32c9.
func oldArg(t *testing.T, b *testBundle, x string) string {
	t.Helper()
	s, err := b.client.Eval(b.ctx, "return string.format('%.17g', tonumber(ARGV[1]))", nil, x).Text()
	require.NoError(t, err)
	return s
}

// TestReviewIntArgTokenPast1e17: the shard's token counter at 10^17 - 1
// (set by hand: a restore, a migration that moves tokens past those of
// another deployment). The next delivery's token is 10^17. Before, the
// held hash stored the Lua number as Redis prints it, "1e+17" (and an ack
// carrying the token the reply gave, 100000000000000000, answered
// lease_lost), and it still does: tokens past 2^53 are not exact anyway,
// and 10^17 deliveries are out of reach. Real Redis only: miniredis always
// printed integral numbers as digits.
func TestReviewIntArgTokenPast1e17(t *testing.T) {
	redistest.ForEachBackend(t, intArgRealOnly, func(t *testing.T, c redis.UniversalClient) {
		for _, on := range []bool{false, true} {
			b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = on })
			enqueue(t, b, runqueue.EnqueueParams{ID: "r0"})
			ackAll(t, b, dequeue(t, b, queueName, 1)) // creates the token counter
			tokens := intArgKey(t, b, ":tokens")
			require.NoError(t, b.client.Set(b.ctx, tokens, "99999999999999999", 0).Err())

			enqueue(t, b, runqueue.EnqueueParams{ID: "r1"})
			runs := dequeue(t, b, queueName, 1)
			require.Len(t, runs, 1)
			require.Equal(t, int64(1e17), runs[0].Token)
			held, err := b.client.HGetAll(b.ctx, intArgKey(t, b, ":held")).Result()
			require.NoError(t, err)
			require.Len(t, held, 1)
			var got string
			for _, v := range held {
				got = v
			}
			want := oldArg(t, b, "100000000000000000")
			require.Equal(t, "1e+17", want)
			assert.Equal(t, want, got, "flag on=%v: held token string changed (was Redis's %%.17g of the token)", on)
		}
	})
}

// TestReviewIntArgCorruptKeyInflight: a key-inflight count edited by hand
// to a value HINCRBY never writes. A dequeue that serves two variants reads
// the counts (HMGET) and writes count + taken with HSET; an ack of runs of
// two variants writes count - acked. They go as Redis printed the Lua
// numbers ('%.17g': "3.5", "1e+20"); with '%d' for every value they were
// truncated ("3") or, out of the range of a C long, LONG_MIN
// ("-9223372036854775808": a negative in-flight count, which HINCRBY then
// accepts and the key limit never reaches). "2.5" on both backends
// (miniredis printed 3.5 as "3.5" too); "1e20" on real Redis only
// (gopher-lua's tonumber refuses it).
func TestReviewIntArgCorruptKeyInflight(t *testing.T) {
	redistest.ForEachBackend(t, memoBackends, func(t *testing.T, c redis.UniversalClient) {
		for _, on := range []bool{false, true} {
			for _, tc := range []struct{ corrupt, old string }{{"2.5", "3.5"}, {"1e20", "1e+20"}} {
				corrupt := tc.corrupt
				if corrupt == "1e20" && strings.Contains(t.Name(), "Mini") {
					continue // gopher-lua's tonumber refuses "1e20": the count reads as 0 either way
				}
				b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = on })
				enqueue(t, b, runqueue.EnqueueParams{ID: "r0", Key: "k1"})
				r0 := dequeue(t, b, queueName, 1)
				require.Len(t, r0, 1)
				kin := intArgKey(t, b, ":kin")
				fields, err := b.client.HGetAll(b.ctx, kin).Result()
				require.NoError(t, err)
				require.Len(t, fields, 1)
				var k1 string
				for f := range fields {
					k1 = f
				}
				require.NoError(t, b.client.HSet(b.ctx, kin, k1, corrupt).Err())

				// Dequeue: two variants touched, counts read with HMGET and
				// written with HSET.
				enqueue(t, b, runqueue.EnqueueParams{ID: "r1", Key: "k1"})
				enqueue(t, b, runqueue.EnqueueParams{ID: "r2", Key: "k2"})
				runs := dequeue(t, b, queueName, 2)
				require.Len(t, runs, 2)
				want := tc.old // Lua number corrupt+1 as Redis printed it (%.17g)
				got, err := b.client.HGet(b.ctx, kin, k1).Result()
				require.NoError(t, err)
				assert.Equal(t, want, got, "flag on=%v, count %q: dequeue wrote count+1 differently", on, corrupt)
			}
		}
	})
}

// TestReviewIntArgCorruptKeyInflightAck: the ack side of the same state:
// an ack of runs of two variants (kin_release's HMGET path) writes count -
// acked; "2.5" - 1 went as "1.5", now "1".
func TestReviewIntArgCorruptKeyInflightAck(t *testing.T) {
	redistest.ForEachBackend(t, memoBackends, func(t *testing.T, c redis.UniversalClient) {
		for _, on := range []bool{false, true} {
			b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = on })
			enqueue(t, b, runqueue.EnqueueParams{ID: "r1", Key: "k1"})
			enqueue(t, b, runqueue.EnqueueParams{ID: "r2", Key: "k2"})
			runs := dequeue(t, b, queueName, 2)
			require.Len(t, runs, 2)
			kin := intArgKey(t, b, ":kin")
			k1 := "=k1" // variant member of key k1
			fields, err := b.client.HGetAll(b.ctx, kin).Result()
			require.NoError(t, err)
			require.Contains(t, fields, k1)
			require.NoError(t, b.client.HSet(b.ctx, kin, k1, "2.5").Err())
			_, err = b.q.AckMany(b.ctx, runs)
			require.NoError(t, err)
			got, err := b.client.HGet(b.ctx, kin, k1).Result()
			require.NoError(t, err)
			assert.Equal(t, "1.5", got, "flag on=%v: ack wrote count-1 differently", on)
		}
	})
}

// TestReviewIntArgIncludes: every assembled script that calls num_arg or
// sched_fmt defines it above its first use (a use before the definition
// would read an undeclared global, which Redis refuses at run time).
func TestReviewIntArgIncludes(t *testing.T) {
	for _, get := range []func() (map[string]string, error){runqueue.FlagOffScripts, runqueue.FlagOnScripts} {
		srcs, err := get()
		require.NoError(t, err)
		for name, src := range srcs {
			for _, fn := range []string{"num_arg", "sched_fmt"} {
				def := strings.Index(src, "local function "+fn+"(")
				use := -1
				for off := 0; ; {
					i := strings.Index(src[off:], fn+"(")
					if i < 0 {
						break
					}
					i += off
					off = i + 1
					if strings.HasSuffix(src[:i], "local function ") {
						continue
					}
					line := src[strings.LastIndex(src[:i], "\n")+1 : i]
					if strings.Contains(line, "--") {
						continue
					}
					use = i
					break
				}
				if use < 0 {
					continue
				}
				require.True(t, def >= 0 && def < use, "%s: %s used at %d, defined at %d", name, fn, use, def)
			}
		}
	}
}
