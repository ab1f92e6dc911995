package runqueue_test

// Review s17: adversarial probes of configuration (New's checks, the
// maxmemory-policy and layout checks, ConfigFromEnv, Limits and
// LimitsFor, InvalidError) and of weights (SetWeight, ClearWeight,
// Weights, MinWeight..MaxWeight, MaxWeightOverrides). Every test is named
// TestS17Config*. Helpers s17* are in review_s17_dead_test.go. A test that
// shows a defect says DEFECT and fails until it is fixed.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// TestS17ConfigBadFields: every out-of-range Config field is an
// *InvalidError naming it, and New writes nothing at all (not even the
// layout version).
func TestS17ConfigBadFields(t *testing.T) {
	s16EachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		for _, tc := range []struct {
			field string
			cfg   runqueue.Config
		}{
			{"Shards", runqueue.Config{Shards: -1}},
			{"Shards", runqueue.Config{Shards: 16385}},
			{"PriorityStep", runqueue.Config{PriorityStep: -time.Second}},
			{"PriorityStep", runqueue.Config{PriorityStep: 999 * time.Microsecond}},
			{"PriorityStep", runqueue.Config{PriorityStep: runqueue.MaxDuration + 1}},
			{"LeaseDuration", runqueue.Config{LeaseDuration: time.Microsecond}},
			{"LeaseDuration", runqueue.Config{LeaseDuration: -time.Minute}},
			{"LeaseDuration", runqueue.Config{LeaseDuration: math.MaxInt64}},
			{"BackoffBase", runqueue.Config{BackoffBase: -time.Second}},
			{"BackoffMax", runqueue.Config{BackoffBase: time.Hour, BackoffMax: time.Minute}},
			{"BackoffMax", runqueue.Config{BackoffMax: runqueue.MaxDuration + 1}},
			{"StateTTL", runqueue.Config{StateTTL: 999 * time.Millisecond}},
			{"BlockPollInterval", runqueue.Config{BlockPollInterval: -1}},
			{"MaxPayloadBytes", runqueue.Config{MaxPayloadBytes: -1}},
			{"MaxPayloadBytes", runqueue.Config{MaxPayloadBytes: 512<<20 + 1}},
			// A record of a 512 MiB payload would pass proto-max-bulk-len.
			{"MaxPayloadBytes", runqueue.Config{MaxPayloadBytes: 512 << 20}},
			{"MaxPayloadBytes", runqueue.Config{MaxPayloadBytes: runqueue.MaxPayloadLimit + 1}},
			{"MaxQueueDepth", runqueue.Config{MaxQueueDepth: -1}},
			{"MaxKeyDepth", runqueue.Config{MaxKeyDepth: -1}},
			{"BackoffJitter", runqueue.Config{BackoffJitter: 1}},
			{"BackoffJitter", runqueue.Config{BackoffJitter: math.NaN()}},
			{"BackoffJitter", runqueue.Config{BackoffJitter: math.Inf(1)}},
			{"MaxDequeueCount", runqueue.Config{MaxDequeueCount: 2001}},
			{"MaxDequeueCount", runqueue.Config{MaxDequeueCount: -1}},
			{"ScanLimit", runqueue.Config{ScanLimit: -1}},
			{"ScanLimit", runqueue.Config{ScanLimit: 10001}},
			{"PromoteLimit", runqueue.Config{PromoteLimit: 501}},
			{"PromoteLimit", runqueue.Config{PromoteLimit: -1}},
			{"WindowMultiplier", runqueue.Config{WindowMultiplier: 101}},
			{"Quantum", runqueue.Config{Quantum: math.NaN()}},
			{"Quantum", runqueue.Config{Quantum: math.Inf(1)}},
			{"Quantum", runqueue.Config{Quantum: -1}},
			{"Quantum", runqueue.Config{Quantum: 1e6 + 1}},
			{"IdleMaxEntries", runqueue.Config{IdleMaxEntries: -1}},
			{"MaxWeightOverrides", runqueue.Config{MaxWeightOverrides: -1}},
			{"Prefix", runqueue.Config{Prefix: "a:b"}},
			{"Prefix", runqueue.Config{Prefix: "{x}"}},
			{"Prefix", runqueue.Config{Prefix: strings.Repeat("p", 65)}},
			{"Prefix", runqueue.Config{Prefix: "a b"}},
		} {
			for _, on := range []bool{false, true} {
				cfg := tc.cfg
				prefix := cfg.Prefix
				if prefix == "" {
					prefix = redistest.Prefix(t)
					cfg.Prefix = prefix
				}
				cfg.VtimeScheduling = on
				q, err := runqueue.New(ctx, c, &cfg)
				require.Nil(t, q)
				s17Invalid(t, err, "Config."+tc.field)
				require.Contains(t, err.Error(), tc.field)
				if strings.Trim(prefix, "abcdefghijklmnopqrstuvwxyz0123456789") == "" {
					require.Empty(t, s17AllKeys(t, c, prefix), "%s: nothing written", tc.field)
				}
			}
		}
		_, err := runqueue.New(ctx, nil, nil)
		s17Invalid(t, err, "client")
	})
}

