package runqueue

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// fetchDepth is how many calls one source may have in flight. A second
// call goes out only while the source has a backlog (its last call got
// all it asked for): Redis then serves one call while the worker decodes
// and hands out the other, so Redis and Go work at the same time rather
// than in turn.
const fetchDepth = 2

// maxGather bounds how long a source waits for more free slots before a
// fetch (see fetchLoop.startGather).
const maxGather = 5 * time.Millisecond

// source is one thing a worker fetches from: a base queue or a shard. One
// goroutine (loop) decides its calls and sends the acks of its runs.
type source struct {
	w          *Worker
	env, queue string // a queue source
	shard      int    // a shard source; -1 for a queue source
	topic      string // wake-up topic
	kick       chan struct{}
	// lined: a queue source of a flag-off Worker, whose loop takes its
	// Queue's waiting line for the env's limit, line (Queue.enterLine),
	// which wakes the source by nudged; inLine (guarded by line.mu): the
	// source waits in it.
	lined  bool
	line   *envLine
	nudged chan struct{}
	inLine bool
	// lineHeld (guarded by line.mu): s joined on a look that found the
	// env at its limit (see envLine.pass). relook (guarded by line.mu):
	// the nudge pending, if any, asks s to look again, no wake-up of the
	// line (see Queue.enterLine). lookedAlone (guarded by line.mu): s's
	// last call's finish found the line not shared (envLine.sharedFor).
	lineHeld, relook, lookedAlone bool
	// lineLimit (guarded by line.mu): the env's limit s's queue had when
	// it joined (LimitsFor may give the env's queues different ones: see
	// envLine.passAbove).
	lineLimit int

	mu   sync.Mutex
	acks []*job
}

func (s *source) poke() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *source) addAck(j *job) {
	s.mu.Lock()
	s.acks = append(s.acks, j)
	n := len(s.acks)
	s.mu.Unlock()
	if n == 1 {
		s.poke()
	}
}

// takeAcks takes up to maxBatch pending acks.
func (s *source) takeAcks() []*job {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.acks) == 0 {
		return nil
	}
	n := min(len(s.acks), maxBatch)
	out := append([]*job(nil), s.acks[:n]...)
	rest := copy(s.acks, s.acks[n:])
	clear(s.acks[rest:])
	s.acks = s.acks[:rest]
	return out
}

// putBack returns acks whose call failed, ahead of newer ones.
func (s *source) putBack(acks []*job) {
	s.mu.Lock()
	s.acks = append(append(make([]*job, 0, len(acks)+len(s.acks)), acks...), s.acks...)
	s.mu.Unlock()
}

// dropAcks takes every pending ack, when the loop gives up sending them or
// a hard stop ends it, reports each as OutcomeLeaseLost (its run runs again
// once its lease passes: its result is lost) and returns how many.
func (s *source) dropAcks() int {
	s.mu.Lock()
	acks := s.acks
	s.acks = nil
	s.mu.Unlock()
	for _, j := range acks {
		s.w.obs.Handled(j.run.Env, j.run.Queue, j.took, OutcomeLeaseLost)
	}
	return len(acks)
}

func (s *source) pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.acks)
}

func (s *source) isDrained() bool { return isDone(s.w.drained) }

// maxRefusedResend bounds how long a stopping fetch loop sends its acks
// again while Redis refuses them unrun (see fetchLoop.finish).
const maxRefusedResend = time.Minute

// resendRefused says whether a stopping loop whose call failed with err
// sends its acks again: Redis refused the call unrun (a slot on the move,
// a node loading, a busy script), a pending ack's lease lasts, and such
// refusals, every failure since, began less than maxRefusedResend ago.
func (l *fetchLoop) resendRefused(err error) bool {
	if !refusedUnrun(err) {
		l.refusedFrom = time.Time{}
		return false
	}
	if l.refusedFrom.IsZero() {
		l.refusedFrom = time.Now()
	}
	return time.Since(l.refusedFrom) < maxRefusedResend && l.s.acksLive()
}

// acksLive says whether a pending ack's lease is still ahead (by
// Config.Clock): sending it again may still settle its run.
func (s *source) acksLive() bool {
	now := s.w.q.cfg.Clock.Now().UnixMilli()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, j := range s.acks {
		if j.lease.Load() > now {
			return true
		}
	}
	return false
}

func (s *source) attrs(kv ...any) []any {
	if s.shard >= 0 {
		return append([]any{"shard", s.shard}, kv...)
	}
	return append([]any{"env", s.env, "queue", s.queue}, kv...)
}

// fetchCall is one call of a source: the acks it carries, the slots it
// fills, and what came back. ackErr says whether the acks must be sent
// again, err whether the call failed. Runs come back even with an error
// when some were dequeued (DequeueShard stops at the first queue that
// fails): they are held, so they are handed out.
type fetchCall struct {
	acks  []*job
	ks    []int
	final bool // started once the stop was forced
	hints int  // the loop's hints when it started (fetchLoop.hints)
	early bool // the loop's early look (see fetchLoop.el)
	// leave: a leave of this queue's env's waiting line with the acks
	// (Queue.leaveLine), no runs asked; nil for any other call.
	leave *queueNames
	// visits: a shard call's queues that went through, and whether each
	// got fewer runs than asked (see dequeueShard).
	visits  map[*queueNames]bool
	from    int64 // Config.Clock when it started (ms): see Queue.queueNext
	runs    []*Run
	ackErrs []error
	ackErr  error
	err     error
	fault   error // a failure of a queue's own that a shard fetch passed over (logged, not counted)
	took    time.Duration
	began   int64 // Worker.mono when the call began: its runs' leases start after it
	// released: its source's envLine's releases when a call for runs began
	// (envLine.join); lineAcks: its acks count in envLine.acking.
	released int64
	lineAcks bool
}

