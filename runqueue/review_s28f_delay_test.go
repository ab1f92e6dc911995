package runqueue_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/fairness"
	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// TestS28FDelayBurstBehindGatedKeys: guarantee 13 where the due variants
// ahead are at their key limit. 300 keys each hold one run (key limit 1)
// and have 50 delayed runs falling due at t0; key X has one run due 1 ms
// later; key B is backlogged (ready). Dequeue(10) calls, flag on (with a
// flag-off call after every second one in the "mixed" case: those do not
// count). X must gain a ready run within ceil(300 / ScanLimit) + 1 flag-on
// calls (ScanLimit = max(30, 3 x 10) = 30: 11 calls), however many runs
// the gated keys ahead have due; the gated keys' promoted runs must not
// be served past their limit.
func TestS28FDelayBurstBehindGatedKeys(t *testing.T) {
	for _, mode := range []string{"on", "mixed"} {
		t.Run(mode, func(t *testing.T) {
			c := redistest.Real(t)
			ctx := context.Background()
			clock := fairness.NewClock()
			prefix := redistest.Prefix(t)
			var on, off *runqueue.Queue
			for _, flag := range []bool{true, false} {
				cfg := runqueue.Config{Prefix: prefix, VtimeScheduling: flag, Clock: clock, KeyConcurrency: 1}
				q, err := runqueue.New(ctx, c, &cfg)
				require.NoError(t, err)
				t.Cleanup(func() { _ = q.Close() })
				if flag {
					on = q
				} else {
					off = q
				}
			}
			const a, due = 300, 50
			var ks []string
			for i := 0; i < a; i++ {
				ks = append(ks, fmt.Sprintf("d%03d", i))
			}
			s28fEnqueue(t, on, ks, "h")
			held := 0
			for held < a {
				runs, err := on.Dequeue(ctx, s28fEnv, s28fQueue, 100)
				require.NoError(t, err)
				require.NotEmpty(t, runs)
				held += len(runs)
			}
			var ps []runqueue.EnqueueParams
			for _, k := range ks {
				for j := 0; j < due; j++ {
					ps = append(ps, runqueue.EnqueueParams{Env: s28fEnv, Queue: s28fQueue, Key: k,
						ID: fmt.Sprintf("%s-d%d", k, j), Payload: []byte("x"), Delay: time.Second})
				}
			}
			ps = append(ps, runqueue.EnqueueParams{Env: s28fEnv, Queue: s28fQueue, Key: "X", ID: "x",
				Payload: []byte("x"), Delay: time.Second + time.Millisecond})
			for len(ps) > 0 {
				n := min(len(ps), 1000)
				_, err := on.EnqueueMany(ctx, ps[:n])
				require.NoError(t, err)
				ps = ps[n:]
			}
			var b []string
			for j := 0; j < 500; j++ {
				b = append(b, "B")
			}
			s28fEnqueue(t, on, b, "b")
			clock.Advance(2 * time.Second)
			xReady := func() bool {
				n, err := c.ZCard(ctx, s28fQKey(t, on).Variant("X").Ready()).Result()
				require.NoError(t, err)
				return n > 0
			}
			onCalls, at := 0, -1
			xServed := false
			for call := 0; call < 200 && at < 0 && !xServed; call++ {
				q := on
				if mode == "mixed" && call%3 == 2 {
					q = off
				} else {
					onCalls++
				}
				runs, err := q.Dequeue(ctx, s28fEnv, s28fQueue, 10)
				require.NoError(t, err)
				for _, r := range runs {
					require.True(t, r.Key == "B" || r.Key == "X", "gated key %q served past its limit 1", r.Key)
					if r.Key == "X" {
						xServed = true
					}
					require.NoError(t, q.Ack(ctx, r))
				}
				if xServed || xReady() {
					at = onCalls
				}
				clock.Advance(time.Millisecond)
			}
			t.Logf("%s: X gained a ready run at flag-on call %d (bound 11)", mode, at)
			require.Greater(t, at, 0, "X never promoted in 200 calls")
			require.LessOrEqual(t, at, 11, "X's due run not reached within ceil(a/ScanLimit)+1 calls")
		})
	}
}

func s28fQKey(t *testing.T, q *runqueue.Queue) keys.Queue {
	sp, err := keys.NewSpace(q.Config().Prefix, q.Config().Shards)
	require.NoError(t, err)
	return sp.Env(s28fEnv).Queue(s28fQueue)
}
