package runqueue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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
// come (a time after now), or, for block, work due with the time of work
// to come sooner than the poll that the caller wakes for (nextZ's second
// entry: the work taken since does not bring that forward). When it says
// work is due otherwise (the caller would sleep the poll interval, while
// a later delayed run may be due sooner), or the read failed (its error
// may be its starter's context), the joiner takes a read that started
// after its look ended instead (future nil: any answer), as it would have
// read itself then, shared with the joiners in the same case. A caller that starts a read starts it after its look
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

// waiting says whether a wait on topic is registered.
func (w *waker) waiting(topic string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.waiters[topic]) > 0
}

// waiting says whether a wait on topic is registered on q (a DequeueWait
// of its queue).
func (q *Queue) waiting(topic string) bool {
	q.closeMu.Lock()
	w := q.waker
	q.closeMu.Unlock()
	return w != nil && w.waiting(topic)
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
// its writer's clock, which may be ahead of this Queue's), or sooner, at
// the time of the queue's first delayed run due within that poll; but a
// look at such a time that serves nothing (that run held too: its key at
// its limit) spends the sooner look until a poll has passed or a wake-up
// came (see block). It returns an empty slice on timeout, and ctx's error
// when ctx ends first. Waiters woken together look again in one coalesced
// call, and share the read of when the queue's next work is due. With
// VtimeScheduling and an env limit, a wait that ends empty (timeout or
// ctx) leaves its env's waiting line (one more script call, at most a
// second), unless another DequeueWait of the queue on this Queue still
// waits: the env's free slots stop being left to the queue, and a caller
// that waits again at once keeps its queue's place.
func (q *Queue) DequeueWait(ctx context.Context, env, queue string, maxCount int, timeout time.Duration) ([]*Run, error) {
	if err := checkQueue(env, queue); err != nil {
		return nil, err
	}
	if err := q.checkMaxCount(maxCount); err != nil {
		return nil, err
	}
	qn := q.names(env, queue)
	topic := qn.wake + "|" + qn.member
	runs, err := q.block(ctx, topic, timeout,
		func() ([]*Run, error) { return q.dequeueOne(ctx, qn, maxCount) },
		func(from int64) (*redis.ZSliceCmd, error) { return nextZ(q.queueNext(ctx, qn.qk, from, nil)) })
	if len(runs) == 0 && (err == nil || ctx.Err() != nil && errors.Is(err, ctx.Err())) && q.leavesLine(env, queue) &&
		!q.waiting(topic) {
		// The wait ends empty (its timeout, or ctx's end): its tries may
		// have marked the queue in its env's waiting line, and the env's
		// free slots would be left to that mark, which nobody serves, for
		// the rest of its life (helper-207: the env idle 59 s after a
		// DequeueWait of 300 ms). It is cut to the leaving grace; a caller
		// that waits again at once renews it in its place (leaveLine). One
		// call, bounded by a second, after ctx's end too. Not while
		// another DequeueWait of the queue on this Queue waits: it keeps
		// the mark (its leave's wake-up would only make those tries
		// again: helper-209, 20 waiters ending in turn made 70-76 calls
		// against 23).
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_, _ = q.leaveLine(lctx, qn, nil)
		cancel()
	}
	return runs, err
}

// DequeueShardWait is DequeueShard that waits up to timeout, like DequeueWait.
// It looks again every Config.BlockPollInterval while a queue DequeueShard
// reads (one scored up to now + Config.ShardLookAhead and holding ready
// runs, or one scored up to now) has work that limits hold back, or sooner,
// when a queue scored after now is due within that poll (see shardNext),
// at most once a poll while such looks serve nothing (see block); a queue
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
		func(from int64) (*redis.ZSliceCmd, error) { return nextZ(q.shardNext(ctx, shard, from)) })
}

