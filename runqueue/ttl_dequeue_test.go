package runqueue_test

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
	"github.com/runqueue/runqueue/vtime"
)

// TestDequeueExpiresPastTTL: a dequeue never delivers a run whose TTL
// passed before the sweep came to it. The runs it takes past their TTL are
// deleted as the sweep would (told to the Observer as expired, their ids
// free again) and take no slot; the others are served as before.
func TestDequeueExpiresPastTTL(t *testing.T) {
	forEachFlagWith(t, func(c *runqueue.Config) { c.Observer = &recorder{} }, func(t *testing.T, b *testBundle, on bool) {
		rec := b.cfg.Observer.(*recorder)
		shard := b.q.ShardOf(env)
		enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "short", TTL: 10 * time.Second})
		b.clock.Advance(time.Millisecond)
		enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: "none"})
		b.clock.Advance(time.Millisecond)
		enqueue(t, b, runqueue.EnqueueParams{Key: "c", ID: "long", TTL: time.Minute})
		b.clock.Advance(time.Millisecond)
		enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "short2", TTL: 10 * time.Second})
		b.clock.Advance(10 * time.Second)

		runs := dequeue(t, b, queueName, 10)
		require.ElementsMatch(t, []string{"none", "long"}, runIDs(runs))
		require.Equal(t, runqueue.Stats{InFlight: 2}, queueStats(t, b, queueName))
		for _, id := range []string{"short", "short2"} {
			_, _, _, err := b.q.RecordOf(b.ctx, env, queueName, id)
			require.Error(t, err, "%s's record is gone", id)
		}
		// Their TTL entries went with them: the sweep finds nothing.
		n, err := b.q.ExpireTTL(b.ctx, shard, 100)
		require.NoError(t, err)
		require.Zero(t, n)
		require.Zero(t, b.client.ZCard(b.ctx, keySpace(t, b).Shard(shard).TTL()).Val(), "ttl entries left")
		events := rec.take()
		require.Contains(t, events, "expired "+env+"/"+queueName+" 2")
		for _, e := range events {
			require.NotContains(t, e, "short", "an expired run reported as dequeued")
		}
		// An expired id is free again, and the key's slot was never taken.
		enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "short"})
		require.Equal(t, []string{"short"}, runIDs(dequeue(t, b, queueName, 10)))
		ackAll(t, b, runs)
		require.Equal(t, runqueue.Stats{InFlight: 1}, queueStats(t, b, queueName))
	})
}

// TestDequeueExpiredThenServesBehind: a Dequeue whose runs taken all
// passed their TTL does not read as an idle queue: it calls again and
// serves the run behind them, in the same Dequeue, on every path that
// serves (a coalesced or serial Dequeue, AckAndDequeue, DequeueShard).
func TestDequeueExpiredThenServesBehind(t *testing.T) {
	paths := map[string]func(t *testing.T, b *testBundle) []*runqueue.Run{
		"Dequeue": func(t *testing.T, b *testBundle) []*runqueue.Run { return dequeue(t, b, queueName, 1) },
		"AckAndDequeue": func(t *testing.T, b *testBundle) []*runqueue.Run {
			runs, _, err := b.q.AckAndDequeue(b.ctx, nil, env, queueName, 1)
			require.NoError(t, err)
			return runs
		},
		"DequeueShard": func(t *testing.T, b *testBundle) []*runqueue.Run {
			runs, err := b.q.DequeueShard(b.ctx, b.q.ShardOf(env), 1)
			require.NoError(t, err)
			return runs
		},
	}
	for name, serve := range paths {
		t.Run(name, func(t *testing.T) {
			forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
				for i := range 3 {
					enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "old" + string(rune('0'+i)), TTL: time.Second})
					b.clock.Advance(time.Millisecond)
				}
				enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "fresh"})
				b.clock.Advance(time.Second)
				require.Equal(t, []string{"fresh"}, runIDs(serve(t, b)))
				require.Equal(t, runqueue.Stats{InFlight: 1}, queueStats(t, b, queueName))
			})
		})
	}
}

// TestDequeueExpiredAtKeyLimit: a run past its TTL at the head of a key
// with a limit of 1 is swept there: it takes no slot, not even within the
// call, and no turn (flag on, the key is not charged for it), so the key's
// next run is served in the key's place, before b's, and is the only run
// the key counts in flight. (Before the sweep at the head, the expired
// run counted for the key's limit within the call: b1 came first.)
func TestDequeueExpiredAtKeyLimit(t *testing.T) {
	forEachFlagWith(t, func(c *runqueue.Config) { c.KeyConcurrency = 1 }, func(t *testing.T, b *testBundle, on bool) {
		enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "a-old", TTL: time.Second})
		b.clock.Advance(time.Millisecond)
		enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "a-next"})
		b.clock.Advance(time.Millisecond)
		enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: "b1"})
		b.clock.Advance(time.Second)
		require.Equal(t, []string{"a-next", "b1"}, runIDs(dequeue(t, b, queueName, 5)))
		qk := keySpace(t, b).Env(env).Queue(queueName)
		require.Equal(t, "1", b.client.HGet(b.ctx, qk.KeyInflight(), keys.VariantMember("a")).Val(),
			"key a's runs in flight")
		// a is at its limit now.
		enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "a-last"})
		require.Empty(t, dequeue(t, b, queueName, 5))
	})
}

