package runqueue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Handler runs one run. Return nil to ack it; an error to nack it for a
// retry after Queue.Backoff; NoRetry(err) (or an error wrapping ErrNoRetry)
// to dead-letter it; RetryAt(err, t) or RetryAfter(err, d) to retry it
// then. A panic is recovered, logged with its stack and nacked like an
// error; so is a call of runtime.Goexit (t.FailNow, say), which ends that
// handler goroutine: another takes its place. ctx ends when the run's
// lease is lost (an extension refused: another delivery may be running
// it; stop, the result is ignored), when its lease may run out unextended
// (extensions failing or unanswered: stop; nil still acks the run,
// NoRetry still dead-letters it, and another error gives it back, ready
// now or at the time a RetryAt or RetryAfter asks, never dead-lettered
// for it, unless it was delivered again meanwhile: see
// WorkerConfig.HeartbeatInterval),
// when Shutdown gives up waiting, or when the Worker's Start context
// ends.
type Handler func(ctx context.Context, r *Run) error

// WorkerQueue names a base queue a Worker serves.
type WorkerQueue struct {
	Env, Queue string
}

// WorkerConfig configures a Worker. The zero value of every field but
// Queues and Shards means its default.
type WorkerConfig struct {
	// Queues are the base queues the worker serves. Each is fetched with
	// AckAndDequeue, so the acks of finished runs ride on the next fetch.
	Queues []WorkerQueue
	// Shards are whole shards the worker serves: every queue of every env
	// whose ShardOf is one of them, fetched with DequeueShard (acks are
	// sent with AckMany, batched per queue). Queues and Shards may both
	// be set; at least one must be.
	Shards []int

	// Concurrency is how many handlers run at once. The worker never holds
	// more runs than this: a fetch asks for at most its free slots.
	// Defaults to 100.
	Concurrency int

	// HeartbeatInterval is how often the worker extends the leases of its
	// running handlers, all in one pipeline, to now + Config.LeaseDuration.
	// A beat extends every lease that is more than half an interval old,
	// by Config.Clock (against the lease's deadline) or by the monotonic
	// time since its fetch or last extension: a step of the clock,
	// backwards or forwards, never stops the beats, and a lost lease shows
	// at the next one. A handler whose extension failed is cancelled when
	// its lease would run out before the next beat, and one whose lease no
	// extension has answered (a paused or unreachable Redis) a quarter
	// interval before it runs out (less for an interval above
	// Config.LeaseDuration / 2), so before another instance may deliver its
	// run again; either run is still extended, and acked (or, after an
	// error, made ready again now or at the time a RetryAt or RetryAfter
	// asks, never dead-lettered for it; after NoRetry, dead-lettered) when
	// its handler returns, if the lease held. Must be less than 2/3 of
	// Config.LeaseDuration (a run fetched just after a beat waits up to 1.5
	// intervals for its first extension: above that its lease would run
	// out, Redis healthy or not, and the run be delivered again while it
	// runs; NewWorker refuses it with ErrInvalid); at most
	// Config.LeaseDuration / 2 leaves Redis time to answer an extension.
	// Defaults to Config.LeaseDuration / 3.
	HeartbeatInterval time.Duration

	// SweepInterval is the mean time between two sweeps of the shards the
	// worker serves (those of Shards and of the envs of Queues): each
	// sweep recovers runs whose lease passed (RecoverLeases) and expires
	// queued runs whose TTL passed (ExpireTTL). Each wait is drawn at
	// random from [SweepInterval/2, 3*SweepInterval/2), so many workers do
	// not sweep in step; any number of them may sweep the same shard.
	// Negative means no sweeps. Defaults to 30s.
	SweepInterval time.Duration
	// SweepLimit is the limit of each RecoverLeases and ExpireTTL call; a
	// sweep calls again while a call returns its limit. Defaults to 1000.
	SweepLimit int

	// IdlePollInterval is the longest a worker waits for a wake-up when a
	// queue (or shard) has nothing at all: a safety net for a wake-up
	// lost while the pub/sub connection reconnects. An enqueue wakes the
	// worker at once through pub/sub, a delayed run at its time, and work
	// held by concurrency limits is looked at every
	// Config.BlockPollInterval (and at the time of other delayed work due
	// sooner, once a poll while such looks serve nothing: see
	// Queue.DequeueWait). Defaults to 1m.
	IdlePollInterval time.Duration

	// Logger receives handler failures, panics (with their stacks), lost
	// leases and Redis errors. Defaults to slog.Default().
	Logger *slog.Logger
}

func (c *WorkerConfig) withDefaults(qc *Config) WorkerConfig {
	out := WorkerConfig{}
	if c != nil {
		out = *c
	}
	setDefault(&out.Concurrency, 100)
	setDefault(&out.HeartbeatInterval, qc.LeaseDuration/3)
	setDefault(&out.SweepInterval, 30*time.Second)
	setDefault(&out.SweepLimit, 1000)
	setDefault(&out.IdlePollInterval, time.Minute)
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out
}

func (c *WorkerConfig) validate(q *Queue) error {
	if len(c.Queues) == 0 && len(c.Shards) == 0 {
		return invalid("WorkerConfig.Queues", "a worker needs Queues or Shards")
	}
	for _, wq := range c.Queues {
		if err := checkQueue(wq.Env, wq.Queue); err != nil {
			return &InvalidError{Field: "WorkerConfig.Queues", Reason: err.Error()}
		}
	}
	for _, s := range c.Shards {
		if s < 0 || s >= q.Shards() {
			return invalid("WorkerConfig.Shards", "%d is outside 0..%d", s, q.Shards()-1)
		}
	}
	switch {
	case c.Concurrency < 1 || c.Concurrency > 1_000_000:
		return invalid("WorkerConfig.Concurrency", "%d is outside 1..1000000", c.Concurrency)
	case c.HeartbeatInterval <= 0 || c.HeartbeatInterval >= q.cfg.LeaseDuration || // (3 x a huge one overflows)
		3*c.HeartbeatInterval >= 2*q.cfg.LeaseDuration:
		return invalid("WorkerConfig.HeartbeatInterval", "%v must be positive and less than 2/3 of Config.LeaseDuration (%v): "+
			"a run fetched just after a beat waits up to 1.5 intervals for its lease's first extension",
			c.HeartbeatInterval, q.cfg.LeaseDuration)
	case c.SweepLimit < 1 || c.SweepLimit > 100000:
		return invalid("WorkerConfig.SweepLimit", "%d is outside 1..100000", c.SweepLimit)
	case c.IdlePollInterval < time.Millisecond:
		return invalid("WorkerConfig.IdlePollInterval", "%v is below 1ms", c.IdlePollInterval)
	}
	return nil
}