// nextZ is a read of the next work time as waker.next and block take it:
// none when ok is false, else an entry scored at, and a second one scored
// soon when soon is set (work due before the poll beside due work that
// limits hold, or due since the look began: see queueNext).
func nextZ(at, soon int64, ok bool, err error) (*redis.ZSliceCmd, error) {
	if err != nil {
		return nil, err
	}
	var z []redis.Z
	if ok {
		z = []redis.Z{{Score: float64(at)}}
		if soon != 0 {
			z = append(z, redis.Z{Score: float64(soon)})
		}
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
// One round trip; with from set (a look's start, this Queue's clock, ms)
// it also reads the delay index's first variant due after from: with ready
// runs there, when it is due before the poll ends, its time is sooner (0: none;
// at or before now: it fell due after the look began), for a waiter that
// may look early for it (see block: helper-177, a free key's run due
// 281 ms on waited 1.012 s beside held keys' runs).
func (q *Queue) queueNext(ctx context.Context, qk keys.Queue, from int64, counts *lookCounts) (at, sooner int64, ok bool, err error) {
	var score *redis.FloatCmd
	var ready *redis.StringSliceCmd
	var delayed *redis.ZSliceCmd
	_, err = q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		score = p.ZScore(ctx, qk.Master(), qk.Member())
		ready = hasReady(ctx, p, qk)
		if from > 0 {
			// In the same round trip (helper-191: a second one cost a
			// look beside held work 45% more round trips): the delay
			// index's first variant due after from, kept below when due
			// before the poll ends.
			delayed = p.ZRangeByScoreWithScores(ctx, qk.DelayIndex(), &redis.ZRangeBy{
				Min: exclusive(from), Max: "+inf", Count: 1})
		}
		if counts != nil { // (last: see below)
			counts.env = p.Get(ctx, qk.Env.InflightCount())
			counts.held = readHeld(ctx, p, qk)
		}
		return nil
	})
	if counts != nil && errors.Is(err, redis.Nil) && !errors.Is(score.Err(), redis.Nil) {
		// An env with nothing in flight has no count: GET's nil is then
		// the pipeline's first error; only the reads after it may fail.
		err = counts.held.err()
	}
	switch {
	case errors.Is(score.Err(), redis.Nil):
		return 0, 0, false, nil
	case err != nil:
		return 0, 0, false, err
	}
	at = int64(score.Val())
	if len(ready.Val()) > 0 {
		now := q.now()
		at = min(at, now)
		if delayed != nil {
			if z := delayed.Val(); len(z) > 0 && int64(z[0].Score) < now+q.pollMs() {
				sooner = int64(z[0].Score)
			}
		}
	}
	return at, sooner, true, nil
}

// lookCounts are the in-flight counts queueNext reads when given one (a
// flag-off Worker's envLine): its env's and its queue's.
type lookCounts struct {
	env  *redis.StringCmd
	held heldLen
}

// envState says whether the env is at its limit lim.Env (held) or below
// it (free), the queue not at its own (neither: the queue at its limit, or
// a read failed).
func (c *lookCounts) envState(lim Limits) envLook {
	n, err := envCount(c.env)
	if err != nil || lim.Queue > 0 && c.held.val() >= int64(lim.Queue) {
		return envLook{}
	}
	return envLook{held: n >= int64(lim.Env), free: n < int64(lim.Env), count: n}
}

// envLook is what a look found of the env's limit, the queue holding
// ready runs (see nextLookOpen), and the env's count it read.
type envLook struct {
	held, free bool
	count      int64
}

// exclusive is the exclusive score bound at ms of a sorted-set range.
func exclusive(ms int64) string { return "(" + strconv.FormatInt(ms, 10) }

