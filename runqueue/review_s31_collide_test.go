package runqueue_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// s31Backends: miniredis and the shared real Redis.
var s31Backends = []redistest.Backend{
	{Name: "Mini", Client: redistest.Mini},
	{Name: "Real", Client: redistest.Real},
}

// s31EachFlag runs fn on miniredis and the shared real Redis, flag off and on.
func s31EachFlag(t *testing.T, fn func(t *testing.T, c redis.UniversalClient, on bool)) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			redistest.ForEachBackend(t, s31Backends, func(t *testing.T, c redis.UniversalClient) {
				fn(t, c, on)
			})
		})
	}
}

// A key of the wrong type under a queue's names (README, "Keys runqueue did
// not write"): with each Enqueue a call of its own (Config.SerialCalls),
// only the broken key's run fails; every healthy run is queued and served
// once. (Coalesced, the callers of one script call share its error, and a
// bulk write can leave runs stored but unqueued: the README's known limit,
// seen by this review and not asserted here.)
func TestS31SerialEnqueueScriptErrorConfined(t *testing.T) {
	s31EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		ctx := context.Background()
		b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = on; cfg.SerialCalls = true })
		bad := keySpace(t, b).Env(env).Queue("q").Variant("bad").Ready()
		require.NoError(t, b.client.Set(ctx, bad, "not a zset", 0).Err())
		const n = 40
		for i := range n {
			key := fmt.Sprintf("good-%d", i%3)
			if i == n/2 {
				key = "bad"
			}
			ok, err := b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: env, Queue: "q", Key: key, ID: fmt.Sprint("r", i), Payload: []byte(fmt.Sprint("p", i))})
			if i == n/2 {
				require.Error(t, err)
				continue
			}
			require.NoError(t, err)
			require.True(t, ok)
		}
		runs := dequeue(t, b, "q", 100)
		require.Len(t, runs, n-1)
		ackAll(t, b, runs)
		st := queueStats(t, b, "q")
		require.Zero(t, st.Ready+st.Delayed+st.InFlight, "%+v", st)
	})
}
