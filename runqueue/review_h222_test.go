package runqueue_test

// helper-222: layout 9 (6e1ca0a), the flag-on env line where LimitsFor
// gives an env's queues different env limits. Polls of 30 s (a mark lives
// 61 s): every bound below (20 s) ends long before a poll could bring
// anything.

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// h222LowMarkAtFront: qa (env limit 1) waits at the front of the line with
// the env empty: qa took its one slot, called again (held by its own
// limit: marked, limit 1) and acked the run.
func h222LowMarkAtFront(t *testing.T, b *testBundle) {
	t.Helper()
	ewEnqueue(t, b, "qa", 3)
	a := ewTake(t, b, nil, "qa")
	require.Len(t, a, 1)
	require.Empty(t, ewTake(t, b, nil, "qa"), "qa is at its own env limit")
	require.True(t, ewMarked(t, b, "qa"))
	require.NoError(t, b.q.Ack(b.ctx, a[0]))
	require.Equal(t, 0, h219EnvCount(t, b))
}

// TestH222LowMarkServedWakesNobody: qa's env limit 1, qb's 10. qa's mark
// is at the front with the env empty: qb's Worker's call leaves qa its
// slot, takes nothing (the lowest limit, 1, leaves it none) and waits
// behind qa. qa's consumer then takes its one run: 9 of qb's 10 slots are
// free, but qa's call counts its room by its own limit (1, all used) and
// wakes nobody behind it; qb waits for its poll. (Layout 8: qb's call took
// 9 at once.)
func TestH222LowMarkServedWakesNobody(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := ewLimitsSetup(t, c, map[string]int{"qa": 1, "qb": 10})
		h222LowMarkAtFront(t, b)
		ewEnqueue(t, b, "qb", 5)
		served := make(chan string, 16)
		startWorker(t, b.q, ewServed(served), ewOver("qb"))
		ewWaits(t, b, "qb")
		require.Empty(t, served, "qb's call left qa its slot and took nothing")
		require.Len(t, ewTake(t, b, nil, "qa"), 1, "qa takes its slot")
		t.Logf("env count %d (qb's limit 10): qb waits", h219EnvCount(t, b))
		ewWithin(t, served, "qb once qa took its one slot (9 of qb's 10 free)")
	})
}

// TestH222LowMarkHoldsEnv: qa's env limit 1, qc's 10, qa's mark at the
// front, the env empty, qa's consumer not calling (a plain Dequeue loop,
// or slow): every call of qc takes nothing while qa's mark lives (61 s
// here), with the env empty and qc's limit 10. This pins layout 9's rule
// (a call takes at most the lowest limit's room: 1 - 0 - 1) and logs the
// figures; layout 8 let qc take 9 (and qa then got nothing).
func TestH222LowMarkHoldsEnv(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := ewLimitsSetup(t, c, map[string]int{"qa": 1, "qc": 10})
		h222LowMarkAtFront(t, b)
		ewEnqueue(t, b, "qc", 20)
		for i := range 3 {
			p, err := b.q.Preview(b.ctx, env, "qc", 10)
			require.NoError(t, err)
			got, err := b.q.Dequeue(b.ctx, env, "qc", 10)
			require.NoError(t, err)
			t.Logf("call %d of qc (limit 10), env count %d: Preview %d, took %d", i, h219EnvCount(t, b), len(p), len(got))
			require.Empty(t, got)
			require.Empty(t, p)
		}
	})
}

// TestH222PassedMarksHideWaiter: 15 queues of env limit 1 wait in the line
// (marked while the env held 9 runs: held by their own limit), then qz
// (limit 10) behind them, and the env holds 9 of 10 after an ack. A
// dequeue of qc (limit 10, no mark) has one free slot: ew_live reads 1,
// 2, 4 and 8 marks (its 4 reads), passes all 15 (their limit leaves them
// none) and never reaches qz, so qc takes qz's slot; Preview (envAheadOf
// reads the whole line) said qc gets none. The ack's wake-up (one mark by
// qf's limit) misses qz the same way. Now Preview reads as the script
// does; the reads' limit is documented (docs/design.md section 6).
func TestH222PassedMarksHideWaiter(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		lim := &h219Limits{env: map[string]int{"qf": 10, "qz": 10, "qc": 10}}
		for i := range 15 {
			lim.env[fmt.Sprintf("w%02d", i)] = 1
		}
		b := h219Setup(t, c, true, lim)
		ewEnqueue(t, b, "qf", 9)
		held, err := b.q.Dequeue(b.ctx, env, "qf", 9)
		require.NoError(t, err)
		require.Len(t, held, 9)
		ewMarkEach(t, b, 15)
		ewEnqueue(t, b, "qz", 3)
		got, err := b.q.Dequeue(b.ctx, env, "qz", 2)
		require.NoError(t, err)
		require.Len(t, got, 1, "qz takes the env's last slot")
		require.True(t, ewMarked(t, b, "qz"), "qz waits behind the 15")
		require.NoError(t, b.q.Ack(b.ctx, held[0]))
		require.Equal(t, 9, h219EnvCount(t, b))

		ewEnqueue(t, b, "qc", 2)
		p, err := b.q.Preview(b.ctx, env, "qc", 2)
		require.NoError(t, err)
		got, err = b.q.Dequeue(b.ctx, env, "qc", 2)
		require.NoError(t, err)
		t.Logf("Preview(qc) %d, Dequeue(qc) took %d", len(p), len(got))
		require.Equal(t, len(p), len(got), "Preview and the dequeue read the line by the same rule, its reads too")
		// (documented: qz, behind the fifteen marks the reads pass over,
		// is not reached, and qc takes the slot)
		require.Len(t, got, 1)
	})
}

