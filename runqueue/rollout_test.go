package runqueue_test

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// Rollout of the fair scheduler (issue 3 item 10): turning the flag on over
// a backlog written with it off, turning it off again, and flag-off
// instances never writing the scheduler's keys.

// rolloutBackends are the three kinds of Redis; mini also returns the
// miniredis server so that a test can move its clock.
func rolloutBackends(t *testing.T, fn func(t *testing.T, c redis.UniversalClient, mini *miniredis.Miniredis)) {
	run := map[string]func(t *testing.T){
		"Mini": func(t *testing.T) {
			m, c := redistest.MiniServer(t)
			fn(t, c, m)
		},
		"Real":    func(t *testing.T) { fn(t, redistest.Real(t), nil) },
		"Cluster": func(t *testing.T) { fn(t, redistest.Cluster(t), nil) },
	}
	for _, name := range []string{"Mini", "Real", "Cluster"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			run[name](t)
		})
	}
}

// TestRolloutFlagOnOverBacklog: a flag-off instance writes a backlog key by
// key (every run of key i older than any of key i+1: the shape age-order
// discovery alone cannot reach), then a flag-on instance serves it with
// immediate acks. Every key is first served within ceil(keys/maxCount)+1
// calls (the flag-flip scenario: 50 keys, maxCount 5, 11 calls), and the
// whole backlog drains, each run once.
func TestRolloutFlagOnOverBacklog(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		keys     int
		runs     func(i int) int
		maxCount int
	}{
		{"FlagFlipScenario", 50, func(int) int { return 10 }, 5},
		{"OneRunEach", 50, func(int) int { return 1 }, 5},
		// Every other key has a single run, so keys served ahead of the
		// discovery cursor leave ckIndex as it sweeps.
		{"SingleRunEveryOtherKey", 50, func(i int) int { return 1 + i%2 }, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rolloutBackends(t, func(t *testing.T, c redis.UniversalClient, _ *miniredis.Miniredis) {
				p := newVPPool(t, c).get(vpConfig{})
				t0 := p.clock.Now().Add(-time.Hour)
				total := 0
				for i := 0; i < tc.keys; i++ {
					for k := 0; k < tc.runs(i); k++ {
						p.enqAt(t, p.off, vpKey(i), t0.Add(time.Duration(100*i+k)*time.Millisecond))
						total++
					}
				}
				bound := (tc.keys+tc.maxCount-1)/tc.maxCount + 1
				first := map[string]int{}
				seen := map[string]bool{}
				calls := 0
				for len(seen) < total {
					calls++
					require.LessOrEqual(t, calls, total+1, "the backlog does not drain")
					runs := p.deq(t, p.on, tc.maxCount)
					require.NotEmpty(t, runs, "call %d served nothing with %d runs left", calls, total-len(seen))
					for _, r := range runs {
						require.False(t, seen[r.ID], "%s served twice", r.ID)
						seen[r.ID] = true
						if _, ok := first[r.Key]; !ok {
							first[r.Key] = calls
						}
					}
					p.ack(t, runs...)
				}
				var late []string
				for i := 0; i < tc.keys; i++ {
					if c := first[vpKey(i)]; c > bound {
						late = append(late, fmt.Sprintf("%s at call %d", vpKey(i), c))
					}
				}
				require.Empty(t, late, "keys first served after call %d", bound)
			})
		})
	}
}

// vtimeState is the value and remaining TTL of each scheduler key of p's
// queue that exists.
type vtimeState struct {
	values map[string]string
	pttl   map[string]time.Duration
}

func readVtimeState(t *testing.T, p *vp) vtimeState {
	st := vtimeState{values: map[string]string{}, pttl: map[string]time.Duration{}}
	for k, v := range p.bundle().dump(t) {
		if strings.Contains(k, "ckVtime") || strings.HasSuffix(k, ":weights") {
			st.values[k] = v
			ttl, err := p.c.PTTL(p.ctx, k).Result()
			require.NoError(t, err)
			st.pttl[k] = ttl
		}
	}
	return st
}

