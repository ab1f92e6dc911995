package runqueue_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// TestWorkerNackWhileRedisBusy: a handler's NoRetry verdict reaches Redis
// while another client's script runs past busy-reply-threshold, so Redis
// answers the nack BUSY without running it. The nack is sent again once
// the script ends: the poison run is dead-lettered once and never runs a
// second time (before the fix, the Worker dropped the nack with a log
// line, the run stayed in flight, its lease passed and a sweep gave it
// back to the handler).
func TestWorkerNackWhileRedisBusy(t *testing.T) {
	s17Flags(t, func(t *testing.T, on bool) {
		srv := s17Spawn(t)
		admin := srv.admin()
		ctx := context.Background()
		// (lua-time-limit: busy-reply-threshold's older name, which Redis 7 keeps)
		require.NoError(t, admin.ConfigSet(ctx, "lua-time-limit", "100").Err())
		c := redis.NewClient(&redis.Options{Addr: srv.addr})
		t.Cleanup(func() { _ = c.Close() })
		var busyNacks atomic.Int64 // calls naming the run that Redis answered BUSY
		c.AddHook(afterEach(func(cmd redis.Cmder, err error) {
			if err != nil && strings.HasPrefix(err.Error(), "BUSY ") && strings.Contains(fmt.Sprint(cmd.Args()...), "poison") {
				busyNacks.Add(1)
			}
		}))
		o := &s28wRecorder{}
		b := setup(t, c, func(cfg *runqueue.Config) {
			cfg.Clock = nil
			cfg.VtimeScheduling = on
			cfg.LeaseDuration = 8 * time.Second
			cfg.Observer = o
		})
		var calls atomic.Int64
		gate := make(chan struct{})
		var once sync.Once
		t.Cleanup(func() { once.Do(func() { close(gate) }) })
		w := startWorker(t, b.q, func(context.Context, *runqueue.Run) error {
			if calls.Add(1) == 1 {
				<-gate
			}
			return runqueue.NoRetry(errors.New("poison"))
		}, func(wc *runqueue.WorkerConfig) {
			wc.HeartbeatInterval = time.Second
			wc.SweepInterval = 200 * time.Millisecond
		})
		enqueue(t, b, runqueue.EnqueueParams{ID: "poison", Payload: []byte("p")})
		require.Eventually(t, func() bool { return calls.Load() == 1 }, 10*time.Second, 5*time.Millisecond)

		// Another client's script busy for 3 s; the handler returns once
		// Redis answers BUSY.
		busy := make(chan error, 1)
		go func() {
			busy <- admin.Eval(ctx, `local t = redis.call('TIME')
local s = t[1] * 1000000 + t[2]
while true do
  local n = redis.call('TIME')
  if n[1] * 1000000 + n[2] - s > 3000000 then return 1 end
end`, nil).Err()
		}()
		probe := redis.NewClient(&redis.Options{Addr: srv.addr, MaxRetries: -1})
		t.Cleanup(func() { _ = probe.Close() })
		require.Eventually(t, func() bool {
			err := probe.Ping(ctx).Err()
			return err != nil && strings.HasPrefix(err.Error(), "BUSY ")
		}, 5*time.Second, 10*time.Millisecond, "Redis never answered BUSY")
		once.Do(func() { close(gate) })
		require.NoError(t, <-busy)

		// Dead-lettered (once the script ended, by the nack sent again; or,
		// as before the fix, by the handler's second run after a sweep).
		require.Eventually(t, func() bool { return queueStats(t, b, queueName).Dead == 1 }, 15*time.Second, 20*time.Millisecond)
		shutdown(t, w)
		require.Positive(t, busyNacks.Load(), "the nack never met BUSY: the test did not test")
		require.EqualValues(t, 1, calls.Load(), "the poison run ran again")
		require.Equal(t, []runqueue.Outcome{runqueue.OutcomeDead}, o.get())
		require.Equal(t, runqueue.Stats{Dead: 1}, queueStats(t, b, queueName))
	})
}
