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
// One subscription per Queue (per server on a Ring), opened at the first
// blocking call.
type waker struct {
	pss     []*redis.PubSub
	loops   sync.WaitGroup // a loop per PubSub
	mu      sync.Mutex
	waiters map[string]map[chan struct{}]struct{}

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
	groups, err := q.wakeGroups()
	if err != nil {
		return nil, err
	}
	w := &waker{waiters: map[string]map[chan struct{}]struct{}{}}
	for _, g := range groups {
		ps := g.c.Subscribe(ctx, g.chans...)
		w.pss = append(w.pss, ps)
		// Wait for every confirmation so that no publish after this point is missed.
		for range g.chans {
			msg, err := ps.Receive(ctx)
			if err == nil {
				if _, ok := msg.(*redis.Subscription); !ok {
					err = fmt.Errorf("runqueue: unexpected %T while subscribing", msg)
				}
			}
			if err != nil {
				_ = w.close()
				return nil, err
			}
		}
	}
	for _, ps := range w.pss {
		w.loops.Add(1)
		go w.loop(ps)
	}
	q.waker = w
	return w, nil
}

// wakeGroup is wake channels to subscribe through one client.
type wakeGroup struct {
	c     subscriber
	chans []string
}

// subscriber is a client of any kind (or a Ring's shard client).
type subscriber interface {
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// wakeGroups groups the shards' wake channels by the client to subscribe
// them through. A script PUBLISHes on the server of its shard's keys. A
// single server or a cluster (which forwards a PUBLISH to every node)
// needs one subscription. A Ring does not forward, and its Subscribe puts
// every channel on the ring server of the first; so on a Ring each channel
// is subscribed on the server the ring maps it to, the server of its
// shard's keys (the channel carries the shard's hash tag). The servers are
// those of the first blocking call: a Ring whose shard set changes later
// (SetAddrs, or a server that was down then and comes back) is not
// followed; the waits of the envs that moved fall back to their timers.
func (q *Queue) wakeGroups() ([]wakeGroup, error) {
	chans := make([]string, q.space.Shards())
	for i := range chans {
		chans[i] = q.space.Shard(i).Wake()
	}
	ring, ok := q.rdb.(*redis.Ring)
	if !ok {
		return []wakeGroup{{c: q.rdb, chans: chans}}, nil
	}
	var groups []wakeGroup
	at := map[*redis.Client]int{}
	for _, ch := range chans {
		c, err := ring.GetShardClientForKey(ch)
		if err != nil {
			return nil, err
		}
		i, ok := at[c]
		if !ok {
			i = len(groups)
			at[c] = i
			groups = append(groups, wakeGroup{c: c})
		}
		groups[i].chans = append(groups[i].chans, ch)
	}
	return groups, nil
}

// loop feeds ps's wake-ups to the waiters. ps's subscriptions were
// confirmed before loop started, so a confirmation here is a resubscription
// after go-redis reconnected: what was published while the connection was
// down is lost, so every waiter looks again (a spurious wake-up costs a
// look). go-redis drops the pongs of its health check; anything else is
// ignored.
func (w *waker) loop(ps *redis.PubSub) {
	defer w.loops.Done()
	for msg := range ps.ChannelWithSubscriptions() {
		switch msg := msg.(type) {
		case *redis.Message:
			w.notify(msg.Channel)
			w.notify(msg.Channel + "|" + msg.Payload)
		case *redis.Subscription:
			w.notifyAll()
		}
	}
}

func (w *waker) notify(topic string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	wakeAll(w.waiters[topic])
}

func (w *waker) notifyAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, chs := range w.waiters {
		wakeAll(chs)
	}
}

// wakeAll wakes the waiters of chs without blocking: a waiter's channel
// holds one wake-up, and one is as good as more.
func wakeAll(chs map[chan struct{}]struct{}) {
	for ch := range chs {
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
	var errs []error
	for _, ps := range w.pss {
		errs = append(errs, ps.Close())
	}
	w.loops.Wait()
	return errors.Join(errs...)
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
