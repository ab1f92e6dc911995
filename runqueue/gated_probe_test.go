package runqueue_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// TestGatedProbeNotStarvedByKeysGatedAgain: guarantee 6's exception on
// every backend. Twenty keys are held at their limit of 1 (gated), the
// probe has looked at the first, and then another instance frees that
// key's slot without a word (a flag-off one, or a flag-on one with no key
// limit), while five busy keys at their limit are served, held 3 calls,
// acked by the flag-on instance (which un-gates them) and gated again. The
// freed key is probed, and served, within a lap of the gated keys. Before
// the probe moved a variant it found at its limit to the back of the
// gating order, the busy keys' new gating numbers always lay ahead of its
// cursor, which never went back to the first: the key was never served in
// 20,000 calls (a review on Redis 7.0.15; vtime's
// TestProbeNotStarvedByKeysGatedAgain is the model's case).
func TestGatedProbeNotStarvedByKeysGatedAgain(t *testing.T) {
	const gated, busy = 20, 5
	for _, rel := range []struct {
		name string
		mut  func(*runqueue.Config)
	}{
		{"FlagOffReleaser", func(cfg *runqueue.Config) { cfg.VtimeScheduling = false }},
		{"NoKeyLimitReleaser", func(cfg *runqueue.Config) { cfg.KeyConcurrency = 0 }},
	} {
		t.Run(rel.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
				b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling, cfg.KeyConcurrency = true, 1 })
				cfg := *b.cfg
				rel.mut(&cfg)
				other, err := runqueue.New(b.ctx, c, &cfg)
				require.NoError(t, err)
				t.Cleanup(func() { _ = other.Close() })
				n := 0
				enq := func(key string) {
					n++
					enqueue(t, b, runqueue.EnqueueParams{Key: key, ID: fmt.Sprintf("r%d", n)})
				}
				for i := 0; i < gated; i++ {
					enq(fmt.Sprintf("g%02d", i))
					enq(fmt.Sprintf("g%02d", i))
				}
				held := map[string]*runqueue.Run{}
				for _, r := range dequeue(t, b, queueName, 100) {
					held[r.Key] = r
				}
				require.Len(t, held, gated)
				require.Empty(t, dequeue(t, b, queueName, 100), "every g at its limit; the probe looks at g00")
				require.NoError(t, other.Ack(b.ctx, held["g00"])) // freed without a word
				for i := 0; i < busy; i++ {
					for j := 0; j < 4; j++ {
						enq(fmt.Sprintf("c%d", i))
					}
				}
				type hold struct {
					r    *runqueue.Run
					call int
				}
				var hs []hold
				for call := 0; call <= 10*(gated+busy); call++ {
					for len(hs) > 0 && hs[0].call+3 <= call {
						require.NoError(t, b.q.Ack(b.ctx, hs[0].r))
						enq(hs[0].r.Key)
						hs = hs[1:]
					}
					for _, r := range dequeue(t, b, queueName, 1) {
						if r.Key == "g00" {
							require.LessOrEqual(t, call, 1+gated+busy, "g00 served too late")
							return
						}
						hs = append(hs, hold{r, call})
					}
				}
				require.Fail(t, "g00, below its limit since its slot was freed without a word, was never served")
			})
		})
	}
}

// TestGatedProbeAlternatingKeyLimit: a LimitsFor that answers a queue's key
// limit 1, 2, 1, 2, ... from call to call. v and w are gated at 2 runs in
// flight; a flag-off instance acks one of v's runs, without a word. v is
// below its limit on every call of 2 and must be served on one. Before, a
// call of 2 did not un-gate anything (the variants were gated under 2),
// and with two gated keys v came to the probe's front only on the calls of
// 1, where it is at its limit: never served (vtime's
// TestProbeAlternatingKeyLimit is the model's case).
// Both phases run (the first call's limit 1 or 2): which of v and w is at
// the probe's front on the calls of 1 depends on the order they were gated.
func TestGatedProbeAlternatingKeyLimit(t *testing.T) {
	for _, phase := range []int{0, 1} {
		t.Run(fmt.Sprintf("phase=%d", phase), func(t *testing.T) { gatedProbeAlternating(t, phase) })
	}
}

func gatedProbeAlternating(t *testing.T, phase int) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		var limit atomic.Int64
		limit.Store(2)
		b := setup(t, c, func(cfg *runqueue.Config) {
			cfg.VtimeScheduling = true
			cfg.LimitsFor = func(string, string) runqueue.Limits { return runqueue.Limits{Key: int(limit.Load())} }
		})
		cfg := *b.cfg
		cfg.VtimeScheduling, cfg.LimitsFor = false, nil
		off, err := runqueue.New(b.ctx, c, &cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = off.Close() })
		for i := 0; i < 3; i++ {
			enqueue(t, b, runqueue.EnqueueParams{Key: "v", ID: fmt.Sprintf("v%d", i)})
			enqueue(t, b, runqueue.EnqueueParams{Key: "w", ID: fmt.Sprintf("w%d", i)})
		}
		var v *runqueue.Run
		for _, r := range dequeue(t, b, queueName, 100) {
			if r.Key == "v" {
				v = r
			}
		}
		require.NotNil(t, v)
		require.Empty(t, dequeue(t, b, queueName, 100), "v and w at their limit of 2")
		require.NoError(t, off.Ack(b.ctx, v))
		for call := 0; call < 10; call++ {
			limit.Store(int64(1 + (call+phase)%2))
			for _, r := range dequeue(t, b, queueName, 1) {
				if r.Key == "v" {
					require.EqualValues(t, 2, limit.Load(), "served under its limit")
					return
				}
			}
		}
		require.Fail(t, "v, below its limit on every call of 2, was not served in 10 calls")
	})
}
