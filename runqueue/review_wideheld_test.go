package runqueue_test

// Review of layout 5 (the wide marks of the held and key-inflight hashes,
// lua/lib/held.lua): states TestWideHeldMarks does not reach, and one
// defect, since mended (TestReviewWideHeldStatsTornRead).

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// rwhFill enqueues perKey runs on each of keys keys k0..k<keys-1>, the
// runs of one round older than the next (so a dequeue of keys runs takes
// one of each key, flag on or off).
func rwhFill(t *testing.T, b *testBundle, keys, perKey int) {
	t.Helper()
	n := keys * perKey
	enqueueMany(t, b, n, func(i int) runqueue.EnqueueParams {
		return runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprintf("k%d", i%keys), ID: fmt.Sprintf("r%04d", i),
			AvailableAt: b.clock.Now().Add(-time.Duration(n-i) * time.Millisecond)}
	})
}

// rwhRequireGone: no run of the queue in flight, and neither hash is left.
func rwhRequireGone(t *testing.T, b *testBundle, what string) {
	t.Helper()
	_, _, he, ke := wideState(t, b)
	require.False(t, he, "%s: the held hash is left behind", what)
	require.False(t, ke, "%s: the key-inflight hash is left behind", what)
	require.Equal(t, int64(0), queueStats(t, b, queueName).InFlight, what)
}

// rwhAckOK acks runs with AckMany and requires every one acked.
func rwhAckOK(t *testing.T, b *testBundle, runs []*runqueue.Run) {
	t.Helper()
	errs, err := b.q.AckMany(b.ctx, runs)
	require.NoError(t, err)
	for i, e := range errs {
		require.NoError(t, e, "ack of %s", runs[i].ID)
	}
}

// tornHeld is a go-redis hook that splits the first pipeline reading the
// held hash twice (HLEN and HEXISTS, in either order) after its first read
// of it and runs between calls between the two parts: what Redis may do
// anyway, since a pipeline is not a transaction (another client's script
// may run between two commands of it). A MULTI/EXEC pipeline is not split
// (between runs before it, where it is harmless).
type tornHeld struct {
	held    string
	armed   atomic.Bool
	between func()
	ran     atomic.Bool
}

func (h *tornHeld) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *tornHeld) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *tornHeld) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !h.armed.Load() {
			return next(ctx, cmds)
		}
		first, second := -1, -1
		for i, c := range cmds {
			switch c.Name() {
			case "multi", "exec":
				h.armed.Store(false)
				h.ran.Store(true)
				h.between()
				return next(ctx, cmds)
			}
			if args := c.Args(); len(args) > 1 && fmt.Sprint(args[1]) == h.held {
				if first < 0 {
					first = i
				} else if second < 0 {
					second = i
				}
			}
		}
		if second < 0 {
			return next(ctx, cmds)
		}
		h.armed.Store(false)
		h.ran.Store(true)
		err := next(ctx, cmds[:first+1])
		h.between()
		if err2 := next(ctx, cmds[first+1:]); err == nil {
			err = err2
		}
		return err
	}
}

// TestReviewWideHeldStatsTornRead: the in-flight count is now two reads,
// HLEN and HEXISTS, sent in one pipeline (stats.go readHeld), which is not
// atomic: another client's ack may run between them. With the mark and one
// run in flight, HLEN says 2; the ack of that run then deletes both hashes
// (held_left), HEXISTS says no mark, and QueueStats reports 2 runs in
// flight, a count the queue never had (it had 1, then 0). The other way, a
// dequeue that marks the hash between the reads makes the count one short.
// The same read serves Preview and Schedule (queueInflight), where the
// queue limit's capacity comes from it. Before layout 5, one HLEN was
// exact. (The defect was found in review; the two reads now go in one
// MULTI/EXEC, which a cluster allows since the keys share a slot. With a
// plain pipeline this test fails.)
func TestReviewWideHeldStatsTornRead(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, nil)
		qk := queueKeys(t, b)
		rwhFill(t, b, 70, 1)
		held := dequeue(t, b, queueName, 70)
		require.Len(t, held, 70)
		hm, _, _, _ := wideState(t, b)
		require.True(t, hm, "70 runs in flight over tokens 1..70: marked")
		rwhAckOK(t, b, held[:69])
		last := held[69]

		// A reader on a connection of its own (a dashboard, the metrics
		// scrape), with the hook.
		o := otherClient(t, c)
		h := &tornHeld{held: qk.Held(), between: func() { require.NoError(t, b.q.Ack(b.ctx, last)) }}
		o.AddHook(h)
		ro, err := runqueue.New(b.ctx, o, &runqueue.Config{Prefix: b.prefix, Clock: b.clock, ReadOnly: true})
		require.NoError(t, err)
		t.Cleanup(func() { _ = ro.Close() })
		h.armed.Store(true)
		s, err := ro.QueueStats(b.ctx, env, queueName)
		require.NoError(t, err)
		if !h.ran.Load() { // the count was read some other way: ack after
			h.between()
		}
		require.Contains(t, []int64{0, 1}, s.InFlight,
			"QueueStats read 1 run in flight and then 0, and reported %d", s.InFlight)
		rwhRequireGone(t, b, "the last run acked")
	})
}