// TestS17ConfigNegativeLimits: a negative concurrency limit in Config is
// refused like every other out-of-range field.
//
// DEFECT (fixed since: validate refuses them, and a negative limit from
// LimitsFor is an *InvalidError of the dequeue, TestS17ConfigNegativeLimitsFor):
// Config.validate (config.go) range-checked MaxQueueDepth and
// MaxKeyDepth (negative: *InvalidError) but not EnvConcurrency,
// QueueConcurrency and KeyConcurrency: New accepts -1, and the dequeue
// scripts (lua/lib/dequeue.lua, `dq.env_limit > 0`, `dq.key_limit <= 0`)
// then treat it as "no limit". A limit computed as cap-1 from a cap of 0,
// or a typo, silently removes the limit (the unsafe direction) where the
// docs say out-of-range fields are an *InvalidError (design.md section
// 10: "Config fields are range-checked at New"; Limits: "0 means no
// limit", nothing about negatives). Fix: reject negative values in
// validate (and in LimitsFor results, or document negatives as 0).
func TestS17ConfigNegativeLimits(t *testing.T) {
	c := redistest.Mini(t)
	ctx := context.Background()
	for _, tc := range []struct {
		field string
		cfg   runqueue.Config
	}{
		{"EnvConcurrency", runqueue.Config{EnvConcurrency: -1}},
		{"QueueConcurrency", runqueue.Config{QueueConcurrency: -1}},
		{"KeyConcurrency", runqueue.Config{KeyConcurrency: -1}},
	} {
		t.Run(tc.field, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Prefix = redistest.Prefix(t)
			q, err := runqueue.New(ctx, c, &cfg)
			if q != nil {
				_ = q.Close()
			}
			s17Invalid(t, err, "Config."+tc.field)
			require.Empty(t, s17AllKeys(t, c, cfg.Prefix))
		})
	}
}

// TestS17ConfigNegativeLimitsFor: a negative limit from Config.LimitsFor
// (consulted at each dequeue) is an *InvalidError of the dequeue naming
// Config.LimitsFor, with nothing written, on every dequeue path; the
// queue's other calls go on.
func TestS17ConfigNegativeLimitsFor(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		var lim atomic.Pointer[runqueue.Limits]
		lim.Store(&runqueue.Limits{})
		b := s17Setup(t, c, on, func(cfg *runqueue.Config) {
			cfg.LimitsFor = func(string, string) runqueue.Limits { return *lim.Load() }
		})
		enqueue(t, b, runqueue.EnqueueParams{ID: "a"})
		enqueue(t, b, runqueue.EnqueueParams{ID: "b"})
		held := dequeue(t, b, queueName, 1)[0]
		for _, l := range []runqueue.Limits{{Env: -1}, {Queue: -1}, {Key: -1}} {
			lim.Store(&l)
			st := s17AllKeys(t, c, b.prefix)
			_, err := b.q.Dequeue(b.ctx, env, queueName, 1)
			s17Invalid(t, err, "Config.LimitsFor")
			_, _, err = b.q.AckAndDequeue(b.ctx, nil, env, queueName, 1)
			s17Invalid(t, err, "Config.LimitsFor")
			_, err = b.q.DequeueShard(b.ctx, b.q.ShardOf(env), 1)
			s17Invalid(t, err, "Config.LimitsFor")
			require.Equal(t, st, s17AllKeys(t, c, b.prefix), "nothing written")
		}
		// The acks of an AckAndDequeue do not wait for the configuration:
		// they are made, alone, and answered with the dequeue's error.
		lim.Store(&runqueue.Limits{Key: -1})
		_, ackErrs, err := b.q.AckAndDequeue(b.ctx, []*runqueue.Run{held}, env, queueName, 1)
		s17Invalid(t, err, "Config.LimitsFor")
		require.Equal(t, []error{nil}, ackErrs)
		require.Equal(t, runqueue.Stats{Ready: 1}, queueStats(t, b, queueName), "the ack was made, nothing dequeued")
		lim.Store(&runqueue.Limits{})
		require.NoError(t, b.q.Ack(b.ctx, held), "acked already: gone, no error")
		require.Equal(t, []string{"b"}, runIDs(dequeue(t, b, queueName, 5)))
	})
}

