package redistest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/runqueue/runqueue/keys"
)

func TestMain(m *testing.M) {
	LeakCheckMain(m)
}

func TestPrefix(t *testing.T) {
	t.Parallel()

	seen := map[string]bool{}
	f := &failedTB{TB: t} // (its cleanups, which would look for keys, never run)
	for range 1000 {
		p := Prefix(f)
		require.Regexp(t, regexp.MustCompile(`^t[0-9a-f]{8}$`), p)
		require.False(t, seen[p], "duplicate prefix %q", p)
		seen[p] = true
	}
}

func TestMini(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	m, c := MiniServer(t)
	key := Prefix(t) + ":k"
	require.NoError(t, c.Set(ctx, key, "v", time.Minute).Err())
	require.Equal(t, "v", c.Get(ctx, key).Val())

	m.FastForward(2 * time.Minute)
	require.ErrorIs(t, c.Get(ctx, key).Err(), redis.Nil)

	require.NoError(t, Mini(t).Ping(ctx).Err())
}

func TestReal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	c1, c2 := Real(t), Real(t)
	require.NoError(t, c1.Ping(ctx).Err())

	key := Prefix(t) + ":k"
	require.NoError(t, c1.Set(ctx, key, "v", time.Minute).Err())
	require.Equal(t, "v", c2.Get(ctx, key).Val(), "both clients reach the one shared server")
}

// TestPrivate: Private is a server of the binary's own, not Real's when
// Real is a REDIS_URL, and one per binary.
func TestPrivate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p1, p2 := Private(t), Private(t)
	key := Prefix(t) + ":k"
	require.NoError(t, p1.Set(ctx, key, "v", time.Minute).Err())
	require.Equal(t, "v", p2.Get(ctx, key).Val(), "one private server per binary")
	require.NotEmpty(t, private.source())
	require.False(t, strings.HasPrefix(private.source(), originURL.String()), private.source())
	if url := os.Getenv("REDIS_URL"); url != "" {
		opt, err := redis.ParseURL(url)
		require.NoError(t, err)
		require.NotEqual(t, opt.Addr, p1.(*redis.Client).Options().Addr, "Private never uses REDIS_URL")
	}
}

// Not parallel: command statistics are server-wide (and the server is the
// binary's own: Private).
func TestRealCommandStats(t *testing.T) {
	ctx := context.Background()
	c := Private(t)
	testCommandStats(ctx, t, c, Prefix(t))
}

func TestCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := Cluster(t)
	require.IsType(t, &redis.ClusterClient{}, c)

	info, err := c.ClusterInfo(ctx).Result()
	require.NoError(t, err)
	require.Contains(t, info, "cluster_state:ok")
	require.Equal(t, int64(12182), c.ClusterKeySlot(ctx, "foo").Val())

	// Keys of different slots in one script fail; one hash tag makes them legal.
	p := Prefix(t)
	const script = `redis.call('SET', KEYS[1], 1); redis.call('SET', KEYS[2], 1); return 1`
	err = c.Eval(ctx, script, []string{p + ":a", p + ":b"}).Err()
	require.ErrorContains(t, err, "CROSSSLOT")
	require.NoError(t, c.Eval(ctx, script, []string{"{" + p + "}:a", "{" + p + "}:b"}).Err())
}

// TestClusterNodes checks the spawned cluster's shape: three masters, each
// serving one third of the slots, and every node agreeing on it.
func TestClusterNodes(t *testing.T) {
	t.Parallel()
	if os.Getenv("REDIS_CLUSTER_ADDRS") != "" {
		t.Skip("the shape of a REDIS_CLUSTER_ADDRS cluster is its owner's")
	}
	ctx := context.Background()
	c := Cluster(t)
	masters, err := Masters(ctx, c)
	require.NoError(t, err)
	require.Len(t, masters, 3)
	require.Regexp(t, `^spawned 3-node cluster of redis-server \d+\.\d+\.\d+ \(/.*redis-server\)$`, ClusterSource())

	want := map[slotRange]string{}
	for _, r := range slotRanges(3) {
		addr, err := NodeOf(ctx, c, slotKey(t, r.start))
		require.NoError(t, err)
		last, err := NodeOf(ctx, c, slotKey(t, r.end))
		require.NoError(t, err)
		require.Equal(t, addr, last, "slots %d-%d on one node", r.start, r.end)
		want[r] = addr
	}
	require.Len(t, want, 3, "one range per master: %v", want)
	for _, addr := range masters {
		n := redis.NewClient(&redis.Options{Addr: addr})
		require.NoError(t, nodeAgrees(ctx, n, 3, want), "node %s", addr)
		require.NoError(t, n.Close())
	}
}

