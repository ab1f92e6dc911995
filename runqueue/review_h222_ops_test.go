package runqueue_test

// helper-222 (layout 9, 6e1ca0a): the commands a release sends in an env
// over its limit (commandstats, on a server of its own). (Its comparison
// of a random sequence's commands at one env limit on layout 8's and 9's
// trees, by MONITOR, was run by hand and not kept: docs/design.md section
// 6 gives its result.)

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// h222Stats is INFO commandstats: command -> calls (INFO, CONFIG and
// the like left out).
func h222Stats(t *testing.T, b *testBundle) map[string]int {
	t.Helper()
	info, err := b.client.Info(b.ctx, "commandstats").Result()
	require.NoError(t, err)
	out := map[string]int{}
	for _, l := range strings.Split(info, "\n") {
		l = strings.TrimSpace(l)
		if !strings.HasPrefix(l, "cmdstat_") {
			continue
		}
		name, rest, _ := strings.Cut(strings.TrimPrefix(l, "cmdstat_"), ":")
		switch name {
		case "info", "config", "config|resetstat", "config|set", "config|get", "ping", "hello", "client|setinfo", "client":
			continue
		}
		var n int
		_, err := fmt.Sscanf(rest, "calls=%d", &n)
		require.NoError(t, err)
		out[name] = n
	}
	return out
}

func h222Fmt(m map[string]int) string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var sb strings.Builder
	for _, k := range ks {
		fmt.Fprintf(&sb, "%s=%d ", k, m[k])
	}
	return sb.String()
}

func h222OwnSetup(t *testing.T, lim *h219Limits) *testBundle {
	c := redis.NewClient(&redis.Options{Addr: ownRedis(t)})
	t.Cleanup(func() { _ = c.Close() })
	return setup(t, c, func(cfg *runqueue.Config) {
		cfg.VtimeScheduling = true
		cfg.LimitsFor = lim.get
		cfg.BlockPollInterval = 30 * time.Second
	})
}

// TestH222OverLimitReleaseOps: one env limit, lowered below the env's
// count (3 in flight, limit 1), 15 queues waiting in the line, their marks
// renewed at the lowered limit. A plain Ack of a run leaves the env over
// its limit: no mark can take a slot, and none is woken. Layout 8 read
// nothing of the line then; layout 9 reads it while the line's highest
// limit ("^", 3 since the marks were first written) is above the count:
// at most its four reads, then, at a count of 3 or more by "^", nothing.
func TestH222OverLimitReleaseOps(t *testing.T) {
	lim := &h219Limits{def: 3}
	b := h222OwnSetup(t, lim)
	ewEnqueue(t, b, "qa", 3)
	runs, err := b.q.Dequeue(b.ctx, env, "qa", 3)
	require.NoError(t, err)
	require.Len(t, runs, 3)
	ewMarkEach(t, b, 15)
	lim.setAll(1)
	// (each queue's consumer calls again: its mark, renewed in place, now
	// holds the lowered limit)
	for i := range 15 {
		require.Empty(t, ewTake(t, b, nil, fmt.Sprintf("w%02d", i)))
	}
	for i := range 2 {
		require.NoError(t, b.client.ConfigResetStat(b.ctx).Err())
		require.NoError(t, b.q.Ack(b.ctx, runs[i]))
		st := h222Stats(t, b)
		t.Logf("over-limit ack %d (count %d after): %s", i, 2-i, h222Fmt(st))
		require.LessOrEqual(t, st["zrangebyscore"], 4, "at most the line's four reads")
		require.Zero(t, st["publish"], "no mark can take a slot: none is woken")
	}
	// A line whose marks were all written at the lowered limit: its "^"
	// is 1, and a release at a count of 1 reads nothing of it.
	ewEnqueue(t, b, "qa", 1)
	lim.setAll(3)
	require.Len(t, ewTake(t, b, nil, "qa"), 1) // (count 2)
	lim.setAll(1)
	require.NoError(t, b.client.Del(b.ctx, ewSpace(t, b).Env(env).Waiting(), ewSpace(t, b).Env(env).WaitingUntil()).Err())
	for i := range 3 {
		require.Empty(t, ewTake(t, b, nil, fmt.Sprintf("w%02d", i)))
	}
	require.NoError(t, b.client.ConfigResetStat(b.ctx).Err())
	require.NoError(t, b.q.Ack(b.ctx, runs[2]))
	st := h222Stats(t, b)
	t.Logf("ack at a count of 1, the line's limits all 1: %s", h222Fmt(st))
	require.Zero(t, st["zrangebyscore"]+st["time"], "nothing of the line is read")
	require.Equal(t, 1, st["hget"], "but its highest limit")
}