// pollMs is Config.BlockPollInterval in ms.
func (q *Queue) pollMs() int64 { return ms(q.cfg.BlockPollInterval) }

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
// work, 6 s later). With from set (a look's start, this Queue's clock, ms),
// when at is at or before now, sooner is the first time after from and
// before the poll ends at which a queue is due, as above, of those scored
// after from, or, when none of those is, at which a queue due now has
// delayed work due (dueDelayed: of the first shardNextPeek queues); 0:
// none; at or before now: it fell due after the look began (see
// shardSoon). A waiter may look early at it (see block: helper-184, an
// idle env's run due in 200 ms was served 1.8 s late at a poll of 2 s
// whenever another env of the shard was at its limit).
func (q *Queue) shardNext(ctx context.Context, shard int, from int64) (at, sooner int64, ok bool, err error) {
	master := q.space.Shard(shard).Master()
	z, err := q.rdb.ZRangeWithScores(ctx, master, 0, shardNextPeek-1).Result()
	if err != nil || len(z) == 0 {
		return 0, 0, false, err
	}
	at = int64(z[0].Score)
	now := q.now()
	look := q.shardLookAhead()
	if at <= now {
		if from <= 0 {
			return at, 0, true, nil
		}
		// One more round trip: the queues scored after from, and the
		// delayed work of the due queues read (their score, their due
		// work's, hides it).
		var after *redis.ZSliceCmd
		var delayed []*redis.ZSliceCmd
		// (The pipeline's error is a command's: each is looked at below.)
		_, _ = q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			after = p.ZRangeByScoreWithScores(ctx, master, &redis.ZRangeBy{
				Min: exclusive(from), Max: exclusive(now + look + q.pollMs()), Count: shardNextPeek})
			delayed = q.dueDelayed(ctx, p, z, from, now)
			return nil
		})
		if err = after.Err(); err == nil {
			sooner, err = q.shardSoon(ctx, after.Val(), nil, from, now)
		}
		if err != nil {
			return 0, 0, false, err
		}
		var first int64 // the due queues' first delayed work
		for _, c := range delayed {
			if c.Err() != nil && (ctxEnded(ctx) || !queueFault(c.Err())) {
				return 0, 0, false, c.Err()
			}
			if d := c.Val(); len(d) > 0 && (first == 0 || int64(d[0].Score) < first) {
				first = int64(d[0].Score)
			}
		}
		// Only when no queue scored after from is due within the poll: a
		// due queue's delayed run is as likely held as free, and an early
		// look it spends must not take the one helper-184's idle env had.
		if sooner == 0 {
			sooner = first
		}
		return at, sooner, true, nil
	}
	if look == 0 {
		return at, 0, true, nil
	}
	// Only a queue scored before the head's score + look can be due
	// before the head.
	end := 0
	for end < len(z) && int64(z[end].Score)-look < at {
		end++
	}
	ready, recheck, err := q.aheadReady(ctx, z[:end], now)
	if err != nil {
		return 0, 0, false, err
	}
	at = min(at, recheck)
	for i, e := range z[:end] {
		if ready[i] {
			at = min(at, int64(e.Score)-look)
		}
	}
	if at <= now && from > 0 {
		// A queue in the look-ahead holds ready runs that the caller's
		// call left (limits hold them back): as above, with z, whose
		// first end entries' ready runs were just read.
		if sooner, err = q.shardSoon(ctx, z, ready, from, now); err != nil {
			return 0, 0, false, err
		}
	}
	return at, sooner, true, nil
}

// dueDelayed queues on p, for each queue of z (a shard's master entries,
// in order) due at now, a read of its delay index's first variant due
// after from and before now + Config.BlockPollInterval: a free key's
// delayed run in a queue that holds due work that limits hold back, which
// the queue's master score (its due work's) does not show (a write of it
// wakes the waiters: see place_soonest in lua/lib/place.lua). A queue
// whose member does not decode is skipped.
func (q *Queue) dueDelayed(ctx context.Context, p redis.Pipeliner, z []redis.Z, from, now int64) []*redis.ZSliceCmd {
	var out []*redis.ZSliceCmd
	by := &redis.ZRangeBy{Min: exclusive(from), Max: exclusive(now + q.pollMs()), Count: 1}
	for _, e := range z {
		if int64(e.Score) > now {
			break
		}
		m, _ := e.Member.(string)
		env, queue, err := keys.DecodeQueueMember(m)
		if err != nil {
			continue
		}
		out = append(out, p.ZRangeByScoreWithScores(ctx, q.space.Env(env).Queue(queue).DelayIndex(), by))
	}
	return out
}