// slotKey returns a key of the given hash slot.
func slotKey(t *testing.T, slot int) string {
	t.Helper()
	for i := range 1 << 20 {
		k := "k" + strconv.Itoa(i)
		if keys.Slot(k) == slot {
			return k
		}
	}
	t.Fatalf("no key found for slot %d", slot)
	return ""
}

// TestClusterShardsSpread checks that the shards of one prefix, {rq:0},
// {rq:1}, ..., land on more than one node, that each key is stored on the
// node NodeOf names, and that a script on one shard's keys runs wherever
// that shard lives.
func TestClusterShardsSpread(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := Cluster(t)
	masters, err := Masters(ctx, c)
	require.NoError(t, err)
	if len(masters) < 2 {
		t.Skipf("a one-master cluster (%v) cannot spread keys", masters)
	}

	p := Prefix(t)
	byNode := map[string][]int{}
	for shard := range 16 {
		tag := fmt.Sprintf("{%s:%d}", p, shard)
		const script = `redis.call('SET', KEYS[1], ARGV[1]); redis.call('SET', KEYS[2], ARGV[1]); return 1`
		require.NoError(t, c.Eval(ctx, script, []string{tag + ":a", tag + ":b"}, shard).Err())

		addr, err := NodeOf(ctx, c, tag+":a")
		require.NoError(t, err)
		byNode[addr] = append(byNode[addr], shard)

		n := redis.NewClient(&redis.Options{Addr: addr})
		require.Equal(t, int64(2), n.Exists(ctx, tag+":a", tag+":b").Val(), "shard %d stored on %s", shard, addr)
		require.NoError(t, n.Close())
	}
	t.Logf("shards by node: %v", byNode)
	require.Greater(t, len(byNode), 1, "16 shards all on one node: %v", byNode)
}

func TestSlotRanges(t *testing.T) {
	t.Parallel()
	for n := 1; n <= 5; n++ {
		r := slotRanges(n)
		require.Len(t, r, n)
		require.Equal(t, 0, r[0].start)
		require.Equal(t, 16383, r[n-1].end)
		for i := 1; i < n; i++ {
			require.Equal(t, r[i-1].end+1, r[i].start)
		}
	}
	require.Equal(t, []slotRange{{0, 5460}, {5461, 10921}, {10922, 16383}}, slotRanges(3))
}

func TestNodeOfPlainClient(t *testing.T) {
	t.Parallel()
	c := Mini(t)
	addr, err := NodeOf(context.Background(), c, "any")
	require.NoError(t, err)
	require.Equal(t, c.(*redis.Client).Options().Addr, addr)
}

// TestSource checks the source line of whatever Real chose on this machine.
func TestSource(t *testing.T) {
	t.Parallel()
	Real(t)
	switch {
	case os.Getenv("REDIS_URL") != "":
		require.Regexp(t, `^REDIS_URL: redis \d+\.\d+\.\d+ at \S+:\d+$`, Source())
	case strings.HasPrefix(Source(), "testcontainers"):
		require.Regexp(t, `^testcontainers: redis:7\.0, redis 7\.0\.\d+ at \S+:\d+$`, Source())
	default:
		require.Regexp(t, `^spawned redis-server \d+\.\d+\.\d+ \(/.*redis-server\)$`, Source())
	}
	require.Contains(t, sourcesLine(), "redistest: Real: "+Source())
	t.Logf("Real: %s", Source())
}

