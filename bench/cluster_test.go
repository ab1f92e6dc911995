package main

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
)

func TestParseTarget(t *testing.T) {
	t.Parallel()
	t.Run("OneServer", func(t *testing.T) {
		tg, err := parseTarget("redis://h:1/2")
		require.NoError(t, err)
		require.Nil(t, tg.cluster)
		require.Equal(t, []any{"h:1", 2}, []any{tg.single.Addr, tg.single.DB})
	})
	t.Run("ClusterURL", func(t *testing.T) {
		tg, err := parseTarget("redis+cluster://u:p%40ss@a:1,b:2, c:3?dial_timeout=2s")
		require.NoError(t, err)
		require.Nil(t, tg.single)
		require.Equal(t, []string{"a:1", "b:2", "c:3"}, tg.cluster.Addrs)
		require.Equal(t, []string{"u", "p@ss"}, []string{tg.cluster.Username, tg.cluster.Password})
		require.Equal(t, "2s", tg.cluster.DialTimeout.String())
		require.Nil(t, tg.cluster.TLSConfig)
	})
	t.Run("ClusterURLOneSeed", func(t *testing.T) {
		tg, err := parseTarget("redis+cluster://a:1/0")
		require.NoError(t, err)
		require.Equal(t, []string{"a:1"}, tg.cluster.Addrs)
	})
	t.Run("ClusterTLS", func(t *testing.T) {
		tg, err := parseTarget("rediss+cluster://a:1,b:2")
		require.NoError(t, err)
		require.NotNil(t, tg.cluster.TLSConfig)
	})
	t.Run("AddressList", func(t *testing.T) {
		tg, err := parseTarget("127.0.0.1:7000,127.0.0.1:7001")
		require.NoError(t, err)
		require.Equal(t, []string{"127.0.0.1:7000", "127.0.0.1:7001"}, tg.cluster.Addrs)
	})
	bad := []struct{ in, want string }{
		{"redis+cluster://a:1/3", "only database 0"},
		{"redis+cluster://", "no node address"},
		{"redis+cluster://a:1?nope=1", "nope"},
		{"a:1,b", `cluster node "b" is not host:port`},
		{"h:1", "redis+cluster://h:1"}, // one bare address: the error says how to write either
		{"http://h:1", "invalid URL scheme"},
	}
	for _, tc := range bad {
		_, err := parseTarget(tc.in)
		require.ErrorContains(t, err, tc.want, tc.in)
	}
}

// fakeTopology is a cluster of n masters at 10.0.0.i:7000 that split the
// slots evenly.
func fakeTopology(n int) *topology {
	t := &topology{}
	for i := range n {
		t.nodes = append(t.nodes, ClusterNode{Addr: "10.0.0." + string(rune('a'+i)) + ":7000"})
	}
	for slot := range t.owner {
		i := slot * n / len(t.owner)
		t.owner[slot] = i
		t.nodes[i].Slots++
	}
	return t
}

// TestSpread: spread gives every master an env that lives on it, and says
// so when a master serves none of the queue's shards.
func TestSpread(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := redistest.Mini(t)
	for _, n := range []int{1, 3, 7} {
		topo := fakeTopology(n)
		// A prefix whose 16 shards miss a master is given up for another,
		// as throughputQueue does.
		var envs []string
		var space keys.Space
		for attempt := 0; envs == nil && attempt < 20; attempt++ {
			q, err := newQueue(ctx, c, redistest.Prefix(t), false, nil, nil)
			require.NoError(t, err)
			got, ok, err := topo.spread(q)
			require.NoError(t, err)
			if ok {
				envs = got
				space, err = keys.NewSpace(q.Config().Prefix, q.Shards())
				require.NoError(t, err)
			}
			require.NoError(t, q.Close())
		}
		require.Len(t, envs, n)
		for i, env := range envs {
			tag := space.Env(env).Queue(benchQueue).CkIndex()
			require.Equal(t, i, topo.owner[keys.Slot(tag)], "env %s on master %d", env, i)
		}
	}

	// 20 masters, 16 shards: four masters serve none.
	q, err := newQueue(ctx, c, redistest.Prefix(t), false, nil, nil)
	require.NoError(t, err)
	defer func() { _ = q.Close() }()
	_, ok, err := fakeTopology(20).spread(q)
	require.NoError(t, err)
	require.False(t, ok)
	require.Equal(t, 80, clusterShards(20))
}

// clusterURL returns a -redis value for the test cluster, skipping when
// it holds keys (a REDIS_CLUSTER_ADDRS cluster in use).
func clusterURL(t *testing.T) (string, []string) {
	t.Helper()
	ctx := context.Background()
	masters, err := redistest.Masters(ctx, redistest.Cluster(t))
	require.NoError(t, err)
	for _, m := range masters {
		n := redis.NewClient(&redis.Options{Addr: m})
		size := n.DBSize(ctx).Val()
		require.NoError(t, n.Close())
		if size > 0 {
			t.Skipf("the test cluster holds keys on %s", m)
		}
	}
	return "redis+cluster://" + strings.Join(masters, ","), masters
}

