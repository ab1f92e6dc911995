package runqueue_test

// Review s28w: what the Observer (and so runqueue/metrics) is told about a
// run whose release at a forced Shutdown could not be sent.

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// TestS28WFailedReleaseOutcome: a handler runs (honouring its context)
// when the server goes away; Shutdown's deadline passes, the release of
// the run fails (Shutdown says so: ErrUnsettled, 1 run), and the handler
// returns on its cancelled context. The run is still in flight in Redis
// and will run again only once its lease passes. OutcomeRetry is
// documented as "handler failed; the run was nacked for a retry", and the
// metric runqueue_handler_duration_seconds{outcome="retry"} reads so; the
// run was not nacked.
//
// Expected: OutcomeLeaseLost (what the worker reports for a result it
// could not settle, as dropAcks and a hard stop do), not OutcomeRetry.
//
// Fixed (CHANGES/2026-12-04-worker-outage.md); it failed (minor, metrics): finishJob (runqueue/worker.go, the
// `j.state.Load() == jobReleased` branch) reports OutcomeRetry for every
// released job, whether or not release() could send its requeue. The same
// holds for a nack that failed (Worker.nack's `case err != nil` branch
// reports the intended outcome): see TestS28WNackDuringRestart.
func TestS28WFailedReleaseOutcome(t *testing.T) {
	srv := s17Spawn(t)
	c := redis.NewClient(&redis.Options{Addr: srv.addr, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = c.Close() })
	o := &s28wRecorder{}
	b := setup(t, c, func(cfg *runqueue.Config) {
		cfg.Clock = nil
		cfg.Observer = o
	})
	started := make(chan struct{})
	w := startWorker(t, b.q, func(hctx context.Context, r *runqueue.Run) error {
		close(started)
		<-hctx.Done()
		time.Sleep(50 * time.Millisecond) // returns after the release was tried
		return hctx.Err()
	}, nil)
	enqueue(t, b, runqueue.EnqueueParams{ID: "r", Payload: []byte("r")})
	waitClosed(t, started)
	srv.kill()
	sctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err := w.Shutdown(sctx)
	require.ErrorIs(t, err, runqueue.ErrUnsettled)
	var ue *runqueue.UnsettledError
	require.ErrorAs(t, err, &ue)
	require.Equal(t, 1, ue.Runs, "the release could not be sent")
	deadline := time.Now().Add(3 * time.Second)
	for len(o.get()) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	require.Equal(t, []runqueue.Outcome{runqueue.OutcomeLeaseLost}, o.get(),
		"a run whose release failed is reported as nacked for a retry")
}