// acksAlone says whether c carries acks and asks for no runs.
func (c *fetchCall) acksAlone() bool { return len(c.ks) == 0 && len(c.acks) > 0 }

// acked is how many of c's acks this call made (the others failed or were
// gone before).
func (c *fetchCall) acked() int {
	if c.ackErr != nil {
		return 0
	}
	n := 0
	for i := range c.acks {
		if c.ackErrs == nil || c.ackErrs[i] == nil {
			n++
		}
	}
	return n
}

func (s *source) fetch(c *fetchCall) {
	w := s.w
	ctx := w.ctx()
	began := time.Now()
	c.began = w.mono()
	defer func() { c.took = time.Since(began) }()
	ackRuns := make([]*Run, len(c.acks))
	for i, j := range c.acks {
		ackRuns[i] = j.run
	}
	n := len(c.ks)
	if s.shard < 0 {
		if c.leave != nil {
			// (bounded as the leave at a stop: helper-209)
			lctx, cancel := context.WithTimeout(ctx, time.Second)
			c.ackErrs, c.err = w.q.leaveLine(lctx, c.leave, ackRuns)
			cancel()
		} else {
			c.runs, c.ackErrs, c.err = w.q.ackAndDequeue(ctx, ackRuns, s.env, s.queue, n)
		}
		if c.ackErrs == nil || len(ackRuns) == 0 {
			c.ackErr = c.err // (with results, the acks were made: see AckAndDequeue)
		}
		return
	}
	if len(ackRuns) > 0 {
		c.ackErrs, c.ackErr = w.q.ackMany(ctx, ackRuns, true)
		for i, e := range c.ackErrs {
			if e == nil {
				c.acks[i].acked.Store(true)
			}
		}
		if c.ackErr != nil {
			c.err = c.ackErr
			return
		}
	}
	if n > 0 {
		var visit func(*queueNames, bool)
		if w.q.cfg.VtimeScheduling { // (the line is kept with the flag on only)
			c.visits = map[*queueNames]bool{}
			visit = func(qn *queueNames, short bool) {
				if !short || w.q.leavesLine(qn.qk.Env.Name(), qn.qk.Name()) {
					c.visits[qn] = short
				}
			}
		}
		c.runs, c.fault, c.err = w.q.dequeueShard(ctx, s.shard, n, visit)
	}
}

// leaveAll leaves the env's waiting line for each of qs, in turn, until
// one fails (best effort: a mark left in place lapses by itself).
func leaveAll(ctx context.Context, q *Queue, qs []*queueNames) {
	for _, qn := range qs {
		if _, err := q.leaveLine(ctx, qn, nil); err != nil {
			return
		}
	}
}

// dispatch hands runs to the handler goroutines, runs[i] in slot ks[i].
// A job's heartbeat clock (job.beat) starts now, after the lease began
// (at the fetch's call): the heartbeat's monotonic rule never finds a
// lease due before its Config.Clock rule would, with a clock in step.
// Its expiry timer counts from the call's start (began), before the lease
// began, so it is never late however long the reply took (it fires at
// once when the reply came after its time).
func (s *source) dispatch(runs []*Run, ks []int, began int64) {
	w := s.w
	mono := w.mono()
	for i, r := range runs {
		j := &job{run: r, src: s, slot: ks[i]}
		j.lease.Store(r.LeaseDeadline.UnixMilli())
		j.beat.Store(mono)
		j.expiry = time.AfterFunc(w.expiresIn(began), func() { w.expire(j) })
		w.held[ks[i]].Store(j)
		w.jobs <- j // never blocks: the channel has a place per slot
	}
}

// settled reports what became of acks that were sent.
func (s *source) settled(acks []*job, errs []error) {
	w := s.w
	for i, j := range acks {
		var err error
		if errs != nil {
			err = errs[i]
		}
		r := j.run
		if err == nil || err == errGoneBefore && (!j.expired.Load() || j.acked.Load()) {
			// (gone before: this holder's earlier call acked it, its
			// reply lost or its batch failed elsewhere)
			w.obs.Handled(r.Env, r.Queue, j.took, OutcomeAck)
			continue
		}
		if err == errGoneBefore {
			// Its handler was cancelled as its lease might run out
			// unextended (expire, lapse): the run is gone because another
			// delivery, after a lease recovery, settled it (or this
			// holder's earlier call, its reply lost: told alike).
			w.obs.Handled(r.Env, r.Queue, j.took, OutcomeLeaseLost)
			continue
		}
		w.log.Warn("runqueue: a finished run could not be acked", "env", r.Env, "queue", r.Queue, "id", r.ID,
			"attempt", r.Attempt, "err", err)
		w.obs.Handled(r.Env, r.Queue, j.took, OutcomeLeaseLost)
	}
}

// nextLook is how long to wait for a wake-up before looking again, after
// a call found nothing: until the source's next due run (a delayed run's
// time), every BlockPollInterval while it holds ready work that limits
// hold back (whatever the ready runs' scores, which are their writers'
// clocks: see Queue.queueNext and Queue.shardNext, which also say how
// Config.ShardLookAhead counts for a shard), IdlePollInterval when there
// is none. With from set (the call's start, Config.Clock, ms), work due
// before that poll beside held work (of that due since from) brings the
// look forward to its time (early true): an early look, which the loop
// spends when it serves nothing (see fetchLoop.el, and Queue.block for
// why). Once the Queue is closed, no enqueue wakes the
// worker (Close stops the wake-up listener), so it waits at most
// BlockPollInterval.
func (s *source) nextLook(from int64, lim Limits) (d time.Duration, early bool, env envLook) {
	d, early, env = s.nextLookOpen(from, lim)
	if s.w.q.isClosed() {
		d = min(d, s.w.q.cfg.BlockPollInterval)
	}
	return d, early, env
}

