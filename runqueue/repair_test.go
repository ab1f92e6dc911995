package runqueue_test

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// repairView is what Repair rebuilds of one queue, read from Redis: the
// age and delay indexes with their scores, the depth counts, the queue's
// master score, its runs' TTL entries with their scores and its runs'
// lease members.
type repairView struct {
	ck, delay, ttl map[string]float64
	depth, kin     map[string]string
	master         float64 // 0: none
	leases         []string
}

func readRepairView(t *testing.T, b *testBundle, qk keys.Queue, sh keys.Shard) repairView {
	t.Helper()
	zset := func(key, prefix string) map[string]float64 {
		zs, err := b.client.ZRangeWithScores(b.ctx, key, 0, -1).Result()
		require.NoError(t, err)
		out := map[string]float64{}
		for _, z := range zs {
			if m := z.Member.(string); strings.HasPrefix(m, prefix) {
				out[m] = z.Score
			}
		}
		return out
	}
	v := repairView{ck: zset(qk.CkIndex(), ""), delay: zset(qk.DelayIndex(), ""), ttl: zset(sh.TTL(), qk.RunPrefix())}
	var err error
	v.depth, err = b.client.HGetAll(b.ctx, qk.Depth()).Result()
	require.NoError(t, err)
	v.kin, err = b.client.HGetAll(b.ctx, qk.KeyInflight()).Result()
	require.NoError(t, err)
	v.master, err = b.client.ZScore(b.ctx, sh.Master(), qk.Member()).Result()
	if errors.Is(err, redis.Nil) {
		v.master, err = 0, nil
	}
	require.NoError(t, err)
	for m := range zset(sh.Leases(), qk.RunPrefix()) {
		v.leases = append(v.leases, m)
	}
	v.leases = sortedCopy(v.leases)
	return v
}

