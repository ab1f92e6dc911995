package runqueue_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
	"github.com/runqueue/runqueue/vtime"
)

// Regressions from the review of the release rule (a freed slot un-gates
// whatever the limit is now). The fused acks of dequeue_vtime looked only
// when the call had a key limit, on the claim that the call's un-gating
// would return the rest; the capacity return (TestReleaseAfterLimitFlap,
// AckAndDequeue0) and the promote phase come before that un-gating.

// TestReviewFusedAckPromoteSeesGatedTop: the same call promotes a delayed
// run of a new key n. x (gated, tag 1) was un-gated by the call's ack, so
// it is the top of the competition: n queues as the lane's head at 2 and
// x is served, as in the model (Ack, then Dequeue). The Lua used to
// promote n while x was still gated: n found no top, registered at V = 0
// and was served.
func TestReviewFusedAckPromoteSeesGatedTop(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b, key := limitFlipSetup(t, c)
		m := vtime.New(vtime.Config{Limits: vtime.Limits{Key: 1}})
		for i := 0; i < 2; i++ {
			id := "x" + strconv.Itoa(i)
			reviewEnqueue(t, b, "x", id)
			now := b.clock.Now().UnixMilli()
			require.NoError(t, m.Enqueue(id, "x", 0, now, now))
		}
		runs, err := b.q.Dequeue(b.ctx, reviewEnv, reviewQueue, 1)
		require.NoError(t, err)
		require.Len(t, runs, 1)
		require.Len(t, m.Dequeue(1, b.clock.Now().UnixMilli()), 1)

		// n's run becomes due later.
		now := b.clock.Now().UnixMilli()
		ok, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: reviewEnv, Queue: reviewQueue, Key: "n", ID: "n0",
			Payload: []byte("n0"), Delay: 5 * time.Second})
		require.NoError(t, err)
		require.True(t, ok)
		require.NoError(t, m.Enqueue("n0", "n", 0, now+5000, now))
		b.clock.Advance(5 * time.Second)

		key.Store(0)
		m.SetLimits(vtime.Limits{})
		next, errs, err := b.q.AckAndDequeue(b.ctx, []*runqueue.Run{runs[0]}, reviewEnv, reviewQueue, 1)
		require.NoError(t, err)
		require.NoError(t, errs[0])
		require.NoError(t, m.Ack(runs[0].ID))
		want := m.Dequeue(1, b.clock.Now().UnixMilli())
		require.Len(t, want, 1)
		require.Len(t, next, 1)
		require.Equal(t, want[0].Key, next[0].Key, "AckAndDequeue serves what Ack then Dequeue serve in the model")
		got, _, err := b.q.SchedulerSnapshot(b.ctx, reviewEnv, reviewQueue)
		require.NoError(t, err)
		requireSameScheduler(t, m.Snapshot(), got, "after AckAndDequeue")
	})
}

// TestReviewAckOnInstanceWithoutKeyLimit: an instance that has never
// given a queue a per-key limit spares its acks the look for a gated
// variant (vtime/doc.go, Gating), so its ack frees x's slot as a flag-off
// one would: x is not served at once, and the gated probe of the instance
// with the limit comes to it within a lap of as many calls as there are
// gated keys (y, z, x: the third call).
func TestReviewAckOnInstanceWithoutKeyLimit(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		a := setup(t, c, func(cfg *runqueue.Config) {
			cfg.VtimeScheduling = true
			cfg.KeyConcurrency = 1
		})
		other, err := runqueue.New(a.ctx, c, &runqueue.Config{Prefix: a.prefix, Clock: a.clock, VtimeScheduling: true})
		require.NoError(t, err)
		defer other.Close()
		for _, k := range []string{"y", "z", "x"} {
			for i := 0; i < 3; i++ {
				reviewEnqueue(t, a, k, k+strconv.Itoa(i))
			}
		}
		runs, err := a.q.Dequeue(a.ctx, reviewEnv, reviewQueue, 3)
		require.NoError(t, err)
		require.Equal(t, []string{"y", "z", "x"}, []string{runs[0].Key, runs[1].Key, runs[2].Key})
		require.NoError(t, other.Ack(a.ctx, runs[2]))
		var served []string
		for call := 0; call < 3; call++ {
			next, err := a.q.Dequeue(a.ctx, reviewEnv, reviewQueue, 1)
			require.NoError(t, err)
			for _, r := range next {
				served = append(served, strconv.Itoa(call)+":"+r.Key)
			}
		}
		require.Equal(t, []string{"2:x"}, served, "the probe comes to x at the third call, not before")
	})
}
