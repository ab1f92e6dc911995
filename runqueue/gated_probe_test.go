package runqueue_test

import (
	"fmt"
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
