// Helpers shared by the test files of this package: backends, the test
// bundle a test gets from setup, a settable clock, and small enqueue,
// dequeue and inspection shortcuts.
package runqueue_test

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// backend is one kind of Redis a conformance test runs on.
type backend = redistest.Backend

// backends are miniredis (always), a real redis-server and a three-node
// Redis Cluster (skipped without one, failed under RUNQUEUE_REQUIRE_REDIS=1).
var backends = []backend{
	{Name: "Mini", Client: redistest.Mini},
	{Name: "Real", Client: redistest.Real},
	{Name: "Cluster", Client: redistest.Cluster},
}

// privateBackends are backends with the binary's own real Redis and
// cluster, for the tests that flush scripts or count commands.
var privateBackends = []backend{
	{Name: "Mini", Client: redistest.Mini},
	{Name: "Real", Client: redistest.Private},
	{Name: "Cluster", Client: redistest.PrivateCluster},
}

// forEachBackend runs fn as a subtest on every backend.
func forEachBackend(t *testing.T, fn func(t *testing.T, c redis.UniversalClient)) {
	redistest.ForEachBackend(t, backends, fn)
}

// forEachFlag runs fn with the scheduler flag off and on (subtests
// vtime=false and vtime=true), on every backend, each on a fresh bundle.
func forEachFlag(t *testing.T, fn func(t *testing.T, b *testBundle, on bool)) {
	forEachFlagWith(t, nil, fn)
}

// forEachFlagWith is forEachFlag with mutate (when non-nil) editing each
// bundle's config after the flag is set.
func forEachFlagWith(t *testing.T, mutate func(*runqueue.Config), fn func(t *testing.T, b *testBundle, on bool)) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
				fn(t, setup(t, c, func(cfg *runqueue.Config) {
					cfg.VtimeScheduling = on
					if mutate != nil {
						mutate(cfg)
					}
				}), on)
			})
		})
	}
}

// keySpace is the key space of the bundle's prefix and shards.
func keySpace(t testing.TB, b *testBundle) keys.Space {
	t.Helper()
	space, err := keys.NewSpace(b.prefix, b.q.Shards())
	require.NoError(t, err)
	return space
}

// fakeClock is a settable clock for tests.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

// newFakeClock starts in 2033, years ahead of the servers' clocks (the
// tests' other fixed clocks start there too): a dequeue moves the shard's
// token counter up to the later of the call's time and the server's
// (lib/dequeue.lua), so the tokens, and with them the wide marks
// (lib/held.lua) and every state a test compares, follow the fake clock
// only while it is ahead of the real one. (Five plain-ack tests fail
// with a fixed clock behind the real one even on the scripts from before
// the server's clock counted; not looked into.)
// TestFakeClockAheadOfServers says when that no longer holds.
func newFakeClock() *fakeClock {
	return &fakeClock{t: time.UnixMilli(2_000_000_000_000)}
}

// TestFakeClockAheadOfServers: the fake clocks' start is at least a year
// ahead of the real time (see newFakeClock); move it on when this fails.
func TestFakeClockAheadOfServers(t *testing.T) {
	start := newFakeClock().Now()
	require.True(t, start.After(time.Now().AddDate(1, 0, 0)),
		"the tests' fake clocks start at %v, less than a year ahead of now: move them on", start)
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

// expiresOnItsOwn says whether k is a key the flag-on scripts leave, with a
// TTL, once every run is gone: a queue's scheduler state (ckVtime,
// ckVtimeState: StateTTL) and an env's waiting line (waiting, waitingU:
// the life of its longest-lived mark).
func expiresOnItsOwn(k string) bool {
	for _, s := range []string{":ckVtime", ":ckVtimeState", ":waiting", ":waitingU"} {
		if strings.HasSuffix(k, s) {
			return true
		}
	}
	return false
}

// prefixKeys lists every key under prefix, on a single node or on every
// master of a cluster.
func prefixKeys(t testing.TB, client redis.UniversalClient, prefix string) []string {
	t.Helper()
	var out []string
	pattern := "{" + prefix + ":*"
	scan := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			out = append(out, iter.Val())
		}
		return iter.Err()
	}
	ctx := context.Background()
	switch c := client.(type) {
	case *redis.ClusterClient:
		var mu sync.Mutex
		require.NoError(t, c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			return scan(ctx, n)
		}))
	case *redis.Client:
		require.NoError(t, scan(ctx, c))
	default:
		t.Fatalf("unsupported client %T", c)
	}
	return out
}

// keysUnder lists every key of the bundle's prefix, so tests can check what
// a call wrote; the shards' delivery token counters, which live for ever by
// design (a token never repeats), and the layout version are left out.
func (b *testBundle) keysUnder(t testing.TB) []string {
	t.Helper()
	var out []string
	for _, k := range prefixKeys(t, b.client, b.prefix) {
		if !strings.HasSuffix(k, ":tokens") && !strings.HasSuffix(k, ":layout") {
			out = append(out, k)
		}
	}
	return out
}