// nextLookOpen is nextLook's look. Given an env limit (lim: a source whose
// line is shared, see finish) it also reads the env's and the queue's
// in-flight counts, in its round trip, and says, when the queue holds
// ready runs, whether the env is at its limit or below it, the queue not
// at its own (envLook).
func (s *source) nextLookOpen(from int64, lim Limits) (time.Duration, bool, envLook) {
	w := s.w
	var at, sooner int64
	var ok bool
	var err error
	var counts *lookCounts
	if s.shard < 0 {
		if lim.Env > 0 {
			counts = &lookCounts{}
		}
		at, sooner, ok, err = w.q.queueNext(w.ctx(), w.q.space.Env(s.env).Queue(s.queue), from, counts)
	} else {
		at, sooner, ok, err = w.q.shardNext(w.ctx(), s.shard, from)
	}
	switch {
	case err != nil:
		return w.q.cfg.BlockPollInterval, false, envLook{}
	case !ok:
		return w.cfg.IdlePollInterval, false, envLook{}
	}
	now := w.q.now()
	due := time.Duration(at-now) * time.Millisecond
	if due <= 0 {
		// ready work that limits hold
		var env envLook
		if counts != nil {
			env = counts.envState(lim)
		}
		if d, soon := w.q.soonIn(sooner, now); soon {
			return d, true, env
		}
		return w.q.cfg.BlockPollInterval, false, env
	}
	return min(due, w.cfg.IdlePollInterval), false, envLook{}
}

// retryDelay is the wait after the n-th failure in a row: 100ms doubling
// to 5s, with jitter.
func retryDelay(n int) time.Duration {
	d := min(100*time.Millisecond<<min(n-1, 6), 5*time.Second)
	return d/2 + rand.N(d)
}

// fetchLoop is the state of a source's goroutine. It decides every call
// of the source and processes every reply, so the rules live in one place:
//
//   - while the source has a backlog, fetch into free slots, up to
//     fetchDepth calls at once, the acks riding along;
//   - when a call got less than it asked for, the source is idle: wait for
//     a wake-up (pub/sub, as DequeueWait), a finished run (its ack goes at
//     once, asking for runs too), or a timer (nextLook), with one call in
//     flight at most;
//   - when Shutdown starts, fetch no more and send acks as they come until
//     no more can;
//   - when the stop is forced (Shutdown's ctx ended), no pause between
//     attempts: the first call that fails with acks, or that was started
//     since, is the last.
type fetchLoop struct {
	s        *source
	w        *Worker
	wake     chan struct{}
	results  chan *fetchCall
	inflight int
	fetching bool // Shutdown has not started
	left     bool // told the slots this loop hands out no more runs
	idle     bool // the last call that asked for runs got fewer
	full     bool // the last call that asked for runs got all: a second call may go
	// marked: the last call that asked for runs got fewer, and no leave was
	// sent since: its queue may have a mark in its env's waiting line. A
	// shard source's: held, the queues whose last visit by its calls got
	// fewer runs than asked (flag on, an env limit), and when.
	marked bool
	held   map[string]heldVisit // by queue member
	// offered: a wake-up came since the last call that asked for runs
	// (a slot may have been left to the queue's mark).
	offered bool
	looked  bool    // the look timer was set from a look at the source since anything changed
	envLook envLook // and what that look found of the env's limit, ready runs held (see nextLookOpen)
	// freeAsked: a call asked again since the last wake-up or call that
	// served runs, its look having found the env free (see lineStep).
	freeAsked bool
	// lineWoken: the source's envLine woke it (nudged) and no call of it
	// has served runs or found the env held since: the slot it was woken
	// for may still be free (see lineStep).
	lineWoken bool
	// lineIn: the source counts in its line's members (its loop runs: see
	// Queue.enterLine, exitLine); lineQuit: it calls for runs no more and
	// left the line's waiting (quitLine).
	lineIn   bool
	lineQuit bool
	failures int
	// faultLogged: when a fetch last logged a queue's failure it passed
	// over (fetchCall.fault).
	faultLogged time.Time
	// hints: the wake-ups received, the calls that got all they asked for
	// and the replies of calls with acks alone, each a sign that the queue
	// may have runs: a call notes the count it started at, and one that
	// gets fewer runs than asked leaves the source idle only when none came
	// meanwhile. (Two calls of a source may reach Redis in the other order
	// than their replies come back: a call the env held, then one that got
	// all it asked and dropped the queue's mark, or acks that freed the
	// limit that held it; had the held one's reply, processed last, left
	// the source idle, nothing would wake it: helper-209's stall of a whole
	// poll, helper-210's.)
	hints int
	// ackAlone: the calls in flight that carry acks and ask for no runs
	// (their acks may free what holds a call for runs on its way: a short
	// reply leaves the source idle only when none is in flight).
	ackAlone int
	forced   bool // the stop was forced
	drained  bool // no more acks can come (Worker.drained was closed when checkStop last looked)
	qclosed  bool // the Queue was closed: no wake-ups come any more (see nextLook)
	giveUp   bool // makes no more calls; leaves once no more acks can come
	// refusedFrom: when the failures in a row since the stop began, all
	// calls Redis refused unrun, began (zero: none such now).
	refusedFrom time.Time
	// The early look (see nextLook): lookEarly says the look timer is set
	// for one, earlyDue that it fired and the next call to start is that
	// look; el, when the early look is spent and the poll's look due (a
	// wake-up or a call that serves runs resets it).
	lookEarly, earlyDue bool
	el                  earlyLooks

	look, gather, pause    *time.Timer
	lookC, gatherC, pauseC <-chan time.Time
	lookAt                 time.Time // when the look timer fires (while lookC is set)
	gatherWant             int
}

