package runqueue_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// Second review of the wide sets (commits 721b41a..8ccd2db): the runs hash,
// the promotion check, the bulk path's choice of sets and the crossing
// arithmetic at its exact edges.

// TestReviewWideSets2PromoteBoundary: a dequeue that promotes due delayed
// runs checks by the ready count the promotion took it to (k = the runs
// promoted): 60 ready + 4 promoted = 64 crosses (the key's ready set of 64
// and the runs hash of 64 are converted), 59 + 4 = 63 does not (both stay
// listpacks). The promoted runs are served as before.
func TestReviewWideSets2PromoteBoundary(t *testing.T) {
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		space := keySpace(t, b)
		for _, tc := range []struct {
			queue string
			ready int
			enc   string // the ready set's and the runs hash's after the promotion
			henc  string
		}{{"p60", 60, "skiplist", "hashtable"}, {"p59", 59, "listpack", "listpack"}} {
			qk := space.Env(env).Queue(tc.queue)
			v := qk.Variant("a")
			var ps []runqueue.EnqueueParams
			for i := range tc.ready {
				ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: tc.queue, Key: "a", ID: fmt.Sprintf("r%03d", i),
					AvailableAt: b.clock.Now().Add(-time.Duration(1000-i) * time.Millisecond)})
			}
			enqueueAll(t, b, ps) // bulk: 0 -> ready, no multiple of 64 passed
			ps = nil
			for i := range 4 {
				ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: tc.queue, Key: "a", ID: fmt.Sprintf("d%03d", i),
					Delay: time.Minute})
			}
			enqueueAll(t, b, ps)
			requireSet(t, b, v.Ready(), idsOf("r", tc.ready), "listpack")
			requireRuns(t, b, qk.Runs(), tc.ready+4, "listpack")
		}
		b.clock.Advance(2 * time.Minute)
		for _, tc := range []struct {
			queue string
			ready int
			enc   string
			henc  string
		}{{"p60", 60, "skiplist", "hashtable"}, {"p59", 59, "listpack", "listpack"}} {
			qk := space.Env(env).Queue(tc.queue)
			got := dequeue(t, b, tc.queue, 1)
			require.Len(t, got, 1)
			require.Equal(t, "r000", got[0].ID, tc.queue) // the oldest
			want := slices.Concat(idsOf("r", tc.ready)[1:], idsOf("d", 4))
			requireSet(t, b, qk.Variant("a").Ready(), want, tc.enc)
			nd, err := b.client.Exists(b.ctx, qk.Variant("a").Delayed()).Result()
			require.NoError(t, err)
			require.Zero(t, nd, "the delayed set is left")
			requireRuns(t, b, qk.Runs(), tc.ready+4, tc.henc)
			st := queueStats(t, b, tc.queue)
			require.Equal(t, [3]int64{int64(tc.ready + 3), 0, 1}, [3]int64{st.Ready, st.Delayed, st.InFlight}, tc.queue)
		}
		rwsNoMarks(t, b, "")
	})
}

