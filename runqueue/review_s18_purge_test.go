package runqueue_test

// Review s18: deleting dead letters (DeleteDeadLetter, PurgeDeadLetters),
// the explicit answer to TestS18ChurnDeadLetters' unbounded store. Every
// test is named TestS18Purge*; they run with the flag off and on, on
// miniredis and a real Redis (s16EachFlag), and TestS18PurgeCluster on a
// cluster.

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// s18PurgeKill dead-letters run id (key) of queue, as s17Kill does for
// queueName.
func s18PurgeKill(t *testing.T, b *testBundle, queue, key, id, payload string) {
	t.Helper()
	enqueue(t, b, runqueue.EnqueueParams{Queue: queue, Key: key, ID: id, Payload: []byte(payload)})
	runs := dequeue(t, b, queue, 1)
	require.Len(t, runs, 1)
	require.Equal(t, id, runs[0].ID)
	res, err := b.q.Nack(b.ctx, runs[0], &runqueue.NackOptions{DeadLetter: true})
	require.NoError(t, err)
	require.False(t, res.Requeued)
}

// s18PurgeDeadIDs lists the ids of queue's dead letters, oldest first.
func s18PurgeDeadIDs(t *testing.T, b *testBundle, queue string) []string {
	t.Helper()
	dead, err := b.q.DeadLetters(b.ctx, env, queue, 0, 10000)
	require.NoError(t, err)
	ids := []string{}
	for _, d := range dead {
		ids = append(ids, d.ID)
	}
	return ids
}

// s18PurgeDead requires the dead counts of queueName (QueueStats) and of
// the env (EnvStats), and that the env's dead hash has a field for
// queueName exactly when its count is not 0.
func s18PurgeDead(t *testing.T, b *testBundle, queueDead, envDead int64) {
	t.Helper()
	qs, err := b.q.QueueStats(b.ctx, env, queueName)
	require.NoError(t, err)
	require.Equal(t, queueDead, qs.Dead, "QueueStats.Dead")
	es, err := b.q.EnvStats(b.ctx, env)
	require.NoError(t, err)
	require.Equal(t, envDead, es.Dead, "EnvStats.Dead")
	qk := keySpace(t, b).Env(env).Queue(queueName)
	has, err := b.client.HExists(b.ctx, qk.Env.Dead(), qk.Member()).Result()
	require.NoError(t, err)
	require.Equal(t, queueDead != 0, has, "the env dead hash's field of the queue (deleted at 0)")
}

// s18PurgeHasRecord says whether queueName's runs hash holds id's record.
func s18PurgeHasRecord(t *testing.T, b *testBundle, id string) bool {
	t.Helper()
	qk := keySpace(t, b).Env(env).Queue(queueName)
	has, err := b.client.HExists(b.ctx, qk.Runs(), keys.Segment(id)).Result()
	require.NoError(t, err)
	return has
}

