package runqueue_test

// Session 30 review: write calls whose reply comes late (the server asleep
// in DEBUG SLEEP) are resent by go-redis after ReadTimeout, so the script
// runs twice. Each call must end as if it had run once.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

func TestS30ResendAfterTimeout(t *testing.T) {
	t.Parallel()
	// A server of its own: the busy script below must hold no other test.
	admin := redis.NewClient(&redis.Options{Addr: ownRedis(t)})
	t.Cleanup(func() { _ = admin.Close() })
	opts := admin.Options()
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			o := *opts
			// A send times out after 300 ms and is sent again, once
			// (go-redis v9.23 sends a command whose read timed out once
			// more, whatever MaxRetries): the busy script below holds the
			// server for 450 ms of its own clock from about 30 ms before
			// the call, so the first send times out and the second is
			// answered, with 120-150 ms to spare on either side.
			o.ReadTimeout = 300 * time.Millisecond
			o.MaxRetries = 3
			o.MinRetryBackoff, o.MaxRetryBackoff = time.Millisecond, 2*time.Millisecond
			c := redis.NewClient(&o)
			t.Cleanup(func() { _ = c.Close() })
			b := setup(t, c, func(cfg *runqueue.Config) {
				cfg.VtimeScheduling = on
				cfg.SerialCalls = true
				cfg.MaxAttempts = 3
			})
			ctx := b.ctx
			// late runs f while the server is busy for a few hundred ms, so that its
			// first send times out and go-redis sends it again.
			late := func(f func()) {
				done := make(chan struct{})
				go func() {
					defer close(done)
					// A busy script holds the server like DEBUG SLEEP (which
					// Redis 7 refuses by default), for 450 ms by the server's
					// clock.
					err := admin.Eval(context.Background(), busyScript, nil, 450).Err()
					if err != nil {
						t.Errorf("busy script: %v", err)
					}
				}()
				// (waited for even when f fails the test: no t.Errorf of
				// the goroutine after the test's end)
				defer func() { <-done }()
				time.Sleep(30 * time.Millisecond)
				f()
			}
			for i := 0; i < 6; i++ {
				enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: fmt.Sprintf("r%d", i)})
			}
			runs := dequeue(t, b, queueName, 6)
			require.Len(t, runs, 6)
			byID := map[string]*runqueue.Run{}
			for _, r := range runs {
				byID[r.ID] = r
			}
			// Nack to dead letter, twice sent.
			late(func() {
				res, err := b.q.Nack(ctx, byID["r0"], &runqueue.NackOptions{DeadLetter: true})
				require.NoError(t, err)
				require.False(t, res.Requeued)
			})
			for _, id := range []string{"r1", "r2"} {
				_, err := b.q.Nack(ctx, byID[id], &runqueue.NackOptions{DeadLetter: true})
				require.NoError(t, err)
			}
			// Nack to retry, twice sent.
			late(func() {
				res, err := b.q.Nack(ctx, byID["r3"], &runqueue.NackOptions{RetryAt: b.clock.Now().Add(time.Hour)})
				require.NoError(t, err)
				require.True(t, res.Requeued)
				require.Equal(t, 2, res.Attempt)
			})
			late(func() { require.NoError(t, b.q.ExtendLease(ctx, byID["r4"], time.Hour)) })
			late(func() { require.NoError(t, b.q.SetWeight(ctx, env, queueName, "k", 3)) })
			late(func() { require.NoError(t, b.q.Redrive(ctx, env, queueName, "k", "r0")) })
			st := queueStats(t, b, queueName)
			require.Equal(t, runqueue.Stats{Ready: 1, Delayed: 1, InFlight: 2, Dead: 2}, st, "after redrive")
			late(func() {
				errs, err := b.q.AckMany(ctx, []*runqueue.Run{byID["r4"], byID["r5"]})
				require.NoError(t, err)
				require.Equal(t, []error{nil, nil}, errs)
			})
			st = queueStats(t, b, queueName)
			require.Equal(t, runqueue.Stats{Ready: 1, Delayed: 1, Dead: 2}, st)
			w, err := b.q.Weights(ctx, env, queueName)
			require.NoError(t, err)
			require.Equal(t, map[string]float64{"k": 3}, w)
			// Purge one of the two dead runs, sent more than once: no more
			// than the limit goes. The caller hears of the send that
			// answered: 1, or 0 when a first send had deleted the run (as
			// README's "Timeouts and go-redis's retries" says).
			late(func() {
				n, err := b.q.PurgeDeadLetters(ctx, env, queueName, b.clock.Now(), 1)
				require.NoError(t, err)
				require.Contains(t, []int{0, 1}, n)
			})
			st = queueStats(t, b, queueName)
			require.Equal(t, int64(1), st.Dead, "PurgeDeadLetters(limit 1) sent more than once deleted %d dead runs", 2-st.Dead)
		})
	}
}

// busyScript holds the server for ARGV[1] ms by its own clock.
const busyScript = `
local t = redis.call('TIME')
local stop = t[1] * 1000 + t[2] / 1000 + ARGV[1]
repeat
  t = redis.call('TIME')
until t[1] * 1000 + t[2] / 1000 >= stop
return 1`
