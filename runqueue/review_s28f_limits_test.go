package runqueue_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/fairness"
	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// TestS28FKeyLimitLoweredAndRaised: 4,000 keys with 6 runs each, key limit
// 3, every key brought to its limit (3 held, gated). The limit drops to 1;
// one run of each key is acked (half by the flag-on instance, half by the
// flag-off one), leaving 2 held: above the new limit, so no key may be
// served. Then the limit rises to 2: still none (2 held). Then the limit
// rises to 4: every key must come back at once (the first call after a
// rise un-gates every gated key) and each may be served up to 2 more
// runs. Measured: the per-key cap at every serve against the limit in
// force; work conservation after the rise (calls of 500 fill until the
// 8,000 servable runs are gone); the cost of the un-gating call (it
// must not fail at 4,000 gated keys).
func TestS28FKeyLimitLoweredAndRaised(t *testing.T) {
	c := redistest.Real(t)
	ctx := context.Background()
	clock := fairness.NewClock()
	prefix := redistest.Prefix(t)
	var limit atomic.Int64
	limit.Store(3)
	on, off := s28fPair(t, c, runqueue.Config{Prefix: prefix, Clock: clock, LimitsFor: func(string, string) runqueue.Limits { return runqueue.Limits{Key: int(limit.Load())} }})
	const n = 4000
	var keys []string
	for i := 0; i < n; i++ {
		keys = append(keys, fmt.Sprintf("g%04d", i))
	}
	var batch []string
	for j := 0; j < 6; j++ {
		batch = append(batch, keys...)
	}
	s28fEnqueue(t, on, batch, "r")
	held := map[string][]*runqueue.Run{}
	var capViol []string
	take := func(q *runqueue.Queue, max int) int {
		runs, err := q.Dequeue(ctx, s28fEnv, s28fQueue, max)
		require.NoError(t, err)
		for _, r := range runs {
			held[r.Key] = append(held[r.Key], r)
			if int64(len(held[r.Key])) > limit.Load() && len(capViol) < 5 {
				capViol = append(capViol, fmt.Sprintf("limit %d: %q holds %d", limit.Load(), r.Key, len(held[r.Key])))
			}
		}
		return len(runs)
	}
	total := 0
	for calls := 0; total < 3*n && calls < 200; calls++ {
		total += take(on, 1000)
	}
	require.Equal(t, 3*n, total, "the keys were not all brought to their limit")
	require.Zero(t, take(on, 1000), "a key was served past its limit 3")
	limit.Store(1)
	for i, k := range keys {
		q := on
		if i%2 == 1 {
			q = off
		}
		r := held[k][0]
		held[k] = held[k][1:]
		require.NoError(t, q.Ack(ctx, r))
	}
	for i := 0; i < 5; i++ {
		require.Zero(t, take(on, 500), "limit 1, 2 held: served")
		require.Zero(t, take(off, 500), "limit 1, 2 held: served (flag off)")
	}
	limit.Store(2)
	for i := 0; i < 5; i++ {
		require.Zero(t, take(on, 500), "limit 2, 2 held: served")
	}
	limit.Store(4)
	start := time.Now()
	got := 0
	calls := 0
	for ; got < 2*n && calls < 100; calls++ {
		m := take(on, 500)
		if m < 500 && got+m < 2*n {
			t.Errorf("call %d after the rise served %d of 500 with %d servable runs left", calls, m, 2*n-got)
		}
		got += m
	}
	t.Logf("after the rise to 4: %d runs in %d calls, %v", got, calls, time.Since(start))
	require.Equal(t, 2*n, got)
	require.Empty(t, capViol, "per-key limit exceeded")
}

