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

// s16bBlockScripts blocks the first script pipeline/call sent while armed
// until release is closed, and says when it is blocked.
type s16bBlockScripts struct {
	armed   *atomic.Bool
	blocked chan struct{}
	release chan struct{}
}

func (h s16bBlockScripts) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h s16bBlockScripts) maybe(cmds ...redis.Cmder) {
	for _, c := range cmds {
		if n := strings.ToLower(c.Name()); n == "evalsha" || n == "eval" || n == "fcall" {
			if h.armed.CompareAndSwap(true, false) {
				close(h.blocked)
				<-h.release
			}
			return
		}
	}
}

func (h s16bBlockScripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.maybe(cmd)
		return next(ctx, cmd)
	}
}

func (h s16bBlockScripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.maybe(cmds...)
		return next(ctx, cmds)
	}
}

// A coalesced Enqueue whose send is stalled (taken by a sender) and whose
// caller's ctx is cancelled keeps waiting (keepTaken); Close during it
// waits for the send too; an Enqueue after Close began goes on its own.
// Once the send goes, every call returns: the first with its real result
// (queued), nothing blocked for ever, the run queued once.
func TestS16BEnqueueKeepTakenStalledSendAndClose(t *testing.T) {
	t.Parallel()
	m, _ := redistest.MiniServer(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	h := s16bBlockScripts{armed: new(atomic.Bool), blocked: make(chan struct{}), release: make(chan struct{})}
	c.AddHook(h)
	b := setup(t, c, nil)
	h.armed.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	type res struct {
		ok  bool
		err error
	}
	first := make(chan res, 1)
	go func() {
		ok, err := b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, ID: "r"})
		first <- res{ok, err}
	}()
	waitClosed(t, h.blocked)
	cancel()
	select {
	case r := <-first:
		t.Fatalf("the caller returned %+v while its run's send was still pending", r)
	case <-time.After(100 * time.Millisecond):
	}
	closed := make(chan error, 1)
	go func() { closed <- b.q.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned %v with a send pending", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(h.release)
	select {
	case r := <-first:
		require.NoError(t, r.err)
		require.True(t, r.ok, "the run was queued, and its caller is told so")
	case <-time.After(5 * time.Second):
		t.Fatal("the caller is still blocked after its send went")
	}
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Close is blocked")
	}
	ok, err := b.q.Enqueue(context.Background(), runqueue.EnqueueParams{Env: env, Queue: queueName, ID: "r"})
	require.NoError(t, err, "after Close an Enqueue goes on its own")
	require.False(t, ok, "an idempotent retry")
	require.Equal(t, int64(1), queueStats(t, b, queueName).Ready)
}