// shardSoon is the first time after from (a look's start) and before now +
// Config.BlockPollInterval at which a queue of z (master entries of a
// shard scored after from, in order) is due for DequeueShard: one that holds
// ready runs when its score comes within Config.ShardLookAhead of now, one
// whose only work is delayed at its score; 0 for none. Which hold ready
// runs it reads as the look-ahead does (aheadReady: one round trip, for
// those not already found without ready runs at their score), for the
// entries that can be due before the poll ends and that known (read at
// now, for z's first entries) does not already tell. The look-ahead's rechecks
// (aheadRecheck) do not count: a wait beside held work looks again at the
// poll, as before, and such a time would spend its early look (see block).
func (q *Queue) shardSoon(ctx context.Context, z []redis.Z, known []bool, from, now int64) (int64, error) {
	look, end := q.shardLookAhead(), now+q.pollMs()
	n := 0
	for n < len(z) && int64(z[n].Score)-look < end {
		n++
	}
	z = z[:n]
	// Those scored up to now fell due since the look began; the others
	// are read as the look-ahead reads them.
	k := 0
	for k < len(z) && int64(z[k].Score) <= now {
		k++
	}
	ready := make([]bool, len(z))
	if look > 0 {
		copy(ready, known)
		if rest := max(k, len(known)); rest < len(z) {
			r, _, err := q.aheadReady(ctx, z[rest:], now)
			if err != nil {
				return 0, err
			}
			copy(ready[rest:], r)
		}
	}
	var soon int64
	for i, e := range z {
		at := int64(e.Score)
		if i >= k && ready[i] {
			at -= look
		}
		if at > from && at < end && (soon == 0 || at < soon) {
			soon = at
		}
	}
	return soon, nil
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

// block runs try until it serves something, an error, the timeout, ctx's
// end or Close, waiting between tries for a wake-up (a publish on topic)
// or a timer at the next work's time (next: see queueNext, shardNext).
// While due work that limits hold back is there, the timer is
// Config.BlockPollInterval, or sooner when next says other work is due
// within it (an idle env's delayed run beside an env at its limit): the
// early look. But such work may be held too (a key at its limit with
// delayed runs of its own, an env at its limit with delayed runs in many
// queues), so an early look that serves nothing spends the early look:
// the waits after it are the whole poll, and next does not read the
// sooner work, until a poll has passed since or a wake-up came (helper-186:
// waking at every such time, DequeueWait made 31-101 script calls in
// 1.5 s where the poll makes 3). So looks that serve nothing come at most
// once more a poll than the poll's own (and once more a wake-up). An early
// look does not put the poll's look off: the wait after it ends at the
// poll counted from the last look that was not early (see earlyLooks).
func (q *Queue) block(ctx context.Context, topic string, timeout time.Duration,
	try func() ([]*Run, error), next func(from int64) (*redis.ZSliceCmd, error)) ([]*Run, error) {
	if timeout < 0 {
		return nil, invalid("timeout", "must not be negative")
	}
	w, err := q.getWaker(ctx)
	if err != nil {
		return nil, ctxFirst(ctx, err)
	}
	deadline := time.Now().Add(timeout)
	poll := q.cfg.BlockPollInterval
	var el earlyLooks
	early := false // this look was an early one
	for {
		// Register before looking, so a publish between the look and the
		// wait is not lost.
		ch := w.register(topic)
		began, from := time.Now(), q.now()
		runs, err := try()
		ended := time.Now()
		if err != nil || len(runs) > 0 {
			w.unregister(topic, ch)
			if len(runs) == 0 {
				err = ctxFirst(ctx, err)
			}
			return runs, err
		}
		wasEarly := early
		el.idle(early, ended, poll)
		left := time.Until(deadline)
		if left <= 0 {
			w.unregister(topic, ch)
			return runs, nil
		}
		soon := !q.noEarlyLook && el.allowed(ended)
		if !soon {
			from = 0
		}
		sleep := left
		early = false
		if z, err := w.next(ctx, topic, began, ended, func() (*redis.ZSliceCmd, error) { return next(from) }, func(z []redis.Z) bool {
			now := q.now()
			// Work due in the shared answer may have been taken since
			// (see waker.next), unless this caller looks at the sooner
			// work's time anyway: what was taken does not bring it forward.
			_, ok := q.soonWithin(z, now)
			return len(z) == 0 || int64(z[0].Score) > now || soon && ok
		}); err != nil {
			w.unregister(topic, ch)
			return nil, ctxFirst(ctx, err)
		} else if len(z) > 0 {
			now := q.now()
			due := time.Duration(int64(z[0].Score)-now) * time.Millisecond
			if due <= 0 {
				// Work exists but limits hold it (queueNext, shardNext:
				// ready runs count as due whatever their scores): look
				// again after the poll, or at the sooner work's time.
				due = el.pollWait(wasEarly, poll)
				if d, ok := q.soonWithin(z, now); soon && ok {
					due, early = d, true
				}
			}
			sleep = min(sleep, due)
		}
		t := time.NewTimer(sleep)
		select {
		case <-ch:
			early = false
			el.reset()
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

// earlyLooks is what a wait loop beside held work (block, a Worker's
// fetch loop) keeps of its early looks: spent, when an early look last
// served nothing + the poll (no early look before then), and pollAt, when
// the poll's look is due after the last look that served nothing and was
// not early (an early look does not put it off: helper-193, counted from
// the early look, a run an ack freed, which publishes nothing, waited up
// to twice the poll).
type earlyLooks struct {
	spent, pollAt time.Time
}

// idle notes a look that served nothing and ended at ended (early: an
// early look).
func (e *earlyLooks) idle(early bool, ended time.Time, poll time.Duration) {
	if early {
		e.spent = ended.Add(poll)
	} else {
		e.pollAt = ended.Add(poll)
	}
}

// reset: a wake-up came or a look served runs; early looks may come again.
func (e *earlyLooks) reset() { e.spent = time.Time{} }

// allowed says whether a wait that starts at now may look early.
func (e *earlyLooks) allowed(now time.Time) bool { return !now.Before(e.spent) }

// pollWait is how long to wait for held work after a look that served
// nothing: the poll, or after an early look (early), until the poll's
// look.
func (e *earlyLooks) pollWait(early bool, poll time.Duration) time.Duration {
	if early && !e.pollAt.IsZero() {
		return max(0, time.Until(e.pollAt))
	}
	return poll
}

// soonWithin is how long from now (ms, this Queue's clock) until the sooner
// work of a read of the next work time (nextZ's second entry), 0 when it
// fell due already (since the look began), and whether there is such work
// due within Config.BlockPollInterval.
func (q *Queue) soonWithin(z []redis.Z, now int64) (time.Duration, bool) {
	if len(z) < 2 {
		return 0, false
	}
	return q.soonIn(int64(z[1].Score), now)
}

// soonIn is how long from now (ms, this Queue's clock) until sooner (a
// time queueNext or shardNext read; 0: none), 0 when it is due already,
// and whether it is due within Config.BlockPollInterval: the early look's
// time, for block and a Worker's nextLook alike.
func (q *Queue) soonIn(sooner, now int64) (time.Duration, bool) {
	if sooner == 0 {
		return 0, false
	}
	d := max(0, time.Duration(sooner-now)*time.Millisecond)
	return d, d < q.cfg.BlockPollInterval
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