func (s *source) loop() {
	w := s.w
	defer w.fetchers.Done()
	l := &fetchLoop{s: s, w: w, wake: w.wake.register(s.topic), results: make(chan *fetchCall, fetchDepth),
		fetching: true,
		// After a call that got all it asked for, the next waits (see
		// startGather) until this many slots are free: with fast handlers
		// a call then carries about Concurrency/fetchDepth runs, not the
		// few freed meanwhile. That matters for the fair scheduler, whose
		// work per run drops when one call serves a key more than once.
		gatherWant: max(1, 3*w.fetchN/(4*fetchDepth*len(w.sources)))}
	if s.lined {
		w.q.enterLine(s)
		l.lineIn = true
	}
	defer l.close()
	for {
		l.checkStop()
		if l.issue() {
			continue
		}
		if !l.fetching && l.inflight == 0 && l.drained && (l.giveUp || s.pending() == 0) {
			if n := s.dropAcks(); n > 0 {
				w.unsettled.Add(int64(n))
				w.log.Error("runqueue: worker gave up sending acks; their runs run again once their leases pass",
					s.attrs("runs", n)...)
			}
			return
		}
		if w.fetchWaitHook != nil && l.left && l.inflight == 0 {
			w.fetchWaitHook()
		}
		if !l.wait() {
			for ; l.inflight > 0; l.inflight-- {
				// The Start context ended: these fail at once, or their
				// runs and unsent acks are left in flight (Shutdown counts
				// them; nothing is dispatched after a hard stop).
				c := <-l.results
				w.unsettled.Add(int64(len(c.runs)))
				if c.lineAcks {
					// Its acks are no more on their way (or the line's
					// free-look joins would wait for them on, in the
					// Queue's line, after this Worker); slots they freed
					// that the call did not take again wake the others.
					l.lineAcksSettled(c)
					s.line.acks(-1)
				}
				if c.ackErr != nil {
					s.putBack(c.acks)
				} else {
					s.settled(c.acks, c.ackErrs)
				}
			}
			// A hard stop sends nothing more: Shutdown reports these acks.
			w.unsettled.Add(int64(s.dropAcks()))
			return
		}
	}
}

func (l *fetchLoop) close() {
	l.w.wake.unregister(l.s.topic, l.wake)
	l.exitLine()
	for _, t := range []*time.Timer{l.look, l.gather, l.pause} {
		if t != nil {
			t.Stop()
		}
	}
}

// quitLine: the source calls for runs no more (its Worker stops, or its
// loop ends). It leaves its line's waiting (the Queue's Workers' other
// sources of the env go on), and a wake-up of the line it got and did not
// use goes on to one of them (envLine.quit), rather than be lost with it.
// It still counts in the members until its loop ends (exitLine): while its
// Worker drains, the acks of its last runs free slots whose release wakes
// the others, which must look with the env's counts to join (helper-214).
func (l *fetchLoop) quitLine() {
	if !l.lineIn || l.lineQuit {
		return
	}
	l.lineQuit = true
	l.s.line.quit(l.s, l.lineWoken)
	l.lineWoken = false // (passed on: a call of its that answers finds it spent)
}

// exitLine: the loop ends; the source counts in its line no more.
func (l *fetchLoop) exitLine() {
	l.quitLine()
	if l.lineIn {
		l.lineIn = false
		l.w.q.exitLine(l.s)
	}
}

func (l *fetchLoop) checkStop() {
	if l.fetching {
		select {
		case <-l.w.stopFetch:
			l.fetching = false
			l.w.slots.forget(l.s)
			l.quitLine()
		default:
		}
	}
	if !l.forced && l.w.forced() {
		l.setForced()
	}
	if !l.drained {
		l.drained = l.s.isDrained()
	}
	// Shutdown may release held runs once no call can hand out more.
	if !l.fetching && !l.left && l.inflight == 0 {
		l.left = true
		l.w.slots.leaveFetch()
		if l.failures == 0 && !l.forced {
			// No call of this source takes runs any more (the calls left
			// are its acks): flag on, the waiting marks its calls may
			// have written (takeMarks; a wake-up clears idle, not these)
			// are cut to the leaving grace (Queue.leaveLine; best effort:
			// a mark lapses by itself; one call a queue, a second in all
			// but on a Redis that does not answer, where the client's read
			// timeout bounds a call).
			if qs := l.takeMarks(); len(qs) > 0 {
				ctx, cancel := context.WithTimeout(l.w.ctx(), time.Second)
				leaveAll(ctx, l.w.q, qs)
				cancel()
			}
		}
	}
}

