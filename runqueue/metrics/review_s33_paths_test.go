package metrics_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
	"github.com/runqueue/runqueue/runqueue/metrics"
)

// TestS33BlockingPathsAndStaleSettles: the blocking dequeues count their
// runs; EnqueueMany over several envs counts per env; a settle with a
// stale token (the run recovered meanwhile) counts nothing; the wait
// histogram counts one observation per delivery.
func TestS33BlockingPathsAndStaleSettles(t *testing.T) {
	t.Parallel()
	redistest.ForEachBackend(t, s17Backends, func(t *testing.T, client redis.UniversalClient) {
		b := setup(t, client, metrics.Options{}, func(cfg *runqueue.Config) {
			cfg.LeaseDuration = 10 * time.Second
			cfg.VtimeScheduling = true
		})
		ctx := b.ctx
		var ps []runqueue.EnqueueParams
		for _, env := range []string{"e1", "e2", "e3"} {
			for i := 0; i < 3; i++ {
				ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: "m", ID: fmt.Sprint(i), Key: fmt.Sprint(i % 2)})
			}
		}
		_, err := b.q.EnqueueMany(ctx, ps)
		require.NoError(t, err)
		count := func(name, env string) float64 {
			v, _ := s17Value(s17Gather(t, b.c), "runqueue_runs_"+name+"_total", map[string]string{"env": env, "queue": "m"})
			return v
		}
		for _, env := range []string{"e1", "e2", "e3"} {
			require.Equal(t, 3.0, count("enqueued", env), env)
		}
		w1, err := b.q.DequeueWait(ctx, "e1", "m", 2, time.Second)
		require.NoError(t, err)
		require.Len(t, w1, 2)
		require.Equal(t, 2.0, count("dequeued", "e1"))
		w2, err := b.q.DequeueShardWait(ctx, b.q.ShardOf("e2"), 10, time.Second)
		require.NoError(t, err)
		n2 := 0
		for _, r := range w2 {
			if r.Env == "e2" {
				n2++
			}
		}
		require.Equal(t, float64(n2), count("dequeued", "e2"))

		// Recover w1 (lease passed), then settle it with the stale token.
		b.clock.Advance(11 * time.Second)
		n, err := b.q.RecoverLeases(ctx, b.q.ShardOf("e1"), 100)
		require.NoError(t, err)
		require.GreaterOrEqual(t, n, 2)
		require.Equal(t, 2.0, count("recovered", "e1"))
		before := map[string]float64{}
		for _, c := range []string{"acked", "nacked", "dead_lettered"} {
			before[c] = count(c, "e1")
		}
		require.Error(t, b.q.Ack(ctx, w1[0]))
		_, err = b.q.Nack(ctx, w1[1], nil)
		require.Error(t, err)
		errs, err := b.q.AckMany(ctx, w1)
		require.NoError(t, err)
		for _, e := range errs {
			require.Error(t, e)
		}
		for c, v := range before {
			require.Equal(t, v, count(c, "e1"), c)
		}
		mfs := s17Gather(t, b.c)
		for _, env := range []string{"e1", "e2"} {
			mf := mfs["runqueue_run_wait_seconds"]
			require.NotNil(t, mf)
			var got uint64
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "env" && l.GetValue() == env {
						got += m.GetHistogram().GetSampleCount()
					}
				}
			}
			require.Equal(t, uint64(count("dequeued", env)), got, env)
		}
	})
}
