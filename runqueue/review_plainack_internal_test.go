package runqueue

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
)

// reviewGated says which variant members of env/q the scheduler state of
// q's instance holds gated.
func reviewGated(t *testing.T, c redis.UniversalClient, q *Queue) []string {
	t.Helper()
	h, err := c.HGetAll(context.Background(), q.names("env", "q").qk.CkVtimeState()).Result()
	require.NoError(t, err)
	var out []string
	for f, v := range h {
		if len(f) > 2 && strings.Contains(v, "g") && !strings.ContainsAny(f, "~") {
			out = append(out, f)
		}
	}
	sort.Strings(out)
	return out
}

// TestReviewAckPlainGatedOtherInstance: with the flag on, a variant gated
// at its key limit by an instance that has one, and its run acked by
// another instance of the same prefix that never met a key limit. The
// no-limit instance now runs the flag-off ack; before the change it ran
// the flag-on ack with look=0. Both prefixes go through the same calls,
// one acking the new way, the other the old way (built by hand as the old
// ackMany did), and every key holds the same afterwards (the variant still
// gated in both: neither ack un-gates), and the limited instance's next
// dequeues serve the same runs (its gated probe un-gates).
func TestReviewAckPlainGatedOtherInstance(t *testing.T) {
	c := redistest.Private(t)
	ctx := context.Background()
	count := newEvalCounter(c)
	type side struct {
		limited, free *Queue
		held          []*Run
	}
	mk := func(prefix string) *side {
		s := &side{limited: ackPlainQueue(t, c, prefix, 1), free: ackPlainQueue(t, c, prefix, 0)}
		for i := range 12 {
			_, err := s.limited.Enqueue(ctx, EnqueueParams{Env: "env", Queue: "q", Key: fmt.Sprint("k", i%3), ID: fmt.Sprint("r", i),
				Payload: []byte("p")})
			require.NoError(t, err)
		}
		for range 3 {
			runs, err := s.limited.Dequeue(ctx, "env", "q", 5)
			require.NoError(t, err)
			s.held = append(s.held, runs...)
		}
		require.Len(t, s.held, 3, "one run of each key in flight at key limit 1")
		return s
	}
	a, b := mk("ga"), mk("gb")
	require.NotEmpty(t, reviewGated(t, c, a.limited), "no variant gated: the test does not reach its state")
	require.Equal(t, reviewGated(t, c, a.limited), reviewGated(t, c, b.limited))
	gatedBefore := reviewGated(t, c, a.limited)

	// a: the free instance acks as it does now (the flag-off ack).
	count.reset()
	errs, err := a.free.AckMany(ctx, a.held[:2])
	require.NoError(t, err)
	require.Equal(t, []error{nil, nil}, errs)
	require.Equal(t, 1, count.evalsha[a.free.scripts.ackPlain.sha])
	require.Zero(t, count.evalsha[a.free.scripts.ack.sha])

	// b: the free instance acks as it did before: the flag-on ack, with
	// the scheduler's keys and look as vtimeArgs gives them (0).
	nb := b.free.names("env", "q")
	args := []any{b.free.now(), nb.runPrefix, 2}
	for _, r := range b.held[:2] {
		args = append(args, nb.qk.Variant(r.Key).Member(), keys.Segment(r.ID), r.Token)
	}
	require.Equal(t, 0, b.free.vtimeArgs(b.free.cfg.LimitsFor("env", "q"))[2])
	ks := append(append([]string(nil), nb.held...), nb.vtime...)
	args = append(args, b.free.vtimeArgs(b.free.cfg.LimitsFor("env", "q"))...)
	cmds, err := runPipelined(ctx, c, []call{{sc: b.free.scripts.ack, keys: ks, args: args}})
	require.NoError(t, err)
	got, err := cmds[0].Slice()
	require.NoError(t, err)
	require.Equal(t, []any{int64(1), int64(1)}, got)

	require.Equal(t, prefixDump(t, c, "ga"), prefixDump(t, c, "gb"))
	require.Equal(t, gatedBefore, reviewGated(t, c, a.limited), "neither ack looks for a gated variant")

	// The limited instance serves the same runs in both.
	served := 0
	for range 5 {
		da, err := a.limited.Dequeue(ctx, "env", "q", 2)
		require.NoError(t, err)
		db, err := b.limited.Dequeue(ctx, "env", "q", 2)
		require.NoError(t, err)
		require.Equal(t, runKeysIDs(da), runKeysIDs(db))
		require.Equal(t, prefixDump(t, c, "ga"), prefixDump(t, c, "gb"))
		served += len(da)
	}
	require.Equal(t, 2, served, "the two freed keys are served again (the gated probe), the held one not")
	// An ack by the limited instance looks (the flag-on ack).
	count.reset()
	require.NoError(t, a.limited.Ack(ctx, a.held[2]))
	require.Equal(t, 1, count.evalsha[a.limited.scripts.ack.sha])
}

