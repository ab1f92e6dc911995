package runqueue

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
)

// lineBackends: miniredis and the shared real Redis.
var lineBackends = []redistest.Backend{
	{Name: "Mini", Client: redistest.Mini},
	{Name: "Real", Client: redistest.Real},
}

// lineSources are n queue sources of one env sharing an envLine, for the
// line's own tests (no Worker behind them), each counted in it (the
// first source's look again, asked as the second came, taken).
func lineSources(n int) []*source {
	w := &Worker{q: &Queue{}}
	ss := make([]*source, n)
	for i := range ss {
		ss[i] = &source{w: w, env: "e", queue: string(rune('a' + i)), shard: -1,
			lined: true, nudged: make(chan struct{}, 1)}
		w.q.enterLine(ss[i])
	}
	takeRelook(ss[0])
	return ss
}

// takeRelook takes the nudge, if any, that Queue.enterLine sent s, the
// lone member, when a second source came (it looks again), as s's loop
// would.
func takeRelook(s *source) {
	if nudgedNow(s) {
		s.line.nudgedFor(s)
	}
}

// handLoop is s's fetch loop, driven by hand (no goroutine): fetching,
// gathering one slot.
func handLoop(w *Worker, s *source) *fetchLoop {
	return &fetchLoop{s: s, w: w, results: make(chan *fetchCall, fetchDepth), fetching: true, gatherWant: 1}
}

func nudgedNow(s *source) bool {
	select {
	case <-s.nudged:
		return true
	default:
		return false
	}
}

// The line wakes the sources held longest first, as many as slots were
// freed, never the source that freed them; a source that left (it calls
// again, or stops) is not woken; one whose call began before a release
// does not join (it asks again).
func TestEnvLineOrderAndCrossing(t *testing.T) {
	t.Parallel()
	ss := lineSources(4)
	a, b, c, d := ss[0], ss[1], ss[2], ss[3]
	line := a.line
	require.Same(t, line, d.line, "one line for the env")
	mustJoin(t, c, false, 0)
	mustJoin(t, b, false, 0)
	mustJoin(t, a, false, 0)

	line.release(a, 1)
	require.True(t, nudgedNow(c), "the longest held is woken first")
	require.False(t, nudgedNow(b))
	require.False(t, nudgedNow(a))
	require.False(t, inEnvLine(c))
	require.True(t, inEnvLine(a), "the releasing source keeps its place")

	line.leave(b) // b calls again on its own (its look, a wake-up)
	line.release(d, 5)
	require.False(t, nudgedNow(b), "a source that left is not woken")
	require.True(t, nudgedNow(a))
	require.Empty(t, line.waiting)

	at := line.leave(d) // d's call for runs begins
	line.release(a, 1)  // a release runs meanwhile (maybe in Redis after d's call)
	require.Equal(t, lineCrossed, line.join(d, at, false, 0), "a release since the call began: ask again, do not join")
	require.False(t, inEnvLine(d))
	at = line.leave(d)
	require.Equal(t, lineJoined, line.join(d, at, false, 0))
	require.Equal(t, lineJoined, line.join(d, at, false, 0), "joining twice keeps one place")
	require.Len(t, line.waiting, 1)
	line.release(d, 1)
	require.False(t, nudgedNow(d), "a source's own release does not wake it")
	require.True(t, inEnvLine(d))

	at = line.leave(b)
	require.Equal(t, lineOut, line.join(b, at, true, 0), "the env free and no acks on their way: b stays out")
	line.acks(1)
	require.Equal(t, lineJoined, line.join(b, at, true, 0), "the env free, acks on their way: b waits for their release")
	line.acks(-1)
}

// lineQueue is a flag-off Queue at 30 s polls (a queue that waits for its
// look is unmistakable) with the limits lf, closed at the test's end.
func lineQueue(t *testing.T, c redis.UniversalClient, lf func(env, queue string) Limits) *Queue {
	q, err := New(context.Background(), c, &Config{Prefix: redistest.Prefix(t), BlockPollInterval: 30 * time.Second,
		LimitsFor: lf})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	return q
}

// lineWorker is a Worker over queues a and b of env "e", flag off, with
// limits *lim (read at each use), not started (its loops are driven by
// hand; both sources count in the env's line, as their loops would).
func lineWorker(t *testing.T, c redis.UniversalClient, lim *Limits) *Worker {
	return lineWorkerOf(t, c, func(string, string) Limits { return *lim })
}

// lineWorkerOf is lineWorker with the limits lf.
func lineWorkerOf(t *testing.T, c redis.UniversalClient, lf func(env, queue string) Limits) *Worker {
	ctx := context.Background()
	q := lineQueue(t, c, lf)
	w, err := NewWorker(q, func(context.Context, *Run) error { return nil }, &WorkerConfig{
		Queues: []WorkerQueue{{Env: "e", Queue: "a"}, {Env: "e", Queue: "b"}}, Concurrency: 4})
	require.NoError(t, err)
	w.setBase(ctx)
	for _, s := range w.sources {
		w.q.enterLine(s)
	}
	takeRelook(w.sources[0])
	return w
}