// TestS17ConfigDefaults: New fills defaults into its own copy and leaves
// the caller's Config alone; WithDefaults of nil is the defaults.
func TestS17ConfigDefaults(t *testing.T) {
	c := redistest.Mini(t)
	cfg := &runqueue.Config{Prefix: redistest.Prefix(t)}
	q, err := runqueue.New(context.Background(), c, cfg)
	require.NoError(t, err)
	defer q.Close()
	require.Equal(t, 0, cfg.Shards)
	require.Nil(t, cfg.Clock)
	got := q.Config()
	require.Equal(t, 16, got.Shards)
	require.Equal(t, 5*time.Minute, got.LeaseDuration)
	require.Equal(t, 5, got.MaxAttempts)
	require.Equal(t, 30*time.Second, got.PriorityStep)
	require.Equal(t, 1000, got.MaxWeightOverrides)
	d := (*runqueue.Config)(nil).WithDefaults()
	require.Equal(t, "rq", d.Prefix)
	require.Equal(t, runqueue.Limits{}, d.LimitsFor("e", "q"))
}

// s17PolicyHook answers CONFIG GET maxmemory-policy with a canned reply
// (or error) instead of asking the server.
type s17PolicyHook struct {
	policy string
	err    error
}

func (h s17PolicyHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h s17PolicyHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if len(args) >= 3 && strings.EqualFold(fmt.Sprint(args[0]), "config") && strings.EqualFold(fmt.Sprint(args[1]), "get") {
			if h.err != nil {
				cmd.SetErr(h.err)
				return h.err
			}
			cmd.(*redis.MapStringStringCmd).SetVal(map[string]string{"maxmemory-policy": h.policy})
			return nil
		}
		return next(ctx, cmd)
	}
}

