package runqueue_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// failPipelines, once on, fails every pipeline of its client as a lost
// connection would (the Worker's heartbeat sends its lease extensions in
// one), without sending it.
// With hang on too, a pipeline fails only when its context ends, as one
// held by a paused Redis or a client redialling a server that is down.
type failPipelines struct {
	nopHook
	on, hang atomic.Bool
}

func (h *failPipelines) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !h.on.Load() {
			return next(ctx, cmds)
		}
		err := errors.New("dial tcp: connect: connection refused")
		if h.hang.Load() {
			<-ctx.Done()
			err = ctx.Err()
		}
		for _, c := range cmds {
			c.SetErr(err)
		}
		return err
	}
}

// TestWorkerLeaseRunsOutUnextended: while a Worker cannot reach Redis to
// extend a lease, its handler runs on until the lease would run out before
// the next beat, and then its context is cancelled (the outcome is
// OutcomeLeaseLost), before a sweep elsewhere may deliver the run again.
// By the clock (Config.Clock within a beat of the deadline) and by
// monotonic time (the clock standing still). helper-115 met it with a Redis
// killed for longer than the lease: the handler kept running beside the
// run's next delivery. Before, the Worker only cancelled on a lease found
// lost, so these handlers were never cancelled.
func TestWorkerLeaseRunsOutUnextended(t *testing.T) {
	t.Parallel()
	for _, byClock := range []bool{true, false} {
		t.Run(fmt.Sprintf("byClock=%v", byClock), func(t *testing.T) {
			hook := &failPipelines{}
			c := hookedReal(t, hook)
			lease := 10 * time.Second
			if !byClock {
				lease = 1500 * time.Millisecond
			}
			o := newS16Observer()
			b := setup(t, c, func(cfg *runqueue.Config) { cfg.LeaseDuration = lease; cfg.Observer = o })
			started := make(chan struct{})
			cancelled := make(chan struct{})
			w := startWorker(t, b.q, func(ctx context.Context, _ *runqueue.Run) error {
				close(started)
				<-ctx.Done()
				close(cancelled)
				return ctx.Err()
			}, func(wc *runqueue.WorkerConfig) {
				wc.Concurrency = 1
				wc.HeartbeatInterval = 50 * time.Millisecond
				wc.SweepInterval = -1
				wc.Logger = quietLogger
			})
			enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
			waitClosed(t, started)
			hook.on.Store(true)
			if byClock {
				// Within the lease: beats fail, the handler runs on.
				b.clock.Advance(lease / 2)
				select {
				case <-cancelled:
					t.Fatal("cancelled while its lease still ran")
				case <-time.After(300 * time.Millisecond):
				}
				// Within one beat of its deadline, not past it: the next
				// beat would come too late to extend it.
				b.clock.Advance(lease/2 - 30*time.Millisecond)
			}
			select {
			case <-cancelled:
			case <-time.After(10 * time.Second):
				t.Fatal("the handler's context was not cancelled after its lease ran out unextended")
			}
			require.Equal(t, runqueue.OutcomeLeaseLost, o.next(t))
			hook.on.Store(false)
			shutdown(t, w)
		})
	}
}

// TestWorkerLeaseRunsOutWhileABeatHangs: a beat whose pipeline does not
// answer (a paused Redis; a client redialling a server that is down, as
// go-redis does for a second and more) must not hold the lapse check past
// the lease's end. CI met it (TestS35TroubleHeartbeatGap): a beat that
// began within the lease failed after it had run out, judged the lease
// by the time it began, and the handler ran on beside the run's next
// delivery. Before, a beat waited on its calls for as long as the Worker
// ran, so here the handler was never cancelled.
func TestWorkerLeaseRunsOutWhileABeatHangs(t *testing.T) {
	t.Parallel()
	hook := &failPipelines{}
	hook.hang.Store(true)
	c := hookedReal(t, hook)
	lease := 1500 * time.Millisecond
	o := newS16Observer()
	b := setup(t, c, func(cfg *runqueue.Config) { cfg.LeaseDuration = lease; cfg.Observer = o })
	started := make(chan struct{})
	cancelled := make(chan struct{})
	w := startWorker(t, b.q, func(ctx context.Context, _ *runqueue.Run) error {
		close(started)
		<-ctx.Done()
		close(cancelled)
		return ctx.Err()
	}, func(wc *runqueue.WorkerConfig) {
		wc.Concurrency = 1
		wc.HeartbeatInterval = 500 * time.Millisecond
		wc.SweepInterval = -1
		wc.Logger = quietLogger
	})
	enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
	waitClosed(t, started)
	hook.on.Store(true)
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler's context was not cancelled while its beats hung past the lease")
	}
	require.Equal(t, runqueue.OutcomeLeaseLost, o.next(t))
	hook.on.Store(false)
	shutdown(t, w)
}
