package runqueue_test

// Review of 8fbaf0f (numbers read by arithmetic, x + 0, instead of
// tonumber). On Redis 7.0's Lua 5.1 both go through luaO_str2d (strtod, hex
// by strtoul), so a string reads the same either way and only a value that
// is not a number (false, nil, "") changes, from nil to a script error; no
// caller gives one (num guards false/nil, the Go client writes every one of
// these arguments with strconv: decimal, no leading zero). On miniredis's
// gopher-lua, arithmetic parses with ParseInt(s, 0) then ParseFloat while
// tonumber used ParseInt(s, 10) or ParseFloat when s has a "."; the two
// differ on strings with a leading 0 ("010": 8 against 10), "0b"/"0o",
// underscores, exponents without a "." and "inf"/"-inf". The only ones a
// script meets are scores miniredis prints: "1e+08" (old num's fallback
// handled it), "inf"/"-inf" and integral scores of 2^63 or more, which
// miniredis prints as digits ("10000000000000000000"): old num read those
// as nil, new num as the number Redis's Lua reads. No script stores such
// a score (a hand edit can). These tests pin the reading at its edges.

import (
	"math"
	"math/rand"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

var numbersBackends = []backend{
	{Name: "Mini", Client: redistest.Mini},
	{Name: "Real", Client: redistest.Real},
}

// numbersOldNum is lib/record's num before 8fbaf0f.
const numbersOldNum = `
local function old_num(s)
  local n = tonumber(s)
  if n == nil and s then
    n = tonumber((string.gsub(string.gsub(s, 'e%+', 'e'), '^(-?%d+)e', '%1.0e')))
  end
  return n
end
`

// TestReviewNumbersNumEveryScore: num reads every score ZSCORE and ZRANGE
// WITHSCORES give (random doubles over the whole range, subnormals, the
// largest double, -0, integers about 2^53 and 2^63, fractions) as the
// double the server holds (what go-redis parses from ZSCORE), and as the
// old num did for every finite score (on miniredis, below 2^63). The infinities read as themselves
// on both backends (old num: nil on miniredis).
func TestReviewNumbersNumEveryScore(t *testing.T) {
	record, err := os.ReadFile("lua/lib/record.lua")
	require.NoError(t, err)
	script := string(record) + numbersOldNum + `
local function show(x)
  if x == nil then return 'nil' end
  if x == 1 / 0 then return 'inf' end
  if x == -1 / 0 then return '-inf' end
  if x == 0 and 1 / x < 0 then return '-0' end
  return string.format('%.17g', x)
end
local out = {}
local raw = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #raw, 2 do
  local z = redis.call('ZSCORE', KEYS[1], raw[i])
  out[#out + 1] = { raw[i], raw[i + 1], show(num(z)), show(num(raw[i + 1])), show(old_num(z)) }
end
out[#out + 1] = { 'missing', '', show(num(redis.call('ZSCORE', KEYS[1], 'missing'))), show(num(nil)), '' }
return out
`
	r := rand.New(rand.NewSource(8))
	scores := []float64{0, math.Copysign(0, -1), 5e-324, -5e-324, math.SmallestNonzeroFloat64 * 3,
		math.MaxFloat64, -math.MaxFloat64, 1e8, -1e8, 1e21, 1e22, 1e-7, 0.1, 1.0 / 3,
		1<<53 - 1, 1 << 53, 1<<53 + 2, -(1 << 53), 1 << 62, 1 << 63, -(1 << 63), 1e19,
		253402300799999, -253402300799999 - 9*30000, 1764700000000, 8, 10, 64,
		// ckVtime's regions (lib/sched_reg): idle, the lane, the wide mark, gated
		-(1 << 52), -(1 << 52) + 12345, -(1 << 51), -(1 << 51) + 7, 1 << 51, 1 << 52, 1<<52 + 3,
		math.Inf(1), math.Inf(-1)}
	for range 300 {
		var x float64
		switch r.Intn(4) {
		case 0: // any finite double
			for x = math.Float64frombits(r.Uint64()); math.IsNaN(x) || math.IsInf(x, 0); {
				x = math.Float64frombits(r.Uint64())
			}
		case 1: // a time in ms, minus a priority offset
			x = float64(r.Int63n(253402300799999) - int64(r.Intn(10))*int64(r.Intn(1e9)))
		case 2: // a scheduler tag region
			x = float64(r.Int63n(1 << 52))
		default: // a fraction
			x = (r.Float64() - 0.5) * math.Pow(10, float64(r.Intn(40)-20))
		}
		scores = append(scores, x)
	}
	redistest.ForEachBackend(t, numbersBackends, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, nil)
		key := "{" + b.prefix + "}:review-num"
		t.Cleanup(func() { c.Del(b.ctx, key) })
		zs := make([]redis.Z, len(scores))
		for i, s := range scores {
			zs[i] = redis.Z{Score: s, Member: "m" + strconv.Itoa(i)}
		}
		require.NoError(t, c.ZAdd(b.ctx, key, zs...).Err())
		res, err := c.Eval(b.ctx, script, []string{key}).Slice()
		require.NoError(t, err)
		require.Len(t, res, len(scores)+1)
		mini, diffs := strings.HasSuffix(t.Name(), "/Mini"), 0
		for _, row := range res[:len(scores)] {
			f := row.([]any)
			member, printed := f[0].(string), f[1].(string)
			got, fromRange, old := f[2].(string), f[3].(string), f[4].(string)
			want, err := c.ZScore(b.ctx, key, member).Result()
			require.NoError(t, err)
			require.Equal(t, got, fromRange, "score %q: ZSCORE and ZRANGE read differently", printed)
			switch {
			case math.IsInf(want, 1):
				require.Equal(t, "inf", got, "score %q", printed)
			case math.IsInf(want, -1):
				require.Equal(t, "-inf", got, "score %q", printed)
			default:
				if want == 0 {
					// -0 reads as 0 or -0 (gopher-lua's ParseInt gives +0): equal as numbers.
					require.Contains(t, []string{"0", "-0"}, got, "score %q", printed)
				} else {
					v, err := strconv.ParseFloat(got, 64)
					require.NoError(t, err, "score %q read as %q", printed, got)
					require.Equal(t, want, v, "score %q", printed)
				}
				switch {
				case want == 0:
					// Redis 8.0.2 prints the -0 score of a skiplist (this
					// set has some 340 members) as "-0", 7.0.15 as "0";
					// tonumber reads "-0" as -0 and x + 0 as 0: the same
					// number to every comparison and to num_arg, which
					// prints both as "0".
					require.Contains(t, []string{"0", "-0"}, old, "score %q: old num read %s", printed, old)
				case math.Abs(want) < 1<<63 || !mini:
					require.Equal(t, old, got, "score %q: old num read %s, new num %s", printed, old, got)
				case old != got:
					// miniredis prints these as digits, past ParseInt's range:
					// old num read them as nil.
					diffs++
				}
			}
		}
		t.Logf("scores old num read as nil that num reads: %d (miniredis digits past 2^63)", diffs)
		last := res[len(scores)].([]any)
		require.Equal(t, "nil", last[2], "a missing score (false) reads as nil")
		require.Equal(t, "nil", last[3], "nil reads as nil")
	})
}

