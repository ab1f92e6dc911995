package runqueue_test

// Review s28w: Worker.Start (and the first blocking dequeue) while the
// real redis-server accepts connections but does not answer (SIGSTOP: a
// hung server, a blackholed network path after the dial).

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// s28wHung returns a bundle on its own server, which then stops answering
// until the test ends (or resume is called).
func s28wHung(t *testing.T) (b *testBundle, resume func()) {
	srv := s17Spawn(t)
	c := redis.NewClient(&redis.Options{Addr: srv.addr, ReadTimeout: 3 * time.Second})
	t.Cleanup(func() { _ = c.Close() })
	b = setup(t, c, func(cfg *runqueue.Config) { cfg.Clock = nil })
	require.NoError(t, srv.cmd.Process.Signal(syscall.SIGSTOP))
	stopped := true
	resume = func() {
		if stopped {
			stopped = false
			_ = srv.cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	return b, resume
}

// TestS28WStartHonoursContext: Start's ctx has a 500 ms deadline. Start
// subscribes for wake-ups and waits for the confirmation; on a hung
// server it must give up when its ctx ends (or at the client's read
// timeout, 3 s), not wait for ever. The same holds for the first
// DequeueWait of a Queue (it opens the same subscription), and Close must
// not be held up behind it.
func TestS28WStartHonoursContext(t *testing.T) {
	t.Run("Start", func(t *testing.T) {
		t.Parallel()
		b, resume := s28wHung(t)
		w := newWorker(t, b.q, func(context.Context, *runqueue.Run) error { return nil }, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		errc := make(chan error, 1)
		began := time.Now()
		go func() { errc <- w.Start(ctx) }()
		select {
		case err := <-errc:
			t.Logf("Start returned after %v: %v", time.Since(began).Round(time.Millisecond), err)
			require.Error(t, err)
		case <-time.After(6 * time.Second):
			resume()
			t.Fatal("Start on a hung Redis ignores its context and the read timeout: still blocked after 6s")
		}
	})
	t.Run("DequeueWait", func(t *testing.T) {
		t.Parallel()
		b, resume := s28wHung(t)
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		errc := make(chan error, 1)
		began := time.Now()
		go func() {
			_, err := b.q.DequeueWait(ctx, env, queueName, 1, 10*time.Second)
			errc <- err
		}()
		select {
		case err := <-errc:
			t.Logf("DequeueWait returned after %v: %v", time.Since(began).Round(time.Millisecond), err)
			require.Error(t, err)
		case <-time.After(6 * time.Second):
			closed := make(chan struct{})
			go func() { _ = b.q.Close(); close(closed) }()
			select {
			case <-closed:
			case <-time.After(time.Second):
				t.Error("Queue.Close is blocked behind it too")
			}
			resume()
			t.Fatal("DequeueWait on a hung Redis ignores its context and the read timeout: still blocked after 6s")
		}
	})
}

// TestS28WStartDuringClientPause: as TestS28WStartHonoursContext, with the
// server paused by CLIENT PAUSE ALL (3 s): connections are accepted and
// handshakes may go through, but no command is answered until the pause
// ends. Start's ctx (500 ms) must bound it, or at worst the pause.
func TestS28WStartDuringClientPause(t *testing.T) {
	srv := s17Spawn(t)
	admin := srv.admin()
	c := redis.NewClient(&redis.Options{Addr: srv.addr, ReadTimeout: 10 * time.Second})
	t.Cleanup(func() { _ = c.Close() })
	b := setup(t, c, func(cfg *runqueue.Config) { cfg.Clock = nil })
	w := newWorker(t, b.q, func(context.Context, *runqueue.Run) error { return nil }, nil)
	require.NoError(t, admin.Do(b.ctx, "CLIENT", "PAUSE", "3000", "ALL").Err())
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	began := time.Now()
	err := w.Start(ctx)
	took := time.Since(began)
	t.Logf("Start returned after %v: %v", took.Round(time.Millisecond), err)
	require.Less(t, took, 3500*time.Millisecond)
}