// A source's call for runs that got none joins the line only when its look
// found the env's limit holding ready runs: not when the queue is empty,
// not when its own queue limit holds it, not when the env has room (an
// env with nothing in flight has no count: the look reads that as 0).
// With the flag on there is no line (the env's line in Redis wakes).
func TestEnvLineJoinsOnlyWhenTheEnvHolds(t *testing.T) {
	t.Parallel()
	redistest.ForEachBackend(t, lineBackends, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		lim := Limits{Env: 2, Queue: 1}
		w := lineWorker(t, c, &lim)
		b := w.sources[1]
		require.NotNil(t, b.line)
		look := func(s *source) bool {
			_, _, env := s.nextLook(0, lim) // (as finish gives it: the limits read then)
			return env.held
		}
		require.False(t, look(b), "an empty queue")
		for _, id := range []string{"b1", "b2", "b3"} {
			_, err := w.q.Enqueue(ctx, EnqueueParams{Env: "e", Queue: "b", Key: "k", ID: id})
			require.NoError(t, err)
		}
		_, err := w.q.Enqueue(ctx, EnqueueParams{Env: "e", Queue: "a", Key: "k", ID: "a1"})
		require.NoError(t, err)
		require.False(t, look(b), "nothing in flight: the env has room")
		at, _, ok, err := w.q.queueNext(ctx, w.q.space.Env("e").Queue("b"), 0, &lookCounts{})
		require.NoError(t, err, "an env with no count yet reads as 0, not as a failed look")
		require.True(t, ok)
		require.LessOrEqual(t, at, w.q.now(), "ready runs")
		runs, err := w.q.Dequeue(ctx, "e", "a", 1)
		require.NoError(t, err)
		require.Len(t, runs, 1)
		require.False(t, look(b), "the env at 1 of 2")
		runs, err = w.q.Dequeue(ctx, "e", "b", 1)
		require.NoError(t, err)
		require.Len(t, runs, 1)
		require.False(t, look(b), "the env at 2 of 2, but the queue at its own limit of 1 too")
		held := func() *fetchLoop { // b's call for runs that got none, and its look
			l := handLoop(w, b)
			ks := w.slots.take(b, 1, 1, nil)
			require.Len(t, ks, 1)
			l.finish(&fetchCall{ks: ks, hints: l.hints, released: b.line.leave(b)})
			return l
		}
		l := held()
		require.True(t, l.idle)
		require.False(t, inEnvLine(b), "held by its own queue limit: b does not wait in the env's line")
		lim.Queue = 2
		require.True(t, look(b), "the env at its limit holds the queue's ready runs")
		l = held()
		require.True(t, l.idle)
		require.True(t, inEnvLine(b), "held by the env: b waits in the line")

		q2, err := New(ctx, c, &Config{Prefix: w.q.cfg.Prefix, VtimeScheduling: true})
		require.NoError(t, err)
		t.Cleanup(func() { _ = q2.Close() })
		w2, err := NewWorker(q2, func(context.Context, *Run) error { return nil }, &WorkerConfig{
			Queues: []WorkerQueue{{Env: "e", Queue: "a"}, {Env: "e", Queue: "b"}}})
		require.NoError(t, err)
		require.False(t, w2.sources[1].lined, "flag on: no line")
	})
}

// A held call that was on its way while another source's call freed the
// env (the release may have run in Redis after it) asks again at once
// rather than join the line: nothing would wake it. The release wakes the
// sources waiting, the held call's source not among them yet.
func TestEnvLineHeldCallCrossingReleaseAsksAgain(t *testing.T) {
	t.Parallel()
	w := lineWorker(t, redistest.Mini(t), &Limits{Env: 2})
	a, b := w.sources[0], w.sources[1]
	lb := handLoop(w, b)
	la := handLoop(w, a)
	ks := w.slots.take(b, 1, 1, nil)
	require.Len(t, ks, 1)
	held := &fetchCall{ks: ks, hints: lb.hints, released: b.line.leave(b)}
	// a's acks go alone and free two env slots while b's call is on its way.
	acks := &fetchCall{acks: []*job{
		{run: &Run{Env: "e", Queue: "a", ID: "x", Token: 1}, src: a},
		{run: &Run{Env: "e", Queue: "a", ID: "y", Token: 1}, src: a}}, ackErrs: []error{nil, nil}}
	la.inflight, la.ackAlone = 1, 1
	la.inflight--
	la.finish(acks)
	lb.looked, lb.envLook = true, envLook{held: true} // (its look found the env holding it)
	lb.finish(held)
	require.False(t, lb.idle, "a release crossed the held call: b asks again")
	require.False(t, inEnvLine(b))

	again := &fetchCall{ks: w.slots.take(b, 1, 1, nil), hints: lb.hints, released: b.line.leave(b)}
	require.Len(t, again.ks, 1)
	require.False(t, lb.looked, "it looks afresh after asking again")
	lb.looked, lb.envLook = true, envLook{held: true} // (and finds the env holding it)
	lb.finish(again)
	require.True(t, lb.idle, "no release since: b waits in the line")
	require.True(t, inEnvLine(b))

	// A release of a's that freed fewer than it acked, its call cut short,
	// wakes b; one that took all it freed again does not.
	full := &fetchCall{acks: acks.acks, ackErrs: []error{nil, nil}, ks: w.slots.take(a, 1, 1, nil)}
	require.Len(t, full.ks, 1)
	full.runs = []*Run{{Env: "e", Queue: "a", ID: "z", Token: 1, LeaseDeadline: time.Now().Add(time.Minute)}}
	la.finish(full)
	(<-w.jobs).expiry.Stop()
	require.False(t, nudgedNow(b), "a call that got all it asked for takes its slots again")
	gone := &fetchCall{acks: acks.acks, ackErrs: []error{errGoneBefore, nil}}
	la.finish(gone)
	require.True(t, nudgedNow(b), "one slot freed: b is woken")
	require.False(t, inEnvLine(b))
}