// TestReviewWideSets2TokenBoundary: a dequeue checks ckIndex, the leases
// and the runs hash when it takes the shard's token counter past a
// multiple of 64: 63 -> 64 does (each rebuilt as a listpack first is
// converted), 64 -> 65 does not (each rebuilt again stays a listpack).
func TestReviewWideSets2TokenBoundary(t *testing.T) {
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		space := keySpace(t, b)
		qk := queueKeys(t, b)
		leases := space.Shard(space.ShardOf(env)).Leases()
		var ps []runqueue.EnqueueParams
		for i := range 200 { // 100 keys, 2 runs each; the first round older
			ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprintf("k%02d", i%100),
				ID: fmt.Sprintf("r%03d", i), AvailableAt: b.clock.Now().Add(-time.Duration(200-i) * time.Millisecond)})
		}
		enqueueAll(t, b, ps)
		held := dequeue(t, b, queueName, 63) // tokens 0 -> 63
		require.Len(t, held, 63)
		ck, err := b.client.ZCard(b.ctx, qk.CkIndex()).Result()
		require.NoError(t, err)
		require.True(t, ck >= 64 && ck <= 128, "ckIndex holds %d", ck)
		rebuildAll := func() {
			rebuildListpack(t, b, qk.CkIndex())
			rebuildListpack(t, b, leases)
			rehashListpack(t, b, qk.Runs())
		}
		rebuildAll()
		held = append(held, dequeue(t, b, queueName, 1)...) // 63 -> 64: a multiple passed
		require.Len(t, held, 64)
		requireEncoding(t, b, qk.CkIndex(), "skiplist")
		requireEncoding(t, b, leases, "skiplist")
		requireRuns(t, b, qk.Runs(), 200, "hashtable")
		rebuildAll()
		held = append(held, dequeue(t, b, queueName, 1)...) // 64 -> 65: none passed
		require.Len(t, held, 65)
		requireEncoding(t, b, qk.CkIndex(), "listpack")
		requireEncoding(t, b, leases, "listpack")
		requireRuns(t, b, qk.Runs(), 200, "listpack")
		var members []string
		for _, r := range held {
			members = append(members, keys.RunMember(keys.Ref{Env: r.Env, Queue: r.Queue, Key: r.Key, ID: r.ID}))
		}
		requireSet(t, b, leases, members, "listpack")
		rwsNoMarks(t, b, "")
		rwhAckOK(t, b, held)
		st := queueStats(t, b, queueName)
		require.Equal(t, [2]int64{135, 0}, [2]int64{st.Ready, st.InFlight})
	})
}

// TestReviewWideSets2BulkMixedKinds: one bulk call that takes both the
// ready and the delayed counts past 64 (61 -> 80 each), with 4 runs for a
// ready set of 61 and 4 for a delayed set of 61, in the middle of the call
// (neither is the last run's set), among 30 runs of other keys alternating
// ready and delayed. Both sets it placed 4 runs in are converted, each by
// its kind's check, and the runs hash too; the indexes (16 entries) and the
// one-run sets stay listpacks, and no mark is left.
func TestReviewWideSets2BulkMixedKinds(t *testing.T) {
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		qk := queueKeys(t, b)
		now := b.clock.Now()
		ready := func(key, id string, i int) runqueue.EnqueueParams {
			return runqueue.EnqueueParams{Env: env, Queue: queueName, Key: key, ID: id,
				AvailableAt: now.Add(-time.Duration(1000-i) * time.Millisecond)}
		}
		delayed := func(key, id string, i int) runqueue.EnqueueParams {
			return runqueue.EnqueueParams{Env: env, Queue: queueName, Key: key, ID: id,
				Delay: time.Hour + time.Duration(i)*time.Millisecond}
		}
		var ps []runqueue.EnqueueParams
		for i := range 61 {
			ps = append(ps, ready("A", fmt.Sprintf("a%03d", i), i), delayed("D", fmt.Sprintf("d%03d", i), i))
		}
		enqueueAll(t, b, ps) // ready 0 -> 61, delayed 0 -> 61: no multiple passed
		requireSet(t, b, qk.Variant("A").Ready(), idsOf("a", 61), "listpack")
		requireSet(t, b, qk.Variant("D").Delayed(), idsOf("d", 61), "listpack")
		requireRuns(t, b, qk.Runs(), 122, "listpack")

		ps = nil
		var cr, cd []string
		for i := range 30 {
			if i == 13 {
				for j := 61; j < 65; j++ {
					ps = append(ps, ready("A", fmt.Sprintf("a%03d", j), 100+j), delayed("D", fmt.Sprintf("d%03d", j), 100+j))
				}
			}
			k := fmt.Sprintf("c%02d", i)
			if i%2 == 0 {
				ps = append(ps, ready(k, k, 200+i))
				cr = append(cr, keys.VariantMember(k))
			} else {
				ps = append(ps, delayed(k, k, 200+i))
				cd = append(cd, keys.VariantMember(k))
			}
		}
		require.Len(t, ps, 38)
		enqueueAll(t, b, ps) // ready 61 -> 80, delayed 61 -> 80
		requireSet(t, b, qk.Variant("A").Ready(), idsOf("a", 65), "skiplist")
		requireSet(t, b, qk.Variant("D").Delayed(), idsOf("d", 65), "skiplist")
		requireRuns(t, b, qk.Runs(), 160, "hashtable")
		requireSet(t, b, qk.CkIndex(), append(cr, keys.VariantMember("A")), "listpack")
		requireSet(t, b, qk.DelayIndex(), append(cd, keys.VariantMember("D")), "listpack")
		requireSet(t, b, qk.Variant("c29").Delayed(), []string{"c29"}, "listpack")
		st := queueStats(t, b, queueName)
		require.Equal(t, [2]int64{80, 80}, [2]int64{st.Ready, st.Delayed})
		rwsNoMarks(t, b, "")
	})
}

