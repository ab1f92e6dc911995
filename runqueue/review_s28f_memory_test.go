package runqueue_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// Review s28f: guarantee 9 (bounded memory) on a real Redis with the
// real clock: the scheduler state expires StateTTL after the last flag-on
// dequeue whatever flag-on producers register meanwhile, and the state's
// size stays bounded under churn, flag on and in a mixed deployment.

const s28fEnv, s28fQueue = "s28f", "work"

// s28fRounds is rounds runs of each of n keys (fmt.Sprintf(format, i)),
// round after round, as s28fEnqueue takes them.
func s28fRounds(rounds, n int, format string) []string {
	batch := make([]string, 0, rounds*n)
	for range rounds {
		for i := range n {
			batch = append(batch, fmt.Sprintf(format, i))
		}
	}
	return batch
}

// s28fPair is a flag-on and a flag-off Queue of cfg (its VtimeScheduling
// aside) on client c, closed at the test's end.
func s28fPair(t *testing.T, c redis.UniversalClient, cfg runqueue.Config) (on, off *runqueue.Queue) {
	t.Helper()
	for _, flag := range []bool{true, false} {
		own := cfg
		own.VtimeScheduling = flag
		q, err := runqueue.New(context.Background(), c, &own)
		require.NoError(t, err)
		t.Cleanup(func() { _ = q.Close() })
		if flag {
			on = q
		} else {
			off = q
		}
	}
	return on, off
}

func s28fQueues(t *testing.T, c redis.UniversalClient, prefix string, mut func(*runqueue.Config)) (on, off *runqueue.Queue, ck, st string) {
	t.Helper()
	cfg := runqueue.Config{Prefix: prefix}
	if mut != nil {
		mut(&cfg)
	}
	on, off = s28fPair(t, c, cfg)
	sp, err := keys.NewSpace(prefix, on.Config().Shards)
	require.NoError(t, err)
	qk := sp.Env(s28fEnv).Queue(s28fQueue)
	return on, off, qk.CkVtime(), qk.CkVtimeState()
}

func s28fEnqueue(t *testing.T, q *runqueue.Queue, keys []string, tag string) {
	t.Helper()
	ps := make([]runqueue.EnqueueParams, 0, len(keys))
	for i, k := range keys {
		ps = append(ps, runqueue.EnqueueParams{Env: s28fEnv, Queue: s28fQueue, Key: k,
			ID: fmt.Sprintf("%s-%d-%s", tag, i, k), Payload: []byte("x")})
	}
	for len(ps) > 0 {
		n := min(len(ps), 1000)
		_, err := q.EnqueueMany(context.Background(), ps[:n])
		require.NoError(t, err)
		ps = ps[n:]
	}
}

