package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/runqueue/runqueue/internal/cli"
	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

func TestMain(m *testing.M) {
	// As cmd/runqueue does: the command reports a failed dial once.
	redis.SetLogger(quiet{})
	redistest.LeakCheckMain(m,
		// go-redis keeps a pool reaper per client until the client closes;
		// clients close in t.Cleanup, but the pool goroutine may lag.
		goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"),
	)
}

// backends are miniredis, a real redis-server and a three-node cluster.
var backends = []redistest.Backend{
	{Name: "Mini", Client: redistest.Mini},
	{Name: "Real", Client: redistest.Real},
	{Name: "Cluster", Client: redistest.Cluster},
}

// forEachBackend runs fn as a parallel subtest on each backend.
func forEachBackend(t *testing.T, fn func(t *testing.T, c redis.UniversalClient)) {
	redistest.ForEachBackend(t, backends, fn)
}

// urlOf is the -redis value that reaches c.
func urlOf(t testing.TB, c redis.UniversalClient) string {
	t.Helper()
	switch c := c.(type) {
	case *redis.ClusterClient:
		return "redis+cluster://" + strings.Join(c.Options().Addrs, ",")
	case *redis.Client:
		o := c.Options()
		u := url.URL{Scheme: "redis", Host: o.Addr, Path: fmt.Sprintf("/%d", o.DB)}
		if o.TLSConfig != nil {
			u.Scheme = "rediss"
		}
		if o.Username != "" || o.Password != "" {
			u.User = url.UserPassword(o.Username, o.Password)
		}
		return u.String()
	}
	t.Fatalf("unsupported client %T", c)
	return ""
}

// result is what one command line did.
type result struct {
	code           int
	stdout, stderr string
}

// runCLI runs one command line as the binary would.
func runCLI(t testing.TB, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := cli.Run(context.Background(), args, &out, &errb)
	return result{code, out.String(), errb.String()}
}

// ok requires the command to have succeeded and returns its stdout.
func (r result) ok(t testing.TB) string {
	t.Helper()
	require.Equal(t, cli.ExitOK, r.code, "stderr: %s", r.stderr)
	require.Empty(t, r.stderr)
	return r.stdout
}

// epoch is the writer's clock: runs die at a fixed time, so tables are
// exact.
var epoch = time.UnixMilli(1_700_000_000_000) // 2023-11-14T22:13:20Z

type fixedClock struct{}

func (fixedClock) Now() time.Time { return epoch }

// bundle is a deployment under its own prefix and the flags that reach it.
type bundle struct {
	ctx    context.Context
	client redis.UniversalClient
	url    string
	prefix string
	vtime  bool
	q      *runqueue.Queue // the deployment's writer
}

// setup opens a writer on c under a fresh prefix, as a deployment would.
func setup(t testing.TB, c redis.UniversalClient, vtime bool, mutate func(*runqueue.Config)) *bundle {
	t.Helper()
	b := &bundle{ctx: context.Background(), client: c, url: urlOf(t, c), prefix: redistest.Prefix(t), vtime: vtime}
	cfg := &runqueue.Config{Prefix: b.prefix, Clock: fixedClock{}, VtimeScheduling: vtime}
	if mutate != nil {
		mutate(cfg)
	}
	q, err := runqueue.New(b.ctx, c, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	b.q = q
	return b
}

// run runs a command line against the bundle's deployment.
func (b *bundle) run(t testing.TB, args ...string) result {
	t.Helper()
	return runCLI(t, append([]string{"-redis", b.url, "-prefix", b.prefix, fmt.Sprintf("-vtime=%v", b.vtime)}, args...)...)
}

// demo fills the bundle's deployment (flag on, key limit 1) with a queue
// prod/builds: acme has one run in flight and one ready (at its limit),
// globex (weight 2) and umbrella each have a dead-lettered run, initech one
// delayed run, and the runs without a key drained.
func demo(t testing.TB, c redis.UniversalClient) *bundle {
	t.Helper()
	b := setup(t, c, true, func(cfg *runqueue.Config) { cfg.KeyConcurrency = 1 })
	add := func(key, id string, delay time.Duration, payload string) {
		_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: "prod", Queue: "builds", Key: key, ID: id,
			Delay: delay, Payload: []byte(payload)})
		require.NoError(t, err)
	}
	add("acme", "b-101", 0, `{"repo":"acme/web"}`)
	add("acme", "b-102", 0, `{"repo":"acme/web"}`)
	add("globex", "b-201", 0, `{"repo":"globex/api"}`)
	add("globex", "b-202", 0, `{"repo":"globex/api"}`)
	// Ten years after the writer's clock: still ahead of the wall clock
	// the command reads.
	add("initech", "b-301", 10*365*24*time.Hour, `{"repo":"initech/tps"}`)
	add("umbrella", "b-401", 0, "\x00\x01binary")
	add("", "b-501", 0, `{"repo":"none"}`)
	require.NoError(t, b.q.SetWeight(b.ctx, "prod", "builds", "globex", 2))
	settle := func(n int) {
		runs, err := b.q.Dequeue(b.ctx, "prod", "builds", n)
		require.NoError(t, err)
		require.Len(t, runs, n)
		for _, r := range runs {
			switch {
			case r.Key == "umbrella" || r.ID == "b-202":
				_, err = b.q.Nack(b.ctx, r, &runqueue.NackOptions{DeadLetter: true})
			case r.Key != "acme":
				err = b.q.Ack(b.ctx, r)
			}
			require.NoError(t, err)
		}
	}
	settle(4) // b-101, b-201, b-401, b-501
	settle(1) // b-202
	return b
}

// ages hides the ages measured against the wall clock.
var ages = regexp.MustCompile(`(oldest ready +)\S+`)

func maskAges(s string) string { return ages.ReplaceAllString(s, "${1}AGE") }

// lines joins lines with newlines, for expected output.
func lines(ls ...string) string { return strings.Join(ls, "\n") + "\n" }

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}
