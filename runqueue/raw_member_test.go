package runqueue_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// leftHold leaves what a served member of key's ready set named field
// (its held field: variant member, ':', id as stored) leaves in flight
// when its release fails: the hold (token 7), its lease, passed since
// 1970, and its key's and env's counts.
func leftHold(t *testing.T, b *testBundle, key, field string) {
	t.Helper()
	qk := keySpace(t, b).Env(env).Queue(queueName)
	sh := keySpace(t, b).Shard(b.q.ShardOf(env))
	require.NoError(t, b.client.HSet(b.ctx, qk.Held(), field, "7").Err())
	require.NoError(t, b.client.ZAdd(b.ctx, sh.Leases(), redis.Z{Score: 1, Member: qk.RunPrefix() + field}).Err())
	require.NoError(t, b.client.HIncrBy(b.ctx, qk.KeyInflight(), keys.VariantMember(key), 1).Err())
	require.NoError(t, b.client.IncrBy(b.ctx, qk.Env.InflightCount(), 1).Err())
}

// leaseMinuteEnvLimit: leases of a minute, and at most n runs of the env
// in flight.
func leaseMinuteEnvLimit(n int) func(*runqueue.Config) {
	return func(cfg *runqueue.Config) {
		cfg.LeaseDuration = time.Minute
		cfg.LimitsFor = func(string, string) runqueue.Limits { return runqueue.Limits{Env: n} }
	}
}

// TestDequeueUndecodableMember: a member added by hand to a key's ready
// set, ahead of its runs, whose id does not decode ("bad id": runqueue
// encodes spaces) and which has no record. The call that served it failed
// whole ("corrupt id"), leaving the good run it took held until its lease
// passed (recovered with attempt + 1), and the member's hold was never
// released: its lease member does not decode, so no sweep recovered it,
// and the key (KeyConcurrency 1) and an env slot stayed taken for ever
// (helper-141). Now the call delivers the good runs, releases the
// member's hold by its names as stored, and calls again while short: the
// key's next run comes in the same call.
func TestDequeueUndecodableMember(t *testing.T) {
	t.Parallel()
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		b.reopen(t, func(cfg *runqueue.Config) { cfg.KeyConcurrency = 1 })
		qk := keySpace(t, b).Env(env).Queue(queueName)
		enqueue(t, b, runqueue.EnqueueParams{ID: "r0", Key: "k1"})
		enqueue(t, b, runqueue.EnqueueParams{ID: "g1", Key: "k2"})
		require.NoError(t, b.client.ZAdd(b.ctx, qk.Variant("k1").Ready(), redis.Z{Score: 1, Member: "bad id"}).Err())
		require.NoError(t, b.client.ZAdd(b.ctx, qk.CkIndex(), redis.Z{Score: 1, Member: keys.VariantMember("k1")}).Err())

		runs, err := b.q.Dequeue(b.ctx, env, queueName, 10)
		require.NoError(t, err)
		require.ElementsMatch(t, []string{"g1", "r0"}, runIDs(runs))
		for _, r := range runs {
			require.Equal(t, 1, r.Attempt)
		}
		held, err := b.client.HKeys(b.ctx, qk.Held()).Result()
		require.NoError(t, err)
		require.ElementsMatch(t, []string{keys.HeldField("k1", "r0"), keys.HeldField("k2", "g1")}, held)
		kin, err := b.client.HGet(b.ctx, qk.KeyInflight(), keys.VariantMember("k1")).Int()
		require.NoError(t, err)
		require.Equal(t, 1, kin, "the member's slot of k1 was released")
		n, err := b.client.Get(b.ctx, qk.Env.InflightCount()).Int()
		require.NoError(t, err)
		require.Equal(t, 2, n)
		leases, err := b.client.ZCard(b.ctx, keySpace(t, b).Shard(b.q.ShardOf(env)).Leases()).Result()
		require.NoError(t, err)
		require.Equal(t, int64(2), leases)
		ackAll(t, b, runs)
		st := queueStats(t, b, queueName)
		require.Zero(t, st.InFlight)
	})
}

// TestRecoverLeasesUndecodableMember: a hold whose id does not decode (a
// member added by hand, served while the call that served it could not
// release it) is released by lease recovery once its lease passed. The
// sweep skipped its lease member, so its key's and env's slots stayed
// taken for ever (helper-141).
func TestRecoverLeasesUndecodableMember(t *testing.T) {
	t.Parallel()
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		b.reopen(t, func(cfg *runqueue.Config) {
			cfg.KeyConcurrency = 1
			cfg.LimitsFor = func(string, string) runqueue.Limits { return runqueue.Limits{Env: 1} }
		})
		sh := keySpace(t, b).Shard(b.q.ShardOf(env))
		enqueue(t, b, runqueue.EnqueueParams{ID: "r0", Key: "k1"})
		// The state such a serve left: held, its lease, its slots.
		field := keys.VariantMember("k1") + ":bad id"
		leftHold(t, b, "k1", field)
		require.Empty(t, dequeue(t, b, queueName, 10), "the env's one slot is taken")

		b.clock.Advance(time.Second)
		_, err := b.q.RecoverLeases(b.ctx, sh.Number(), 100)
		require.NoError(t, err)
		left, err := b.client.ZCard(b.ctx, sh.Leases()).Result()
		require.NoError(t, err)
		require.Zero(t, left, "its lease is gone")
		require.Equal(t, []string{"r0"}, runIDs(dequeue(t, b, queueName, 10)), "its slots are free")
	})
}