// Worker runs a Handler over the runs of some base queues or whole
// shards, up to WorkerConfig.Concurrency at a time, on a fixed pool of
// handler goroutines. It fetches with the fused AckAndDequeue: one round
// trip carries the acks of the runs that finished and asks for as many
// runs as it has free slots (while a queue has a backlog, two such calls
// may be in flight, so that Redis and the worker work at the same time).
// It waits for work without polling (pub/sub wake-ups, as DequeueWait),
// extends the leases of running handlers, and sweeps expired leases and
// TTLs of the shards it serves in the background.
//
// # Usage
//
//	w, err := runqueue.NewWorker(q, func(ctx context.Context, r *runqueue.Run) error {
//		return send(ctx, r.Payload) // nil acks; an error retries with backoff
//	}, &runqueue.WorkerConfig{
//		Queues:      []runqueue.WorkerQueue{{Env: "prod", Queue: "emails"}},
//		Concurrency: 50,
//	})
//	if err != nil { ... }
//	if err := w.Start(context.WithoutCancel(ctx)); err != nil { ... }
//	<-ctx.Done() // a signal, say
//	stop, cancel := context.WithTimeout(context.Background(), 30*time.Second)
//	defer cancel()
//	err = w.Shutdown(stop) // waits for handlers, then releases the rest
//
// # Delivery
//
// Delivery is at least once. Every run a worker takes ends acked, nacked
// (retried or dead-lettered) or released by Shutdown; a run whose worker
// died is recovered by any worker's sweep once its lease passes, and runs
// again. A handler whose lease was lost (an extension refused: the run was
// recovered) has its context cancelled and its result ignored; one whose
// lease may run out unextended (extensions failing or unanswered) has its
// context cancelled and its result kept, the delivery token refusing it
// if the run was delivered again (OutcomeLeaseLost).
type Worker struct {
	q       *Queue
	handler Handler
	cfg     WorkerConfig
	log     *slog.Logger
	obs     Observer
	sources []*source
	shards  []int     // swept
	fetchN  int       // the most runs one fetch asks for
	epoch   time.Time // monotonic origin of job.beat

	mu       sync.Mutex
	state    int
	base     context.Context // Start's: the parent of handler contexts; its end is a hard stop
	wake     *waker
	forceErr error // the error of the ctx that forced the stop; set before force is closed
	result   error // what Shutdown returns; set before done is closed
	endForce func()

	// Every Redis call of the worker uses calls' context: rctx (base's
	// child) until the stop is forced, then one that ends shutdownGrace
	// later, when rctx is cancelled too (for the calls already in flight).
	rctx    context.Context
	rcancel context.CancelFunc
	calls   atomic.Pointer[context.Context]

	stopFetch chan struct{} // closed when Shutdown starts
	force     chan struct{} // closed when a Shutdown's ctx ends before the stop is over
	drained   chan struct{} // closed when no more acks can come: fetchers flush and leave
	quit      chan struct{} // closed last: heartbeat, sweeper and idle handler goroutines leave
	done      chan struct{} // closed when the stop is over

	jobs   chan *job
	held   []atomic.Pointer[job] // by slot: what the heartbeat extends and Shutdown releases
	slots  slots
	settle counter // handler goroutines between a handler's return and the ack or nack of its result

	unsettled atomic.Int64 // runs that Shutdown's stop left to lease recovery (an ack, nack or release not sent)

	fetchers sync.WaitGroup
	bg       sync.WaitGroup
	handlers sync.WaitGroup

	// fetchWaitHook, when set (tests only, before Start), runs in a
	// source's fetch loop each time it is about to wait, having decided
	// not to leave, once it hands out no more runs and has no call in
	// flight.
	fetchWaitHook func()
}

const (
	workerNew = iota
	workerStarted
	workerStopping
	workerStopped
)

// NewWorker returns a Worker that runs handler over the runs cfg names. It
// does not start it (Start). A Queue opened with Config.ReadOnly cannot
// take runs: NewWorker returns ErrReadOnly.
func NewWorker(q *Queue, handler Handler, cfg *WorkerConfig) (*Worker, error) {
	if q == nil {
		return nil, invalid("queue", "must not be nil")
	}
	if q.cfg.ReadOnly {
		return nil, ErrReadOnly
	}
	if handler == nil {
		return nil, invalid("handler", "must not be nil")
	}
	c := cfg.withDefaults(q.cfg)
	if err := c.validate(q); err != nil {
		return nil, err
	}
	c.Queues = append([]WorkerQueue(nil), c.Queues...)
	c.Shards = append([]int(nil), c.Shards...)
	w := &Worker{q: q, handler: handler, cfg: c, log: c.Logger, obs: q.cfg.Observer,
		fetchN: min(c.Concurrency, q.cfg.MaxDequeueCount), epoch: time.Now(),
		stopFetch: make(chan struct{}), force: make(chan struct{}), drained: make(chan struct{}), quit: make(chan struct{}),
		done: make(chan struct{}), jobs: make(chan *job, c.Concurrency),
		held: make([]atomic.Pointer[job], c.Concurrency)}
	w.slots.init(c.Concurrency)
	w.settle.init()
	swept := map[int]bool{}
	seenQ := map[WorkerQueue]bool{}
	for _, wq := range c.Queues {
		if seenQ[wq] {
			continue
		}
		seenQ[wq] = true
		qk := q.space.Env(wq.Env).Queue(wq.Queue)
		w.sources = append(w.sources, &source{w: w, env: wq.Env, queue: wq.Queue, shard: -1,
			topic: qk.Wake() + "|" + qk.Member(), kick: make(chan struct{}, 1)})
		swept[q.ShardOf(wq.Env)] = true
	}
	if !q.cfg.VtimeScheduling {
		for _, s := range w.sources {
			s.lined, s.nudged = true, make(chan struct{}, 1)
		}
	}
	seenS := map[int]bool{}
	for _, s := range c.Shards {
		if seenS[s] {
			continue
		}
		seenS[s], swept[s] = true, true
		w.sources = append(w.sources, &source{w: w, shard: s, topic: q.space.Shard(s).Wake(),
			kick: make(chan struct{}, 1)})
	}
	for s := range q.Shards() {
		if swept[s] {
			w.shards = append(w.shards, s)
		}
	}
	return w, nil
}

