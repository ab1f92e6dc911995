package runqueue_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(redistest.Wrap(m),
		// go-redis keeps a pool reaper per client until the client closes;
		// clients close in t.Cleanup, but the pool goroutine may lag.
		goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"),
	)
}

// backend is one kind of Redis a conformance test runs on.
type backend struct {
	name   string
	client func(t testing.TB) redis.UniversalClient
}

// backends are miniredis (always), a real redis-server and a three-node
// Redis Cluster (skipped without one, failed under RUNQUEUE_REQUIRE_REDIS=1).
var backends = []backend{
	{"Mini", redistest.Mini},
	{"Real", redistest.Real},
	{"Cluster", redistest.Cluster},
}

// forEachBackend runs fn as a subtest on every backend.
func forEachBackend(t *testing.T, fn func(t *testing.T, c redis.UniversalClient)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			fn(t, b.client(t))
		})
	}
}

// fakeClock is a settable clock for tests.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.UnixMilli(1_800_000_000_000)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// testBundle is what setup gives a test.
type testBundle struct {
	ctx    context.Context
	client redis.UniversalClient
	clock  *fakeClock
	cfg    *runqueue.Config
	q      *runqueue.Queue
	prefix string
}

// setup returns a Queue on c under a fresh key prefix and a fake clock.
// mutate, when non-nil, edits the config before New.
func setup(t testing.TB, c redis.UniversalClient, mutate func(*runqueue.Config)) *testBundle {
	t.Helper()
	b := &testBundle{ctx: context.Background(), client: c, clock: newFakeClock(), prefix: redistest.Prefix(t)}
	b.cfg = &runqueue.Config{Prefix: b.prefix, Clock: b.clock}
	if mutate != nil {
		mutate(b.cfg)
	}
	q, err := runqueue.New(b.ctx, c, b.cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	b.q = q
	return b
}

// keysUnder lists every key of the bundle's prefix, so tests can check what
// a call wrote; the shards' delivery token counters, which live for ever by
// design (a token never repeats), and the layout version are left out.
func (b *testBundle) keysUnder(t testing.TB) []string {
	t.Helper()
	var out []string
	pattern := "{" + b.prefix + ":*"
	scan := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			if k := iter.Val(); !strings.HasSuffix(k, ":tokens") && !strings.HasSuffix(k, ":layout") {
				out = append(out, iter.Val())
			}
		}
		return iter.Err()
	}
	switch c := b.client.(type) {
	case *redis.ClusterClient:
		var mu sync.Mutex
		require.NoError(t, c.ForEachMaster(b.ctx, func(ctx context.Context, n *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			return scan(ctx, n)
		}))
	case *redis.Client:
		require.NoError(t, scan(b.ctx, c))
	default:
		t.Fatalf("unsupported client %T", c)
	}
	return out
}

// dump returns every key of the bundle's prefix with a string rendering of
// its value, to compare states before and after a call.
func (b *testBundle) dump(t testing.TB) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, k := range b.keysUnder(t) {
		typ, err := b.client.Type(b.ctx, k).Result()
		require.NoError(t, err)
		var v any
		switch typ {
		case "string":
			v, err = b.client.Get(b.ctx, k).Result()
		case "hash":
			v, err = b.client.HGetAll(b.ctx, k).Result()
		case "set":
			var m []string
			m, err = b.client.SMembers(b.ctx, k).Result()
			v = sortedCopy(m)
		case "zset":
			v, err = b.client.ZRangeWithScores(b.ctx, k, 0, -1).Result()
		default:
			v = typ
		}
		require.NoError(t, err)
		out[k] = typeAndValue(typ, v)
	}
	return out
}