// freedBeforeReleaseSeen drives, by hand, flag off at env limit 2, a
// Worker over qa and qb: qa's a1 and a2 hold both env slots; qb's call
// (b1 ready) runs in Redis while the env is full; qa's acks (qa then
// empty) run in Redis after it and free both slots, but their reply (the
// line's release) is processed after qb's, whose look finds the env free,
// not held. It returns qb's loop once both replies were processed.
// freeAsked: qb already asked again once for such a look.
func freedBeforeReleaseSeen(t *testing.T, freeAsked bool) (*Worker, *fetchLoop) {
	w := lineWorker(t, redistest.Mini(t), &Limits{Env: 2})
	a := w.sources[0]
	la, lb := handLoop(w, a), handLoop(w, w.sources[1])
	lb.freeAsked = freeAsked
	j1, j2, cb := aHoldsBothSlots(t, w, la, lb)
	// qa's acks run in Redis (both env slots free); their reply waits.
	ca2 := &fetchCall{acks: []*job{j1, j2}, ks: w.slots.take(nil, 1, 1, nil), hints: la.hints,
		released: a.line.leave(a), lineAcks: true}
	a.line.acks(1) // (as launch counts it)
	a.fetch(ca2)
	require.NoError(t, ca2.err)
	require.Empty(t, ca2.runs)
	lb.finish(cb)
	la.finish(ca2)
	return w, lb
}

// aHoldsBothSlots: on a lineWorker w at env limit 2 with its sources'
// loops la (queue a) and lb (queue b), driven by hand, a's call takes a1
// and a2 (both env slots; its reply processed, their expiry timers
// stopped), and b's call runs in Redis and gets none of b1: b's reply is
// left to the caller.
func aHoldsBothSlots(t *testing.T, w *Worker, la, lb *fetchLoop) (j1, j2 *job, cb *fetchCall) {
	t.Helper()
	ctx := context.Background()
	a, b := la.s, lb.s
	for _, p := range []EnqueueParams{{Queue: "a", ID: "a1"}, {Queue: "a", ID: "a2"}, {Queue: "b", ID: "b1"}} {
		p.Env, p.Key = "e", "k"
		_, err := w.q.Enqueue(ctx, p)
		require.NoError(t, err)
	}
	ca := &fetchCall{ks: w.slots.take(a, 2, 1, nil), hints: la.hints, released: a.line.leave(a)}
	a.fetch(ca)
	require.NoError(t, ca.err)
	require.Len(t, ca.runs, 2)
	la.finish(ca)
	j1, j2 = <-w.jobs, <-w.jobs
	j1.expiry.Stop()
	j2.expiry.Stop()
	cb = &fetchCall{ks: w.slots.take(b, 1, 1, nil), hints: lb.hints, released: b.line.leave(b)}
	b.fetch(cb)
	require.NoError(t, cb.err)
	require.Empty(t, cb.runs)
	return j1, j2, cb
}

// helper-212: a held call whose look finds the env free (acks ran in
// Redis after it, their release not yet seen) asks again, once: before,
// it neither joined the line nor asked, and the release found the line
// empty; qb sat idle for its look (30 s) with b1 ready and the env free.
func TestEnvLineFreedBeforeReleaseSeenAsksAgain(t *testing.T) {
	t.Parallel()
	w, lb := freedBeforeReleaseSeen(t, false)
	require.False(t, lb.idle, "the env was free at qb's look: qb asks again")
	require.True(t, lb.freeAsked)
	probe := &fetchCall{ks: w.slots.take(nil, 1, 1, nil)}
	lb.s.fetch(probe)
	require.NoError(t, probe.err)
	require.Len(t, probe.runs, 1, "the env is free and b1 ready")
}

// helper-212's second crossing: a source that already asked again once for
// a look that found the env free, and finds it free again, joins the line
// while acks of the line are on their way, and their release wakes it;
// before, it went idle out of the line for its look.
func TestEnvLineFreedAgainJoinsWhileAcksAreOnTheirWay(t *testing.T) {
	t.Parallel()
	_, lb := freedBeforeReleaseSeen(t, true)
	require.True(t, lb.idle)
	require.True(t, nudgedNow(lb.s), "qa's release wakes qb, which joined while qa's acks were on their way")
}

// A call with acks of a source of the line counts in the line's acking
// from its launch until its reply was processed (its release made).
func TestEnvLineCountsAcksOnTheirWay(t *testing.T) {
	t.Parallel()
	w := lineWorker(t, redistest.Mini(t), &Limits{Env: 2})
	a := w.sources[0]
	la := handLoop(w, a)
	acking := func() int {
		a.line.mu.Lock()
		defer a.line.mu.Unlock()
		return a.line.acking
	}
	la.launch(&fetchCall{acks: []*job{{run: &Run{Env: "e", Queue: "a", ID: "x", Token: 1}, src: a}}})
	require.Equal(t, 1, acking(), "on its way")
	c := <-la.results
	require.Equal(t, 1, acking(), "until its reply is processed")
	la.inflight--
	la.finish(c)
	require.Equal(t, 0, acking())
	la.launch(&fetchCall{ks: w.slots.take(a, 1, 1, nil)})
	require.Equal(t, 0, acking(), "a call without acks does not count")
	la.inflight--
	la.finish(<-la.results)
}