// TestRecoverLeasesHeldLost: a queue's held hash is lost (deleted by hand,
// evicted under AllowEviction) while runs are in flight. Their leases, due,
// were refused by every recovery (the runs not held), stayed at the head
// of the shard's leases, so a sweep of limit 2 recovered nothing, not even
// a later run's passed lease, for ever; and their env slots stayed taken
// (helper-141). Now recovery takes such a lease as a held run's: the runs
// come back with attempt + 1 and their slots are free.
func TestRecoverLeasesHeldLost(t *testing.T) {
	t.Parallel()
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		b.reopen(t, leaseMinuteEnvLimit(3))
		qk := keySpace(t, b).Env(env).Queue(queueName)
		sh := b.q.ShardOf(env)
		enqueue(t, b, runqueue.EnqueueParams{ID: "a1", Key: "k1"})
		enqueue(t, b, runqueue.EnqueueParams{ID: "b1", Key: "k2"})
		require.Len(t, dequeue(t, b, queueName, 10), 2)
		require.NoError(t, b.client.Del(b.ctx, qk.Held()).Err()) // the loss
		b.clock.Advance(time.Second)
		enqueue(t, b, runqueue.EnqueueParams{ID: "c1", Key: "k3"})
		require.Equal(t, []string{"c1"}, runIDs(dequeue(t, b, queueName, 10)))

		b.clock.Advance(2 * time.Minute)
		n, err := b.q.RecoverLeases(b.ctx, sh, 2)
		require.NoError(t, err)
		require.Equal(t, 2, n, "the two leases whose holds were lost")
		n, err = b.q.RecoverLeases(b.ctx, sh, 2)
		require.NoError(t, err)
		require.Equal(t, 1, n, "then c1's")

		runs := dequeue(t, b, queueName, 10)
		require.ElementsMatch(t, []string{"a1", "b1", "c1"}, runIDs(runs), "the env's 3 slots are free")
		for _, r := range runs {
			require.Equal(t, 2, r.Attempt)
		}
		ackAll(t, b, runs)
		st := queueStats(t, b, queueName)
		require.Equal(t, runqueue.Stats{}, runqueue.Stats{Ready: st.Ready, Delayed: st.Delayed, InFlight: st.InFlight, Dead: st.Dead})
		require.Zero(t, b.client.Exists(b.ctx, qk.Env.InflightCount(), qk.KeyInflight()).Val(), "no count left")
	})
}

// TestRecoverLeasesHeldAndRecordLost: a run's hold and its record are both
// lost while it is in flight, and a producer enqueues its id again before
// the sweep, under the same key or another. The lease is not the new run's:
// recovery releases it and the slots it stood for, and leaves the new run
// as it is (helper-143 on 0651dd4: with the same key only the lease went,
// its env slot taken for ever; with another key it stayed due at the head
// of the shard's leases for ever).
func TestRecoverLeasesHeldAndRecordLost(t *testing.T) {
	t.Parallel()
	for _, key2 := range []string{"k1", "k2"} {
		t.Run(key2, func(t *testing.T) {
			forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
				b.reopen(t, leaseMinuteEnvLimit(1))
				qk := keySpace(t, b).Env(env).Queue(queueName)
				sh := keySpace(t, b).Shard(b.q.ShardOf(env))
				enqueue(t, b, runqueue.EnqueueParams{ID: "a1", Key: "k1"})
				require.Len(t, dequeue(t, b, queueName, 10), 1)
				require.NoError(t, b.client.Del(b.ctx, qk.Held(), qk.Runs()).Err()) // the loss
				enqueue(t, b, runqueue.EnqueueParams{ID: "a1", Key: key2})          // a producer's retry
				b.clock.Advance(2 * time.Minute)
				_, err := b.q.RecoverLeases(b.ctx, sh.Number(), 10)
				require.NoError(t, err)
				left, err := b.client.ZCard(b.ctx, sh.Leases()).Result()
				require.NoError(t, err)
				require.Zero(t, left, "the lease is gone")
				runs := dequeue(t, b, queueName, 10)
				require.Equal(t, []string{"a1"}, runIDs(runs), "the env's one slot is free")
				require.Equal(t, key2, runs[0].Key)
				require.Equal(t, 1, runs[0].Attempt, "the new run as it was enqueued")
			})
		})
	}
}

