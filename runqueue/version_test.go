package runqueue_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// infoVersionHook answers every INFO with a reply whose server section
// reports redis_version version (none when version is ""), as a server of
// that version would; other commands go to the server.
type infoVersionHook struct{ version string }

func (h infoVersionHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h infoVersionHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		sc, ok := cmd.(*redis.StringCmd)
		if !ok || cmd.Name() != "info" {
			return next(ctx, cmd)
		}
		reply := "# Server\r\nredis_git_sha1:00000000\r\n"
		if h.version != "" {
			reply += "redis_version:" + h.version + "\r\n"
		}
		sc.SetVal(reply + "redis_mode:standalone\r\n")
		return nil
	}
}

func (h infoVersionHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestNewServerVersion: New refuses a Redis older than 6.2 (whose scripts
// would fail half-way, at ZADD LT or ZMSCORE), writing nothing, and skips
// the check where INFO is refused or reports no version.
func TestNewServerVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addr := ownRedis(t)
	admin := clientFor(t, &redis.Options{Addr: addr})
	newQueue := func(c redis.UniversalClient, cfg runqueue.Config) (*runqueue.Queue, error) {
		cfg.Prefix = redistest.Prefix(t)
		q, err := runqueue.New(ctx, c, &cfg)
		if q != nil {
			t.Cleanup(func() { _ = q.Close() })
		}
		return q, err
	}
	reporting := func(version string) *redis.Client {
		c := clientFor(t, &redis.Options{Addr: addr})
		c.AddHook(infoVersionHook{version})
		return c
	}

	for _, v := range []string{"6.0.16", "5.0.14", "6.1.9", "2.8.0", " 6.0.16 ", "6.1.240"} {
		for _, cfg := range []runqueue.Config{{}, {VtimeScheduling: true}, {ReadOnly: true}, {AllowEviction: true}} {
			q, err := newQueue(reporting(v), cfg)
			require.Nil(t, q, v)
			require.ErrorIs(t, err, runqueue.ErrServerVersion, v)
			require.NotErrorIs(t, err, runqueue.ErrInvalid)
			var ve *runqueue.ServerVersionError
			require.ErrorAs(t, err, &ve)
			require.Equal(t, strings.TrimSpace(v), ve.Version)
			require.Equal(t, addr, ve.Addr)
			require.Contains(t, err.Error(), "needs Redis "+runqueue.MinRedisVersion+" or later")
		}
	}
	keys, err := admin.Keys(ctx, "*").Result()
	require.NoError(t, err)
	require.Empty(t, keys, "a refused New wrote keys")
	mem, err := admin.Info(ctx, "memory").Result()
	require.NoError(t, err)
	require.Contains(t, mem, "number_of_cached_scripts:0\r\n", "a refused New loaded scripts")
	fns, err := admin.FunctionList(ctx, redis.FunctionListQuery{}).Result()
	require.NoError(t, err)
	require.Empty(t, fns, "a refused New loaded the Functions library")

	// 6.2 and later, a version that does not read as major.minor, and no
	// version at all are accepted; so is the server itself.
	for _, v := range []string{"6.2.0", "6.2.14", "7.0.15", "10.1.0", "", "unstable", "7"} {
		q, err := newQueue(reporting(v), runqueue.Config{VtimeScheduling: true})
		require.NoError(t, err, v)
		_, err = q.Enqueue(ctx, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "1"})
		require.NoError(t, err, v)
	}
	_, err = newQueue(admin, runqueue.Config{})
	require.NoError(t, err)

	t.Run("InfoNotAllowed", func(t *testing.T) {
		// A user without INFO, as on some managed services: NOPERM, so the
		// version cannot be read and the check is skipped.
		require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "noinfo", "on", ">pw", "~*", "&*", "+@all", "-info").Err())
		app := clientFor(t, &redis.Options{Addr: addr, Username: "noinfo", Password: "pw"})
		require.Error(t, app.Info(ctx, "server").Err())
		_, err := newQueue(app, runqueue.Config{})
		require.NoError(t, err)
	})
	t.Run("InfoRenamed", func(t *testing.T) {
		// INFO renamed away answers "unknown command": skipped too.
		addr := ownRedis(t, "--rename-command", "INFO", "")
		c := clientFor(t, &redis.Options{Addr: addr})
		require.Error(t, c.Info(ctx, "server").Err())
		_, err := newQueue(c, runqueue.Config{})
		require.NoError(t, err)
	})
	t.Run("Unreachable", func(t *testing.T) {
		// A server that does not answer is an error, not a skipped check.
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		gone := l.Addr().String()
		require.NoError(t, l.Close())
		c := clientFor(t, &redis.Options{Addr: gone, MaxRetries: -1, DialTimeout: time.Second})
		q, err := newQueue(c, runqueue.Config{AllowEviction: true})
		require.Nil(t, q)
		require.Error(t, err)
		require.NotErrorIs(t, err, runqueue.ErrServerVersion)
	})
}
