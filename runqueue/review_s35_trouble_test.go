package runqueue_test

// Review s35 (trouble): Workers processing a steady stream from producers
// while a real redis-server misbehaves: maxmemory reached (noeviction),
// connections killed, the server down for a few seconds (restarted with its
// data), and clients paused. Each test runs flag off and flag on on a
// redis-server of its own (ownServer, eviction_test.go).

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// s35tObs counts what the queue and its worker report.
type s35tObs struct {
	outcomes  sync.Map // runqueue.Outcome -> *atomic.Int64
	recovered atomic.Int64
	acked     atomic.Int64
}

func (o *s35tObs) Enqueued(string, string, int)        {}
func (o *s35tObs) Dequeued([]*runqueue.Run, time.Time) {}
func (o *s35tObs) Acked(_, _ string, n int)            { o.acked.Add(int64(n)) }
func (o *s35tObs) Nacked(string, string, bool)         {}
func (o *s35tObs) Expired(string, string, int)         {}
func (o *s35tObs) Recovered(_, _ string, n, _ int)     { o.recovered.Add(int64(n)) }
func (o *s35tObs) Handled(_, _ string, _ time.Duration, out runqueue.Outcome) {
	v, _ := o.outcomes.LoadOrStore(out, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

func (o *s35tObs) String() string {
	var parts []string
	o.outcomes.Range(func(k, v any) bool {
		parts = append(parts, fmt.Sprintf("%v=%d", k, v.(*atomic.Int64).Load()))
		return true
	})
	sort.Strings(parts)
	return fmt.Sprintf("outcomes{%s} recovered=%d acked=%d", strings.Join(parts, " "), o.recovered.Load(), o.acked.Load())
}

// s35tLog counts log records by message, and keeps the first few of each.
type s35tLog struct {
	mu    sync.Mutex
	count map[string]int
	first map[string]string
}

func (h *s35tLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *s35tLog) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.count == nil {
		h.count, h.first = map[string]int{}, map[string]string{}
	}
	h.count[r.Message]++
	if os.Getenv("S35T_TRACE") != "" {
		var b strings.Builder
		r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
		fmt.Printf("%s %s%s\n", r.Time.Format("05.000"), r.Message, b.String())
	}
	if _, ok := h.first[r.Message]; !ok {
		var b strings.Builder
		r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
		h.first[r.Message] = b.String()
	}
	return nil
}
func (h *s35tLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *s35tLog) WithGroup(string) slog.Handler      { return h }
func (h *s35tLog) n(sub string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for m, c := range h.count {
		if strings.Contains(m, sub) {
			n += c
		}
	}
	return n
}
func (h *s35tLog) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var parts []string
	for m, c := range h.count {
		parts = append(parts, fmt.Sprintf("  %dx %q%s", c, m, h.first[m]))
	}
	sort.Strings(parts)
	return strings.Join(parts, "\n")
}

// s35tCmdCount counts the commands (a pipeline's each) a client sends.
type s35tCmdCount struct{ n atomic.Int64 }

func (h *s35tCmdCount) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *s35tCmdCount) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h *s35tCmdCount) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// s35tRig is one test's server, a producer Queue and a worker Queue (each
// on its own client), the producers and the handler's books.
type s35tRig struct {
	t          *testing.T
	on         bool
	srv        *ownProc
	admin      *redis.Client
	pc, wc     *redis.Client
	pq, wq     *runqueue.Queue
	env, queue string
	prefix     string
	lease      time.Duration
	obs        *s35tObs
	log        *s35tLog
	cmds       *s35tCmdCount

	mu      sync.Mutex
	told    map[string]bool // Enqueue returned true
	errs    map[string]int  // Enqueue errors by first 40 bytes
	handled map[string]int  // handler calls by id
	deliv   map[string][]string
	calls   atomic.Int64

	stopP chan struct{}
	prod  sync.WaitGroup
}