func (h s17PolicyHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// s17Err is a Redis error reply.
type s17Err string

func (e s17Err) Error() string { return string(e) }
func (e s17Err) RedisError()   {}

// TestS17ConfigEviction: an evicting maxmemory-policy is refused with an
// *EvictionPolicyError and nothing written; AllowEviction accepts it; a
// CONFIG refused by ACL is not checked; noeviction in any case passes.
func TestS17ConfigEviction(t *testing.T) {
	ctx := context.Background()
	open := func(t *testing.T, h s17PolicyHook, allow bool) (string, redis.UniversalClient, error) {
		_, c := redistest.MiniServer(t)
		c.(*redis.Client).AddHook(h)
		prefix := redistest.Prefix(t)
		q, err := runqueue.New(ctx, c, &runqueue.Config{Prefix: prefix, AllowEviction: allow})
		if q != nil {
			_ = q.Close()
		}
		return prefix, c, err
	}
	for _, p := range []string{"allkeys-lru", "volatile-ttl", "AllKeys-Random"} {
		prefix, c, err := open(t, s17PolicyHook{policy: p}, false)
		require.ErrorIs(t, err, runqueue.ErrEvictionPolicy)
		var pe *runqueue.EvictionPolicyError
		require.ErrorAs(t, err, &pe)
		require.Equal(t, strings.ToLower(p), pe.Policy)
		require.Empty(t, s17AllKeys(t, c, prefix))
		_, _, err = open(t, s17PolicyHook{policy: p}, true)
		require.NoError(t, err)
	}
	for _, h := range []s17PolicyHook{{policy: "noeviction"}, {policy: "NoEviction"}, {policy: ""},
		{err: s17Err("NOPERM this user has no permissions to run the 'config|get' command")},
		{err: s17Err("ERR unknown command 'CONFIG'")}} {
		_, _, err := open(t, h, false)
		require.NoError(t, err, "%+v", h)
	}
	// Any other failure is an error of New, before anything is written.
	prefix, c, err := open(t, s17PolicyHook{err: errors.New("i/o timeout")}, false)
	require.Error(t, err)
	require.Empty(t, s17AllKeys(t, c, prefix))
	// A real Redis at its default policy passes.
	r := redistest.Real(t)
	q, err := runqueue.New(ctx, r, &runqueue.Config{Prefix: redistest.Prefix(t)})
	require.NoError(t, err)
	require.NoError(t, q.Close())
}

// TestS17ConfigLayout: another layout version is refused with a
// *LayoutError and nothing written, read-only too; a read-only Queue on
// an empty prefix writes nothing; a prefix whose layout key holds
// something that is no version is refused and left alone.
func TestS17ConfigLayout(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		ctx := context.Background()
		prefix := redistest.Prefix(t)
		space, err := keys.NewSpace(prefix, 16)
		require.NoError(t, err)

		ro, err := runqueue.New(ctx, c, &runqueue.Config{Prefix: prefix, ReadOnly: true, VtimeScheduling: on})
		require.NoError(t, err)
		require.Empty(t, s17AllKeys(t, c, prefix), "a read-only New writes nothing")
		require.ErrorIs(t, ro.SetWeight(ctx, env, queueName, "k", 2), runqueue.ErrReadOnly)
		require.ErrorIs(t, ro.ClearWeight(ctx, env, queueName, "k"), runqueue.ErrReadOnly)
		require.ErrorIs(t, ro.Redrive(ctx, env, queueName, "k", "x"), runqueue.ErrReadOnly)
		require.NoError(t, ro.Close())
		require.Empty(t, s17AllKeys(t, c, prefix))

		// another version, the next, and this one padded or spaced
		lv := runqueue.LayoutVersion
		for _, v := range []string{fmt.Sprint(lv - 1), fmt.Sprint(lv + 1), fmt.Sprintf("0%d", lv), fmt.Sprintf("%d ", lv), ""} {
			require.NoError(t, c.Set(ctx, space.Layout(), v, 0).Err())
			before := s17AllKeys(t, c, prefix)
			for _, readOnly := range []bool{false, true} {
				q, err := runqueue.New(ctx, c, &runqueue.Config{Prefix: prefix, ReadOnly: readOnly, VtimeScheduling: on})
				require.Nil(t, q)
				require.ErrorIs(t, err, runqueue.ErrLayout, "version %q", v)
				var le *runqueue.LayoutError
				require.ErrorAs(t, err, &le)
				require.Equal(t, v, le.Found)
				require.Equal(t, space.Layout(), le.Key)
				require.Equal(t, before, s17AllKeys(t, c, prefix))
			}
		}
		require.NoError(t, c.Del(ctx, space.Layout()).Err())
		require.NoError(t, c.HSet(ctx, space.Layout(), "v", "6").Err())
		before := s17AllKeys(t, c, prefix)
		q, err := runqueue.New(ctx, c, &runqueue.Config{Prefix: prefix, VtimeScheduling: on})
		require.Nil(t, q)
		require.Error(t, err)
		require.Equal(t, before, s17AllKeys(t, c, prefix))
	})
}

// TestS17ConfigLayoutUnversionedData: a prefix that holds runqueue data
// but no layout version, which is what layout 1 ("the first release (no
// version recorded)", layout.go) left, is adopted silently.
//
// DEFECT (fixed since: a prefix with no version but data in a shard's
// master, leases or ttl key is a *LayoutError with Found ""):
// checkLayout (layout.go) SETNXed LayoutVersion whenever the
// layout key is missing, without looking whether the prefix already holds
// data, so a build of layout 5 started on a layout-1 deployment records
// "5" over it and runs on data it misreads, the very case LayoutVersion's
// doc promises ("a rolling upgrade can never mix layouts silently") and
// README's "a prefix that holds another LayoutVersion is a *LayoutError".
// A read-only Queue likewise passes ("a prefix with no version passes,
// since there is nothing of another layout to misread"). Fix: when the
// layout key is missing, look for data under the prefix (EXISTS on each
// shard's master, leases and ttl keys: Shards commands, once) and refuse
// with a *LayoutError{Found: "1"} (or "none") when there is any.
func TestS17ConfigLayoutUnversionedData(t *testing.T) {
	s16EachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		prefix := redistest.Prefix(t)
		space, err := keys.NewSpace(prefix, 16)
		require.NoError(t, err)
		// Data a deployment wrote: a queued run, a run in flight (layout 1
		// wrote these shard keys too).
		sh := space.Shard(space.ShardOf(env))
		require.NoError(t, c.ZAdd(ctx, sh.Master(), redis.Z{Score: 1, Member: "e:env:q:q"}).Err())
		require.NoError(t, c.ZAdd(ctx, sh.Leases(), redis.Z{Score: 2, Member: "e:env:q:q:=:r1"}).Err())
		before := s17AllKeys(t, c, prefix)
		for _, readOnly := range []bool{true, false} {
			q, err := runqueue.New(ctx, c, &runqueue.Config{Prefix: prefix, ReadOnly: readOnly})
			if q != nil {
				_ = q.Close()
			}
			require.ErrorIs(t, err, runqueue.ErrLayout, "readOnly=%v: a prefix with unversioned data", readOnly)
			require.Equal(t, before, s17AllKeys(t, c, prefix))
		}
	})
}