// TestChooseReal checks the order in which Real looks for a Redis, with
// stand-ins for PATH and the Docker engine, so that the container branch is
// decided without Docker. Each source is asked for only when the ones
// before it are missing.
func TestChooseReal(t *testing.T) {
	t.Parallel()
	notFound := errors.New(`exec: "redis-server": executable file not found in $PATH`)
	noEngine := errors.New("Cannot connect to the Docker daemon")
	cases := []struct {
		name        string
		url         string
		bin         error // nil: redis-server is on PATH
		docker      error // nil: an engine answers
		want        origin
		wantBin     string
		asksPath    bool
		asksDocker  bool
		wantMissing bool
	}{
		{name: "URLFirst", url: "redis://h:1/0", want: originURL},
		{name: "URLWithoutBinaryOrDocker", url: "redis://h:1/0", bin: notFound, docker: noEngine, want: originURL},
		{name: "BinaryBeforeDocker", want: originSpawned, wantBin: "/opt/redis/bin/redis-server", asksPath: true},
		{name: "DockerWithoutBinary", bin: notFound, want: originContainer, asksPath: true, asksDocker: true},
		{name: "Nothing", bin: notFound, docker: noEngine, want: originNone, asksPath: true, asksDocker: true, wantMissing: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var askedPath, askedDocker bool
			lookPath := func(name string) (string, error) {
				askedPath = true
				require.Equal(t, "redis-server", name)
				if tc.bin != nil {
					return "", tc.bin
				}
				return "/opt/redis/bin/redis-server", nil
			}
			docker := func() error { askedDocker = true; return tc.docker }

			got, bin, err := chooseReal(tc.url, lookPath, docker)
			require.Equal(t, tc.want, got)
			require.Equal(t, tc.wantBin, bin)
			require.Equal(t, tc.asksPath, askedPath, "asked PATH")
			require.Equal(t, tc.asksDocker, askedDocker, "asked Docker")
			if !tc.wantMissing {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, errMissing, "Real skips, rather than fails, when nothing is there")
			require.ErrorContains(t, err, "no REDIS_URL")
			require.ErrorContains(t, err, notFound.Error())
			require.ErrorContains(t, err, noEngine.Error())
		})
	}
}

// TestChooseCluster: REDIS_CLUSTER_ADDRS, else redis-server from PATH, and
// no container fallback.
func TestChooseCluster(t *testing.T) {
	t.Parallel()
	found := func(string) (string, error) { return "/usr/bin/redis-server", nil }
	missing := func(string) (string, error) { return "", errors.New("not found") }
	unasked := func(string) (string, error) {
		t.Error("PATH asked although REDIS_CLUSTER_ADDRS is set")
		return "", nil
	}

	o, _, err := chooseCluster("a:1,b:2", unasked)
	require.NoError(t, err)
	require.Equal(t, originAddrs, o)
	o, bin, err := chooseCluster("", found)
	require.NoError(t, err)
	require.Equal(t, []any{originSpawned, "/usr/bin/redis-server"}, []any{o, bin})
	o, _, err = chooseCluster("", missing)
	require.Equal(t, originNone, o)
	require.ErrorIs(t, err, errMissing)
	require.ErrorContains(t, err, "no REDIS_CLUSTER_ADDRS")
}

// TestOriginWords: every source line starts with the word of its origin.
func TestOriginWords(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{"REDIS_URL", "REDIS_CLUSTER_ADDRS", "spawned", "testcontainers", "none"},
		[]string{originURL.String(), originAddrs.String(), originSpawned.String(), originContainer.String(), originNone.String()})
}

// Not parallel: command statistics are server-wide.
func TestClusterCommandStats(t *testing.T) {
	ctx := context.Background()
	c := PrivateCluster(t)
	testCommandStats(ctx, t, c, "{"+Prefix(t)+"}")
}

func testCommandStats(ctx context.Context, t *testing.T, c redis.UniversalClient, prefix string) {
	t.Helper()

	require.NoError(t, ResetStats(ctx, c))
	before, err := CommandStats(ctx, c)
	require.NoError(t, err)

	sha, err := c.ScriptLoad(ctx, `redis.call('SET', KEYS[1], 1); redis.call('SET', KEYS[2], 2); return 1`).Result()
	require.NoError(t, err)
	require.NoError(t, c.EvalSha(ctx, sha, []string{prefix + ":a", prefix + ":b"}).Err())
	require.NoError(t, c.Get(ctx, prefix+":a").Err())

	after, err := CommandStats(ctx, c)
	require.NoError(t, err)
	d := after.Sub(before)

	require.Equal(t, int64(2), d["set"].Calls, "redis.call()s inside Lua are counted: %v", d)
	require.Equal(t, int64(1), d["get"].Calls)
	require.Equal(t, int64(1), d["evalsha"].Calls)
	// A cluster client loads a script on every master.
	masters, err := Masters(ctx, c)
	require.NoError(t, err)
	loads := int64(len(masters))
	require.Equal(t, loads, d["script|load"].Calls)
	require.Equal(t, int64(3), d.Commands().Calls, "sets and get, not INFO, script or admin: %v", d)
	require.Equal(t, int64(1), d.Scripts().Calls)
	require.Equal(t, 4+loads, d.Total().Calls)
}

