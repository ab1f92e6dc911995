package runqueue

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
)

// A source whose queue is idle sends the acks of its finished runs and asks
// for runs with them only if a slot happens to be free: its try must not
// queue it up as a slot waiter, or the slot freed next pokes it (it wants
// nothing) rather than a source with a backlog, which then waits for ever.
// (Once its acks went alone it does want a slot, and waits for one after
// that call: TestWorkerIdleSourceAsksAgainAfterItsAcksGoAlone.) The loops
// are driven by hand so that the order is the one that stalled.
func TestWorkerIdleSourceDoesNotSwallowSlotPokes(t *testing.T) {
	t.Parallel()
	w := handWorker(t, 1, "idle", "busy")
	idle, busy := w.sources[0], w.sources[1]

	// The only slot is held by a running handler.
	held := w.slots.take(nil, 1, 1, nil)
	require.Len(t, held, 1)

	// The idle source has the ack of a run that finished: it sends it alone.
	l := &fetchLoop{s: idle, w: w, results: make(chan *fetchCall, fetchDepth), fetching: true, idle: true, gatherWant: 1}
	idle.acks = []*job{{run: &Run{Env: "e", Queue: "idle", ID: "done", Token: 1}, src: idle}}
	require.True(t, l.issue(), "the ack goes at once")
	c := <-l.results
	require.Empty(t, c.ks, "no slot was free: the call asks for no runs")

	// The busy source has a backlog and waits for a slot.
	require.Empty(t, w.slots.take(busy, w.fetchN, 1, nil))

	// The handler returns and frees the slot: the busy source is poked.
	w.slots.give(held...)
	select {
	case <-busy.kick:
	default:
		t.Fatal("the freed slot did not poke the source that waits for it")
	}
	select {
	case <-idle.kick:
		t.Fatal("the freed slot poked the idle source, which did not ask for one")
	default:
	}
	require.Len(t, w.slots.take(busy, w.fetchN, 1, nil), 1)
}

// A source whose call came back short goes idle and drops its wait for a
// slot: a stale wait would take the poke of the next freed slot.
func TestWorkerSourceGoingIdleForgetsItsWait(t *testing.T) {
	t.Parallel()
	w := handWorker(t, 3, "a", "b")
	a, b := w.sources[0], w.sources[1]
	l := &fetchLoop{s: a, w: w, results: make(chan *fetchCall, fetchDepth), fetching: true, gatherWant: 3}

	// Source a's first call took two slots; a gathering second call waits
	// for three free slots; a handler of b holds the third slot.
	first := w.slots.take(a, 3, 1, nil)
	require.Len(t, first, 3)
	first = first[:2] // first[2]: the slot of b's handler
	l.gatherC = make(chan time.Time)
	require.False(t, l.issue())
	require.Equal(t, 3, w.slots.waiting[a])
	// Source b waits for one slot, behind a.
	require.Empty(t, w.slots.take(b, w.fetchN, 1, nil))

	// a's first call got one run of the two it asked for: a is idle now,
	// wants no slot, and b gets the one a gave back.
	l.inflight = 1
	l.finish(&fetchCall{ks: first, runs: []*Run{{Env: "e", Queue: "a", ID: "r", Token: 1, LeaseDeadline: time.Now()}}})
	<-w.jobs
	require.True(t, l.idle)
	_, waits := w.slots.waiting[a]
	require.False(t, waits, "an idle source waits for no slot")
	select {
	case <-b.kick:
	default:
		t.Fatal("a free slot is left while a source waits for one")
	}
	require.Len(t, w.slots.take(b, 1, 1, nil), 1)
}

