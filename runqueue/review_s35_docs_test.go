package runqueue_test

// Session 35: documentation-versus-behaviour audit. Each test states the
// claim it checks.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
	"github.com/runqueue/runqueue/runqueue/metrics"
)

func s35Invalid(t *testing.T, err error, field string) {
	t.Helper()
	var ie *runqueue.InvalidError
	require.Error(t, err)
	require.True(t, errors.As(err, &ie), "want *InvalidError, got %T %v", err, err)
	require.True(t, errors.Is(err, runqueue.ErrInvalid))
	if field != "" {
		require.Equal(t, field, ie.Field, "err %v", err)
	}
}

// README configuration table and Config godoc: each bound is an
// *InvalidError naming "Config.<field>".
func TestS35DocsConfigBounds(t *testing.T) {
	c := redistest.Real(t)
	ctx := t.Context()
	cases := []struct {
		name  string
		field string
		mut   func(*runqueue.Config)
	}{
		{"prefix long", "Config.Prefix", func(c *runqueue.Config) { c.Prefix = strings.Repeat("a", 65) }},
		{"prefix colon", "Config.Prefix", func(c *runqueue.Config) { c.Prefix = "a:b" }},
		{"shards", "Config.Shards", func(c *runqueue.Config) { c.Shards = 16385 }},
		{"shards neg", "Config.Shards", func(c *runqueue.Config) { c.Shards = -1 }},
		{"prio step", "Config.PriorityStep", func(c *runqueue.Config) { c.PriorityStep = time.Microsecond }},
		{"prio step big", "Config.PriorityStep", func(c *runqueue.Config) { c.PriorityStep = runqueue.MaxDuration + 1 }},
		{"payload", "Config.MaxPayloadBytes", func(c *runqueue.Config) { c.MaxPayloadBytes = runqueue.MaxPayloadLimit + 1 }},
		{"payload neg", "Config.MaxPayloadBytes", func(c *runqueue.Config) { c.MaxPayloadBytes = -1 }},
		{"qdepth", "Config.MaxQueueDepth", func(c *runqueue.Config) { c.MaxQueueDepth = -1 }},
		{"kdepth", "Config.MaxKeyDepth", func(c *runqueue.Config) { c.MaxKeyDepth = -1 }},
		{"envc", "Config.EnvConcurrency", func(c *runqueue.Config) { c.EnvConcurrency = -1 }},
		{"lease", "Config.LeaseDuration", func(c *runqueue.Config) { c.LeaseDuration = time.Microsecond }},
		{"lease neg", "Config.LeaseDuration", func(c *runqueue.Config) { c.LeaseDuration = -time.Second }},
		{"jitter", "Config.BackoffJitter", func(c *runqueue.Config) { c.BackoffJitter = 1 }},
		{"jitter nan", "Config.BackoffJitter", func(c *runqueue.Config) { c.BackoffJitter = math.NaN() }},
		{"backoff base", "Config.BackoffBase", func(c *runqueue.Config) { c.BackoffBase = -time.Second }},
		{"backoff max<base", "Config.BackoffMax", func(c *runqueue.Config) { c.BackoffBase = time.Hour; c.BackoffMax = time.Minute }},
		{"deq", "Config.MaxDequeueCount", func(c *runqueue.Config) { c.MaxDequeueCount = 2001 }},
		{"scan", "Config.ScanLimit", func(c *runqueue.Config) { c.ScanLimit = 10001 }},
		{"promote", "Config.PromoteLimit", func(c *runqueue.Config) { c.PromoteLimit = 501 }},
		{"window", "Config.WindowMultiplier", func(c *runqueue.Config) { c.WindowMultiplier = 101 }},
		{"quantum", "Config.Quantum", func(c *runqueue.Config) { c.Quantum = 1e6 + 1 }},
		{"quantum neg", "Config.Quantum", func(c *runqueue.Config) { c.Quantum = -1 }},
		{"statettl", "Config.StateTTL", func(c *runqueue.Config) { c.StateTTL = 999 * time.Millisecond }},
		{"poll", "Config.BlockPollInterval", func(c *runqueue.Config) { c.BlockPollInterval = time.Microsecond }},
		{"lookahead", "Config.ShardLookAhead", func(c *runqueue.Config) { c.ShardLookAhead = runqueue.MaxDuration + 1 }},
		{"idle", "Config.IdleMaxEntries", func(c *runqueue.Config) { c.IdleMaxEntries = -1 }},
		{"weights", "Config.MaxWeightOverrides", func(c *runqueue.Config) { c.MaxWeightOverrides = -1 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &runqueue.Config{Prefix: redistest.Prefix(t)}
			tc.mut(cfg)
			_, err := runqueue.New(ctx, c, cfg)
			s35Invalid(t, err, tc.field)
		})
	}
	// Bounds that are documented as accepted.
	ok := []struct {
		name string
		mut  func(*runqueue.Config)
	}{
		{"prefix 64", func(c *runqueue.Config) { c.Prefix += strings.Repeat("a", 64-len(c.Prefix)) }},
		{"shards 16384", func(c *runqueue.Config) { c.Shards = 16384 }},
		{"prio step 1ms", func(c *runqueue.Config) { c.PriorityStep = time.Millisecond }},
		{"max attempts neg", func(c *runqueue.Config) { c.MaxAttempts = -1 }},
		{"jitter neg", func(c *runqueue.Config) { c.BackoffJitter = -1 }},
		{"deq 2000", func(c *runqueue.Config) { c.MaxDequeueCount = 2000 }},
		{"scan 10000", func(c *runqueue.Config) { c.ScanLimit = 10000 }},
		{"promote 500", func(c *runqueue.Config) { c.PromoteLimit = 500 }},
		{"window 100", func(c *runqueue.Config) { c.WindowMultiplier = 100 }},
		{"quantum 1e6", func(c *runqueue.Config) { c.Quantum = 1e6 }},
		{"statettl 1s", func(c *runqueue.Config) { c.StateTTL = time.Second }},
		{"lookahead neg", func(c *runqueue.Config) { c.ShardLookAhead = -1 }},
		{"lookahead max", func(c *runqueue.Config) { c.ShardLookAhead = runqueue.MaxDuration }},
	}
	for _, tc := range ok {
		t.Run("ok "+tc.name, func(t *testing.T) {
			cfg := &runqueue.Config{Prefix: redistest.Prefix(t)}
			tc.mut(cfg)
			q, err := runqueue.New(ctx, c, cfg)
			require.NoError(t, err)
			_ = q.Close()
		})
	}
}

