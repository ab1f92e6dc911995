package runqueue_test

// Review s29: a full Redis (maxmemory, noeviction) and a flag-on dequeue run
// by EVALSHA (Config.ScriptsOnly, or New's fallback when FUNCTION LOAD is
// refused for memory) while the queue's ready runs have no scheduler tag
// (written by a flag-off instance, or the state expired past StateTTL).

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// Probe (held): a flag-on Dequeue on the full Redis serves as the flag-off
// one does, although discovery registers (ZADD to ckVtime) before
// dq_finish: the state's start deletes a stray ckVtime first (a write, so
// Redis lets the rest of the EVALSHA script through).
func TestS29OOMUntaggedBacklog(t *testing.T) {
	for _, tc := range []struct {
		name        string
		on          bool
		scriptsOnly bool
	}{
		{"vtime=false", false, true},
		{"vtime=true/ScriptsOnly", true, true},
		{"vtime=true/FunctionLoadRefused", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := s17Spawn(t)
			admin := srv.admin()
			ctx := context.Background()
			// A flag-off producer (EVALSHA only: no library loaded).
			b := setup(t, admin, func(cfg *runqueue.Config) { cfg.ScriptsOnly = true })
			const n = 300
			payload := []byte(strings.Repeat("p", 1000))
			for i := range n {
				enqueue(t, b, runqueue.EnqueueParams{ID: fmt.Sprint("r", i), Key: fmt.Sprint("k", i%5), Payload: payload})
			}
			used := s28wUsedMemory(t, admin)
			require.NoError(t, admin.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used-30_000, 10)).Err())
			t.Cleanup(func() { _ = admin.ConfigSet(context.Background(), "maxmemory", "0").Err() })
			_, err := b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, ID: "more", Payload: payload})
			require.ErrorContains(t, err, "OOM", "Redis is full")

			q, err := runqueue.New(ctx, admin, &runqueue.Config{Prefix: b.prefix, Clock: b.clock,
				VtimeScheduling: tc.on, ScriptsOnly: tc.scriptsOnly})
			require.NoError(t, err, "New on a full Redis")
			t.Cleanup(func() { _ = q.Close() })
			var errs []string
			served := 0
			for range 5 {
				runs, err := q.Dequeue(ctx, env, queueName, 10)
				if err != nil {
					errs = append(errs, err.Error())
					continue
				}
				for _, r := range runs {
					require.NoError(t, q.Ack(ctx, r))
				}
				served += len(runs)
			}
			require.Empty(t, errs, "dequeues on the full Redis failed")
			require.Equal(t, 50, served)
		})
	}
}
