package runqueue_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

var (
	epoch   = time.UnixMilli(0)
	maxTime = time.UnixMilli(runqueue.MaxTimeUnixMilli)
	huge    = time.Duration(math.MaxInt64)
)

// lateClock is a fake clock one hour before the latest accepted time, so
// that now + an ordinary duration leaves the range.
func lateClock() *fakeClock { return &fakeClock{t: maxTime.Add(-time.Hour)} }

// TestTimeRangeRejected calls every entry point that takes a time or a
// duration with a value outside the accepted range and checks the typed
// error, the field it names, and that Redis is unchanged.
func TestTimeRangeRejected(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, nil)
		ctx := b.ctx
		ok, err := b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: "prod", Queue: "q", Key: "k", ID: "held", Payload: []byte("x")})
		require.NoError(t, err)
		require.True(t, ok)
		runs, err := b.q.Dequeue(ctx, "prod", "q", 1)
		require.NoError(t, err)
		require.Len(t, runs, 1)
		held := runs[0]
		ok, err = b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: "prod", Queue: "q", Key: "k", ID: "ready", Payload: []byte("y")})
		require.NoError(t, err)
		require.True(t, ok)

		// A second handle on the same keys whose clock is an hour before
		// the end of the range.
		late, err := runqueue.New(ctx, c, &runqueue.Config{Prefix: b.prefix, Clock: lateClock()})
		require.NoError(t, err)
		t.Cleanup(func() { _ = late.Close() })

		enq := func(q *runqueue.Queue, mut func(*runqueue.EnqueueParams)) func(context.Context) error {
			return func(ctx context.Context) error {
				p := runqueue.EnqueueParams{Env: "prod", Queue: "q", Key: "k", ID: "new", Payload: []byte("z")}
				mut(&p)
				_, err := q.Enqueue(ctx, p)
				return err
			}
		}
		nack := func(at time.Time) func(context.Context) error {
			return func(ctx context.Context) error {
				r := *held
				_, err := b.q.Nack(ctx, &r, &runqueue.NackOptions{RetryAt: at})
				return err
			}
		}
		extend := func(q *runqueue.Queue, d time.Duration) func(context.Context) error {
			return func(ctx context.Context) error {
				r := *held
				return q.ExtendLease(ctx, &r, d)
			}
		}
		newWith := func(mut func(*runqueue.Config)) func(context.Context) error {
			return func(ctx context.Context) error {
				cfg := &runqueue.Config{Prefix: b.prefix, Clock: b.clock}
				mut(cfg)
				nq, err := runqueue.New(ctx, c, cfg)
				if nq != nil {
					_ = nq.Close()
					return errors.New("New returned a Queue with its error")
				}
				return err
			}
		}
		year := func(y int) time.Time { return time.Date(y, 1, 1, 0, 0, 0, 0, time.UTC) }

		cases := []struct {
			name, field string
			call        func(context.Context) error
		}{
			{"Enqueue/AvailableAt/Year300000000", "availableAt", enq(b.q, func(p *runqueue.EnqueueParams) { p.AvailableAt = year(300_000_000) })},
			{"Enqueue/AvailableAt/Year10000", "availableAt", enq(b.q, func(p *runqueue.EnqueueParams) { p.AvailableAt = year(10000) })},
			{"Enqueue/AvailableAt/JustAfterMax", "availableAt", enq(b.q, func(p *runqueue.EnqueueParams) { p.AvailableAt = maxTime.Add(time.Millisecond) })},
			{"Enqueue/AvailableAt/Year1969", "availableAt", enq(b.q, func(p *runqueue.EnqueueParams) { p.AvailableAt = year(1969) })},
			{"Enqueue/AvailableAt/JustBeforeEpoch", "availableAt", enq(b.q, func(p *runqueue.EnqueueParams) { p.AvailableAt = epoch.Add(-time.Nanosecond) })},
			{"Enqueue/AvailableAt/Year1", "availableAt", enq(b.q, func(p *runqueue.EnqueueParams) { p.AvailableAt = year(1).Add(time.Millisecond) })},
			{"Enqueue/Delay/MaxInt64", "delay", enq(b.q, func(p *runqueue.EnqueueParams) { p.Delay = huge })},
			{"Enqueue/Delay/JustAboveMax", "delay", enq(b.q, func(p *runqueue.EnqueueParams) { p.Delay = runqueue.MaxDuration + time.Nanosecond })},
			{"Enqueue/Delay/PastMaxTime", "delay", enq(late, func(p *runqueue.EnqueueParams) { p.Delay = time.Hour + time.Millisecond })},
			{"Enqueue/TTL/MaxInt64", "ttl", enq(b.q, func(p *runqueue.EnqueueParams) { p.TTL = huge })},
			{"Enqueue/TTL/JustAboveMax", "ttl", enq(b.q, func(p *runqueue.EnqueueParams) { p.TTL = runqueue.MaxDuration + time.Nanosecond })},
			{"Enqueue/TTL/PastMaxTime", "ttl", enq(late, func(p *runqueue.EnqueueParams) { p.TTL = time.Hour + time.Millisecond })},
			{"Nack/RetryAt/Year300000000", "retryAt", nack(year(300_000_000))},
			{"Nack/RetryAt/Year10000", "retryAt", nack(year(10000))},
			{"Nack/RetryAt/Year1969", "retryAt", nack(year(1969))},
			{"ExtendLease/Duration/MaxInt64", "duration", extend(b.q, huge)},
			{"ExtendLease/Duration/JustAboveMax", "duration", extend(b.q, runqueue.MaxDuration+time.Nanosecond)},
			{"ExtendLease/Duration/PastMaxTime", "duration", extend(late, time.Hour+time.Millisecond)},
		}
		above := runqueue.MaxDuration + time.Nanosecond
		configs := []struct {
			name, field string
			mut         func(*runqueue.Config)
		}{
			{"MaxInt64", "PriorityStep", func(c *runqueue.Config) { c.PriorityStep = huge }},
			{"JustAboveMax", "PriorityStep", func(c *runqueue.Config) { c.PriorityStep = above }},
			{"MaxInt64", "LeaseDuration", func(c *runqueue.Config) { c.LeaseDuration = huge }},
			{"JustAboveMax", "LeaseDuration", func(c *runqueue.Config) { c.LeaseDuration = above }},
			{"MaxInt64", "BackoffBase", func(c *runqueue.Config) { c.BackoffBase, c.BackoffMax = huge, huge }},
			{"MaxInt64", "BackoffMax", func(c *runqueue.Config) { c.BackoffMax = huge }},
			{"JustAboveMax", "BackoffMax", func(c *runqueue.Config) { c.BackoffMax = above }},
			{"MaxInt64", "StateTTL", func(c *runqueue.Config) { c.StateTTL = huge }},
			{"JustAboveMax", "StateTTL", func(c *runqueue.Config) { c.StateTTL = above }},
			{"MaxInt64", "BlockPollInterval", func(c *runqueue.Config) { c.BlockPollInterval = huge }},
			{"Negative", "BlockPollInterval", func(c *runqueue.Config) { c.BlockPollInterval = -time.Second }},
			{"SubMillisecond", "BlockPollInterval", func(c *runqueue.Config) { c.BlockPollInterval = time.Microsecond }},
		}
		for _, cc := range configs {
			cases = append(cases, struct {
				name, field string
				call        func(context.Context) error
			}{"New/Config/" + cc.field + "/" + cc.name, "Config." + cc.field, newWith(cc.mut)})
		}

		before := b.dump(t)
		require.NotEmpty(t, before)
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				err := tc.call(ctx)
				requireInvalid(t, err, tc.field)
				require.Equal(t, before, b.dump(t), "a rejected call changed Redis")
			})
		}
	})
}