// README table defaults.
func TestS35DocsDefaults(t *testing.T) {
	d := (&runqueue.Config{}).WithDefaults()
	require.Equal(t, "rq", d.Prefix)
	require.Equal(t, 16, d.Shards)
	require.Equal(t, 30*time.Second, d.PriorityStep)
	require.Equal(t, 1<<20, d.MaxPayloadBytes)
	require.Equal(t, 5*time.Minute, d.LeaseDuration)
	require.Equal(t, 5, d.MaxAttempts)
	require.Equal(t, time.Second, d.BackoffBase)
	require.Equal(t, 10*time.Minute, d.BackoffMax)
	require.Equal(t, 0.2, d.BackoffJitter)
	require.Equal(t, 1000, d.MaxDequeueCount)
	require.Equal(t, 100, d.PromoteLimit)
	require.Equal(t, 3, d.WindowMultiplier)
	require.Equal(t, 1.0, d.Quantum)
	require.Equal(t, 24*time.Hour, d.StateTTL)
	require.Equal(t, 10000, d.IdleMaxEntries)
	require.Equal(t, 1000, d.MaxWeightOverrides)
	require.Equal(t, time.Second, d.BlockPollInterval)
	require.Equal(t, time.Minute, d.ShardLookAhead)
	require.Equal(t, 0, d.ScanLimit)
}

// ConfigFromEnv godoc: every variable named maps to its field; a malformed
// value is an *InvalidError naming the variable.
func TestS35DocsConfigFromEnv(t *testing.T) {
	t.Setenv("CK_VTIME_SCHEDULING_ENABLED", "1")
	t.Setenv("RUNQUEUE_PREFIX", "pfx")
	t.Setenv("RUNQUEUE_SHARDS", "7")
	t.Setenv("RUNQUEUE_LEASE_DURATION", "30s")
	t.Setenv("RUNQUEUE_MAX_ATTEMPTS", "9")
	t.Setenv("RUNQUEUE_MAX_QUEUE_DEPTH", "11")
	t.Setenv("RUNQUEUE_MAX_KEY_DEPTH", "12")
	t.Setenv("RUNQUEUE_VTIME_QUANTUM", "2.5")
	t.Setenv("RUNQUEUE_VTIME_WINDOW_MULTIPLIER", "4")
	t.Setenv("RUNQUEUE_VTIME_STATE_TTL", "2h")
	c, err := runqueue.ConfigFromEnv()
	require.NoError(t, err)
	require.True(t, c.VtimeScheduling)
	require.Equal(t, "pfx", c.Prefix)
	require.Equal(t, 7, c.Shards)
	require.Equal(t, 30*time.Second, c.LeaseDuration)
	require.Equal(t, 9, c.MaxAttempts)
	require.Equal(t, 11, c.MaxQueueDepth)
	require.Equal(t, 12, c.MaxKeyDepth)
	require.Equal(t, 2.5, c.Quantum)
	require.Equal(t, 4, c.WindowMultiplier)
	require.Equal(t, 2*time.Hour, c.StateTTL)
	for _, v := range []string{"CK_VTIME_SCHEDULING_ENABLED", "RUNQUEUE_SHARDS", "RUNQUEUE_LEASE_DURATION",
		"RUNQUEUE_VTIME_QUANTUM", "RUNQUEUE_VTIME_STATE_TTL"} {
		t.Run(v, func(t *testing.T) {
			t.Setenv(v, "bogus")
			_, err := runqueue.ConfigFromEnv()
			s35Invalid(t, err, v)
		})
	}
}

// Backoff godoc: BackoffBase*2^(attempt-1), at most BackoffMax; negative
// jitter means none.
func TestS35DocsBackoff(t *testing.T) {
	b := setup(t, redistest.Real(t), func(c *runqueue.Config) { c.BackoffJitter = -1 })
	require.Equal(t, time.Second, b.q.Backoff(1))
	require.Equal(t, 4*time.Second, b.q.Backoff(3))
	require.Equal(t, 10*time.Minute, b.q.Backoff(100))
	require.Equal(t, 10*time.Minute, b.q.Backoff(100000))
	b2 := setup(t, redistest.Real(t), func(c *runqueue.Config) { c.BackoffJitter = 0.5 })
	for i := 0; i < 200; i++ {
		d := b2.q.Backoff(2)
		require.True(t, d >= time.Second && d <= 3*time.Second, "%v", d)
	}
}

