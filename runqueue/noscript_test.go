package runqueue_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// flushScripts empties the script cache of every node c talks to, as a
// restart or failover would.
func flushScripts(t *testing.T, b *testBundle) {
	t.Helper()
	// ClusterClient.ScriptFlush runs on every shard; miniredis implements
	// SCRIPT FLUSH too.
	require.NoError(t, b.client.ScriptFlush(b.ctx).Err())
}

// requireNoScriptRecovered checks the script calls of one step: the first
// EVALSHA met an empty cache (NOSCRIPT) and the same script was then sent
// in full (EVAL) and ran.
func requireNoScriptRecovered(t *testing.T, step string, calls []scriptCall) {
	t.Helper()
	require.NotEmpty(t, calls, "%s ran no script", step)
	first := calls[0]
	require.Equal(t, "evalsha", first.cmd, step)
	require.Error(t, first.err, "%s: the script cache was flushed, EVALSHA must miss", step)
	require.True(t, strings.HasPrefix(first.err.Error(), "NOSCRIPT"), "%s: %v", step, first.err)
	require.GreaterOrEqual(t, len(calls), 2, "%s: no EVAL after NOSCRIPT", step)
	resent := calls[1]
	require.Equal(t, "eval", resent.cmd, step)
	require.Equal(t, first.sha, resent.sha, step)
	require.Equal(t, first.keys, resent.keys, step)
	// The step itself checks the outcome, which may be a script error.
	if resent.err != nil {
		require.False(t, strings.HasPrefix(resent.err.Error(), "NOSCRIPT"), "%s: %v", step, resent.err)
	}
}