// TestS17ConfigFromEnv: every variable is read (whitespace trimmed), a
// malformed one is an *InvalidError naming the variable, and what it
// reads opens a Queue with those settings.
func TestS17ConfigFromEnv(t *testing.T) {
	vars := []string{"CK_VTIME_SCHEDULING_ENABLED", "RUNQUEUE_PREFIX", "RUNQUEUE_SHARDS", "RUNQUEUE_LEASE_DURATION",
		"RUNQUEUE_MAX_ATTEMPTS", "RUNQUEUE_MAX_QUEUE_DEPTH", "RUNQUEUE_MAX_KEY_DEPTH", "RUNQUEUE_VTIME_QUANTUM",
		"RUNQUEUE_VTIME_WINDOW_MULTIPLIER", "RUNQUEUE_VTIME_STATE_TTL"}
	for _, v := range vars {
		t.Setenv(v, "")
	}
	cfg, err := runqueue.ConfigFromEnv()
	require.NoError(t, err)
	require.Equal(t, runqueue.Config{}, *cfg)

	prefix := redistest.Prefix(t)
	set := map[string]string{
		"CK_VTIME_SCHEDULING_ENABLED":      " 1 ",
		"RUNQUEUE_PREFIX":                  prefix,
		"RUNQUEUE_SHARDS":                  "4",
		"RUNQUEUE_LEASE_DURATION":          "90s",
		"RUNQUEUE_MAX_ATTEMPTS":            "-1",
		"RUNQUEUE_MAX_QUEUE_DEPTH":         "7",
		"RUNQUEUE_MAX_KEY_DEPTH":           "3",
		"RUNQUEUE_VTIME_QUANTUM":           "2.5",
		"RUNQUEUE_VTIME_WINDOW_MULTIPLIER": "5",
		"RUNQUEUE_VTIME_STATE_TTL":         "2h",
	}
	for k, v := range set {
		t.Setenv(k, v)
	}
	cfg, err = runqueue.ConfigFromEnv()
	require.NoError(t, err)
	require.Equal(t, runqueue.Config{VtimeScheduling: true, Prefix: prefix, Shards: 4, LeaseDuration: 90 * time.Second,
		MaxAttempts: -1, MaxQueueDepth: 7, MaxKeyDepth: 3, Quantum: 2.5, WindowMultiplier: 5, StateTTL: 2 * time.Hour}, *cfg)
	c := redistest.Mini(t)
	q, err := runqueue.New(context.Background(), c, cfg)
	require.NoError(t, err)
	require.Equal(t, 4, q.Shards())
	require.NoError(t, q.Close())

	for _, v := range []string{"0", "false", "FALSE"} {
		t.Setenv("CK_VTIME_SCHEDULING_ENABLED", v)
		cfg, err = runqueue.ConfigFromEnv()
		require.NoError(t, err)
		require.False(t, cfg.VtimeScheduling)
	}
	t.Setenv("CK_VTIME_SCHEDULING_ENABLED", "true")

	for k, bad := range map[string]string{
		"CK_VTIME_SCHEDULING_ENABLED":      "yes",
		"RUNQUEUE_SHARDS":                  "4x",
		"RUNQUEUE_LEASE_DURATION":          "30",
		"RUNQUEUE_MAX_ATTEMPTS":            "1.5",
		"RUNQUEUE_MAX_QUEUE_DEPTH":         "99999999999999999999",
		"RUNQUEUE_MAX_KEY_DEPTH":           "three",
		"RUNQUEUE_VTIME_QUANTUM":           "1,5",
		"RUNQUEUE_VTIME_WINDOW_MULTIPLIER": "0x",
		"RUNQUEUE_VTIME_STATE_TTL":         "1d",
	} {
		t.Run(k, func(t *testing.T) {
			t.Setenv(k, bad)
			_, err := runqueue.ConfigFromEnv()
			s17Invalid(t, err, k)
		})
	}
	// Well-formed but out of range: New refuses it, nothing written.
	prefix = redistest.Prefix(t)
	t.Setenv("RUNQUEUE_PREFIX", prefix)
	t.Setenv("RUNQUEUE_LEASE_DURATION", "-5s")
	cfg, err = runqueue.ConfigFromEnv()
	require.NoError(t, err)
	_, err = runqueue.New(context.Background(), c, cfg)
	s17Invalid(t, err, "Config.LeaseDuration")
	require.Empty(t, s17AllKeys(t, c, prefix))
}