// Bad-input claims of README "Bad input" and the package's Errors section.
func TestS35DocsBadInput(t *testing.T) {
	b := setup(t, redistest.Real(t), nil)
	ctx := b.ctx
	base := runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "x"}
	enq := func(mut func(*runqueue.EnqueueParams)) error {
		p := base
		mut(&p)
		_, err := b.q.Enqueue(ctx, p)
		return err
	}
	s35Invalid(t, enq(func(p *runqueue.EnqueueParams) { p.Priority = 10 }), "")
	s35Invalid(t, enq(func(p *runqueue.EnqueueParams) { p.Priority = -1 }), "")
	s35Invalid(t, enq(func(p *runqueue.EnqueueParams) { p.Delay = -time.Second }), "")
	s35Invalid(t, enq(func(p *runqueue.EnqueueParams) { p.TTL = -time.Second }), "")
	s35Invalid(t, enq(func(p *runqueue.EnqueueParams) { p.Delay = time.Second; p.AvailableAt = time.Now() }), "")
	s35Invalid(t, enq(func(p *runqueue.EnqueueParams) { p.AvailableAt = time.Unix(-10, 0) }), "")
	s35Invalid(t, enq(func(p *runqueue.EnqueueParams) { p.AvailableAt = time.UnixMilli(runqueue.MaxTimeUnixMilli + 1) }), "")
	s35Invalid(t, enq(func(p *runqueue.EnqueueParams) { p.Delay = runqueue.MaxDuration + 1 }), "")
	s35Invalid(t, enq(func(p *runqueue.EnqueueParams) { p.TTL = runqueue.MaxDuration + 1 }), "")
	s35Invalid(t, enq(func(p *runqueue.EnqueueParams) { p.Payload = make([]byte, 1<<20+1) }), "")
	s35Invalid(t, enq(func(p *runqueue.EnqueueParams) { p.Env = " e" }), "env")
	s35Invalid(t, enq(func(p *runqueue.EnqueueParams) { p.Key = "k\n" }), "key")
	s35Invalid(t, enq(func(p *runqueue.EnqueueParams) { p.ID = ".." }), "id")
	s35Invalid(t, enq(func(p *runqueue.EnqueueParams) { p.Queue = strings.Repeat("q", 257) }), "queue")
	require.Empty(t, b.keysUnder(t), "nothing written")

	_, err := b.q.Dequeue(ctx, "e", "q", 0)
	s35Invalid(t, err, "")
	_, err = b.q.Dequeue(ctx, "e", "q", 1001)
	s35Invalid(t, err, "")
	_, err = b.q.DequeueShard(ctx, 16, 1)
	s35Invalid(t, err, "")
	_, err = b.q.DequeueShard(ctx, -1, 1)
	s35Invalid(t, err, "")
	_, err = b.q.DequeueWait(ctx, "e", "q", 1, -time.Second)
	t.Logf("DequeueWait negative timeout: %v", err)
	_, err = b.q.RecoverLeases(ctx, 16, 1)
	s35Invalid(t, err, "")
	_, err = b.q.RecoverLeases(ctx, 0, 100001)
	s35Invalid(t, err, "")
	_, err = b.q.ExpireTTL(ctx, 16, 1)
	s35Invalid(t, err, "")
	_, err = b.q.ExpireTTL(ctx, -1, 1)
	s35Invalid(t, err, "")
	_, err = b.q.ExpireTTL(ctx, 0, 0)
	s35Invalid(t, err, "")
	_, err = b.q.DeadLetters(ctx, "e", "q", 0, 10001)
	s35Invalid(t, err, "")
	_, err = b.q.DeadLetters(ctx, "e", "q", -1, 1)
	s35Invalid(t, err, "")
	_, err = b.q.PurgeDeadLetters(ctx, "e", "q", time.Now(), 10001)
	s35Invalid(t, err, "")
	_, err = b.q.PurgeDeadLetters(ctx, "e", "q", time.Unix(-1, 0), 1)
	s35Invalid(t, err, "")
	for _, w := range []float64{0, 0.0009, 1000.1, math.NaN(), math.Inf(1), -1} {
		s35Invalid(t, b.q.SetWeight(ctx, "e", "q", "k", w), "")
	}
	require.NoError(t, b.q.SetWeight(ctx, "e", "q", "k", runqueue.MinWeight))
	require.NoError(t, b.q.SetWeight(ctx, "e", "q", "k", runqueue.MaxWeight))
	_, err = b.q.Schedule(ctx, "e", "q", 0)
	s35Invalid(t, err, "")
	_, err = b.q.Preview(ctx, "e", "q", 0)
	s35Invalid(t, err, "")
	_, err = b.q.TopLags(ctx, "e", "q", 0)
	s35Invalid(t, err, "")
	_, _, err = b.q.ActiveQueues(ctx, 0)
	s35Invalid(t, err, "")
	require.Error(t, runqueue.QueueRef{Env: "", Queue: "q"}.Validate())
}

// Ack / Nack / ExtendLease godoc: a holder whose lease was recovered gets
// ErrNotInFlight while the run waits to be delivered again, ErrLeaseLost
// once it was.
func TestS35DocsLeaseLost(t *testing.T) {
	for _, on := range []bool{false, true} {
		b := setup(t, redistest.Real(t), func(c *runqueue.Config) { c.VtimeScheduling = on; c.LeaseDuration = time.Second })
		ctx := b.ctx
		enqueue(t, b, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "a", Key: "k"})
		old := s35deq(t, b, 1)
		require.Len(t, old, 1)
		b.clock.Advance(2 * time.Second)
		n, err := b.q.RecoverLeases(ctx, b.q.ShardOf("e"), 10)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		// waiting
		require.ErrorIs(t, b.q.ExtendLease(ctx, old[0], time.Minute), runqueue.ErrNotInFlight)
		_, err = b.q.Nack(ctx, old[0], nil)
		require.ErrorIs(t, err, runqueue.ErrNotInFlight)
		errs, err := b.q.AckMany(ctx, []*runqueue.Run{old[0]})
		require.NoError(t, err)
		require.ErrorIs(t, errs[0], runqueue.ErrNotInFlight)
		require.ErrorIs(t, b.q.Ack(ctx, old[0]), runqueue.ErrNotInFlight)
		// delivered again
		again := s35deq(t, b, 1)
		require.Len(t, again, 1)
		require.Equal(t, 2, again[0].Attempt)
		require.ErrorIs(t, b.q.Ack(ctx, old[0]), runqueue.ErrLeaseLost)
		require.ErrorIs(t, b.q.ExtendLease(ctx, old[0], time.Minute), runqueue.ErrLeaseLost)
		_, err = b.q.Nack(ctx, old[0], nil)
		require.ErrorIs(t, err, runqueue.ErrLeaseLost)
		require.NoError(t, b.q.Ack(ctx, again[0]))
		// Ack of a run that is gone succeeds (idempotent).
		require.NoError(t, b.q.Ack(ctx, again[0]))
		require.NoError(t, b.q.Ack(ctx, old[0]))
	}
}

// MaxAttempts: "negative: none"; default 5: deliveries before dead letter.
// NackResult.Attempt and DeadRun.Attempt ("attempts made + 1").
func TestS35DocsMaxAttempts(t *testing.T) {
	b := setup(t, redistest.Real(t), func(c *runqueue.Config) { c.MaxAttempts = -1 })
	ctx := b.ctx
	enqueue(t, b, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "a"})
	for i := 1; i <= 8; i++ {
		r := s35deq(t, b, 1)
		require.Len(t, r, 1)
		require.Equal(t, i, r[0].Attempt)
		res, err := b.q.Nack(ctx, r[0], &runqueue.NackOptions{RetryAt: b.clock.Now()})
		require.NoError(t, err)
		require.True(t, res.Requeued, "attempt %d", i)
		require.Equal(t, i+1, res.Attempt)
	}

	b = setup(t, redistest.Real(t), nil) // default 5
	enqueue(t, b, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "a"})
	var last runqueue.NackResult
	deliveries := 0
	for {
		r := s35deq(t, b, 1)
		if len(r) == 0 {
			break
		}
		deliveries++
		var err error
		last, err = b.q.Nack(ctx, r[0], &runqueue.NackOptions{RetryAt: b.clock.Now()})
		require.NoError(t, err)
		if !last.Requeued {
			break
		}
	}
	require.Equal(t, 5, deliveries, "MaxAttempts 5 = deliveries before dead letter")
	require.Equal(t, 6, last.Attempt, "the one it died at + 1")
	require.True(t, last.RetryAt.IsZero())
	d, err := b.q.DeadLetter(ctx, "e", "q", "", "a")
	require.NoError(t, err)
	require.Equal(t, 6, d.Attempt, "DeadRun.Attempt: attempts made + 1")
	st, err := b.q.KeyStats(ctx, "e", "q", "")
	require.NoError(t, err)
	require.Zero(t, st.Dead, "KeyStats: Dead is queue and env only")
	qs, err := b.q.QueueStats(ctx, "e", "q")
	require.NoError(t, err)
	require.EqualValues(t, 1, qs.Dead)
	es, err := b.q.EnvStats(ctx, "e")
	require.NoError(t, err)
	require.EqualValues(t, 1, es.Dead)
	// DeleteDeadLetter of a live run: ErrNotFound, left as it is.
	enqueue(t, b, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "live"})
	require.ErrorIs(t, b.q.DeleteDeadLetter(ctx, "e", "q", "", "live"), runqueue.ErrNotFound)
	require.ErrorIs(t, b.q.DeleteDeadLetter(ctx, "e", "q", "other", "a"), runqueue.ErrNotFound)
	_, err = b.q.DeadLetter(ctx, "e", "q", "", "live")
	require.ErrorIs(t, err, runqueue.ErrNotFound)
	qs, err = b.q.QueueStats(ctx, "e", "q")
	require.NoError(t, err)
	require.EqualValues(t, 1, qs.Ready)
	// Redrive: ready now, attempts reset.
	require.NoError(t, b.q.Redrive(ctx, "e", "q", "", "a"))
	require.NoError(t, b.q.Redrive(ctx, "e", "q", "", "a")) // live: succeeds
	rs := s35deq(t, b, 10)
	require.Len(t, rs, 2)
	for _, r := range rs {
		require.Equal(t, 1, r.Attempt, r.ID)
	}
	// Redrive of a run that never existed.
	err = b.q.Redrive(ctx, "e", "q", "", "never")
	t.Logf("Redrive of unknown run: %v", err)
	// DeleteDeadLetter then re-enqueue of the id.
}