// TestRolloutFlagOffAgain: after a stretch with the flag on (weights,
// keys draining and coming back, parked tags), the flag goes off. The
// scheduler's keys are then inert: a flag-off instance serves in age order
// whatever they say, and neither changes them nor refreshes their TTL
// through any operation. Then they expire: every one has a TTL of at most
// StateTTL (the weights hash excepted: weights are configuration), and on
// miniredis moving past StateTTL leaves none of them.
func TestRolloutFlagOffAgain(t *testing.T) {
	t.Parallel()
	rolloutBackends(t, func(t *testing.T, c redis.UniversalClient, mini *miniredis.Miniredis) {
		p := newVPPool(t, c).get(vpConfig{MaxAttempts: 2})
		// Flag on: keys come and go.
		p.setWeight(t, "w", 3)
		p.enq(t, p.on, "a", 3, 0, 0)
		p.enq(t, p.on, "b", 1, 0, 0)
		p.enq(t, p.on, "w", 4, 0, 0)
		p.ack(t, p.deq(t, p.on, 4)...)
		for p.ready(t, "a")+p.ready(t, "w") > 0 {
			p.ack(t, p.deq(t, p.on, 2)...)
		}
		p.clock.Advance(time.Minute)
		p.enq(t, p.on, "c", 2, 0, 0)
		p.enq(t, p.on, "d", 2, 0, 0)
		p.ack(t, p.deq(t, p.on, 1)...) // c served once: d now has the lower tag
		before := readVtimeState(t, p)
		require.Contains(t, before.values, p.qk.CkVtime())
		require.Contains(t, before.values, p.qk.CkVtimeState())
		require.Contains(t, before.values, p.qk.Weights())

		// Flag off: an old run of a new key, then every operation.
		old := p.enqAt(t, p.off, "x", p.clock.Now().Add(-time.Hour))
		ttlRun := p.enq(t, p.off, "y", 1, 0, 0)[0]
		_, err := p.off.Enqueue(p.ctx, runqueue.EnqueueParams{Env: vpEnv, Queue: p.queue, Key: "y", ID: "short",
			Payload: []byte("short"), TTL: time.Second})
		require.NoError(t, err)
		p.enq(t, p.off, "z", 1, time.Second, 9)
		// Age order: x (an hour old), then c (its second run is older than
		// d's runs; the tags would pick d), d, d, then y.
		runs := p.deq(t, p.off, 4)
		require.Equal(t, []string{"x", "c", "d", "d"}, byKeys(runs))
		require.Equal(t, old, runs[0].ID)
		require.NoError(t, p.off.ExtendLease(p.ctx, runs[0], time.Minute))
		p.ack(t, runs[0])
		res, err := p.off.Nack(p.ctx, runs[1], &runqueue.NackOptions{DeadLetter: true})
		require.NoError(t, err)
		require.False(t, res.Requeued)
		require.NoError(t, p.off.Redrive(p.ctx, vpEnv, p.queue, "c", runs[1].ID))
		_, err = p.off.Nack(p.ctx, runs[2], &runqueue.NackOptions{RetryAt: p.clock.Now()})
		require.NoError(t, err)
		p.clock.Advance(2 * time.Second) // "short" expires, z comes due
		n, err := p.off.ExpireTTL(p.ctx, p.off.ShardOf(vpEnv), 100)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		p.clock.Advance(10 * time.Minute) // runs[3]'s lease passes
		n, err = p.off.RecoverLeases(p.ctx, p.off.ShardOf(vpEnv), 100)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		shard, err := p.off.DequeueShard(p.ctx, p.off.ShardOf(vpEnv), 2)
		require.NoError(t, err)
		require.Len(t, shard, 2)
		p.ack(t, shard...)
		rest := p.deq(t, p.off, 10)
		p.ack(t, rest...)
		var ids []string
		for _, r := range append(shard, rest...) {
			ids = append(ids, r.ID)
		}
		require.Contains(t, ids, ttlRun)

		after := readVtimeState(t, p)
		require.Equal(t, before.values, after.values, "flag-off operations changed the scheduler's keys")
		for k, ttl := range after.pttl {
			require.LessOrEqual(t, ttl, before.pttl[k], "%s: TTL refreshed by a flag-off instance", k)
		}

		// Then they expire.
		stateTTL := p.on.Config().StateTTL
		for k, ttl := range after.pttl {
			if k == p.qk.Weights() {
				continue
			}
			require.Positive(t, ttl, "%s has no TTL: it never expires", k)
			require.LessOrEqual(t, ttl, stateTTL, k)
		}
		if mini != nil {
			mini.FastForward(stateTTL + time.Second)
			left := readVtimeState(t, p)
			delete(left.values, p.qk.Weights())
			require.Empty(t, left.values, "scheduler keys left after StateTTL")
		}
	})
}