// TestReviewWideHeldFusedAckDequeue: AckAndDequeue acks every run of a
// marked queue (one of them twice in the call), which deletes both hashes
// in the script (held_left), then serves in the same call, which reads
// the key counts and the queue's count afresh and marks the new hashes
// again; the queue limit is exact with the mark on a hash that shrank far
// below 64, and nothing is left once all is acked. DequeueShard makes the
// first marking serve. Both flag states. (Passes.)
func TestReviewWideHeldFusedAckDequeue(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
				b := setup(t, c, func(cfg *runqueue.Config) {
					cfg.VtimeScheduling = on
					cfg.QueueConcurrency = 70
				})
				rwhFill(t, b, 70, 3)
				first, err := b.q.DequeueShard(b.ctx, b.q.ShardOf(env), 100)
				require.NoError(t, err)
				require.Len(t, first, 70, "queue limit 70")
				hm, km, _, _ := wideState(t, b)
				require.True(t, hm)
				require.True(t, km, "70 keys in flight: kin marked")

				// Every run acked (the first twice), then 70 served, in one call.
				acks := append([]*runqueue.Run{first[0]}, first...)
				second, ackErrs, err := b.q.AckAndDequeue(b.ctx, acks, env, queueName, 100)
				require.NoError(t, err)
				for i, e := range ackErrs {
					require.NoError(t, e, "ack %d", i)
				}
				require.Len(t, second, 70, "the acks freed the whole queue limit")
				hm, km, _, _ = wideState(t, b)
				require.True(t, hm, "tokens 71..140 pass 128 with 70 in flight: marked again")
				require.True(t, km)
				require.Equal(t, int64(70), queueStats(t, b, queueName).InFlight)
				for k := range 70 {
					n, err := b.q.KeyInflight(b.ctx, env, queueName, fmt.Sprintf("k%d", k))
					require.NoError(t, err)
					require.Equal(t, 1, n, "key k%d", k)
				}

				// Down to 5 in flight with the mark: the limit leaves 65.
				_, ackErrs, err = b.q.AckAndDequeue(b.ctx, second[:65], env, queueName, 0)
				require.NoError(t, err)
				for i, e := range ackErrs {
					require.NoError(t, e, "ack %d", i)
				}
				hm, _, _, _ = wideState(t, b)
				require.True(t, hm, "5 runs in flight: the mark stays")
				require.Equal(t, int64(5), queueStats(t, b, queueName).InFlight)
				third := dequeue(t, b, queueName, 100)
				require.Len(t, third, 65, "queue limit 70 with 5 in flight (and the mark)")
				require.Empty(t, dequeue(t, b, queueName, 100), "at the limit")

				// The rest acked in one fused call that serves the last 5 runs
				// (of 210) on the hashes it deleted; then those acked.
				rest := append(append([]*runqueue.Run{}, second[65:]...), third...)
				runs, ackErrs, err := b.q.AckAndDequeue(b.ctx, rest, env, queueName, 100)
				require.NoError(t, err)
				for i, e := range ackErrs {
					require.NoError(t, e, "ack %d", i)
				}
				require.Len(t, runs, 5, "the last runs")
				hm, km, _, _ = wideState(t, b)
				require.False(t, hm || km, "5 runs in flight on new hashes: no mark")
				require.Equal(t, int64(5), queueStats(t, b, queueName).InFlight)
				rwhAckOK(t, b, runs)
				rwhRequireGone(t, b, "every run acked")
			})
		})
	}
}

