package cli_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/cli"
	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
)

// readCommands are every command that must write nothing, with arguments
// that reach Redis: ones that succeed on the demo deployment and ones that
// fail there (no such run, invalid name), as text and as JSON, with the
// fair scheduler's flag on and off.
func readCommands() [][]string {
	base := [][]string{
		{"stats", "prod"},
		{"stats", "prod", "builds"},
		{"stats", "prod", "builds", "acme"},
		{"schedule", "-key-limit", "1", "prod", "builds"},
		{"schedule", "-n", "5", "prod", "builds"},
		{"preview", "prod", "builds"},
		{"preview", "-key-limit", "1", "-n", "3", "prod", "builds"},
		{"dead", "list", "prod", "builds"},
		{"dead", "list", "-offset", "1", "-limit", "1", "prod", "builds"},
		{"dead", "show", "-key", "globex", "prod", "builds", "b-202"},
		{"dead", "show", "-key", "umbrella", "-payload", "prod", "builds", "b-401"},
		{"dead", "show", "prod", "builds", "nope"},
		{"weight", "list", "prod", "builds"},
		{"stats", "prod", " builds"},
	}
	var out [][]string
	for _, args := range base {
		for _, extra := range [][]string{nil, {"-json"}, {"-vtime=false"}} {
			out = append(out, append(append([]string(nil), extra...), args...))
		}
	}
	return out
}

// TestReadCommandsWriteNothing runs every read command against a real
// Redis and compares every key of the database (DUMP and expiry time)
// before and after each one; on a Redis spawned for this test binary it
// also checks the commands the server ran (none with the write flag, no
// SCRIPT LOAD) and the script cache. Then it does the same on a prefix
// that holds nothing: no layout version may appear.
//
// It runs in database 15 of the shared server, which no other test uses,
// and not in parallel, so that nothing else writes while it compares.
func TestReadCommandsWriteNothing(t *testing.T) {
	ctx := context.Background()
	shared := redistest.Real(t)
	opt, err := redis.ParseURL(urlOf(t, shared))
	require.NoError(t, err)
	opt.DB = 15
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	// Spawned for this binary: no other process sends commands to it.
	alone := os.Getenv("REDIS_URL") == ""

	check := func(t *testing.T, b *bundle, args []string) {
		t.Helper()
		before := snapshot(t, c)
		var stats redistest.Stats
		if alone {
			stats, err = redistest.CommandStats(ctx, c)
			require.NoError(t, err)
		}
		scripts := cachedScripts(t, c)
		r := b.run(t, args...)
		require.Contains(t, []int{cli.ExitOK, cli.ExitFailure, cli.ExitUsage}, r.code)
		if alone {
			after, err := redistest.CommandStats(ctx, c)
			require.NoError(t, err)
			requireNoWrites(t, c, after.Sub(stats))
			require.Equal(t, scripts, cachedScripts(t, c), "no script loaded")
		}
		require.Equal(t, before, snapshot(t, c), "%q changed Redis", args)
	}

	t.Run("Deployment", func(t *testing.T) {
		b := demo(t, c)
		b.url = urlOf(t, c)
		for _, args := range readCommands() {
			check(t, b, args)
		}
		// The demo's run of each succeeds, so the check saw real work.
		require.Contains(t, b.run(t, "dead", "list", "prod", "builds").ok(t), "umbrella")
	})

	t.Run("EmptyPrefix", func(t *testing.T) {
		b := &bundle{ctx: ctx, client: c, url: urlOf(t, c), prefix: redistest.Prefix(t), vtime: true}
		for _, args := range readCommands() {
			check(t, b, args)
		}
		r := b.run(t, "stats", "prod", "builds")
		require.Equal(t, cli.ExitOK, r.code)
		require.Contains(t, r.stderr, "note: nothing under prefix")
		space, err := keys.NewSpace(b.prefix, 16)
		require.NoError(t, err)
		n, err := c.Exists(ctx, space.Layout()).Result()
		require.NoError(t, err)
		require.Zero(t, n, "a read command records no layout version")
		require.Empty(t, keysMatching(t, c, "{"+b.prefix+":*"))
	})
}

// TestReadCommandsWriteNothingMini is the key comparison on miniredis.
func TestReadCommandsWriteNothingMini(t *testing.T) {
	t.Parallel()
	m, c := redistest.MiniServer(t)
	b := demo(t, c)
	empty := &bundle{ctx: b.ctx, client: c, url: b.url, prefix: "empty", vtime: true}
	for _, bb := range []*bundle{b, empty} {
		for _, args := range readCommands() {
			before := m.Dump()
			bb.run(t, args...)
			require.Equal(t, before, m.Dump(), "%q changed Redis", args)
		}
	}
	for _, k := range m.Keys() {
		require.False(t, strings.HasPrefix(k, "{empty:"), k)
	}
}

// snapshot is every key of c's database with its serialized value and
// absolute expiry time.
func snapshot(t testing.TB, c *redis.Client) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	for _, k := range keysMatching(t, c, "*") {
		dump, err := c.Dump(ctx, k).Result()
		require.NoError(t, err)
		exp, err := c.Do(ctx, "PEXPIRETIME", k).Int64()
		require.NoError(t, err)
		out[k] = fmt.Sprintf("%d:%x", exp, dump)
	}
	return out
}

func keysMatching(t testing.TB, c *redis.Client, pattern string) []string {
	t.Helper()
	ctx := context.Background()
	var out []string
	iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		out = append(out, iter.Val())
	}
	require.NoError(t, iter.Err())
	return out
}

// cachedScripts is the size of the server's script cache.
func cachedScripts(t testing.TB, c *redis.Client) string {
	t.Helper()
	info, err := c.Info(context.Background(), "memory").Result()
	require.NoError(t, err)
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "number_of_cached_scripts:"); ok {
			return v
		}
	}
	t.Fatal("INFO memory has no number_of_cached_scripts")
	return ""
}

// requireNoWrites fails if the server ran a command flagged write, a
// script, or a script or function management command.
func requireNoWrites(t testing.TB, c *redis.Client, ran redistest.Stats) {
	t.Helper()
	require.NotEmpty(t, ran, "the command reached Redis")
	infos, err := c.Command(context.Background()).Result()
	require.NoError(t, err)
	for name := range ran {
		parent, _, sub := strings.Cut(name, "|")
		require.NotContains(t, []string{"script", "function", "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall",
			"fcall_ro"}, parent, "ran %s", name)
		if sub {
			continue // CLIENT SETINFO, CONFIG GET and the like: connection and server state
		}
		info, ok := infos[name]
		require.True(t, ok, "unknown command %s", name)
		require.NotContains(t, info.Flags, "write", "ran %s, a write command", name)
	}
}
