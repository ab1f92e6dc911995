package runqueue_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// Wide sets (lua/lib/place.lua, WIDE): a variant's ready or delayed set,
// the queue's ckIndex and delayIndex and the shard's leases are made
// skiplists at 64 members, and the queue's runs hash a hash table, by a
// member (a field) of more than 64 bytes added and removed in one script. The
// data is what it was (no reader ever sees the member); only Redis's
// encoding changes, which real Redis shows (OBJECT ENCODING).

// wideSetMark is how the mark's member starts (WIDE.MEMBER).
const wideSetMark = "~runqueue"

// requireSet checks a sorted set's members (exactly want, in any order,
// so no mark is left) and, on real Redis, its encoding.
func requireSet(t *testing.T, b *testBundle, key string, want []string, enc string) {
	t.Helper()
	got, err := b.client.ZRange(b.ctx, key, 0, -1).Result()
	require.NoError(t, err)
	require.ElementsMatch(t, want, got, "members of %s", key)
	for _, m := range got {
		require.False(t, strings.HasPrefix(m, wideSetMark), "the mark is left in %s", key)
	}
	requireEncoding(t, b, key, enc)
}

// requireRuns checks that hash key holds n fields, none of them the mark,
// and, on real Redis, its encoding.
func requireRuns(t *testing.T, b *testBundle, key string, n int, enc string) {
	t.Helper()
	fields, err := b.client.HKeys(b.ctx, key).Result()
	require.NoError(t, err)
	require.Len(t, fields, n, "fields of %s", key)
	for _, f := range fields {
		require.False(t, strings.HasPrefix(f, wideSetMark), "the mark is left in %s", key)
	}
	requireEncoding(t, b, key, enc)
}

// rebuildListpack rewrites sorted set key as a new set (ZRANGESTORE), which
// Redis makes a listpack again when it is small: the state after a
// restart. A no-op on miniredis (no encodings).
func rebuildListpack(t *testing.T, b *testBundle, key string) {
	t.Helper()
	if strings.Contains(t.Name(), "/Mini") {
		return
	}
	rebuild := redis.NewScript(`redis.call('ZRANGESTORE', KEYS[2], KEYS[1], 0, -1)
return redis.call('RENAME', KEYS[2], KEYS[1])`)
	require.NoError(t, rebuild.Run(b.ctx, b.client, []string{key, key + ":copy"}).Err())
	requireEncoding(t, b, key, "listpack")
}

// rehashListpack rewrites hash key as a new hash (HGETALL, DEL, HSET), which
// Redis makes a listpack again when it is small: the state after a
// restart. A no-op on miniredis (no encodings).
func rehashListpack(t *testing.T, b *testBundle, key string) {
	t.Helper()
	if strings.Contains(t.Name(), "/Mini") {
		return
	}
	rehash := redis.NewScript(`local all = redis.call('HGETALL', KEYS[1])
redis.call('DEL', KEYS[1])
return redis.call('HSET', KEYS[1], unpack(all))`)
	require.NoError(t, rehash.Run(b.ctx, b.client, []string{key}).Err())
	requireEncoding(t, b, key, "listpack")
}

// enqueueAll enqueues ps by EnqueueMany, 1,000 runs a call (one call up to
// 1,000), and requires each queued.
func enqueueAll(t *testing.T, b *testBundle, ps []runqueue.EnqueueParams) {
	t.Helper()
	for from := 0; from < len(ps); from += 1000 {
		part := ps[from:min(from+1000, len(ps))]
		res, err := b.q.EnqueueMany(b.ctx, part)
		require.NoError(t, err)
		require.Len(t, res, len(part))
		for i, r := range res {
			require.NoError(t, r.Err, "run %d", from+i)
			require.True(t, r.Queued, "run %d", from+i)
		}
	}
}

// idsOf returns the encoded ids prefix0 .. prefix(n-1), as a ready or
// delayed set holds them.
func idsOf(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = keys.Segment(fmt.Sprintf("%s%03d", prefix, i))
	}
	return out
}