func TestParseCommandStats(t *testing.T) {
	t.Parallel()

	const info = "# Commandstats\r\n" +
		"cmdstat_zadd:calls=12,usec=34,usec_per_call=2.83,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_evalsha:calls=3,usec=900,usec_per_call=300.00,rejected_calls=0,failed_calls=1\r\n" +
		"cmdstat_script|load:calls=1,usec=20,usec_per_call=20.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=4,usec=100,usec_per_call=25.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_config|resetstat:calls=1,usec=5,usec_per_call=5.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_ping:calls=2,usec=1,usec_per_call=0.50,rejected_calls=0,failed_calls=0\r\n" +
		"\r\n"

	s, err := parseCommandStats(info)
	require.NoError(t, err)
	require.Equal(t, Stats{
		"zadd":             {Calls: 12, Usec: 34},
		"evalsha":          {Calls: 3, Usec: 900},
		"script|load":      {Calls: 1, Usec: 20},
		"info":             {Calls: 4, Usec: 100},
		"config|resetstat": {Calls: 1, Usec: 5},
		"ping":             {Calls: 2, Usec: 1},
	}, s)
	require.Equal(t, CmdStat{Calls: 12, Usec: 34}, s.Commands())
	require.Equal(t, CmdStat{Calls: 3, Usec: 900}, s.Scripts())
	require.Equal(t, CmdStat{Calls: 16, Usec: 954}, s.Total())

	_, err = parseCommandStats("cmdstat_get:calls=x,usec=1\r\n")
	require.Error(t, err)
}

func TestStatsSub(t *testing.T) {
	t.Parallel()

	before := Stats{"get": {Calls: 1, Usec: 10}, "set": {Calls: 5, Usec: 50}}
	after := Stats{"get": {Calls: 4, Usec: 25}, "set": {Calls: 5, Usec: 50}, "zadd": {Calls: 2, Usec: 7}}
	require.Equal(t, Stats{"get": {Calls: 3, Usec: 15}, "zadd": {Calls: 2, Usec: 7}}, after.Sub(before))
}

// recordTB stands in for a test so that the skip/fail decision can be observed
// without ending the real test.
type recordTB struct {
	testing.TB
	skipped, failed bool
}

func (r *recordTB) Helper()               { r.TB.Helper() }
func (r *recordTB) Skip(...any)           { r.skipped = true }
func (r *recordTB) Fatalf(string, ...any) { r.failed = true }

func TestUnavailable(t *testing.T) {
	t.Run("Skips", func(t *testing.T) {
		t.Setenv("RUNQUEUE_REQUIRE_REDIS", "")
		r := &recordTB{TB: t}
		unavailable(r)
		require.True(t, r.skipped)
		require.False(t, r.failed)
	})
	t.Run("FailsWhenRequired", func(t *testing.T) {
		t.Setenv("RUNQUEUE_REQUIRE_REDIS", "1")
		r := &recordTB{TB: t}
		unavailable(r)
		require.True(t, r.failed)
		require.False(t, r.skipped)
	})
}

// TestURLDeployment takes the REDIS_URL branch against the server of Real:
// the options come from the URL and the source names the server.
func TestURLDeployment(t *testing.T) {
	t.Parallel()
	addr := Real(t).(*redis.Client).Options().Addr
	d, err := urlDeployment("redis://" + addr + "/3")
	require.NoError(t, err)
	defer d.stop()
	require.Equal(t, []string{addr}, d.addrs)
	require.Equal(t, 3, d.opt.DB)
	require.Regexp(t, `^REDIS_URL: redis \d+\.\d+\.\d+ at `+regexp.QuoteMeta(addr)+`$`, d.source)

	_, err = urlDeployment("http://" + addr)
	require.ErrorContains(t, err, "REDIS_URL")
	require.NotErrorIs(t, err, errMissing, "a wrong REDIS_URL fails the test, it does not skip it")
}