// TestDequeueMemberOfAnotherKey: a live run's id added by hand to another
// key's ready set (a key that does not decode, or one that does). The call
// that serves it there does not deliver it (its ack would settle the
// other key's run) and releases that hold alone; the run itself stays as
// it was and is served from its own key at attempt 1 (helper-143: the
// release dead-lettered the live run's record, attempt + 1, and added a
// dead letter for a run still queued).
func TestDequeueMemberOfAnotherKey(t *testing.T) {
	t.Parallel()
	for _, other := range []string{"=bad key", keys.VariantMember("k2")} {
		t.Run(other, func(t *testing.T) {
			forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
				qk := keySpace(t, b).Env(env).Queue(queueName)
				enqueue(t, b, runqueue.EnqueueParams{ID: "r1", Key: "k1"})
				b.clock.Advance(time.Millisecond)
				require.NoError(t, b.client.ZAdd(b.ctx, qk.VariantBase()+other[1:]+":ready", redis.Z{Score: 0, Member: keys.Segment("r1")}).Err())
				require.NoError(t, b.client.ZAdd(b.ctx, qk.CkIndex(), redis.Z{Score: 0, Member: other}).Err())
				var got []*runqueue.Run
				for range 3 {
					runs, err := b.q.Dequeue(b.ctx, env, queueName, 1)
					require.NoError(t, err)
					got = append(got, runs...)
				}
				require.Len(t, got, 1)
				require.Equal(t, "k1", got[0].Key)
				require.Equal(t, 1, got[0].Attempt)
				held, err := b.client.HKeys(b.ctx, qk.Held()).Result()
				require.NoError(t, err)
				require.Equal(t, []string{keys.HeldField("k1", "r1")}, held)
				ackAll(t, b, got)
				st := queueStats(t, b, queueName)
				require.Zero(t, st.Dead, "nothing dead-lettered")
				require.Zero(t, st.InFlight)
			})
		})
	}
}

// TestRecoverLeasesColonInRawID: a hold left by a served member added by
// hand whose id holds ':' (its release at serve failed: a Dequeue whose
// context ended as the script answered). Its lease member has five parts;
// recovery splits it at the first ':' after the queue (runqueue's keys
// never hold one), frees its slots and removes its lease, so it takes no
// place in later sweeps (helper-144 on d1355ce, which skipped members of
// more than four parts: the slots stayed taken and the lease, due at the
// head, took the one place of sweeps of limit 1 for ever).
func TestRecoverLeasesColonInRawID(t *testing.T) {
	t.Parallel()
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		b.reopen(t, leaseMinuteEnvLimit(2))
		qk := keySpace(t, b).Env(env).Queue(queueName)
		sh := keySpace(t, b).Shard(b.q.ShardOf(env))
		field := keys.VariantMember("k1") + ":bad:id"
		leftHold(t, b, "k1", field)
		enqueue(t, b, runqueue.EnqueueParams{ID: "r0", Key: "k2"})
		require.Len(t, dequeue(t, b, queueName, 10), 1)
		b.clock.Advance(2 * time.Minute)
		n, err := b.q.RecoverLeases(b.ctx, sh.Number(), 1)
		require.NoError(t, err)
		n2, err := b.q.RecoverLeases(b.ctx, sh.Number(), 1)
		require.NoError(t, err)
		require.Equal(t, 1, n+n2, "r0's passed lease (the other answers ErrNotFound, not counted)")
		left, err := b.client.ZCard(b.ctx, sh.Leases()).Result()
		require.NoError(t, err)
		require.Zero(t, left, "both leases gone")
		require.Zero(t, b.client.HLen(b.ctx, qk.KeyInflight()).Val(), "no key count left")
		enqueue(t, b, runqueue.EnqueueParams{ID: "r1", Key: "k3"})
		require.Len(t, dequeue(t, b, queueName, 10), 2, "r0 and r1: the env's two slots are free")
	})
}

// TestExpireTTLUndecodableEntry: a TTL entry whose id does not decode (a
// member added by hand to a ready set with a TTL entry, or the entry
// itself added by hand) goes at the sweep that meets it, as an entry whose
// run is gone does: the sweeps name runs by their stored names. It was
// skipped and took one of every sweep's reads for ever.
func TestExpireTTLUndecodableEntry(t *testing.T) {
	t.Parallel()
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		qk := keySpace(t, b).Env(env).Queue(queueName)
		sh := keySpace(t, b).Shard(b.q.ShardOf(env))
		member := qk.RunPrefix() + keys.VariantMember("k1") + ":bad id"
		require.NoError(t, b.client.ZAdd(b.ctx, sh.TTL(), redis.Z{Score: 1, Member: member}).Err())
		n, err := b.q.ExpireTTL(b.ctx, sh.Number(), 10)
		require.NoError(t, err)
		require.Zero(t, n, "no run expired")
		require.Zero(t, b.client.ZCard(b.ctx, sh.TTL()).Val(), "the entry is gone")
	})
}