// TestRepairRebuildsLostKeys: a queue with ready, delayed, prioritised,
// expiring and in-flight runs over several keys loses its age and delay
// indexes, its depth counts, its keys' in-flight counts, its entry in the
// shard's master index, its runs' TTL entries and their leases (deleted
// by hand, or evicted under AllowEviction), and its age index gets an
// entry for a key without runs. Flag off nothing is served then. Repair writes back exactly what was
// there (the leases with a fresh deadline), a second Repair writes
// nothing, and every run is then served, expired or recovered as before
// the loss.
func TestRepairRebuildsLostKeys(t *testing.T) {
	t.Parallel()
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		qk := keySpace(t, b).Env(env).Queue(queueName)
		sh := keySpace(t, b).Shard(b.q.ShardOf(env))
		t0 := b.clock.Now()
		var all []string
		add := func(p runqueue.EnqueueParams) {
			enqueue(t, b, p)
			all = append(all, p.ID)
			b.clock.Advance(time.Millisecond)
		}
		for i := range 12 {
			add(runqueue.EnqueueParams{ID: "r" + strconv.Itoa(i), Key: "k" + strconv.Itoa(i%4), Priority: i % 3})
		}
		add(runqueue.EnqueueParams{ID: "late1", Key: "k4", Delay: time.Hour})
		add(runqueue.EnqueueParams{ID: "late2", Key: "k5", Delay: 2 * time.Hour})
		add(runqueue.EnqueueParams{ID: "now5", Key: "k5"})
		add(runqueue.EnqueueParams{ID: "ttl1", Key: "k6", TTL: time.Minute})
		add(runqueue.EnqueueParams{ID: "ttl2", Key: "k6", TTL: time.Minute})
		held := dequeue(t, b, queueName, 3)
		require.Len(t, held, 3)
		for _, r := range held {
			require.NotEqual(t, "k6", r.Key, "the expiring runs stay queued")
		}
		want := readRepairView(t, b, qk, sh)
		require.Len(t, want.ttl, 2)
		require.Len(t, want.leases, 3)
		require.Len(t, want.delay, 2)
		require.NotEmpty(t, want.master)
		require.NotEmpty(t, want.kin)

		// The loss.
		require.NoError(t, b.client.Del(b.ctx, qk.CkIndex(), qk.DelayIndex(), qk.Depth(), qk.KeyInflight()).Err())
		require.NoError(t, b.client.ZRem(b.ctx, sh.Master(), qk.Member()).Err())
		for m := range want.ttl {
			require.NoError(t, b.client.ZRem(b.ctx, sh.TTL(), m).Err())
		}
		for _, m := range want.leases {
			require.NoError(t, b.client.ZRem(b.ctx, sh.Leases(), m).Err())
		}
		require.NoError(t, b.client.ZAdd(b.ctx, qk.CkIndex(), redis.Z{Score: 1, Member: keys.VariantMember("ghost")}).Err())
		ghost := 1
		if !on {
			require.Empty(t, dequeue(t, b, queueName, 10), "flag off, a lost age index hides every ready run")
			ghost = 0 // (that call removed the ghost's entry: its ready set is empty)
		}

		now := b.clock.Now()
		res, err := b.q.Repair(b.ctx, env, queueName, nil)
		require.NoError(t, err)
		require.Equal(t, runqueue.RepairResult{Runs: len(all), Keys: 7 + ghost, IndexEntries: len(want.ck) + len(want.delay) + ghost,
			Depth: true, Master: true, TTLEntries: 2, Leases: 3, KeyCounts: len(want.kin)}, res)
		got := readRepairView(t, b, qk, sh)
		require.Equal(t, want, got, "what was lost is back as it was")
		for _, m := range got.leases {
			s, err := b.client.ZScore(b.ctx, sh.Leases(), m).Result()
			require.NoError(t, err)
			require.Equal(t, float64(now.Add(5*time.Minute).UnixMilli()), s, "a lease LeaseDuration (its default) from now")
		}
		again, err := b.q.Repair(b.ctx, env, queueName, nil)
		require.NoError(t, err)
		require.False(t, again.Changed(), "a second Repair writes nothing: %+v", again)
		require.Equal(t, 7, again.Keys, "the ghost's entry went")

		// Everything is served, expired or recovered again.
		b.clock.Advance(t0.Add(2 * time.Minute).Sub(b.clock.Now()))
		n, err := b.q.ExpireTTL(b.ctx, sh.Number(), 100)
		require.NoError(t, err)
		require.Equal(t, 2, n, "the TTL entries expire their runs")
		b.clock.Advance(t0.Add(3 * time.Hour).Sub(b.clock.Now()))
		n, err = b.q.RecoverLeases(b.ctx, sh.Number(), 100)
		require.NoError(t, err)
		require.Equal(t, 3, n, "the leases recover their runs")
		var served []string
		for {
			runs := dequeue(t, b, queueName, 5)
			if len(runs) == 0 {
				break
			}
			served = append(served, runIDs(runs)...)
			ackAll(t, b, runs)
		}
		require.ElementsMatch(t, all[:len(all)-2], served, "every run but the expired ones, once")
		s := queueStats(t, b, queueName)
		require.Zero(t, s.Ready+s.Delayed+s.InFlight)
	})
}

// TestRepairReadOnlyAndBadInput: a ReadOnly Queue refuses, and bad names
// are ErrInvalid, with nothing read or written.
func TestRepairReadOnlyAndBadInput(t *testing.T) {
	t.Parallel()
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		_, err := b.q.Repair(b.ctx, "", queueName, nil)
		require.ErrorIs(t, err, runqueue.ErrInvalid)
		_, err = b.q.Repair(b.ctx, env, "bad\nname", nil)
		require.ErrorIs(t, err, runqueue.ErrInvalid)
		ro, err := runqueue.New(b.ctx, b.client, &runqueue.Config{Prefix: b.prefix, ReadOnly: true, VtimeScheduling: on})
		require.NoError(t, err)
		defer ro.Close()
		_, err = ro.Repair(b.ctx, env, queueName, nil)
		require.ErrorIs(t, err, runqueue.ErrReadOnly)
		res, err := b.q.Repair(b.ctx, env, queueName, nil)
		require.NoError(t, err)
		require.Equal(t, runqueue.RepairResult{}, res, "an empty queue: nothing to read or write")
	})
}