// TestS28FProbeLapAfterFlagOffAcks: 1,500 keys, key limit 1, two runs
// each; the flag-on instance serves one run of each (every key at its
// limit, gated when met). The flag-off instance acks them all: it writes
// nothing of the scheduler, so every key stays gated below its limit
// until the gated probe reaches it (guarantee 6's exception), one gated
// key per flag-on call, each "within a lap of as many calls as there are
// gated variants". Meanwhile a backlogged key B keeps the calls busy and
// newly gated keys join the probe's order behind. Measured: every one of
// the 1,500 keys is served within 1,500 + 2 flag-on calls of the acks
// (per-key cap checked throughout), and each such key is served at most
// one call after the probe could reach it: none is skipped for a lap.
func TestS28FProbeLapAfterFlagOffAcks(t *testing.T) {
	c := redistest.Real(t)
	ctx := context.Background()
	clock := fairness.NewClock()
	prefix := redistest.Prefix(t)
	on, off := s28fPair(t, c, runqueue.Config{Prefix: prefix, Clock: clock, KeyConcurrency: 1})
	const n = 1500
	batch := s28fRounds(2, n, "g%04d")
	s28fEnqueue(t, on, batch, "a")
	var held []*runqueue.Run
	for len(held) < n {
		runs, err := on.Dequeue(ctx, s28fEnv, s28fQueue, 500)
		require.NoError(t, err)
		require.NotEmpty(t, runs)
		held = append(held, runs...)
	}
	require.Len(t, held, n)
	// One more call meets them all at their limit (gated).
	runs, err := on.Dequeue(ctx, s28fEnv, s28fQueue, 500)
	require.NoError(t, err)
	require.Empty(t, runs, "a key served past its limit 1")
	for _, r := range held {
		require.NoError(t, off.Ack(ctx, r))
	}
	var b []string
	for j := 0; j < 3*n; j++ {
		b = append(b, "B")
	}
	s28fEnqueue(t, on, b, "b")
	servedAt := map[string]int{}
	call := 0
	for ; call < n+50 && len(servedAt) < n; call++ {
		runs, err := on.Dequeue(ctx, s28fEnv, s28fQueue, 5)
		require.NoError(t, err)
		require.NotEmpty(t, runs, "call %d served nothing while B is backlogged", call)
		for _, r := range runs {
			if r.Key != "B" {
				_, dup := servedAt[r.Key]
				require.False(t, dup, "%q served twice with one run", r.Key)
				servedAt[r.Key] = call
			}
			require.NoError(t, on.Ack(ctx, r))
		}
	}
	t.Logf("%d of %d keys served back within %d flag-on calls", len(servedAt), n, call)
	require.Len(t, servedAt, n, "keys left gated below their limit past the probe's lap")
	require.LessOrEqual(t, call, n+2, "the probe's lap took more calls than there are gated keys")
}

// TestS28FGatedKeyExpiresThenReturns: key K at its limit 1 (one run
// held, gated) loses its queued runs to TTL expiry (swept by a flag-on or
// flag-off instance), then its held run is acked (flag on or off), then
// a new run of K is enqueued, next to 300 other keys at their limit and a
// backlogged key B. Guarantee 5: a registered variant with a ready head
// below its limit is served within the bounds of 1, 2 and 10 (B and K:
// within a few serves), or, when a flag-off instance freed its slot,
// once the gated probe reaches it (a lap of the 301 gated keys).
func TestS28FGatedKeyExpiresThenReturns(t *testing.T) {
	for _, sweepBy := range []string{"on", "off"} {
		for _, ackBy := range []string{"on", "off"} {
			t.Run("sweep-"+sweepBy+"/ack-"+ackBy, func(t *testing.T) {
				c := redistest.Real(t)
				ctx := context.Background()
				clock := fairness.NewClock()
				prefix := redistest.Prefix(t)
				on, off := s28fPair(t, c, runqueue.Config{Prefix: prefix, Clock: clock, KeyConcurrency: 1})
				pick := func(s string) *runqueue.Queue {
					if s == "on" {
						return on
					}
					return off
				}
				const g = 300
				batch := s28fRounds(2, g, "g%03d")
				s28fEnqueue(t, on, batch, "a")
				_, err := on.Enqueue(ctx, runqueue.EnqueueParams{Env: s28fEnv, Queue: s28fQueue, Key: "K", ID: "k0", Payload: []byte("x")})
				require.NoError(t, err)
				for j := 1; j <= 3; j++ {
					_, err := on.Enqueue(ctx, runqueue.EnqueueParams{Env: s28fEnv, Queue: s28fQueue, Key: "K",
						ID: fmt.Sprintf("k%d", j), Payload: []byte("x"), TTL: 10 * time.Second})
					require.NoError(t, err)
				}
				var kHeld *runqueue.Run
				for got := 0; got < g+1; {
					runs, err := on.Dequeue(ctx, s28fEnv, s28fQueue, 100)
					require.NoError(t, err)
					require.NotEmpty(t, runs)
					for _, r := range runs {
						if r.Key == "K" {
							require.Nil(t, kHeld, "K served twice at limit 1")
							kHeld = r
						}
					}
					got += len(runs)
				}
				require.NotNil(t, kHeld)
				runs, err := on.Dequeue(ctx, s28fEnv, s28fQueue, 100)
				require.NoError(t, err)
				require.Empty(t, runs, "served past the key limit")
				clock.Advance(11 * time.Second)
				nExp, err := pick(sweepBy).ExpireTTL(ctx, on.ShardOf(s28fEnv), 1000)
				require.NoError(t, err)
				require.Equal(t, 3, nExp)
				require.NoError(t, pick(ackBy).Ack(ctx, kHeld))
				var b []string
				for j := 0; j < 2000; j++ {
					b = append(b, "B")
				}
				s28fEnqueue(t, on, b, "b")
				_, err = on.Enqueue(ctx, runqueue.EnqueueParams{Env: s28fEnv, Queue: s28fQueue, Key: "K", ID: "k9", Payload: []byte("x")})
				require.NoError(t, err)
				bound := 5
				if ackBy == "off" {
					bound = g + 1 + 5
				}
				at := -1
				for call := 0; call < 3*g && at < 0; call++ {
					runs, err := on.Dequeue(ctx, s28fEnv, s28fQueue, 1)
					require.NoError(t, err)
					require.Len(t, runs, 1, "call %d served nothing", call)
					if runs[0].Key == "K" {
						at = call
					}
					require.NoError(t, on.Ack(ctx, runs[0]))
				}
				t.Logf("sweep by %s, ack by %s: K's new run served at call %d (bound %d)", sweepBy, ackBy, at, bound)
				require.GreaterOrEqual(t, at, 0, "K never served")
				require.LessOrEqual(t, at, bound)
			})
		}
	}
}