// Flag off (no waiting line in Redis), env limit 2: a Worker over qa and
// qb whose qa runs hold both env slots; qb's call finds its run held back
// and its look the env at its limit: qb joins the env's envLine. When qa's
// runs end and qa has nothing more, the acks' call frees the env's slots
// and wakes qb, which is served at once; before, it waited for its look
// (BlockPollInterval, 30 s here), the env free. two-Workers: qa and qb on
// two Workers of one Queue (helper-209's shape, flag off: the third queue
// on a Worker of its own): the line is the Queue's, so qa's Worker's
// release wakes qb's Worker (with a line per Worker, b1 waited for its
// look).
func TestWorkerEnvLineWakesHeldQueueFlagOff(t *testing.T) {
	t.Parallel()
	for _, split := range []bool{false, true} {
		name := map[bool]string{false: "one-Worker", true: "two-Workers"}[split]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			redistest.ForEachBackend(t, lineBackends, func(t *testing.T, c redis.UniversalClient) {
				_, gate, served := qbBehindQa(t, c, func() int { return 2 }, split)
				close(gate)
				waitServed(t, served, "b1", func() string { return "once qa's runs ended (" + name + ")" })
			})
		})
	}
}

// A source counts in its line while its loop runs: looks read the env's
// counts only while two or more do (a lone Worker over one queue of the
// env pays nothing for the line). A source whose loop ends leaves the
// line, and a wake-up it got and did not use goes on to the first source
// waiting for the env, not to one that joined on a free look while one
// that joined held waits, and not back to itself; the line goes with its
// last source.
func TestEnvLineMembersAndWakeUpOfAStoppingSource(t *testing.T) {
	t.Parallel()
	ss := lineSources(4)
	a, b, c, d := ss[0], ss[1], ss[2], ss[3]
	line := a.line
	require.GreaterOrEqual(t, lineMembers(line), 2)
	loop := func(s *source) *fetchLoop { return &fetchLoop{s: s, w: s.w, lineIn: true} }
	for _, s := range []*source{b, c} {
		mustJoin(t, s, false, 0)
	}
	line.acks(1)
	mustJoin(t, d, true, 0, "d joins on a free look")
	line.acks(-1)
	line.release(a, 1)
	require.False(t, inEnvLine(b), "b, the longest held, is woken")
	lb := loop(b)
	lb.exitLine() // b's Worker stops before b's loop saw the wake-up
	require.False(t, lb.lineIn)
	require.True(t, nudgedNow(c), "b's unused wake-up goes on to c")
	require.False(t, nudgedNow(d), "d joined on a free look: owed none")
	require.False(t, nudgedNow(b))
	lb.exitLine()
	require.GreaterOrEqual(t, lineMembers(line), 2, "a, c and d still call")

	mustJoin(t, c, false, 0)
	la := loop(a)
	la.lineWoken = true // a's call for the wake-up it got is on its way
	la.exitLine()
	require.True(t, nudgedNow(c), "a wake-up a call of a's has not answered goes on too")
	loop(c).exitLine()
	require.Equal(t, 1, lineMembers(line), "d alone calls: its looks read no counts")
	require.True(t, inEnvLine(d))
	loop(d).exitLine()
	require.False(t, inEnvLine(d), "a source that stops leaves the line")
	require.Empty(t, line.members)
	require.Empty(t, a.w.q.lines, "the line goes with its last member")
}

// lineMembers is how many sources count in e.
func lineMembers(e *envLine) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.members)
}

// mustJoin: s's call for runs begins (leave) and, no release made since,
// s joins its line (free: on a free look; limit: its queue's env limit).
func mustJoin(t *testing.T, s *source, free bool, limit int, msgAndArgs ...any) {
	t.Helper()
	at := s.line.leave(s)
	require.Equal(t, lineJoined, s.line.join(s, at, free, limit), msgAndArgs...)
}

// inEnvLine says whether s waits in its envLine.
// (It finds the line through the Queue's map: s.line is its loop's, set
// as the loop begins.)
func inEnvLine(s *source) bool {
	q := s.w.q
	q.linesMu.Lock()
	e := q.lines[s.env]
	q.linesMu.Unlock()
	if e == nil {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return s.inLine
}

// A source the line woke that cannot take the slot (its key limits hold
// it), the env left free, passes the wake-up to the first source that
// joined on a held look, never to one that joined on a free look (two
// such would pass it back and forth while acks flow) nor to itself.
func TestEnvLinePassGoesToAHeldWaiter(t *testing.T) {
	t.Parallel()
	ss := lineSources(4)
	a, b, c, d := ss[0], ss[1], ss[2], ss[3]
	line := a.line
	line.acks(1)
	mustJoin(t, b, true, 0, "b joins on a free look")
	mustJoin(t, c, false, 0, "c joins on a held look")
	mustJoin(t, a, false, 0)
	line.acks(-1)

	at := line.leave(d)
	line.pass(a, false)
	require.False(t, nudgedNow(b), "b joined on a free look: owed none")
	require.True(t, nudgedNow(c), "the first held waiter is woken")
	require.False(t, inEnvLine(c))
	require.True(t, inEnvLine(b))
	require.Equal(t, lineCrossed, line.join(d, at, false, 0), "a pass counts as a release for a crossing call")

	line.leave(a)
	mustJoin(t, a, false, 0)
	line.pass(a, false)
	require.False(t, nudgedNow(a), "never the passing source itself")
	require.False(t, nudgedNow(b))
	require.True(t, inEnvLine(a))
}

// gatedQa is a flag-off Queue at 30 s polls whose env "e" has the limit
// envLimit(), with qa's runs a1 and a2 enqueued, and a handler whose qa runs
// wait until gate closes; started and served get each run's ID.
type gatedQa struct {
	q               *Queue
	handler         Handler
	gate            chan struct{}
	started, served chan string
}

func newGatedQa(t *testing.T, c redis.UniversalClient, envLimit func() int) *gatedQa {
	ctx := context.Background()
	q := lineQueue(t, c, func(string, string) Limits { return Limits{Env: envLimit()} })
	g := &gatedQa{q: q, gate: make(chan struct{}), started: make(chan string, 4), served: make(chan string, 4)}
	g.handler = func(_ context.Context, r *Run) error {
		g.started <- r.ID
		if r.Queue == "qa" {
			<-g.gate
		}
		g.served <- r.ID
		return nil
	}
	for _, id := range []string{"a1", "a2"} {
		_, err := q.Enqueue(ctx, EnqueueParams{Env: "e", Queue: "qa", Key: "k", ID: id})
		require.NoError(t, err)
	}
	return g
}

// startedWorker is a started Worker of q over cfg, with handler h, shut
// down gracefully (within 10 s, without error) at the test's end.
func startedWorker(t *testing.T, q *Queue, h Handler, cfg *WorkerConfig) *Worker {
	t.Helper()
	ctx := context.Background()
	w, err := NewWorker(q, h, cfg)
	require.NoError(t, err)
	require.NoError(t, w.Start(ctx))
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		require.NoError(t, w.Shutdown(sctx))
	})
	return w
}

