package runqueue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
)

// H216-1 (probe, race): Workers of one env come and go concurrently, some
// hard-stopped (Start ctx cancelled), some shut down; the Queue's line map
// must be empty once all are gone, each live source of the env on the one
// line (no split lines), members never negative.
func TestH216LineChurn(t *testing.T) {
	t.Parallel()
	redistest.ForEachBackend(t, lineBackends, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		q := lineQueue(t, c, func(string, string) Limits { return Limits{Env: 1} })
		for i := range 20 {
			_, err := q.Enqueue(ctx, EnqueueParams{Env: "e", Queue: fmt.Sprintf("q%d", i%3), Key: "k", ID: fmt.Sprint(i)})
			require.NoError(t, err)
		}
		h := func(context.Context, *Run) error { return nil }
		var wg sync.WaitGroup
		for i := range 12 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w, err := NewWorker(q, h, &WorkerConfig{Queues: []WorkerQueue{{Env: "e", Queue: fmt.Sprintf("q%d", i%3)}}, Concurrency: 1})
				if err != nil {
					t.Error(err)
					return
				}
				sctx, cancel := context.WithCancel(ctx)
				if err := w.Start(sctx); err != nil {
					t.Error(err)
					cancel()
					return
				}
				if i%2 == 0 {
					cancel() // hard stop
					_ = w.Shutdown(ctx)
				} else {
					stx, c2 := context.WithTimeout(ctx, 20*time.Second)
					_ = w.Shutdown(stx)
					c2()
					cancel()
				}
			}()
		}
		wg.Wait()
		q.linesMu.Lock()
		n := len(q.lines)
		q.linesMu.Unlock()
		require.Zero(t, n, "every line goes with its last member")
	})
}

// H216-2 (probe): d joined the line on a free look while a's acks were on
// their way (their release may be what it missed). a's call fails after
// its acks may have run (a read timeout): finish takes its acks off
// acking with no release, and d, which waits only for acks of the line,
// waits its poll.
func TestH216FailedAcksLeaveFreeJoiner(t *testing.T) {
	t.Parallel()
	redistest.ForEachBackend(t, lineBackends, func(t *testing.T, c redis.UniversalClient) {
		lim := Limits{Env: 2}
		w := lineWorker(t, c, &lim)
		a, d := w.sources[0], w.sources[1]
		line := a.line
		la := handLoop(w, a)
		ca := &fetchCall{acks: []*job{{run: &Run{Env: "e", Queue: "a", ID: "x"}}}, lineAcks: true}
		line.acks(1) // (as launch counts it)
		mustJoin(t, d, true, 0, "d joins on a free look, a's acks on their way")
		ca.err, ca.ackErr = errors.New("i/o timeout"), errors.New("i/o timeout") // (sent; the reply lost)
		la.inflight = 1
		la.inflight--
		la.finish(ca)
		line.mu.Lock()
		acking := line.acking
		line.mu.Unlock()
		require.Zero(t, acking)
		require.True(t, nudgedNow(d) || !inEnvLine(d),
			"no acks of the line on their way any more: d, a free-look joiner, should look again (it waits its poll)")
	})
}

// H216-3 (probe): a call whose acks were made but that returns an error
// (results with an error: AckAndDequeue's acks ran) frees slots; finish
// returns before lineStep, so b, held in the line, is not woken (the
// hard-stop branch releases for the same call).
func TestH216FailedCallWithAcksMadeReleases(t *testing.T) {
	t.Parallel()
	redistest.ForEachBackend(t, lineBackends, func(t *testing.T, c redis.UniversalClient) {
		lim := Limits{Env: 2}
		w := lineWorker(t, c, &lim)
		a, b := w.sources[0], w.sources[1]
		line := a.line
		la := handLoop(w, a)
		mustJoin(t, b, false, 0, "b held by the env")
		line.acks(1)
		ca := &fetchCall{acks: []*job{{run: &Run{Env: "e", Queue: "a", ID: "x"}}}, lineAcks: true,
			ackErrs: []error{nil}, err: errors.New("the dequeue's part failed")}
		la.finish(ca)
		require.True(t, nudgedNow(b), "a's ack was made: its slot should wake b")
	})
}

// H216-4 (probe): a lone source (its partner's loop ended) skips lineStep,
// and with it the reset of lineWoken: a wake-up it got before the partner
// left stays "unused" for good and is passed on (a phantom release) at a
// later pass or quit, once the line is shared again.
func TestH216LoneKeepsStaleLineWoken(t *testing.T) {
	t.Parallel()
	redistest.ForEachBackend(t, lineBackends, func(t *testing.T, c redis.UniversalClient) {
		lim := Limits{Env: 2}
		w := lineWorker(t, c, &lim)
		a, b := w.sources[0], w.sources[1]
		w.q.exitLine(b) // b's loop ended: a is alone
		la := handLoop(w, a)
		la.lineIn, la.lineWoken = true, true
		ks := w.slots.take(a, 1, 1, nil)
		require.Len(t, ks, 1)
		la.finish(&fetchCall{ks: ks, hints: la.hints, released: a.line.leave(a)})
		require.False(t, la.lineWoken, "the call the wake-up brought was made: it is spent")
	})
}