// TestDequeueServesDeliveredPastOldTTL: the TTL binds until the first
// delivery only: a run nacked back (or recovered) after its old deadline
// is served, not expired.
func TestDequeueServesDeliveredPastOldTTL(t *testing.T) {
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "nacked", TTL: 10 * time.Second})
		runs := dequeue(t, b, queueName, 1)
		require.Equal(t, []string{"nacked"}, runIDs(runs))
		_, err := b.q.Nack(b.ctx, runs[0], &runqueue.NackOptions{RetryAt: b.clock.Now()})
		require.NoError(t, err)
		b.clock.Advance(time.Minute)
		again := dequeue(t, b, queueName, 1)
		require.Equal(t, []string{"nacked"}, runIDs(again))
		require.Equal(t, 2, again[0].Attempt)
	})
}

// TestDequeueFillsPastExpired: a Dequeue whose call took runs past their
// TTL and delivered fewer than maxCount calls again for the rest, so a
// call of 2 behind one expired run delivers two runs, and each caller of
// a coalesced send gets its run while runs are ready.
func TestDequeueFillsPastExpired(t *testing.T) {
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "old", TTL: time.Second})
		b.clock.Advance(time.Millisecond)
		for _, id := range []string{"x", "y", "z"} {
			enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: id})
			b.clock.Advance(time.Millisecond)
		}
		b.clock.Advance(time.Second)
		require.Equal(t, []string{"x", "y"}, runIDs(dequeue(t, b, queueName, 2)))
		require.Equal(t, runqueue.Stats{Ready: 1, InFlight: 2, OldestReadyAge: time.Second + time.Millisecond}, queueStats(t, b, queueName))
	})
}

// TestDequeueTTLKeepsKeyShare: a key whose backlog outlives its TTL keeps
// its share of the deliveries (flag on): the dequeue sweeps its runs past
// their TTL at its head without charging it, so its live runs behind them
// are served in its turns, alternating with another key's. (When the dead
// runs were charged as serves, each of a's turns went to one of them: b
// got every delivery until a's 30 dead runs were gone.)
func TestDequeueTTLKeepsKeyShare(t *testing.T) {
	for _, batch := range []int{1, 10} {
		t.Run("batch="+strconv.Itoa(batch), func(t *testing.T) {
			forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
				for i := range 30 {
					enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: fmt.Sprintf("a-dead%02d", i), TTL: time.Second})
				}
				b.clock.Advance(time.Millisecond)
				for i := range 10 {
					enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: fmt.Sprintf("a-live%02d", i)})
					enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: fmt.Sprintf("b-live%02d", i)})
				}
				b.clock.Advance(time.Second)
				var got []string
				for len(got) < 20 {
					runs := dequeue(t, b, queueName, batch)
					require.NotEmpty(t, runs)
					got = append(got, runIDs(runs)...)
					ackAll(t, b, runs)
				}
				if !on {
					// Age order (one millisecond: a's, then b's): every
					// live run, none of the dead.
					var live []string
					for i := range 10 {
						live = append(live, fmt.Sprintf("a-live%02d", i), fmt.Sprintf("b-live%02d", i))
					}
					require.ElementsMatch(t, live, got)
					require.Equal(t, runqueue.Stats{}, queueStats(t, b, queueName))
					return
				}
				for i := 0; i < 20; i += 2 {
					keysOf := []string{got[i][:1], got[i+1][:1]}
					require.ElementsMatch(t, []string{"a", "b"}, keysOf, "serves %d and %d: %v", i, i+1, got)
				}
				require.Equal(t, runqueue.Stats{}, queueStats(t, b, queueName))
			})
		})
	}
}

// TestDequeueSweepsBeyondTTLLook: with more runs past their TTL than a
// call sweeps (vtime.TTLLook), the call sweeps that many at the head,
// takes the next as a run (deleted, not delivered, counted for maxCount)
// and calls again for the rest: every dead run is gone, both live runs are
// delivered, in one Dequeue, and the Observer hears of each expiry once.
func TestDequeueSweepsBeyondTTLLook(t *testing.T) {
	forEachFlagWith(t, func(c *runqueue.Config) { c.Observer = &s17ExpiredCount{} }, func(t *testing.T, b *testBundle, on bool) {
		expired := b.cfg.Observer.(*s17ExpiredCount)
		dead := vtime.TTLLook + 50
		for i := range dead {
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: fmt.Sprintf("dead%03d", i), TTL: time.Second})
		}
		b.clock.Advance(time.Millisecond)
		enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "a-live"})
		enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: "b-live"})
		b.clock.Advance(time.Second)
		require.Zero(t, expired.n.Load())
		require.ElementsMatch(t, []string{"a-live", "b-live"}, runIDs(dequeue(t, b, queueName, 2)))
		require.Equal(t, runqueue.Stats{InFlight: 2}, queueStats(t, b, queueName))
		require.Zero(t, b.client.ZCard(b.ctx, keySpace(t, b).Shard(b.q.ShardOf(env)).TTL()).Val(), "ttl entries left")
		require.EqualValues(t, dead, expired.n.Load(), "expiries told to the Observer")
	})
}

// TestDequeueTTLLookMatchesModel: the scripts sweep as many runs past their
// TTL a call as the model (vtime.TTLLook) says.
func TestDequeueTTLLookMatchesModel(t *testing.T) {
	src, err := os.ReadFile("lua/lib/dequeue.lua")
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^local DQ_TTL_LOOK = (\d+)$`).FindSubmatch(src)
	require.NotNil(t, m, "DQ_TTL_LOOK in lib/dequeue.lua")
	require.Equal(t, strconv.Itoa(vtime.TTLLook), string(m[1]))
}