func TestWideSetsEnqueue(t *testing.T) {
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		space := keySpace(t, b)
		now := b.clock.Now()
		run := func(queue, key, id string, delay time.Duration) runqueue.EnqueueParams {
			return runqueue.EnqueueParams{Env: env, Queue: queue, Key: key, ID: id, Delay: delay}
		}

		// One run per call: the 64th ready run of the queue makes its
		// variant's set a skiplist, not the 63rd.
		single := space.Env(env).Queue("single").Variant("a")
		for i := range 63 {
			enqueue(t, b, run("single", "a", fmt.Sprintf("s%03d", i), 0))
		}
		requireSet(t, b, single.Ready(), idsOf("s", 63), "listpack")
		requireRuns(t, b, space.Env(env).Queue("single").Runs(), 63, "listpack")
		enqueue(t, b, run("single", "a", "s063", 0))
		requireSet(t, b, single.Ready(), idsOf("s", 64), "skiplist")
		// The runs hash (small records) too.
		requireRuns(t, b, space.Env(env).Queue("single").Runs(), 64, "hashtable")
		// Its index holds one variant: a listpack still.
		requireSet(t, b, space.Env(env).Queue("single").CkIndex(), []string{single.Member()}, "listpack")

		// Delayed runs: the delayed set, by the delayed count.
		delayed := space.Env(env).Queue("delayed").Variant("a")
		for i := range 63 {
			enqueue(t, b, run("delayed", "a", fmt.Sprintf("d%03d", i), time.Hour))
		}
		requireSet(t, b, delayed.Delayed(), idsOf("d", 63), "listpack")
		enqueue(t, b, run("delayed", "a", "d063", time.Hour))
		requireSet(t, b, delayed.Delayed(), idsOf("d", 64), "skiplist")

		// Delayed runs that fall due: the dequeue that promotes
		// them (up to PromoteLimit, 100, per variant) into a ready
		// set of 64 or more makes it a skiplist.
		promoted := space.Env(env).Queue("promote").Variant("a")
		for i := range 80 {
			enqueue(t, b, run("promote", "a", fmt.Sprintf("p%03d", i), time.Minute))
		}
		b.clock.Advance(2 * time.Minute)
		got := dequeue(t, b, "promote", 1)
		require.Len(t, got, 1)
		requireSet(t, b, promoted.Ready(), idsOf("p", 80)[1:], "skiplist")

		// Calls of several runs (memo: counts written once) and of
		// many (bulk): the call that takes the count past 64.
		for _, tc := range []struct {
			queue string
			per   int
		}{{"memo", 10}, {"bulk", 40}} {
			v := space.Env(env).Queue(tc.queue).Variant("a")
			n := 0
			send := func() { // one call of tc.per new runs
				var ps []runqueue.EnqueueParams
				for range tc.per {
					ps = append(ps, run(tc.queue, "a", fmt.Sprintf("m%03d", n), 0))
					n++
				}
				enqueueAll(t, b, ps)
			}
			for n+tc.per < 64 {
				send()
				requireSet(t, b, v.Ready(), idsOf("m", n), "listpack")
			}
			send()
			requireSet(t, b, v.Ready(), idsOf("m", n), "skiplist")
		}

		// 64 keys of one run each: ckIndex is made a skiplist by the
		// run that takes the queue's count to 64; each variant's set
		// (one run) stays a listpack.
		qk := space.Env(env).Queue("index")
		var members []string
		for i := range 64 {
			k := fmt.Sprintf("k%02d", i)
			enqueue(t, b, runqueue.EnqueueParams{Env: env, Queue: "index", Key: k, ID: "x" + k,
				AvailableAt: now.Add(time.Duration(i-100) * time.Millisecond)})
			members = append(members, qk.Variant(k).Member())
			if i == 62 {
				requireSet(t, b, qk.CkIndex(), members, "listpack")
			}
		}
		requireSet(t, b, qk.CkIndex(), members, "skiplist")
		requireSet(t, b, qk.Variant("k00").Ready(), []string{keys.Segment("xk00")}, "listpack")
	})
}

// A dequeue looks at ckIndex once per 64 tokens of the shard: a ckIndex
// that is a listpack again (as after Redis loads a dump, here rebuilt by
// ZRANGESTORE, which writes a new set) is made a skiplist by the dequeue
// that takes the token counter past 64, and so is the shard's leases set
// once it holds 64 runs in flight; the runs hash is made a hash table.
func TestWideSetsDequeue(t *testing.T) {
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		qk := queueKeys(t, b)
		const nkeys, runs = 100, 200
		var ps []runqueue.EnqueueParams
		var members []string
		for i := range runs {
			// (one age each: the keys' first runs are the oldest)
			k := fmt.Sprintf("k%02d", i%nkeys)
			ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: k, ID: fmt.Sprintf("r%03d", i),
				AvailableAt: b.clock.Now().Add(-time.Duration(runs-i) * time.Millisecond)})
			if i < nkeys {
				members = append(members, qk.Variant(k).Member())
			}
		}
		enqueueAll(t, b, ps)
		requireSet(t, b, qk.CkIndex(), members, "skiplist")
		if strings.Contains(t.Name(), "/Mini") {
			return // no encodings to see
		}
		rebuildListpack(t, b, qk.CkIndex())
		requireSet(t, b, qk.CkIndex(), members, "listpack")
		requireRuns(t, b, qk.Runs(), runs, "hashtable")
		rehashListpack(t, b, qk.Runs())
		requireRuns(t, b, qk.Runs(), runs, "listpack")

		var held []*runqueue.Run
		for range 6 {
			held = append(held, dequeue(t, b, queueName, 10)...)
		}
		require.Len(t, held, 60)
		requireSet(t, b, qk.CkIndex(), members, "listpack")
		leases := func() []string {
			var out []string
			for _, r := range held {
				out = append(out, keys.RunMember(keys.Ref{Env: r.Env, Queue: r.Queue, Key: r.Key, ID: r.ID}))
			}
			return out
		}
		space := keySpace(t, b)
		leaseSet := space.Shard(space.ShardOf(env)).Leases()
		requireSet(t, b, leaseSet, leases(), "listpack")
		requireRuns(t, b, qk.Runs(), runs, "listpack")
		held = append(held, dequeue(t, b, queueName, 10)...)
		require.Len(t, held, 70)
		requireSet(t, b, qk.CkIndex(), members, "skiplist")
		requireSet(t, b, leaseSet, leases(), "skiplist")
		requireRuns(t, b, qk.Runs(), runs, "hashtable")
	})
}
