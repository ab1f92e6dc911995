package runqueue_test

// Review of 5e32510 (the dequeue's served runs as two lists, dq_finish
// filling its reply by index, dq_open's constructor naming own_args, cap
// and the two heads) and 9af3651 (enqueue's admission check nil without a
// depth limit, the bulk path's functions defined inside its branch).
//
// Both were run against the scripts before them (the snapshots of 8fbaf0f
// and 39cf0cf) on identical random workloads, EnqueueMany of 1 to 51 runs
// with duplicates, conflicts, delays, TTLs and depth limits, dequeues of 0
// to 11 with acks (stale, repeated, wrong token) and with per-key and queue
// limits, nacks and clock moves, flag off and on, miniredis and Redis 7.0
// (flag on by FCALL of the new library against EVALSHA of the old
// scripts): every reply and every key was the same. These tests pin the
// edges that were checked: the reply's layout with acks and serves and with
// acks alone, a variant served several times in one call, the held fields,
// leases and TTL entries built from the two lists, the master score after a
// promotion (delayIndex's head nil: read, not taken as empty) and after the
// last run (removed), and admission with EnqueueMany on both sides of the
// bulk threshold (32 runs).

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

var tablesBackends = []backend{
	{Name: "Mini", Client: redistest.Mini},
	{Name: "Real", Client: redistest.Real},
}

// tablesModes: flag off; flag on as the Queue runs it (by FCALL of the
// library where the server has Functions); flag on by EVALSHA.
var tablesModes = []struct {
	name        string
	on, scripts bool
}{{"off", false, false}, {"on", true, false}, {"on-evalsha", true, true}}

func tablesSetup(t *testing.T, c redis.UniversalClient, on, scripts bool, mutate func(*runqueue.Config)) (*testBundle, keys.Queue) {
	t.Helper()
	b := setup(t, c, func(cfg *runqueue.Config) {
		cfg.VtimeScheduling, cfg.ScriptsOnly = on, scripts
		if mutate != nil {
			mutate(cfg)
		}
	})
	return b, keySpace(t, b).Env(env).Queue(queueName)
}