// TestRepairWideHeld: a queue with 80 runs in flight, whose held hash has
// the wide mark (a field that is no run), loses its leases; Repair adds
// one for each run and none for the mark, and RecoverLeases then recovers
// all 80.
func TestRepairWideHeld(t *testing.T) {
	t.Parallel()
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		qk := keySpace(t, b).Env(env).Queue(queueName)
		sh := keySpace(t, b).Shard(b.q.ShardOf(env))
		ps := make([]runqueue.EnqueueParams, 80)
		for i := range ps {
			ps[i] = runqueue.EnqueueParams{Env: env, Queue: queueName, ID: "w" + strconv.Itoa(i), Key: "k" + strconv.Itoa(i)}
		}
		_, err := b.q.EnqueueMany(b.ctx, ps)
		require.NoError(t, err)
		n := 0
		for n < 80 {
			runs := dequeue(t, b, queueName, 7)
			require.NotEmpty(t, runs)
			n += len(runs)
		}
		require.True(t, b.client.HExists(b.ctx, qk.Held(), "~").Val(), "the held hash is wide")
		require.NoError(t, b.client.Del(b.ctx, sh.Leases()).Err())
		res, err := b.q.Repair(b.ctx, env, queueName, nil)
		require.NoError(t, err)
		require.Equal(t, 80, res.Leases)
		require.EqualValues(t, 80, b.client.ZCard(b.ctx, sh.Leases()).Val())
		b.clock.Advance(time.Hour)
		got, err := b.q.RecoverLeases(b.ctx, sh.Number(), 1000)
		require.NoError(t, err)
		require.Equal(t, 80, got)
		require.Len(t, dequeue(t, b, queueName, 100), 80)
	})
}

// TestRepairOrphans: runs whose set was lost (a key's ready set, another
// key's delayed set, the queue's dead letters) keep their records, but
// nothing serves them and their ids stay taken. Repair queues each again
// as its record says (the same ready scores, priority included; the
// delayed run delayed until its time), or dead-letters them all with
// DeadLetterOrphans; the dead count follows the dead letters; the run in
// flight is left alone.
func TestRepairOrphans(t *testing.T) {
	t.Parallel()
	for _, kill := range []bool{false, true} {
		t.Run(fmt.Sprintf("dead=%v", kill), func(t *testing.T) {
			t.Parallel()
			forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
				qk := keySpace(t, b).Env(env).Queue(queueName)
				enqueue(t, b, runqueue.EnqueueParams{ID: "x0", Key: "k2"})
				b.clock.Advance(time.Millisecond)
				enqueue(t, b, runqueue.EnqueueParams{ID: "h0", Key: "k3"})
				b.clock.Advance(time.Millisecond)
				x0 := dequeue(t, b, queueName, 1)
				require.Equal(t, []string{"x0"}, runIDs(x0))
				_, err := b.q.Nack(b.ctx, x0[0], &runqueue.NackOptions{DeadLetter: true})
				require.NoError(t, err)
				require.Equal(t, []string{"h0"}, runIDs(dequeue(t, b, queueName, 1)))
				enqueue(t, b, runqueue.EnqueueParams{ID: "r0", Key: "k0", TTL: time.Hour})
				b.clock.Advance(time.Millisecond)
				enqueue(t, b, runqueue.EnqueueParams{ID: "r1", Key: "k0", Priority: 2})
				enqueue(t, b, runqueue.EnqueueParams{ID: "d0", Key: "k1", Delay: time.Hour})
				zs := func(key string) []redis.Z {
					z, err := b.client.ZRangeWithScores(b.ctx, key, 0, -1).Result()
					require.NoError(t, err)
					return z
				}
				ready, delayed := zs(qk.Variant("k0").Ready()), zs(qk.Variant("k1").Delayed())
				require.Len(t, ready, 2)
				require.Len(t, delayed, 1)
				require.NoError(t, b.client.Del(b.ctx, qk.Variant("k0").Ready(), qk.Variant("k1").Delayed(), qk.Dead()).Err())
				_, err = b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, ID: "r0", Key: "k0"})
				require.NoError(t, err) // (answered as queued already: its record is there)

				res, err := b.q.Repair(b.ctx, env, queueName, &runqueue.RepairOptions{DeadLetterOrphans: kill})
				require.NoError(t, err)
				require.Equal(t, 4, res.Orphans, "r0, r1, d0 and the dead x0")
				require.Zero(t, res.OrphansExpired)
				if kill {
					require.Equal(t, 4, res.OrphansDead)
				} else {
					require.Zero(t, res.OrphansDead, "x0 died by request, at attempt 2 of 5")
				}
				require.True(t, res.Dead, "the dead count follows the dead letters")
				again, err := b.q.Repair(b.ctx, env, queueName, nil)
				require.NoError(t, err)
				require.False(t, again.Changed(), "%+v", again)
				s := queueStats(t, b, queueName)
				es, err := b.q.EnvStats(b.ctx, env)
				require.NoError(t, err)
				require.EqualValues(t, 1, s.InFlight, "h0 left alone")
				if kill {
					rec, err := b.client.HGet(b.ctx, qk.Runs(), "r0").Result()
					require.NoError(t, err)
					require.True(t, strings.HasPrefix(rec, "0|"), "a dead letter's record has no deadline: %q", rec)
					sh := keySpace(t, b).Shard(b.q.ShardOf(env))
					require.Zero(t, b.client.ZScore(b.ctx, sh.TTL(), qk.RunPrefix()+keys.VariantMember("k0")+":r0").Val(),
						"nor a TTL entry")
					require.EqualValues(t, 4, s.Dead)
					require.EqualValues(t, 4, es.Dead)
					require.Zero(t, s.Ready+s.Delayed)
					dead, err := b.q.DeadLetters(b.ctx, env, queueName, 0, 10)
					require.NoError(t, err)
					var ids []string
					for _, d := range dead {
						ids = append(ids, d.ID)
					}
					require.ElementsMatch(t, []string{"r0", "r1", "d0", "x0"}, ids)
					return
				}
				require.Zero(t, s.Dead)
				require.Zero(t, es.Dead)
				require.EqualValues(t, 3, s.Ready)
				require.EqualValues(t, 1, s.Delayed)
				require.Equal(t, ready, zs(qk.Variant("k0").Ready()), "r0 and r1 as they were")
				require.Equal(t, delayed, zs(qk.Variant("k1").Delayed()), "d0 as it was")
				runs := dequeue(t, b, queueName, 10)
				got := map[string]int{}
				for _, r := range runs {
					got[r.ID] = r.Attempt
				}
				require.Equal(t, map[string]int{"r1": 1, "r0": 1, "x0": 2}, got, "the lost runs are served, x0 at its next attempt")
				b.clock.Advance(time.Hour)
				require.Equal(t, []string{"d0"}, runIDs(dequeue(t, b, queueName, 10)))
			})
		})
	}
}