// Start starts the worker's goroutines and returns. ctx is the worker's
// lifetime: its values reach the handlers, and its end is a hard stop, as
// if the process died: fetching stops, every handler's context is
// cancelled, and nothing more is sent to Redis, so runs in flight and acks
// not yet sent are left to lease recovery (they run again once their lease
// passes). Stop a worker with Shutdown; pass context.WithoutCancel(ctx)
// when ctx is one a signal cancels. Start fails when the pub/sub
// subscription for wake-ups cannot be opened, or when called twice.
func (w *Worker) Start(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state != workerNew {
		return errors.New("runqueue: a worker starts once")
	}
	wk, err := w.q.getWaker(ctx)
	if err != nil {
		return err
	}
	w.setBase(ctx)
	w.wake, w.state = wk, workerStarted
	w.slots.fetching = len(w.sources)
	for range w.cfg.Concurrency {
		w.handlers.Add(1)
		go w.work()
	}
	for _, s := range w.sources {
		w.fetchers.Add(1)
		go s.loop()
	}
	w.bg.Add(1)
	go w.heartbeatLoop()
	if w.cfg.SweepInterval > 0 {
		w.bg.Add(1)
		go w.sweepLoop()
	}
	return nil
}

// shutdownGrace is how long Shutdown goes on once its ctx ended: the
// release of the runs still running and the acks not yet sent get one
// attempt each, and every Redis call of the worker ends by then.
const shutdownGrace = time.Second

// ErrUnsettled is wrapped by every *UnsettledError.
var ErrUnsettled = errors.New("runqueue: worker shutdown left runs unsettled")

// UnsettledError is returned by Worker.Shutdown when the stop left runs
// unsettled: the ack of a finished run, the nack of a failed one or the
// release of one still running could not be sent (Redis was unreachable,
// or Shutdown's ctx ended first). Those runs stay in flight and run again
// once their lease passes, as after a crash. Runs is how many (at least:
// a fetch cut short may have taken runs it never saw). Err is the error of
// the ctx that ended before the stop was over, if one did.
//
// After a hard stop (the Start context ended before the stop was over)
// Shutdown always returns one, with the Start context's error (or the
// forcing Shutdown's): a hard stop sends nothing more to Redis, so it
// cannot know all it leaves. Runs then counts the runs it knows of (held
// runs whose handler had not returned, results not sent, a nack that was
// on its way, runs of a fetch whose reply came after the end) and may be
// below the truth, or 0.
type UnsettledError struct {
	Runs int
	Err  error
}

func (e *UnsettledError) Error() string {
	var s string
	switch e.Runs {
	case 0:
		s = "runqueue: worker stopped hard; runs it had in flight, if any, run again once their lease passes"
	case 1:
		s = "runqueue: worker shutdown left 1 run unsettled; it runs again once its lease passes"
	default:
		s = fmt.Sprintf("runqueue: worker shutdown left %d runs unsettled; they run again once their lease passes", e.Runs)
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap makes errors.Is(err, ErrUnsettled) true, and errors.Is(err, Err)
// (context.DeadlineExceeded, say) when Err is set.
func (e *UnsettledError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrUnsettled}
	}
	return []error{ErrUnsettled, e.Err}
}

// Shutdown stops the worker gracefully: it stops fetching, waits for the
// running handlers until ctx ends, sends the acks of the runs that finished
// and returns nil. An ack Redis refuses unrun (a slot on the move during a
// resharding, a node loading, a script past busy-reply-threshold) is sent
// again, with a growing pause, while its run's lease lasts, for a minute
// at most; after that, or after four failed sends in a row of another kind
// (Redis unreachable), the acks are given up, as below. When ctx ends first, the stop is forced: the handlers
// still running get their context cancelled and their runs are released
// (nacked with a retry time of now, so that another worker runs them at
// once rather than after their lease), and Shutdown returns ctx's error.
// Once ctx has ended, Shutdown returns within about a second
// (shutdownGrace), even when Redis is unreachable: the release and the
// acks not yet sent get one attempt each, with no retries, and a Redis
// call still in flight is cancelled. But a call blocked reading a reply
// from a Redis that is up and does not answer (paused, or busy with a
// long script) ends only at the client's read timeout (Options.ReadTimeout;
// go-redis's default is 5s): with Redis paused, Shutdown with 300ms left
// returned after 5.3s with the default and after 3.3s with ReadTimeout
// 3s. Runs whose ack, nack or release could not be
// sent are left to lease recovery: Shutdown then returns an
// *UnsettledError (errors.Is(err, ErrUnsettled)), which also matches ctx's
// error when ctx ended. When the Start context ends before the stop is
// over (a hard stop: see Start), Shutdown returns an *UnsettledError with
// that context's error: see UnsettledError for what it counts.
//
// With Config.VtimeScheduling on, once a queue source of a graceful stop
// takes no more runs, and its last call got fewer runs than it asked for,
// its queue's mark in its env's waiting line (an env limit shared by its
// queues: see Config.EnvConcurrency) is cut to half a second and passed
// over from then on, and the queue's other consumers are woken to renew it
// in its place: the env's free slots are not left to a queue nobody serves
// for up to two of its poll intervals and a second. A shard source does so
// for the queues whose last visit by its calls got fewer runs (the latest
// 64). That is one best-effort script call a queue, a second in all (on a
// Redis that does not answer, the client's read timeout bounds a call, as
// any call). A running queue source does the same when, woken, it finds
// all its Worker's handler slots busy with other sources' runs.
//
// A release counts as a delivery attempt (the requeue that nacks and lease
// recovery share always adds one), but it never dead-letters a run: a run
// released at its last attempt gets one more delivery. Shutdown does not
// wait for released handlers to return: one that ignores its context keeps
// running, and its run may then run twice.
//
// Shutdown may be called again, before or after the stop is over: every
// call waits for the same stop and returns the same result. A call whose
// ctx ends before the stop is over forces it as the first call's would: so
// Shutdown(context.Background()) followed by Shutdown with a deadline
// waits for the handlers until that deadline. Shutdown of a worker never
// started returns nil.
func (w *Worker) Shutdown(ctx context.Context) error {
	w.mu.Lock()
	switch w.state {
	case workerNew:
		w.state = workerStopped
		close(w.done)
		w.mu.Unlock()
		return nil
	case workerStarted:
		w.state = workerStopping
		close(w.stopFetch)
		go w.stop()
	}
	w.mu.Unlock()
	select {
	case <-w.done:
	case <-ctx.Done():
		w.forceStop(ctx.Err())
		<-w.done
	}
	return w.result
}

