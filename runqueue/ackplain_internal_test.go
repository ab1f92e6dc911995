package runqueue

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
)

type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time { return c.t }

func ackPlainQueue(t *testing.T, c redis.UniversalClient, prefix string, keyLimit int) *Queue {
	t.Helper()
	q, err := New(context.Background(), c, &Config{Prefix: prefix, Shards: 1, VtimeScheduling: true,
		KeyConcurrency: keyLimit, Clock: fixedClock{time.UnixMilli(2_000_000_000_000)}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	return q
}

// ackPlainRuns queues 30 runs over 5 keys and takes n of them in flight.
func ackPlainRuns(t *testing.T, q *Queue, n int) []*Run {
	t.Helper()
	ctx := context.Background()
	for i := range 30 {
		_, err := q.Enqueue(ctx, EnqueueParams{Env: "env", Queue: "q", Key: fmt.Sprint("k", i%5), ID: fmt.Sprint("r", i),
			Payload: []byte("p"), Priority: i % 3})
		require.NoError(t, err)
	}
	var runs []*Run
	for len(runs) < n {
		got, err := q.Dequeue(ctx, "env", "q", 4)
		require.NoError(t, err)
		require.NotEmpty(t, got)
		runs = append(runs, got...)
	}
	return runs
}

// TestAckPlainWhenNothingGated: with the flag on, an ack runs the flag-off
// ack script while no per-key limit was met (its hooks would do nothing),
// and the flag-on ack once the instance met one, from then on.
func TestAckPlainWhenNothingGated(t *testing.T) {
	c := redistest.Private(t)
	ctx := context.Background()
	count := newEvalCounter(c)
	plain := ackPlainQueue(t, c, "plain", 0)
	require.NotNil(t, plain.scripts.ackPlain)
	require.NotEqual(t, plain.scripts.ack.sha, plain.scripts.ackPlain.sha)
	runs := ackPlainRuns(t, plain, 12)
	count.reset()
	require.NoError(t, plain.Ack(ctx, runs[0]))
	_, err := plain.AckMany(ctx, runs[1:4])
	require.NoError(t, err)
	require.Equal(t, 2, count.evalsha[plain.scripts.ackPlain.sha])
	require.Zero(t, count.evalsha[plain.scripts.ack.sha])

	// An instance whose queues have a per-key limit looks for gated
	// variants at every ack.
	limited := ackPlainQueue(t, c, "limited", 2)
	runs = ackPlainRuns(t, limited, 8)
	count.reset()
	require.NoError(t, limited.Ack(ctx, runs[0]))
	require.Equal(t, 1, count.evalsha[limited.scripts.ack.sha])
	require.Zero(t, count.evalsha[limited.scripts.ackPlain.sha])

	// The flag-off set has no second ack.
	off, err := buildScripts(false)
	require.NoError(t, err)
	require.Nil(t, off.ackPlain)
	require.Equal(t, off.ack.sha, plain.scripts.ackPlain.sha)
}

// TestAckPlainSameAsHookedAck: the flag-off ack leaves exactly what the
// flag-on ack without the gated look leaves: two queues under the same
// clock go through the same calls, one acking with the flag-off script,
// the other with the flag-on one, and every key holds the same afterwards
// (the runs acked, the held hash, the in-flight counts, the scheduler's
// state), and the next dequeues serve the same runs.
func TestAckPlainSameAsHookedAck(t *testing.T) {
	c := redistest.Private(t)
	ctx := context.Background()
	a, b := ackPlainQueue(t, c, "qa", 0), ackPlainQueue(t, c, "qb", 0)
	ra, rb := ackPlainRuns(t, a, 12), ackPlainRuns(t, b, 12)
	require.Equal(t, len(ra), len(rb))
	// Ack 8 of the 12 (and one twice: the second finds it gone).
	acks := []int{0, 2, 3, 5, 7, 8, 10, 11, 3}
	var pa, pb []*Run
	for _, i := range acks {
		pa, pb = append(pa, ra[i]), append(pb, rb[i])
	}
	_, err := a.AckMany(ctx, pa)
	require.NoError(t, err)
	nb := b.names("env", "q")
	args := []any{b.now(), nb.runPrefix, len(pb)}
	for _, r := range pb {
		args = append(args, nb.qk.Variant(r.Key).Member(), keys.Segment(r.ID), r.Token)
	}
	require.False(t, b.looksForGated(b.cfg.LimitsFor("env", "q")))
	ks, args := b.withHooks(b.scripts.ack, nb, nb.held, args)
	require.Len(t, ks, len(nb.held)+3, "the flag-on ack takes the scheduler's keys")
	cmds, err := runPipelined(ctx, b.rdb, []call{{sc: b.scripts.ack, keys: ks, args: args}})
	require.NoError(t, err)
	gotB, err := cmds[0].Slice()
	require.NoError(t, err)
	require.Equal(t, []any{int64(1), int64(1), int64(1), int64(1), int64(1), int64(1), int64(1), int64(1), int64(0)}, gotB)

	require.Equal(t, prefixDump(t, c, "qa"), prefixDump(t, c, "qb"))
	for range 6 {
		da, err := a.Dequeue(ctx, "env", "q", 3)
		require.NoError(t, err)
		db, err := b.Dequeue(ctx, "env", "q", 3)
		require.NoError(t, err)
		require.Equal(t, runKeysIDs(da), runKeysIDs(db))
	}
}

func runKeysIDs(runs []*Run) []string {
	var out []string
	for _, r := range runs {
		out = append(out, r.Key+"/"+r.ID)
	}
	return out
}

// prefixDump is every key under prefix with its value, the prefix cut off.
func prefixDump(t *testing.T, c redis.UniversalClient, prefix string) map[string]string {
	t.Helper()
	ctx := context.Background()
	ks, err := c.Keys(ctx, "{"+prefix+":*").Result()
	require.NoError(t, err)
	require.NotEmpty(t, ks)
	out := map[string]string{}
	for _, k := range ks {
		typ, err := c.Type(ctx, k).Result()
		require.NoError(t, err)
		var v any
		switch typ {
		case "string":
			v, err = c.Get(ctx, k).Result()
		case "hash":
			var h map[string]string
			h, err = c.HGetAll(ctx, k).Result()
			var fs []string
			for f, x := range h {
				fs = append(fs, f+"="+x)
			}
			sort.Strings(fs)
			v = fs
		case "zset":
			v, err = c.ZRangeWithScores(ctx, k, 0, -1).Result()
		default:
			t.Fatalf("key %s of type %s", k, typ)
		}
		require.NoError(t, err)
		out[strings.TrimPrefix(k, "{"+prefix)] = fmt.Sprint(typ, v)
	}
	return out
}