// TestReviewTablesDequeueReply: a call that acks and serves, then one that
// only acks. The acks' results come first in the order asked (a wrong
// token's lease_lost, an ack, the same ack again: 0), then four values a
// run; key a has four of the six runs, so the second call serves it at
// least twice. Each run comes with its own key, payload and the next
// token of the shard, in reply order; held, leases, key-inflight and the
// TTL set hold exactly the runs in flight under their own variant.
func TestReviewTablesDequeueReply(t *testing.T) {
	redistest.ForEachBackend(t, tablesBackends, func(t *testing.T, c redis.UniversalClient) {
		for _, m := range tablesModes {
			t.Run(m.name, func(t *testing.T) {
				b, qk := tablesSetup(t, c, m.on, m.scripts, nil)
				keyOf := map[string]string{"a1": "a", "a2": "a", "a3": "a", "a4": "a", "b1": "b", "c1": "c"}
				ttl := map[string]bool{"a2": true, "a4": true, "b1": true}
				for _, id := range []string{"a1", "a2", "a3", "a4", "b1", "c1"} {
					p := runqueue.EnqueueParams{ID: id, Key: keyOf[id], Payload: []byte("payload-" + id)}
					if ttl[id] {
						p.TTL = time.Hour
					}
					enqueue(t, b, p)
				}
				first := dequeue(t, b, queueName, 2)
				require.Len(t, first, 2)
				x, y := first[0], first[1]
				// (a new counter starts at the call's time in microseconds,
				// a multiple of 64: see lib/dequeue)
				t0 := x.Token - 1
				require.True(t, t0 > 0 && t0%64 == 0, "a new counter's start: %d", t0)
				require.Equal(t, []int64{t0 + 1, t0 + 2}, []int64{x.Token, y.Token})
				wrong := *y
				wrong.Token += 1000

				runs, ackErrs, err := b.q.AckAndDequeue(b.ctx, []*runqueue.Run{&wrong, x, x}, env, queueName, 10)
				require.NoError(t, err)
				require.Len(t, ackErrs, 3)
				require.ErrorIs(t, ackErrs[0], runqueue.ErrLeaseLost)
				require.NoError(t, ackErrs[1])
				require.NoError(t, ackErrs[2])
				require.Len(t, runs, 4)
				served := map[string]bool{x.ID: true, y.ID: true}
				perKey := map[string]int{}
				for i, r := range runs {
					require.False(t, served[r.ID], "%s served twice", r.ID)
					served[r.ID] = true
					require.Equal(t, keyOf[r.ID], r.Key, "run %d: %s", i, r.ID)
					require.Equal(t, "payload-"+r.ID, string(r.Payload))
					require.Equal(t, t0+int64(3+i), r.Token, "tokens in reply order")
					require.Equal(t, 1, r.Attempt)
					perKey[r.Key]++
				}
				require.Len(t, served, 6)
				require.GreaterOrEqual(t, perKey["a"], 2, "a variant served several times in one call")

				// In flight now: y (its own token) and the four.
				inflight := append([]*runqueue.Run{y}, runs...)
				wantHeld, wantLeases, wantKin := map[string]string{}, []string{}, map[string]int{}
				for _, r := range inflight {
					vm := keys.VariantMember(r.Key) + ":" + keys.Segment(r.ID)
					wantHeld[vm] = strconv.FormatInt(r.Token, 10)
					wantLeases = append(wantLeases, qk.RunPrefix()+vm)
					wantKin[r.Key]++
				}
				held, err := c.HGetAll(b.ctx, qk.Held()).Result()
				require.NoError(t, err)
				require.Equal(t, wantHeld, held)
				leases, err := c.ZRangeWithScores(b.ctx, qk.Leases(), 0, -1).Result()
				require.NoError(t, err)
				var gotLeases []string
				for _, z := range leases {
					gotLeases = append(gotLeases, z.Member.(string))
					require.Equal(t, float64(runs[0].LeaseDeadline.UnixMilli()), z.Score, "%v", z.Member)
				}
				sort.Strings(gotLeases)
				sort.Strings(wantLeases)
				require.Equal(t, wantLeases, gotLeases)
				for k, n := range wantKin {
					got, err := b.q.KeyInflight(b.ctx, env, queueName, k)
					require.NoError(t, err)
					require.Equal(t, n, got, "key %s", k)
				}
				// Every run with a TTL was served: none is left in the TTL set.
				require.Zero(t, c.ZCard(b.ctx, qk.TTL()).Val())

				// Acks only (maxCount 0): the results alone, nothing served.
				runs2, ackErrs2, err := b.q.AckAndDequeue(b.ctx, inflight, env, queueName, 0)
				require.NoError(t, err)
				require.Empty(t, runs2)
				require.Equal(t, make([]error, len(inflight)), ackErrs2)
				require.Zero(t, c.Exists(b.ctx, qk.Held(), qk.KeyInflight(), qk.Runs()).Val())
				require.Zero(t, c.ZCard(b.ctx, qk.Leases()).Val())
				require.Empty(t, dequeue(t, b, queueName, 10))
			})
		}
	})
}

// TestReviewTablesMasterAfterPromote: a dequeue that promotes a due run
// and serves it, emptying ckIndex, while another key's run waits: its
// delayIndex head was not looked at (nil), so master_refresh reads it and
// the queue stays in the shard master at that run's time (taken as empty,
// the queue would leave the master and DequeueShard would never find the
// run). The call that serves the last run removes the queue from it.
func TestReviewTablesMasterAfterPromote(t *testing.T) {
	redistest.ForEachBackend(t, tablesBackends, func(t *testing.T, c redis.UniversalClient) {
		for _, m := range tablesModes {
			t.Run(m.name, func(t *testing.T) {
				b, qk := tablesSetup(t, c, m.on, m.scripts, nil)
				t0 := b.clock.Now()
				enqueue(t, b, runqueue.EnqueueParams{ID: "soon", Key: "a", Delay: time.Second})
				enqueue(t, b, runqueue.EnqueueParams{ID: "later", Key: "b", Delay: 10 * time.Second})
				b.clock.Advance(time.Second)
				require.Equal(t, []string{"soon"}, runIDs(dequeue(t, b, queueName, 10)))
				score, err := c.ZScore(b.ctx, qk.Master(), qk.Member()).Result()
				require.NoError(t, err, "the queue left the shard master with a run delayed")
				require.Equal(t, float64(t0.Add(10*time.Second).UnixMilli()), score)

				b.clock.Advance(9 * time.Second)
				got, err := b.q.DequeueShard(b.ctx, b.q.ShardOf(env), 10)
				require.NoError(t, err)
				require.Equal(t, []string{"later"}, runIDs(got))
				require.ErrorIs(t, c.ZScore(b.ctx, qk.Master(), qk.Member()).Err(), redis.Nil,
					"nothing queued: the queue leaves the master")
			})
		}
	})
}