// numbersSetClock sets the bundle's fake clock.
func numbersSetClock(b *testBundle, at time.Time) {
	b.clock.mu.Lock()
	defer b.clock.mu.Unlock()
	b.clock.t = at
}

// TestReviewNumbersTimeEdges: every integer argument read by arithmetic at
// its extremes through the public API, flag off and on: now = 0 (the
// epoch), available_at and retry_at 0 and 9999-12-31T23:59:59.999Z, ready
// scores below zero (priority 9 at the epoch), the limits and depths at
// math.MaxInt and the priority step at MaxDuration. Runs come in priority
// order, a retry at now is ready at once, one a millisecond later is
// delayed until then, one at the last time waits.
func TestReviewNumbersTimeEdges(t *testing.T) {
	redistest.ForEachBackend(t, numbersBackends, func(t *testing.T, c redis.UniversalClient) {
		for _, on := range []bool{false, true} {
			b := setup(t, c, func(cfg *runqueue.Config) {
				cfg.VtimeScheduling = on
				cfg.MaxQueueDepth, cfg.MaxKeyDepth = math.MaxInt, math.MaxInt
				cfg.EnvConcurrency, cfg.QueueConcurrency, cfg.KeyConcurrency = math.MaxInt, math.MaxInt, math.MaxInt
				cfg.PriorityStep = runqueue.MaxDuration
				cfg.PromoteLimit = 500
				cfg.IdleMaxEntries = math.MaxInt
			})
			epoch, last := time.UnixMilli(0), time.UnixMilli(runqueue.MaxTimeUnixMilli)
			numbersSetClock(b, epoch)
			enqueue(t, b, runqueue.EnqueueParams{ID: "p0", Key: "a"})
			enqueue(t, b, runqueue.EnqueueParams{ID: "p9", Key: "a", Priority: 9, AvailableAt: epoch})
			enqueue(t, b, runqueue.EnqueueParams{ID: "late", Key: "c", Priority: 9, AvailableAt: last})
			enqueue(t, b, runqueue.EnqueueParams{ID: "soon", Key: "a", Delay: time.Millisecond})
			s := queueStats(t, b, queueName)
			require.Equal(t, int64(2), s.Ready, "flag on=%v", on)
			require.Equal(t, int64(2), s.Delayed, "flag on=%v", on)

			runs := dequeue(t, b, queueName, 10)
			require.Equal(t, []string{"p9", "p0"}, runIDs(runs), "flag on=%v", on)
			require.True(t, runs[0].AvailableAt.Equal(epoch), "flag on=%v: %v", on, runs[0].AvailableAt)

			// retry_at "0" at now 0: ready at once, its score -9 steps.
			res, err := b.q.Nack(b.ctx, runs[0], &runqueue.NackOptions{RetryAt: epoch})
			require.NoError(t, err)
			require.True(t, res.Requeued)
			// retry_at "1" at now 0: delayed.
			res, err = b.q.Nack(b.ctx, runs[1], &runqueue.NackOptions{RetryAt: time.UnixMilli(1)})
			require.NoError(t, err)
			require.True(t, res.Requeued)
			again := dequeue(t, b, queueName, 10)
			require.Equal(t, []string{"p9"}, runIDs(again), "flag on=%v", on)
			require.Equal(t, 2, again[0].Attempt)

			numbersSetClock(b, time.UnixMilli(1))
			due := dequeue(t, b, queueName, 10)
			require.ElementsMatch(t, []string{"p0", "soon"}, runIDs(due), "flag on=%v", on)
			ackAll(t, b, append(again, due...))

			// Dead-lettered and redriven in year 8307 (2e14 + 123 ms): its
			// record's time as written (a Lua number joined to the record
			// printed as "2.0000000000001e+14" on Redis, which no dequeue
			// could read).
			far := time.UnixMilli(200_000_000_000_123)
			numbersSetClock(b, far)
			enqueue(t, b, runqueue.EnqueueParams{ID: "far", Key: "d"})
			runs = dequeue(t, b, queueName, 10)
			require.Equal(t, []string{"far"}, runIDs(runs), "flag on=%v", on)
			res, err = b.q.Nack(b.ctx, runs[0], &runqueue.NackOptions{DeadLetter: true})
			require.NoError(t, err)
			require.False(t, res.Requeued)
			require.NoError(t, b.q.Redrive(b.ctx, env, queueName, "d", "far"))
			runs = dequeue(t, b, queueName, 10)
			require.Equal(t, []string{"far"}, runIDs(runs), "flag on=%v", on)
			require.True(t, runs[0].AvailableAt.Equal(far), "flag on=%v: %v", on, runs[0].AvailableAt)
			ackAll(t, b, runs)

			// The run at the last time waits until then, and not a ms less.
			numbersSetClock(b, last.Add(-time.Millisecond))
			require.Empty(t, dequeue(t, b, queueName, 10), "flag on=%v", on)
			numbersSetClock(b, last)
			final := dequeue(t, b, queueName, 10)
			require.Equal(t, []string{"late"}, runIDs(final), "flag on=%v", on)
			require.True(t, final[0].AvailableAt.Equal(last))
			// A retry at the last time from now = the last time: ready.
			res, err = b.q.Nack(b.ctx, final[0], &runqueue.NackOptions{RetryAt: last})
			require.NoError(t, err)
			require.True(t, res.Requeued)
			final = dequeue(t, b, queueName, 10)
			require.Equal(t, []string{"late"}, runIDs(final), "flag on=%v", on)
			// Dead-lettered at the last time: no retry time is computed
			// (now + Backoff was past the range: an *InvalidError).
			res, err = b.q.Nack(b.ctx, final[0], &runqueue.NackOptions{DeadLetter: true})
			require.NoError(t, err, "flag on=%v", on)
			require.False(t, res.Requeued)
			require.NoError(t, b.q.Redrive(b.ctx, env, queueName, "c", "late"))
			final = dequeue(t, b, queueName, 10)
			require.Equal(t, []string{"late"}, runIDs(final), "flag on=%v", on)
			ackAll(t, b, final)
			require.Equal(t, runqueue.Stats{}, queueStats(t, b, queueName), "flag on=%v", on)
			if !on { // (flag on, the scheduler's state stays until its TTL)
				require.Empty(t, b.keysUnder(t))
			}
		}
	})
}