// Enqueue godoc: same id with same key and payload is a no-op false,
// another body or key is ErrConflict.
func TestS35DocsIdempotent(t *testing.T) {
	b := setup(t, redistest.Real(t), nil)
	ctx := b.ctx
	ok, err := b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "a", Key: "k", Payload: []byte("p")})
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "a", Key: "k", Payload: []byte("p")})
	require.NoError(t, err)
	require.False(t, ok)
	_, err = b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "a", Key: "k", Payload: []byte("other")})
	require.ErrorIs(t, err, runqueue.ErrConflict)
	_, err = b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "a", Key: "k2", Payload: []byte("p")})
	require.ErrorIs(t, err, runqueue.ErrConflict)
	// Priority/delay differ but same key/payload: documented as no-op.
	ok, err = b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "a", Key: "k", Payload: []byte("p"), Priority: 5})
	t.Logf("same id, other priority: %v %v", ok, err)
	// Depth limits.
	b2 := setup(t, redistest.Real(t), func(c *runqueue.Config) { c.MaxQueueDepth = 1 })
	_, err = b2.q.Enqueue(ctx, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "a"})
	require.NoError(t, err)
	_, err = b2.q.Enqueue(ctx, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "b"})
	var qf *runqueue.QueueFullError
	require.ErrorAs(t, err, &qf)
	require.Equal(t, "queue", qf.Scope)
	require.Equal(t, 1, qf.Limit)
	b3 := setup(t, redistest.Real(t), func(c *runqueue.Config) { c.MaxKeyDepth = 1 })
	_, err = b3.q.Enqueue(ctx, runqueue.EnqueueParams{Env: "e", Queue: "q", Key: "k", ID: "a"})
	require.NoError(t, err)
	_, err = b3.q.Enqueue(ctx, runqueue.EnqueueParams{Env: "e", Queue: "q", Key: "k", ID: "b"})
	require.ErrorAs(t, err, &qf)
	require.Equal(t, "key", qf.Scope)
	require.Equal(t, 1, qf.Limit)
	res, err := b3.q.EnqueueMany(ctx, []runqueue.EnqueueParams{{Env: "e", Queue: "q", Key: "k", ID: "c"}})
	require.NoError(t, err)
	require.ErrorAs(t, res[0].Err, &qf)
	require.Equal(t, 1, qf.Limit, "EnqueueMany's QueueFullError.Limit")
}

// AckAndDequeue godoc: at most 1,000 acks (more: *InvalidError, nothing
// done); every run must belong to env and queue.
func TestS35DocsAckAndDequeue(t *testing.T) {
	b := setup(t, redistest.Real(t), nil)
	ctx := b.ctx
	acks := make([]*runqueue.Run, 1001)
	for i := range acks {
		acks[i] = &runqueue.Run{Env: "e", Queue: "q", ID: "x", Token: 1}
	}
	_, _, err := b.q.AckAndDequeue(ctx, acks, "e", "q", 1)
	s35Invalid(t, err, "acks")
	_, _, err = b.q.AckAndDequeue(ctx, []*runqueue.Run{{Env: "e", Queue: "other", ID: "x", Token: 1}}, "e", "q", 1)
	s35Invalid(t, err, "acks")
	_, _, err = b.q.AckAndDequeue(ctx, nil, "e", "q", 0)
	require.NoError(t, err, "maxCount may be 0")
	_, _, err = b.q.AckAndDequeue(ctx, nil, "e", "q", -1)
	s35Invalid(t, err, "")
}