// qbBehindQa starts, flag off at 30 s polls, a Worker over qa and qb of env
// "e" with the env limit envLimit() (2 to begin with), or (split) two
// Workers of one Queue, one over qa and one over qb: qa's runs a1 and a2
// hold both env slots until gate closes; b1, enqueued then, finds the env
// full and qb joins the line. It returns qb's source, the gate and the
// served runs' IDs.
func qbBehindQa(t *testing.T, c redis.UniversalClient, envLimit func() int, split bool) (*source, chan struct{}, chan string) {
	ctx := context.Background()
	g := newGatedQa(t, c, envLimit)
	q, handler, gate, started, served := g.q, g.handler, g.gate, g.started, g.served
	qa, qb := WorkerQueue{Env: "e", Queue: "qa"}, WorkerQueue{Env: "e", Queue: "qb"}
	cfgs := []*WorkerConfig{{Queues: []WorkerQueue{qa, qb}, Concurrency: 3}}
	if split {
		cfgs = []*WorkerConfig{{Queues: []WorkerQueue{qa}, Concurrency: 2}, {Queues: []WorkerQueue{qb}, Concurrency: 1}}
	}
	var qbs *source
	for _, cfg := range cfgs {
		w := startedWorker(t, q, handler, cfg)
		qbs = w.sources[len(w.sources)-1]
	}
	for range 2 {
		<-started
	}
	_, err := q.Enqueue(ctx, EnqueueParams{Env: "e", Queue: "qb", Key: "k", ID: "b1"})
	require.NoError(t, err)
	require.Equal(t, "qb", qbs.queue)
	require.Eventually(t, func() bool { return inEnvLine(qbs) }, 10*time.Second, 5*time.Millisecond,
		"qb's call finds the env full: it joins the line")
	return qbs, gate, served
}

func waitServed(t *testing.T, served <-chan string, id string, state func() string) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case got := <-served:
			if got == id {
				return
			}
		case <-deadline:
			t.Fatalf("%s not served in 20 s (its poll is 30 s) %s", id, state())
		}
	}
}

// helper-213: a source its key limit holds is first in the line; a release
// wakes it and it takes nothing (its key is busy), the env left with room:
// the wake-up goes on to the env-held source behind it. Before, that one
// was never woken: it waited for its poll (30 s).
func TestWorkerEnvLineWakeUpGoesOnPastKeyHeldQueue(t *testing.T) {
	t.Parallel()
	redistest.ForEachBackend(t, lineBackends, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		q := lineQueue(t, c, func(_, queue string) Limits {
			if queue == "qa" {
				return Limits{Env: 2, Key: 1}
			}
			return Limits{Env: 2}
		})
		gateA, gateC := make(chan struct{}), make(chan struct{})
		started, served := make(chan string, 16), make(chan string, 16)
		w, err := NewWorker(q, func(_ context.Context, r *Run) error {
			started <- r.ID
			switch r.Queue {
			case "qa":
				<-gateA // a long run: its key holds qa's other runs
			case "qc":
				<-gateC
			}
			served <- r.ID
			return nil
		}, &WorkerConfig{Queues: []WorkerQueue{{Env: "e", Queue: "qa"}, {Env: "e", Queue: "qb"}, {Env: "e", Queue: "qc"}},
			Concurrency: 4})
		require.NoError(t, err)
		for _, p := range []EnqueueParams{{Env: "e", Queue: "qa", Key: "k", ID: "a1"}, {Env: "e", Queue: "qc", Key: "k", ID: "c1"}} {
			_, err := q.Enqueue(ctx, p)
			require.NoError(t, err)
		}
		require.NoError(t, w.Start(ctx))
		t.Cleanup(func() {
			close(gateA)
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			require.NoError(t, w.Shutdown(sctx))
		})
		for range 2 {
			<-started
		}
		qa, qb := w.sources[0], w.sources[1]
		_, err = q.Enqueue(ctx, EnqueueParams{Env: "e", Queue: "qa", Key: "k", ID: "a2"})
		require.NoError(t, err)
		require.Eventually(t, func() bool { return inEnvLine(qa) }, 10*time.Second, 5*time.Millisecond,
			"qa's call finds the env full (and its key busy): it joins the line")
		_, err = q.Enqueue(ctx, EnqueueParams{Env: "e", Queue: "qb", Key: "k", ID: "b1"})
		require.NoError(t, err)
		require.Eventually(t, func() bool { return inEnvLine(qb) }, 10*time.Second, 5*time.Millisecond,
			"qb's call finds the env full: it joins the line behind qa")
		close(gateC) // c1 ends: qc's ack frees one env slot and wakes qa, whose key still holds it
		waitServed(t, served, "b1", func() string {
			return fmt.Sprintf("with the env at 1 of 2; qb in line: %v, qa in line: %v", inEnvLine(qb), inEnvLine(qa))
		})
	})
}