func s35tNew(t *testing.T, on bool, lease time.Duration, copt func(*redis.Options), extra ...string) *s35tRig {
	t.Helper()
	srv := ownServer(t, extra...)
	r := &s35tRig{t: t, on: on, srv: srv, env: "e", queue: "q", obs: &s35tObs{}, log: &s35tLog{},
		cmds: &s35tCmdCount{}, told: map[string]bool{}, errs: map[string]int{}, handled: map[string]int{}, deliv: map[string][]string{},
		stopP: make(chan struct{})}
	r.admin = clientFor(t, &redis.Options{Addr: srv.addr})
	popt := &redis.Options{Addr: srv.addr}
	wopt := &redis.Options{Addr: srv.addr}
	if copt != nil {
		copt(popt)
		copt(wopt)
	}
	r.pc = redis.NewClient(popt)
	r.wc = redis.NewClient(wopt)
	r.wc.AddHook(r.cmds)
	prefix := redistest.Prefix(t)
	r.prefix, r.lease = prefix, lease
	var err error
	ctx := context.Background()
	r.pq, err = runqueue.New(ctx, r.pc, &runqueue.Config{Prefix: prefix, VtimeScheduling: on, LeaseDuration: lease})
	require.NoError(t, err)
	r.wq, err = runqueue.New(ctx, r.wc, &runqueue.Config{Prefix: prefix, VtimeScheduling: on, LeaseDuration: lease,
		Observer: r.obs, BlockPollInterval: 200 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = r.pq.Close()
		_ = r.wq.Close()
		_ = r.pc.Close()
		_ = r.wc.Close()
	})
	return r
}

// produce starts n producers, each enqueueing a run every every, with keys
// k0..k4, until stopProducers.
func (r *s35tRig) produce(n int, every time.Duration, payload int) {
	body := []byte(strings.Repeat("x", payload))
	for p := range n {
		r.prod.Add(1)
		go func() {
			defer r.prod.Done()
			for i := 0; ; i++ {
				select {
				case <-r.stopP:
					return
				default:
				}
				id := fmt.Sprintf("p%d-%d", p, i)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				ok, err := r.pq.Enqueue(ctx, runqueue.EnqueueParams{Env: r.env, Queue: r.queue,
					Key: "k" + strconv.Itoa(i%5), ID: id, Payload: body})
				cancel()
				r.mu.Lock()
				if err == nil && ok {
					r.told[id] = true
				} else if err != nil {
					m := err.Error()
					if len(m) > 40 {
						m = m[:40]
					}
					r.errs[m]++
				}
				r.mu.Unlock()
				if err != nil {
					time.Sleep(10 * time.Millisecond)
				}
				time.Sleep(every)
			}
		}()
	}
}

func (r *s35tRig) stopProducers() {
	close(r.stopP)
	r.prod.Wait()
}

