package runqueue_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/fairness"
	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// TestS28FPriorityHeadStartBounded: priority is a bounded head start
// (docs/design.md section 1; ready score = available_at - priority x
// PriorityStep). Key K holds one run at priority 0 enqueued at t0; then
// every call enqueues one run at priority 9 to K and one to M, advances
// the clock 10 s and dequeues one run (the backlog grows). With
// PriorityStep 30 s, the runs that rank before K's old run are the
// 2 x 27 enqueued before t0 + 270 s; K's own such runs are 27, and K gets
// every other serve within the lag bound (equal weights: |n_K - n_M| <=
// 2), so the old run must be served by call 2 x 28 + 2 = 58, flag on, flag
// off, and with the two instances alternating every 2 calls.
func TestS28FPriorityHeadStartBounded(t *testing.T) {
	for _, mode := range []string{"on", "off", "mixed"} {
		t.Run(mode, func(t *testing.T) {
			c := redistest.Real(t)
			ctx := context.Background()
			clock := fairness.NewClock()
			prefix := redistest.Prefix(t)
			on, off := s28fPair(t, c, runqueue.Config{Prefix: prefix, Clock: clock, PriorityStep: 30 * time.Second})
			enq := func(key, id string, prio int) {
				_, err := on.Enqueue(ctx, runqueue.EnqueueParams{Env: s28fEnv, Queue: s28fQueue, Key: key, ID: id,
					Payload: []byte("x"), Priority: prio})
				require.NoError(t, err)
			}
			enq("K", "old", 0)
			served := -1
			for call := 0; call < 120 && served < 0; call++ {
				clock.Advance(10 * time.Second)
				enq("K", fmt.Sprintf("k%d", call), runqueue.MaxPriority)
				enq("M", fmt.Sprintf("m%d", call), runqueue.MaxPriority)
				q := on
				switch {
				case mode == "off", mode == "mixed" && (call/2)%2 == 1:
					q = off
				}
				runs, err := q.Dequeue(ctx, s28fEnv, s28fQueue, 1)
				require.NoError(t, err)
				require.Len(t, runs, 1, "call %d served nothing", call)
				require.NoError(t, q.Ack(ctx, runs[0]))
				if runs[0].ID == "old" {
					served = call
				}
			}
			t.Logf("%s: the priority-0 run was served at call %d", mode, served)
			require.GreaterOrEqual(t, served, 0, "the priority-0 run was starved for 120 calls")
			require.LessOrEqual(t, served, 58, "the priority-0 run waited past its head-start bound")
		})
	}
}