// TestS18PurgeDeleteOne: DeleteDeadLetter deletes one dead run (its
// record, its entry, its counts) and no other; sent again it is
// ErrNotFound and changes nothing; the id is free again.
func TestS18PurgeDeleteOne(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		b := s17Setup(t, c, on, nil)
		s17Kill(t, b, "k1", "a", "pa")
		s17Kill(t, b, "k:2 %", "b", "pb") // a key that Segment escapes
		s17Kill(t, b, "", "c/1", "pc")    // no key, an id that Segment escapes
		s18PurgeDead(t, b, 3, 3)

		require.NoError(t, b.q.DeleteDeadLetter(b.ctx, env, queueName, "k:2 %", "b"))
		require.ElementsMatch(t, []string{"a", "c/1"}, s18PurgeDeadIDs(t, b, queueName))
		_, err := b.q.DeadLetter(b.ctx, env, queueName, "k:2 %", "b")
		require.ErrorIs(t, err, runqueue.ErrNotFound)
		require.False(t, s18PurgeHasRecord(t, b, "b"), "the record and its payload are gone")
		require.True(t, s18PurgeHasRecord(t, b, "a"))
		s18PurgeDead(t, b, 2, 2)

		// Sent again (a lost reply retried), under another key, or of no
		// such run: ErrNotFound, nothing written.
		st := s17AllKeys(t, c, b.prefix)
		require.ErrorIs(t, b.q.DeleteDeadLetter(b.ctx, env, queueName, "k:2 %", "b"), runqueue.ErrNotFound)
		require.ErrorIs(t, b.q.DeleteDeadLetter(b.ctx, env, queueName, "k2", "a"), runqueue.ErrNotFound)
		require.ErrorIs(t, b.q.DeleteDeadLetter(b.ctx, env, queueName, "k1", "c/1"), runqueue.ErrNotFound)
		require.ErrorIs(t, b.q.DeleteDeadLetter(b.ctx, env, queueName, "", "nope"), runqueue.ErrNotFound)
		require.ErrorIs(t, b.q.DeleteDeadLetter(b.ctx, env, "other", "k1", "a"), runqueue.ErrNotFound)
		require.Equal(t, st, s17AllKeys(t, c, b.prefix))

		require.NoError(t, b.q.DeleteDeadLetter(b.ctx, env, queueName, "", "c/1"))
		require.NoError(t, b.q.DeleteDeadLetter(b.ctx, env, queueName, "k1", "a"))
		s18PurgeDead(t, b, 0, 0)
		require.Empty(t, s18PurgeDeadIDs(t, b, queueName))

		// The ids are free: new runs under them, of other keys and bodies.
		enqueue(t, b, runqueue.EnqueueParams{Key: "k9", ID: "b", Payload: []byte("new b")})
		enqueue(t, b, runqueue.EnqueueParams{Key: "k1", ID: "a", Payload: []byte("new a")})
		got := dequeue(t, b, queueName, 5)
		require.Len(t, got, 2)
		for _, r := range got {
			require.Equal(t, 1, r.Attempt)
			require.Equal(t, "new "+r.ID, string(r.Payload))
		}
		ackAll(t, b, got)
		require.Empty(t, s17RunKeys(t, b), "nothing left")
	})
}

// TestS18PurgeLive: a live run (ready, delayed or in flight) is not a dead
// letter: DeleteDeadLetter is ErrNotFound and a purge passes it by,
// nothing of it written; then it still runs and acks as before.
func TestS18PurgeLive(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		b := s17Setup(t, c, on, nil)
		s17Kill(t, b, "k2", "dead", "d")
		b.clock.Advance(time.Second)
		enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "held", Payload: []byte("h")})
		held := dequeue(t, b, queueName, 1)
		require.Len(t, held, 1)
		enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "ready", Payload: []byte("r")})
		enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "later", Payload: []byte("l"), Delay: time.Hour})
		enqueue(t, b, runqueue.EnqueueParams{ID: "ttl", Payload: []byte("t"), TTL: time.Hour})
		before := s17AllKeys(t, c, b.prefix)
		for _, id := range []string{"held", "ready", "later"} {
			require.ErrorIs(t, b.q.DeleteDeadLetter(b.ctx, env, queueName, "k", id), runqueue.ErrNotFound, id)
		}
		require.ErrorIs(t, b.q.DeleteDeadLetter(b.ctx, env, queueName, "", "ttl"), runqueue.ErrNotFound)
		require.Equal(t, before, s17AllKeys(t, c, b.prefix), "nothing written")

		// A purge of everything takes the dead run alone.
		n, err := b.q.PurgeDeadLetters(b.ctx, env, queueName, time.UnixMilli(runqueue.MaxTimeUnixMilli), 10000)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		s, err := b.q.QueueStats(b.ctx, env, queueName)
		require.NoError(t, err)
		require.Equal(t, []int64{2, 1, 1, 0}, []int64{s.Ready, s.Delayed, s.InFlight, s.Dead})
		for _, id := range []string{"held", "ready", "later", "ttl"} {
			require.True(t, s18PurgeHasRecord(t, b, id), id)
		}
		st := s17AllKeys(t, c, b.prefix)
		n, err = b.q.PurgeDeadLetters(b.ctx, env, queueName, time.UnixMilli(runqueue.MaxTimeUnixMilli), 10000)
		require.NoError(t, err)
		require.Zero(t, n)
		require.Equal(t, st, s17AllKeys(t, c, b.prefix), "nothing written")

		require.NoError(t, b.q.Ack(b.ctx, held[0]))
		b.clock.Advance(2 * time.Hour)
		n, err = b.q.ExpireTTL(b.ctx, b.q.ShardOf(env), 10)
		require.NoError(t, err)
		require.Equal(t, 1, n, "the TTL run expires as before")
		got := dequeue(t, b, queueName, 5)
		require.ElementsMatch(t, []string{"ready", "later"}, runIDs(got))
		ackAll(t, b, got)
		require.Empty(t, s17RunKeys(t, b), "nothing left")
	})
}