// A source with a backlog has a call in flight and waits for a slot for a
// second one; another source waits behind it. When the first call comes
// back empty, the slot it gives back goes to the other source: the idle
// source must not be poked by its own slot (it would not take it).
func TestWorkerSlotGivenBackGoesToAnotherSource(t *testing.T) {
	t.Parallel()
	w := handWorker(t, 1, "a", "b")
	a, b := w.sources[0], w.sources[1]
	l := &fetchLoop{s: a, w: w, results: make(chan *fetchCall, fetchDepth), fetching: true, full: true, gatherWant: 1}

	ks := w.slots.take(a, 1, 1, nil) // a's first call
	require.Len(t, ks, 1)
	l.inflight = 1
	require.False(t, l.issue(), "no slot for a second call: a waits")
	require.Empty(t, w.slots.take(b, 1, 1, nil)) // b waits behind a

	l.finish(&fetchCall{ks: ks}) // the first call found nothing
	require.True(t, l.idle)
	select {
	case <-b.kick:
	default:
		t.Fatal("the slot a gave back did not poke b, which waits for one")
	}
	select {
	case <-a.kick:
		t.Fatal("the slot a gave back poked a, which is idle")
	default:
	}
	require.Len(t, w.slots.take(b, 1, 1, nil), 1)
}