// helper-213: the env's limit is lifted (Limits.Env 0) while qb waits in
// the line; qa's runs end and their acks wake the whole line. Before, the
// release was made only under an env limit: qb waited for its poll (30 s).
func TestWorkerEnvLineWokenWhenEnvLimitLifted(t *testing.T) {
	t.Parallel()
	redistest.ForEachBackend(t, lineBackends, func(t *testing.T, c redis.UniversalClient) {
		var envLim atomic.Int64
		envLim.Store(2)
		qb, gate, served := qbBehindQa(t, c, func() int { return int(envLim.Load()) }, false)
		envLim.Store(0) // the env's limit is lifted
		close(gate)
		waitServed(t, served, "b1", func() string {
			return fmt.Sprintf("with the env's limit lifted and qa's runs ended; qb in line: %v", inEnvLine(qb))
		})
	})
}

// A call whose own acks ran first in its script, and that got no runs, was
// not held by the env (its acks made room for it): it does not join the
// line, whatever its last look said (an idle source's call with acks does
// not look again when nothing changed).
func TestEnvLineCallWithOwnAcksDoesNotJoin(t *testing.T) {
	t.Parallel()
	w := lineWorker(t, redistest.Mini(t), &Limits{Env: 2})
	b := w.sources[1]
	lb := handLoop(w, b)
	lb.looked, lb.envLook = true, envLook{held: true} // (a look from before its acks)
	c := &fetchCall{acks: []*job{{run: &Run{Env: "e", Queue: "b", ID: "x", Token: 1}, src: b}}, ackErrs: []error{nil},
		ks: w.slots.take(b, 1, 1, nil), released: b.line.leave(b)}
	require.Len(t, c.ks, 1)
	lb.finish(c)
	require.True(t, lb.idle)
	require.False(t, inEnvLine(b), "its own acks made room: the env did not hold it")
	d := &fetchCall{ks: w.slots.take(b, 1, 1, nil), released: b.line.leave(b)}
	lb.finish(d)
	require.True(t, inEnvLine(b), "a call without acks, the look finding the env full, joins")
}

// evalHold holds the replies of the script calls naming queue (evalsha,
// alone or in a pipeline: the call runs in Redis, its reply waits) while on
// is set, until release closes; held says one is held.
type evalHold struct {
	queue   string
	on      atomic.Bool
	held    chan struct{}
	release chan struct{}
	once    sync.Once
}

func (h *evalHold) hold(cmds []redis.Cmder) {
	for _, c := range cmds {
		if c.Name() == "evalsha" && h.on.Load() && strings.Contains(fmt.Sprint(c.Args()...), h.queue) {
			h.once.Do(func() { close(h.held) })
			<-h.release
			return
		}
	}
}

func (h *evalHold) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *evalHold) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, c redis.Cmder) error {
		err := next(ctx, c)
		h.hold([]redis.Cmder{c})
		return err
	}
}
func (h *evalHold) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.hold(cmds)
		return err
	}
}

// Env limit 1: Worker W1's run a1 of qa holds the env; b1 of qb, on Worker
// W2 of the same Queue, is held and qb waits in the line. W1 is stopped
// hard (its Start context ends) while the call carrying a1's ack is on its
// way (it ran in Redis, freeing the env; its reply is late). The hard stop
// takes the reply without the usual step: the line, the Queue's and kept
// by W2, counted those acks on their way for good (a free-look join would
// wait on them), and the slot they freed woke nobody: b1 waited for qb's
// poll (30 s). Now the reply's acks are settled in the line and their
// release wakes qb.
func TestEnvLineHardStopSettlesItsAcksOnTheirWay(t *testing.T) {
	t.Parallel()
	redistest.ForEachBackend(t, lineBackends, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		hook := &evalHold{queue: "qa", held: make(chan struct{}), release: make(chan struct{})}
		c.AddHook(hook)
		q := lineQueue(t, c, func(string, string) Limits { return Limits{Env: 1} })
		started, finish := make(chan struct{}), make(chan struct{})
		w1, err := NewWorker(q, func(context.Context, *Run) error {
			close(started)
			<-finish
			hook.on.Store(true) // the reply of the call carrying a1's ack is held
			return nil
		}, &WorkerConfig{Queues: []WorkerQueue{{Env: "e", Queue: "qa"}}, Concurrency: 1})
		require.NoError(t, err)
		served := make(chan string, 1)
		w2 := startedWorker(t, q, func(_ context.Context, r *Run) error { served <- r.ID; return nil },
			&WorkerConfig{Queues: []WorkerQueue{{Env: "e", Queue: "qb"}}, Concurrency: 1})
		hard, stop := context.WithCancel(ctx)
		defer stop()
		require.NoError(t, w1.Start(hard))
		_, err = q.Enqueue(ctx, EnqueueParams{Env: "e", Queue: "qa", Key: "k", ID: "a1"})
		require.NoError(t, err)
		<-started
		_, err = q.Enqueue(ctx, EnqueueParams{Env: "e", Queue: "qb", Key: "k", ID: "b1"})
		require.NoError(t, err)
		qb := w2.sources[0]
		require.Eventually(t, func() bool { return inEnvLine(qb) }, 10*time.Second, 5*time.Millisecond,
			"qb's call finds the env full: it joins the line")
		close(finish)
		select {
		case <-hook.held:
		case <-time.After(10 * time.Second):
			t.Fatal("the call carrying a1's ack was not sent")
		}
		q.linesMu.Lock()
		line := q.lines["e"]
		q.linesMu.Unlock()
		acking := func() int {
			line.mu.Lock()
			defer line.mu.Unlock()
			return line.acking
		}
		require.Equal(t, 1, acking(), "a1's ack is on its way")
		stop() // the hard stop
		close(hook.release)
		waitServed(t, served, "b1", func() string {
			return fmt.Sprintf("once W1's late reply came after its hard stop; qb in line: %v", inEnvLine(qb))
		})
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_ = w1.Shutdown(sctx) // (after a hard stop it reports the Start context's end; it returns once W1's loops ended)
		// (W2's ack of b1 may be on its way a moment)
		require.Eventually(t, func() bool { return acking() == 0 }, 10*time.Second, 5*time.Millisecond,
			"no acks of the line are on their way")
	})
}