// ReadOnly godoc: every method that would write returns ErrReadOnly; the
// CLI's read commands rely on the reads working.
func TestS35DocsReadOnly(t *testing.T) {
	for _, on := range []bool{false, true} {
		c := redistest.Real(t)
		b := setup(t, c, func(cfg *runqueue.Config) {
			cfg.VtimeScheduling = on
			cfg.LeaseDuration = time.Second
			cfg.MaxAttempts = 1
		})
		ctx := b.ctx
		enqueue(t, b, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "dead", Key: "k"})
		r := s35deq(t, b, 1)
		_, err := b.q.Nack(ctx, r[0], nil)
		require.NoError(t, err)
		enqueue(t, b, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "held", Key: "k"})
		held := s35deq(t, b, 1)
		require.Len(t, held, 1)
		enqueue(t, b, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "ttl", Key: "k", TTL: time.Second})
		require.NoError(t, b.q.SetWeight(ctx, "e", "q", "k", 2))
		b.clock.Advance(5 * time.Second)
		before := b.dump(t)

		ro, err := runqueue.New(ctx, c, &runqueue.Config{Prefix: b.prefix, Clock: b.clock, ReadOnly: true, VtimeScheduling: on})
		require.NoError(t, err)
		defer ro.Close()
		// Reads work.
		_, err = ro.QueueStats(ctx, "e", "q")
		require.NoError(t, err)
		_, err = ro.KeyStats(ctx, "e", "q", "k")
		require.NoError(t, err)
		_, err = ro.EnvStats(ctx, "e")
		require.NoError(t, err)
		_, err = ro.DeadLetters(ctx, "e", "q", 0, 10)
		require.NoError(t, err)
		_, err = ro.DeadLetter(ctx, "e", "q", "k", "dead")
		require.NoError(t, err)
		_, err = ro.Schedule(ctx, "e", "q", 10)
		require.NoError(t, err)
		_, err = ro.Preview(ctx, "e", "q", 10)
		require.NoError(t, err)
		_, err = ro.TopLags(ctx, "e", "q", 10)
		require.NoError(t, err)
		_, err = ro.Weights(ctx, "e", "q")
		require.NoError(t, err)
		_, _, err = ro.ActiveQueues(ctx, 10)
		require.NoError(t, err)
		// Writes refused.
		_, err = ro.Enqueue(ctx, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "new"})
		require.ErrorIs(t, err, runqueue.ErrReadOnly, "Enqueue")
		res, err := ro.EnqueueMany(ctx, []runqueue.EnqueueParams{{Env: "e", Queue: "q", ID: "new"}})
		if err == nil {
			require.ErrorIs(t, res[0].Err, runqueue.ErrReadOnly, "EnqueueMany")
		} else {
			require.ErrorIs(t, err, runqueue.ErrReadOnly, "EnqueueMany")
		}
		_, err = ro.Dequeue(ctx, "e", "q", 1)
		require.ErrorIs(t, err, runqueue.ErrReadOnly, "Dequeue")
		_, err = ro.DequeueWait(ctx, "e", "q", 1, 10*time.Millisecond)
		require.ErrorIs(t, err, runqueue.ErrReadOnly, "DequeueWait")
		_, err = ro.DequeueShard(ctx, ro.ShardOf("e"), 1)
		require.ErrorIs(t, err, runqueue.ErrReadOnly, "DequeueShard")
		require.ErrorIs(t, ro.Ack(ctx, held[0]), runqueue.ErrReadOnly, "Ack")
		errs, err := ro.AckMany(ctx, held)
		if err == nil {
			require.ErrorIs(t, errs[0], runqueue.ErrReadOnly, "AckMany")
		}
		_, _, err = ro.AckAndDequeue(ctx, held, "e", "q", 1)
		require.ErrorIs(t, err, runqueue.ErrReadOnly, "AckAndDequeue")
		_, err = ro.Nack(ctx, held[0], nil)
		require.ErrorIs(t, err, runqueue.ErrReadOnly, "Nack")
		require.ErrorIs(t, ro.ExtendLease(ctx, held[0], time.Minute), runqueue.ErrReadOnly, "ExtendLease")
		_, err = ro.RecoverLeases(ctx, ro.ShardOf("e"), 10)
		require.ErrorIs(t, err, runqueue.ErrReadOnly, "RecoverLeases")
		_, err = ro.ExpireTTL(ctx, ro.ShardOf("e"), 10)
		require.ErrorIs(t, err, runqueue.ErrReadOnly, "ExpireTTL")
		require.ErrorIs(t, ro.Redrive(ctx, "e", "q", "k", "dead"), runqueue.ErrReadOnly, "Redrive")
		require.ErrorIs(t, ro.DeleteDeadLetter(ctx, "e", "q", "k", "dead"), runqueue.ErrReadOnly, "DeleteDeadLetter")
		_, err = ro.PurgeDeadLetters(ctx, "e", "q", b.clock.Now(), 10)
		require.ErrorIs(t, err, runqueue.ErrReadOnly, "PurgeDeadLetters")
		require.ErrorIs(t, ro.SetWeight(ctx, "e", "q", "k", 3), runqueue.ErrReadOnly, "SetWeight")
		require.ErrorIs(t, ro.ClearWeight(ctx, "e", "q", "k"), runqueue.ErrReadOnly, "ClearWeight")
		_, err = runqueue.NewWorker(ro, func(context.Context, *runqueue.Run) error { return nil },
			&runqueue.WorkerConfig{Queues: []runqueue.WorkerQueue{{Env: "e", Queue: "q"}}})
		t.Logf("NewWorker on read-only: %v", err)
		require.Equal(t, before, b.dump(t), "read-only wrote")
	}
}

func s35deq(t *testing.T, b *testBundle, n int) []*runqueue.Run {
	t.Helper()
	runs, err := b.q.Dequeue(b.ctx, "e", "q", n)
	require.NoError(t, err)
	return runs
}