func (r *s35tRig) handler(d time.Duration) runqueue.Handler {
	return func(ctx context.Context, run *runqueue.Run) error {
		r.calls.Add(1)
		r.mu.Lock()
		r.handled[run.ID]++
		r.deliv[run.ID] = append(r.deliv[run.ID], fmt.Sprintf("a%d/t%d@%s lease %s", run.Attempt, run.Token,
			time.Now().Format("05.000"), run.LeaseDeadline.Format("05.000")))
		r.mu.Unlock()
		if d > 0 {
			select {
			case <-time.After(d/2 + rand.N(d)):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
}

func (r *s35tRig) worker(h runqueue.Handler, mod func(*runqueue.WorkerConfig)) *runqueue.Worker {
	wc := &runqueue.WorkerConfig{Queues: []runqueue.WorkerQueue{{Env: r.env, Queue: r.queue}}, Concurrency: 8,
		SweepInterval: 200 * time.Millisecond, IdlePollInterval: 2 * time.Second, Logger: slog.New(r.log)}
	if mod != nil {
		mod(wc)
	}
	w, err := runqueue.NewWorker(r.wq, h, wc)
	require.NoError(r.t, err)
	require.NoError(r.t, w.Start(context.Background()))
	return w
}

// drained waits up to d for the queue to be empty and every run told
// queued to have been handled; it reports the stats it last saw.
func (r *s35tRig) drained(d time.Duration) (runqueue.Stats, []string, time.Duration) {
	began := time.Now()
	var st runqueue.Stats
	var missing []string
	for {
		var err error
		st, err = r.pq.QueueStats(context.Background(), r.env, r.queue)
		missing = missing[:0]
		r.mu.Lock()
		for id := range r.told {
			if r.handled[id] == 0 {
				missing = append(missing, id)
			}
		}
		r.mu.Unlock()
		if err == nil && st.Ready+st.Delayed+st.InFlight == 0 && len(missing) == 0 {
			return st, nil, time.Since(began)
		}
		if time.Since(began) > d {
			sort.Strings(missing)
			return st, missing, time.Since(began)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// books reports told, handler calls, ids handled more than once.
func (r *s35tRig) books() (told, calls, dupIDs, extra int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.handled {
		calls += n
		if n > 1 {
			dupIDs++
			extra += n - 1
		}
	}
	return len(r.told), calls, dupIDs, extra
}

// redeliveries counts the handler calls of a run after its first: at an
// attempt above 1 (a lease recovery), and at attempt 1 again (the run
// queued again).
func (r *s35tRig) redeliveries() (again, reenq int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range r.deliv {
		for _, x := range d[1:] {
			if strings.HasPrefix(x, "a1/") {
				reenq++
			} else {
				again++
			}
		}
	}
	return again, reenq
}

func (r *s35tRig) dupDetail() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for id, d := range r.deliv {
		if len(d) > 1 {
			fmt.Fprintf(&b, "  %s: %v\n", id, d)
		}
	}
	return b.String()
}

func (r *s35tRig) errSummary() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmt.Sprint(r.errs)
}

func (r *s35tRig) usedMemory() int64 {
	info, err := r.admin.Info(context.Background(), "memory").Result()
	require.NoError(r.t, err)
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(r.t, err)
			return n
		}
	}
	r.t.Fatal("no used_memory")
	return 0
}

func (r *s35tRig) finalChecks(st runqueue.Stats, missing []string) {
	t := r.t
	require.Empty(t, missing, "runs told queued never handled (stats %+v)", st)
	require.Zero(t, st.Ready+st.Delayed+st.InFlight, "queue not empty at rest: %+v", st)
	require.Zero(t, st.Dead, "dead-lettered runs: %+v", st)
}

func s35tFlags(t *testing.T, fn func(t *testing.T, on bool)) {
	for _, on := range []bool{false, true} {
		t.Run("flag="+strconv.FormatBool(on), func(t *testing.T) { fn(t, on) })
	}
}

func s35tCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestS35TroubleOOM: producers outpace the workers, then maxmemory is set
// just above used memory (noeviction). Enqueues get OOM; the workers must
// go on dequeuing and acking (the docs: acks, dequeues that serve, lease
// extensions still run on a full Redis), so memory frees and some enqueues
// get through again. Then maxmemory is lifted, producers stop, and
// everything drains: every run told queued handled, stats zero.
func TestS35TroubleOOM(t *testing.T) {
	s35tFlags(t, func(t *testing.T, on bool) {
		r := s35tNew(t, on, 3*time.Second, nil, "--maxmemory-policy", "noeviction")
		w := r.worker(r.handler(6*time.Millisecond), func(wc *runqueue.WorkerConfig) { wc.Concurrency = 4 })
		r.produce(4, time.Millisecond, 300)
		time.Sleep(1500 * time.Millisecond)
		used := r.usedMemory()
		require.NoError(t, r.admin.ConfigSet(context.Background(), "maxmemory", strconv.FormatInt(used+128<<10, 10)).Err())
		// Wait for the first OOM.
		deadline := time.Now().Add(8 * time.Second)
		for !strings.Contains(r.errSummary(), "OOM") && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		require.Contains(t, r.errSummary(), "OOM", "no OOM within 8s (used %d)", used)
		callsAt, fetchFailAt := r.calls.Load(), r.log.n("fetch failed")
		time.Sleep(3 * time.Second)
		callsOOM, fetchFailOOM := r.calls.Load()-callsAt, r.log.n("fetch failed")-fetchFailAt
		stOOM, _ := r.pq.QueueStats(context.Background(), r.env, r.queue)
		t.Logf("flag=%v: maxmemory %d (used %d at set); in 3s at the limit: %d handler calls, %d fetch failures; stats %+v; enqueue errors %s",
			on, used+128<<10, used, callsOOM, fetchFailOOM, stOOM, r.errSummary())
		require.NoError(t, r.admin.ConfigSet(context.Background(), "maxmemory", "0").Err())
		time.Sleep(300 * time.Millisecond)
		r.stopProducers()
		st, missing, took := r.drained(20 * time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		serr := w.Shutdown(ctx)
		told, calls, dups, extra := r.books()
		t.Logf("flag=%v: drained in %v; told %d, handler calls %d, ids run twice+ %d (extra %d); %s; shutdown %v\nlog:\n%s",
			on, took.Round(time.Millisecond), told, calls, dups, extra, r.obs, serr, r.log)
		require.NoError(t, serr)
		r.finalChecks(st, missing)
		require.Positive(t, callsOOM, "workers stopped handling at the memory limit")
		require.LessOrEqual(t, int64(dups), r.obs.recovered.Load(), "duplicates without a lease recovery")
	})
}

// TestS35TroubleClientKill: CLIENT KILL TYPE normal every 50 ms for 4 s
// (and TYPE pubsub every 500 ms) while producers enqueue and a worker
// handles. Then everything must drain, a run may run twice only where a
// lease was recovered, the worker must keep working, and no goroutine may
// remain after Shutdown and Close. Redeliveries at attempt 1 (about 1 in
// 450 runs here, both flags) are not lease recoveries: a coalesced Enqueue
// whose reply was lost with its connection is sent again by go-redis after
// its runs were served and acked, and queues them again
// (TestS35TroubleEnqueueResentAfterAck pins it); this test logs them and
// asserts on the attempt > 1 redeliveries only.
func TestS35TroubleClientKill(t *testing.T) {
	s35tFlags(t, func(t *testing.T, on bool) {
		before := runtime.NumGoroutine()
		r := s35tNew(t, on, 2*time.Second, nil)
		w := r.worker(r.handler(3*time.Millisecond), nil)
		r.produce(3, 2*time.Millisecond, 100)
		time.Sleep(500 * time.Millisecond)
		stopK := make(chan struct{})
		var kills, killed atomic.Int64
		var kwg sync.WaitGroup
		kwg.Add(1)
		go func() {
			defer kwg.Done()
			for i := 0; ; i++ {
				select {
				case <-stopK:
					return
				case <-time.After(50 * time.Millisecond):
				}
				typ := "normal"
				if i%10 == 9 {
					typ = "pubsub"
				}
				n, err := r.admin.Do(context.Background(), "CLIENT", "KILL", "TYPE", typ, "SKIPME", "yes").Int64()
				if err == nil {
					kills.Add(1)
					killed.Add(n)
				}
			}
		}()
		callsAt := r.calls.Load()
		time.Sleep(4 * time.Second)
		close(stopK)
		kwg.Wait()
		callsKill := r.calls.Load() - callsAt
		// The worker keeps working after the storm.
		time.Sleep(500 * time.Millisecond)
		callsAfter := r.calls.Load()
		time.Sleep(500 * time.Millisecond)
		callsAfter = r.calls.Load() - callsAfter
		r.stopProducers()
		st, missing, took := r.drained(15 * time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		serr := w.Shutdown(ctx)
		told, calls, dups, extra := r.books()
		t.Logf("flag=%v: %d kills (%d connections); handler calls during the storm %d, in 500ms after %d; drained in %v; told %d, handler calls %d, ids run twice+ %d (extra %d); %s; enqueue errors %s; shutdown %v\nlog:\n%s",
			on, kills.Load(), killed.Load(), callsKill, callsAfter, took.Round(time.Millisecond), told, calls, dups, extra,
			r.obs, r.errSummary(), serr, r.log)
		require.NoError(t, serr)
		r.finalChecks(st, missing)
		require.Positive(t, callsAfter, "the worker stopped working after the kills")
		t.Logf("duplicates:\n%s", r.dupDetail())
		again, reenq := r.redeliveries()
		t.Logf("flag=%v: deliveries at attempt > 1: %d (lease recoveries %d); runs delivered again at attempt 1 (re-queued by a resent Enqueue, TestS35TroubleEnqueueResentAfterAck): %d",
			on, again, r.obs.recovered.Load(), reenq)
		require.LessOrEqual(t, int64(again), r.obs.recovered.Load(), "redeliveries without a lease recovery")
		// Goroutines: close everything this test opened, then settle.
		_ = r.pq.Close()
		_ = r.wq.Close()
		_ = r.pc.Close()
		_ = r.wc.Close()
		_ = r.admin.Close()
		var now int
		for i := 0; i < 100; i++ {
			runtime.GC()
			if now = runtime.NumGoroutine(); now <= before+1 { // +1: ownServer's cmd.Wait
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if now > before+1 {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Logf("goroutines:\n%s", buf)
		}
		require.LessOrEqual(t, now, before+1, "goroutines left after Shutdown and Close: before %d, after %d", before, now)
	})
}

// TestS35TroubleRestart: the server stops (its data saved first: writes
// paused, SAVE, kill) for 3 s and starts again on the same port with its
// RDB. Measured: the commands the worker's client tries per second during
// the outage and the process CPU (the worker must back off, not spin), the
// time from the restart to the first handler call, and a second worker's
// Shutdown with a 500 ms deadline during the outage. Then everything
// drains.
func TestS35TroubleRestart(t *testing.T) {
	s35tFlags(t, func(t *testing.T, on bool) {
		r := s35tNew(t, on, 6*time.Second, nil)
		w := r.worker(r.handler(3*time.Millisecond), nil)
		w2 := r.worker(r.handler(3*time.Millisecond), func(wc *runqueue.WorkerConfig) { wc.Concurrency = 2 })
		r.produce(2, 3*time.Millisecond, 100)
		time.Sleep(time.Second)
		ctx := context.Background()
		require.NoError(t, r.admin.Do(ctx, "CLIENT", "PAUSE", "5000", "WRITE").Err())
		require.NoError(t, r.admin.Save(ctx).Err())
		r.srv.stop()
		down := time.Now()
		cmd0, cpu0, calls0 := r.cmds.n.Load(), s35tCPU(), r.calls.Load()
		// A second worker stops during the outage, with a deadline.
		sctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		began := time.Now()
		s2err := w2.Shutdown(sctx)
		s2took := time.Since(began)
		cancel()
		time.Sleep(3*time.Second - time.Since(down))
		cmdOut, cpuOut, callsOut := r.cmds.n.Load()-cmd0, s35tCPU()-cpu0, r.calls.Load()-calls0
		outage := time.Since(down)
		require.NoError(t, r.srv.start(t))
		up := time.Now()
		for r.calls.Load() == calls0+callsOut && time.Since(up) < 20*time.Second {
			time.Sleep(5 * time.Millisecond)
		}
		recovered := time.Since(up)
		time.Sleep(500 * time.Millisecond)
		r.stopProducers()
		st, missing, took := r.drained(20 * time.Second)
		sctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		serr := w.Shutdown(sctx)
		told, calls, dups, extra := r.books()
		t.Logf("flag=%v: outage %v: worker client tried %d commands (%.0f/s), process CPU %v (%.0f%%), handler calls %d; second worker's Shutdown(500ms) took %v: %v; first handler call %v after the restart; drained in %v; told %d, handler calls %d, ids run twice+ %d (extra %d); %s; enqueue errors %s; shutdown %v\nlog:\n%s",
			on, outage.Round(time.Millisecond), cmdOut, float64(cmdOut)/outage.Seconds(), cpuOut.Round(time.Millisecond),
			100*cpuOut.Seconds()/outage.Seconds(), callsOut, s2took.Round(time.Millisecond), s2err,
			recovered.Round(time.Millisecond), took.Round(time.Millisecond), told, calls, dups, extra, r.obs, r.errSummary(), serr, r.log)
		require.Less(t, s2took, 2*time.Second, "Shutdown with a 500ms deadline during the outage")
		require.Less(t, float64(cmdOut)/outage.Seconds(), 200.0, "the worker spins during the outage")
		require.NoError(t, serr)
		r.finalChecks(st, missing)
		again, reenq := r.redeliveries()
		t.Logf("flag=%v: deliveries at attempt > 1: %d (lease recoveries %d); delivered again at attempt 1: %d\n%s",
			on, again, r.obs.recovered.Load(), reenq, r.dupDetail())
		require.LessOrEqual(t, int64(again), r.obs.recovered.Load(), "redeliveries without a lease recovery")
	})
}

// TestS35TroublePauseShutdown: CLIENT PAUSE 9000 ALL (S35T_PAUSE_MS) while
// a worker holds runs whose handlers take 1 s; Shutdown with a 300 ms
// deadline. The docs (Worker.Shutdown): "Once ctx has ended, Shutdown
// returns within about a second (shutdownGrace), even when Redis is
// unreachable: ... a Redis call still in flight is cancelled (one blocked
// reading a reply ends at the client's read timeout)". The client's
// ReadTimeout is go-redis's default, 5 s (an earlier reading took it for
// 3 s and the 5 s for a read timeout and a resend: with ReadTimeout 3s the
// same stop takes 3.3 s), so Shutdown returns by about 0.3 + max(1, 5) s.
// It returns 5.0 s after its deadline, flag off and on, with
// ContextTimeoutEnabled (S35T_CTX_TIMEOUT=1) or not: release waits until
// no fetch is in flight (slots.fetchersGone), the fetch that was on its
// way when the pause began is a go-redis call that times out after
// ReadTimeout, ~5 s after it began (S35T_TRACE=1: "worker fetch failed
// ... context canceled" 5.05 s after the pause), and only then is the
// release sent, to fail too. Then, after the pause, the unsettled runs are
// handled again (lease recovery), the queue empty.
func TestS35TroublePauseShutdown(t *testing.T) {
	s35tFlags(t, func(t *testing.T, on bool) {
		r := s35tNew(t, on, 2*time.Second, func(o *redis.Options) {
			o.ContextTimeoutEnabled = os.Getenv("S35T_CTX_TIMEOUT") != ""
		})
		w := r.worker(r.handler(time.Second), nil)
		r.produce(2, 20*time.Millisecond, 100)
		time.Sleep(1500 * time.Millisecond)
		r.stopProducers()
		ctx := context.Background()
		require.NoError(t, r.admin.Do(ctx, "CLIENT", "PAUSE", s35tPauseMS(), "ALL").Err())
		paused := time.Now()
		if os.Getenv("S35T_TRACE") != "" {
			fmt.Printf("%s paused\n", paused.Format("05.000"))
		}
		sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		serr := w.Shutdown(sctx)
		stook := time.Since(paused)
		cancel()
		// The rest is handled by a new worker once the pause ends.
		w2 := r.worker(r.handler(10*time.Millisecond), nil)
		st, missing, took := r.drained(20 * time.Second)
		sctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		s2err := w2.Shutdown(sctx)
		told, calls, dups, extra := r.books()
		t.Logf("flag=%v: Shutdown(300ms) during CLIENT PAUSE took %v: %v; drained in %v; told %d, handler calls %d, ids run twice+ %d (extra %d); %s; second shutdown %v\nlog:\n%s",
			on, stook.Round(time.Millisecond), serr, took.Round(time.Millisecond), told, calls, dups, extra, r.obs, s2err, r.log)
		require.ErrorIs(t, serr, runqueue.ErrUnsettled)
		// Shutdown's doc: shutdownGrace (1 s) past its deadline, or the
		// end of a call blocked reading a reply, at the client's read
		// timeout: 300 ms + the read timeout, and the grace as a margin.
		rt := r.wc.Options().ReadTimeout
		require.Equal(t, 5*time.Second, rt, "go-redis's default ReadTimeout, which the docs quote")
		require.Less(t, stook, 300*time.Millisecond+rt+time.Second, "Shutdown(300ms) during a pause: more than its documented bound past its deadline")
		r.finalChecks(st, missing)
	})
}

// TestS35TroubleHeartbeatGap: handlers that honour their context run 2.5 s
// under a 1.5 s lease (heartbeat every 500 ms); the server goes down for
// 1.2 s (writes paused, SAVE, kill, restart with the RDB), so up to two
// beats in a row fail and a lease may pass before the next one lands; the
// worker's own sweep (every 100 ms) may recover the run and deliver it
// again. Expected (Handler, WorkerConfig.HeartbeatInterval): the first
// delivery's context is cancelled by the next beat that finds the lease
// lost (within about a HeartbeatInterval of the redelivery; another
// instance sweeps right after the restart), its result
// is not acked, and every run is acked once; the queue drains.
func TestS35TroubleHeartbeatGap(t *testing.T) {
	s35tFlags(t, func(t *testing.T, on bool) {
		r := s35tNew(t, on, 1500*time.Millisecond, nil)
		type dl struct {
			id                  string
			attempt             int
			start, end          time.Time
			cancelled, returned bool
		}
		var mu sync.Mutex
		var dls []*dl
		w := r.worker(func(ctx context.Context, run *runqueue.Run) error {
			d := &dl{id: run.ID, attempt: run.Attempt, start: time.Now()}
			r.mu.Lock()
			r.deliv[run.ID] = append(r.deliv[run.ID], fmt.Sprintf("a%d/t%d@%s lease %s", run.Attempt, run.Token,
				time.Now().Format("05.000"), run.LeaseDeadline.Format("05.000")))
			r.mu.Unlock()
			mu.Lock()
			dls = append(dls, d)
			mu.Unlock()
			r.calls.Add(1)
			r.mu.Lock()
			r.handled[run.ID]++
			r.mu.Unlock()
			select {
			case <-time.After(2500 * time.Millisecond):
			case <-ctx.Done():
			}
			mu.Lock()
			d.end, d.cancelled, d.returned = time.Now(), ctx.Err() != nil, true
			mu.Unlock()
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return nil
		}, func(wc *runqueue.WorkerConfig) {
			wc.HeartbeatInterval, wc.SweepInterval, wc.Concurrency = 500*time.Millisecond, 100*time.Millisecond, 16
		})
		r.produce(1, 150*time.Millisecond, 10)
		time.Sleep(1200 * time.Millisecond)
		ctx := context.Background()
		require.NoError(t, r.admin.Do(ctx, "CLIENT", "PAUSE", "5000", "WRITE").Err())
		pausedAt := time.Now()
		require.NoError(t, r.admin.Save(ctx).Err())
		r.srv.stop()
		time.Sleep(s35tGap())
		require.NoError(t, r.srv.start(t))
		ls, err := r.admin.ZRangeWithScores(ctx, "{"+r.prefix+":"+strconv.Itoa(r.pq.ShardOf(r.env))+"}:leases", 0, -1).Result()
		require.NoError(t, err)
		var left []string
		for _, z := range ls {
			left = append(left, fmt.Sprintf("%v", time.Duration(int64(z.Score)-time.Now().UnixMilli())*time.Millisecond))
		}
		t.Logf("flag=%v: %v after the pause began, the leases in flight end in %v", on, time.Since(pausedAt).Round(time.Millisecond), left)
		// Another instance sweeps at once, before the worker's next beat.
		sc := clientFor(t, &redis.Options{Addr: r.srv.addr})
		sq, err := runqueue.New(ctx, sc, &runqueue.Config{Prefix: r.prefix, VtimeScheduling: on, LeaseDuration: r.lease})
		require.NoError(t, err)
		t.Cleanup(func() { _ = sq.Close() })
		swept, err := sq.RecoverLeases(ctx, sq.ShardOf(r.env), 1000)
		require.NoError(t, err)
		t.Logf("flag=%v: the other instance's sweep right after the restart recovered %d runs", on, swept)
		time.Sleep(1500 * time.Millisecond)
		r.stopProducers()
		st, missing, took := r.drained(20 * time.Second)
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		serr := w.Shutdown(sctx)
		mu.Lock()
		defer mu.Unlock()
		byID := map[string][]*dl{}
		for _, d := range dls {
			byID[d.id] = append(byID[d.id], d)
		}
		var overlaps []string
		worst := time.Duration(0)
		for id, ds := range byID {
			for i := 1; i < len(ds); i++ {
				prev, cur := ds[i-1], ds[i]
				if prev.end.After(cur.start) {
					o := prev.end.Sub(cur.start)
					worst = max(worst, o)
					overlaps = append(overlaps, fmt.Sprintf("%s a%d ran on %v into a%d (cancelled %v)", id, prev.attempt,
						o.Round(time.Millisecond), cur.attempt, prev.cancelled))
				}
			}
		}
		told, calls, dups, extra := r.books()
		t.Logf("flag=%v: drained in %v; told %d, handler calls %d, ids run twice+ %d (extra %d); %s; shutdown %v; overlapping deliveries %d, worst %v: %v\nlog:\n%s",
			on, took.Round(time.Millisecond), told, calls, dups, extra, r.obs, serr, len(overlaps), worst, overlaps, r.log)
		if dups > 0 {
			t.Logf("paused at %s; redelivered:\n%s", pausedAt.Format("05.000"), r.dupDetail())
		}
		require.NoError(t, serr)
		r.finalChecks(st, missing)
		for _, o := range overlaps {
			require.Contains(t, o, "cancelled true", "a superseded delivery ran to its end uncancelled")
		}
		require.Less(t, worst, 500*time.Millisecond+300*time.Millisecond, "a lost lease was noticed later than a heartbeat interval")
	})
}

func s35tGap() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("S35T_GAP")); err == nil {
		return d
	}
	return 2200 * time.Millisecond
}

// s35tPauseMS is the CLIENT PAUSE of TestS35TroublePauseShutdown, in ms
// (S35T_PAUSE_MS, default 9000).
func s35tPauseMS() string {
	if v := os.Getenv("S35T_PAUSE_MS"); v != "" {
		return v
	}
	return "9000"
}