// TestRepairKinAfterHeldLoss: a queue's held hash is lost while run A is
// in flight (key limit 2), and B is served after it. A's lease stands for
// A's slot, which lease recovery releases: Repair must count it (kin is
// 2, as it should be) and leave A to lease recovery, not queue it again.
// Counting the held runs alone (a first version, helper-146) set kin to 1,
// recovery then took it to 0, and the key ran 3 runs under its limit of 2.
func TestRepairKinAfterHeldLoss(t *testing.T) {
	t.Parallel()
	forEachFlagWith(t, func(cfg *runqueue.Config) { cfg.KeyConcurrency = 2 }, func(t *testing.T, b *testBundle, _ bool) {
		qk := keySpace(t, b).Env(env).Queue(queueName)
		sh := keySpace(t, b).Shard(b.q.ShardOf(env))
		for i := range 4 {
			enqueue(t, b, runqueue.EnqueueParams{ID: "a" + strconv.Itoa(i), Key: "k"})
			b.clock.Advance(time.Millisecond)
		}
		require.Equal(t, []string{"a0"}, runIDs(dequeue(t, b, queueName, 1)))
		require.NoError(t, b.client.Del(b.ctx, qk.Held()).Err())
		b.clock.Advance(3 * time.Minute)
		require.Equal(t, []string{"a1"}, runIDs(dequeue(t, b, queueName, 1)))
		res, err := b.q.Repair(b.ctx, env, queueName, nil)
		require.NoError(t, err)
		require.Zero(t, res.Orphans, "a0 has its lease: lease recovery's")
		require.Zero(t, res.KeyCounts, "k has 2 slots taken: a1's hold and a0's lease")
		require.False(t, res.Changed(), "%+v", res)
		b.clock.Advance(3 * time.Minute) // past a0's lease, not a1's
		n, err := b.q.RecoverLeases(b.ctx, sh.Number(), 100)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Len(t, dequeue(t, b, queueName, 5), 1, "k holds 2 runs in flight at most")
	})
}

