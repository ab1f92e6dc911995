package runqueue

import (
	"context"
	"runtime"
	"slices"
	"sync"
)

// Coalescing of concurrent Enqueue calls.
//
// A script call has a fixed cost in Redis (the round trip's reads and
// writes, the script's set-up) that a single Enqueue pays for one run. When
// many goroutines call Enqueue at once, Enqueue hands its run to a list of
// pending runs instead, and at most enqueueSenders goroutines send that list,
// each taking every run pending at the time into one EnqueueMany (one
// script call per base queue, in one pipeline). A caller alone is sent at
// once, in a call of its own; runs that arrive while the senders are busy
// go together in the next call. Each run stays all or nothing and
// idempotent, with its own result, as with EnqueueMany.

// enqueueSenders is the most coalesced EnqueueMany calls in flight at once
// per Queue: one call can be on the wire or in Redis while the next forms.
const enqueueSenders = 2

// pendingRun is a run handed to the senders by Enqueue.
type pendingRun struct {
	ctx  context.Context // the caller's, for its values (a sender drops its cancellation)
	p    EnqueueParams
	res  EnqueueResult
	done chan struct{} // closed when res is set
}

// coalescer holds the runs waiting for a sender.
type coalescer struct {
	mu      sync.Mutex
	pending []*pendingRun
	senders int // running sender goroutines
}

// enqueueCoalesced is Enqueue through the senders. The caller's context
// bounds its wait: a run not yet taken by a sender is withdrawn (nothing
// written); a run already sent may or may not be queued, and a retry is
// safe.
func (q *Queue) enqueueCoalesced(ctx context.Context, p EnqueueParams) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	r := &pendingRun{ctx: ctx, p: p, done: make(chan struct{})}
	c := &q.enq
	c.mu.Lock()
	c.pending = append(c.pending, r)
	start := c.senders < enqueueSenders
	if start {
		c.senders++
	}
	c.mu.Unlock()
	if start {
		go q.sendEnqueues()
	}
	select {
	case <-r.done:
		return r.res.Queued, r.res.Err
	case <-ctx.Done():
	}
	c.mu.Lock()
	if i := slices.Index(c.pending, r); i >= 0 {
		c.pending = slices.Delete(c.pending, i, i+1)
		c.mu.Unlock()
		return false, ctx.Err()
	}
	c.mu.Unlock()
	// Taken: its call may have completed in the meantime.
	select {
	case <-r.done:
		return r.res.Queued, r.res.Err
	default:
		return false, ctx.Err()
	}
}

// sendEnqueues sends the pending runs until none is left. Before it takes
// the list it yields the processor once, so that callers woken by its last
// call, or just arrived, join this one (with 8 producers on 2 cores, a
// third fewer calls). Each call runs on the first run's context without its
// cancellation: one caller giving up must not fail the runs of the others.
func (q *Queue) sendEnqueues() {
	c := &q.enq
	for {
		runtime.Gosched()
		c.mu.Lock()
		batch := c.pending
		c.pending = nil
		if len(batch) == 0 {
			c.senders--
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		ps := make([]EnqueueParams, len(batch))
		for i, r := range batch {
			ps[i] = r.p
		}
		res, _ := q.EnqueueMany(context.WithoutCancel(batch[0].ctx), ps)
		for i, r := range batch {
			r.res = res[i]
			close(r.done)
		}
	}
}