// TestS28FAckAndDequeueFreesInCall: 1,000 keys at key limit 1, each with
// one run held (gated when met) and two queued; nothing else. A flag-on
// AckAndDequeue that acks all 1,000 held runs frees every slot before
// its dequeue (docs/design.md section 5: the acks first, then the
// capacity), so with maxCount 1,000 it must serve 1,000 runs, one per
// key (work conservation; per-key cap). Then the same with half the
// acks made by the flag-off instance beforehand (unsaid) and the other
// half fused: at least the fused half is served at once.
func TestS28FAckAndDequeueFreesInCall(t *testing.T) {
	c := redistest.Real(t)
	ctx := context.Background()
	clock := fairness.NewClock()
	prefix := redistest.Prefix(t)
	on, off := s28fPair(t, c, runqueue.Config{Prefix: prefix, Clock: clock, KeyConcurrency: 1})
	const n = 1000
	batch := s28fRounds(3, n, "f%04d")
	s28fEnqueue(t, on, batch, "a")
	held, err := on.Dequeue(ctx, s28fEnv, s28fQueue, n)
	require.NoError(t, err)
	require.Len(t, held, n)
	runs, err := on.Dequeue(ctx, s28fEnv, s28fQueue, n)
	require.NoError(t, err)
	require.Empty(t, runs, "served past the key limit")
	runs, errs, err := on.AckAndDequeue(ctx, held, s28fEnv, s28fQueue, n)
	require.NoError(t, err)
	for _, e := range errs {
		require.NoError(t, e)
	}
	keys := map[string]bool{}
	for _, r := range runs {
		require.False(t, keys[r.Key], "%q served twice at limit 1", r.Key)
		keys[r.Key] = true
	}
	t.Logf("fused acks of %d held runs: %d served in the same call", n, len(runs))
	require.Len(t, runs, n, "the fused call did not serve what its acks freed")
	// Half acked by the flag-off instance first, half fused.
	for _, r := range runs[:n/2] {
		require.NoError(t, off.Ack(ctx, r))
	}
	got, errs, err := on.AckAndDequeue(ctx, runs[n/2:], s28fEnv, s28fQueue, n)
	require.NoError(t, err)
	for _, e := range errs {
		require.NoError(t, e)
	}
	keys = map[string]bool{}
	for _, r := range got {
		require.False(t, keys[r.Key], "%q served twice at limit 1", r.Key)
		keys[r.Key] = true
	}
	fused := 0
	for _, r := range runs[n/2:] {
		if keys[r.Key] {
			fused++
		}
	}
	t.Logf("mixed: %d served, %d of the %d fused-acked keys", len(got), fused, n/2)
	require.Equal(t, n/2, fused, "a key whose slot the fused ack freed was not served in that call")
}
