package runqueue_test

import (
	"context"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/runqueue/runqueue/runqueue"
)

// TestDerivedVariantKeys: the dequeue scripts derive a variant's keys from
// its member (lua/lib/dequeue.lua), Go builds them with keys.Queue.Variant.
// For arbitrary concurrency keys, a run that Go queued under its variant's
// keys is found, served and removed by the script in both flag states, and
// nothing is left under any other name.
func TestDerivedVariantKeys(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		rapid.Check(t, func(rt *rapid.T) {
			key := rapid.StringMatching(`[^\x00]{0,40}`).Filter(validKey).Draw(rt, "key")
			on := rapid.Bool().Draw(rt, "flag")
			b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = on })
			ctx := context.Background()
			_, err := b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: key, ID: "r", Payload: []byte("p")})
			require.NoError(rt, err)
			runs, err := b.q.Dequeue(ctx, env, queueName, 1)
			require.NoError(rt, err)
			require.Len(rt, runs, 1, "key %q", key)
			require.Equal(rt, key, runs[0].Key)
			require.Equal(rt, "p", string(runs[0].Payload))
			require.NoError(rt, b.q.Ack(ctx, runs[0]))
			for _, k := range b.keysUnder(t) {
				require.Contains(rt, []string{"ckVtime", "ckVtimeState"}, k[strings.LastIndex(k, ":")+1:],
					"key %q left %s", key, k)
			}
		})
	})
}

// validKey is what Enqueue accepts as a concurrency key (see validate.go).
func validKey(s string) bool {
	if len(s) > 256 || !utf8.ValidString(s) || s == "." || s == ".." || strings.TrimSpace(s) != s {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}
