package runqueue

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
)

// H217-1: a wake-up of the line is pending in a's nudged (a release woke
// a, its loop has not taken the token yet); the other members leave and a
// new source enters, making the line shared again: enterLine sets relook
// over the wake-up's token (its send finds the buffer full), so a's loop
// reads the wake-up as a look again, and a call of a's that takes nothing
// (its key limits hold it, the env free) passes nothing on: d, which joined
// held, waits for its poll.
func TestH217RelookOverPendingWakeUpIsMisread(t *testing.T) {
	t.Parallel()
	ss := lineSources(2)
	a, b := ss[0], ss[1]
	line := a.line
	mustJoin(t, a, false, 0)
	line.release(b, 1) // b's call freed a slot: a is woken (token pending)
	require.Len(t, a.nudged, 1)
	(&fetchLoop{s: b, w: b.w, lineIn: true}).exitLine() // b's Worker stops
	require.False(t, line.sharedFor(a), "(a call of a's with acks alone answers: its look, alone, read no counts)")
	d := &source{w: a.w, env: "e", queue: "d", shard: -1, lined: true, nudged: make(chan struct{}, 1)}
	a.w.q.enterLine(d) // a second Worker starts: the line is shared again
	mustJoin(t, d, false, 0, "d's first call finds the env held")
	require.True(t, nudgedNow(a))
	require.True(t, line.nudgedFor(a), "the token a takes is the release's wake-up, not a look again")
}

// H217-2: a, lone, is asked to look again as b enters; b's first call
// finds the env held and b joins the line; a's Worker stops before a's loop
// took the nudge. quit takes the pending token as a wake-up of the line and
// passes it on: b is woken (and released counts a release) though no slot
// was freed.
func TestH217QuitPassesARelookOn(t *testing.T) {
	t.Parallel()
	w := &Worker{q: &Queue{}}
	a := &source{w: w, env: "e", queue: "a", shard: -1, lined: true, nudged: make(chan struct{}, 1)}
	w.q.enterLine(a)
	require.False(t, a.line.sharedFor(a), "a's call answered: its look, alone, read no counts")
	b := &source{w: w, env: "e", queue: "b", shard: -1, lined: true, nudged: make(chan struct{}, 1)}
	w.q.enterLine(b)
	require.Len(t, a.nudged, 1, "a is asked to look again")
	line := a.line
	mustJoin(t, b, false, 0)
	rel := line.released
	(&fetchLoop{s: a, w: w, lineIn: true}).quitLine() // a's Worker stops, the look again untaken
	require.Equal(t, rel, line.released, "no release was made")
	require.False(t, nudgedNow(b), "b waits: no slot was freed (a phantom wake-up passed on)")
}

// H217-3: a lone source whose first call has not answered yet (or whose
// last look read the counts) is not asked to look again when a second
// source enters: its look, after the entry, reads the counts. Asked, each
// start of a second source of an env cost a script call for nothing
// (2 to 3 EVALSHA at the start of one Worker over qa and qb, 20 of 20
// runs). Its last finish found the line not shared: it is asked.
func TestH217NoRelookForALookNotTakenAlone(t *testing.T) {
	t.Parallel()
	w := &Worker{q: &Queue{}}
	src := func(queue string) *source {
		s := &source{w: w, env: "e", queue: queue, shard: -1, lined: true, nudged: make(chan struct{}, 1)}
		w.q.enterLine(s)
		return s
	}
	exit := func(s *source) { (&fetchLoop{s: s, w: w, lineIn: true}).exitLine() }
	a := src("a")
	b := src("b")
	require.Empty(t, a.nudged, "a's first call has not answered: not asked")
	require.True(t, a.line.sharedFor(a), "its finish finds the line shared: its look reads the counts")
	exit(b)
	c := src("c")
	require.Empty(t, a.nudged, "a's last look read the counts: not asked")
	exit(c)
	require.False(t, a.line.sharedFor(a), "a's next finish, alone")
	src("d")
	require.Len(t, a.nudged, 1, "a's last look was taken alone: asked")
}

// H217-4 (-race): Workers over queues of one env come and go while runs
// flow, so that members go 1->2->1 and relooks cross wake-ups and quits.
func TestH217ChurnRace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := redistest.Mini(t)
	q, err := New(ctx, c, &Config{Prefix: redistest.Prefix(t), BlockPollInterval: 2 * time.Second,
		LimitsFor: func(string, string) Limits { return Limits{Env: 1} }})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	handler := func(context.Context, *Run) error { time.Sleep(time.Millisecond); return nil }
	for i := 0; i < 30; i++ {
		for _, qn := range []string{"qa", "qb", "qc"} {
			_, err := q.Enqueue(ctx, EnqueueParams{Env: "e", Queue: qn, Key: "k", ID: fmt.Sprint(qn, i)})
			require.NoError(t, err)
		}
	}
	var wg sync.WaitGroup
	for g, qn := range []string{"qa", "qb", "qc"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 8; i++ {
				w, err := NewWorker(q, handler, &WorkerConfig{Queues: []WorkerQueue{{Env: "e", Queue: qn}}, Concurrency: 1})
				if err != nil {
					t.Error(err)
					return
				}
				if err := w.Start(ctx); err != nil {
					t.Error(err)
					return
				}
				time.Sleep(time.Duration(5+g*7+i) * time.Millisecond)
				sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				if err := w.Shutdown(sctx); err != nil {
					t.Error(err)
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	q.linesMu.Lock()
	defer q.linesMu.Unlock()
	require.Empty(t, q.lines, "every line went with its last member")
}