// TestContainer starts a Redis with testcontainers where a Docker engine
// answers, whatever Real picks on this machine, so that the fallback is
// exercised wherever it can be. It skips without Docker, even under
// RUNQUEUE_REQUIRE_REDIS=1: Docker is optional.
func TestContainer(t *testing.T) {
	t.Parallel()
	if err := dockerEngine(); err != nil {
		t.Skipf("no Docker engine: %v", err)
	}
	d, err := startContainer()
	require.NoError(t, err)
	defer d.stop()
	require.Regexp(t, `^testcontainers: redis:7\.0, redis 7\.0\.\d+ at \S+:\d+$`, d.source)

	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: d.addrs[0]})
	defer func() { _ = c.Close() }()
	key := Prefix(t) + ":k"
	require.NoError(t, c.Set(ctx, key, "v", time.Minute).Err())
	require.Equal(t, "v", c.Get(ctx, key).Val())
}

// FindLeaks lets a goroutine that ends later than goleak's own wait end,
// and still reports one that does not end.
func TestFindLeaksPatience(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	late := make(chan struct{})
	go func() { time.Sleep(LeakPatience / 3); close(late) }()
	require.NoError(t, FindLeaks(ignore), "a goroutine ending after %v is not a leak", LeakPatience/3)
	<-late

	stuck := make(chan struct{})
	go func() { <-stuck }()
	start := time.Now()
	err := FindLeaks(ignore)
	close(stuck)
	require.Error(t, err, "a goroutine blocked for good is a leak")
	require.GreaterOrEqual(t, time.Since(start), LeakPatience, "it was judged before the patience ran out")
	require.NoError(t, FindLeaks(ignore))
}

// failedTB is a test that has failed: it keeps its cleanups for the caller
// to run.
type failedTB struct {
	testing.TB
	cleanups []func()
}

func (f *failedTB) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }
func (f *failedTB) Failed() bool      { return true }

// TestPrefixKeysRemoved: the keys that start with a prefix in a hash tag
// are removed from the shared servers when its test passes; a key holding
// it elsewhere, another prefix's keys and a failed test's keys stay.
func TestPrefixKeysRemoved(t *testing.T) {
	t.Parallel()
	for _, b := range []Backend{{Name: "Real", Client: Real}, {Name: "Cluster", Client: Cluster}} {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			c := b.Client(t)
			ctx := context.Background()
			names := func(p string) []string {
				return []string{"{" + p + ":e1}:a", "{" + p + ":e2}:b", "{" + p + "}:c"}
			}
			write := func(p string) {
				for _, k := range names(p) {
					require.NoError(t, c.Set(ctx, k, "v", time.Hour).Err())
				}
			}
			count := func(p string) int {
				n := 0
				for _, k := range names(p) {
					n += int(c.Exists(ctx, k).Val())
				}
				return n
			}
			bystander := Prefix(t)
			write(bystander)
			var passed string
			elsewhere := func() string { return "x:" + passed + ":c" }
			t.Run("passes", func(t *testing.T) {
				passed = Prefix(t)
				write(passed)
				require.NoError(t, c.Set(ctx, elsewhere(), "v", time.Hour).Err())
				require.Equal(t, 3, count(passed))
			})
			require.Zero(t, count(passed), "a passed test's keys are removed")
			require.Equal(t, int64(1), c.Exists(ctx, elsewhere()).Val(), "a key holding the prefix elsewhere stays")
			require.NoError(t, c.Del(ctx, elsewhere()).Err())
			require.Equal(t, 3, count(bystander), "another prefix's keys stay")

			f := &failedTB{TB: t}
			failed := Prefix(f)
			write(failed)
			for i := len(f.cleanups) - 1; i >= 0; i-- {
				f.cleanups[i]()
			}
			require.Equal(t, 3, count(failed), "a failed test's keys stay")
			forget(failed)
			require.Zero(t, count(failed))
		})
	}
}
