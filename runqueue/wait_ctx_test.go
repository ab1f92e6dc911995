package runqueue_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// slowFailingDials, once on, makes each new connection of its client fail
// after a while, as a dial to a server that stopped answering does when
// go-redis's timeouts, not the caller's context, end it.
type slowFailingDials struct {
	nopHook
	on    atomic.Bool
	after time.Duration
}

func (h *slowFailingDials) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if h.on.Load() {
			time.Sleep(h.after)
			return nil, errors.New("dial tcp " + addr + ": i/o timeout")
		}
		return next(ctx, network, addr)
	}
}

// TestWaitCtxErrorFirst: DequeueWait and DequeueShardWait return their
// context's error when it ends first, as documented, also when the
// command they were making fails only after it: here the subscription's
// dial of a Queue's first blocking call, which fails 300 ms after the
// call's 50 ms deadline. (helper-114 met it with CLIENT PAUSE and the
// client's default options: "dial tcp ...: i/o timeout".) Before, they
// returned the dial's error.
func TestWaitCtxErrorFirst(t *testing.T) {
	t.Parallel()
	for _, flag := range []bool{false, true} {
		for _, shard := range []bool{false, true} {
			t.Run(fmt.Sprintf("flag=%v/shard=%v", flag, shard), func(t *testing.T) {
				hook := &slowFailingDials{after: 300 * time.Millisecond}
				c := hookedReal(t, hook)
				q, err := runqueue.New(t.Context(), c, &runqueue.Config{Prefix: redistest.Prefix(t), VtimeScheduling: flag})
				require.NoError(t, err)
				t.Cleanup(func() { _ = q.Close() })
				hook.on.Store(true)
				ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
				defer cancel()
				if shard {
					_, err = q.DequeueShardWait(ctx, 0, 1, time.Minute)
				} else {
					_, err = q.DequeueWait(ctx, "e", "q", 1, time.Minute)
				}
				require.ErrorIs(t, err, context.DeadlineExceeded)
			})
		}
	}
}