// TestRepairForeignMembers: a record's variant member and an index member
// that runqueue does not write ("#k", which names k's sets all the same)
// are not counted as another key: the depth stays, the record's run is
// left as it is and the index member goes (helper-146: depth doubled).
func TestRepairForeignMembers(t *testing.T) {
	t.Parallel()
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		qk := keySpace(t, b).Env(env).Queue(queueName)
		for i := range 3 {
			enqueue(t, b, runqueue.EnqueueParams{ID: "a" + strconv.Itoa(i), Key: "k"})
		}
		rec, err := b.client.HGet(b.ctx, qk.Runs(), "a0").Result()
		require.NoError(t, err)
		require.NoError(t, b.client.HSet(b.ctx, qk.Runs(), "a0", strings.Replace(rec, "|=k|", "|#k|", 1)).Err())
		require.NoError(t, b.client.ZAdd(b.ctx, qk.DelayIndex(), redis.Z{Score: 5, Member: "#k"}).Err())
		res, err := b.q.Repair(b.ctx, env, queueName, nil)
		require.NoError(t, err)
		require.Equal(t, runqueue.RepairResult{Runs: 3, Keys: 1, IndexEntries: 1}, res, "the foreign index member went")
		require.EqualValues(t, 3, queueStats(t, b, queueName).Ready)
		again, err := b.q.Repair(b.ctx, env, queueName, nil)
		require.NoError(t, err)
		require.False(t, again.Changed(), "%+v", again)
	})
}

// TestRepairNothingToMendWrites: a Repair of a queue with nothing to mend
// sends no write, even where the index holds 64 to 128 keys (the wide
// marks' range), so it also runs on a Redis at maxmemory (noeviction),
// where a write that may add memory fails the call (helper-146: two
// writes, and OOM).
func TestRepairNothingToMendWrites(t *testing.T) {
	t.Parallel()
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			c := redistest.Private(t)
			b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = on })
			ps := make([]runqueue.EnqueueParams, 70)
			for i := range ps {
				ps[i] = runqueue.EnqueueParams{Env: env, Queue: queueName, ID: "a" + strconv.Itoa(i), Key: "k" + strconv.Itoa(i),
					TTL: time.Hour}
			}
			_, err := b.q.EnqueueMany(b.ctx, ps)
			require.NoError(t, err)
			require.Len(t, dequeue(t, b, queueName, 3), 3)
			_, err = b.q.Repair(b.ctx, env, queueName, nil)
			require.NoError(t, err)
			require.NoError(t, c.ConfigSet(b.ctx, "maxmemory", "1").Err())
			t.Cleanup(func() { _ = c.ConfigSet(b.ctx, "maxmemory", "0").Err() })
			before, err := redistest.CommandStats(b.ctx, c)
			require.NoError(t, err)
			res, err := b.q.Repair(b.ctx, env, queueName, nil)
			require.NoError(t, err, "nothing to write: no OOM")
			require.False(t, res.Changed(), "%+v", res)
			after, err := redistest.CommandStats(b.ctx, c)
			require.NoError(t, err)
			for name := range after.Sub(before) {
				switch name {
				case "zadd", "zrem", "hset", "hdel", "del", "hincrby", "hsetnx":
					t.Errorf("a Repair with nothing to mend sent %s", name)
				}
			}
		})
	}
}