// issue starts a call when the rules allow one, and says whether it did.
func (l *fetchLoop) issue() bool {
	w, s := l.w, l.s
	if l.inflight >= fetchDepth || l.pauseC != nil || l.giveUp {
		return false
	}
	if !l.fetching || l.idle {
		if l.inflight > 0 {
			return false
		}
		acks := s.takeAcks()
		if len(acks) == 0 {
			return false
		}
		var ks []int
		if l.fetching {
			ks = w.slots.take(nil, w.fetchN, 1, nil) // ask for runs with the acks: it costs nothing more
			if len(ks) == 0 {
				// Every slot is busy with other sources' runs: the acks go
				// alone, and the slots they free in the queue and its env
				// may be what held the queue. The source is no longer idle:
				// it asks again once a slot of this Worker frees (it waits
				// for one as any source), rather than wait for a wake-up
				// or its look: after the env held it, nothing else may
				// come (helper-209: a Worker's last queue idle a whole
				// poll with 48-78 ready runs once its other queues
				// drained, the env free).
				l.idle = false
			}
		}
		l.start(acks, ks)
		return true
	}
	if l.inflight > 0 && !l.full {
		return false
	}
	least := 1
	if l.gatherC != nil {
		least = l.gatherWant
	}
	ks := w.slots.take(s, w.fetchN, least, nil)
	if len(ks) == 0 {
		if least == 1 && l.inflight == 0 && s.shard < 0 && l.offered {
			// Every slot is busy (with other sources' runs) while the
			// queue may hold a mark in its env's waiting line and a
			// wake-up came since (a slot may have been left to the mark):
			// the env's slots left to it would stay idle until a slot of
			// this Worker frees (helper-207: an env below its limit for
			// 5.7 s of every 6 s while another queue waited). Leave, with
			// the acks pending; the next call that is held marks the
			// queue again. (A shard source does not: its visits do not
			// say which queues the env held, and leaving every queue
			// a visit got fewer runs of cost 32 leaves a run served at
			// saturation: helper-209.)
			if qs := l.takeMarks(); len(qs) > 0 {
				l.startLeave(s.takeAcks(), qs[0])
				return true
			}
		}
		if least == 1 && l.inflight == 0 {
			// Every slot is busy: the acks of runs that finished (their
			// slots went to other sources) go alone rather than wait.
			if acks := s.takeAcks(); len(acks) > 0 {
				l.start(acks, nil)
				return true
			}
		}
		return false
	}
	l.stopGather()
	l.start(s.takeAcks(), ks)
	return true
}

// setForced notes that the stop was forced: a retry pause ends.
func (l *fetchLoop) setForced() {
	l.forced = true
	if l.pauseC != nil {
		l.pause.Stop()
		l.pauseC = nil
	}
}

func (l *fetchLoop) start(acks []*job, ks []int) {
	l.launch(&fetchCall{acks: acks, ks: ks, final: l.forced, hints: l.hints, early: l.earlyDue && len(ks) > 0,
		from: l.w.q.now()})
}

// startLeave starts a call of a queue source that leaves the env's waiting
// line (Queue.leaveLine) for its queue qn, with acks.
func (l *fetchLoop) startLeave(acks []*job, qn *queueNames) {
	l.launch(&fetchCall{acks: acks, leave: qn, final: l.forced, hints: l.hints, from: l.w.q.now()})
}

// leaveMax: the most queues a shard source leaves the env's waiting line
// for at its stop (the latest its calls got fewer runs of); it keeps
// twice as many (held).
const leaveMax = 64

// takeMarks returns the queues of this source that may hold a mark in
// their env's waiting line (flag on, an env limit), and forgets them: a
// queue source's queue when its last call that asked for runs got fewer
// (marked), a shard source's queues whose last visits got fewer, within a
// mark's life (held; the latest leaveMax).
func (l *fetchLoop) takeMarks() []*queueNames {
	s, q := l.s, l.w.q
	if s.shard < 0 {
		if !l.marked || !q.leavesLine(s.env, s.queue) {
			return nil
		}
		l.marked = false
		return []*queueNames{q.names(s.env, s.queue)}
	}
	l.pruneHeld(leaveMax)
	qs := make([]*queueNames, 0, len(l.held))
	for _, h := range l.held {
		qs = append(qs, h.qn)
	}
	clear(l.held)
	return qs
}

// noteVisits notes a shard call's visits (see dequeueShard) in held.
func (l *fetchLoop) noteVisits(visits map[*queueNames]bool) {
	for qn, short := range visits {
		if !short {
			delete(l.held, qn.member)
			continue
		}
		if l.held == nil {
			l.held = map[string]heldVisit{}
		}
		l.held[qn.member] = heldVisit{qn, time.Now()}
	}
	if len(l.held) > 2*leaveMax {
		// (queues come and go: the map is kept to the latest, helper-209:
		// 4.5 MB for 12,000 one-run queues)
		l.pruneHeld(2 * leaveMax)
	}
}

// heldVisit is a shard source's queue whose last visit got fewer runs than
// asked (held), and when.
type heldVisit struct {
	qn *queueNames
	at time.Time
}

// pruneHeld drops the held queues past a mark's life and, when more than
// keep (0: no bound) are left, the oldest of them.
func (l *fetchLoop) pruneHeld(keep int) {
	life := time.Duration(l.w.q.waitingLife()) * time.Millisecond
	for m, h := range l.held {
		if time.Since(h.at) >= life {
			delete(l.held, m)
		}
	}
	if keep <= 0 || len(l.held) <= keep {
		return
	}
	all := make([]string, 0, len(l.held))
	for m := range l.held {
		all = append(all, m)
	}
	slices.SortFunc(all, func(a, b string) int { return l.held[b].at.Compare(l.held[a].at) })
	for _, m := range all[keep:] {
		delete(l.held, m)
	}
}

