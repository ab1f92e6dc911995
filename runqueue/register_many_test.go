package runqueue_test

import (
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// Flag on, the variants one call makes ready register together after the
// call's other writes (sched_register_many, from the hooks of the scripts
// that move runs): one read and one write for all of them. What it leaves
// must be what the same runs leave in single-run calls, one registration
// at a time. TestVtimeDifferential checks it against the model (its
// "enqueue many" steps); these build the states it does not.

// parkAll gives each key one run, serves and acks them all: every key
// drains above V, so its tag is parked in ckVtime's idle region.
func parkAll(t *testing.T, b *testBundle, keys []string) {
	t.Helper()
	now := b.clock.Now()
	for i, k := range keys {
		enqueue(t, b, runqueue.EnqueueParams{Key: k, ID: fmt.Sprintf("p%d", i), Payload: []byte("x"), AvailableAt: now})
	}
	for served := 0; served < len(keys); {
		runs := dequeue(t, b, queueName, 10)
		require.NotEmpty(t, runs)
		ackAll(t, b, runs)
		served += len(runs)
	}
}

// TestRegisterManyStrayParked: the state hash is gone while ckVtime stays,
// holding the parked tag of key "a" (the hash deleted by hand or evicted).
// The call's first registration starts the state again, which drops the
// stray ckVtime: "a" then registers at V, not at the parked tag the call
// read before, whichever of "a" and a new key "b" comes first.
func TestRegisterManyStrayParked(t *testing.T) {
	redistest.ForEachBackend(t, memoBackends, func(t *testing.T, c redis.UniversalClient) {
		for _, order := range [][]string{{"b", "a"}, {"a", "b"}, {"b", "a", "c"}} {
			name := fmt.Sprint(order)
			t.Run(name, func(t *testing.T) {
				mk := func(serial bool) *testBundle {
					return setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling, cfg.SerialCalls = true, serial })
				}
				bm, bs := mk(false), mk(true)
				for _, b := range []*testBundle{bm, bs} {
					parkAll(t, b, []string{"a", "c", "z"})
					enqueue(t, b, runqueue.EnqueueParams{Key: "z", ID: "z1", Payload: []byte("x"), AvailableAt: b.clock.Now()})
					qk := reviewQK(t, b)
					parked, err := c.ZScore(b.ctx, qk.CkVtime(), "=a").Result()
					require.NoError(t, err, "a's tag is parked before the hash goes")
					require.Less(t, parked, 0.0)
					require.NoError(t, c.Del(b.ctx, qk.CkVtimeState()).Err())
				}
				var batch []runqueue.EnqueueParams
				for i, k := range order {
					batch = append(batch, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: k, ID: fmt.Sprintf("n%d", i),
						Payload: []byte("x"), AvailableAt: bm.clock.Now()})
				}
				for _, res := range enqueueBothWays(t, bm, bs, batch, name) {
					require.True(t, res.Queued)
				}
				requireSameOutcome(t, bs, bm, true, 2, name)
			})
		}
	})
}

// TestRegisterManyWide: every 64th registration looks at ckVtime's size to
// mark the keys wide, and inside one call that size counts the entries of
// the call's earlier registrations, not written yet (parked entries
// leaving, tags and lane entries arriving): the marks, the tags and the
// lane must be those of single calls. "fresh": one call of 100 new keys,
// whose 64th registration sees 64 entries (the sentinel and 63 tags);
// "parked": 40 keys drain (their tags parked) and a key holds a tag above
// V (newcomers queue in the lane), then calls bring back 30 of them with
// 270 new keys. Both the run-by-run path (31 runs) and the bulk path.
func TestRegisterManyWide(t *testing.T) {
	redistest.ForEachBackend(t, memoBackends, func(t *testing.T, c redis.UniversalClient) {
		for _, tc := range []struct {
			parked bool
			per    int
		}{{false, 100}, {true, 31}, {true, 100}} {
			name := fmt.Sprintf("parked=%v/calls of %d", tc.parked, tc.per)
			per := tc.per
			t.Run(name, func(t *testing.T) {
				mk := func(serial bool) *testBundle {
					return setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling, cfg.SerialCalls = true, serial })
				}
				bm, bs := mk(false), mk(true)
				var old, keys []string
				if tc.parked {
					for i := 0; i < 40; i++ {
						old = append(old, fmt.Sprintf("o%02d", i))
					}
					for _, b := range []*testBundle{bm, bs} {
						parkAll(t, b, old)
						enqueue(t, b, runqueue.EnqueueParams{Key: "busy", ID: "busy0", Payload: []byte("x"), AvailableAt: b.clock.Now()})
						enqueue(t, b, runqueue.EnqueueParams{Key: "busy", ID: "busy1", Payload: []byte("x"), AvailableAt: b.clock.Now()})
						ackAll(t, b, dequeue(t, b, queueName, 1))
					}
					keys = append(keys, old[:30]...)
					for i := 0; i < 270; i++ {
						keys = append(keys, fmt.Sprintf("n%03d", i))
					}
				} else {
					for i := 0; i < 100; i++ {
						keys = append(keys, fmt.Sprintf("n%03d", i))
					}
				}
				for from := 0; from < len(keys); from += per {
					var batch []runqueue.EnqueueParams
					for i, k := range keys[from:min(from+per, len(keys))] {
						batch = append(batch, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: k, ID: fmt.Sprintf("r%d", from+i),
							Payload: []byte("x"), AvailableAt: bm.clock.Now()})
					}
					for _, res := range enqueueBothWays(t, bm, bs, batch, name) {
						require.True(t, res.Queued)
					}
				}
				wide, err := c.HExists(bm.ctx, reviewQK(t, bm).CkVtimeState(), "~").Result()
				require.NoError(t, err)
				require.True(t, wide, "the keys were marked wide")
				requireSameOutcome(t, bs, bm, true, 10, name)
			})
		}
	})
}
