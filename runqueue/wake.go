package runqueue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// waker fans out the wake-ups that scripts PUBLISH when a run becomes ready
// (on the shard's wake channel, message = queue member) to blocked callers.
// One subscription per Queue, opened at the first blocking call.
type waker struct {
	ps      *redis.PubSub
	mu      sync.Mutex
	waiters map[string]map[chan struct{}]struct{}
	done    chan struct{}

	readMu sync.Mutex
	reads  map[string]*nextRead // the read of each topic's next work time in flight
}

// nextRead is one read of a topic's next work time (see waker.next).
type nextRead struct {
	start  time.Time
	joined int           // callers that joined it (waker.readMu)
	done   chan struct{} // closed when z and err are set
	z      []redis.Z
	err    error
}

// next reads when topic's next work is due (read), sharing the read with
// the other waiters of the topic: a wake-up wakes every waiter of a
// topic, and those its run did not go to all look again at once. A caller
// registered for wake-ups, then looked at the queue from since to ended.
//
// It joins a read in flight that started after since: new work after that
// (an enqueue, nack or redrive that brings the queue's next work time
// forward publishes) wakes it again, whatever the read missed. But what
// the read saw may have been taken since, which publishes nothing, so a
// joiner keeps the answer only when future says it is no work or work to
// come (a time after now). When it says work is due (the caller would
// sleep the poll interval, while a later delayed run may be due sooner),
// or the read failed (its error may be its starter's context), the joiner
// takes a read that started after its look ended instead (future nil: any
// answer), as it would have read itself then, shared with the joiners in
// the same case. A caller that starts a read starts it after its look
// ended: the answer is its own.
func (w *waker) next(ctx context.Context, topic string, since, ended time.Time, read func() (*redis.ZSliceCmd, error), future func([]redis.Z) bool) ([]redis.Z, error) {
	w.readMu.Lock()
	if r := w.reads[topic]; r != nil && r.start.After(since) {
		r.joined++
		w.readMu.Unlock()
		select {
		case <-r.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if r.err == nil && (future == nil || future(r.z)) {
			return r.z, nil
		}
		return w.next(ctx, topic, ended, ended, read, nil)
	}
	r := &nextRead{start: time.Now(), done: make(chan struct{})}
	if w.reads == nil {
		w.reads = map[string]*nextRead{}
	}
	w.reads[topic] = r
	w.readMu.Unlock()
	r.err = errNoRead // until read returns (it may panic)
	defer func() {
		w.readMu.Lock()
		if w.reads[topic] == r {
			delete(w.reads, topic)
		}
		w.readMu.Unlock()
		close(r.done)
	}()
	cmd, err := read()
	if err != nil {
		r.err = err
		return nil, err
	}
	r.z, r.err = cmd.Val(), nil
	return r.z, nil
}

// errNoRead is a shared read's error while it has no answer.
var errNoRead = errors.New("runqueue: no read of the next work time")

func (q *Queue) getWaker(ctx context.Context) (*waker, error) {
	q.closeMu.Lock()
	defer q.closeMu.Unlock()
	if q.isClosed() {
		return nil, ErrClosed
	}
	if q.waker != nil {
		return q.waker, nil
	}
	chans := make([]string, q.space.Shards())
	for i := range chans {
		chans[i] = q.space.Shard(i).Wake()
	}
	ps := q.rdb.Subscribe(ctx, chans...)
	// Wait for every confirmation so that no publish after this point is missed.
	for range chans {
		msg, err := ps.Receive(ctx)
		if err != nil {
			_ = ps.Close()
			return nil, err
		}
		if _, ok := msg.(*redis.Subscription); !ok {
			_ = ps.Close()
			return nil, fmt.Errorf("runqueue: unexpected %T while subscribing", msg)
		}
	}
	w := &waker{ps: ps, waiters: map[string]map[chan struct{}]struct{}{}, done: make(chan struct{})}
	go w.loop()
	q.waker = w
	return w, nil
}

func (w *waker) loop() {
	defer close(w.done)
	for msg := range w.ps.Channel() {
		w.notify(msg.Channel)
		w.notify(msg.Channel + "|" + msg.Payload)
	}
}

func (w *waker) notify(topic string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for ch := range w.waiters[topic] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func (w *waker) register(topic string) chan struct{} {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.waiters[topic] == nil {
		w.waiters[topic] = map[chan struct{}]struct{}{}
	}
	w.waiters[topic][ch] = struct{}{}
	return ch
}

func (w *waker) unregister(topic string, ch chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.waiters[topic], ch)
	if len(w.waiters[topic]) == 0 {
		delete(w.waiters, topic)
	}
}

func (w *waker) close() error {
	err := w.ps.Close()
	<-w.done
	return err
}

// DequeueWait is Dequeue that waits up to timeout for work when none is
// ready. It does not poll: an enqueue (from any process) wakes it through
// Redis pub/sub, a delayed run wakes it at its time, and when runs exist but
// limits hold them it looks again every Config.BlockPollInterval. It returns
// an empty slice on timeout, and ctx's error when ctx ends first. Waiters
// woken together look again in one coalesced call, and share the read of
// when the queue's next work is due.
func (q *Queue) DequeueWait(ctx context.Context, env, queue string, maxCount int, timeout time.Duration) ([]*Run, error) {
	if err := checkQueue(env, queue); err != nil {
		return nil, err
	}
	if err := q.checkMaxCount(maxCount); err != nil {
		return nil, err
	}
	qn := q.names(env, queue)
	qk := qn.qk
	return q.block(ctx, qn.wake+"|"+qn.member, timeout,
		func() ([]*Run, error) { return q.dequeueOne(ctx, qn, maxCount) },
		func() (*redis.ZSliceCmd, error) {
			s, err := q.rdb.ZScore(ctx, qk.Master(), qk.Member()).Result()
			if err == redis.Nil {
				return redis.NewZSliceCmdResult(nil, nil), nil
			}
			return redis.NewZSliceCmdResult([]redis.Z{{Score: s}}, err), err
		})
}

// DequeueShardWait is DequeueShard that waits up to timeout, like DequeueWait.
// As DequeueShard, it never returns runs with an error: runs served before
// ctx ended or a queue's call failed are returned with a nil error.
func (q *Queue) DequeueShardWait(ctx context.Context, shard, maxCount int, timeout time.Duration) ([]*Run, error) {
	if err := q.checkShard(shard); err != nil {
		return nil, err
	}
	if err := q.checkMaxCount(maxCount); err != nil {
		return nil, err
	}
	sh := q.space.Shard(shard)
	return q.block(ctx, sh.Wake(), timeout,
		func() ([]*Run, error) { return q.DequeueShard(ctx, shard, maxCount) },
		func() (*redis.ZSliceCmd, error) {
			cmd := q.rdb.ZRangeWithScores(ctx, sh.Master(), 0, 0)
			return cmd, cmd.Err()
		})
}

func (q *Queue) block(ctx context.Context, topic string, timeout time.Duration,
	try func() ([]*Run, error), next func() (*redis.ZSliceCmd, error)) ([]*Run, error) {
	if timeout < 0 {
		return nil, invalid("timeout", "must not be negative")
	}
	w, err := q.getWaker(ctx)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(timeout)
	for {
		// Register before looking, so a publish between the look and the
		// wait is not lost.
		ch := w.register(topic)
		began := time.Now()
		runs, err := try()
		ended := time.Now()
		if err != nil || len(runs) > 0 {
			w.unregister(topic, ch)
			return runs, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			w.unregister(topic, ch)
			return runs, nil
		}
		sleep := left
		if z, err := w.next(ctx, topic, began, ended, next, func(z []redis.Z) bool {
			return len(z) == 0 || int64(z[0].Score) > q.now()
		}); err != nil {
			w.unregister(topic, ch)
			return nil, err
		} else if len(z) > 0 {
			due := time.Duration(int64(z[0].Score)-q.now()) * time.Millisecond
			if due <= 0 {
				due = q.cfg.BlockPollInterval // work exists but limits hold it
			}
			sleep = min(sleep, due)
		}
		t := time.NewTimer(sleep)
		select {
		case <-ch:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			w.unregister(topic, ch)
			return nil, ctx.Err()
		case <-q.closed:
			t.Stop()
			w.unregister(topic, ch)
			return nil, ErrClosed
		}
		t.Stop()
		w.unregister(topic, ch)
	}
}