func (l *fetchLoop) launch(c *fetchCall) {
	l.inflight++
	if c.acksAlone() {
		l.ackAlone++
	}
	if len(c.ks) > 0 {
		l.earlyDue, l.offered = false, false
		if l.s.line != nil {
			c.released = l.s.line.leave(l.s)
		}
	}
	if l.s.line != nil && len(c.acks) > 0 {
		c.lineAcks = true
		l.s.line.acks(1)
	}
	go func() {
		l.s.fetch(c)
		l.results <- c // never blocks: room for fetchDepth replies
	}()
}

// wait waits for something that may allow a call, or let the loop leave;
// false: the Start context ended. It waits only on what the loop has not
// seen yet: a closed channel would make it spin. What it has not seen is
// what its own flags say, never a fresh look: a stop step taken since
// checkStop looked (drained closed just now, say) must wake it, or the
// loop sleeps on with nothing left to wake it and Shutdown never returns.
func (l *fetchLoop) wait() bool {
	var stop, drained, force, qclosed <-chan struct{}
	if !l.qclosed {
		qclosed = l.w.q.closed
	}
	if l.fetching {
		stop = l.w.stopFetch
	} else if !l.drained {
		drained = l.w.drained
	}
	if !l.forced {
		force = l.w.force
	}
	select {
	case c := <-l.results:
		l.inflight--
		l.finish(c)
	case <-l.s.kick:
	case <-l.wake:
		l.woken()
		l.offered = true
	case <-l.s.nudged:
		l.woken()
		l.lineWoken = l.s.line.nudgedFor(l.s) || l.lineWoken
	case <-qclosed:
		// Queue.Close stopped the wake-ups: look again now, and from now on
		// at most every BlockPollInterval (nextLook).
		l.qclosed = true
		l.idle, l.looked = false, false
		if l.lookC != nil {
			l.look.Stop()
			l.lookC, l.lookEarly = nil, false
		}
	case <-l.lookC:
		l.lookC, l.idle, l.looked = nil, false, false
		l.earlyDue, l.lookEarly = l.lookEarly, false
	case <-l.gatherC:
		l.gatherC = nil
	case <-l.pauseC:
		l.pauseC = nil
	case <-stop:
	case <-drained:
	case <-force:
		l.setForced()
	case <-l.w.base.Done():
		return false
	}
	return true
}

// woken: a wake-up came, or a nudge of the source's envLine: the queue
// may have runs for a call.
func (l *fetchLoop) woken() {
	l.idle, l.looked, l.freeAsked = false, false, false
	l.hints++
	l.earlyDue = false
	l.el.reset()
}

// finish processes a call's reply.
func (l *fetchLoop) finish(c *fetchCall) {
	w, s := l.w, l.s
	if c.lineAcks {
		defer s.line.acks(-1) // (after its release, in lineStep)
	}
	if c.acksAlone() {
		l.ackAlone--
	}
	if len(c.runs) > 0 {
		s.dispatch(c.runs, c.ks, c.began)
	}
	if len(c.runs) < len(c.ks) && c.err == nil {
		// The source is idle now (below): it drops its wait for a slot
		// before it gives back those it did not fill, or the slot it gives
		// back would poke itself (it waits when its other call wanted a
		// slot) rather than a source that wants one.
		w.slots.forget(s)
	}
	w.slots.give(c.ks[len(c.runs):]...)
	if c.ackErr != nil {
		s.putBack(c.acks)
	} else {
		s.settled(c.acks, c.ackErrs)
	}
	if c.fault != nil && w.base.Err() == nil && time.Since(l.faultLogged) >= time.Second {
		// A queue of the shard failed, the others were served (see
		// DequeueShard); logged at most once a second.
		l.faultLogged = time.Now()
		w.log.Warn("runqueue: worker passed over a queue whose call failed", s.attrs("err", c.fault)...)
	}
	if c.err != nil {
		if c.lineAcks {
			// (helper-216) The call failed, its acks made (results with an
			// error) or maybe made (its reply lost): lineStep does not run,
			// so the slots they freed would wake nobody in the line.
			l.lineAcksSettled(c)
		}
		if w.base.Err() != nil {
			return
		}
		l.failures++
		w.log.Warn("runqueue: worker fetch failed", s.attrs("err", c.err, "failures", l.failures)...)
		if !l.forced && w.forced() {
			l.setForced()
		}
		switch {
		case l.forced && (c.final || len(c.acks) > 0):
			l.giveUp = true // that was the acks' one attempt since the stop was forced
		case l.forced:
			// A fetch started before: the acks pending go at once, once.
		case !l.fetching && l.failures > 3 && s.isDrained() && !l.resendRefused(c.err):
			// (Redis unreachable: a graceful stop must end. A call Redis
			// refused unrun, a slot on the move above all, goes again
			// while an ack's lease lasts, for a minute at most: it
			// succeeds once the slot has moved, as a nack's resend does.)
			l.giveUp = true
		default:
			l.pauseC = arm(&l.pause, retryDelay(l.failures))
		}
		return
	}
	l.failures, l.refusedFrom = 0, time.Time{}
	l.noteVisits(c.visits)
	if len(c.runs) > 0 {
		l.looked, l.freeAsked, l.lineWoken = false, false, false
		l.el.reset()
	} else if c.early && len(c.ks) > 0 {
		// An early look that served nothing: the next look is the
		// poll's, the looks after it wait the whole poll until it has
		// passed (see nextLook).
		l.el.idle(true, time.Now(), w.q.cfg.BlockPollInterval)
	}
	// A source whose line is shared (one may wake another: a lone source
	// spends no LimitsFor call on it) reads its limits once for the look
	// and the line's step.
	lined := s.line != nil && s.line.sharedFor(s)
	var lim Limits
	var limErr error
	if lined {
		lim, limErr = w.q.cfg.limitsFor(s.env, s.queue)
	}
	switch n := len(c.ks); {
	case n == 0:
		if c.acksAlone() {
			// Its acks may have freed what held a call for runs that ran
			// in Redis before them and is still on its way (helper-210: a
			// queue at its limit of 1 idle a whole poll at saturation).
			l.hints++
		}
	case len(c.runs) == n: // there may be more
		l.idle, l.full, l.marked = false, true, false
		l.hints++
		if l.lookC != nil {
			l.look.Stop()
			l.lookC, l.lookEarly = nil, false
		}
		if l.gatherWant > 1 {
			l.startGather(min(c.took, maxGather))
		}
	case len(c.runs) > 0:
		// Limits (or a drained queue) cut the call short; the acks of
		// these runs will look again. The timer bounds the wait should
		// none come (a nack elsewhere, say). (Below, idle stays false when
		// a hint came while the call was on its way, maybe for work the
		// call did not see: the loop looks again at once rather than wait
		// for its timer, which may be IdlePollInterval away.) A timer
		// set before, from a look that found the queue empty or its next
		// work far off, is brought forward: the wake-up that started this
		// call may have been for a delayed run now the queue's head, and
		// runs these fail are nacked behind it, which publishes nothing;
		// with no ack to look again, that timer alone would serve them.
		l.cutShort(c)
		if d := w.q.cfg.BlockPollInterval; l.lookC == nil || time.Until(l.lookAt) > d {
			l.armLook(d, false)
		}
	default:
		l.cutShort(c)
		if !l.looked {
			var from int64 // 0: no early look
			if !w.q.noEarlyLook && l.el.allowed(time.Now()) {
				from = c.from
			}
			var d time.Duration
			var early bool
			d, early, l.envLook = s.nextLook(from, lim)
			if !c.early {
				l.el.idle(false, time.Now(), w.q.cfg.BlockPollInterval)
			} else if !early {
				d = min(d, l.el.pollWait(true, d))
			}
			l.armLook(d, early)
			l.looked = true
		}
	}
	if lined {
		if limErr == nil {
			l.lineStep(c, lim)
		} else {
			// (LimitsFor failed after the call read it: the slots its acks
			// freed still wake as many sources, helper-220; a wake-up of
			// this source's waits for its next call)
			l.lineRelease(c)
		}
	} else if len(c.ks) > 0 {
		// (a wake-up that came before its partner left was spent by this
		// call: kept, a later pass or quit would hand on a phantom one,
		// helper-216)
		l.lineWoken = false
	}
}

