package runqueue_test

// Review s28w: Shutdown while the real redis-server does not answer
// (SIGSTOP: connections open, no reply), and what is left afterwards.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// TestS28WShutdownRedisHung: one handler has finished (its ack not yet
// sent) and one runs (honouring its context) when the server stops
// answering. Shutdown with a 300 ms deadline must return within the
// deadline + shutdownGrace + the client's read timeout (1 s here), with an
// *UnsettledError counting both runs and matching DeadlineExceeded; no
// goroutine may be left. Once the server answers again, a second worker's
// sweep gives both runs back and they are handled and acked: nothing is
// lost or stuck.
func TestS28WShutdownRedisHung(t *testing.T) {
	defer redistest.VerifyNoLeaks(t, goleak.IgnoreCurrent())
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			srv := s17Spawn(t)
			c := redis.NewClient(&redis.Options{Addr: srv.addr, ReadTimeout: time.Second, WriteTimeout: time.Second})
			t.Cleanup(func() { _ = c.Close() })
			b, _ := workerSetup(t, c, func(cfg *runqueue.Config) {
				cfg.VtimeScheduling = on
				cfg.Clock = nil
				cfg.LeaseDuration = 1500 * time.Millisecond
			})
			ctx := b.ctx
			startedA, startedB, finishA := make(chan struct{}), make(chan struct{}), make(chan struct{})
			w := startWorker(t, b.q, func(hctx context.Context, r *runqueue.Run) error {
				if r.ID == "a" {
					close(startedA)
					<-finishA
					return nil
				}
				close(startedB)
				<-hctx.Done()
				return hctx.Err()
			}, func(wc *runqueue.WorkerConfig) { wc.HeartbeatInterval = 200 * time.Millisecond })
			enqueue(t, b, runqueue.EnqueueParams{ID: "a", Key: "ka", Payload: []byte("a")})
			enqueue(t, b, runqueue.EnqueueParams{ID: "b", Key: "kb", Payload: []byte("b")})
			waitClosed(t, startedA)
			waitClosed(t, startedB)

			require.NoError(t, srv.cmd.Process.Signal(syscall.SIGSTOP))
			stopped := true
			cont := func() {
				if stopped {
					_ = srv.cmd.Process.Signal(syscall.SIGCONT)
					stopped = false
				}
			}
			t.Cleanup(cont)
			close(finishA) // its ack cannot go
			time.Sleep(100 * time.Millisecond)

			sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			began := time.Now()
			errc := make(chan error, 1)
			go func() { errc <- w.Shutdown(sctx) }()
			var err error
			select {
			case err = <-errc:
			case <-time.After(8 * time.Second):
				cont()
				t.Fatal("Shutdown hangs while Redis does not answer")
			}
			took := time.Since(began)
			t.Logf("Shutdown took %v: %v", took.Round(time.Millisecond), err)
			require.Less(t, took, 3500*time.Millisecond, "Shutdown past deadline + grace + read timeout")
			require.ErrorIs(t, err, runqueue.ErrUnsettled)
			require.ErrorIs(t, err, context.DeadlineExceeded)
			var ue *runqueue.UnsettledError
			require.True(t, errors.As(err, &ue))
			require.Equal(t, 2, ue.Runs, "the unsent ack and the failed release")
			cont()

			// Another worker, sweeping, gives both back after their leases.
			var mu sync.Mutex
			seen := map[string][]int{}
			done := make(chan struct{}, 10)
			w2 := startWorker(t, b.q, func(hctx context.Context, r *runqueue.Run) error {
				mu.Lock()
				seen[r.ID] = append(seen[r.ID], r.Attempt)
				mu.Unlock()
				done <- struct{}{}
				return nil
			}, func(wc *runqueue.WorkerConfig) { wc.SweepInterval = 100 * time.Millisecond })
			// b (released or recovered) runs again; a runs again unless its
			// ack, written to the socket before the timeout, ran once Redis
			// answered again (a timed-out call may still have run).
			deadline := time.Now().Add(8 * time.Second)
			for {
				mu.Lock()
				_, gotB := seen["b"]
				mu.Unlock()
				st := queueStats(t, b, queueName)
				if gotB && st == (runqueue.Stats{}) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("runs left by the hung shutdown never came back: %v, stats %+v", seen, st)
				}
				time.Sleep(50 * time.Millisecond)
			}
			shutdown(t, w2)
			mu.Lock()
			defer mu.Unlock()
			t.Logf("after the outage: %v", seen)
			require.Equal(t, []int{2}, seen["b"])
			if a, ok := seen["a"]; ok {
				require.Equal(t, []int{2}, a)
			}
			require.Len(t, done, len(seen))
		})
	}
}