// forceStop makes the stop in progress give up waiting for handlers (err
// is the ctx error it returns): the running handlers are cancelled and
// their runs released, the remaining acks are sent once without retries,
// and every Redis call ends within shutdownGrace.
func (w *Worker) forceStop(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state != workerStopping || w.forceErr != nil {
		return
	}
	fctx, fcancel := context.WithTimeout(w.rctx, shutdownGrace)
	stopAfter := context.AfterFunc(fctx, w.rcancel) // the calls in flight end then too
	w.calls.Store(&fctx)
	w.endForce = func() { stopAfter(); fcancel() }
	w.forceErr = err
	close(w.force)
}

// stop is the stop that Shutdown starts and its calls wait for.
func (w *Worker) stop() {
	graceful := w.waitIdle()
	if !graceful && w.base.Err() == nil {
		w.release()
	}
	close(w.drained)
	w.fetchers.Wait()
	close(w.quit)
	w.bg.Wait()
	if graceful {
		w.handlers.Wait()
	} else {
		// The handlers that returned finish settling their runs first (a
		// hard stop skips release, which waits for them): a nack on its
		// way when the Start context ended fails at once, and is counted.
		w.settle.wait()
	}
	w.mu.Lock()
	w.state = workerStopped
	err, n := w.forceErr, w.unsettled.Load()
	if hard := w.base.Err(); hard != nil {
		// A hard stop (the Start context ended first): the runs still
		// queued for or running in a handler are left in flight too
		// (those whose handler returned were counted as it did), and the
		// error is an UnsettledError whatever the count: what calls in
		// flight leased is unknown, so Runs is a lower bound, maybe 0.
		if err == nil {
			err = hard
		}
		err = &UnsettledError{Runs: int(n + w.heldUnfinished()), Err: err}
	} else if n > 0 {
		err = &UnsettledError{Runs: int(n), Err: err}
	}
	w.result = err
	if w.endForce != nil {
		w.endForce()
	}
	w.rcancel()
	w.mu.Unlock()
	close(w.done)
}

// heldUnfinished counts the held runs whose handler has not returned.
func (w *Worker) heldUnfinished() int64 {
	var n int64
	for i := range w.held {
		if j := w.held[i].Load(); j != nil {
			if st := j.state.Load(); st == jobQueued || st == jobRunning {
				n++
			}
		}
	}
	return n
}

// setBase sets the Start context and the context of Redis calls.
func (w *Worker) setBase(ctx context.Context) {
	w.base = ctx
	w.rctx, w.rcancel = context.WithCancel(ctx)
	w.calls.Store(&w.rctx)
}

// ctx is the context of a Redis call.
func (w *Worker) ctx() context.Context { return *w.calls.Load() }

// forced says whether the stop was forced.
func (w *Worker) forced() bool { return isDone(w.force) }

// stopping says whether Shutdown has started.
func (w *Worker) stopping() bool { return isDone(w.stopFetch) }

// waitIdle waits until no fetcher fetches and every slot is free (every
// handler returned and its result was acked or nacked), and reports
// whether that happened before the stop was forced or the Start context
// ended.
func (w *Worker) waitIdle() bool {
	for {
		if w.slots.idle() {
			return true
		}
		select {
		case <-w.slots.changed:
		case <-w.force:
			return false
		case <-w.base.Done():
			return false
		}
	}
}

