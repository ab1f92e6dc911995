package runqueue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"time"
)

// Coalescing of concurrent Enqueue, Ack and Dequeue calls.
//
// A script call has a fixed cost in Redis (the round trip's reads and
// writes, the script's set-up) that a single Enqueue or Ack pays for one
// run. When many goroutines call them at once, each call hands its run to
// a list of pending runs instead, and at most coalesceSenders goroutines
// (per group) send that list, each taking every run pending at the time into one
// EnqueueMany (or AckMany): one script call per base queue, in one
// pipeline. A caller alone is sent at once, in a call of its own; runs that
// arrive while the senders are busy go together in the next call. Each run
// stays all or nothing and idempotent, with its own result, as with
// EnqueueMany and AckMany. One send takes at most coalesceRuns runs (and,
// for Enqueue, batchBytes of payload): a burst goes out in many small
// calls, each far within a read timeout even on a slow server (go-redis
// sends a pipeline again when its reply times out, and a run sent again
// reads as an idempotent retry).
//
// Concurrent Dequeue calls go the same way (see dequeueCoalesced), each
// base queue a group of its own (group) with coalesceSenders senders of its
// own: the calls of a queue pending at once become one dequeue that stands
// for them, whose runs are handed out in serve order. A dequeue's caller,
// once its call is sent, waits for the reply whatever its context
// (keepTaken): the runs served for it are of use to no one else. An
// enqueue's caller does too: had it returned, its retry could be served
// and acked before the first send landed, and that send would queue the
// run again.
//
// The Observer hears of each run in its caller's goroutine, as with a call
// of its own (a panic there is that caller's); of a run whose caller has
// stopped waiting, in the sender's.

// coalesceSenders is the most coalesced calls in flight at once per
// coalescer group (see coalescer.group; Enqueue and Ack have one): one
// call can be on the wire or in Redis while the next forms.
// coalesceRuns bounds the runs of one: at 100 runs a call's fixed cost is a
// few percent of the whole, and the call about 1-2 ms of Redis time.
const (
	coalesceSenders = 2
	coalesceRuns    = 100
)

// pending is one run handed to the senders: a copy the caller no longer
// touches.
type pending[P, R any] struct {
	ctx       context.Context // the caller's, for its values and deadline
	p         P
	group     string // its send group (see coalescer.group)
	res       R
	panicked  any           // a panic of the send, raised again in the caller
	done      chan struct{} // closed when res (or panicked) is set
	abandoned bool          // the caller stopped waiting after it was taken (c.mu)
}

// coalescer gathers the runs of concurrent calls of one kind. send does
// the work of a batch: one result per run, in order; errors are results.
// observe tells the Observer of one run's result. weigh, when set, weighs a
// run against limit, which bounds the weight of one send (a run heavier
// than limit goes alone).
type coalescer[P, R any] struct {
	send    func(ctx context.Context, ps []P) []R
	observe func(P, R)
	weigh   func(P) int
	limit   int
	// keepTaken: a caller whose run a sender has taken waits for its
	// result even when its context ends (what it gets is of no use to
	// anyone else: a dequeue's runs); else it returns ctx.Err() at once.
	keepTaken bool
	// group, when set, splits the runs into groups sent apart: a send
	// takes runs of one group only, and each group has senders of its own
	// (at most coalesceSenders), so that no group waits for another's
	// calls. Without it all runs are one group.
	group   func(P) string
	mu      sync.Mutex
	pending []*pending[P, R]
	sending map[string]int // running sender goroutines by group (none: no entry)
	idle    *sync.Cond     // on mu: broadcast when a sender ends
	closed  bool           // wait was called: do takes no more runs
}

// errCoalescerClosed is do's answer once wait was called: the caller sends
// its run in a call of its own.
var errCoalescerClosed = errors.New("runqueue: coalescer closed")

func newCoalescer[P, R any](send func(ctx context.Context, ps []P) []R, observe func(P, R), weigh func(P) int, limit int) *coalescer[P, R] {
	c := &coalescer[P, R]{send: send, observe: observe, weigh: weigh, limit: limit, sending: map[string]int{}}
	c.idle = sync.NewCond(&c.mu)
	return c
}

// wait closes the coalescer (do takes no more runs) and returns once no
// sender runs: the runs taken or waiting when it is called have been sent
// (each send is bounded by its callers' latest deadline, or by the
// client's timeouts and retries when a caller has none).
func (c *coalescer[P, R]) wait() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for len(c.sending) > 0 {
		c.idle.Wait()
	}
}

// do hands p to the senders and returns its result. The caller's context
// bounds its wait (err is then ctx.Err()): a run not yet taken by a sender
// is withdrawn, nothing written; a run already sent may or may not have
// been written, and a retry is safe (with keepTaken, its result is waited
// for).
func (c *coalescer[P, R]) do(ctx context.Context, p P) (res R, err error) {
	if err := ctx.Err(); err != nil {
		return res, err
	}
	r := &pending[P, R]{ctx: ctx, p: p, done: make(chan struct{})}
	if c.group != nil {
		r.group = c.group(p)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return res, errCoalescerClosed
	}
	c.pending = append(c.pending, r)
	start := c.sending[r.group] < coalesceSenders
	if start {
		c.sending[r.group]++
	}
	c.mu.Unlock()
	if start {
		go c.run(r.group)
	}
	select {
	case <-r.done:
		return c.result(r)
	case <-ctx.Done():
	}
	c.mu.Lock()
	if i := slices.Index(c.pending, r); i >= 0 {
		c.pending = slices.Delete(c.pending, i, i+1)
		c.mu.Unlock()
		return res, ctx.Err()
	}
	if c.keepTaken {
		// Taken: its result is waited for, as a call of its own waits for
		// its reply once sent.
		c.mu.Unlock()
		<-r.done
		return c.result(r)
	}
	// Taken: its call may have completed in the meantime (results are set
	// under c.mu); if not, the sender tells the Observer of it.
	select {
	case <-r.done:
		c.mu.Unlock()
		return c.result(r)
	default:
		r.abandoned = true
		c.mu.Unlock()
		return res, ctx.Err()
	}
}