// TestS17ConfigLimitsFor: LimitsFor, when set, decides the limits of each
// queue at each dequeue (over the Config fields), and a key limit that
// rises lets a waiting key through at the next dequeue.
func TestS17ConfigLimitsFor(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		var keyLimit atomic.Int64
		keyLimit.Store(1)
		b := s17Setup(t, c, on, func(cfg *runqueue.Config) {
			cfg.KeyConcurrency = 100
			cfg.EnvConcurrency = 100
			cfg.LimitsFor = func(e, q string) runqueue.Limits {
				if q == "other" {
					return runqueue.Limits{Queue: 2}
				}
				return runqueue.Limits{Key: int(keyLimit.Load())}
			}
		})
		for i := range 3 {
			enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: fmt.Sprintf("r%d", i)})
			enqueue(t, b, runqueue.EnqueueParams{Queue: "other", Key: fmt.Sprintf("o%d", i), ID: fmt.Sprintf("o%d", i)})
		}
		require.Len(t, dequeue(t, b, queueName, 10), 1)
		require.Len(t, dequeue(t, b, "other", 10), 2)
		require.Empty(t, dequeue(t, b, queueName, 10))
		keyLimit.Store(3)
		require.Len(t, dequeue(t, b, queueName, 10), 2, "the raised limit applies at the next dequeue")
	})
}

// TestS17ConfigWeightBounds: SetWeight takes MinWeight..MaxWeight
// inclusive and nothing else (NaN, infinities, zero, negatives, a hair
// outside), with nothing written; Weights reports what was set exactly.
func TestS17ConfigWeightBounds(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		b := s17Setup(t, c, on, nil)
		enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "x"})
		dequeue(t, b, queueName, 1) // a scheduler state exists (flag on)
		st := s17AllKeys(t, c, b.prefix)
		for _, w := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), 0, -1, math.Copysign(0, -1),
			runqueue.MinWeight / 2, math.Nextafter(runqueue.MinWeight, 0), math.Nextafter(runqueue.MaxWeight, 2000),
			math.MaxFloat64, math.SmallestNonzeroFloat64} {
			s17Invalid(t, b.q.SetWeight(b.ctx, env, queueName, "a", w), "weight")
		}
		s17Invalid(t, b.q.SetWeight(b.ctx, env, queueName, "a\n", 2), "key")
		s17Invalid(t, b.q.SetWeight(b.ctx, "", queueName, "a", 2), "env")
		s17Invalid(t, b.q.ClearWeight(b.ctx, env, ".", "a"), "queue")
		_, err := b.q.Weights(b.ctx, env, "")
		s17Invalid(t, err, "queue")
		require.Equal(t, st, s17AllKeys(t, c, b.prefix))

		want := map[string]float64{"a": runqueue.MinWeight, "b": runqueue.MaxWeight, "": 2.5, "c": 0.0015}
		for k, w := range want {
			require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, k, w))
		}
		st = s17AllKeys(t, c, b.prefix)
		for k, w := range want { // sent twice: nothing changes
			require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, k, w))
		}
		require.Equal(t, st, s17AllKeys(t, c, b.prefix))
		got, err := b.q.Weights(b.ctx, env, queueName)
		require.NoError(t, err)
		require.Equal(t, want, got)
		require.NoError(t, b.q.ClearWeight(b.ctx, env, queueName, "zz"), "clearing a key without a weight")
		for k := range want {
			require.NoError(t, b.q.ClearWeight(b.ctx, env, queueName, k))
			require.NoError(t, b.q.ClearWeight(b.ctx, env, queueName, k))
		}
		got, err = b.q.Weights(b.ctx, env, queueName)
		require.NoError(t, err)
		require.Empty(t, got)
	})
}