// lineStep (a source with an envLine): a call for runs that got none, its
// look finding the env's limit holding the queue, joins the line (or, a
// release made since the call began, asks again: see envLine.join); one
// whose look found the env free asks again once, then joins only while
// acks of the line are on their way; one the line woke that took nothing,
// the env not full, passes the wake-up on (envLine.pass). A call that
// freed slots of the env it did not take again (fewer runs than it acked,
// and fewer than it asked for or acks alone) wakes as many sources of the
// line; with no env limit (lim, the queue's), a call with acks wakes them
// all.
func (l *fetchLoop) lineStep(c *fetchCall, lim Limits) {
	s := l.s
	acked := c.acked()
	if lim.Env <= 0 {
		// No env limit (lifted since sources joined, say): none waits for
		// it, and no release of a limited env would wake them (helper-213:
		// a source in the line waited its poll once the limit was lifted).
		if acked > 0 {
			s.line.release(s, math.MaxInt)
		}
		return
	}
	if len(c.ks) > 0 && len(c.runs) == 0 && l.idle && l.fetching {
		env := l.envLook
		switch {
		case env.free && !l.freeAsked:
			// The look found ready runs and the env and queue below their
			// limits: acks that ran in Redis after the call, whose release
			// this loop may not have seen yet (helper-212: the source then
			// stayed out of the line, idle for its poll, with the env
			// free). Ask again, once until a wake-up or a call that serves
			// runs (a queue its key limits hold would ask on and on).
			l.idle, l.looked, l.freeAsked = false, false, true
		default:
			switch {
			case l.lineWoken && !env.held:
				// The line woke this source for a slot it did not take (its
				// key limits hold it, its queue is empty or at its limit)
				// and its look did not find the env at its limit: the
				// wake-up goes on to a source waiting for the env, or that
				// one waits for its poll (helper-213).
				s.line.pass(s, false)
			case l.lineWoken:
				// Woken, and the env still at its queue's limit: a lower
				// one than another waiter's may be what holds it
				// (helper-219's F3), and the slot goes on to that waiter.
				s.line.passAbove(s, env.count)
			}
			l.lineWoken = false
			if !env.held && !env.free || acked > 0 {
				// (a call whose own acks ran first, in its script, was not
				// held by the env: its look, maybe one from before them,
				// says nothing of it; helper-213)
				break
			}
			// (free again: it joins while acks of the line are on their
			// way, whose release may be what it missed: helper-212's
			// second crossing in a row)
			if s.line.join(s, c.released, env.free, lim.Env) == lineCrossed {
				// A release crossed the call: ask again, after a fresh look.
				l.idle, l.looked = false, false
			}
		}
	}
	l.lineRelease(c)
}

