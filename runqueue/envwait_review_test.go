package runqueue_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// helper-203's read of the env's waiting line (lua/lib/envwait.lua): each
// test here failed on the first version of the line.

// TestEnvWaitingFullRedis: on a full Redis (maxmemory, noeviction) a
// script run by EVALSHA (ScriptsOnly here; Redis 6.2, or FUNCTION LOAD
// refused) is refused at its first write that may add memory. A held
// flag-on dequeue wrote its mark (HINCRBY, HSET) as its first write and
// failed with OOM, and DequeueShard stopped there, serving no other env's
// runs; the marks are best effort now (pcall): a held dequeue returns
// nothing, as with the flag off, and the shard call serves the other env.
func TestEnvWaitingFullRedis(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			srv := s17Spawn(t)
			admin := srv.admin()
			ctx := context.Background()
			b := setup(t, admin, func(cfg *runqueue.Config) {
				cfg.ScriptsOnly = true
				cfg.VtimeScheduling = on
				cfg.Shards = 1
				cfg.LimitsFor = func(e, _ string) runqueue.Limits {
					if e == "e1" {
						return runqueue.Limits{Env: 1}
					}
					return runqueue.Limits{}
				}
			})
			payload := []byte(strings.Repeat("p", 1000))
			for i := range 60 {
				q := "qa"
				if i%2 == 1 {
					q = "qb"
				}
				_, err := b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: "e1", Queue: q, Key: "k", ID: fmt.Sprint("r", i), Payload: payload})
				require.NoError(t, err)
				b.clock.Advance(1)
			}
			for i := range 40 {
				_, err := b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: "e2", Queue: "q", Key: "k", ID: fmt.Sprint("s", i), Payload: payload})
				require.NoError(t, err)
			}
			a, err := b.q.Dequeue(ctx, "e1", "qa", 1)
			require.NoError(t, err)
			require.Len(t, a, 1)
			used := s28wUsedMemory(t, admin)
			require.NoError(t, admin.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used-30_000, 10)).Err())
			t.Cleanup(func() { _ = admin.ConfigSet(context.Background(), "maxmemory", "0").Err() })
			_, err = b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: "e1", Queue: "qa", ID: "more", Payload: payload})
			require.ErrorContains(t, err, "OOM", "Redis is full")

			runs, err := b.q.Dequeue(ctx, "e1", "qb", 1)
			require.NoError(t, err, "a held dequeue on a full Redis")
			require.Empty(t, runs)
			served := 0
			for range 5 {
				runs, err := b.q.DequeueShard(ctx, 0, 10)
				require.NoError(t, err)
				for _, r := range runs {
					require.NoError(t, b.q.Ack(ctx, r))
				}
				served += len(runs)
			}
			require.Equal(t, 40, served, "e2's runs, beside e1 at its limit, on a full Redis")
		})
	}
}

// TestEnvWaitingDeclinedSlotWakesNext: a waiting queue left a slot it
// cannot use (its ready runs are all of a key at its KeyConcurrency) drops
// its mark and wakes the queue behind it, which left it the slot; before,
// nobody was woken and the slot stayed idle until that queue's poll.
func TestEnvWaitingDeclinedSlotWakesNext(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, func(cfg *runqueue.Config) {
			cfg.VtimeScheduling = true
			cfg.BlockPollInterval = 30 * time.Second
			cfg.LimitsFor = func(_, q string) runqueue.Limits {
				if q == "qb" {
					return runqueue.Limits{Env: 2, Key: 1}
				}
				return runqueue.Limits{Env: 2}
			}
		})
		sp, err := keys.NewSpace(b.prefix, b.q.Shards())
		require.NoError(t, err)
		wake := sp.Shard(sp.ShardOf(env)).Wake()
		// (a cluster's pub/sub reaches a subscriber on any node)
		ps := c.Subscribe(b.ctx, wake)
		defer ps.Close()
		_, err = ps.Receive(b.ctx)
		require.NoError(t, err)
		ch := ps.Channel()
		// wakes returns the wake-ups published since the last call: a
		// sentinel published after them comes after them.
		wakes := func(tag string) []string {
			require.NoError(t, c.Publish(b.ctx, wake, tag).Err())
			var got []string
			for m := range ch {
				if m.Payload == tag {
					break
				}
				got = append(got, m.Payload)
			}
			return got
		}
		ewEnqueue(t, b, "qa", 5)
		for i := range 3 {
			_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: "qb", Key: "k", ID: fmt.Sprintf("qb-%03d", i)})
			require.NoError(t, err)
		}
		require.Len(t, ewTake(t, b, nil, "qb"), 1) // k at its limit from now on
		a := ewTake(t, b, nil, "qa")
		require.Len(t, a, 1) // the env's 2 slots taken
		require.Empty(t, ewTake(t, b, nil, "qb"))
		require.True(t, ewMarked(t, b, "qb"))
		wakes("s1")
		require.Empty(t, ewTake(t, b, a, "qa"), "qa's freed slot is left to qb")
		require.True(t, ewMarked(t, b, "qa"), "qa waits behind qb")
		require.Contains(t, wakes("s2"), keys.QueueMember(env, "qb"))
		// qb, woken, takes nothing (k at its limit), drops its mark, and
		// passes the slot on.
		require.Empty(t, ewTake(t, b, nil, "qb"))
		require.False(t, ewMarked(t, b, "qb"))
		require.Contains(t, wakes("s3"), keys.QueueMember(env, "qa"), "the queue behind is woken for the slot")
		require.Len(t, ewTake(t, b, nil, "qa"), 1)
	})
}