// Batch 2.
func TestS35DocsMisc(t *testing.T) {
	ctx := t.Context()
	t.Run("ActiveQueues excludes in-flight/dead-only", func(t *testing.T) {
		for _, on := range []bool{false, true} {
			b := setup(t, redistest.Real(t), func(c *runqueue.Config) { c.VtimeScheduling = on; c.MaxAttempts = 1 })
			enqueue(t, b, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "a"})
			enqueue(t, b, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "b"})
			rs := s35deq(t, b, 2)
			require.Len(t, rs, 2)
			_, err := b.q.Nack(ctx, rs[0], nil)
			require.NoError(t, err)
			refs, total, err := b.q.ActiveQueues(ctx, 10)
			require.NoError(t, err)
			require.Empty(t, refs, "on=%v", on)
			require.Zero(t, total, "on=%v", on)
		}
	})
	t.Run("MaxQueueDepth counts queued only", func(t *testing.T) {
		b := setup(t, redistest.Real(t), func(c *runqueue.Config) { c.MaxQueueDepth = 1; c.MaxKeyDepth = 1 })
		enqueue(t, b, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "a"})
		require.Len(t, s35deq(t, b, 1), 1)
		enqueue(t, b, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "b"})
		_, err := b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "c", Delay: time.Hour})
		require.ErrorIs(t, err, runqueue.ErrQueueFull, "delayed counts as queued")
	})
	t.Run("MaxKeyDepth on no-key variant", func(t *testing.T) {
		b := setup(t, redistest.Real(t), func(c *runqueue.Config) { c.MaxKeyDepth = 1 })
		enqueue(t, b, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "a"})
		_, err := b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "b"})
		t.Logf("MaxKeyDepth, second no-key run: %v", err)
	})
	t.Run("LimitsFor negative", func(t *testing.T) {
		b := setup(t, redistest.Real(t), func(c *runqueue.Config) {
			c.LimitsFor = func(env, queue string) runqueue.Limits { return runqueue.Limits{Key: -1} }
		})
		enqueue(t, b, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "a"})
		before := b.dump(t)
		_, err := b.q.Dequeue(ctx, "e", "q", 1)
		s35Invalid(t, err, "Config.LimitsFor")
		_, err = b.q.DequeueWait(ctx, "e", "q", 1, time.Millisecond)
		s35Invalid(t, err, "Config.LimitsFor")
		_, err = b.q.DequeueShard(ctx, b.q.ShardOf("e"), 1)
		s35Invalid(t, err, "Config.LimitsFor")
		require.Equal(t, before, b.dump(t))
		_, err = b.q.Schedule(ctx, "e", "q", 1)
		t.Logf("Schedule with negative LimitsFor: %v", err)
	})
	t.Run("ErrClosed and ctx", func(t *testing.T) {
		b := setup(t, redistest.Real(t), nil)
		c2, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		rs, err := b.q.DequeueWait(c2, "e", "q", 1, time.Second)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Empty(t, rs)
		rs, err = b.q.DequeueWait(ctx, "e", "q", 1, 10*time.Millisecond)
		require.NoError(t, err)
		require.Empty(t, rs)
		require.NoError(t, b.q.Close())
		_, err = b.q.DequeueWait(ctx, "e", "q", 1, 10*time.Millisecond)
		require.ErrorIs(t, err, runqueue.ErrClosed)
		_, err = b.q.DequeueShardWait(ctx, 0, 1, 10*time.Millisecond)
		require.ErrorIs(t, err, runqueue.ErrClosed)
		// "Enqueue, Ack and Dequeue still work after Close"
		enqueue(t, b, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "a"})
		rs = s35deq(t, b, 1)
		require.Len(t, rs, 1)
		require.NoError(t, b.q.Ack(ctx, rs[0]))
	})
	t.Run("weights cap", func(t *testing.T) {
		b := setup(t, redistest.Real(t), func(c *runqueue.Config) { c.MaxWeightOverrides = 1 })
		require.NoError(t, b.q.SetWeight(ctx, "e", "q", "a", 2))
		require.NoError(t, b.q.SetWeight(ctx, "e", "q", "a", 3))
		require.ErrorIs(t, b.q.SetWeight(ctx, "e", "q", "b", 2), runqueue.ErrTooManyWeights)
		require.NoError(t, b.q.ClearWeight(ctx, "e", "q", "a"))
		require.NoError(t, b.q.SetWeight(ctx, "e", "q", "b", 2))
		w, err := b.q.Weights(ctx, "e", "q")
		require.NoError(t, err)
		require.Equal(t, map[string]float64{"b": 2}, w)
		require.NoError(t, b.q.ClearWeight(ctx, "e", "q", "never"))
	})
	t.Run("TopLags flag off empty", func(t *testing.T) {
		b := setup(t, redistest.Real(t), nil)
		enqueue(t, b, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "a", Key: "k"})
		l, err := b.q.TopLags(ctx, "e", "q", 5)
		require.NoError(t, err)
		require.Empty(t, l)
		p, err := b.q.Preview(ctx, "e", "q", 5)
		require.NoError(t, err)
		require.Len(t, p, 1, "Preview with flag off shows the fair order")
	})
	t.Run("Nack RetryAt past is ready; result", func(t *testing.T) {
		b := setup(t, redistest.Real(t), nil)
		enqueue(t, b, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "a"})
		rs := s35deq(t, b, 1)
		past := b.clock.Now().Add(-time.Hour)
		res, err := b.q.Nack(ctx, rs[0], &runqueue.NackOptions{RetryAt: past})
		require.NoError(t, err)
		require.True(t, res.Requeued)
		require.Equal(t, past.UnixMilli(), res.RetryAt.UnixMilli())
		st := queueStatsE(t, b)
		require.EqualValues(t, 1, st.Ready)
		// again with dead letter option
		rs = s35deq(t, b, 1)
		require.Equal(t, 2, rs[0].Attempt)
		res, err = b.q.Nack(ctx, rs[0], &runqueue.NackOptions{DeadLetter: true})
		require.NoError(t, err)
		require.False(t, res.Requeued)
		require.Equal(t, 3, res.Attempt)
		// retried nack returns what the first returned
		res2, err := b.q.Nack(ctx, rs[0], &runqueue.NackOptions{DeadLetter: true})
		require.NoError(t, err)
		require.Equal(t, res, res2)
	})
	t.Run("OldestReadyAge never negative", func(t *testing.T) {
		b := setup(t, redistest.Real(t), nil)
		enqueue(t, b, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "a", Priority: 9})
		st := queueStatsE(t, b)
		require.GreaterOrEqual(t, st.OldestReadyAge, time.Duration(0))
		t.Logf("age with priority 9 just enqueued: %v", st.OldestReadyAge)
		ks, err := b.q.KeyStats(ctx, "e", "q", "")
		require.NoError(t, err)
		t.Logf("key age: %v", ks.OldestReadyAge)
		es, err := b.q.EnvStats(ctx, "e")
		require.NoError(t, err)
		t.Logf("env age: %v", es.OldestReadyAge)
	})
	t.Run("priority never makes available early", func(t *testing.T) {
		b := setup(t, redistest.Real(t), nil)
		enqueue(t, b, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "a", Priority: 9, Delay: time.Minute})
		require.Empty(t, s35deq(t, b, 1))
		b.clock.Advance(time.Minute)
		require.Len(t, s35deq(t, b, 1), 1)
	})
	t.Run("TTL", func(t *testing.T) {
		b := setup(t, redistest.Real(t), nil)
		enqueue(t, b, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "a", TTL: time.Minute, Delay: 2 * time.Minute})
		enqueue(t, b, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "b", TTL: time.Minute})
		rs := s35deq(t, b, 1)
		require.Len(t, rs, 1)
		b.clock.Advance(90 * time.Second)
		n, err := b.q.ExpireTTL(ctx, b.q.ShardOf("e"), 10)
		require.NoError(t, err)
		require.Equal(t, 1, n, "delayed run expired by TTL from enqueue; in-flight not")
		_, err = b.q.Nack(ctx, rs[0], &runqueue.NackOptions{RetryAt: b.clock.Now()})
		require.NoError(t, err)
		b.clock.Advance(time.Hour)
		n, err = b.q.ExpireTTL(ctx, b.q.ShardOf("e"), 10)
		require.NoError(t, err)
		require.Equal(t, 0, n, "a dequeue removes the TTL entry")
	})
	t.Run("Worker misc", func(t *testing.T) {
		b := setup(t, redistest.Real(t), nil)
		h := func(context.Context, *runqueue.Run) error { return nil }
		_, err := runqueue.NewWorker(b.q, h, nil)
		s35Invalid(t, err, "WorkerConfig.Queues")
		_, err = runqueue.NewWorker(b.q, h, &runqueue.WorkerConfig{Shards: []int{16}})
		s35Invalid(t, err, "WorkerConfig.Shards")
		_, err = runqueue.NewWorker(b.q, h, &runqueue.WorkerConfig{Shards: []int{0}, HeartbeatInterval: 5 * time.Minute})
		s35Invalid(t, err, "WorkerConfig.HeartbeatInterval")
		_, err = runqueue.NewWorker(b.q, h, &runqueue.WorkerConfig{Shards: []int{0}, SweepInterval: -1})
		require.NoError(t, err, "negative SweepInterval: no sweeps")
		w, err := runqueue.NewWorker(b.q, h, &runqueue.WorkerConfig{Shards: []int{0}})
		require.NoError(t, err)
		require.NoError(t, w.Shutdown(ctx), "Shutdown of a worker never started returns nil")
	})
}