// evalshaByNode reads how many scripts each master has run (EVALSHA, and
// FCALL of the flag-on library).
func evalshaByNode(t *testing.T, masters []string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, m := range masters {
		n := redis.NewClient(&redis.Options{Addr: m})
		s, err := redistest.CommandStats(context.Background(), n)
		require.NoError(t, err)
		require.NoError(t, n.Close())
		out[m] = s["evalsha"].Calls + s["fcall"].Calls
	}
	return out
}

// TestRedisCluster runs a short bench on the three-node test cluster:
// every master serves work, by the bench's count and by its own command
// statistics, the per-node counts add up to each phase's, and no key is
// left behind. Not parallel: it reads the masters' statistics and needs
// the cluster empty.
func TestRedisCluster(t *testing.T) {
	url, masters := clusterURL(t)
	require.Len(t, masters, 3)
	ctx := context.Background()
	dir := t.TempDir()
	opts := tinyOptions()
	opts.RedisURL = url
	opts.Sections = map[string]bool{secScenarios: true, secCost: true, secThroughput: true}
	opts.ThroughputRuns, opts.Producers, opts.Workers = 300, 2, 4 // workers dealt 2, 1, 1
	opts.JSONPath = filepath.Join(dir, "bench.json")
	opts.OutDir = filepath.Join(dir, "out")

	before := evalshaByNode(t, masters)
	var stdout bytes.Buffer
	rep, err := run(ctx, opts, &stdout, io.Discard)
	require.NoError(t, err)
	after := evalshaByNode(t, masters)
	for _, m := range masters {
		require.Greater(t, after[m], before[m], "master %s ran no script", m)
		n := redis.NewClient(&redis.Options{Addr: m})
		require.Zero(t, n.DBSize(ctx).Val(), "the bench must remove its keys from %s", m)
		require.NoError(t, n.Close())
	}

	require.Equal(t, "redis-cluster", rep.Backend)
	var addrs []string
	for _, n := range rep.Nodes {
		addrs = append(addrs, n.Addr)
	}
	require.Equal(t, masters, addrs)
	require.Empty(t, rep.Cost, "cost is measured on one server")
	require.True(t, slices.ContainsFunc(rep.Notes, func(n string) bool { return strings.Contains(n, "sections cost not run on a Redis Cluster") }), rep.Notes)
	require.True(t, rep.allMet(), "the scenario runs on the cluster too")

	require.Len(t, rep.Throughput, 18)
	for _, r := range rep.Throughput {
		require.Len(t, r.Nodes, 3, "%s/%s", r.Phase, r.Flag)
		runs, workers, fetchers := 0, 0, 0
		var envs []string
		for i, n := range r.Nodes {
			require.Equal(t, masters[i], n.Addr)
			require.Positive(t, n.Runs, "%s/%s: node %s took no run", r.Phase, r.Flag, n.Addr)
			require.Positive(t, n.RunsPerSec)
			require.Positive(t, n.RedisCPUUsPerRun)
			require.NotContains(t, envs, n.Env)
			envs = append(envs, n.Env)
			runs += n.Runs
			workers += n.Workers
			fetchers += n.Fetchers
		}
		require.Equal(t, r.Runs, runs, "%s/%s: the nodes' runs add up to the phase's", r.Phase, r.Flag)
		require.Equal(t, r.Workers, workers)
		require.Equal(t, r.Fetchers, fetchers)
		if r.Phase == phaseFetch {
			// Fetchers are dealt to the envs in turn: every env has some.
			want := map[int][]int{10: {4, 3, 3}, 100: {34, 33, 33}}[r.Fetchers]
			require.NotNil(t, want, "fetch row of %d fetchers", r.Fetchers)
			require.Equal(t, want, []int{r.Nodes[0].Fetchers, r.Nodes[1].Fetchers, r.Nodes[2].Fetchers})
		}
		if r.Workers > 0 {
			require.Equal(t, []int{2, 1, 1}, []int{r.Nodes[0].Workers, r.Nodes[1].Workers, r.Nodes[2].Workers})
		}
	}

	out := stdout.String()
	require.Contains(t, out, "backend Redis Cluster")
	require.Contains(t, out, "Throughput per cluster node")
	for _, m := range masters {
		require.Regexp(t, `(?m)^ +`+regexp.QuoteMeta(m)+` +bench\d+ +\d+ +\d+ `, out)
	}
	doc := decode(t, opts.JSONPath)
	require.Equal(t, "redis-cluster", doc["backend"])
	require.Len(t, objects(t, doc, "nodes"), 3)
	for _, r := range objects(t, doc, "throughput") {
		for _, n := range objects(t, r, "nodes") {
			requireFields(t, "node row", n, "addr", "env", "workers", "runs", "duration_s", "runs_per_sec", "redis_cpu_us_per_run")
		}
	}
}

// TestRedisClusterNeedsAWorkerPerMaster: with fewer workers than masters
// some env would have no worker; the bench says so.
func TestRedisClusterNeedsAWorkerPerMaster(t *testing.T) {
	url, _ := clusterURL(t)
	opts := tinyOptions()
	opts.RedisURL = url
	opts.Sections = map[string]bool{secThroughput: true}
	opts.Workers = 2
	_, err := run(context.Background(), opts, io.Discard, io.Discard)
	require.ErrorContains(t, err, "-workers 2: the cluster has 3 masters")
}