// TestReviewTablesEnqueueAdmission: EnqueueMany of 31, 32 and 40 runs
// (below and at or above the bulk threshold) with no limit, a queue depth
// limit, a key depth limit and both, each batch with a run stored already
// (retried: no-op), a conflict with a stored run, and an id twice in the
// batch (the second a no-op, or a conflict when its payload differs). Every
// answer and the depths are those of a run-by-run model: a stored id
// answers first, then the queue limit, then the key limit; a refused run
// is not stored, so its id again is judged again.
func TestReviewTablesEnqueueAdmission(t *testing.T) {
	type limits struct{ queue, key int }
	redistest.ForEachBackend(t, tablesBackends, func(t *testing.T, c redis.UniversalClient) {
		for _, m := range tablesModes {
			for _, lim := range []limits{{0, 0}, {20, 0}, {0, 7}, {20, 7}} {
				for _, n := range []int{31, 32, 40} {
					t.Run(fmt.Sprintf("%s/q%d-k%d/n%d", m.name, lim.queue, lim.key, n), func(t *testing.T) {
						b, _ := tablesSetup(t, c, m.on, m.scripts, func(cfg *runqueue.Config) {
							cfg.MaxQueueDepth, cfg.MaxKeyDepth = lim.queue, lim.key
						})
						type stored struct{ key, payload string }
						have := map[string]stored{}
						depth, keyDepth := 0, map[string]int{}
						model := func(p runqueue.EnqueueParams) runqueue.EnqueueResult {
							if s, ok := have[p.ID]; ok {
								if s.key == p.Key && s.payload == string(p.Payload) {
									return runqueue.EnqueueResult{}
								}
								return runqueue.EnqueueResult{Err: runqueue.ErrConflict}
							}
							if lim.queue > 0 && depth >= lim.queue {
								return runqueue.EnqueueResult{Err: &runqueue.QueueFullError{Scope: "queue", Limit: lim.queue}}
							}
							if lim.key > 0 && keyDepth[p.Key] >= lim.key {
								return runqueue.EnqueueResult{Err: &runqueue.QueueFullError{Scope: "key", Limit: lim.key}}
							}
							have[p.ID] = stored{p.Key, string(p.Payload)}
							depth++
							keyDepth[p.Key]++
							return runqueue.EnqueueResult{Queued: true}
						}
						mk := func(id, key, payload string, delayed bool) runqueue.EnqueueParams {
							p := runqueue.EnqueueParams{Env: env, Queue: queueName, ID: id, Key: key, Payload: []byte(payload)}
							if delayed {
								p.Delay = time.Minute
							}
							return p
						}
						// Stored before the batch: one run of key a, one of key b.
						pre := []runqueue.EnqueueParams{mk("old-a", "a", "x", false), mk("old-b", "b", "x", true)}
						for _, p := range pre {
							model(p)
							enqueue(t, b, p)
						}
						batch := []runqueue.EnqueueParams{mk("old-a", "a", "x", false), mk("old-b", "b", "other", false)}
						for i := 0; len(batch) < n-2; i++ {
							batch = append(batch, mk(fmt.Sprint("r", i), []string{"a", "b", "c"}[i%3], "p", i%4 == 3))
						}
						batch = append(batch, mk("r0", "a", "p", false), mk("r1", "b", "changed", false))
						require.Len(t, batch, n)
						want := make([]runqueue.EnqueueResult, n)
						for i, p := range batch {
							want[i] = model(p)
						}
						got, err := b.q.EnqueueMany(b.ctx, batch)
						if lim.queue == 0 && lim.key == 0 {
							require.NoError(t, err)
						}
						require.Len(t, got, n)
						for i := range batch {
							require.Equal(t, want[i].Queued, got[i].Queued, "run %d (%s)", i, batch[i].ID)
							switch w := want[i].Err; {
							case w == nil:
								require.NoError(t, got[i].Err, "run %d (%s)", i, batch[i].ID)
							case errors.Is(w, runqueue.ErrConflict):
								require.ErrorIs(t, got[i].Err, runqueue.ErrConflict, "run %d (%s)", i, batch[i].ID)
							default:
								require.Equal(t, w, got[i].Err, "run %d (%s)", i, batch[i].ID)
							}
						}
						s := queueStats(t, b, queueName)
						require.Equal(t, int64(depth), s.Ready+s.Delayed)
						for k, d := range keyDepth {
							ks, err := b.q.KeyStats(b.ctx, env, queueName, k)
							require.NoError(t, err)
							require.Equal(t, int64(d), ks.Ready+ks.Delayed, "key %s", k)
						}
					})
				}
			}
		}
	})
}