// TestS18PurgeByTime: PurgeDeadLetters deletes the runs that died at or
// before the time, oldest first, at most limit a call, and the counts
// follow; another queue's dead letters in the same env are left alone.
func TestS18PurgeByTime(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		b := s17Setup(t, c, on, nil)
		var died []time.Time
		for i := range 7 {
			s17Kill(t, b, fmt.Sprintf("k%d", i%3), fmt.Sprintf("d%d", i), "p")
			died = append(died, b.clock.Now())
			b.clock.Advance(time.Second)
		}
		s18PurgeKill(t, b, "other", "k0", "o1", "p")
		s18PurgeKill(t, b, "other", "k1", "o2", "p")
		s18PurgeDead(t, b, 7, 9)

		purge := func(before time.Time, limit int) int {
			t.Helper()
			n, err := b.q.PurgeDeadLetters(b.ctx, env, queueName, before, limit)
			require.NoError(t, err)
			return n
		}
		// Before the first death, and a millisecond before one: nothing.
		st := s17AllKeys(t, c, b.prefix)
		require.Zero(t, purge(time.UnixMilli(0), 100))
		require.Zero(t, purge(died[0].Add(-time.Millisecond), 100))
		require.Equal(t, st, s17AllKeys(t, c, b.prefix), "nothing written")

		require.Equal(t, 2, purge(died[4], 2), "limit")
		require.Equal(t, []string{"d2", "d3", "d4", "d5", "d6"}, s18PurgeDeadIDs(t, b, queueName), "oldest first")
		s18PurgeDead(t, b, 5, 7)
		require.False(t, s18PurgeHasRecord(t, b, "d0"))
		require.False(t, s18PurgeHasRecord(t, b, "d1"))
		require.True(t, s18PurgeHasRecord(t, b, "d2"))

		require.Equal(t, 3, purge(died[4].Add(999*time.Microsecond), 10), "at or before, to the millisecond")
		require.Equal(t, []string{"d5", "d6"}, s18PurgeDeadIDs(t, b, queueName))
		s18PurgeDead(t, b, 2, 4)
		require.Zero(t, purge(died[4], 10))

		// A time of death as DeadLetters reports it takes that run.
		dead, err := b.q.DeadLetters(b.ctx, env, queueName, 0, 1)
		require.NoError(t, err)
		require.Equal(t, 1, purge(dead[0].DiedAt, 10))
		require.Equal(t, []string{"d6"}, s18PurgeDeadIDs(t, b, queueName))

		require.Equal(t, 1, purge(time.UnixMilli(runqueue.MaxTimeUnixMilli), 10000))
		s18PurgeDead(t, b, 0, 2)
		require.Equal(t, []string{"o1", "o2"}, s18PurgeDeadIDs(t, b, "other"), "the other queue's are left")
		require.Zero(t, purge(time.UnixMilli(runqueue.MaxTimeUnixMilli), 10000), "an empty queue: 0")
	})
}

