package metrics_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
	"github.com/runqueue/runqueue/runqueue/metrics"
)

func TestMain(m *testing.M) {
	redistest.LeakCheckMain(m,
		// go-redis keeps a pool reaper per client until the client closes;
		// clients close in t.Cleanup, but the pool goroutine may lag.
		goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"),
	)
}

// backends are miniredis, a real redis-server and a three-node cluster.
var backends = []redistest.Backend{
	{Name: "Mini", Client: redistest.Mini},
	{Name: "Real", Client: redistest.Real},
	{Name: "Cluster", Client: redistest.Cluster},
}

// forEachBackend runs fn as a parallel subtest on each backend.
func forEachBackend(t *testing.T, fn func(t *testing.T, c redis.UniversalClient)) {
	redistest.ForEachBackend(t, backends, fn)
}

// fakeClock is a settable clock: waits and ages come out exact.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// logBuffer collects what a Collector logs; scrapes log from the
// registry's goroutines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// testBundle is a Queue that reports to a Collector, which watches it.
type testBundle struct {
	ctx   context.Context
	clock *fakeClock
	q     *runqueue.Queue
	c     *metrics.Collector
	log   *logBuffer
}

// setup builds a Collector with opts (Logger set to the bundle's buffer)
// and a Queue on client under a fresh prefix that reports to it; mutate,
// when non-nil, edits the Queue's config.
func setup(t testing.TB, client redis.UniversalClient, opts metrics.Options, mutate func(*runqueue.Config)) *testBundle {
	t.Helper()
	b := &testBundle{ctx: context.Background(), clock: &fakeClock{t: time.UnixMilli(2_000_000_000_000)}, log: &logBuffer{}}
	opts.Logger = slog.New(slog.NewTextHandler(b.log, nil))
	c, err := metrics.New(&opts)
	require.NoError(t, err)
	cfg := &runqueue.Config{Prefix: redistest.Prefix(t), Clock: b.clock, Observer: c}
	if mutate != nil {
		mutate(cfg)
	}
	q, err := runqueue.New(b.ctx, client, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	c.Watch(q)
	b.q, b.c = q, c
	return b
}

func (b *testBundle) enqueue(t testing.TB, p runqueue.EnqueueParams) bool {
	t.Helper()
	if p.Env == "" {
		p.Env = "env"
	}
	ok, err := b.q.Enqueue(b.ctx, p)
	require.NoError(t, err)
	return ok
}

func (b *testBundle) dequeue(t testing.TB, queue string, n int) []*runqueue.Run {
	t.Helper()
	runs, err := b.q.Dequeue(b.ctx, "env", queue, n)
	require.NoError(t, err)
	return runs
}

// blackHole is a TCP proxy to a Redis that can stop answering: once
// swallow is set, what clients send is read and dropped, so every command
// waits for a reply that never comes, as with a hung server. With a delay
// (newSlowHole) each chunk of a reply waits that long: a Redis far away,
// or busy, but answering.
type blackHole struct {
	ln      net.Listener
	target  string
	delay   time.Duration
	swallow atomic.Bool
	wg      sync.WaitGroup
	mu      sync.Mutex
	closed  bool // close began: a connection accepted now is closed at once
	conns   []net.Conn
}

func newBlackHole(t testing.TB, target string) *blackHole {
	t.Helper()
	return newSlowHole(t, target, 0)
}

func newSlowHole(t testing.TB, target string, delay time.Duration) *blackHole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	h := &blackHole{ln: ln, target: target, delay: delay}
	h.wg.Add(1)
	go h.accept()
	t.Cleanup(h.close)
	return h
}

func (h *blackHole) addr() string { return h.ln.Addr().String() }

func (h *blackHole) accept() {
	defer h.wg.Done()
	for {
		in, err := h.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", h.target)
		if err != nil {
			_ = in.Close()
			continue
		}
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			_ = in.Close()
			_ = out.Close()
			continue
		}
		h.conns = append(h.conns, in, out)
		h.wg.Add(2)
		h.mu.Unlock()
		go func() {
			defer h.wg.Done()
			buf := make([]byte, 32<<10)
			for {
				n, err := in.Read(buf)
				if err != nil {
					return
				}
				if h.swallow.Load() {
					continue
				}
				if _, err := out.Write(buf[:n]); err != nil {
					return
				}
			}
		}()
		go func() {
			defer h.wg.Done()
			if h.delay == 0 {
				_, _ = io.Copy(in, out)
				return
			}
			buf := make([]byte, 32<<10)
			for {
				n, err := out.Read(buf)
				if err != nil {
					return
				}
				time.Sleep(h.delay)
				if _, err := in.Write(buf[:n]); err != nil {
					return
				}
			}
		}()
	}
}

func (h *blackHole) close() {
	_ = h.ln.Close()
	h.mu.Lock()
	h.closed = true
	for _, c := range h.conns {
		_ = c.Close()
	}
	h.mu.Unlock()
	h.wg.Wait()
}
