package runqueue_test

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// ownRedis starts a redis-server for t alone, with extra arguments, and
// returns its address. The shared server of the test binary must keep its
// config, so tests that change maxmemory-policy or ACLs use this one. Skips
// without redis-server on PATH, or fails under RUNQUEUE_REQUIRE_REDIS=1.
func ownRedis(t *testing.T, extra ...string) string {
	t.Helper()
	return ownServer(t, extra...).addr
}

// ownProc is a redis-server of ownServer's (no persistence).
type ownProc struct {
	bin, dir, addr string
	args           []string
	cmd            *exec.Cmd
	exited         chan struct{}
}

// ownServer is ownRedis with a handle that can restart the server.
func ownServer(t *testing.T, extra ...string) *ownProc {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("RUNQUEUE_REQUIRE_REDIS") == "1" {
			t.Fatal("redis-server is not on PATH (RUNQUEUE_REQUIRE_REDIS=1)")
		}
		t.Skip("redis-server is not on PATH")
	}
	p := &ownProc{bin: bin, dir: t.TempDir()}
	var lastErr error
	// Another process may take the free port before redis-server binds it;
	// the next attempt picks another.
	for range 3 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		port := l.Addr().(*net.TCPAddr).Port
		require.NoError(t, l.Close())
		p.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		p.args = append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
			"--appendonly", "no", "--daemonize", "no", "--dir", p.dir}, extra...)
		if lastErr = p.start(t); lastErr == nil {
			t.Cleanup(p.stop)
			return p
		}
	}
	t.Fatalf("redis-server: %v", lastErr)
	return nil
}

// start runs the server and waits for its PONG; a server that does not
// answer is stopped.
func (p *ownProc) start(t *testing.T) error {
	t.Helper()
	p.cmd = exec.Command(p.bin, p.args...)
	require.NoError(t, p.cmd.Start())
	p.exited = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(p.cmd, p.exited)
	err := waitPing(p.addr, p.exited)
	if err != nil {
		p.stop()
	}
	return err
}

func (p *ownProc) stop() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
	p.cmd = nil
}

// restart stops the server (its data, script cache and functions go: no
// persistence) and starts it again on the same address.
func (p *ownProc) restart(t *testing.T) {
	t.Helper()
	p.stop()
	require.NoError(t, p.start(t))
}

func waitPing(addr string, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	defer func() { _ = c.Close() }()
	for c.Ping(ctx).Err() != nil {
		select {
		case <-exited:
			return errors.New("exited during startup")
		case <-ctx.Done():
			return errors.New("no PONG within 10s")
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

func clientFor(t *testing.T, opt *redis.Options) *redis.Client {
	t.Helper()
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestNewEvictionPolicy: New refuses a Redis that may evict keys unless
// Config.AllowEviction is set, and skips the check where CONFIG is refused.
func TestNewEvictionPolicy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addr := ownRedis(t, "--maxmemory-policy", "allkeys-lru")
	admin := clientFor(t, &redis.Options{Addr: addr})
	newQueue := func(c redis.UniversalClient, allow bool) (*runqueue.Queue, error) {
		q, err := runqueue.New(ctx, c, &runqueue.Config{Prefix: redistest.Prefix(t), AllowEviction: allow})
		if q != nil {
			t.Cleanup(func() { _ = q.Close() })
		}
		return q, err
	}

	// The subtests run in order: the last ones change the server's config.
	t.Run("Refused", func(t *testing.T) {
		q, err := newQueue(admin, false)
		require.Nil(t, q)
		require.ErrorIs(t, err, runqueue.ErrEvictionPolicy)
		require.NotErrorIs(t, err, runqueue.ErrInvalid)
		var ee *runqueue.EvictionPolicyError
		require.ErrorAs(t, err, &ee)
		require.Equal(t, "allkeys-lru", ee.Policy)
		require.Equal(t, addr, ee.Addr)
		require.Contains(t, err.Error(), "set maxmemory-policy noeviction")
		require.Contains(t, err.Error(), "Config.AllowEviction")
		keys, err := admin.Keys(ctx, "*").Result()
		require.NoError(t, err)
		require.Empty(t, keys, "a refused New wrote keys")
	})
	t.Run("AllowEviction", func(t *testing.T) {
		q, err := newQueue(admin, true)
		require.NoError(t, err)
		ok, err := q.Enqueue(ctx, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "1"})
		require.NoError(t, err)
		require.True(t, ok)
	})
	t.Run("ConfigNotAllowed", func(t *testing.T) {
		// A user without CONFIG, as on some managed services: NOPERM, so the
		// policy cannot be read and the check is skipped.
		require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-config").Err())
		app := clientFor(t, &redis.Options{Addr: addr, Username: "app", Password: "pw"})
		require.Error(t, app.ConfigGet(ctx, "maxmemory-policy").Err())
		_, err := newQueue(app, false)
		require.NoError(t, err)
	})
	t.Run("CommandRenamed", func(t *testing.T) {
		// CONFIG renamed away answers "unknown command": skipped too.
		addr := ownRedis(t, "--maxmemory-policy", "volatile-lru", "--rename-command", "CONFIG", "")
		_, err := newQueue(clientFor(t, &redis.Options{Addr: addr}), false)
		require.NoError(t, err)
	})
	t.Run("NoEviction", func(t *testing.T) {
		require.NoError(t, admin.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
		_, err := newQueue(admin, false)
		require.NoError(t, err)
	})
}

// TestNewEvictionPolicyMini: miniredis has no CONFIG command; New does not
// refuse it.
func TestNewEvictionPolicyMini(t *testing.T) {
	t.Parallel()
	q, err := runqueue.New(context.Background(), redistest.Mini(t), &runqueue.Config{Prefix: redistest.Prefix(t)})
	require.NoError(t, err)
	require.NoError(t, q.Close())
}