// helper-216's G3: a source that called alone looked without the env's
// counts, so a queue the env held stayed out of the line; a second source
// entering then freed the env's slots and woke nobody (the first waited
// for its poll). The second's entry asks the lone source to look again, a
// nudge that is no wake-up of the line (nothing to pass on); only the
// entry that makes the line shared sends one, and only to a source not
// waiting in the line already (a release wakes that one). A wake-up after
// the ask is the line's.
func TestEnvLineSecondMemberAsksTheLoneOneToLookAgain(t *testing.T) {
	t.Parallel()
	w := &Worker{q: &Queue{}}
	w.setBase(context.Background())
	src := func(queue string) *source {
		s := &source{w: w, env: "e", queue: queue, shard: -1, lined: true, nudged: make(chan struct{}, 1)}
		w.q.enterLine(s)
		return s
	}
	exit := func(s *source) {
		l := handLoop(w, s)
		l.lineIn = true
		l.exitLine()
	}
	a := src("a")
	require.False(t, nudgedNow(a), "alone: no one to ask")
	la := handLoop(w, a)
	la.idle, la.looked = true, true // a's call got nothing, its look (alone) read no counts
	require.False(t, a.line.sharedFor(a))
	b := src("b")
	require.False(t, nudgedNow(b), "the entering source itself is not asked")
	require.Len(t, a.nudged, 1, "b's entry made the line shared: a is asked to look again")
	require.True(t, la.wait())
	require.False(t, la.idle || la.looked, "a looks again, now with the env's counts")
	require.False(t, la.lineWoken, "a look again is no wake-up of the line: a's call that takes nothing passes none on")
	c := src("c")
	require.False(t, nudgedNow(a) || nudgedNow(b) || nudgedNow(c), "the line was shared already")

	// a waits in the line when the others leave and one comes again: a
	// release of the newcomer's wakes it, no look again is asked.
	mustJoin(t, a, false, 0)
	exit(b)
	exit(c)
	require.Len(t, a.line.members, 1)
	d := src("d")
	require.False(t, nudgedNow(a), "a waits in the line: no look again")
	a.line.release(d, 1)
	require.True(t, nudgedNow(a))
	require.True(t, a.line.nudgedFor(a), "a wake-up of the line")

	// Asked to look again, then woken before it took the nudge (one
	// token): the wake-up's.
	exit(d)
	e := src("e2")
	mustJoin(t, a, false, 0)
	a.line.release(e, 1)
	require.True(t, nudgedNow(a))
	require.True(t, a.line.nudgedFor(a), "the wake-up after the ask is the line's")
	require.False(t, nudgedNow(e))

	// A source asked to look again that stops before it took the nudge
	// passes nothing on (it got no wake-up): e, waiting on a held look,
	// is not woken.
	exit(e)
	exit(a)
	require.Empty(t, w.q.lines)
	g := src("g")
	require.False(t, g.line.sharedFor(g)) // g's call answered, alone
	h := src("h")
	require.Len(t, g.nudged, 1, "g, alone and not waiting, is asked to look again")
	mustJoin(t, h, false, 0)
	lg := handLoop(w, g)
	lg.lineIn = true
	lg.quitLine()
	require.False(t, nudgedNow(h), "g's stop passed on a wake-up it never got")
	require.Empty(t, g.nudged)
}

// G3 end to end (flag off, env limit 1, 30 s polls): b0 of qb, taken by a
// plain Dequeue, holds the env; W1 over qa alone calls, gets nothing and
// looks without counts. W2 over qb starts: qa looks again with the env's
// counts and joins the line. b0 is acked (a plain Ack wakes nobody) and b1
// enqueued: W2 serves b1 and its ack's release wakes qa, which serves a1
// well within its poll. Before, qa never joined and waited for its poll.
func TestWorkerEnvLineSecondWorkerAsksLoneQueueToLookAgain(t *testing.T) {
	t.Parallel()
	redistest.ForEachBackend(t, lineBackends, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		hook := &lookHook{queue: "qa"}
		c.AddHook(hook)
		q := lineQueue(t, c, func(string, string) Limits { return Limits{Env: 1} })
		enq := func(queue, id string) {
			_, err := q.Enqueue(ctx, EnqueueParams{Env: "e", Queue: queue, Key: "k", ID: id})
			require.NoError(t, err)
		}
		enq("qb", "b0")
		held, err := q.Dequeue(ctx, "e", "qb", 1)
		require.NoError(t, err)
		require.Len(t, held, 1)
		enq("qa", "a1")
		served := make(chan string, 4)
		handler := func(_ context.Context, r *Run) error { served <- r.ID; return nil }
		w1 := startedWorker(t, q, handler, &WorkerConfig{Queues: []WorkerQueue{{Env: "e", Queue: "qa"}}, Concurrency: 1})
		require.Eventually(t, func() bool { return hook.n.Load() > 0 }, 10*time.Second, 5*time.Millisecond, "qa's look")
		require.Zero(t, hook.gets.Load(), "qa, alone in the env's line, looks without its counts")
		qa := w1.sources[0]
		require.False(t, inEnvLine(qa))
		startedWorker(t, q, handler, &WorkerConfig{Queues: []WorkerQueue{{Env: "e", Queue: "qb"}}, Concurrency: 1})
		require.Eventually(t, func() bool { return inEnvLine(qa) }, 10*time.Second, 5*time.Millisecond,
			"W2 came: qa looks again, with the env's counts, and joins the line")
		require.NoError(t, q.Ack(ctx, held[0]))
		enq("qb", "b1")
		waitServed(t, served, "a1", func() string { return fmt.Sprintf("qa in line: %v", inEnvLine(qa)) })
	})
}