// TestTimeRangeBoundariesAccepted: values at the edges of the range are
// accepted and stored exactly.
func TestTimeRangeBoundariesAccepted(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, nil)
		ctx := b.ctx
		enq := func(p runqueue.EnqueueParams) {
			t.Helper()
			p.Env, p.Queue, p.Payload = "prod", "q", []byte(p.ID)
			ok, err := b.q.Enqueue(ctx, p)
			require.NoError(t, err)
			require.True(t, ok)
		}

		// Latest AvailableAt, top priority: stored to the millisecond, and
		// not delivered now.
		enq(runqueue.EnqueueParams{ID: "latest", AvailableAt: maxTime, Priority: runqueue.MaxPriority})
		require.Contains(t, b.scores(t), float64(runqueue.MaxTimeUnixMilli))
		enq(runqueue.EnqueueParams{ID: "longest", Key: "k", Delay: runqueue.MaxDuration, TTL: runqueue.MaxDuration})
		runs, err := b.q.Dequeue(ctx, "prod", "q", 10)
		require.NoError(t, err)
		require.Empty(t, runs, "runs due at the end of the range were delivered now")

		// The earliest AvailableAt is ready now.
		enq(runqueue.EnqueueParams{ID: "epoch", Key: "e", AvailableAt: epoch, Priority: runqueue.MaxPriority})
		runs, err = b.q.Dequeue(ctx, "prod", "q", 10)
		require.NoError(t, err)
		require.Len(t, runs, 1)
		r := runs[0]
		require.Equal(t, "epoch", r.ID)

		require.NoError(t, b.q.ExtendLease(ctx, r, runqueue.MaxDuration))
		require.Equal(t, b.clock.Now().Add(runqueue.MaxDuration).UnixMilli(), r.LeaseDeadline.UnixMilli())

		// A handle whose clock is an hour before the end: now + 1h is the
		// last millisecond.
		late, err := runqueue.New(ctx, c, &runqueue.Config{Prefix: b.prefix, Clock: lateClock()})
		require.NoError(t, err)
		t.Cleanup(func() { _ = late.Close() })
		require.NoError(t, late.ExtendLease(ctx, r, time.Hour))
		require.Equal(t, maxTime.UnixMilli(), r.LeaseDeadline.UnixMilli())
		ok, err := late.Enqueue(ctx, runqueue.EnqueueParams{Env: "prod", Queue: "q", Key: "late", ID: "late",
			Delay: time.Hour, TTL: time.Hour})
		require.NoError(t, err)
		require.True(t, ok)

		res, err := b.q.Nack(ctx, r, &runqueue.NackOptions{RetryAt: maxTime})
		require.NoError(t, err)
		require.True(t, res.Requeued)
		require.Equal(t, maxTime.UnixMilli(), res.RetryAt.UnixMilli())

		// RetryAt at the epoch: ready at once.
		runs, err = b.q.Dequeue(ctx, "prod", "q", 10)
		require.NoError(t, err)
		require.Empty(t, runs)
		// The zero time.Time (year 1, January 1) still means now.
		enq(runqueue.EnqueueParams{ID: "again", Key: "a", AvailableAt: time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)})
		runs, err = b.q.Dequeue(ctx, "prod", "q", 10)
		require.NoError(t, err)
		require.Len(t, runs, 1)
		res, err = b.q.Nack(ctx, runs[0], &runqueue.NackOptions{RetryAt: epoch})
		require.NoError(t, err)
		require.True(t, res.Requeued)
		runs, err = b.q.Dequeue(ctx, "prod", "q", 10)
		require.NoError(t, err)
		require.Len(t, runs, 1)
		require.Equal(t, "again", runs[0].ID)

		// Every duration of the Config at its maximum: New accepts it and a
		// run goes round (Nack uses the longest backoff).
		longest := setup(t, c, func(cfg *runqueue.Config) {
			cfg.VtimeScheduling = true
			cfg.PriorityStep = runqueue.MaxDuration
			cfg.LeaseDuration = runqueue.MaxDuration
			cfg.BackoffBase = runqueue.MaxDuration
			cfg.BackoffMax = runqueue.MaxDuration
			cfg.StateTTL = runqueue.MaxDuration
			cfg.BlockPollInterval = runqueue.MaxDuration
		})
		ok, err = longest.q.Enqueue(ctx, runqueue.EnqueueParams{Env: "prod", Queue: "q", Key: "k", ID: "r",
			Priority: runqueue.MaxPriority})
		require.NoError(t, err)
		require.True(t, ok)
		runs, err = longest.q.Dequeue(ctx, "prod", "q", 1)
		require.NoError(t, err)
		require.Len(t, runs, 1)
		require.Equal(t, longest.clock.Now().Add(runqueue.MaxDuration).UnixMilli(), runs[0].LeaseDeadline.UnixMilli())
		res, err = longest.q.Nack(ctx, runs[0], nil)
		require.NoError(t, err)
		require.True(t, res.Requeued)
		require.True(t, res.RetryAt.After(longest.clock.Now()))

		// The smallest accepted Config durations.
		_ = setup(t, c, func(cfg *runqueue.Config) {
			cfg.PriorityStep = time.Millisecond
			cfg.LeaseDuration = time.Millisecond
			cfg.BackoffBase = time.Nanosecond // zero means the default
			cfg.BackoffMax = time.Nanosecond
			cfg.StateTTL = time.Second
			cfg.BlockPollInterval = time.Millisecond
		})
	})
}

// scores returns the score of every sorted-set member under the bundle's
// prefix.
func (b *testBundle) scores(t testing.TB) []float64 {
	t.Helper()
	var out []float64
	for _, k := range b.keysUnder(t) {
		typ, err := b.client.Type(b.ctx, k).Result()
		require.NoError(t, err)
		if typ != "zset" {
			continue
		}
		zs, err := b.client.ZRangeWithScores(b.ctx, k, 0, -1).Result()
		require.NoError(t, err)
		for _, z := range zs {
			out = append(out, z.Score)
		}
	}
	return out
}
