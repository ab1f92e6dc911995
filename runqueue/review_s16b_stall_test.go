package runqueue_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// s16bSlowScripts delays the reply of every script call while on is set
// (after Redis ran it, before the caller sees it).
type s16bSlowScripts struct {
	on    *atomic.Bool
	delay time.Duration
}

func (h s16bSlowScripts) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h s16bSlowScripts) slow(cmds ...redis.Cmder) {
	if !h.on.Load() {
		return
	}
	for _, c := range cmds {
		if n := strings.ToLower(c.Name()); n == "evalsha" || n == "eval" || n == "fcall" {
			time.Sleep(h.delay)
			return
		}
	}
}

func (h s16bSlowScripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.slow(cmd)
		return err
	}
}

func (h s16bSlowScripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.slow(cmds...)
		return err
	}
}

// An idle worker (its last look found the queue empty, so it waits up to
// IdlePollInterval) is woken by an enqueue and fetches; while that fetch's
// reply is on its way, a second run is enqueued from another process (its
// PUBLISH reaches the worker during the call). The worker has free slots:
// the second run must start within about BlockPollInterval.
//
// DEFECT (pre-existing: the same test fails on HEAD without the working-
// tree change; found while probing it), fixed since: the wake-up consumed while the call
// is in flight only sets l.idle = false (fetchLoop.wait, `case <-l.wake`);
// when the short call returns, fetchLoop.finish sets l.idle = true again
// and, in the `len(c.runs) > 0` case, arms the BlockPollInterval timer only
// `if l.lookC == nil` -- but lookC still holds the IdlePollInterval timer
// armed by the earlier empty look. The second run then waits, ready, with
// free slots, for up to IdlePollInterval (1 minute by default).
func TestS16BWakeDuringFetchIsLost(t *testing.T) {
	t.Parallel()
	m, _ := redistest.MiniServer(t)
	var on atomic.Bool
	wc := redis.NewClient(&redis.Options{Addr: m.Addr()})
	wc.AddHook(s16bSlowScripts{on: &on, delay: 300 * time.Millisecond})
	t.Cleanup(func() { _ = wc.Close() })
	b := setup(t, wc, nil)
	// The producer: another client, another Queue on the same prefix.
	pc := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = pc.Close() })
	producer, err := runqueue.New(context.Background(), pc, b.cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = producer.Close() })

	started := make(chan string, 10)
	gate := make(chan struct{})
	defer close(gate) // before the worker's Shutdown (a Cleanup)
	startWorker(t, b.q, func(ctx context.Context, r *runqueue.Run) error {
		started <- r.ID
		select {
		case <-gate:
		case <-ctx.Done():
		}
		return nil
	}, func(c *runqueue.WorkerConfig) { c.Concurrency = 4 }) // IdlePollInterval: the default 1m
	time.Sleep(200 * time.Millisecond) // the worker's first look found nothing (ordering only)
	on.Store(true)
	_, err = producer.Enqueue(context.Background(), runqueue.EnqueueParams{Env: env, Queue: queueName, ID: "first"})
	require.NoError(t, err)
	time.Sleep(100 * time.Millisecond) // the worker's fetch of "first" is in flight (its reply delayed)
	_, err = producer.Enqueue(context.Background(), runqueue.EnqueueParams{Env: env, Queue: queueName, ID: "second"})
	require.NoError(t, err)
	require.Equal(t, "first", <-started)
	select {
	case id := <-started:
		require.Equal(t, "second", id)
	case <-time.After(4 * time.Second): // BlockPollInterval is 1s
		t.Fatalf("the second run is ready, the worker has 3 free slots, yet it was not fetched within 4s: %+v",
			queueStats(t, b, queueName))
	}
}
