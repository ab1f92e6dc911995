package runqueue_test

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// Review of the wide sets (lua/lib/place.lua, WIDE): the states the
// change's own tests leave out.

// rwsMark is the whole mark member (WIDE.MEMBER, read from the script's
// source), for the test that puts a member of that name in a set.
func rwsMark(t *testing.T) string {
	t.Helper()
	src, err := os.ReadFile("lua/lib/place.lua")
	require.NoError(t, err)
	m := regexp.MustCompile(`MEMBER = '([^']+)'`).FindSubmatch(src)
	require.NotNil(t, m, "WIDE.MEMBER in lua/lib/place.lua")
	return string(m[1])
}

// rwsNoMarks: no sorted set under the bundle's prefix holds a member that
// starts like the mark, and every member of the shard's leases decodes as
// a run (what lease recovery reads). keep is a member a test put there
// on purpose.
func rwsNoMarks(t *testing.T, b *testBundle, keep string) {
	t.Helper()
	for _, k := range b.keysUnder(t) {
		typ, err := b.client.Type(b.ctx, k).Result()
		require.NoError(t, err)
		if typ != "zset" {
			continue
		}
		ms, err := b.client.ZRange(b.ctx, k, 0, -1).Result()
		require.NoError(t, err)
		for _, m := range ms {
			if m == keep {
				continue
			}
			require.False(t, strings.HasPrefix(m, wideSetMark), "the mark is left in %s", k)
			if strings.HasSuffix(k, ":leases") {
				_, err := keys.DecodeRunMember(m)
				require.NoError(t, err, "leases member %q of %s", m, k)
			}
		}
	}
}

// TestReviewWideSetsBulkIndexMoves: a bulk EnqueueMany whose index moves
// take ckIndex and delayIndex into 64..128 members in the same call that
// takes the ready and delayed counts past 64 (40 -> 80 each). The indexes
// are looked at after their moves (place_flush after index_moves), so both
// become skiplists; looked at before, they held 40 entries and stayed
// listpacks. Nothing else changes: the answers, the counts, no mark, and
// every ready run is served.
func TestReviewWideSetsBulkIndexMoves(t *testing.T) {
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		qk := queueKeys(t, b)
		now := b.clock.Now()
		batch := func(prefix string) []runqueue.EnqueueParams {
			var ps []runqueue.EnqueueParams
			for i := range 40 {
				ps = append(ps,
					runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprintf("%sr%02d", prefix, i),
						ID: fmt.Sprintf("%sr%02d", prefix, i), AvailableAt: now.Add(-time.Duration(100-i) * time.Millisecond)},
					runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprintf("%sd%02d", prefix, i),
						ID: fmt.Sprintf("%sd%02d", prefix, i), Delay: time.Hour + time.Duration(i)*time.Millisecond})
			}
			return ps
		}
		var ready, delayed []string
		for _, prefix := range []string{"p", "n"} {
			res, err := b.q.EnqueueMany(b.ctx, batch(prefix))
			require.NoError(t, err)
			require.Len(t, res, 80)
			for _, r := range res {
				require.True(t, r.Queued)
				require.NoError(t, r.Err)
			}
			for i := range 40 {
				ready = append(ready, keys.VariantMember(fmt.Sprintf("%sr%02d", prefix, i)))
				delayed = append(delayed, keys.VariantMember(fmt.Sprintf("%sd%02d", prefix, i)))
			}
			enc := "listpack"
			if prefix == "n" {
				enc = "skiplist"
			}
			requireSet(t, b, qk.CkIndex(), ready, enc)
			requireSet(t, b, qk.DelayIndex(), delayed, enc)
		}
		// Each key's own set (one run) stays a listpack.
		requireSet(t, b, qk.Variant("nr07").Ready(), []string{keys.Segment("nr07")}, "listpack")
		requireSet(t, b, qk.Variant("nd07").Delayed(), []string{keys.Segment("nd07")}, "listpack")
		st := queueStats(t, b, queueName)
		require.Equal(t, int64(80), st.Ready)
		require.Equal(t, int64(80), st.Delayed)
		rwsNoMarks(t, b, "")

		var got []string
		for {
			runs := dequeue(t, b, queueName, 7)
			if len(runs) == 0 {
				break
			}
			got = append(got, runIDs(runs)...)
		}
		require.Len(t, got, 80)
		var want []string
		for _, prefix := range []string{"p", "n"} {
			for i := range 40 {
				want = append(want, fmt.Sprintf("%sr%02d", prefix, i))
			}
		}
		require.ElementsMatch(t, want, got)
		rwsNoMarks(t, b, "")
	})
}