// lineRelease: a call that freed slots of the env it did not take again
// (fewer runs than it acked, and fewer than it asked for or acks alone)
// wakes as many sources of the line.
func (l *fetchLoop) lineRelease(c *fetchCall) {
	if freed := c.acked() - len(c.runs); freed > 0 && len(c.runs) < max(len(c.ks), 1) {
		l.s.line.release(l.s, freed)
	}
}

// lineAcksSettled: a call c that failed, or whose reply a hard stop took,
// carried acks counted in the line, and lineStep does not run for it: the
// slots its acks freed and it did not take again wake as many sources
// (release); when it cannot tell (ackErr: its reply lost), the sources that
// joined the line on a free look, waiting for acks on their way, look again
// once none are (envLine.acksLost). (c's acks(-1) comes after.)
func (l *fetchLoop) lineAcksSettled(c *fetchCall) {
	if n := c.acked() - len(c.runs); n > 0 {
		l.s.line.release(l.s, n)
	} else if c.ackErr != nil {
		l.s.line.acksLost(l.s)
	}
}

// cutShort notes a call that got fewer runs than it asked for: the source
// goes idle unless a hint came while the call was on its way or acks alone
// still are (see hints, ackAlone); its queue may have a mark in its env's
// waiting line; its wait for a slot, if any, is dropped.
func (l *fetchLoop) cutShort(c *fetchCall) {
	l.idle, l.full, l.marked = l.hints == c.hints && l.ackAlone == 0, false, true
	l.w.slots.forget(l.s)
}

// armLook (re)starts the look timer for d; early: an early look (see
// nextLook).
func (l *fetchLoop) armLook(d time.Duration, early bool) {
	l.lookC = arm(&l.look, d)
	l.lookAt = time.Now().Add(d)
	l.lookEarly = early
}

// startGather makes the next call wait, for at most d (about a round
// trip, so a freed slot waits at most one more), until gatherWant slots
// are free.
func (l *fetchLoop) startGather(d time.Duration) {
	l.gatherC = arm(&l.gather, d)
}

func (l *fetchLoop) stopGather() {
	if l.gatherC != nil {
		l.gather.Stop()
		l.gatherC = nil
	}
}

// arm (re)starts *t for d and returns its channel.
func arm(t **time.Timer, d time.Duration) <-chan time.Time {
	if *t == nil {
		*t = time.NewTimer(d)
	} else {
		(*t).Reset(d)
	}
	return (*t).C
}

// slots hands out the worker's Concurrency slots; each held run has one
// from its fetch until its ack is queued or its nack is done.
type slots struct {
	mu       sync.Mutex
	free     []int
	size     int
	fetching int             // source loops that may still hand out runs
	waiters  []slotWaiter    // first come first served
	waiting  map[*source]int // how many free slots each waiting source wants
	changed  chan struct{}   // a slot was given back or a loop stopped handing out runs
}

// slotWaiter is a source waiting until want slots are free; it is stale
// when waiting no longer says so.
type slotWaiter struct {
	src  *source
	want int
}

func (s *slots) init(n int) {
	s.size = n
	s.free = make([]int, n)
	for i := range s.free {
		s.free[i] = n - 1 - i
	}
	s.waiting = map[*source]int{}
	s.changed = make(chan struct{}, 1)
}

// take moves up to most free slots into buf when at least least (1 or
// more) are free; otherwise, when src is non-nil, it waits until they are:
// it is poked. A source takes with a nil src when it only tries (its
// queue is idle): a waiting source that does not want the slot would
// swallow the poke meant for another.
func (s *slots) take(src *source, most, least int, buf []int) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.free) < least {
		if src != nil && s.waiting[src] != least {
			s.waiting[src] = least
			s.waiters = append(s.waiters, slotWaiter{src, least})
		}
		return buf
	}
	delete(s.waiting, src)
	n := min(most, len(s.free))
	buf = append(buf, s.free[len(s.free)-n:]...)
	s.free = s.free[:len(s.free)-n]
	return buf
}

// forget drops src's wait, if any: a waiter that gathered slots ahead of
// others no longer holds them back.
func (s *slots) forget(src *source) {
	s.mu.Lock()
	if _, ok := s.waiting[src]; !ok {
		s.mu.Unlock()
		return
	}
	delete(s.waiting, src)
	wake := s.wakeLocked()
	s.mu.Unlock()
	for _, src := range wake {
		src.poke()
	}
}

func (s *slots) give(ks ...int) {
	if len(ks) == 0 {
		return
	}
	s.mu.Lock()
	s.free = append(s.free, ks...)
	wake := s.wakeLocked()
	s.mu.Unlock()
	for _, src := range wake {
		src.poke()
	}
	s.signal()
}

// wakeLocked takes the waiters that the free slots satisfy off the queue,
// first come first served, and returns them to be poked.
func (s *slots) wakeLocked() []*source {
	var wake []*source
	avail := len(s.free)
	for len(s.waiters) > 0 && avail > 0 {
		h := s.waiters[0]
		if want, ok := s.waiting[h.src]; ok && want == h.want {
			if h.want > avail {
				break // first come first served; a gathering waiter's timer bounds this
			}
			delete(s.waiting, h.src)
			wake = append(wake, h.src)
			avail -= h.want
		}
		s.waiters[0] = slotWaiter{}
		s.waiters = s.waiters[1:]
	}
	return wake
}

func (s *slots) signal() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

func (s *slots) leaveFetch() {
	s.mu.Lock()
	s.fetching--
	s.mu.Unlock()
	s.signal()
}

func (s *slots) fetchersGone() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fetching == 0
}

func (s *slots) idle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fetching == 0 && len(s.free) == s.size
}