// TestRolloutFlagOffNeverWritesVtime: a flag-off instance goes through
// every operation (enqueue ready, delayed, with priority and TTL; dequeue
// by queue, by shard and blocking; extend; ack; nack; dead letter; redrive;
// lease recovery; TTL expiry) on a fresh queue; no scheduler key ever
// appears.
func TestRolloutFlagOffNeverWritesVtime(t *testing.T) {
	t.Parallel()
	rolloutBackends(t, func(t *testing.T, c redis.UniversalClient, _ *miniredis.Miniredis) {
		p := newVPPool(t, c).get(vpConfig{MaxAttempts: 5})
		q := p.off
		names := []string{p.qk.CkVtime(), p.qk.CkVtimeState(), p.qk.Weights()}
		check := func(step string) {
			n, err := c.Exists(p.ctx, names...).Result()
			require.NoError(t, err)
			require.Zero(t, n, "after %s", step)
		}
		p.enq(t, q, "a", 3, 0, 0)
		p.enq(t, q, "b", 2, 0, 9)
		p.enq(t, q, "c", 2, 5*time.Second, 0)
		_, err := q.Enqueue(p.ctx, runqueue.EnqueueParams{Env: vpEnv, Queue: p.queue, Key: "d", ID: "ttl",
			TTL: 2 * time.Second})
		require.NoError(t, err)
		check("enqueue")
		runs := p.deq(t, q, 3)
		require.Len(t, runs, 3)
		check("dequeue")
		require.NoError(t, q.ExtendLease(p.ctx, runs[0], time.Minute))
		check("extend")
		p.ack(t, runs[0])
		check("ack")
		_, err = q.Nack(p.ctx, runs[1], &runqueue.NackOptions{RetryAt: p.clock.Now().Add(time.Second)})
		require.NoError(t, err)
		check("nack")
		_, err = q.Nack(p.ctx, runs[2], &runqueue.NackOptions{DeadLetter: true})
		require.NoError(t, err)
		check("dead letter")
		require.NoError(t, q.Redrive(p.ctx, vpEnv, p.queue, runs[2].Key, runs[2].ID))
		check("redrive")
		p.clock.Advance(3 * time.Second)
		n, err := q.ExpireTTL(p.ctx, q.ShardOf(vpEnv), 100)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		check("expire")
		held, err := q.DequeueShard(p.ctx, q.ShardOf(vpEnv), 2)
		require.NoError(t, err)
		require.Len(t, held, 2)
		check("dequeue by shard")
		p.clock.Advance(10 * time.Minute) // leases pass; c comes due
		n, err = q.RecoverLeases(p.ctx, q.ShardOf(vpEnv), 100)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		check("lease recovery")
		for {
			got, err := q.DequeueWait(p.ctx, vpEnv, p.queue, 2, 100*time.Millisecond)
			require.NoError(t, err)
			if len(got) == 0 {
				break
			}
			check("blocking dequeue")
			p.ack(t, got...)
			check("ack")
			st, err := q.QueueStats(p.ctx, vpEnv, p.queue)
			require.NoError(t, err)
			if st.Ready+st.Delayed == 0 {
				break
			}
		}
		st, err := q.QueueStats(p.ctx, vpEnv, p.queue)
		require.NoError(t, err)
		require.Equal(t, runqueue.Stats{}, st)
		require.Empty(t, vtimeKeysOf(t, p.bundle()))
	})
}

// TestRolloutStaleTags: the flag-on instance registered keys, then a
// flag-off instance drained them (during a rolling deploy, or while the
// flag was off again for less than StateTTL): their tags stay in ckVtime,
// below V once the clock moves on. When the flag-on instance serves again,
// a light key L (no debt: registered at V) and a key U written by a
// flag-off instance must each be served within one serve per other active
// key (H, L, U: 3 calls of maxCount 1), whatever the backlog of an old
// heavy key H.
func TestRolloutStaleTags(t *testing.T) {
	t.Parallel()
	rolloutBackends(t, func(t *testing.T, c redis.UniversalClient, _ *miniredis.Miniredis) {
		p := newVPPool(t, c).get(vpConfig{})
		for i := 0; i < 12; i++ {
			p.enq(t, p.on, fmt.Sprintf("s%02d", i), 1, 0, 0)
		}
		p.ack(t, p.deq(t, p.off, 20)...) // drained by a flag-off instance
		p.enq(t, p.on, "x", 4, 0, 0)
		for p.ready(t, "x") > 0 {
			p.ack(t, p.deq(t, p.on, 4)...)
		}
		require.Greater(t, p.v(t), 0.0)
		// The flag-on dequeues that served x collected the tags the
		// flag-off drain left behind (variants without a ready run).
		index := map[string]bool{}
		for _, m := range p.c.ZRange(p.ctx, p.qk.CkIndex(), 0, -1).Val() {
			index[m] = true
		}
		for _, e := range p.tags(t) {
			require.True(t, index[e.Member], "stale tag %v left in ckVtime", e)
		}
		// Leave a fresh set of stale tags for the calls below.
		for i := 0; i < 12; i++ {
			p.enq(t, p.on, fmt.Sprintf("t%02d", i), 1, 0, 0)
		}
		p.ack(t, p.deq(t, p.off, 20)...)
		require.Len(t, p.tags(t), 12, "tags left behind by a flag-off drain")

		past := p.clock.Now().Add(-time.Hour)
		for i := 0; i < 50; i++ {
			p.enqAt(t, p.on, "H", past.Add(time.Duration(i)*time.Millisecond))
		}
		p.enq(t, p.on, "L", 1, 0, 0)
		p.enq(t, p.off, "U", 1, 0, 0)
		first := map[string]int{}
		for call := 1; call <= 3; call++ {
			runs := p.deq(t, p.on, 1)
			for _, r := range runs {
				if _, ok := first[r.Key]; !ok {
					first[r.Key] = call
				}
			}
			p.ack(t, runs...)
		}
		keys := make([]string, 0, len(first))
		for k := range first {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		require.Equal(t, []string{"H", "L", "U"}, keys, "keys served in the first 3 calls")
	})
}