// TestReviewWideSetsMarkNamedMember: a set that already holds a member of
// the mark's name (no runqueue member can have it: Segment escapes '~',
// ':' and spaces; here put there by hand) keeps it, with its score, when a
// call widens the set: ZADD NX adds nothing, so nothing is removed.
// Checked on the shard's leases (a dequeue that takes the token counter
// past 64) and on a key's delayed set (the 64th delayed run).
func TestReviewWideSetsMarkNamedMember(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
				rwsMark := rwsMark(t)
				require.True(t, strings.HasPrefix(rwsMark, wideSetMark))
				require.Greater(t, len(rwsMark), 64)
				b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = on })
				space := keySpace(t, b)
				qk := queueKeys(t, b)
				leases := space.Shard(space.ShardOf(env)).Leases()
				const far = float64(runqueue.MaxTimeUnixMilli)
				require.NoError(t, b.client.ZAdd(b.ctx, leases, redis.Z{Score: far, Member: rwsMark}).Err())
				delayedSet := qk.Variant("late").Delayed()
				require.NoError(t, b.client.ZAdd(b.ctx, delayedSet, redis.Z{Score: far, Member: rwsMark}).Err())

				res, err := b.q.EnqueueMany(b.ctx, func() []runqueue.EnqueueParams {
					var ps []runqueue.EnqueueParams
					for i := range 100 {
						ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprintf("k%02d", i),
							ID: fmt.Sprintf("r%03d", i), AvailableAt: b.clock.Now().Add(-time.Duration(100-i) * time.Millisecond)})
					}
					return ps
				}())
				require.NoError(t, err)
				require.Len(t, res, 100)
				var held []*runqueue.Run
				for range 7 { // tokens 0 -> 70: past 64 at the 7th call
					held = append(held, dequeue(t, b, queueName, 10)...)
				}
				require.Len(t, held, 70)
				for i := range 64 {
					enqueue(t, b, runqueue.EnqueueParams{Key: "late", ID: fmt.Sprintf("l%03d", i), Delay: time.Hour})
				}
				for _, k := range []string{leases, delayedSet} {
					s, err := b.client.ZScore(b.ctx, k, rwsMark).Result()
					require.NoError(t, err, "the member of the mark's name left %s", k)
					require.Equal(t, far, s, "its score in %s", k)
				}
				n, err := b.client.ZCard(b.ctx, leases).Result()
				require.NoError(t, err)
				require.Equal(t, int64(71), n)
				require.Equal(t, int64(64), queueStats(t, b, queueName).Delayed)
				rwsNoMarks(t, b, rwsMark)
			})
		})
	}
}

// TestReviewWideSetsRequeueRedrive: the requeue (nack) and redrive paths
// place one run at a time (no memo): the run that takes the queue's count
// past 64 widens the key's set it went to, and no mark is left. The set
// is first rebuilt as a listpack (the state after a restart), so the
// encodings show which call widened it.
func TestReviewWideSetsRequeueRedrive(t *testing.T) {
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		space := keySpace(t, b)
		for _, tc := range []struct {
			queue string
			kind  string // "nack" (ready again), "later" (nack to delayed), "redrive"
		}{{"qn", "nack"}, {"ql", "later"}, {"qr", "redrive"}} {
			qk := space.Env(env).Queue(tc.queue)
			v := qk.Variant("a")
			var ps []runqueue.EnqueueParams
			for i := range 100 {
				ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: tc.queue, Key: "a", ID: fmt.Sprintf("r%03d", i),
					AvailableAt: b.clock.Now().Add(-time.Duration(100-i) * time.Millisecond)})
			}
			_, err := b.q.EnqueueMany(b.ctx, ps)
			require.NoError(t, err)
			held := dequeue(t, b, tc.queue, 64)
			require.Len(t, held, 64)
			set := v.Ready()
			if tc.kind == "later" {
				set = v.Delayed()
			}
			if tc.kind == "redrive" {
				for _, r := range held {
					res, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{DeadLetter: true})
					require.NoError(t, err)
					require.False(t, res.Requeued)
				}
			}
			// ready: 36 left; the set of the kind the runs go back to,
			// as after a restart
			ids := idsOf("r", 100)
			members := append([]string(nil), ids[64:]...)
			if tc.kind == "later" {
				members = nil
			} else {
				rebuildListpack(t, b, set)
			}
			// runs back when the count is 63: the next one takes it to 64
			before := 63 - len(members)
			if tc.kind == "later" {
				before = 63
			}
			for i, r := range held {
				switch tc.kind {
				case "nack":
					res, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{RetryAt: b.clock.Now()})
					require.NoError(t, err)
					require.True(t, res.Requeued)
				case "later":
					res, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{RetryAt: b.clock.Now().Add(time.Hour)})
					require.NoError(t, err)
					require.True(t, res.Requeued)
				case "redrive":
					require.NoError(t, b.q.Redrive(b.ctx, env, tc.queue, r.Key, r.ID))
				}
				members = append(members, keys.Segment(r.ID))
				switch i + 1 {
				case before:
					requireSet(t, b, set, members, "listpack")
				case before + 1:
					requireSet(t, b, set, members, "skiplist")
				}
			}
			st := queueStats(t, b, tc.queue)
			if tc.kind == "later" {
				require.Equal(t, [2]int64{36, 64}, [2]int64{st.Ready, st.Delayed}, tc.kind)
			} else {
				require.Equal(t, [2]int64{100, 0}, [2]int64{st.Ready, st.Delayed}, tc.kind)
			}
			require.Equal(t, int64(0), st.InFlight, tc.kind)
		}
		rwsNoMarks(t, b, "")
	})
}