// release ends the runs still held when the stop is forced: each
// handler's context is cancelled and its run nacked to be ready now,
// without the attempt limit, in one pipeline (one attempt, bounded by
// shutdownGrace).
func (w *Worker) release() {
	// No fetch may hand out a run after the scan below. The calls in
	// flight end within shutdownGrace.
	for !w.slots.fetchersGone() {
		select {
		case <-w.slots.changed:
		case <-w.base.Done():
			return
		}
	}
	// A clock out of range writes nothing: the runs wait for their leases.
	now, bad := w.q.clockNow()
	var released []*job
	var calls []call
	for i := range w.held {
		j := w.held[i].Load()
		if j == nil {
			continue
		}
		if j.state.CompareAndSwap(jobRunning, jobReleased) {
			j.cancel()
		} else if !j.state.CompareAndSwap(jobQueued, jobReleased) {
			continue
		}
		released = append(released, j)
		calls = append(calls, w.q.releaseCall(j.run, now, now))
	}
	for len(calls) > 0 {
		n := min(len(calls), 500)
		var cmds []*redis.Cmd
		err := bad
		if err == nil {
			cmds, err = runPipelined(w.ctx(), w.q.rdb, calls[:n])
		}
		for i, j := range released[:n] {
			e := err
			if cmds != nil { // a connection lost part way: the calls that answered released their run
				e = scriptError(cmds[i].Err(), nil)
			}
			switch {
			case e == nil:
				j.released.Store(releaseSent)
				// (a nack with a retry time of now, as Shutdown says: the
				// Observer counts it as one)
				if w.q.observe {
					w.q.cfg.Observer.Nacked(j.run.Env, j.run.Queue, true)
				}
			case leaseGone(e): // recovered meanwhile: it runs again anyway
				j.released.Store(releaseFailed)
				w.log.Warn("runqueue: worker could not release a run at shutdown: its lease was lost",
					"env", j.run.Env, "queue", j.run.Queue, "id", j.run.ID, "err", e)
			default:
				j.released.Store(releaseFailed)
				w.unsettled.Add(1)
				w.log.Error("runqueue: worker could not release a run at shutdown; "+afterLease(e),
					"env", j.run.Env, "queue", j.run.Queue, "id", j.run.ID, "err", e)
			}
			if j.handled.Load() {
				w.reportReleased(j)
			}
		}
		calls, released = calls[n:], released[n:]
	}
	if len(released) > 0 {
		w.log.Info("runqueue: worker released runs at shutdown", "runs", len(released))
	}
	// Handlers that returned before the release claimed their run finish
	// acking (into their source's buffer, flushed next) or nacking it.
	w.settle.wait()
}

// job is one run a worker holds, from its fetch to its ack, nack or
// release. state decides who settles it: the handler's goroutine when its
// handler returns (jobFinished), or the heartbeat (jobLost) or Shutdown
// (jobReleased) before that.
type job struct {
	run   *Run
	src   *source
	slot  int
	state atomic.Int32
	lease atomic.Int64 // lease deadline, ms
	beat  atomic.Int64 // Worker.mono when the lease was set (its fetch answered, or its last extension began)
	// expiry cancels the handler (expire) a margin before the lease runs
	// out by monotonic time from the call that set it (the fetch's start,
	// the extension's beat): whatever the heartbeat's calls do meanwhile.
	expiry  *time.Timer
	expired atomic.Bool
	// acked: an ack of this delivery answered 1 (acked by that call) in a
	// batch that failed elsewhere and is sent again: the resend's "gone
	// before" is then this holder's own ack (settled).
	acked  atomic.Bool
	ctx    context.Context
	cancel context.CancelFunc
	took   time.Duration
	// A released job's handler outcome is told once both its handler has
	// returned (handled, took set) and its release call has answered
	// (released): by whichever comes second (reportReleased).
	handled  atomic.Bool
	released atomic.Int32 // releasePending, releaseSent, releaseFailed
	reported atomic.Bool
}

const (
	releasePending int32 = iota
	releaseSent          // ready again now: OutcomeRetry
	releaseFailed        // still in flight in Redis (or its lease was lost): OutcomeLeaseLost
)

// reportReleased tells the Observer of a released job's handler, once.
func (w *Worker) reportReleased(j *job) {
	if !j.reported.CompareAndSwap(false, true) {
		return
	}
	outcome := OutcomeRetry
	if j.released.Load() == releaseFailed {
		outcome = OutcomeLeaseLost
	}
	w.obs.Handled(j.run.Env, j.run.Queue, j.took, outcome)
}

const (
	jobQueued int32 = iota
	jobRunning
	jobFinished
	jobLost
	jobReleased
)

// work is one of the Concurrency handler goroutines.
func (w *Worker) work() {
	left := false
	defer func() {
		if !left {
			// A handler called runtime.Goexit: this goroutine is ending
			// (runJob settled its run); another takes its place.
			w.handlers.Add(1)
			go w.work()
		}
		w.handlers.Done()
	}()
	for {
		select {
		case j := <-w.jobs:
			w.runJob(j)
		case <-w.quit:
			left = true
			return
		case <-w.base.Done():
			left = true
			return
		}
	}
}

func (w *Worker) runJob(j *job) {
	// The context exists before the job counts as running, so that
	// whoever takes the job from running may cancel it.
	j.ctx, j.cancel = context.WithCancel(w.base)
	if !j.state.CompareAndSwap(jobQueued, jobRunning) {
		j.cancel()
		w.free(j) // lost or released before it started: never ran
		return
	}
	start := time.Now()
	var err error
	panicked, returned := false, false
	defer func() {
		if !returned {
			// The handler neither returned nor panicked: it called
			// runtime.Goexit (t.FailNow, say). Its run is settled as a
			// panic's, here, as the goroutine ends.
			err, panicked = errors.New("runqueue: handler called runtime.Goexit"), true
			w.log.Error("runqueue: handler called runtime.Goexit", "env", j.run.Env, "queue", j.run.Queue,
				"id", j.run.ID, "attempt", j.run.Attempt, "stack", string(debug.Stack()))
		}
		w.finishJob(j, err, panicked, time.Since(start))
	}()
	err, panicked = w.call(j)
	returned = true
}

// finishJob settles j once its handler is over: the ack is queued, the
// nack sent, or nothing when the job was lost or released meanwhile.
func (w *Worker) finishJob(j *job, err error, panicked bool, took time.Duration) {
	j.cancel()
	r := j.run
	w.settle.add()
	defer w.settle.done()
	if !j.state.CompareAndSwap(jobRunning, jobFinished) {
		if j.state.Load() == jobReleased {
			// Released by Shutdown: ready again now, or still in flight
			// when the release call failed (told once both are known).
			j.took = took
			j.handled.Store(true)
			if j.released.Load() != releasePending {
				w.reportReleased(j)
			}
		} else {
			w.obs.Handled(r.Env, r.Queue, took, OutcomeLeaseLost)
		}
		w.free(j)
		return
	}
	if w.base.Err() != nil { // hard stop: nothing more goes to Redis
		w.unsettled.Add(1) // Shutdown reports it
		w.obs.Handled(r.Env, r.Queue, took, OutcomeLeaseLost)
		w.free(j)
		return
	}
	if err != nil && !panicked && j.expired.Load() && !errors.Is(err, ErrNoRetry) {
		w.giveBack(j, err, took)
		w.free(j)
		return
	}
	if err == nil && !panicked {
		j.took = took
		j.src.addAck(j) // Handled follows the ack
		w.free(j)
		return
	}
	w.nack(j, err, panicked, took)
	w.free(j)
}

