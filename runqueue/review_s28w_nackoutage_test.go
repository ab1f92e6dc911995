package runqueue_test

// Review s28w: a handler's failure while the real redis-server restarts
// (with its data kept: an upgrade, a failover of a single node).

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// s28wRecorder records the Handled outcomes.
type s28wRecorder struct {
	runqueue.NopObserver
	mu   sync.Mutex
	outs []runqueue.Outcome
}

func (o *s28wRecorder) Handled(_, _ string, _ time.Duration, out runqueue.Outcome) {
	o.mu.Lock()
	o.outs = append(o.outs, out)
	o.mu.Unlock()
}

func (o *s28wRecorder) get() []runqueue.Outcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]runqueue.Outcome(nil), o.outs...)
}

// TestS28WNackDuringRestart: a handler returns NoRetry (a poison run: the
// handler says it must never run again) or RetryAfter(1h) (a rate limit)
// while Redis restarts with its data (4 s down; the lease is 7 s, so it
// does not pass during the outage). An ack in the same spot is kept and
// sent once Redis is back (TestS16WorkerAckDuringOutage); a careful user
// expects the same of the handler's other verdicts: the run dead-lettered,
// or retried in an hour, and in no case run again now.
//
// With a 1.5 s outage it held (go-redis's own retries and dial retries
// bridge it); with 4 s it fails every time (2 of 2 runs, both cases).
//
// Fixed (CHANGES/2026-12-04-worker-outage.md); it failed: Worker.nack (runqueue/worker.go, the w.q.Nack call and
// nackAgain) sends the nack once (go-redis's own retries, about half a
// second, aside); nackAgain retries only refusals of a moving cluster slot
// or a LOADING node (refusedUnrun, runqueue/scripts.go:487), not a
// connection refused. The nack is dropped with a log line, the run stays
// in flight, its lease passes, a sweep requeues it ready now and the
// worker runs it again at once: the poison run runs a second time, and the
// rate-limited one an hour early. The Observer meanwhile reported
// OutcomeDead / OutcomeRetry for a nack that never happened
// (runqueue_handler_duration_seconds{outcome="dead"} counts a run that
// Redis never dead-lettered).
func TestS28WNackDuringRestart(t *testing.T) {
	for _, tc := range []struct {
		name string
		ret  error
	}{
		{"NoRetry", runqueue.NoRetry(errors.New("poison"))},
		{"RetryAfterHour", runqueue.RetryAfter(errors.New("rate limited"), time.Hour)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := s17Spawn(t)
			admin := srv.admin()
			c := redis.NewClient(&redis.Options{Addr: srv.addr, ReadTimeout: 2 * time.Second})
			t.Cleanup(func() { _ = c.Close() })
			o := &s28wRecorder{}
			b := setup(t, c, func(cfg *runqueue.Config) {
				cfg.Clock = nil
				cfg.LeaseDuration = 7 * time.Second
				cfg.Observer = o
			})
			ctx := b.ctx
			started, finish := make(chan struct{}, 10), make(chan struct{})
			var mu sync.Mutex
			var attempts []int
			w := startWorker(t, b.q, func(hctx context.Context, r *runqueue.Run) error {
				mu.Lock()
				attempts = append(attempts, r.Attempt)
				mu.Unlock()
				started <- struct{}{}
				if r.Attempt == 1 {
					<-finish
				}
				return tc.ret
			}, func(wc *runqueue.WorkerConfig) {
				wc.HeartbeatInterval = 2 * time.Second
				wc.SweepInterval = 200 * time.Millisecond
			})
			enqueue(t, b, runqueue.EnqueueParams{ID: "r", Payload: []byte("r")})
			<-started

			require.NoError(t, admin.Save(ctx).Err())
			srv.kill()
			close(finish) // the handler fails while Redis is down
			time.Sleep(4 * time.Second)
			srv.start("--dbfilename", "dump.rdb")
			defer func() { _ = os.Remove(filepath.Join(srv.dir, "dump.rdb")) }()

			time.Sleep(5 * time.Second) // past the lease, with sweeps
			shutdown(t, w)
			mu.Lock()
			got := append([]int(nil), attempts...)
			mu.Unlock()
			st := queueStats(t, b, queueName)
			t.Logf("%s: deliveries %v, outcomes %v, stats %+v", tc.name, got, o.get(), st)
			require.Equal(t, []int{1}, got, "the run ran again after its handler's verdict")
			if tc.name == "NoRetry" {
				require.Equal(t, runqueue.Stats{Dead: 1}, st)
			} else {
				require.Equal(t, runqueue.Stats{Delayed: 1}, st)
			}
		})
	}
}