// TestReviewWideSetsLeaseRecovery: a shard's leases widened at 64 to 128
// runs in flight (the dequeue that takes the token counter past 64) hold
// exactly the runs: lease recovery finds the 70 and nothing else, and
// leaves no leases key behind.
func TestReviewWideSetsLeaseRecovery(t *testing.T) {
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		space := keySpace(t, b)
		shard := space.ShardOf(env)
		leases := space.Shard(shard).Leases()
		rwhFill(t, b, 100, 1)
		var held []*runqueue.Run
		for range 7 {
			held = append(held, dequeue(t, b, queueName, 10)...)
		}
		require.Len(t, held, 70)
		var members []string
		for _, r := range held {
			members = append(members, keys.RunMember(keys.Ref{Env: r.Env, Queue: r.Queue, Key: r.Key, ID: r.ID}))
		}
		requireSet(t, b, leases, members, "skiplist")
		b.clock.Advance(b.q.Config().LeaseDuration + time.Second)
		n, err := b.q.RecoverLeases(b.ctx, shard, 1000)
		require.NoError(t, err)
		require.Equal(t, 70, n)
		ex, err := b.client.Exists(b.ctx, leases).Result()
		require.NoError(t, err)
		require.Zero(t, ex, "the leases key is left")
		st := queueStats(t, b, queueName)
		require.Equal(t, int64(100), st.Ready)
		require.Equal(t, int64(0), st.InFlight)
		rwsNoMarks(t, b, "")
	})
}

// TestReviewWideSetsAdmission: with admission limits an EnqueueMany goes
// run by run; MaxQueueDepth (the depth is read before each run, so counted
// run by run) and MaxKeyDepth (ZCARDs of the key's sets: a mark would
// count) refuse exactly the runs past the limit, and the 64th run widens
// the set within the call.
func TestReviewWideSetsAdmission(t *testing.T) {
	for _, on := range []bool{false, true} {
		for _, scope := range []string{"queue", "key"} {
			t.Run(fmt.Sprintf("vtime=%v/%s", on, scope), func(t *testing.T) {
				forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
					b := setup(t, c, func(cfg *runqueue.Config) {
						cfg.VtimeScheduling = on
						if scope == "queue" {
							cfg.MaxQueueDepth = 70
						} else {
							cfg.MaxKeyDepth = 70
						}
					})
					v := queueKeys(t, b).Variant("a")
					n := 0
					for call := range 8 {
						var ps []runqueue.EnqueueParams
						for range 10 {
							ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: "a", ID: fmt.Sprintf("m%03d", n)})
							n++
						}
						res, err := b.q.EnqueueMany(b.ctx, ps)
						require.NoError(t, err)
						for i, r := range res {
							if call*10+i < 70 {
								require.True(t, r.Queued, "run %d", call*10+i)
								require.NoError(t, r.Err)
							} else {
								require.False(t, r.Queued, "run %d", call*10+i)
								require.True(t, errors.Is(r.Err, runqueue.ErrQueueFull), "run %d: %v", call*10+i, r.Err)
							}
						}
						queued := min(n, 70)
						enc := "listpack"
						if queued >= 64 {
							enc = "skiplist"
						}
						requireSet(t, b, v.Ready(), idsOf("m", queued), enc)
					}
					require.Equal(t, int64(70), queueStats(t, b, queueName).Ready)
					rwsNoMarks(t, b, "")
				})
			})
		}
	}
}

// TestReviewWideSetsDrainLeavesNoKeys: a queue of 100 runs over 70 keys
// drained in calls of 7 (the token counter passes 64 while ckIndex
// shrinks through 64..128 and goes) and acked leaves none of its keys nor
// the shard's leases: widening never writes a set back.
func TestReviewWideSetsDrainLeavesNoKeys(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	forEachFlag(t, func(t *testing.T, b *testBundle, on bool) {
		var ps []runqueue.EnqueueParams
		for i := range 100 {
			ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprintf("k%02d", i%70),
				ID: fmt.Sprintf("r%03d", i), AvailableAt: b.clock.Now().Add(-time.Duration(100-i) * time.Millisecond)})
		}
		_, err := b.q.EnqueueMany(b.ctx, ps)
		require.NoError(t, err)
		served := 0
		for {
			runs := dequeue(t, b, queueName, 7)
			if len(runs) == 0 {
				break
			}
			served += len(runs)
			rwsNoMarks(t, b, "")
			rwhAckOK(t, b, runs)
		}
		require.Equal(t, 100, served)
		qk := queueKeys(t, b)
		for _, k := range b.keysUnder(t) {
			if k == qk.CkVtime() || k == qk.CkVtimeState() {
				continue // (flag on: lives out its StateTTL)
			}
			t.Errorf("key left behind: %s", k)
		}
	})
}
