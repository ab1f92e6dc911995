package runqueue_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// The wide marks of the in-flight hashes (layout 5, lua/lib/held.lua): a
// queue's held hash that holds 64 runs or more gets the field "~" (and its
// key-inflight hash too at 64 variants), so that Redis keeps both as hash
// tables; the mark is no run (counts, limits and stats leave it out), and
// when the last run leaves flight both hashes go.

const wideField = "~"

// wideState reports whether the queue's held and key-inflight hashes carry
// the mark, and whether each key exists.
func wideState(t *testing.T, b *testBundle) (heldMark, kinMark, heldExists, kinExists bool) {
	t.Helper()
	qk := queueKeys(t, b)
	var err error
	heldMark, err = b.client.HExists(b.ctx, qk.Held(), wideField).Result()
	require.NoError(t, err)
	kinMark, err = b.client.HExists(b.ctx, qk.KeyInflight(), wideField).Result()
	require.NoError(t, err)
	n, err := b.client.Exists(b.ctx, qk.Held()).Result()
	require.NoError(t, err)
	m, err := b.client.Exists(b.ctx, qk.KeyInflight()).Result()
	require.NoError(t, err)
	return heldMark, kinMark, n == 1, m == 1
}

func queueKeys(t *testing.T, b *testBundle) keys.Queue {
	t.Helper()
	return keySpace(t, b).Env(env).Queue(queueName)
}

// requireEncoding checks Redis's encoding of key (real Redis only:
// miniredis has no OBJECT ENCODING).
func requireEncoding(t *testing.T, b *testBundle, key, want string) {
	t.Helper()
	if strings.Contains(t.Name(), "/Mini") {
		return
	}
	enc, err := b.client.ObjectEncoding(b.ctx, key).Result()
	require.NoError(t, err)
	require.Equal(t, want, enc, "encoding of %s", key)
}

// TestWideMarksWhenTheCounterMoves: the wide checks fall once per 64
// deliveries even when every dequeue moves the shard's token counter up
// to the clock (calls 10.24 ms or more apart: a quiet shard, or the
// server's clock under a profiler). Before, a move left the counter on a
// multiple of 10,240, a call of 10 never passed a multiple of 64, and 130
// runs in flight left both hashes unmarked, listpacks.
func TestWideMarksWhenTheCounterMoves(t *testing.T) {
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		qk := queueKeys(t, b)
		const keys, runs = 100, 200
		enqueueMany(t, b, runs, func(i int) runqueue.EnqueueParams {
			return runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprintf("k%d", i%keys), ID: fmt.Sprintf("r%03d", i),
				AvailableAt: b.clock.Now().Add(-time.Duration(runs-i) * time.Millisecond)}
		})
		var tokens []int64
		for range 13 {
			b.clock.Advance(20 * time.Millisecond) // each call past the counter's floor
			got := dequeue(t, b, queueName, 10)
			require.Len(t, got, 10)
			tokens = append(tokens, got[0].Token)
		}
		require.Equal(t, int64(130), queueStats(t, b, queueName).InFlight)
		for i := 1; i < len(tokens); i++ {
			require.Greater(t, tokens[i]-tokens[i-1], int64(10), "call %d did not move the counter", i)
		}
		hm, km, _, _ := wideState(t, b)
		require.True(t, hm, "130 runs in flight: the held hash is marked")
		require.True(t, km, "100 keys in flight: the key-inflight hash is marked")
		requireEncoding(t, b, qk.Held(), "hashtable")
		requireEncoding(t, b, qk.KeyInflight(), "hashtable")
	})
}