// TestNoScriptRecovery flushes the script cache before every call of a full
// lifecycle: each call must still do its work, by sending the script source
// when EVALSHA reports NOSCRIPT.
//
// Not parallel: SCRIPT FLUSH empties the cache of the redis-server every
// test of the binary shares, and sequential top-level tests run alone, so
// no other test reloads a script between the flush and the call under
// test (which would make the NOSCRIPT assertions flaky). The real server is
// the binary's own (redistest.Private), never a REDIS_URL that other test
// binaries share: they would reload scripts under this test, and this
// test's flush would take theirs away.
func TestNoScriptRecovery(t *testing.T) {
	redistest.ForEachBackend(t, privateBackends, func(t *testing.T, c redis.UniversalClient) {
		rec := recordEvals(c)
		b := setup(t, c, func(cfg *runqueue.Config) { cfg.LeaseDuration = time.Minute })
		ctx := b.ctx
		const env, queue = "prod", "q:{1}"
		var held []*runqueue.Run
		var shardRun *runqueue.Run

		enqueue := func(p runqueue.EnqueueParams) func(t *testing.T) {
			return func(t *testing.T) {
				p.Env, p.Queue, p.Payload = env, queue, []byte("body-"+p.ID)
				ok, err := b.q.Enqueue(ctx, p)
				require.NoError(t, err)
				require.True(t, ok)
			}
		}
		steps := []struct {
			name string
			fn   func(t *testing.T)
		}{
			{"EnqueueReady", enqueue(runqueue.EnqueueParams{Key: "k", ID: "a"})},
			{"EnqueueNoKey", enqueue(runqueue.EnqueueParams{ID: "b", Priority: 3})},
			{"EnqueueDelayed", enqueue(runqueue.EnqueueParams{Key: "k", ID: "c", Delay: 10 * time.Second})},
			{"EnqueueExpiring", enqueue(runqueue.EnqueueParams{Key: "k2", ID: "d", Delay: time.Hour, TTL: 5 * time.Second})},
			{"EnqueueIdempotent", func(t *testing.T) {
				ok, err := b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: env, Queue: queue, Key: "k", ID: "a", Payload: []byte("body-a")})
				require.NoError(t, err)
				require.False(t, ok)
			}},
			{"EnqueueConflict", func(t *testing.T) {
				_, err := b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: env, Queue: queue, Key: "k", ID: "a", Payload: []byte("other")})
				require.ErrorIs(t, err, runqueue.ErrConflict, "a script error must survive the EVAL fallback")
			}},
			{"Dequeue", func(t *testing.T) {
				runs, err := b.q.Dequeue(ctx, env, queue, 2)
				require.NoError(t, err)
				require.Len(t, runs, 2)
				held = runs
			}},
			{"Nack", func(t *testing.T) {
				res, err := b.q.Nack(ctx, held[0], &runqueue.NackOptions{RetryAt: b.clock.Now()})
				require.NoError(t, err)
				require.True(t, res.Requeued)
				require.Equal(t, 2, res.Attempt)
			}},
			{"ExtendLease", func(t *testing.T) {
				require.NoError(t, b.q.ExtendLease(ctx, held[1], 30*time.Second))
			}},
			{"RecoverLeases", func(t *testing.T) {
				b.clock.Advance(2 * time.Minute)
				n, err := b.q.RecoverLeases(ctx, b.q.ShardOf(env), 100)
				require.NoError(t, err)
				require.Equal(t, 1, n)
			}},
			{"DequeueAfterRecovery", func(t *testing.T) {
				runs, err := b.q.Dequeue(ctx, env, queue, 10)
				require.NoError(t, err)
				// a, b (recovered) and c (promoted: its delay passed).
				require.Len(t, runs, 3)
				held = runs
			}},
			{"Ack", func(t *testing.T) {
				for _, r := range held {
					require.NoError(t, b.q.Ack(ctx, r))
				}
			}},
			{"ExpireTTL", func(t *testing.T) {
				n, err := b.q.ExpireTTL(ctx, b.q.ShardOf(env), 100)
				require.NoError(t, err)
				require.Equal(t, 1, n)
			}},
			{"EnqueueForShard", enqueue(runqueue.EnqueueParams{Key: "k", ID: "e"})},
			{"DequeueShard", func(t *testing.T) {
				runs, err := b.q.DequeueShard(ctx, b.q.ShardOf(env), 10)
				require.NoError(t, err)
				require.Len(t, runs, 1)
				shardRun = runs[0]
			}},
			{"NackDeadLetter", func(t *testing.T) {
				res, err := b.q.Nack(ctx, shardRun, &runqueue.NackOptions{DeadLetter: true})
				require.NoError(t, err)
				require.False(t, res.Requeued)
			}},
			{"Redrive", func(t *testing.T) {
				require.NoError(t, b.q.Redrive(ctx, env, queue, "k", "e"))
			}},
			{"DequeueWait", func(t *testing.T) {
				runs, err := b.q.DequeueWait(ctx, env, queue, 10, 0)
				require.NoError(t, err)
				require.Len(t, runs, 1)
				require.Equal(t, "e", runs[0].ID)
				require.Equal(t, 1, runs[0].Attempt, "redrive resets attempts")
				shardRun = runs[0]
			}},
			{"NackRedrivenDead", func(t *testing.T) {
				res, err := b.q.Nack(ctx, shardRun, &runqueue.NackOptions{DeadLetter: true})
				require.NoError(t, err)
				require.False(t, res.Requeued)
			}},
			// (PurgeDeadLetters reads its runs first and sends no script
			// when there are none: it needs one to purge.)
			{"PurgeDeadLetters", func(t *testing.T) {
				n, err := b.q.PurgeDeadLetters(ctx, env, queue, b.clock.Now(), 10)
				require.NoError(t, err)
				require.Equal(t, 1, n)
			}},
			{"Repair", func(t *testing.T) {
				res, err := b.q.Repair(ctx, env, queue, nil)
				require.NoError(t, err)
				require.False(t, res.Changed(), "%+v", res)
			}},
			{"SetWeight", func(t *testing.T) { require.NoError(t, b.q.SetWeight(ctx, env, queue, "k", 2)) }},
			{"ClearWeight", func(t *testing.T) { require.NoError(t, b.q.ClearWeight(ctx, env, queue, "k")) }},
		}
		names := flagOffNames(t)
		ran := map[string]bool{}
		for _, s := range steps {
			flushScripts(t, b)
			_, _ = rec.take()
			t.Run(s.name, s.fn)
			calls, _ := rec.take()
			requireNoScriptRecovered(t, s.name, calls)
			for _, c := range calls {
				ran[names[c.sha]] = true
			}
		}
		for _, name := range names {
			require.True(t, ran[name], "script %s never ran after a flush", name)
		}

		st, err := b.q.QueueStats(ctx, env, queue)
		require.NoError(t, err)
		require.Equal(t, runqueue.Stats{}, st, "every run was acked or expired")
	})
}