// TestS28FOutageProducersDoNotRenew: a flag-on queue serves keys a and b,
// then no dequeue runs for 3 x StateTTL while flag-on producers keep
// enqueueing (new keys every 50 ms, which register as newcomers, and more
// runs of a). The state a's registration lives in must be gone within
// StateTTL of the last dequeue (plus scheduling slack), and no scheduler
// key may ever be without a TTL or hold one above StateTTL.
func TestS28FOutageProducersDoNotRenew(t *testing.T) {
	c := redistest.Real(t)
	ctx := context.Background()
	const ttl = 1500 * time.Millisecond
	on, _, ck, st := s28fQueues(t, c, redistest.Prefix(t), func(cfg *runqueue.Config) { cfg.StateTTL = ttl })
	s28fEnqueue(t, on, []string{"a", "a", "a", "a", "b", "b", "b", "b"}, "w")
	runs, err := on.Dequeue(ctx, s28fEnv, s28fQueue, 3)
	require.NoError(t, err)
	require.Len(t, runs, 3)
	for _, r := range runs {
		require.NoError(t, on.Ack(ctx, r))
	}
	lastDequeue := time.Now()
	aField := keys.VariantMember("a")
	has, err := c.HExists(ctx, st, aField).Result()
	require.NoError(t, err)
	require.True(t, has, "a is not registered in the state hash: the test no longer builds its state")

	var goneAt time.Duration
	var badTTL []string
	i := 0
	for time.Since(lastDequeue) < 3*ttl {
		i++
		s28fEnqueue(t, on, []string{fmt.Sprintf("n%d", i), "a"}, fmt.Sprintf("p%d", i))
		for _, k := range []string{ck, st} {
			d, err := c.PTTL(ctx, k).Result()
			require.NoError(t, err)
			if d == -1*time.Nanosecond || d == -1 || d > ttl {
				// go-redis reports "no TTL" as -1ns.
				if len(badTTL) < 5 {
					badTTL = append(badTTL, fmt.Sprintf("%s at %v: PTTL %v", k, time.Since(lastDequeue), d))
				}
			}
		}
		if goneAt == 0 {
			has, err := c.HExists(ctx, st, aField).Result()
			require.NoError(t, err)
			if !has {
				goneAt = time.Since(lastDequeue)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("%d producer rounds; a's registration gone %v after the last dequeue (StateTTL %v)", i, goneAt, ttl)
	require.Empty(t, badTTL, "a scheduler key without a TTL or with one above StateTTL")
	require.NotZero(t, goneAt, "the state outlived 3 x StateTTL with no dequeue: producers renewed it")
	require.LessOrEqual(t, goneAt, ttl+300*time.Millisecond, "the state outlived StateTTL after the last dequeue")
	// Work goes on after the outage: every key is served (a fresh state).
	seen := map[string]bool{}
	for n := 0; n < 200; n++ {
		runs, err := on.Dequeue(ctx, s28fEnv, s28fQueue, 50)
		require.NoError(t, err)
		if len(runs) == 0 {
			break
		}
		for _, r := range runs {
			seen[r.Key] = true
			require.NoError(t, on.Ack(ctx, r))
		}
	}
	require.Len(t, seen, i+2, "keys left unserved after the outage")
}

// s28fStateSize is the scheduler state's ZSET and hash sizes.
func s28fStateSize(t *testing.T, c redis.UniversalClient, ck, st string) (int64, int64) {
	z, err := c.ZCard(context.Background(), ck).Result()
	require.NoError(t, err)
	h, err := c.HLen(context.Background(), st).Result()
	require.NoError(t, err)
	return z, h
}

// TestS28FChurnStateBounded: 3,000 keys at weight 0.001 (their tags end
// 1,000 serves above V when they drain, so they park) drain and return
// every round, flag on, IdleMaxEntries 200, with a stream of keys minted
// once. Guarantee 9: one ZSET entry per registered key,
// parked tags capped. After each round, with nothing registered, the
// ZSET may hold the sentinel, the wide mark and at most IdleMaxEntries
// parked tags.
func TestS28FChurnStateBounded(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	c := redistest.Real(t)
	ctx := context.Background()
	const idleMax = 200
	on, _, ck, st := s28fQueues(t, c, redistest.Prefix(t), func(cfg *runqueue.Config) { cfg.IdleMaxEntries, cfg.MaxWeightOverrides = idleMax, 5000 })
	const n = 3000
	var ks []string
	for i := 0; i < n; i++ {
		ks = append(ks, fmt.Sprintf("c%04d", i))
		require.NoError(t, on.SetWeight(ctx, s28fEnv, s28fQueue, ks[i], 0.001))
	}
	var maxZ, maxH, lastZ int64
	for round := 0; round < 6; round++ {
		batch := append([]string{}, ks...)
		for j := 0; j < 500; j++ {
			batch = append(batch, fmt.Sprintf("m%d-%d", round, j)) // minted once
		}
		s28fEnqueue(t, on, batch, fmt.Sprintf("r%d", round))
		// Drain everything, counting what is served.
		served := 0
		for served < len(batch) {
			runs, err := on.Dequeue(ctx, s28fEnv, s28fQueue, 200)
			require.NoError(t, err)
			if len(runs) == 0 {
				z, h := s28fStateSize(t, c, ck, st)
				t.Fatalf("round %d: a call served nothing while %d runs were queued (state %d/%d)", round, len(batch)-served, z, h)
			}
			served += len(runs)
			for _, r := range runs {
				require.NoError(t, on.Ack(ctx, r))
			}
			z, h := s28fStateSize(t, c, ck, st)
			maxZ, maxH = max(maxZ, z), max(maxH, h)
		}
		z, h := s28fStateSize(t, c, ck, st)
		t.Logf("round %d: ckVtime %d entries, state hash %d fields", round, z, h)
		// nothing registered: sentinel + wide mark + parked tags.
		require.LessOrEqual(t, z, int64(2+idleMax), "round %d: the state ZSET grew past registered + IdleMaxEntries", round)
		require.LessOrEqual(t, h, z+32, "round %d: the state hash holds far more fields than the ZSET entries", round)
		lastZ = z
	}
	require.Greater(t, lastZ, int64(idleMax/2), "few parked tags left above V: the idle cap was never tested")
	t.Logf("peak during drains: ckVtime %d, hash %d", maxZ, maxH)
	require.LessOrEqual(t, maxZ, int64(n+500+2+2+idleMax), "peak ZSET past one entry per registered key + IdleMaxEntries")
}

// TestS28FMixedChurnStateBounded: a mixed deployment. Flag-on producers
// mint 300 one-run keys per round (each registers in the scheduler); a
// flag-off instance serves most of them (it writes nothing of the
// scheduler, so each leaves a stale registration), a flag-on instance
// makes every third (or every 25th) call and renews the state. Stale registrations are
// collected "a bounded number per call" when a flag-on call meets them;
// guarantee 9 wants one entry per registered key. The state must not
// grow without bound: after 40 rounds (12,000 keys minted, all served)
// it may hold at most a few rounds' worth of stale entries.
func TestS28FMixedChurnStateBounded(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	for _, every := range []int{3, 25} {
		t.Run(fmt.Sprint(every), func(t *testing.T) { s28fMixedChurn(t, every) })
	}
}

func s28fMixedChurn(t *testing.T, every int) {
	c := redistest.Real(t)
	ctx := context.Background()
	on, off, ck, st := s28fQueues(t, c, redistest.Prefix(t), nil)
	const perRound, rounds = 300, 40
	var sizes []int64
	call := 0
	for round := 0; round < rounds; round++ {
		var batch []string
		for j := 0; j < perRound; j++ {
			batch = append(batch, fmt.Sprintf("m%d-%d", round, j))
		}
		for j := 0; j < 10; j++ {
			batch = append(batch, "heavy")
		}
		s28fEnqueue(t, on, batch, fmt.Sprintf("r%d", round))
		for {
			call++
			q := off
			if call%every == 0 {
				q = on
			}
			runs, err := q.Dequeue(ctx, s28fEnv, s28fQueue, 50)
			require.NoError(t, err)
			if len(runs) == 0 {
				break
			}
			for _, r := range runs {
				require.NoError(t, q.Ack(ctx, r))
			}
		}
		z, _ := s28fStateSize(t, c, ck, st)
		sizes = append(sizes, z)
	}
	z, h := s28fStateSize(t, c, ck, st)
	t.Logf("ckVtime entries after each round: %v; final hash %d fields", sizes, h)
	require.LessOrEqual(t, z, int64(4*perRound), "the state keeps growing with stale registrations: %v", sizes)
}

// TestS28FHalfStateEvicted: Redis evicts one of the two scheduler keys
// (allkeys-* eviction takes keys one by one) under load: 3,000 keys
// backlogged, registered; then either ckVtime or the state hash goes.
// docs/design.md section 6: a state with one key missing is broken and
// starts afresh; a flag-on dequeue that meets it serves nothing and Go
// repeats it at once. Measured: the very next Dequeue (and an Enqueue
// before it, for the other path) still serves a full call (work
// conservation: 3,000 keys have ready runs), the state afterwards is
// whole (both keys, both with a TTL) and holds no leftover of the old
// one past one entry per registered key, and every key is served.
func TestS28FHalfStateEvicted(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	for _, gone := range []string{"ckVtime", "state"} {
		for _, first := range []string{"dequeue", "enqueue"} {
			t.Run(gone+"/"+first, func(t *testing.T) {
				c := redistest.Real(t)
				ctx := context.Background()
				on, _, ck, st := s28fQueues(t, c, redistest.Prefix(t), nil)
				const n = 3000
				batch := s28fRounds(2, n, "e%04d")
				s28fEnqueue(t, on, batch, "a")
				served := 0
				for i := 0; i < 3; i++ {
					runs, err := on.Dequeue(ctx, s28fEnv, s28fQueue, 100)
					require.NoError(t, err)
					served += len(runs)
					for _, r := range runs {
						require.NoError(t, on.Ack(ctx, r))
					}
				}
				victim := ck
				if gone == "state" {
					victim = st
				}
				require.NoError(t, c.Del(ctx, victim).Err())
				if first == "enqueue" {
					s28fEnqueue(t, on, []string{"fresh"}, "b")
					batch = append(batch, "fresh")
				}
				runs, err := on.Dequeue(ctx, s28fEnv, s28fQueue, 100)
				require.NoError(t, err)
				require.Len(t, runs, 100, "the first call after the eviction did not serve a full call")
				for _, r := range runs {
					require.NoError(t, on.Ack(ctx, r))
				}
				served += len(runs)
				for _, k := range []string{ck, st} {
					d, err := c.PTTL(ctx, k).Result()
					require.NoError(t, err)
					require.Greater(t, d, time.Duration(0), "%s has no TTL (or is missing) after the restart", k)
				}
				seen := map[string]bool{}
				for i := 0; served < len(batch) && i < 1000; i++ {
					runs, err := on.Dequeue(ctx, s28fEnv, s28fQueue, 100)
					require.NoError(t, err)
					require.NotEmpty(t, runs, "a call served nothing with %d runs queued", len(batch)-served)
					for _, r := range runs {
						seen[r.Key] = true
						require.NoError(t, on.Ack(ctx, r))
					}
					served += len(runs)
				}
				require.Equal(t, len(batch), served)
				z, h := s28fStateSize(t, c, ck, st)
				t.Logf("after the drain: ckVtime %d, hash %d", z, h)
				require.LessOrEqual(t, z, int64(2+10000))
			})
		}
	}
}