// TestS17ConfigWeightOverrides: MaxWeightOverrides caps the keys with a
// weight per queue: one more is ErrTooManyWeights with nothing written, a
// key that has one may change it, and clearing one makes room.
func TestS17ConfigWeightOverrides(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		b := s17Setup(t, c, on, func(cfg *runqueue.Config) { cfg.MaxWeightOverrides = 2 })
		require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, "a", 2))
		require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, "b", 3))
		st := s17AllKeys(t, c, b.prefix)
		require.ErrorIs(t, b.q.SetWeight(b.ctx, env, queueName, "c", 4), runqueue.ErrTooManyWeights)
		require.Equal(t, st, s17AllKeys(t, c, b.prefix))
		require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, "b", 5))
		require.NoError(t, b.q.SetWeight(b.ctx, env, "other", "c", 4), "the cap is per queue")
		require.NoError(t, b.q.ClearWeight(b.ctx, env, queueName, "a"))
		require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, "c", 4))
		got, err := b.q.Weights(b.ctx, env, queueName)
		require.NoError(t, err)
		require.Equal(t, map[string]float64{"b": 5, "c": 4}, got)
	})
}

// TestS17ConfigWeightFromFlagOffInstance: a weight set through a flag-off
// Queue (sharing Redis with a flag-on one whose scheduler state already
// runs with no weights) applies at the flag-on instance's next serves.
func TestS17ConfigWeightFromFlagOffInstance(t *testing.T) {
	s16EachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		on := s17Setup(t, c, true, nil)
		off, err := runqueue.New(on.ctx, c, &runqueue.Config{Prefix: on.prefix, Clock: on.clock, SerialCalls: true})
		require.NoError(t, err)
		t.Cleanup(func() { _ = off.Close() })
		for i := range 60 {
			enqueue(t, on, runqueue.EnqueueParams{Key: "a", ID: fmt.Sprintf("a%02d", i)})
			enqueue(t, on, runqueue.EnqueueParams{Key: "b", ID: fmt.Sprintf("b%02d", i)})
		}
		ackAll(t, on, dequeue(t, on, queueName, 4)) // the state runs, weightless
		require.NoError(t, off.SetWeight(on.ctx, env, queueName, "a", 3))
		count := map[string]int{}
		for range 40 {
			rs := dequeue(t, on, queueName, 1)
			require.Len(t, rs, 1)
			count[rs[0].Key]++
			ackAll(t, on, rs)
		}
		require.InDelta(t, 30, count["a"], 2, "a has weight 3: %v", count)
		require.NoError(t, off.ClearWeight(on.ctx, env, queueName, "a"))
		count = map[string]int{}
		for range 40 {
			rs := dequeue(t, on, queueName, 1)
			require.Len(t, rs, 1)
			count[rs[0].Key]++
			ackAll(t, on, rs)
		}
		require.InDelta(t, 20, count["a"], 2, "a is back to weight 1: %v", count)
	})
}

// TestS17ConfigWeightExtremes: with weights MinWeight and MaxWeight side
// by side the heavy key gets (almost) every serve and the light one still
// gets its share; nothing is served twice.
func TestS17ConfigWeightExtremes(t *testing.T) {
	s16EachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := s17Setup(t, c, true, nil)
		require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, "light", runqueue.MinWeight))
		require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, "heavy", runqueue.MaxWeight))
		for i := range 30 {
			enqueue(t, b, runqueue.EnqueueParams{Key: "light", ID: fmt.Sprintf("l%02d", i)})
			enqueue(t, b, runqueue.EnqueueParams{Key: "heavy", ID: fmt.Sprintf("h%02d", i)})
		}
		seen := map[string]bool{}
		count := map[string]int{}
		for range 30 {
			rs := dequeue(t, b, queueName, 1)
			require.Len(t, rs, 1)
			require.False(t, seen[rs[0].ID])
			seen[rs[0].ID] = true
			count[rs[0].Key]++
			ackAll(t, b, rs)
		}
		require.GreaterOrEqual(t, count["heavy"], 28, "%v", count)
		rest := dequeue(t, b, queueName, 100)
		require.Len(t, rest, 30)
	})
}