// call runs the handler, turning a panic into an error. A handler that
// calls runtime.Goexit does not return from call (runJob sees to it).
func (w *Worker) call(j *job) (err error, panicked bool) {
	defer func() {
		if v := recover(); v != nil {
			panicked = true
			err = fmt.Errorf("runqueue: handler panicked: %v", v)
			w.log.Error("runqueue: handler panicked", "env", j.run.Env, "queue", j.run.Queue, "id", j.run.ID,
				"attempt", j.run.Attempt, "panic", v, "stack", string(debug.Stack()))
		}
	}()
	return w.handler(j.ctx, j.run), false
}

// nack settles a failed run: dead-lettered (NoRetry), retried at the time
// its error asks for (RetryError), or after the backoff.
func (w *Worker) nack(j *job, herr error, panicked bool, took time.Duration) {
	r := j.run
	opts := &NackOptions{}
	var re *RetryError
	switch {
	case errors.Is(herr, ErrNoRetry):
		opts.DeadLetter = true
	case errors.As(herr, &re):
		opts.RetryAt = re.At
		if re.At.IsZero() {
			opts.RetryAt = w.q.cfg.Clock.Now().Add(re.After)
		}
	}
	sent := opts
	res, err := w.q.Nack(w.ctx(), r, sent)
	if err != nil && errors.Is(err, ErrInvalid) && !opts.RetryAt.IsZero() {
		w.log.Warn("runqueue: handler asked for a retry time out of range; using the backoff",
			"env", r.Env, "queue", r.Queue, "id", r.ID, "retry_at", opts.RetryAt, "err", err)
		sent = nil
		res, err = w.q.Nack(w.ctx(), r, sent)
	}
	res, err = w.nackAgain(j, sent, res, err)
	intended := OutcomeRetry
	switch {
	case panicked:
		intended = OutcomePanic
	case opts.DeadLetter:
		intended = OutcomeDead
	}
	switch {
	case err != nil && leaseGone(err):
		w.log.Warn("runqueue: handler failed after its lease was lost", "env", r.Env, "queue", r.Queue, "id", r.ID,
			"attempt", r.Attempt, "err", herr, "nack_err", err)
		w.obs.Handled(r.Env, r.Queue, took, OutcomeLeaseLost)
	case err != nil:
		if w.stopping() || w.base.Err() != nil {
			w.unsettled.Add(1) // Shutdown reports it
		}
		w.log.Error("runqueue: could not nack a failed run; "+afterLease(err),
			"env", r.Env, "queue", r.Queue, "id", r.ID, "attempt", r.Attempt, "err", herr, "nack_err", err)
		// Not what the handler asked for: the run is still in flight.
		w.obs.Handled(r.Env, r.Queue, took, OutcomeLeaseLost)
	case !res.Requeued:
		if !panicked {
			intended = OutcomeDead
		}
		w.log.Warn("runqueue: run failed and was dead-lettered", "env", r.Env, "queue", r.Queue, "id", r.ID,
			"attempt", r.Attempt, "err", herr)
		w.obs.Handled(r.Env, r.Queue, took, intended)
	default:
		w.log.Warn("runqueue: run failed and will be retried", "env", r.Env, "queue", r.Queue, "id", r.ID,
			"attempt", r.Attempt, "retry_at", res.RetryAt, "err", herr)
		w.obs.Handled(r.Env, r.Queue, took, intended)
	}
}

// nackAgain sends j's nack again while Redis refuses it before running it
// (refusedUnrun: a Redis Cluster slot moving, a node loading its data,
// another client's script running past busy-reply-threshold) or
// does not answer (unanswered: a restart, a failover, a network cut; a
// nack sent twice is answered as the first was, requeue.lua; not once
// Shutdown began, which reports the run unsettled instead), waiting 50
// ms, then twice as long each time up to 1 s, until it goes through, the
// next wait would reach j's lease deadline, or the Worker's calls end (a
// forced stop, the Start context's end). Without it, a run that failed
// while its slot moved, Redis restarted or was busy with a long script
// waited for its lease to pass and ran again at once: a poison run
// (NoRetry) a second time, a rate-limited one (RetryAfter) early. Acks
// need no such loop: an ack whose call failed goes back to its source and
// rides with its next fetch (AckAndDequeue fails whole; AckMany reports an
// error when any of its calls failed).
func (w *Worker) nackAgain(j *job, opts *NackOptions, res NackResult, err error) (NackResult, error) {
	err = w.sendAgain(j, err, func() (e error) {
		res, e = w.q.Nack(w.ctx(), j.run, opts)
		return e
	})
	return res, err
}

// sendAgain calls send again, from 50 ms apart doubling to 1 s, while its
// last error (err first) says Redis refused it unrun, or did not answer
// and the Worker is not stopping, until j's lease would run out; it
// returns the last error. send must be safe to send twice.
func (w *Worker) sendAgain(j *job, err error, send func() error) error {
	for wait := 50 * time.Millisecond; err != nil && (refusedUnrun(err) || unanswered(err) && !w.stopping()); wait = min(2*wait, time.Second) {
		if w.q.cfg.Clock.Now().Add(wait).UnixMilli() >= j.lease.Load() || !sleepCtx(w.ctx(), wait) {
			break
		}
		err = send()
	}
	return err
}

// leaseGone says whether err means the caller no longer holds the run.
func leaseGone(err error) bool {
	return errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrNotInFlight) || errors.Is(err, ErrNotFound)
}