// handWorker is a Worker over queues a and b of env "e" on miniredis, not
// started: a test drives its slots and fetch loops by hand.
func handWorker(t *testing.T, concurrency int, a, b string) *Worker {
	ctx := context.Background()
	q, err := New(ctx, redistest.Mini(t), &Config{Prefix: redistest.Prefix(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	w, err := NewWorker(q, func(context.Context, *Run) error { return nil }, &WorkerConfig{
		Queues:      []WorkerQueue{{Env: "e", Queue: a}, {Env: "e", Queue: b}},
		Concurrency: concurrency,
	})
	require.NoError(t, err)
	w.setBase(ctx)
	return w
}

// TestWorkerShardHeldKeepsLatest: a shard source keeps the queues whose
// last visit got fewer runs than asked (it leaves their env's waiting line
// at its stop) to the latest 2 x leaveMax while queues come and go
// (helper-209: 4.5 MB for 12,000 one-run queues, never dropped while the
// Worker ran), forgets one whose later visit got all it asked for, and
// leaves the latest leaveMax.
func TestWorkerShardHeldKeepsLatest(t *testing.T) {
	t.Parallel()
	w := handWorker(t, 1, "a", "b")
	l := &fetchLoop{s: &source{w: w, shard: 0}, w: w}
	var order []*queueNames
	for i := range 1000 {
		qn := w.q.names("e", fmt.Sprint("q", i))
		order = append(order, qn)
		l.noteVisits(map[*queueNames]bool{qn: true})
		require.LessOrEqual(t, len(l.held), 2*leaveMax)
	}
	last := order[len(order)-1]
	l.noteVisits(map[*queueNames]bool{last: false})
	require.NotContains(t, l.held, last.member, "a visit that got all it asked for forgets the queue")
	got := map[string]bool{}
	for _, qn := range l.takeMarks() {
		got[qn.member] = true
	}
	want := map[string]bool{}
	for _, qn := range order[len(order)-1-leaveMax : len(order)-1] {
		want[qn.member] = true
	}
	require.Equal(t, want, got, "the latest leaveMax are left")
	require.Empty(t, l.held)
	require.Empty(t, l.takeMarks())
}

// An idle source whose acks go alone (every slot busy with another
// source's runs) asks again once a slot frees: its acks free slots of its
// queue and env, which may be what held it, and nothing else may wake it
// (helper-209: a Worker's last queue idle for its whole poll with ready
// runs and its env free, once its other queue drained).
func TestWorkerIdleSourceAsksAgainAfterItsAcksGoAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := handWorker(t, 1, "a", "b")
	a := w.sources[0]
	for _, id := range []string{"r1", "r2"} {
		_, err := w.q.Enqueue(ctx, EnqueueParams{Env: "e", Queue: "a", Key: "k", ID: id})
		require.NoError(t, err)
	}
	done, err := w.q.Dequeue(ctx, "e", "a", 1)
	require.NoError(t, err)
	require.Len(t, done, 1)

	// The only slot is held by a handler of b; a's run finished, its
	// source is idle (its last call was held back).
	held := w.slots.take(nil, 1, 1, nil)
	require.Len(t, held, 1)
	l := &fetchLoop{s: a, w: w, results: make(chan *fetchCall, fetchDepth), fetching: true, idle: true, gatherWant: 1}
	a.acks = []*job{{run: done[0], src: a}}
	require.True(t, l.issue(), "the ack goes at once")
	c := <-l.results
	require.Empty(t, c.ks, "no slot was free: the call asks for no runs")
	require.NoError(t, c.err)
	l.inflight--
	l.finish(c)

	// a waits for a slot now, and the slot b's handler frees goes to it.
	require.False(t, l.issue())
	w.slots.give(held...)
	select {
	case <-a.kick:
	default:
		t.Fatal("the freed slot did not poke a, whose acks went alone")
	}
	require.True(t, l.issue())
	c = <-l.results
	require.NoError(t, c.err)
	require.Len(t, c.runs, 1, "a's next call serves its ready run")
	require.Equal(t, "r2", c.runs[0].ID)
}

// Two calls of a source in flight may run in Redis in the other order
// than their replies come back: the one whose reply comes last (it got
// fewer runs than asked: held back) may have run first, and the other
// (it got all it asked for) after it. The source stays busy then: it asks
// again rather than wait for a wake-up that may never come. A call started
// after a full reply was seen leaves it idle as before.
func TestWorkerShortReplyAfterFullStaysBusy(t *testing.T) {
	t.Parallel()
	w := handWorker(t, 2, "a", "b")
	a := w.sources[0]
	l := &fetchLoop{s: a, w: w, results: make(chan *fetchCall, fetchDepth), fetching: true, gatherWant: 1}
	ks := w.slots.take(a, 2, 1, nil)
	require.Len(t, ks, 2)
	first := &fetchCall{ks: ks[:1], hints: l.hints}
	second := &fetchCall{ks: ks[1:], hints: l.hints}
	l.inflight = 2
	first.runs = []*Run{{Env: "e", Queue: "a", ID: "r", Token: 1, LeaseDeadline: time.Now().Add(time.Minute)}}
	l.inflight--
	l.finish(first)
	j := <-w.jobs
	j.expiry.Stop()
	l.inflight--
	l.finish(second) // no runs
	require.False(t, l.idle, "a reply of all asked came while the short call was on its way")

	third := &fetchCall{ks: w.slots.take(a, 1, 1, nil), hints: l.hints}
	require.Len(t, third.ks, 1)
	l.finish(third) // no runs
	require.True(t, l.idle, "a short call started after every reply was seen leaves the source idle")
}

// A source's acks went alone (every slot busy) and, while they were on
// their way, a slot freed and the source asked for runs. Redis may run the
// ask first (the run being acked still holds the queue, its env or its key
// at its limit: nothing) and the acks after it: the short reply leaves the
// source busy whichever reply comes first (helper-210: a queue of limit 1
// idle for its whole poll at saturation). An ask launched after the acks'
// reply was seen, with no acks on their way, goes idle as before.
func TestWorkerAcksAloneBesideShortAskStayBusy(t *testing.T) {
	t.Parallel()
	for _, acksFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("acks reply first=%v", acksFirst), func(t *testing.T) {
			t.Parallel()
			w := handWorker(t, 2, "a", "b")
			a := w.sources[0]
			l := &fetchLoop{s: a, w: w, results: make(chan *fetchCall, fetchDepth), fetching: true, full: true, gatherWant: 1}
			ack := &fetchCall{acks: []*job{{run: &Run{Env: "e", Queue: "a", ID: "done", Token: 1}, src: a}}, hints: l.hints}
			ks := w.slots.take(a, 1, 1, nil)
			require.Len(t, ks, 1)
			ask := &fetchCall{ks: ks, hints: l.hints}
			l.inflight, l.ackAlone = 2, 1 // as launch counts them
			if acksFirst {
				l.inflight--
				l.finish(ack)
				l.inflight--
				l.finish(ask)
			} else {
				l.inflight--
				l.finish(ask)
				l.inflight--
				l.finish(ack)
			}
			require.False(t, l.idle, "the acks beside the short call may have freed what held it")

			later := &fetchCall{ks: w.slots.take(a, 1, 1, nil), hints: l.hints}
			require.Len(t, later.ks, 1)
			l.inflight = 1
			l.inflight--
			l.finish(later)
			require.True(t, l.idle, "a short call with no acks beside it leaves the source idle")
		})
	}
}
