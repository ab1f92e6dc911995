package runqueue_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// TestS34WorkerKeyLimit: KeyConcurrency 2, a Worker of concurrency 32
// (queue source: every ack rides on AckAndDequeue, a flag-on instance
// that gave the queue a key limit, so a freed slot un-gates its key at
// once, section 6 Gating). Eight slow keys G0..G7 (12 runs each, handlers
// of 40 ms) hold up to 16 slots at their limit; ten fast keys F0..F9 (300
// runs each, handlers 0-3 ms) share the rest.
//
// Checked:
//   - the key limit: at most 2 handlers of one key at once;
//   - every key (the fast keys reach their limit too, 10 x 2 + 16 > 32)
//     is served when a slot of it frees: its next serve comes
//     within a bounded number of serves after the handler of a run of its
//     key ended. Bound: the ack joins the source's pending acks and rides
//     on the next call; the calls already in flight (at most fetchDepth =
//     2, each of at most Concurrency runs) serve without it. Once the ack
//     is made the key competes at max(S, V), within guarantee 2's D = 1/w_k
//     for a gated key: another servable key j gets n_j/w_j <= D + 1/w_j = 2
//     serves, so at most 2 per other key (17 others). Bound: 2 x 32 + 2 x
//     17 = 98 serves of other keys, counted from the token read after the
//     handler ended (the ack cannot be made before then).
//
// The same with a shard-source Worker (its acks go by AckMany, also a
// flag-on ack on an instance with a key limit) and with a queue-source and
// a shard-source Worker of 32 each on the same queue (the in-flight calls
// then come from both: 4 calls of 32, so 4 x 32 + 2 x 17 = 162).
func TestS34WorkerKeyLimit(t *testing.T) {
	for _, mode := range []string{"queue", "shard", "queue+shard"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			s34KeyLimit(t, mode)
		})
	}
}

func s34KeyLimit(t *testing.T, mode string) {
	c := redistest.Real(t)
	prefix := redistest.Prefix(t)
	q := s34NewQueue(t, c, prefix, func(cfg *runqueue.Config) { cfg.KeyConcurrency = 2 })
	tokKey := s34Tokens(t, c, q, prefix)
	const slow, slowN, fast, fastN, conc = 8, 12, 10, 300, 32
	// Slow keys first, so that their runs are the oldest.
	for i := 0; i < slow; i++ {
		s34EnqueueBulk(t, q, fmt.Sprintf("G%d", i), slowN, 0, "g")
	}
	for i := 0; i < fast; i++ {
		s34EnqueueBulk(t, q, fmt.Sprintf("F%d", i), fastN, 0, "f")
	}
	rnd := s34RandDur(3)
	type end struct {
		key string
		tok int64
	}
	ends := make(chan end, slow*slowN+fast*fastN)
	h := s34NewRec(func(r *runqueue.Run) time.Duration {
		if strings.HasPrefix(r.Key, "G") {
			return 40 * time.Millisecond
		}
		return rnd(r)
	})
	inner := h.handler
	handler := func(ctx context.Context, r *runqueue.Run) error {
		err := inner(ctx, r)
		tok, _ := c.Get(context.Background(), tokKey).Int64()
		ends <- end{r.Key, tok}
		return err
	}
	start := func(q *runqueue.Queue, cfg runqueue.WorkerConfig) {
		cfg.Concurrency, cfg.SweepInterval = conc, -1
		wk, err := runqueue.NewWorker(q, handler, &cfg)
		require.NoError(t, err)
		require.NoError(t, wk.Start(context.Background()))
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = wk.Shutdown(ctx)
		})
	}
	workers := 1
	switch mode {
	case "queue":
		start(q, runqueue.WorkerConfig{Queues: []runqueue.WorkerQueue{{Env: s34Env, Queue: s34Queue}}})
	case "shard":
		start(q, runqueue.WorkerConfig{Shards: []int{q.ShardOf(s34Env)}})
	default:
		q2 := s34NewQueue(t, c, prefix, func(cfg *runqueue.Config) { cfg.KeyConcurrency = 2 })
		start(q, runqueue.WorkerConfig{Queues: []runqueue.WorkerQueue{{Env: s34Env, Queue: s34Queue}}})
		start(q2, runqueue.WorkerConfig{Shards: []int{q2.ShardOf(s34Env)}})
		workers = 2
	}
	h.waitCount(t, slow*slowN+fast*fastN)
	// Every handler's end is received, not counted with len and the
	// channel closed: len does not order the sends before the close (the
	// race detector reported the close against a handler's send).
	var ended []end
	for deadline := time.After(30 * time.Second); len(ended) < slow*slowN+fast*fastN; {
		select {
		case e := <-ends:
			ended = append(ended, e)
		case <-deadline:
			t.Fatalf("handlers did not end: %d of %d", len(ended), slow*slowN+fast*fastN)
		}
	}
	starts := h.snapshot()
	serves := s34Serves(starts)

	h.mu.Lock()
	for k, m := range h.maxIn {
		require.LessOrEqual(t, m, 2, "key %s ran %d handlers at once at key limit 2", k, m)
	}
	h.mu.Unlock()

	// Gated keys served after their slot freed.
	bound := 2*workers*conc + 2*(slow+fast-1)
	var maxWait int
	var gviol []string
	next := map[string][]int{} // key -> indexes of its serves in serves
	for i, r := range serves {
		next[r.Key] = append(next[r.Key], i)
	}
	for _, e := range ended {
		// the first serve of e.key with a token above e.tok, if any is left
		idx := -1
		for _, i := range next[e.key] {
			if serves[i].Token > e.tok {
				idx = i
				break
			}
		}
		if idx < 0 {
			continue
		}
		var others int
		for k := idx - 1; k >= 0 && serves[k].Token > e.tok; k-- {
			if serves[k].Key != e.key {
				others++
			}
		}
		maxWait = max(maxWait, others)
		if others > bound && len(gviol) < 5 {
			gviol = append(gviol, fmt.Sprintf("%s: %d serves of other keys after a handler of it ended, before its next serve", e.key, others))
		}
	}
	t.Logf("key limit, %s: a key's wait after a slot of it freed: max %d serves of others (bound %d)", mode, maxWait, bound)
	require.Empty(t, gviol)
}