// TestReviewWideSets2RunsHash: the runs hash's check at its edges.
//   - 448 runs in a listpack runs hash, then a bulk call of 64 takes the
//     ready count 448 -> 512 and the hash to 512 fields, the most Redis
//     keeps as a listpack (WIDE.HASH_TO): converted, 512 fields, no mark.
//   - a field of the mark's very name in the runs hash (no encoded id can
//     be one: Segment escapes '~', ':' and spaces; put there by hand) is
//     left alone with its value by the checks of the 64th run and of the
//     dequeue that passes token 64 (HSETNX answers 0: nothing to remove),
//     and no reader counts it: the queue's figures are the runs'.
func TestReviewWideSets2RunsHash(t *testing.T) {
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		space := keySpace(t, b)
		now := b.clock.Now()
		batch := func(queue string, from, n int) []runqueue.EnqueueParams {
			var ps []runqueue.EnqueueParams
			for i := from; i < from+n; i++ {
				ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: queue, Key: fmt.Sprintf("k%02d", i%50),
					ID: fmt.Sprintf("r%03d", i), AvailableAt: now.Add(-time.Duration(1000-i) * time.Millisecond)})
			}
			return ps
		}
		big := space.Env(env).Queue("big")
		enqueueAll(t, b, batch("big", 0, 448))
		rehashListpack(t, b, big.Runs())
		requireRuns(t, b, big.Runs(), 448, "listpack")
		enqueueAll(t, b, batch("big", 448, 64))
		requireRuns(t, b, big.Runs(), 512, "hashtable")
		require.Equal(t, int64(512), queueStats(t, b, "big").Ready)

		mark := rwsMark(t)
		named := space.Env(env).Queue("named")
		require.NoError(t, b.client.HSet(b.ctx, named.Runs(), mark, "keep").Err())
		for i := range 64 {
			enqueue(t, b, runqueue.EnqueueParams{Queue: "named", Key: fmt.Sprintf("k%02d", i%10),
				ID: fmt.Sprintf("n%03d", i), AvailableAt: now.Add(-time.Duration(1000-i) * time.Millisecond)})
		}
		requireSet(t, b, named.Variant("k03").Ready(), []string{"n003", "n013", "n023", "n033", "n043", "n053", "n063"}, "listpack")
		// the shard's counter is at 0: 64 tokens pass 64
		held := dequeue(t, b, "named", 64)
		require.Len(t, held, 64)
		v, err := b.client.HGet(b.ctx, named.Runs(), mark).Result()
		require.NoError(t, err, "the field of the mark's name left the runs hash")
		require.Equal(t, "keep", v)
		n, err := b.client.HLen(b.ctx, named.Runs()).Result()
		require.NoError(t, err)
		require.Equal(t, int64(65), n)
		st := queueStats(t, b, "named")
		require.Equal(t, [3]int64{0, 0, 64}, [3]int64{st.Ready, st.Delayed, st.InFlight})
		rwhAckOK(t, b, held)
		all, err := b.client.HGetAll(b.ctx, named.Runs()).Result()
		require.NoError(t, err)
		require.Equal(t, map[string]string{mark: "keep"}, all)
		// (no other key of the mark's prefix anywhere)
		for _, k := range b.keysUnder(t) {
			typ, err := b.client.Type(b.ctx, k).Result()
			require.NoError(t, err)
			if typ != "hash" || k == named.Runs() {
				continue
			}
			fs, err := b.client.HKeys(b.ctx, k).Result()
			require.NoError(t, err)
			for _, f := range fs {
				require.False(t, strings.HasPrefix(f, wideSetMark), "the mark is left in %s", k)
			}
		}
		rwsNoMarks(t, b, "")
	})
}