// free gives j's slot back.
func (w *Worker) free(j *job) {
	if j.expiry != nil {
		j.expiry.Stop()
	}
	w.held[j.slot].Store(nil)
	w.slots.give(j.slot)
}

// heartbeatLoop extends the leases of running handlers every
// HeartbeatInterval.
func (w *Worker) heartbeatLoop() {
	defer w.bg.Done()
	t := time.NewTicker(w.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			w.heartbeat()
		case <-w.quit:
			return
		case <-w.base.Done():
			return
		}
	}
}

// mono is the monotonic time since the worker was made: it never steps
// with Config.Clock.
func (w *Worker) mono() int64 { return int64(time.Since(w.epoch)) }

// heartbeat extends, in one pipeline, every held lease that is due to
// now + LeaseDuration. A lease is due when it ends within LeaseDuration -
// HeartbeatInterval/2 by Config.Clock, or when more than
// HeartbeatInterval/2 of monotonic time passed since it was set (its
// fetch, or the beat that last extended it). The monotonic rule keeps
// the beats going whatever Config.Clock does: by the clock alone, a step
// back of s stopped them for about s, so the lease lapsed for the other
// instances, was recovered and redelivered, and the handler was never
// told. With a clock that moves with real time the two rules agree, so
// a run fetched since the last beat is left alone and each lease is
// extended once a beat, as before. A lease found lost cancels its
// handler's context, as does one that ran out while it could not be
// extended (lapse).
func (w *Worker) heartbeat() {
	mono := w.mono() // before the clock: the extensions' leases start after it
	now, err := w.q.clockNow()
	if err != nil {
		w.log.Warn("runqueue: worker did not extend leases", "err", err)
		return
	}
	lease := ms(w.q.cfg.LeaseDuration)
	half := w.cfg.HeartbeatInterval / 2
	due := now + lease - ms(half)
	var js []*job
	var calls []call
	for i := range w.held {
		j := w.held[i].Load()
		if j == nil || (j.lease.Load() >= due && mono-j.beat.Load() <= int64(half)) {
			continue
		}
		if st := j.state.Load(); st != jobQueued && st != jobRunning {
			continue
		}
		js = append(js, j)
		calls = append(calls, w.q.extendCall(j.run, now+lease))
	}
	for len(calls) > 0 {
		n := min(len(calls), 500)
		cmds, lost := runPipelined(w.ctx(), w.q.rdb, calls[:n])
		if lost != nil && w.base.Err() == nil {
			w.log.Warn("runqueue: worker could not extend leases", "runs", len(js), "err", lost)
		}
		// A failed call's lapse is judged when it failed, not when the
		// beat began: it may have waited a long time (a client redialling
		// a server that is down).
		after := w.mono()
		nowAfter := now + ms(time.Duration(after-mono))
		// With a connection lost part way, the calls that answered still
		// say whether their lease was extended or lost.
		for i, j := range js[:len(cmds)] {
			switch err := scriptError(cmds[i].Err(), nil); {
			case err == nil:
				j.lease.Store(now + lease)
				j.beat.Store(mono)
				if st := j.state.Load(); st == jobQueued || st == jobRunning {
					j.expiry.Reset(w.expiresIn(mono)) // (free stopped it otherwise)
				}
			case leaseGone(err):
				w.lose(j, err)
			case lost != nil: // the lost connection's, warned of above
				w.lapse(j, nowAfter, after, lost)
			default:
				w.log.Warn("runqueue: worker could not extend a lease", "env", j.run.Env, "queue", j.run.Queue,
					"id", j.run.ID, "err", err)
				w.lapse(j, nowAfter, after, err)
			}
		}
		if lost != nil {
			for _, j := range js[len(cmds):] {
				w.lapse(j, nowAfter, after, lost)
			}
			return
		}
		calls, js = calls[n:], js[n:]
	}
}

// expiresIn is how long from now j's expiry timer waits, for a lease set
// by a call that began at monotonic time set: until a margin before the
// lease runs out, a quarter of HeartbeatInterval, or less when the
// interval is long (half of what a lease has left 1.5 intervals after it
// was set, the latest a beat begins to extend it; none near 2/3 of
// LeaseDuration, above which NewWorker refuses the interval: a lease may
// run out before a beat extends it, Redis healthy or not). So, as the
// interval is less than 2/3 of the lease,
// while Redis answers the fetch and the extensions within about half of
// what the lease leaves after 1.5 intervals and the margin (5/12 of the
// lease at the default interval), the timer is reset before it fires.
// When the beat's calls neither answer nor fail (a paused Redis; go-redis,
// unless ContextTimeoutEnabled, reads a stalled connection until
// ReadTimeout whatever the context says), it cancels the handler before
// another instance's sweep may deliver the run again, with clocks in step
// (a sweeper's Config.Clock ahead of this one's by less than the margin).
func (w *Worker) expiresIn(set int64) time.Duration {
	lease, beat := w.q.cfg.LeaseDuration, w.cfg.HeartbeatInterval
	margin := max(0, min(beat/4, (lease-beat*3/2)/2))
	return time.Duration(set-w.mono()) + lease - margin
}