// result is the run's result, told to the Observer in the caller's
// goroutine, or the send's panic raised there, as a call of its own would
// have raised it.
func (c *coalescer[P, R]) result(r *pending[P, R]) (R, error) {
	if r.panicked != nil {
		panic(r.panicked)
	}
	c.observe(r.p, r.res)
	return r.res, nil
}

// run is a sender of group g: it sends the group's pending runs until
// none is left. Before it takes the list it yields the processor once, so
// that callers woken by its last call, or just arrived, join this one
// (with 8 producers on 2 cores, a third fewer calls).
func (c *coalescer[P, R]) run(g string) {
	ended := false
	defer func() {
		if ended {
			return
		}
		// The send ended the goroutine (runtime.Goexit in a hook): another
		// sender takes over the runs that wait, or the count goes down.
		c.mu.Lock()
		again := slices.ContainsFunc(c.pending, func(r *pending[P, R]) bool { return r.group == g })
		if !again {
			c.stopped(g)
		}
		c.mu.Unlock()
		if again {
			go c.run(g)
		}
	}()
	for {
		runtime.Gosched()
		c.mu.Lock()
		batch := c.take(g)
		if len(batch) == 0 {
			c.stopped(g)
			c.mu.Unlock()
			ended = true
			return
		}
		c.mu.Unlock()
		c.sendBatch(batch)
	}
}

// stopped counts a sender of group g out. The caller holds c.mu.
func (c *coalescer[P, R]) stopped(g string) {
	if c.sending[g]--; c.sending[g] == 0 {
		delete(c.sending, g)
	}
	c.idle.Broadcast()
}

// take removes the runs of group g's next send from the pending list: the
// oldest of the group, at most coalesceRuns of them and limit of their
// weight (at least one run). The caller holds c.mu.
func (c *coalescer[P, R]) take(g string) []*pending[P, R] {
	var batch []*pending[P, R]
	weight, full := 0, false
	rest := c.pending[:0]
	for _, r := range c.pending {
		if full || r.group != g {
			rest = append(rest, r)
			continue
		}
		if c.weigh != nil {
			w := c.weigh(r.p)
			if len(batch) > 0 && weight+w > c.limit {
				full = true
				rest = append(rest, r)
				continue
			}
			weight += w
		}
		batch = append(batch, r)
		full = len(batch) == coalesceRuns
	}
	clear(c.pending[len(rest):])
	c.pending = rest
	return batch
}

// sendBatch sends one batch and hands each caller its result. The call
// keeps the first caller's context values but none of the callers'
// cancellation; its deadline is the latest of theirs (none when a caller
// has none): it is bounded as the callers' own calls would have been. A
// panic of the send reaches every caller of the batch, and the sender goes
// on with the next.
func (c *coalescer[P, R]) sendBatch(batch []*pending[P, R]) {
	ctx := context.WithoutCancel(batch[0].ctx)
	var latest time.Time
	for _, r := range batch {
		d, ok := r.ctx.Deadline()
		if !ok {
			latest = time.Time{}
			break
		}
		if d.After(latest) {
			latest = d
		}
	}
	if !latest.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, latest)
		defer cancel()
	}
	sent := false
	defer func() {
		if sent {
			return
		}
		v := recover()
		if v == nil {
			v = fmt.Errorf("runqueue: a coalesced call ended without results")
		}
		c.mu.Lock()
		for _, r := range batch {
			r.panicked = v
			close(r.done)
		}
		c.mu.Unlock()
	}()
	ps := make([]P, len(batch))
	for i, r := range batch {
		ps[i] = r.p
	}
	res := c.send(ctx, ps)
	if len(res) != len(batch) {
		panic(fmt.Sprintf("runqueue: a coalesced call returned %d results for %d runs", len(res), len(batch)))
	}
	sent = true
	var orphans []int
	c.mu.Lock()
	for i, r := range batch {
		r.res = res[i]
		if r.abandoned {
			orphans = append(orphans, i)
		}
		close(r.done)
	}
	c.mu.Unlock()
	for _, i := range orphans {
		c.observeOrphan(batch[i].p, res[i])
	}
}

// observeOrphan tells the Observer of a run whose caller stopped waiting.
// No caller is left to take a panic of the Observer: it is logged.
func (c *coalescer[P, R]) observeOrphan(p P, res R) {
	defer func() {
		if v := recover(); v != nil {
			slog.Default().Error("runqueue: Observer panicked for a run whose caller had returned", "panic", v)
		}
	}()
	c.observe(p, res)
}

// waiting and running report the pending runs and the running senders.
func (c *coalescer[P, R]) waiting() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending)
}

func (c *coalescer[P, R]) running() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, k := range c.sending {
		n += k
	}
	return n
}