// TestReviewNumbersInfiniteDelayHead: a delayIndex score set to +inf by
// hand (a variant whose runs must wait for ever). Dequeue reads it with
// num and serves the other runs; the delayed run stays. Before 8fbaf0f,
// miniredis's num read "inf" as nil and the dequeue failed ("attempt to
// compare nil with number"), while Redis served; now both serve.
func TestReviewNumbersInfiniteDelayHead(t *testing.T) {
	redistest.ForEachBackend(t, numbersBackends, func(t *testing.T, c redis.UniversalClient) {
		for _, on := range []bool{false, true} {
			b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = on })
			enqueue(t, b, runqueue.EnqueueParams{ID: "d", Key: "k", Delay: time.Minute})
			enqueue(t, b, runqueue.EnqueueParams{ID: "r", Key: "j"})
			di := intArgKey(t, b, ":delayIndex")
			vms, err := c.ZRange(b.ctx, di, 0, -1).Result()
			require.NoError(t, err)
			require.Len(t, vms, 1)
			require.NoError(t, c.ZAdd(b.ctx, di, redis.Z{Score: math.Inf(1), Member: vms[0]}).Err())
			b.clock.Advance(2 * time.Minute)
			runs, err := b.q.Dequeue(b.ctx, env, queueName, 10)
			require.NoError(t, err, "flag on=%v", on)
			require.Equal(t, []string{"r"}, runIDs(runs), "flag on=%v", on)
			require.Equal(t, int64(1), queueStats(t, b, queueName).Delayed, "flag on=%v", on)
		}
	})
}