// helper-219's F3 (flag off, 30 s polls): LimitsFor gives env e's queues
// different limits, qa 1, qb and qc 3. qb's three runs hold the env at 3;
// qa, then qc, join the line held. One of qb's runs ends and qb has no
// more: its release wakes qa, the longest held, which the env still holds
// (2 of its 1) and which joins again; the slot fits qc (2 of 3), to which
// qa now passes the wake-up. Before, qc waited for its poll.
func TestWorkerEnvLineWakeUpGoesOnToHigherLimit(t *testing.T) {
	t.Parallel()
	redistest.ForEachBackend(t, lineBackends, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		q := lineQueue(t, c, func(_, queue string) Limits {
			if queue == "qa" {
				return Limits{Env: 1}
			}
			return Limits{Env: 3}
		})
		gates := map[string]chan struct{}{}
		for _, p := range []EnqueueParams{{Queue: "qb", ID: "b0"}, {Queue: "qb", ID: "b1"}, {Queue: "qb", ID: "b2"},
			{Queue: "qa", ID: "a1"}, {Queue: "qc", ID: "c1"}} {
			p.Env, p.Key = "e", "k"+p.ID
			_, err := q.Enqueue(ctx, p)
			require.NoError(t, err)
			if p.Queue == "qb" {
				gates[p.ID] = make(chan struct{})
			}
		}
		started, served := make(chan string, 8), make(chan string, 8)
		handler := func(_ context.Context, r *Run) error {
			started <- r.ID
			if g := gates[r.ID]; g != nil {
				<-g
			}
			served <- r.ID
			return nil
		}
		over := func(queue string, n int) *WorkerConfig {
			return &WorkerConfig{Queues: []WorkerQueue{{Env: "e", Queue: queue}}, Concurrency: n}
		}
		startedWorker(t, q, handler, over("qb", 3))
		for range 3 {
			<-started
		}
		wa := startedWorker(t, q, handler, over("qa", 1))
		require.Eventually(t, func() bool { return inEnvLine(wa.sources[0]) }, 10*time.Second, 5*time.Millisecond,
			"qa, held at 3 of its 1, joins the line")
		wc := startedWorker(t, q, handler, over("qc", 1))
		require.Eventually(t, func() bool { return inEnvLine(wc.sources[0]) }, 10*time.Second, 5*time.Millisecond,
			"qc, held at 3 of its 3, joins behind qa")
		t.Cleanup(func() { close(gates["b1"]); close(gates["b2"]) }) // (before the Workers' shutdowns)
		close(gates["b0"])
		waitServed(t, served, "c1", func() string {
			return fmt.Sprintf("qa in line: %v, qc in line: %v", inEnvLine(wa.sources[0]), inEnvLine(wc.sources[0]))
		})
	})
}

// passAbove wakes the first waiter whose queue's env limit, as it joined,
// is above the count the passing source saw, never the passing source,
// and counts as a release.
func TestEnvLinePassAboveGoesToAHigherLimit(t *testing.T) {
	t.Parallel()
	ss := lineSources(4)
	a, b, c, d := ss[0], ss[1], ss[2], ss[3]
	line := a.line
	for _, j := range []struct {
		s     *source
		limit int
	}{{a, 1}, {b, 2}, {c, 3}, {d, 3}} {
		mustJoin(t, j.s, false, j.limit)
	}
	at := line.leave(a)
	require.Equal(t, lineJoined, line.join(a, at, false, 1), "a, woken, held at 2 of its 1, joins again")
	line.passAbove(a, 3)
	require.False(t, nudgedNow(b) || nudgedNow(c) || nudgedNow(d), "no waiter's limit is above 3")
	line.passAbove(a, 2)
	require.False(t, nudgedNow(b), "b's limit 2 is not above 2")
	require.True(t, nudgedNow(c), "c's limit 3 is: the first such waiter")
	require.False(t, nudgedNow(d))
	require.Equal(t, lineCrossed, line.join(b, at, false, 2), "a pass counts as a release")
	line.passAbove(d, 0)
	require.True(t, nudgedNow(b), "b, first in line now, its limit above 0")
	require.False(t, nudgedNow(d) || nudgedNow(a))
	line.passAbove(d, 0)
	require.False(t, nudgedNow(d), "never the passing source")
	require.True(t, nudgedNow(a))

	// d joined on a free look (waiting for acks on their way): passed
	// over, as its key limits may hold it and it would pass the wake-up
	// back for as long as acks are on their way.
	line.acks(1)
	mustJoin(t, d, true, 3)
	mustJoin(t, b, false, 1)
	line.passAbove(b, 2)
	require.False(t, nudgedNow(d), "d joined on a free look")
	line.acks(-1)
}