// TestRepairOrphansPastAttemptsOrTTL: among the runs found in no set, one
// that died for its attempts (its dead letter's entry lost) is
// dead-lettered again, not run a time more, and one whose TTL passed is
// deleted as the TTL sweep would (queued again, it was served after its
// TTL: helper-147), but one in its first delivery whose hold and lease
// were lost is queued again, not deleted (its record keeps its deadline
// through that delivery: helper-148); the others are queued again.
func TestRepairOrphansPastAttemptsOrTTL(t *testing.T) {
	t.Parallel()
	forEachFlagWith(t, func(cfg *runqueue.Config) { cfg.MaxAttempts = 1 }, func(t *testing.T, b *testBundle, _ bool) {
		qk := keySpace(t, b).Env(env).Queue(queueName)
		enqueue(t, b, runqueue.EnqueueParams{ID: "m0", Key: "km"})
		m0 := dequeue(t, b, queueName, 1)
		require.Len(t, m0, 1)
		nr, err := b.q.Nack(b.ctx, m0[0], nil)
		require.NoError(t, err)
		require.False(t, nr.Requeued, "dead at MaxAttempts 1")
		// f0 is in its first delivery (its record keeps its deadline,
		// its TTL entry went at the dequeue) when the held runs and
		// its lease are lost.
		enqueue(t, b, runqueue.EnqueueParams{ID: "f0", Key: "kf", TTL: time.Minute})
		require.Equal(t, []string{"f0"}, runIDs(dequeue(t, b, queueName, 1)))
		enqueue(t, b, runqueue.EnqueueParams{ID: "e0", Key: "ke", TTL: time.Minute})
		enqueue(t, b, runqueue.EnqueueParams{ID: "q0", Key: "kq"})
		require.NoError(t, b.client.Del(b.ctx, qk.Dead(), qk.Variant("ke").Ready(), qk.Variant("kq").Ready(),
			qk.Held()).Err())
		sh := keySpace(t, b).Shard(b.q.ShardOf(env))
		require.NoError(t, b.client.ZRem(b.ctx, sh.Leases(), qk.RunPrefix()+keys.VariantMember("kf")+":f0").Err())
		b.clock.Advance(2 * time.Minute)

		res, err := b.q.Repair(b.ctx, env, queueName, nil)
		require.NoError(t, err)
		require.Equal(t, 4, res.Orphans)
		require.Equal(t, 1, res.OrphansDead, "m0 died for its attempts")
		require.Equal(t, 1, res.OrphansExpired, "e0's TTL passed before a delivery; f0 was delivered")
		require.False(t, b.client.HExists(b.ctx, qk.Runs(), "e0").Val(), "e0 is gone")
		dead, err := b.q.DeadLetters(b.ctx, env, queueName, 0, 10)
		require.NoError(t, err)
		require.Len(t, dead, 1)
		require.Equal(t, "m0", dead[0].ID)
		es, err := b.q.EnvStats(b.ctx, env)
		require.NoError(t, err)
		require.EqualValues(t, 1, es.Dead)
		require.ElementsMatch(t, []string{"q0", "f0"}, runIDs(dequeue(t, b, queueName, 10)))
		again, err := b.q.Repair(b.ctx, env, queueName, nil)
		require.NoError(t, err)
		require.False(t, again.Changed(), "%+v", again)
	})
}

// TestRepairMovesWrongEntry: an age-index entry whose score is not its
// key's oldest ready run's is moved there, and the master score with it
// (on miniredis, whose scores read "2e+12", a comparison by tonumber took
// every score for equal and moved nothing).
func TestRepairMovesWrongEntry(t *testing.T) {
	t.Parallel()
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		qk := keySpace(t, b).Env(env).Queue(queueName)
		sh := keySpace(t, b).Shard(b.q.ShardOf(env))
		enqueue(t, b, runqueue.EnqueueParams{ID: "a0", Key: "k"})
		want := readRepairView(t, b, qk, sh)
		require.NoError(t, b.client.ZAdd(b.ctx, qk.CkIndex(), redis.Z{Score: 3e12, Member: keys.VariantMember("k")}).Err())
		require.NoError(t, b.client.ZAdd(b.ctx, sh.Master(), redis.Z{Score: 3e12, Member: qk.Member()}).Err())
		res, err := b.q.Repair(b.ctx, env, queueName, nil)
		require.NoError(t, err)
		require.Equal(t, runqueue.RepairResult{Runs: 1, Keys: 1, IndexEntries: 1, Master: true}, res)
		require.Equal(t, want, readRepairView(t, b, qk, sh))
	})
}