// TestReviewNumbersLastAttemptAtLastTime: a Nack with no options of a run
// on its last attempt, at the last accepted time, dead-letters it. Go
// computed now + Backoff first, past MaxTimeUnixMilli, and refused the
// call with an *InvalidError although no retry time is used.
func TestReviewNumbersLastAttemptAtLastTime(t *testing.T) {
	redistest.ForEachBackend(t, numbersBackends, func(t *testing.T, c redis.UniversalClient) {
		for _, on := range []bool{false, true} {
			b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling, cfg.MaxAttempts = on, 2 })
			last := time.UnixMilli(runqueue.MaxTimeUnixMilli)
			numbersSetClock(b, last)
			enqueue(t, b, runqueue.EnqueueParams{ID: "r", Key: "k"})
			runs := dequeue(t, b, queueName, 1)
			require.Len(t, runs, 1)
			// Attempt 1 of 2: a retry is computed, and it is past the range.
			_, err := b.q.Nack(b.ctx, runs[0], nil)
			require.ErrorIs(t, err, runqueue.ErrInvalid, "flag on=%v", on)
			res, err := b.q.Nack(b.ctx, runs[0], &runqueue.NackOptions{RetryAt: last})
			require.NoError(t, err)
			require.True(t, res.Requeued)
			runs = dequeue(t, b, queueName, 1)
			require.Len(t, runs, 1)
			require.Equal(t, 2, runs[0].Attempt)
			res, err = b.q.Nack(b.ctx, runs[0], nil)
			require.NoError(t, err, "flag on=%v: the last attempt's nack dead-letters", on)
			require.False(t, res.Requeued)
			require.Equal(t, int64(1), queueStats(t, b, queueName).Dead, "flag on=%v", on)
		}
	})
}