func queueStatsE(t *testing.T, b *testBundle) runqueue.Stats {
	t.Helper()
	s, err := b.q.QueueStats(b.ctx, "e", "q")
	require.NoError(t, err)
	return s
}

// Config.ReadOnly: "every method that would write returns ErrReadOnly". A
// Worker on a read-only Queue would only write (fetch, ack, sweep).
func TestS35DocsReadOnlyWorker(t *testing.T) {
	c := redistest.Real(t)
	b := setup(t, c, nil)
	enqueue(t, b, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "a"})
	ro, err := runqueue.New(b.ctx, c, &runqueue.Config{Prefix: b.prefix, ReadOnly: true})
	require.NoError(t, err)
	defer ro.Close()
	var logs strings.Builder
	w, err := runqueue.NewWorker(ro, func(context.Context, *runqueue.Run) error { return nil },
		&runqueue.WorkerConfig{Queues: []runqueue.WorkerQueue{{Env: "e", Queue: "q"}},
			Logger: slog.New(slog.NewTextHandler(&s35syncWriter{b: &logs}, nil))})
	if err == nil {
		err = w.Start(context.WithoutCancel(b.ctx))
		time.Sleep(300 * time.Millisecond)
		_ = w.Shutdown(b.ctx)
	}
	t.Logf("log lines: %d; first: %.300s", strings.Count(logs.String(), "\n"), logs.String())
	require.ErrorIs(t, err, runqueue.ErrReadOnly, "NewWorker/Start on a read-only Queue")
}

type s35syncWriter struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (w *s35syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// Package doc: ErrTooLarge (Schedule or Preview of a queue with more than
// MaxInspectVariants keys).
func TestS35DocsTooLarge(t *testing.T) {
	for _, on := range []bool{false, true} {
		b := setup(t, redistest.Real(t), func(c *runqueue.Config) { c.VtimeScheduling = on })
		ps := make([]runqueue.EnqueueParams, 0, runqueue.MaxInspectVariants+1)
		for i := 0; i < runqueue.MaxInspectVariants+10; i++ {
			ps = append(ps, runqueue.EnqueueParams{Env: "e", Queue: "q", Key: fmt.Sprint("k", i), ID: fmt.Sprint(i)})
		}
		res, err := b.q.EnqueueMany(b.ctx, ps)
		require.NoError(t, err)
		for _, r := range res {
			require.NoError(t, r.Err)
		}
		_, err = b.q.Schedule(b.ctx, "e", "q", 1)
		require.ErrorIs(t, err, runqueue.ErrTooLarge, "Schedule on=%v", on)
		_, err = b.q.Preview(b.ctx, "e", "q", 1)
		require.ErrorIs(t, err, runqueue.ErrTooLarge, "Preview on=%v", on)
		if on {
			// a dequeue registers some; then the state holds variants too
			_, err = b.q.Dequeue(b.ctx, "e", "q", 5)
			require.NoError(t, err)
			_, err = b.q.Schedule(b.ctx, "e", "q", 1)
			require.ErrorIs(t, err, runqueue.ErrTooLarge, "Schedule after dequeue")
		}
	}
}

func TestS35DocsShardAndFused(t *testing.T) {
	ctx := t.Context()
	t.Run("DequeueShard serves every env when maxCount >= envs", func(t *testing.T) {
		for _, on := range []bool{false, true} {
			b := setup(t, redistest.Real(t), func(c *runqueue.Config) { c.VtimeScheduling = on; c.Shards = 1 })
			for i := 0; i < 50; i++ {
				enqueue(t, b, runqueue.EnqueueParams{Env: "big", Queue: "q", ID: fmt.Sprint(i)})
			}
			for _, e := range []string{"a", "b", "c", "d"} {
				b.clock.Advance(time.Millisecond)
				enqueue(t, b, runqueue.EnqueueParams{Env: e, Queue: fmt.Sprint("q", e), ID: "x"})
			}
			for call := 0; call < 3; call++ {
				rs, err := b.q.DequeueShard(ctx, 0, 5)
				require.NoError(t, err)
				envs := map[string]int{}
				for _, r := range rs {
					envs[r.Env]++
				}
				t.Logf("on=%v call %d: %v", on, call, envs)
				if call == 0 {
					require.Len(t, envs, 5, "every env served in one call of maxCount >= envs")
				}
			}
		}
	})
	t.Run("AckAndDequeue with refused limits still acks", func(t *testing.T) {
		bad := false
		b := setup(t, redistest.Real(t), func(c *runqueue.Config) {
			c.LimitsFor = func(string, string) runqueue.Limits {
				if bad {
					return runqueue.Limits{Queue: -1}
				}
				return runqueue.Limits{}
			}
		})
		enqueue(t, b, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "a"})
		enqueue(t, b, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "b"})
		rs := s35deq(t, b, 1)
		bad = true
		runs, errs, err := b.q.AckAndDequeue(ctx, rs, "e", "q", 1)
		s35Invalid(t, err, "Config.LimitsFor")
		require.Empty(t, runs)
		require.Len(t, errs, 1)
		require.NoError(t, errs[0])
		st := queueStatsE(t, b)
		require.Zero(t, st.InFlight, "acked")
		require.EqualValues(t, 1, st.Ready)
	})
}