// TestEnvWaitingClocks: marks live by Redis's clock (TIME), not their
// writers': a consumer an hour ahead or 10 s behind writes marks the
// others see for the writer's life; the hash lives as long as its
// longest-lived mark, not the last writer's (a 100 ms poll's 1.2 s cut a
// 60 s poll's 121 s mark before).
func TestEnvWaitingClocks(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b, waiting := ewSetup(t, c, true, 1)
		aheadClock, behindClock := newFakeClock(), newFakeClock()
		aheadClock.Advance(time.Hour)
		b.clock.Advance(10 * time.Second)
		ahead := ewPeer(t, b, aheadClock, time.Minute, 1)            // life 121 s
		behind := ewPeer(t, b, behindClock, 100*time.Millisecond, 1) // life 1.2 s
		ewEnqueue(t, b, "qa", 5)
		ewEnqueue(t, b, "qb", 1)
		ewEnqueue(t, b, "qc", 1)
		a := ewTake(t, b, nil, "qa")
		require.Len(t, a, 1)
		before := ewServerMs(t, b)
		r, err := ahead.Dequeue(b.ctx, env, "qb", 1)
		require.NoError(t, err)
		require.Empty(t, r)
		r, err = behind.Dequeue(b.ctx, env, "qc", 1)
		require.NoError(t, err)
		require.Empty(t, r)
		after := ewServerMs(t, b)
		u := ewUntil(t, b, "qb")
		require.GreaterOrEqual(t, u, before+121_000)
		require.LessOrEqual(t, u, after+121_000, "an hour ahead's mark is Redis's clock plus its life")
		for _, k := range []string{waiting, ewSpace(t, b).Env(env).WaitingUntil()} {
			require.Greater(t, b.client.PTTL(b.ctx, k).Val(), 100*time.Second, "the line lives as long as qb's mark")
		}
		// qc's mark (the writer 10 s behind) is live: qa leaves the slot
		// its ack frees to qb, the older of the two.
		require.Empty(t, ewTake(t, b, a, "qa"))
		require.True(t, ewMarked(t, b, "qc"))
		r, err = ahead.Dequeue(b.ctx, env, "qb", 1)
		require.NoError(t, err)
		require.Len(t, r, 1)
	})
}

// TestEnvWaitingLongLine: the line has no bound, and a call reads only as
// many marks ahead of it as the env has free slots (an earlier version read
// it whole, then held it to 64 queues, which starved the queues outside):
// env limit 1, 70 queues with backlogs, each consumer acking and taking one
// run a call in turn; the first 70 serves go to 70 queues, in the order
// they found the env full.
func TestEnvWaitingLongLine(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b, waiting := ewSetup(t, c, true, 1)
		name := func(i int) string { return fmt.Sprintf("q%02d", i) }
		for i := range 70 {
			ewEnqueue(t, b, name(i), 3)
		}
		held := map[string][]*runqueue.Run{}
		var order []string
		// (one serve a round of 70 calls: the env's one slot goes from the
		// queue that acks to the next in the line, which calls next)
		for round := 0; len(order) < 70 && round < 75; round++ {
			for i := range 70 {
				q := name(i)
				runs := ewTake(t, b, held[q], q)
				held[q] = runs
				for range runs {
					order = append(order, q)
				}
			}
			if round == 0 {
				require.Equal(t, int64(69), b.client.ZCard(b.ctx, waiting).Val(), "every queue but the one served waits")
			}
		}
		require.GreaterOrEqual(t, len(order), 70)
		seen := map[string]bool{}
		for i, q := range order[:70] {
			require.False(t, seen[q], "%s served twice in the first 70 serves: %v", q, order[:i+1])
			seen[q] = true
		}
		require.Equal(t, name(0), order[0])
		require.Equal(t, name(1), order[1], "the slot goes to the line's first")
	})
}