func TestWideHeldMarks(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
				// A queue limit of 135: with 130 runs in flight (and the
				// mark) a dequeue of 10 may take 5.
				b := setup(t, c, func(cfg *runqueue.Config) {
					cfg.VtimeScheduling = on
					cfg.QueueConcurrency = 135
				})
				qk := queueKeys(t, b)
				const keys, runs = 100, 300
				enqueueMany(t, b, runs, func(i int) runqueue.EnqueueParams {
					// (one age each: the keys' runs interleave in age order)
					return runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprintf("k%d", i%keys), ID: fmt.Sprintf("r%03d", i),
						AvailableAt: b.clock.Now().Add(-time.Duration(runs-i) * time.Millisecond)}
				})

				// Below 64 in flight: no mark, the listpacks stay.
				var held []*runqueue.Run
				for range 6 {
					held = append(held, dequeue(t, b, queueName, 10)...)
				}
				require.Len(t, held, 60)
				hm, km, _, _ := wideState(t, b)
				require.False(t, hm, "60 runs in flight: no mark")
				require.False(t, km)
				requireEncoding(t, b, qk.Held(), "listpack")

				// Tokens 61..70 pass 64 with 70 runs in flight over 70 keys:
				// both hashes are marked.
				for range 7 {
					held = append(held, dequeue(t, b, queueName, 10)...)
				}
				require.Len(t, held, 130)
				hm, km, _, _ = wideState(t, b)
				require.True(t, hm, "130 runs in flight: the held hash is marked")
				require.True(t, km, "100 keys in flight: the key-inflight hash is marked")
				requireEncoding(t, b, qk.Held(), "hashtable")
				requireEncoding(t, b, qk.KeyInflight(), "hashtable")

				// The mark is no run: stats and the queue limit leave it out.
				require.Equal(t, int64(130), queueStats(t, b, queueName).InFlight)
				preview, err := b.q.Preview(b.ctx, env, queueName, 10)
				require.NoError(t, err)
				require.Len(t, preview, 5, "Preview: queue limit 135 with 130 in flight")
				more := dequeue(t, b, queueName, 10)
				require.Len(t, more, 5, "queue limit 135 with 130 in flight")
				held = append(held, more...)
				require.Empty(t, dequeue(t, b, queueName, 10))
				ks, err := b.q.KeyStats(b.ctx, env, queueName, "k0")
				require.NoError(t, err)
				require.Equal(t, int64(2), ks.InFlight)

				// Acks down to one run in flight: the marks stay.
				errs, err := b.q.AckMany(b.ctx, held[:len(held)-1])
				require.NoError(t, err)
				for _, e := range errs {
					require.NoError(t, e)
				}
				hm, km, _, _ = wideState(t, b)
				require.True(t, hm)
				require.True(t, km)
				require.Equal(t, int64(1), queueStats(t, b, queueName).InFlight)

				// The last run leaves by a nack: both hashes go.
				_, err = b.q.Nack(b.ctx, held[len(held)-1], nil)
				require.NoError(t, err)
				_, _, he, ke := wideState(t, b)
				require.False(t, he, "no run in flight: the held hash is gone")
				require.False(t, ke, "no run in flight: the key-inflight hash is gone")
				require.Equal(t, int64(0), queueStats(t, b, queueName).InFlight)

				// Again (tokens 136..265: the look at 192 finds 60 runs in
				// flight, the one at 256 finds 130), and the last runs leave
				// by acks.
				held = held[:0]
				for range 13 {
					held = append(held, dequeue(t, b, queueName, 10)...)
				}
				require.Len(t, held, 130)
				hm, _, _, _ = wideState(t, b)
				require.True(t, hm, "130 runs in flight, tokens past 256: marked again")
				ackAll(t, b, held)
				_, _, he, ke = wideState(t, b)
				require.False(t, he)
				require.False(t, ke)

				// Every run served, acked: the queue leaves no key behind
				// (the shards' keys aside, and the scheduler's state, which
				// lives out its StateTTL).
				b.clock.Advance(time.Hour) // the nacked run's retry is due
				for range 10 {
					ackAll(t, b, dequeue(t, b, queueName, 50))
				}
				require.Empty(t, dequeue(t, b, queueName, 50), "every ready run served")
				left := slices.DeleteFunc(b.keysUnder(t), func(k string) bool {
					return !strings.Contains(k, ":q:") || strings.HasSuffix(k, ":ckVtime") || strings.HasSuffix(k, ":ckVtimeState")
				})
				require.Empty(t, left)
			})
		})
	}
}