// TestReviewWideHeldLeaseRecovery: the last runs of a marked queue leave
// by lease recovery (requeue.lua with token 0) and a dead letter; the
// holders' late acks find them not in flight; both hashes go with the
// last one, and the runs are served and acked again. (Passes.)
func TestReviewWideHeldLeaseRecovery(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
				b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = on })
				rwhFill(t, b, 70, 1)
				held := dequeue(t, b, queueName, 70)
				require.Len(t, held, 70)
				hm, km, _, _ := wideState(t, b)
				require.True(t, hm)
				require.True(t, km)
				rwhAckOK(t, b, held[:67])

				// One dead-lettered by its holder, two recovered.
				res, err := b.q.Nack(b.ctx, held[67], &runqueue.NackOptions{DeadLetter: true})
				require.NoError(t, err)
				require.False(t, res.Requeued)
				hm, _, he, _ := wideState(t, b)
				require.True(t, he && hm, "2 runs in flight: the marked hash stays")
				b.clock.Advance(time.Hour)
				n, err := b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 100)
				require.NoError(t, err)
				require.Equal(t, 2, n)
				rwhRequireGone(t, b, "the last runs recovered")
				for _, r := range held[68:] {
					require.ErrorIs(t, b.q.Ack(b.ctx, r), runqueue.ErrNotInFlight, "late ack of %s", r.ID)
				}
				again := dequeue(t, b, queueName, 10)
				require.Len(t, again, 2)
				rwhAckOK(t, b, again)
				rwhRequireGone(t, b, "the recovered runs acked")
				require.Equal(t, int64(1), queueStats(t, b, queueName).Dead)
			})
		})
	}
}

// TestReviewWideHeldGatedRelease: flag on with a key limit of 1, every one
// of 70 keys at its limit in a marked queue and gated by the next dequeue;
// the acks of all of them delete both hashes (held_left) before the hook
// that frees gated variants runs; the next dequeue serves every key again
// and the counts are exact. Flag off too (no gating). (Passes.)
func TestReviewWideHeldGatedRelease(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
				b := setup(t, c, func(cfg *runqueue.Config) {
					cfg.VtimeScheduling = on
					cfg.KeyConcurrency = 1
				})
				rwhFill(t, b, 70, 2)
				held := dequeue(t, b, queueName, 100)
				require.Len(t, held, 70, "one per key")
				require.Empty(t, dequeue(t, b, queueName, 100), "every key at its limit (gated, flag on)")
				hm, km, _, _ := wideState(t, b)
				require.True(t, hm)
				require.True(t, km)
				rwhAckOK(t, b, held)
				rwhRequireGone(t, b, "every run acked")
				next := dequeue(t, b, queueName, 100)
				require.Len(t, next, 70, "every key free again")
				for k := range 70 {
					n, err := b.q.KeyInflight(b.ctx, env, queueName, fmt.Sprintf("k%d", k))
					require.NoError(t, err)
					require.Equal(t, 1, n, "key k%d", k)
				}
				ackAll(t, b, next)
				rwhRequireGone(t, b, "every run acked again")
				require.Empty(t, b.keysUnderQueue(t))
			})
		})
	}
}

// TestReviewWideHeldFewKeys: 70 runs in flight over 2 keys: held is marked,
// kin (2 fields) is not; the counts and stats leave the mark out; later
// 64 keys come in flight and a later look marks kin too (kin is marked
// only together with held). (Passes.)
func TestReviewWideHeldFewKeys(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, nil)
		qk := queueKeys(t, b)
		rwhFill(t, b, 2, 35)
		held := dequeue(t, b, queueName, 70)
		require.Len(t, held, 70)
		hm, km, _, _ := wideState(t, b)
		require.True(t, hm, "70 runs in flight: held marked")
		require.False(t, km, "2 keys in flight: kin not marked")
		requireEncoding(t, b, qk.KeyInflight(), "listpack")
		ks, err := b.q.KeyStats(b.ctx, env, queueName, "k0")
		require.NoError(t, err)
		require.Equal(t, int64(35), ks.InFlight)
		require.Equal(t, int64(70), queueStats(t, b, queueName).InFlight)

		// 64 more keys, one run each: tokens 71..134 pass 128.
		enqueueMany(t, b, 64, func(i int) runqueue.EnqueueParams {
			return runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprintf("m%d", i), ID: fmt.Sprintf("m%02d", i)}
		})
		more := dequeue(t, b, queueName, 64)
		require.Len(t, more, 64)
		_, km, _, _ = wideState(t, b)
		require.True(t, km, "66 keys in flight at the look at 128: kin marked")
		require.Equal(t, int64(134), queueStats(t, b, queueName).InFlight)
		rwhAckOK(t, b, append(held, more...))
		rwhRequireGone(t, b, "every run acked")
	})
}

// keysUnderQueue is keysUnder limited to the queue's own keys, the
// scheduler's state left out (it lives out its StateTTL).
func (b *testBundle) keysUnderQueue(t *testing.T) []string {
	t.Helper()
	qk := queueKeys(t, b)
	base := strings.TrimSuffix(qk.Held(), "held")
	var out []string
	for _, k := range b.keysUnder(t) {
		if strings.HasPrefix(k, base) && k != qk.CkVtime() && k != qk.CkVtimeState() {
			out = append(out, k)
		}
	}
	return out
}
