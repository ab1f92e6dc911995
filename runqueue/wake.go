package runqueue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/keys"
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
// Redis pub/sub, a delayed run wakes it at its time, and while the queue
// holds ready runs that limits hold back it looks again every
// Config.BlockPollInterval, whatever their scores say (a run's score is
// its writer's clock, which may be ahead of this Queue's). It returns an
// empty slice on timeout, and ctx's error when ctx ends first. Waiters
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
	return q.block(ctx, qn.wake+"|"+qn.member, timeout,
		func() ([]*Run, error) { return q.dequeueOne(ctx, qn, maxCount) },
		func() (*redis.ZSliceCmd, error) { return nextZ(q.queueNext(ctx, qn.qk)) })
}

// DequeueShardWait is DequeueShard that waits up to timeout, like DequeueWait.
// It looks again every Config.BlockPollInterval while a queue DequeueShard
// reads (one scored up to now + Config.ShardLookAhead and holding ready
// runs, or one scored up to now) has work that limits hold back; a queue
// whose only work is delayed wakes it at its time. As DequeueShard, it
// never returns runs with an error: runs served before ctx ended or a
// queue's call failed are returned with a nil error.
func (q *Queue) DequeueShardWait(ctx context.Context, shard, maxCount int, timeout time.Duration) ([]*Run, error) {
	if err := q.checkShard(shard); err != nil {
		return nil, err
	}
	if err := q.checkMaxCount(maxCount); err != nil {
		return nil, err
	}
	return q.block(ctx, q.space.Shard(shard).Wake(), timeout,
		func() ([]*Run, error) { return q.DequeueShard(ctx, shard, maxCount) },
		func() (*redis.ZSliceCmd, error) { return nextZ(q.shardNext(ctx, shard)) })
}

// nextZ is a read of the next work time as waker.next and block take it:
// one entry scored at, or none when ok is false.
func nextZ(at int64, ok bool, err error) (*redis.ZSliceCmd, error) {
	if err != nil {
		return nil, err
	}
	var z []redis.Z
	if ok {
		z = []redis.Z{{Score: float64(at)}}
	}
	return redis.NewZSliceCmdResult(z, nil), nil
}

// hasReady queues on p a look at whether the queue of qk holds ready runs
// (its ckIndex has an entry: a variant with ready runs, held back by limits
// or not).
func hasReady(ctx context.Context, p redis.Pipeliner, qk keys.Queue) *redis.StringSliceCmd {
	return p.ZRange(ctx, qk.CkIndex(), 0, 0)
}

// queueNext reads when the next work of the queue of qk is due, by this
// Queue's clock (ms): at or before now when the queue holds ready runs
// (Dequeue serves them, or limits hold them back: look again after
// Config.BlockPollInterval), else its earliest delayed run's time; ok is
// false when the queue has no queued run. The queue's master score alone
// does not tell: it is the earliest of its ready head's score and its
// delayed head's time, both from its writers' clocks, and a ready head
// scored by a writer ahead of this clock would read as work to come.
// One round trip.
func (q *Queue) queueNext(ctx context.Context, qk keys.Queue) (at int64, ok bool, err error) {
	var score *redis.FloatCmd
	var ready *redis.StringSliceCmd
	_, err = q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		score = p.ZScore(ctx, qk.Master(), qk.Member())
		ready = hasReady(ctx, p, qk)
		return nil
	})
	switch {
	case errors.Is(score.Err(), redis.Nil):
		return 0, false, nil
	case err != nil:
		return 0, false, err
	}
	at = int64(score.Val())
	if len(ready.Val()) > 0 {
		at = min(at, q.now())
	}
	return at, true, nil
}

// shardNextPeek is how many of a shard's earliest queues shardNext looks
// at.
const shardNextPeek = 64