// TestS18PurgeTies: runs that died in the same millisecond go in the dead
// set's order (DeadLetters'), limit at a time.
func TestS18PurgeTies(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		b := s17Setup(t, c, on, nil)
		for i := range 5 {
			s17Kill(t, b, "k", fmt.Sprintf("t%d", 4-i), "p")
		}
		want := s18PurgeDeadIDs(t, b, queueName)
		require.Len(t, want, 5)
		for i := range 5 {
			n, err := b.q.PurgeDeadLetters(b.ctx, env, queueName, b.clock.Now(), 1)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			require.Equal(t, want[i+1:], s18PurgeDeadIDs(t, b, queueName))
		}
		s18PurgeDead(t, b, 0, 0)
	})
}

// TestS18PurgeLeavesNothing: once every dead run of the queue is purged,
// no key of the queue is left but the scheduler's state (flag on), which
// expires; the ids can be enqueued again.
func TestS18PurgeLeavesNothing(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		b := s17Setup(t, c, on, func(cfg *runqueue.Config) { cfg.MaxAttempts = 1 })
		before := s17AllKeys(t, c, b.prefix)
		const n = 40
		for i := range n {
			enqueue(t, b, runqueue.EnqueueParams{Key: fmt.Sprintf("k%d", i%7), ID: fmt.Sprintf("r%02d", i),
				Payload: []byte(strings.Repeat("x", i)), Priority: i % 10, TTL: time.Hour})
		}
		runs := dequeue(t, b, queueName, n)
		require.Len(t, runs, n)
		for _, r := range runs {
			res, err := b.q.Nack(b.ctx, r, nil)
			require.NoError(t, err)
			require.False(t, res.Requeued)
		}
		s18PurgeDead(t, b, n, n)
		total := 0
		for {
			k, err := b.q.PurgeDeadLetters(b.ctx, env, queueName, b.clock.Now(), 15)
			require.NoError(t, err)
			require.LessOrEqual(t, k, 15)
			total += k
			if k < 15 {
				break
			}
		}
		require.Equal(t, n, total)
		s18PurgeDead(t, b, 0, 0)
		after := s17AllKeys(t, c, b.prefix)
		for k, v := range after {
			switch {
			case before[k] == v:
			case strings.HasSuffix(k, ":tokens"): // the shard's delivery counter, for ever by design
			case s18IsSched(k):
				require.Contains(t, v, "ttl=true", "%s expires", k)
			default:
				t.Errorf("left after the purge: %s = %s", k, v)
			}
		}
		require.Empty(t, s17RunKeys(t, b))
		for i := range n {
			enqueue(t, b, runqueue.EnqueueParams{Key: "new", ID: fmt.Sprintf("r%02d", i)})
		}
		require.Equal(t, n, s18Drain(t, b))
	})
}

// TestS18PurgeOtherFlag: runs dead-lettered with the flag on are deleted
// by a flag-off Queue and the other way round (one script on both flags).
func TestS18PurgeOtherFlag(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		b := s17Setup(t, c, on, nil)
		other, err := runqueue.New(b.ctx, c, &runqueue.Config{Prefix: b.prefix, Clock: b.clock, SerialCalls: true,
			VtimeScheduling: !on})
		require.NoError(t, err)
		t.Cleanup(func() { _ = other.Close() })
		for i := range 3 {
			s17Kill(t, b, "k", fmt.Sprintf("x%d", i), "p")
		}
		require.NoError(t, other.DeleteDeadLetter(b.ctx, env, queueName, "k", "x1"))
		n, err := other.PurgeDeadLetters(b.ctx, env, queueName, b.clock.Now(), 10)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		s18PurgeDead(t, b, 0, 0)
		require.Empty(t, s17RunKeys(t, b))
	})
}

// TestS18PurgeForeignRecord: a dead-set entry whose id's record is of
// another key (which the scripts never write: made by hand here) goes,
// and the record, which is not its, stays.
func TestS18PurgeForeignRecord(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		b := s17Setup(t, c, on, nil)
		s17Kill(t, b, "k", "x", "p")
		qk := keySpace(t, b).Env(env).Queue(queueName)
		forged := keys.RunMember(keys.Ref{Env: env, Queue: queueName, Key: "other", ID: "x"})
		require.NoError(t, c.ZAdd(b.ctx, qk.Dead(), redis.Z{Score: 1, Member: forged}).Err())
		require.NoError(t, c.HIncrBy(b.ctx, qk.Env.Dead(), qk.Member(), 1).Err())
		require.NoError(t, b.q.DeleteDeadLetter(b.ctx, env, queueName, "other", "x"))
		d, err := b.q.DeadLetter(b.ctx, env, queueName, "k", "x")
		require.NoError(t, err)
		require.Equal(t, "p", string(d.Payload), "the record of x under k stays")
		s18PurgeDead(t, b, 1, 1)
	})
}