// giveBack settles a run whose handler returned an error other than
// NoRetry after the Worker cancelled it (cut: its expiry timer, lapse):
// the error is taken for the Worker's doing, not the run's, so the run is
// made ready now, or at the time a RetryAt or RetryAfter asks (a handler
// may wrap any failure in one, the cancel's included), and never
// dead-lettered for it, as Shutdown's
// release does (its attempt counts one more), not nacked (a nack would
// dead-letter it at MaxAttempts or wait out a backoff, though the lease
// may never have run out in Redis). Its token decides: refused, the run
// was delivered again. A call that Redis did not answer (out of reach, as
// it often is when the timer fires) is sent again, as a nack is
// (nackAgain), until the lease would run out: a Redis back within the
// lease gets the run back ready, where lease recovery would count the
// attempt (dead-lettered at MaxAttempts 1). (The release is safe to send
// twice: a resend finds its token as the run's last settled one.)
func (w *Worker) giveBack(j *job, herr error, took time.Duration) {
	r := j.run
	var re *RetryError
	asked := errors.As(herr, &re)
	at := int64(-1) // the retry time, set by the first call (a resend is answered as it)
	release := func() error {
		now, err := w.q.clockNow()
		if err != nil {
			return err
		}
		if at < 0 {
			at = now
			if asked {
				t := re.At
				if t.IsZero() {
					t = time.UnixMilli(now).Add(re.After)
				}
				if checkTime("retryAt", t) == nil {
					at = t.UnixMilli()
				} else {
					// (as nack does: not at once, which the time did not ask)
					w.log.Warn("runqueue: handler asked for a retry time out of range; using the backoff",
						"env", r.Env, "queue", r.Queue, "id", r.ID, "retry_at", t, "err", herr)
					at = now + ms(w.q.Backoff(r.Attempt))
				}
			}
		}
		c := w.q.releaseCall(r, now, at)
		return scriptError(run(w.ctx(), w.q.rdb, c.sc, c.keys, c.args...).Err(), nil)
	}
	err := w.sendAgain(j, release(), release)
	switch {
	case err == nil:
		if w.q.observe {
			w.q.cfg.Observer.Nacked(r.Env, r.Queue, true)
		}
		w.obs.Handled(r.Env, r.Queue, took, OutcomeRetry)
	case leaseGone(err):
		w.obs.Handled(r.Env, r.Queue, took, OutcomeLeaseLost)
	default:
		if w.stopping() || w.base.Err() != nil {
			w.unsettled.Add(1) // Shutdown reports it
		}
		w.log.Error("runqueue: could not give back a run whose lease ran out unextended; "+afterLease(err),
			"env", r.Env, "queue", r.Queue, "id", r.ID, "attempt", r.Attempt, "err", err)
		w.obs.Handled(r.Env, r.Queue, took, OutcomeLeaseLost)
	}
}

// expire is j's expiry timer: no extension has answered and the lease
// is about to run out. The handler's context is cancelled, and the run
// stays j's, still extended by the beats; when its handler returns it is
// acked (nil), dead-lettered (NoRetry) or given back (another error:
// giveBack), and the delivery token decides whether that still holds
// (refused, the outcome is OutcomeLeaseLost, as for a lease found lost).
// A job not started yet is lost. Nothing after a hard stop, which
// cancelled every handler already.
func (w *Worker) expire(j *job) {
	w.cut(j, "runqueue: no extension of a lease has answered and it is about to run out; the handler's context is cancelled", nil)
}

// cut cancels j's handler because its lease may run out unextended (the
// expiry timer, lapse), and keeps its run (see expire); msg and err are
// logged. A job not started yet is lost.
func (w *Worker) cut(j *job, msg string, err error) {
	if w.base.Err() != nil || j.expired.Swap(true) {
		return
	}
	switch {
	case j.state.CompareAndSwap(jobQueued, jobLost):
	case j.state.Load() == jobRunning:
		j.cancel()
	default:
		return // settled meanwhile
	}
	args := []any{"env", j.run.Env, "queue", j.run.Queue, "id", j.run.ID, "attempt", j.run.Attempt}
	if err != nil {
		args = append(args, "err", err)
	}
	w.log.Warn(msg, args...)
}

// lapse cancels j's handler when its lease, which this beat could not
// extend (err), runs out before the next beat could extend it: by
// Config.Clock its deadline comes within HeartbeatInterval, or by
// monotonic time a whole LeaseDuration since it was set does. Once it has
// run out any instance's sweep may recover the run and deliver it again,
// so the handler must stop by then; a Redis that stays out of reach that
// long would otherwise leave it running beside the next delivery. The run
// stays the worker's, as after its expiry timer (expire): the beats still
// try to extend it, and when its handler returns it is acked (nil),
// dead-lettered (NoRetry) or given back (another error, taken for the
// cancel's), its delivery token refusing each if it was delivered again
// meanwhile. (It was
// marked lost: its handler's result was dropped, so one that returned nil
// once Redis answered again ran again after lease recovery, and one that
// returned the cancel's error waited out the lease and was recovered with
// its attempt counted, dead-lettered at MaxAttempts 1.)
func (w *Worker) lapse(j *job, now, mono int64, err error) {
	beat := w.cfg.HeartbeatInterval
	if now+ms(beat) < j.lease.Load() && time.Duration(mono-j.beat.Load())+beat < w.q.cfg.LeaseDuration {
		return
	}
	w.cut(j, "runqueue: a lease could not be extended and runs out before the next beat; the handler's context is cancelled", err)
}

// lose marks j's lease lost and cancels its handler.
func (w *Worker) lose(j *job, err error) {
	if j.state.CompareAndSwap(jobRunning, jobLost) {
		j.cancel()
	} else if !j.state.CompareAndSwap(jobQueued, jobLost) {
		return // settled meanwhile
	}
	w.log.Warn("runqueue: lease lost; the handler's context is cancelled", "env", j.run.Env, "queue", j.run.Queue,
		"id", j.run.ID, "attempt", j.run.Attempt, "err", err)
}

// counter is a WaitGroup whose Add may race with Wait.
type counter struct {
	mu   sync.Mutex
	n    int
	zero *sync.Cond
}

func (c *counter) init() { c.zero = sync.NewCond(&c.mu) }

func (c *counter) add() {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
}

func (c *counter) done() {
	c.mu.Lock()
	c.n--
	if c.n == 0 {
		c.zero.Broadcast()
	}
	c.mu.Unlock()
}

func (c *counter) wait() {
	c.mu.Lock()
	for c.n > 0 {
		c.zero.Wait()
	}
	c.mu.Unlock()
}

// afterLease says what becomes of a run a Worker could not settle after
// err: it runs again once its lease passes, unless its record does not
// parse, when lease recovery dead-letters it.
func afterLease(err error) string {
	if errors.Is(err, ErrCorruptRecord) {
		return "its record does not parse: lease recovery dead-letters it once its lease passes"
	}
	return "it runs again once its lease passes"
}