// shardNext reads when the next work of shard is due for DequeueShard, by
// this Queue's clock (ms): at or before now when a queue it reads has work
// (limits hold it back, as the caller's call just served nothing: look
// again after Config.BlockPollInterval); ok is false when the shard has no
// queued run. When the master's head is scored after now, the earliest
// shardNextPeek queues are looked at (one more round trip, for those not
// already found without ready runs at their score: see aheadReady): a queue that
// holds ready runs is due when its score comes within
// Config.ShardLookAhead of now (at once when it is within it already), a
// queue whose only work is delayed at its score (its time), so such a
// queue is waited on until its time, not polled; but no later than when
// the look-ahead looks again at a queue it found without ready runs
// (aheadRecheck), so that a ready run a writer ahead put there meanwhile
// waits no longer than it would for DequeueShard (helper-163: a wait woken
// by the run's write within that second slept until the queue's delayed
// work, 6 s later).
func (q *Queue) shardNext(ctx context.Context, shard int) (at int64, ok bool, err error) {
	z, err := q.rdb.ZRangeWithScores(ctx, q.space.Shard(shard).Master(), 0, shardNextPeek-1).Result()
	if err != nil || len(z) == 0 {
		return 0, false, err
	}
	at = int64(z[0].Score)
	look := q.shardLookAhead()
	if look == 0 || at <= q.now() {
		return at, true, nil
	}
	// Only a queue scored before the head's score + look can be due
	// before the head.
	end := 0
	for end < len(z) && int64(z[end].Score)-look < at {
		end++
	}
	ready, recheck, err := q.aheadReady(ctx, z[:end], q.now())
	if err != nil {
		return 0, false, err
	}
	at = min(at, recheck)
	for i, e := range z[:end] {
		if ready[i] {
			at = min(at, int64(e.Score)-look)
		}
	}
	return at, true, nil
}

// shardLookAhead is Config.ShardLookAhead in ms; 0: no look ahead.
func (q *Queue) shardLookAhead() int64 { return max(0, ms(q.cfg.ShardLookAhead)) }

// readyOf says, in one pipeline, which of the queues of qks hold ready
// runs (see hasReady). A queue whose read fails for a reason of its own
// (queueFault: a key of the wrong type) holds none for it, so one queue's
// broken key does not fail the calls that look at the others (helper-163:
// every shard call failed while such a queue was in the look-ahead).
func (q *Queue) readyOf(ctx context.Context, qks []keys.Queue) ([]bool, error) {
	if len(qks) == 0 {
		return nil, nil
	}
	cmds := make([]*redis.StringSliceCmd, len(qks))
	_, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, qk := range qks {
			cmds[i] = hasReady(ctx, p, qk)
		}
		return nil
	})
	out := make([]bool, len(qks))
	for i, c := range cmds {
		if e := c.Err(); e != nil {
			if ctxEnded(ctx) || !queueFault(e) {
				return nil, e
			}
			continue
		}
		out[i] = len(c.Val()) > 0
	}
	if err != nil && (ctxEnded(ctx) || !queueFault(err)) {
		return nil, err
	}
	return out, nil
}

func (q *Queue) block(ctx context.Context, topic string, timeout time.Duration,
	try func() ([]*Run, error), next func() (*redis.ZSliceCmd, error)) ([]*Run, error) {
	if timeout < 0 {
		return nil, invalid("timeout", "must not be negative")
	}
	w, err := q.getWaker(ctx)
	if err != nil {
		return nil, ctxFirst(ctx, err)
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
			if len(runs) == 0 {
				err = ctxFirst(ctx, err)
			}
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
			return nil, ctxFirst(ctx, err)
		} else if len(z) > 0 {
			due := time.Duration(int64(z[0].Score)-q.now()) * time.Millisecond
			if due <= 0 {
				// Work exists but limits hold it (queueNext, shardNext:
				// ready runs count as due whatever their scores).
				due = q.cfg.BlockPollInterval
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

// ctxFirst is err, or ctx's error when ctx has ended: a blocking call
// returns its context's error when the context ends first, also when the
// call it was making failed later for it (a command that go-redis did not
// end at the deadline, see "Deadlines" in the README).
func ctxFirst(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	if ctxEnded(ctx) {
		return context.DeadlineExceeded
	}
	return err
}

// ctxEnded says whether ctx has ended, or its deadline passed before its
// timer told it: go-redis gives a socket ctx's deadline (a pub/sub read
// does whatever ContextTimeoutEnabled says), and the read's timeout can
// come first.
func ctxEnded(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}