// keyValue renders key k's type and value, to compare states before and
// after a call.
func keyValue(t testing.TB, c redis.UniversalClient, k string) string {
	t.Helper()
	ctx := context.Background()
	typ, err := c.Type(ctx, k).Result()
	require.NoError(t, err)
	var v any
	switch typ {
	case "string":
		v, err = c.Get(ctx, k).Result()
	case "hash":
		v, err = c.HGetAll(ctx, k).Result()
	case "set":
		var m []string
		m, err = c.SMembers(ctx, k).Result()
		v = sortedCopy(m)
	case "zset":
		v, err = c.ZRangeWithScores(ctx, k, 0, -1).Result()
	default:
		v = typ
	}
	require.NoError(t, err)
	return typeAndValue(typ, v)
}

// reopen replaces the bundle's Queue with one of its config as edit
// leaves it, closed at the test's end.
func (b *testBundle) reopen(t testing.TB, edit func(cfg *runqueue.Config)) {
	t.Helper()
	edit(b.cfg)
	q, err := runqueue.New(b.ctx, b.client, b.cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	b.q = q
}

// dump returns every key of the bundle's prefix with a string rendering of
// its value, to compare states before and after a call.
func (b *testBundle) dump(t testing.TB) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, k := range b.keysUnder(t) {
		out[k] = keyValue(t, b.client, k)
	}
	return out
}

const env, queueName = "env", "q"

// enqueue queues p, which must be new; an empty Env or Queue means env or
// queueName.
func enqueue(t testing.TB, b *testBundle, p runqueue.EnqueueParams) {
	t.Helper()
	if p.Env == "" {
		p.Env = env
	}
	if p.Queue == "" {
		p.Queue = queueName
	}
	ok, err := b.q.Enqueue(b.ctx, p)
	require.NoError(t, err)
	require.True(t, ok, "enqueue of %s must queue a new run", p.ID)
}

func dequeue(t testing.TB, b *testBundle, queue string, n int) []*runqueue.Run {
	t.Helper()
	runs, err := b.q.Dequeue(b.ctx, env, queue, n)
	require.NoError(t, err)
	return runs
}

func runIDs(runs []*runqueue.Run) []string {
	out := make([]string, len(runs))
	for i, r := range runs {
		out[i] = r.ID
	}
	return out
}

func queueStats(t testing.TB, b *testBundle, queue string) runqueue.Stats {
	t.Helper()
	s, err := b.q.QueueStats(b.ctx, env, queue)
	require.NoError(t, err)
	return s
}

func ackAll(t testing.TB, b *testBundle, runs []*runqueue.Run) {
	t.Helper()
	for _, r := range runs {
		require.NoError(t, b.q.Ack(b.ctx, r))
	}
}

func sortedCopy(s []string) []string {
	out := append([]string(nil), s...)
	sort.Strings(out)
	return out
}

func typeAndValue(typ string, v any) string { return fmt.Sprintf("%s:%v", typ, v) }

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// wallClock switches a bundle to the real clock: blocking calls sleep in
// real time.
func wallClock(c *runqueue.Config) { c.Clock = nil }

// otherClient opens a second client to the same server, so that work can
// come from another process's connection.
func otherClient(t testing.TB, c redis.UniversalClient) redis.UniversalClient {
	t.Helper()
	var o redis.UniversalClient
	switch c := c.(type) {
	case *redis.ClusterClient:
		o = redis.NewClusterClient(c.Options())
	case *redis.Client:
		o = redis.NewClient(c.Options())
	default:
		t.Fatalf("unsupported client %T", c)
	}
	t.Cleanup(func() { _ = o.Close() })
	return o
}

// enqueueMany enqueues n runs built by param from 8 goroutines, to fill
// large backlogs quickly.
func enqueueMany(t testing.TB, b *testBundle, n int, param func(i int) runqueue.EnqueueParams) {
	t.Helper()
	const workers = 8
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				ok, err := b.q.Enqueue(b.ctx, param(i))
				if err == nil && !ok {
					err = fmt.Errorf("run %d was not queued", i)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// afterEach is a go-redis hook that calls the function with each command
// the client sends and its error, once answered (in pipelines too).
type afterEach func(cmd redis.Cmder, err error)

func (f afterEach) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f afterEach) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		// Process sets cmd's error from this return value only after the
		// hooks have returned.
		f(cmd, err)
		return err
	}
}

func (f afterEach) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			f(cmd, cmd.Err())
		}
		return err
	}
}

// infoInt is the integer field of INFO section on c's server.
func infoInt(t testing.TB, c redis.UniversalClient, section, field string) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), section).Result()
	require.NoError(t, err)
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatalf("no %s in INFO %s", field, section)
	return 0
}

// nopHook passes every dial, command and pipeline on: a test's go-redis
// hook embeds it and overrides what it changes.
type nopHook struct{}

func (nopHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (nopHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (nopHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