// TestReviewAckPlainLimitsFor: with per-queue limits (LimitsFor), acks
// of a queue without a key limit run the flag-off ack until the instance
// meets a queue with one (a dequeue of it, or an ack of it), and the
// flag-on ack from then on, for every queue (the flag is sticky). In one
// AckMany the queues' calls choose in order.
func TestReviewAckPlainLimitsFor(t *testing.T) {
	c := redistest.Private(t)
	ctx := context.Background()
	count := newEvalCounter(c)
	mk := func(prefix string) *Queue {
		q, err := New(ctx, c, &Config{Prefix: prefix, Shards: 1, VtimeScheduling: true,
			Clock: fixedClock{time.UnixMilli(2_000_000_000_000)},
			LimitsFor: func(env, queue string) Limits {
				if queue == "lim" {
					return Limits{Key: 2}
				}
				return Limits{}
			}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = q.Close() })
		return q
	}
	// A writer instance takes the runs in flight; the instances under test
	// only ack, so the dequeues do not note the limit for them.
	writer := mk("lf")
	take := func(queue string, n int) []*Run {
		for i := range n {
			_, err := writer.Enqueue(ctx, EnqueueParams{Env: "env", Queue: queue, Key: fmt.Sprint("k", i), ID: fmt.Sprint(queue, i)})
			require.NoError(t, err)
		}
		runs, err := writer.Dequeue(ctx, "env", queue, n)
		require.NoError(t, err)
		require.Len(t, runs, n)
		return runs
	}
	free, lim := take("free", 6), take("lim", 2)

	q := mk("lf")
	plain, hooked := q.scripts.ackPlain.sha, q.scripts.ack.sha
	count.reset()
	require.NoError(t, q.Ack(ctx, free[0]))
	require.Equal(t, map[string]int{plain: 1}, count.evalsha)

	// One AckMany: the free queue's call first (plain), then lim's (which
	// notes the limit: flag-on).
	count.reset()
	errs, err := q.AckMany(ctx, []*Run{free[1], lim[0]})
	require.NoError(t, err)
	require.Equal(t, []error{nil, nil}, errs)
	require.Equal(t, map[string]int{plain: 1, hooked: 1}, count.evalsha)

	// Sticky: the free queue's acks look from now on.
	count.reset()
	require.NoError(t, q.Ack(ctx, free[2]))
	require.Equal(t, map[string]int{hooked: 1}, count.evalsha)

	// A fresh instance that dequeued lim (no ack of it) looks too.
	q2 := mk("lf")
	_, err = q2.Dequeue(ctx, "env", "lim", 1)
	require.NoError(t, err)
	count.reset()
	require.NoError(t, q2.Ack(ctx, free[3]))
	require.Equal(t, map[string]int{hooked: 1}, count.evalsha)
}

// TestReviewAckPlainNoScript: after the script cache is lost, the
// flag-off ack of a flag-on instance is resent with its source (Ack and
// AckMany), and acks. Not parallel: SCRIPT FLUSH (see
// TestRunPipelinedRecoversNoScript).
func TestReviewAckPlainNoScript(t *testing.T) {
	c := redistest.Private(t)
	ctx := context.Background()
	count := newEvalCounter(c)
	q := ackPlainQueue(t, c, "pns", 0)
	runs := ackPlainRuns(t, q, 6)
	sha := q.scripts.ackPlain.sha

	require.NoError(t, c.ScriptFlush(ctx).Err())
	count.reset()
	errs, err := q.AckMany(ctx, runs[:3])
	require.NoError(t, err)
	require.Equal(t, []error{nil, nil, nil}, errs)
	_, noscript, eval := count.snapshot()
	require.Equal(t, 1, noscript[sha])
	require.Equal(t, 1, eval[sha])

	require.NoError(t, c.ScriptFlush(ctx).Err())
	count.reset()
	require.NoError(t, q.Ack(ctx, runs[3]))
	_, noscript, eval = count.snapshot()
	require.Equal(t, 1, noscript[sha])
	require.Equal(t, 1, eval[sha])
	// Cached again: no NOSCRIPT.
	count.reset()
	require.NoError(t, q.Ack(ctx, runs[4]))
	evalsha, noscript, _ := count.snapshot()
	require.Equal(t, 1, evalsha[sha])
	require.Empty(t, noscript)
	s, err := q.QueueStats(ctx, "env", "q")
	require.NoError(t, err)
	require.Equal(t, int64(len(runs)-5), s.InFlight)
}

// TestReviewAckPlainReadOnly: a read-only flag-on instance refuses
// AckMany (whose calls now go through the flag-off ack) with ErrReadOnly,
// nothing written.
func TestReviewAckPlainReadOnly(t *testing.T) {
	c := redistest.Private(t)
	ctx := context.Background()
	q := ackPlainQueue(t, c, "pro", 0)
	runs := ackPlainRuns(t, q, 2)
	ro, err := New(ctx, c, &Config{Prefix: "pro", Shards: 1, VtimeScheduling: true, ReadOnly: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ro.Close() })
	require.True(t, ro.scripts.ackPlain.refused)
	before := prefixDump(t, c, "pro")
	_, err = ro.AckMany(ctx, runs)
	require.ErrorIs(t, err, ErrReadOnly)
	require.ErrorIs(t, ro.Ack(ctx, runs[0]), ErrReadOnly)
	require.Equal(t, before, prefixDump(t, c, "pro"))
}