// TestH222LoweredLimitMarkIdlesSlot: qa's mark was written with limit 10,
// then LimitsFor gives qa 1; qc waits behind qa (limit 10). qb's ack (count
// 10 -> 9) wakes one mark, qa's (its kept limit 10 is above 9); qa's call,
// now limit 1, takes nothing, renews its mark (limit 1) and passes the
// slot on to nobody: qc's Worker waits for its poll.
func TestH222LoweredLimitMarkIdlesSlot(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		lim := &h219Limits{env: map[string]int{"qa": 10, "qb": 10, "qc": 10}}
		b := h219Setup(t, c, true, lim)
		ewEnqueue(t, b, "qb", 10)
		held, err := b.q.Dequeue(b.ctx, env, "qb", 10)
		require.NoError(t, err)
		require.Len(t, held, 10)
		ewEnqueue(t, b, "qa", 3)
		require.Empty(t, ewTake(t, b, nil, "qa"))
		require.True(t, ewMarked(t, b, "qa"))
		lim.set("qa", 1)
		ewEnqueue(t, b, "qc", 3)
		served := make(chan string, 16)
		startWorker(t, b.q, ewServed(served), ewOver("qc"))
		ewWaits(t, b, "qc")
		require.NoError(t, b.q.Ack(b.ctx, held[0]))
		require.Empty(t, ewTake(t, b, nil, "qa"), "qa's consumer, woken, now limit 1")
		ewWithin(t, served, "qc after qb's ack (qa's call passed the slot on?)")
	})
}

// h222Walk is a pseudo-random walk of calls over queues of env with env
// limits lims: each take checks Preview against the dequeue it names and
// the env's count against the queue's limit.
type h222Walk struct {
	t    *testing.T
	b    *testBundle
	lims map[string]int
	next map[string]int // queue -> runs enqueued
	held []*runqueue.Run
	bad  int // takes whose Preview named another number of runs
}

// put enqueues n runs of q, each of a key of its own.
func (w *h222Walk) put(q string, n int) {
	for range n {
		_, err := w.b.q.Enqueue(w.b.ctx, runqueue.EnqueueParams{Env: env, Queue: q, Key: fmt.Sprintf("k%d", w.next[q]), ID: fmt.Sprintf("%s-%03d", q, w.next[q])})
		require.NoError(w.t, err)
		w.next[q]++
		w.b.clock.Advance(time.Millisecond)
	}
}

// ack acks the i-th run held.
func (w *h222Walk) ack(i int) {
	require.NoError(w.t, w.b.q.Ack(w.b.ctx, w.held[i]))
	w.held = append(w.held[:i], w.held[i+1:]...)
}

// take is Preview then Dequeue of n runs of q.
func (w *h222Walk) take(step int, q string, n int) {
	t, b := w.t, w.b
	before := h219EnvCount(t, b)
	p, err := b.q.Preview(b.ctx, env, q, n)
	require.NoError(t, err)
	got, err := b.q.Dequeue(b.ctx, env, q, n)
	require.NoError(t, err)
	after := h219EnvCount(t, b)
	if len(p) != len(got) {
		w.bad++
		t.Logf("step %d: %s (limit %d) n %d count %d: Preview %d, took %d", step, q, w.lims[q], n, before, len(p), len(got))
	}
	require.LessOrEqual(t, after, max(before, w.lims[q]), "step %d: %s took the env past its limit", step, q)
	w.held = append(w.held, got...)
}

// TestH222PreviewMatchesDequeueMixed: five queues with env limits 1, 2, 3,
// 5 and 5, a fixed pseudo-random sequence of Dequeue and Ack: before each
// Dequeue, Preview of the same call must name as many runs, and no call
// may take the env past its own queue's limit.
func TestH222PreviewMatchesDequeueMixed(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		lims := map[string]int{"qa": 1, "qb": 2, "qc": 3, "qd": 5, "qe": 5}
		b := ewLimitsSetup(t, c, lims)
		qs := []string{"qa", "qb", "qc", "qd", "qe"}
		w := &h222Walk{t: t, b: b, lims: lims, next: map[string]int{}}
		for _, q := range qs {
			w.put(q, 4)
		}
		r := rand.New(rand.NewPCG(222, 9))
		for step := range 400 {
			q := qs[r.IntN(len(qs))]
			if r.IntN(2) == 0 && len(w.held) > 0 {
				w.ack(r.IntN(len(w.held)))
				continue
			}
			w.take(step, q, 1+r.IntN(3))
			if r.IntN(4) == 0 {
				w.put(q, 2)
			}
		}
		require.Zero(t, w.bad, "Preview disagreed with the dequeue")
	})
}
