package cli_test

// Review s28w: the CLI against a real redis-server at maxmemory
// (noeviction), the moment an operator reaches for it.

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// s28wServer starts a redis-server of t's own (no persistence) and
// returns a client of it.
func s28wServer(t *testing.T) *redis.Client {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("RUNQUEUE_REQUIRE_REDIS") == "1" {
			t.Fatal("redis-server is not on PATH (RUNQUEUE_REQUIRE_REDIS=1)")
		}
		t.Skip("redis-server is not on PATH")
	}
	// A port picked free may be taken by another spawn before this one
	// binds it, whose server then answers here: the answer must be this
	// child's (INFO process_id), else another port is tried.
	for attempt := 1; ; attempt++ {
		if c := s28wSpawn(t); c != nil {
			return c
		}
		require.Less(t, attempt, 3, "redis-server did not start on three ports")
	}
}

// s28wSpawn starts a redis-server on a free port; nil when the server that
// answers there is not the one started.
func s28wSpawn(t *testing.T) *redis.Client {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--dir", t.TempDir())
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port)})
	t.Cleanup(func() { _ = c.Close() })
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		require.True(t, time.Now().Before(deadline), "redis-server did not answer")
		time.Sleep(20 * time.Millisecond)
	}
	info, err := c.Info(context.Background(), "server").Result()
	require.NoError(t, err)
	if !strings.Contains(info, "process_id:"+strconv.Itoa(cmd.Process.Pid)+"\r\n") {
		return nil
	}
	return c
}

// TestS28WCLIOnFullRedis: Redis is full (maxmemory, noeviction) and the
// operator inspects it and frees memory from the shell. Expected: the
// read commands answer; `dead purge`, `dead delete` and `redrive` (which
// remove, or move a run the library settles with allow-oom) succeed and do
// what they say; `weight set` fails with Redis's OOM error and writes
// nothing. Both flag states of the CLI (-vtime).
//
// Fixed (CHANGES/2026-12-04-full-redis.md); it failed (-vtime=true; every run): every write command fails with "OOM
// command not allowed when used memory > 'maxmemory'" before doing
// anything: the command's runqueue.New loads the Functions library
// (FUNCTION LOAD, which Redis refuses on a full server even when the
// library is already there), library.load returns the OOM error "to fall
// back" (runqueue/library.go, `case isOOM(err): return err`), but
// scriptSet.load (runqueue/scripts.go:363-367) returns it from New instead
// of falling back to EVALSHA. See runqueue.TestS28WNewOnFullRedis. With
// -vtime=false all of it works.
func TestS28WCLIOnFullRedis(t *testing.T) {
	for _, vtime := range []bool{true, false} {
		t.Run(fmt.Sprintf("vtime=%v", vtime), func(t *testing.T) {
			c := s28wServer(t)
			b := demo(t, c)
			b.vtime = vtime
			require.Equal(t, [2]int64{2, 2}, deadCounts(t, b))
			require.NoError(t, c.ConfigSet(b.ctx, "maxmemory", "1").Err())
			t.Cleanup(func() { _ = c.ConfigSet(context.Background(), "maxmemory", "0").Err() })

			for _, args := range [][]string{
				{"stats", "prod"}, {"stats", "prod", "builds"}, {"dead", "list", "prod", "builds"},
				{"schedule", "prod", "builds"}, {"weight", "list", "prod", "builds"},
			} {
				r := b.run(t, args...)
				require.Equal(t, 0, r.code, "%v on a full Redis: %s", args, r.stderr)
			}
			r := b.run(t, "weight", "set", "prod", "builds", "acme", "3")
			require.NotEqual(t, 0, r.code, "weight set on a full Redis")
			require.Contains(t, r.stderr, "OOM")

			r = b.run(t, "redrive", "-key", "umbrella", "prod", "builds", "b-401")
			require.Equal(t, 0, r.code, "redrive on a full Redis: %s", r.stderr)
			require.Contains(t, r.stdout, "redriven")
			r = b.run(t, "dead", "delete", "-key", "globex", "prod", "builds", "b-202")
			require.Equal(t, 0, r.code, "dead delete on a full Redis: %s", r.stderr)
			require.Equal(t, [2]int64{0, 0}, deadCounts(t, b))
			st, err := b.q.KeyStats(b.ctx, "prod", "builds", "umbrella")
			require.NoError(t, err)
			require.EqualValues(t, 1, st.Ready, "the redriven run is queued")
		})
	}
}

// TestS28WCLIPurgeOnFullRedis: `dead purge` is the documented way to free
// the memory dead letters hold (README, "Dead letters"); on a full Redis,
// when it matters most, it must work.
//
// Fixed (CHANGES/2026-12-04-full-redis.md); it failed (-vtime=true; every run): refused with OOM, for the reason given
// at TestS28WCLIOnFullRedis (New fails on a full Redis with the flag on).
func TestS28WCLIPurgeOnFullRedis(t *testing.T) {
	for _, vtime := range []bool{true, false} {
		t.Run(fmt.Sprintf("vtime=%v", vtime), func(t *testing.T) {
			c := s28wServer(t)
			b := demo(t, c)
			b.vtime = vtime
			require.NoError(t, c.ConfigSet(b.ctx, "maxmemory", "1").Err())
			t.Cleanup(func() { _ = c.ConfigSet(context.Background(), "maxmemory", "0").Err() })
			r := b.run(t, "dead", "purge", "-before", "0s", "prod", "builds")
			require.Equal(t, 0, r.code, "dead purge on a full Redis: %s", r.stderr)
			t.Log(r.stdout)
			require.Equal(t, [2]int64{0, 0}, deadCounts(t, b))
		})
	}
}
