package runqueue_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// Review of a048fd5 (sweeps count every call past a failed one).
//
// DEFECT (fixed since: sweep, ackMany, and the Worker's release and
// heartbeat read each cmd when runPipelined returns them with an error
// that is not Redis's, as enqueueMany did): that fix covered calls that
// failed with a Redis error, not a pipeline whose connection is lost part
// way (a reply stream cut after some replies were read, a read timeout, a
// cluster node down while another answered). runPipelined then returns
// the cmds with the error, each holding its own answer, but sweep
// returned before its counting loop, and ackMany set every run's error
// and returned before reporting: the runs the answered calls expired,
// recovered or acked were missing from the count and the Observer for
// good (a later sweep or a retried ack finds them gone), and an acked
// run's result was the connection's error.

// cutAfter simulates what go-redis does when a pipeline's reply stream
// breaks after `keep` script replies (pipelineReadCmds: the cmds read keep
// their answers, the rest get the transport error, the pipeline returns
// it): the hook lets the pipeline run, then gives the script cmds after
// the first keep the error io.ErrUnexpectedEOF.
type cutAfter struct {
	armed atomic.Bool
	keep  int
}

func (h *cutAfter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *cutAfter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *cutAfter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if !h.armed.CompareAndSwap(true, false) {
			return err
		}
		seen := 0
		for _, c := range cmds {
			if n := strings.ToLower(c.Name()); n != "evalsha" && n != "fcall" && n != "eval" {
				continue // the cluster's TYPE fences
			}
			if seen++; seen > h.keep {
				c.SetErr(io.ErrUnexpectedEOF)
			}
		}
		return io.ErrUnexpectedEOF
	}
}

// cutClient is a client of c's server with the hook h.
func cutClient(t *testing.T, c redis.UniversalClient, h *cutAfter) redis.UniversalClient {
	o := otherClient(t, c)
	o.AddHook(h)
	return o
}

func TestS25SweepLostConnectionCount(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		t.Run("ExpireTTL", func(t *testing.T) {
			h := &cutAfter{keep: 2}
			b, rec := observed(t, cutClient(t, c, h), nil)
			for i := range 3 {
				enqueue(t, b, runqueue.EnqueueParams{Queue: queueName, Key: "k", ID: fmt.Sprint("r", i),
					TTL: time.Duration(i+1) * time.Second})
			}
			rec.take()
			b.clock.Advance(time.Minute)

			h.armed.Store(true)
			n, err := b.q.ExpireTTL(b.ctx, b.q.ShardOf(env), 100)
			require.ErrorIs(t, err, io.ErrUnexpectedEOF)
			require.Zero(t, queueStats(t, b, queueName).Ready, "all three expired")
			got := rec.take()
			t.Logf("n=%d err=%v observer=%v", n, err, got)
			require.Equal(t, 2, n, "the two calls answered 1 before the reply stream broke are counted")
			assert.Equal(t, []string{"expired env/q 2"}, got, "and reported to the Observer")

			// The next sweep finds nothing left: it could not have reported
			// them.
			n, err = b.q.ExpireTTL(b.ctx, b.q.ShardOf(env), 100)
			require.NoError(t, err)
			t.Logf("next sweep n=%d observer=%v", n, rec.take())
		})
		t.Run("RecoverLeases", func(t *testing.T) {
			h := &cutAfter{keep: 2}
			b, rec := observed(t, cutClient(t, c, h), func(cfg *runqueue.Config) { cfg.LeaseDuration = time.Second })
			for i := range 3 {
				enqueue(t, b, runqueue.EnqueueParams{Queue: queueName, Key: fmt.Sprint("k", i), ID: fmt.Sprint("r", i)})
			}
			require.Len(t, dequeue(t, b, queueName, 3), 3)
			rec.take()
			b.clock.Advance(time.Minute)

			h.armed.Store(true)
			n, err := b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 100)
			require.ErrorIs(t, err, io.ErrUnexpectedEOF)
			s := queueStats(t, b, queueName)
			require.EqualValues(t, 3, s.Ready, "all three were requeued")
			got := rec.take()
			t.Logf("n=%d err=%v observer=%v", n, err, got)
			require.Equal(t, 2, n, "the two calls answered {1, att} before the reply stream broke are counted")
			assert.Equal(t, []string{"recovered env/q 2 dead=0"}, got, "and reported to the Observer")
		})
		t.Run("AckMany", func(t *testing.T) {
			// The same shape in ackMany (leases.go): one call per base
			// queue; the first answered, the second's reply lost.
			h := &cutAfter{keep: 1}
			b, rec := observed(t, cutClient(t, c, h), nil)
			enqueue(t, b, runqueue.EnqueueParams{Queue: "a", Key: "k", ID: "a1"})
			enqueue(t, b, runqueue.EnqueueParams{Queue: "b", Key: "k", ID: "b1"})
			runs := append(dequeue(t, b, "a", 1), dequeue(t, b, "b", 1)...)
			require.Len(t, runs, 2)
			rec.take()

			h.armed.Store(true)
			errs, err := b.q.AckMany(b.ctx, runs)
			require.ErrorIs(t, err, io.ErrUnexpectedEOF)
			require.Zero(t, queueStats(t, b, "a").InFlight, "a1 was acked")
			got := rec.take()
			t.Logf("errs=%v err=%v observer=%v", errs, err, got)
			assert.NoError(t, errs[0], "a1's call answered (acked): its result is nil, not the lost connection's error")
			assert.ErrorIs(t, errs[1], io.ErrUnexpectedEOF, "b1's call did not answer: its result is the connection's error")
			assert.Equal(t, []string{"acked env/a 1"}, got, "the ack a1's call made is reported")

			// The retry the doc invites finds a1 gone ("acked by an earlier
			// call, which counted it"): only the first call could report it.
			errs, err = b.q.AckMany(b.ctx, runs)
			require.NoError(t, err)
			t.Logf("retry errs=%v observer=%v", errs, rec.take())
		})
	})
}