func TestS35DocsLayout(t *testing.T) {
	c := redistest.Real(t)
	ctx := t.Context()
	b := setup(t, c, nil)
	space := keySpace(t, b)
	require.Equal(t, fmt.Sprintf("string:%d", runqueue.LayoutVersion), keyValue(t, c, space.Layout()))
	enqueue(t, b, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "a"})
	require.NoError(t, c.Set(ctx, space.Layout(), "4", 0).Err())
	for _, ro := range []bool{false, true} {
		_, err := runqueue.New(ctx, c, &runqueue.Config{Prefix: b.prefix, ReadOnly: ro})
		var le *runqueue.LayoutError
		require.ErrorAs(t, err, &le, "ro=%v", ro)
		require.ErrorIs(t, err, runqueue.ErrLayout)
		require.Equal(t, "4", le.Found)
		require.Equal(t, runqueue.LayoutVersion, le.Want)
		require.Equal(t, space.Layout(), le.Key)
	}
	require.NoError(t, c.Del(ctx, space.Layout()).Err())
	for _, ro := range []bool{false, true} {
		_, err := runqueue.New(ctx, c, &runqueue.Config{Prefix: b.prefix, ReadOnly: ro})
		var le *runqueue.LayoutError
		require.ErrorAs(t, err, &le, "no version but queued runs: ro=%v", ro)
		require.Equal(t, "", le.Found)
	}
	// Only dead runs and no version.
	b2 := setup(t, c, func(cfg *runqueue.Config) { cfg.MaxAttempts = 1 })
	enqueue(t, b2, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "a"})
	rs, err := b2.q.Dequeue(ctx, "e", "q", 1)
	require.NoError(t, err)
	_, err = b2.q.Nack(ctx, rs[0], nil)
	require.NoError(t, err)
	require.NoError(t, c.Del(ctx, keySpace(t, b2).Layout()).Err())
	_, err = runqueue.New(ctx, c, &runqueue.Config{Prefix: b2.prefix})
	t.Logf("dead-only prefix without version: %v", err)
}

func TestS35DocsWorkerOutcomes(t *testing.T) {
	c := redistest.Real(t)
	var mu sync.Mutex
	outcomes := []runqueue.Outcome{}
	b := setup(t, c, func(cfg *runqueue.Config) {
		cfg.Clock = nil
		cfg.MaxAttempts = 1
		cfg.Observer = s35HandledFunc(func(o runqueue.Outcome) { mu.Lock(); outcomes = append(outcomes, o); mu.Unlock() })
	})
	done := make(chan struct{}, 10)
	w, err := runqueue.NewWorker(b.q, func(ctx context.Context, r *runqueue.Run) error {
		defer func() { done <- struct{}{} }()
		switch r.ID {
		case "err":
			return errors.New("boom")
		case "retryat":
			return runqueue.RetryAfter(errors.New("later"), time.Hour)
		case "noretry":
			return runqueue.NoRetry(errors.New("final"))
		case "panic":
			panic("p")
		}
		return nil
	}, &runqueue.WorkerConfig{Queues: []runqueue.WorkerQueue{{Env: "e", Queue: "q"}}, Concurrency: 4,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	require.NoError(t, w.Start(context.WithoutCancel(b.ctx)))
	for _, id := range []string{"err", "retryat", "noretry", "panic"} {
		_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: id})
		require.NoError(t, err)
	}
	for i := 0; i < 4; i++ {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("timeout")
		}
	}
	time.Sleep(200 * time.Millisecond)
	require.NoError(t, w.Shutdown(b.ctx))
	st, err := b.q.QueueStats(b.ctx, "e", "q")
	require.NoError(t, err)
	t.Logf("stats %+v outcomes %v", st, outcomes)
	// MaxAttempts 1: all four failed at their last attempt: all dead-lettered.
	require.EqualValues(t, 4, st.Dead)
	// A panic reports OutcomePanic whatever became of the run; the others
	// report OutcomeDead when the failure dead-lettered the run.
	require.ElementsMatch(t, []runqueue.Outcome{runqueue.OutcomeDead, runqueue.OutcomeDead, runqueue.OutcomeDead, runqueue.OutcomePanic}, outcomes)
}

type s35HandledFunc func(runqueue.Outcome)

func (f s35HandledFunc) Enqueued(string, string, int)                             {}
func (f s35HandledFunc) Dequeued([]*runqueue.Run, time.Time)                      {}
func (f s35HandledFunc) Acked(string, string, int)                                {}
func (f s35HandledFunc) Nacked(string, string, bool)                              {}
func (f s35HandledFunc) Expired(string, string, int)                              {}
func (f s35HandledFunc) Recovered(string, string, int, int)                       {}
func (f s35HandledFunc) Handled(_, _ string, _ time.Duration, o runqueue.Outcome) { f(o) }

// lifecycle.md "Ages in stats ... they are never negative".
func TestS35DocsAgesNeverNegative(t *testing.T) {
	c := redistest.Real(t)
	for _, on := range []bool{false, true} {
		b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = on })
		b.clock.Advance(time.Hour) // the writer is ahead
		enqueue(t, b, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "a", Key: "k"})
		enqueue(t, b, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "d", Key: "k2", Delay: time.Second})
		reader := newFakeClock()
		r, err := runqueue.New(b.ctx, c, &runqueue.Config{Prefix: b.prefix, Clock: reader, VtimeScheduling: on})
		require.NoError(t, err)
		defer r.Close()
		for _, f := range []func() (runqueue.Stats, error){
			func() (runqueue.Stats, error) { return r.QueueStats(b.ctx, "e", "q") },
			func() (runqueue.Stats, error) { return r.KeyStats(b.ctx, "e", "q", "k") },
			func() (runqueue.Stats, error) { return r.KeyStats(b.ctx, "e", "q", "k2") },
			func() (runqueue.Stats, error) { return r.EnvStats(b.ctx, "e") },
		} {
			s, err := f()
			require.NoError(t, err)
			require.GreaterOrEqual(t, s.OldestReadyAge, time.Duration(0), "%+v", s)
		}
		// reader far ahead: due delayed run counts
		reader.Advance(3 * time.Hour)
		s, err := r.KeyStats(b.ctx, "e", "q", "k2")
		require.NoError(t, err)
		t.Logf("on=%v due delayed key stats: %+v", on, s)
	}
}

// README "Metrics": Watch(q) gives gauges "ready, delayed, in flight, dead".
// A queue whose runs all died (the case a dead-letter alert is for) is not
// discovered (Queue.ActiveQueues lists queues with queued runs only), so
// runqueue_queue_dead_runs has no series for it.
func TestS35DocsMetricsDeadOnlyQueue(t *testing.T) {
	c := redistest.Real(t)
	col, err := metrics.New(nil)
	require.NoError(t, err)
	b := setup(t, c, func(cfg *runqueue.Config) { cfg.MaxAttempts = 1; cfg.Observer = col })
	col.Watch(b.q)
	enqueue(t, b, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "a"})
	rs := s35deq(t, b, 1)
	_, err = b.q.Nack(b.ctx, rs[0], nil)
	require.NoError(t, err)
	st := queueStatsE(t, b)
	require.EqualValues(t, 1, st.Dead)
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(col))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "runqueue_queue_dead_runs" {
			for _, m := range mf.GetMetric() {
				t.Logf("dead gauge %v = %v", m.GetLabel(), m.GetGauge().GetValue())
				found = true
			}
		}
	}
	require.True(t, found, "no runqueue_queue_dead_runs series for a queue holding 1 dead run")
}