// TestS18PurgeBadInput: bad arguments are *InvalidError naming the field,
// and a read-only Queue's calls ErrReadOnly; nothing is written.
func TestS18PurgeBadInput(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		b := s17Setup(t, c, on, nil)
		s17Kill(t, b, "k", "dead", "x")
		before := s17AllKeys(t, c, b.prefix)
		now := b.clock.Now()
		s17Invalid(t, b.q.DeleteDeadLetter(b.ctx, "", queueName, "k", "dead"), "env")
		s17Invalid(t, b.q.DeleteDeadLetter(b.ctx, env, "..", "k", "dead"), "queue")
		s17Invalid(t, b.q.DeleteDeadLetter(b.ctx, env, queueName, " k", "dead"), "key")
		s17Invalid(t, b.q.DeleteDeadLetter(b.ctx, env, queueName, "k", "a\x00"), "id")
		s17Invalid(t, b.q.DeleteDeadLetter(b.ctx, env, queueName, "k", strings.Repeat("d", 257)), "id")
		purge := func(envName, queue string, before time.Time, limit int) error {
			n, err := b.q.PurgeDeadLetters(b.ctx, envName, queue, before, limit)
			require.Zero(t, n)
			return err
		}
		s17Invalid(t, purge("", queueName, now, 10), "env")
		s17Invalid(t, purge(env, "", now, 10), "queue")
		s17Invalid(t, purge(env, "q\n", now, 10), "queue")
		for _, lim := range []int{0, -1, 10001, int(^uint(0) >> 1)} {
			s17Invalid(t, purge(env, queueName, now, lim), "limit")
		}
		for _, at := range []time.Time{{}, time.UnixMilli(-1), time.UnixMilli(runqueue.MaxTimeUnixMilli + 1),
			time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC)} {
			s17Invalid(t, purge(env, queueName, at, 10), "diedBefore")
		}
		require.Equal(t, before, s17AllKeys(t, c, b.prefix))

		ro, err := runqueue.New(b.ctx, c, &runqueue.Config{Prefix: b.prefix, Clock: b.clock, VtimeScheduling: on,
			ReadOnly: true})
		require.NoError(t, err)
		t.Cleanup(func() { _ = ro.Close() })
		require.ErrorIs(t, ro.DeleteDeadLetter(b.ctx, env, queueName, "k", "dead"), runqueue.ErrReadOnly)
		n, err := ro.PurgeDeadLetters(b.ctx, env, queueName, now, 10)
		require.ErrorIs(t, err, runqueue.ErrReadOnly)
		require.Zero(t, n)
		require.Equal(t, before, s17AllKeys(t, c, b.prefix))
		s18PurgeDead(t, b, 1, 1)
	})
}

// TestS18PurgeCluster: both calls on a Redis Cluster (the keys of one
// script call share the env's slot), flag off and on.
func TestS18PurgeCluster(t *testing.T) {
	c := redistest.Cluster(t)
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			b := s17Setup(t, c, on, nil)
			for i := range 4 {
				s17Kill(t, b, "k", fmt.Sprintf("c%d", i), "p")
			}
			require.NoError(t, b.q.DeleteDeadLetter(b.ctx, env, queueName, "k", "c2"))
			n, err := b.q.PurgeDeadLetters(b.ctx, env, queueName, b.clock.Now(), 10)
			require.NoError(t, err)
			require.Equal(t, 3, n)
			s18PurgeDead(t, b, 0, 0)
			require.Empty(t, s17RunKeys(t, b))
		})
	}
}
