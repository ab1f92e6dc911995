package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// tinyOptions are sizes small enough for a test to run every section in a
// few seconds. Each cost phase keeps Redis busy for several milliseconds:
// the process CPU the server reports can lag by a scheduler tick (4 ms at
// 250 Hz), and a phase of 1 ms once read as 0 µs.
func tinyOptions() Options {
	return Options{
		Scenarios: []string{"retry-storm"},
		CostRuns:  400, CostRepeats: 1, CostKeys: 10, GatedCalls: 300, GatedKeys: 8,
		// (600 runs over 3 keys: each key's set past 128 runs and the
		// runs hash past 512, where Redis converts them itself; at fewer,
		// whether a wide-set check finds a set at 64 to 128 depends on
		// how the concurrent enqueues were coalesced, and a skiplist
		// costs a run more bytes than a listpack.)
		MemoryKeys: []int{10, 50}, RunMemoryKeys: []int{3}, MemoryRuns: 600, SweepKeys: []int{10, 50}, SweepRuns: 40,
		Producers: 2, Workers: 2, ThroughputRuns: 200, ThroughputKeys: 10, Batch: 10, Concurrency: 10,
		SingleProducers: 3, BulkBatch: 50,
	}
}

// decode reads the JSON document as generic values, the way a consumer
// that knows only the documented field names would.
func decode(t *testing.T, path string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(b, &doc))
	return doc
}

func objects(t *testing.T, doc map[string]any, key string) []map[string]any {
	t.Helper()
	raw, ok := doc[key].([]any)
	require.True(t, ok, "%q is not a list in %v", key, doc[key])
	out := make([]map[string]any, len(raw))
	for i, r := range raw {
		out[i], ok = r.(map[string]any)
		require.True(t, ok, "%s[%d] is not an object", key, i)
	}
	return out
}

func requireFields(t *testing.T, what string, obj map[string]any, fields ...string) {
	t.Helper()
	for _, f := range fields {
		require.Contains(t, obj, f, "%s lacks %q: %v", what, f, obj)
	}
}

// requireSVG checks that path is a well-formed SVG document that draws
// something.
func requireSVG(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	dec := xml.NewDecoder(bytes.NewReader(b))
	root, paths := "", 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "%s is not well-formed XML", path)
		if se, ok := tok.(xml.StartElement); ok {
			if root == "" {
				root = se.Name.Local
			}
			if se.Name.Local == "path" {
				paths++
			}
		}
	}
	require.Equal(t, "svg", root, path)
	require.Positive(t, paths, "%s draws no path", path)
	require.Less(t, len(b), 200_000, "%s should stay small", path)
}

// TestMiniredisReport runs the default backend on two scenarios: the JSON
// holds the documented fields and no section miniredis cannot measure, and
// -out writes the report with the two cumulative-serve charts.
func TestMiniredisReport(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	opts := DefaultOptions()
	opts.Scenarios = []string{"skew", "weights"}
	opts.JSONPath = filepath.Join(dir, "bench.json")
	opts.OutDir = filepath.Join(dir, "out")
	var stdout, stderr bytes.Buffer
	rep, err := run(context.Background(), opts, &stdout, &stderr)
	require.NoError(t, err)
	require.True(t, rep.allMet(), stdout.String())
	require.Empty(t, stderr.String(), "no progress without a terminal")

	out := stdout.String()
	require.Contains(t, out, "backend miniredis")
	require.Regexp(t, `(?m)^skew +480 → 4 +576 → 16 .* 7/7 met$`, out)
	require.Contains(t, out, "all 10 thresholds met")
	require.NotContains(t, out, "Cost per operation")

	doc := decode(t, opts.JSONPath)
	require.Equal(t, "miniredis", doc["backend"])
	for _, absent := range []string{"cost", "targets", "memory", "run_memory", "sweep", "throughput", "redis_version"} {
		require.NotContains(t, doc, absent, "miniredis cannot measure %s: it must be left out", absent)
	}
	scen := objects(t, doc, "scenarios")
	require.Len(t, scen, 4)
	for _, s := range scen {
		requireFields(t, "scenario", s, "name", "flag", "first_light_serve_step", "all_light_first_serve_step",
			"light_mean_wait", "jain", "drain_steps", "wait_p50", "wait_p95", "wait_p99")
	}
	require.Equal(t, []any{"skew", "off", 480.0, "skew", "on", 4.0},
		[]any{scen[0]["name"], scen[0]["flag"], scen[0]["first_light_serve_step"], scen[1]["name"], scen[1]["flag"], scen[1]["first_light_serve_step"]})
	verdicts := objects(t, doc, "verdicts")
	require.Len(t, verdicts, 10)
	for _, v := range verdicts {
		requireFields(t, "verdict", v, "scenario", "metric", "value", "off", "threshold", "ok")
		require.Equal(t, true, v["ok"], v)
	}

	md, err := os.ReadFile(filepath.Join(opts.OutDir, "report.md"))
	require.NoError(t, err)
	for _, chart := range []string{"skew.svg", "weights.svg"} {
		require.Contains(t, string(md), "]("+chart+")")
		requireSVG(t, filepath.Join(opts.OutDir, chart))
	}
	require.Contains(t, string(md), "| skew | 480 → 4 |")
	require.NoFileExists(t, filepath.Join(opts.OutDir, "sweep.svg"))
}

// emptyDB returns the URL of a database of the test server that holds no
// key, skipping when all of them are in use (a shared REDIS_URL server).
func emptyDB(t *testing.T, from int) (string, *redis.Client) {
	t.Helper()
	base := redistest.Real(t).(*redis.Client).Options()
	for db := from; db < 16; db++ {
		opt := *base
		opt.DB = db
		c := redis.NewClient(&opt)
		n, err := c.DBSize(context.Background()).Result()
		require.NoError(t, err)
		if n == 0 {
			t.Cleanup(func() { _ = c.Close() })
			return "redis://" + opt.Addr + "/" + strconv.Itoa(db), c
		}
		_ = c.Close()
	}
	t.Skip("no empty database on the test server")
	return "", nil
}

// TestRealRedis runs every section on a real Redis with tiny sizes: each
// section is present with its documented fields, the figures are positive,
// and no key of the bench is left behind.
func TestRealRedis(t *testing.T) {
	url, c := emptyDB(t, 1)
	dir := t.TempDir()
	opts := tinyOptions()
	opts.RedisURL = url
	opts.JSONPath = filepath.Join(dir, "bench.json")
	opts.OutDir = filepath.Join(dir, "out")
	var stdout bytes.Buffer
	_, err := run(context.Background(), opts, &stdout, io.Discard)
	require.NoError(t, err)
	require.Zero(t, c.DBSize(context.Background()).Val(), "the bench must remove its keys")

	out := stdout.String()
	for _, title := range []string{"Cost per operation", "Cost targets", "Memory per registered key", "Memory per queued run", "Redis CPU per run lifecycle", "End-to-end throughput",
		"Prefilled queue", "Prefilled queue, fetched with Dequeue + Ack"} {
		require.Contains(t, out, title)
	}
	// The fetch table: by shape, flag off before on.
	require.Regexp(t, `(?m)^FLAG +FETCHERS +BATCH +RUNS +KEYS +RUNS/S +CPU µs/RUN\n`+
		`off +10 +10 +200 +10 +\d+ +[\d.]+\non +10 +10 +200 +10 +\d+ +[\d.]+\n`+
		`off +100 +1 +200 +10 +\d+ +[\d.]+\non +100 +1 +200 +10 +\d+ +[\d.]+\n`, out)
	require.Regexp(t, `(?m)^lifecycle +on +`, out)
	require.Contains(t, out, "<= 30 µs (flag on)")
	require.Contains(t, out, "network work")

	doc := decode(t, opts.JSONPath)
	require.Equal(t, "redis", doc["backend"])
	require.NotEmpty(t, doc["redis_version"])

	cost := objects(t, doc, "cost")
	ops := map[string]int{}
	byOp := map[string]map[string]any{}
	for _, r := range cost {
		requireFields(t, "cost row", r, "op", "flag", "redis_us_per_call", "redis_us_per_op", "redis_cpu_us_per_op", "calls_per_op")
		op := r["op"].(string)
		ops[op+"/"+r["flag"].(string)]++
		byOp[op+"/"+r["flag"].(string)] = r
		require.Positive(t, r["redis_us_per_call"], r)
		require.Positive(t, r["redis_cpu_us_per_op"], r)
		if op == "dequeue_gated" {
			// No run moves: per-run figures cannot be measured.
			require.NotContains(t, r, "redis_us_per_run")
			require.NotContains(t, r, "redis_cpu_us_per_run")
			require.NotContains(t, r, "calls_per_run")
			require.Zero(t, r["runs"])
			continue
		}
		requireFields(t, "cost row", r, "redis_us_per_run", "redis_cpu_us_per_run", "calls_per_run")
		require.Positive(t, r["calls_per_run"], r)
		require.Positive(t, r["redis_cpu_us_per_run"], r)
		// Every operation is one script call: a dequeue derives the keys of
		// the variants it serves inside the script, so Go reads nothing first.
		require.Zero(t, r["read_calls_per_op"], r)
	}
	for _, op := range costOrder {
		for _, f := range []string{"off", "on"} {
			require.Equal(t, 1, ops[op+"/"+f], "cost rows %v", ops)
		}
	}
	// The lifecycle row is the sum of its parts, per run.
	for _, f := range []string{"off", "on"} {
		for _, metric := range []string{"redis_us_per_run", "redis_cpu_us_per_run", "calls_per_run"} {
			sum := 0.0
			for _, op := range lifecycleOps {
				sum += byOp[op+"/"+f][metric].(float64)
			}
			require.InDelta(t, sum, byOp["lifecycle/"+f][metric], 1e-6*sum, "%s, flag %s", metric, f)
		}
	}
	targets := objects(t, doc, "targets")
	require.Len(t, targets, 16) // lifecycle 2, on/off ratios 7, batch-1 rules 2, command differences 3, enqueue rates 2
	lifecycle := map[string]bool{}
	for _, tr := range targets {
		requireFields(t, "target", tr, "target", "op", "metric", "off", "on", "limit", "met")
		if tr["op"] == "lifecycle" {
			lifecycle[tr["metric"].(string)] = true
			require.Equal(t, "<= 30 µs (flag on)", tr["limit"])
			require.Equal(t, tr["on"].(float64) <= 30, tr["met"], tr)
			require.NotContains(t, tr, "ratio")
		}
	}
	require.Equal(t, map[string]bool{"redis_us_per_run": true, "redis_cpu_us_per_run": true}, lifecycle)

	mem := objects(t, doc, "memory")
	require.Len(t, mem, 4)
	for _, m := range mem {
		requireFields(t, "memory row", m, "keys", "flag", "bytes_per_key", "index_bytes_per_key", "vtime_bytes_per_key")
		require.Positive(t, m["index_bytes_per_key"], m)
		if m["flag"] == "on" {
			require.Positive(t, m["vtime_bytes_per_key"], "flag on registers every key in ckVtime: %v", m)
		} else {
			require.Zero(t, m["vtime_bytes_per_key"], m)
		}
	}

	// A queued run costs the same bytes on both flags: the scheduler
	// stores nothing per run.
	runMem := objects(t, doc, "run_memory")
	require.Len(t, runMem, 2)
	for _, m := range runMem {
		requireFields(t, "run memory row", m, "keys", "flag", "runs", "bytes_per_run")
		require.Equal(t, 600.0, m["runs"])
		require.Greater(t, m["bytes_per_run"], 20.0, "a record and a set member: %v", m)
		require.Less(t, m["bytes_per_run"], 1000.0, m)
	}
	require.InEpsilon(t, runMem[0]["bytes_per_run"], runMem[1]["bytes_per_run"], 0.05, "off %v, on %v", runMem[0], runMem[1])

	sweep := objects(t, doc, "sweep")
	require.Len(t, sweep, 4)
	for _, s := range sweep {
		requireFields(t, "sweep row", s, "keys", "flag", "redis_us_per_run", "dequeue_us_per_run", "enqueue_new_key_us_per_run", "drain_us_per_run")
		require.Equal(t, 40.0, s["runs"])
		require.GreaterOrEqual(t, s["runs_per_key"], 2.0, "every key keeps a run: %v", s)
		require.Greater(t, s["enqueue_new_key_us_per_run"], 0.0, s)
		require.Greater(t, s["drain_us_per_run"], 0.0, s)
	}

	tp := objects(t, doc, "throughput")
	var phases []string
	var fetches [][]any // flag, fetchers, batch of the fetch rows
	for _, r := range tp {
		requireFields(t, "throughput row", r, "flag", "phase", "producers", "workers", "runs", "keys", "batch", "duration_s", "runs_per_sec", "redis_cpu_us_per_run")
		phases = append(phases, r["phase"].(string)+"/"+r["flag"].(string))
		require.Equal(t, 200.0, r["runs"])
		require.Positive(t, r["runs_per_sec"])
		require.Positive(t, r["redis_cpu_us_per_run"], r)
		switch r["phase"] {
		case "concurrent":
			requireFields(t, "concurrent throughput row", r, "latency_p50_ms", "latency_p99_ms", "latency_max_ms")
			require.GreaterOrEqual(t, r["latency_p99_ms"], r["latency_p50_ms"])
			require.Equal(t, []any{2.0, 2.0, 10.0}, []any{r["producers"], r["workers"], r["batch"]})
		case "enqueue":
			require.NotContains(t, r, "latency_p50_ms")
			require.Equal(t, []any{2.0, 0.0, 0.0}, []any{r["producers"], r["workers"], r["batch"]})
		case "process":
			require.NotContains(t, r, "latency_p50_ms")
			require.Equal(t, []any{0.0, 2.0, 10.0}, []any{r["producers"], r["workers"], r["batch"]})
		case "steady":
			requireFields(t, "steady throughput row", r, "rate_target_per_sec", "latency_p50_ms")
			require.Equal(t, []any{1.0, 2.0, 10.0}, []any{r["producers"], r["workers"], r["batch"]})
		case "enqueue-single", "enqueue-serial":
			require.Equal(t, []any{3.0, 0.0, 0.0}, []any{r["producers"], r["workers"], r["batch"]})
		case "enqueue-bulk":
			require.Equal(t, []any{2.0, 0.0, 0.0}, []any{r["producers"], r["workers"], r["batch"]})
		case "fetch":
			require.Equal(t, []any{0.0, 0.0}, []any{r["producers"], r["workers"]})
			fetches = append(fetches, []any{r["flag"], r["fetchers"], r["batch"]})
			require.NotContains(t, r, "concurrency")
			require.NotContains(t, r, "latency_p50_ms")
		}
		if r["phase"] != "fetch" {
			require.NotContains(t, r, "fetchers")
		}
		if r["phase"] == "enqueue" || r["phase"] == "enqueue-single" || r["phase"] == "enqueue-serial" || r["phase"] == "enqueue-bulk" || r["phase"] == "fetch" {
			require.NotContains(t, r, "wait_light")
			continue
		}
		require.Equal(t, 10.0, r["concurrency"])
		light, heavy := r["wait_light"].(map[string]any), r["wait_heavy"].(map[string]any)
		require.Equal(t, 200.0, light["runs"].(float64)+heavy["runs"].(float64), "every run's wait, in one class")
		require.Equal(t, 100.0, heavy["runs"], "the even runs go to the heavy key")
		for _, w := range []map[string]any{light, heavy} {
			requireFields(t, "wait", w, "p50_ms", "p99_ms", "p999_ms")
			require.GreaterOrEqual(t, w["p999_ms"], w["p99_ms"])
			require.GreaterOrEqual(t, w["p99_ms"], w["p50_ms"])
		}
	}
	require.Equal(t, []string{"concurrent/off", "concurrent/on", "enqueue/off", "enqueue/on", "process/off", "process/on",
		"steady/off", "steady/on", "enqueue-single/off", "enqueue-single/on", "enqueue-serial/off", "enqueue-serial/on",
		"enqueue-bulk/off", "enqueue-bulk/on", "fetch/off", "fetch/off", "fetch/on", "fetch/on"}, phases)
	require.Equal(t, [][]any{{"off", 10.0, 10.0}, {"off", 100.0, 1.0}, {"on", 10.0, 10.0}, {"on", 100.0, 1.0}}, fetches)

	requireSVG(t, filepath.Join(opts.OutDir, "sweep.svg"))
	md, err := os.ReadFile(filepath.Join(opts.OutDir, "report.md"))
	require.NoError(t, err)
	require.Contains(t, string(md), "](sweep.svg)")
	require.Contains(t, string(md), "## Prefilled queue")
	require.Regexp(t, `\| lifecycle \| on \| `, string(md))
	require.NoFileExists(t, filepath.Join(opts.OutDir, "skew.svg"), "the skew scenario did not run")
}

// TestRealRedisRefusesNonEmpty: a database that holds a key is refused
// without -force and left as it was; with -force the bench runs and still
// touches nothing but its own keys.
func TestRealRedisRefusesNonEmpty(t *testing.T) {
	url, c := emptyDB(t, 8)
	ctx := context.Background()
	foreign := map[string]string{"foreign": "1", "{bench:x}": "2", "{benchzz.1:x}": "3", "x{bench0.1:y}": "4"}
	for k, v := range foreign {
		require.NoError(t, c.Set(ctx, k, v, 0).Err())
	}
	t.Cleanup(func() {
		_ = c.Del(context.Background(), "foreign", "{bench:x}", "{benchzz.1:x}", "x{bench0.1:y}").Err()
	})
	opts := tinyOptions()
	opts.RedisURL = url
	opts.Sections = map[string]bool{secScenarios: true, secMemory: true}

	_, err := run(ctx, opts, io.Discard, io.Discard)
	require.ErrorContains(t, err, "-force")
	require.ErrorContains(t, err, "holds 4 keys")

	opts.Force = true
	var stdout bytes.Buffer
	rep, err := run(ctx, opts, &stdout, io.Discard)
	require.NoError(t, err)
	require.NotEmpty(t, rep.Memory)
	require.Contains(t, stdout.String(), "-force")
	all, err := c.Keys(ctx, "*").Result()
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"foreign", "{bench:x}", "{benchzz.1:x}", "x{bench0.1:y}"}, all)
	for k, v := range foreign {
		require.Equal(t, v, c.Get(ctx, k).Val())
	}
}

// TestRealRedisCleansUpWhenInterrupted: a run cancelled in the middle
// (Ctrl-C) still removes every key it wrote.
func TestRealRedisCleansUpWhenInterrupted(t *testing.T) {
	url, c := emptyDB(t, 12)
	opts := tinyOptions()
	opts.RedisURL = url
	opts.Sections = map[string]bool{secThroughput: true}
	opts.ThroughputRuns = 10_000_000 // never finishes on its own
	ctx, cancel := context.WithCancel(context.Background())
	// Cancel once keys exist, as a Ctrl-C would.
	go func() {
		for ctx.Err() == nil {
			if c.DBSize(context.Background()).Val() > 0 {
				cancel()
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	_, err := run(ctx, opts, io.Discard, io.Discard)
	cancel()
	require.ErrorIs(t, err, context.Canceled)
	require.Zero(t, c.DBSize(context.Background()).Val())
}

// TestKeyspaceCleanup deletes exactly the keys of the run's prefixes (all
// under "{" + base + ".", base being random): a key of another prefix, of
// another run or with the tag elsewhere in its name survives.
func TestKeyspaceCleanup(t *testing.T) {
	t.Parallel()
	for name, client := range map[string]func(testing.TB) redis.UniversalClient{"Mini": redistest.Mini, "Real": redistest.Real} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := client(t).(*redis.Client)
			ctx := context.Background()
			ks := newKeyspace(c)
			p1, p2 := ks.prefix(), ks.prefix()
			require.NotEqual(t, p1, p2)
			other := newKeyspace(c)
			op := other.prefix()
			// mine[3] would be prefix p1 + "0" (that is, base.10): the run's,
			// but not p1's.
			mine := []string{"{" + p1 + ":0}:master", "{" + p1 + ":3}:e:x", "{" + p2 + ":0}:leases", "{" + p1 + "0:0}:master"}
			theirs := []string{"{" + op + ":0}:master", "{" + ks.base + ":0}:master", "x{" + p1 + ":0}", ks.base + ".1:0"}
			for _, k := range append(append([]string{}, mine...), theirs...) {
				require.NoError(t, c.Set(ctx, k, "v", 0).Err())
			}
			t.Cleanup(func() { _ = c.Del(context.Background(), theirs...).Err() })

			require.NoError(t, ks.cleanup(ctx, p1))
			require.Zero(t, c.Exists(ctx, mine[0], mine[1]).Val())
			require.EqualValues(t, 2, c.Exists(ctx, mine[2], mine[3]).Val())
			require.NoError(t, ks.cleanupAll(ctx))
			require.Zero(t, c.Exists(ctx, mine...).Val())
			require.EqualValues(t, len(theirs), c.Exists(ctx, theirs...).Val())
		})
	}
}

func TestParseFlags(t *testing.T) {
	t.Parallel()
	env := func(url string) func(string) string {
		return func(k string) string {
			if k == "REDIS_URL" {
				return url
			}
			return ""
		}
	}
	t.Run("Defaults", func(t *testing.T) {
		o, err := parseFlags(nil, env(""), io.Discard)
		require.NoError(t, err)
		require.Empty(t, o.RedisURL)
		require.Equal(t, DefaultOptions().SweepKeys, o.SweepKeys)
		require.Len(t, o.Sections, len(allSections))
	})
	t.Run("RedisURLFromEnv", func(t *testing.T) {
		o, err := parseFlags(nil, env("redis://h:1/2"), io.Discard)
		require.NoError(t, err)
		require.Equal(t, "redis://h:1/2", o.RedisURL)
		o, err = parseFlags([]string{"-redis", "redis://x:2/0"}, env("redis://h:1/2"), io.Discard)
		require.NoError(t, err)
		require.Equal(t, "redis://x:2/0", o.RedisURL, "the flag wins over the environment")
	})
	t.Run("Cluster", func(t *testing.T) {
		for _, v := range []string{"redis+cluster://a:1,b:2", "a:1,b:2"} {
			o, err := parseFlags([]string{"-redis", v}, env(""), io.Discard)
			require.NoError(t, err, v)
			require.Equal(t, v, o.RedisURL)
		}
	})
	t.Run("Lists", func(t *testing.T) {
		o, err := parseFlags([]string{"-sweep-keys", "5, 50", "-sections", "cost,memory", "-scenarios", "skew"}, env(""), io.Discard)
		require.NoError(t, err)
		require.Equal(t, []int{5, 50}, o.SweepKeys)
		require.Equal(t, map[string]bool{"cost": true, "memory": true}, o.Sections)
		require.Equal(t, []string{"skew"}, o.Scenarios)
	})
	bad := []struct {
		name string
		args []string
		want string
	}{
		{"UnknownSection", []string{"-sections", "costs"}, `unknown section "costs"`},
		{"BadKeyCount", []string{"-memory-keys", "10,x"}, `"x" is not a positive integer`},
		{"ZeroWorkers", []string{"-workers", "0"}, "-workers must be at least 1"},
		{"HugeBatch", []string{"-batch", "5000"}, "-batch must be at most 1000"},
		{"StrayArgument", []string{"now"}, `unexpected argument "now"`},
		{"BareAddress", []string{"-redis", "h:1"}, "a cluster: redis+cluster://h:1"},
		{"ClusterDB", []string{"-redis", "redis+cluster://a:1/2"}, "only database 0"},
		{"CallgrindAllSections", []string{"-callgrind"}, "-callgrind measures the cost section alone"},
		{"CallgrindTwoSections", []string{"-callgrind", "-sections", "cost,memory"}, "-callgrind measures the cost section alone"},
		{"CallgrindWithRedis", []string{"-callgrind", "-sections", "cost", "-redis", "redis://h:1/0"}, "leave out -redis"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseFlags(tc.args, env(""), io.Discard)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// TestUnknownScenario names the scenarios there are.
func TestUnknownScenario(t *testing.T) {
	t.Parallel()
	_, err := selectCases([]string{"skew", "nope"})
	require.ErrorContains(t, err, `unknown scenario "nope"`)
	require.ErrorContains(t, err, "weights")
}

func TestTargets(t *testing.T) {
	t.Parallel()
	f := func(v float64) *float64 { return &v }
	rows := []CostRow{
		{Op: "enqueue", Flag: "off", RedisUsPerRun: f(10)},
		{Op: "enqueue", Flag: "on", RedisUsPerRun: f(10.5)},
		{Op: "dequeue_batch10", Flag: "off", RedisUsPerRun: f(4), CallsPerRun: f(4)},
		{Op: "dequeue_batch10", Flag: "on", RedisUsPerRun: f(5), CallsPerRun: f(5.5)},
		{Op: "dequeue_gated", Flag: "off", RedisUsPerOp: 10},
		{Op: "dequeue_gated", Flag: "on", RedisUsPerOp: 16},
	}
	got := map[string]bool{}
	for _, tr := range targets(rows) {
		got[tr.Op+" "+tr.Metric] = tr.Met
	}
	require.Equal(t, map[string]bool{
		"enqueue redis_us_per_run":         true,  // 1.05x <= 1.10x
		"dequeue_batch10 redis_us_per_run": false, // 1.25x > 1.10x
		"dequeue_batch10 calls_per_run":    true,  // +1.5 <= +1.5
		"dequeue_gated redis_us_per_op":    false, // 1.6x > 1.5x
	}, got)

	// The lifecycle is judged on flag on alone, against 30 µs per run.
	rows = append(rows,
		CostRow{Op: "lifecycle", Flag: "off", RedisUsPerRun: f(12), RedisCPUUsPerRun: f(35)},
		CostRow{Op: "lifecycle", Flag: "on", RedisUsPerRun: f(14), RedisCPUUsPerRun: f(31)})
	got = map[string]bool{}
	for _, tr := range targets(rows) {
		got[tr.Op+" "+tr.Metric] = tr.Met
		if tr.Op == "lifecycle" {
			require.Nil(t, tr.Ratio)
			require.Nil(t, tr.Diff)
			require.Equal(t, "<= 30 µs (flag on)", tr.Limit)
		}
	}
	require.False(t, got["lifecycle redis_cpu_us_per_run"]) // 31 > 30
	require.True(t, got["lifecycle redis_us_per_run"])      // 14 <= 30
	require.Len(t, got, 6)

	// Every op is held to 1.10x (1.12x fails), and a batch-1 dequeue to
	// twice its flag's per-run cost at batch 10.
	rows = append(rows,
		CostRow{Op: "ack", Flag: "off", RedisUsPerRun: f(10)},
		CostRow{Op: "ack", Flag: "on", RedisUsPerRun: f(11.2)},
		CostRow{Op: "dequeue_batch1", Flag: "off", RedisUsPerRun: f(8)},   // 2.0x batch 10 (4)
		CostRow{Op: "dequeue_batch1", Flag: "on", RedisUsPerRun: f(10.5)}) // 2.1x batch 10 (5)
	got = map[string]bool{}
	for _, tr := range targets(rows) {
		got[tr.Op+" "+tr.Metric] = tr.Met
	}
	require.False(t, got["ack redis_us_per_run"])
	require.True(t, got["dequeue_batch1/off redis_us_per_run"])
	require.False(t, got["dequeue_batch1/on redis_us_per_run"])
	require.NotContains(t, got, "ack redis_instructions_per_run", "no instruction targets without counts")

	// Counted under callgrind, the same targets are judged by instructions
	// too, beside the time figures.
	rows = []CostRow{
		{Op: "ack", Flag: "off", RedisUsPerRun: f(10), InstrPerRun: f(100_000)},
		{Op: "ack", Flag: "on", RedisUsPerRun: f(11.2), InstrPerRun: f(109_000)},
	}
	got = map[string]bool{}
	for _, tr := range targets(rows) {
		got[tr.Op+" "+tr.Metric] = tr.Met
	}
	require.Equal(t, map[string]bool{
		"ack redis_us_per_run":           false, // 1.12x by time
		"ack redis_instructions_per_run": true,  // 1.09x by instructions
	}, got)
}

// TestLifecycleRow: the lifecycle row is enqueue + dequeue batch 10 + ack
// per run, each part counted as measured.
func TestLifecycleRow(t *testing.T) {
	t.Parallel()
	mk := func(op string, calls, runs int, scriptUs, cpuUs, cmds float64) CostRow {
		tot := costTotals{scriptCalls: float64(calls), scriptUsec: scriptUs, cmds: cmds, cpuUsec: cpuUs}
		r := costRowOf(op, "on", tot, calls, runs)
		r.Repeats, r.Spread = 3, 0.1
		return r
	}
	rows := []CostRow{
		mk("enqueue", 1000, 1000, 20_000, 30_000, 6000),
		mk("dequeue_batch10", 100, 1000, 50_000, 60_000, 4300),
		mk("dequeue_batch1", 1000, 1000, 99_000, 99_000, 16000), // not a part
		mk("ack", 1000, 1000, 17_000, 25_000, 7000),
	}
	rows[3].Spread = 0.4
	r, ok := lifecycleRow(rows, "on")
	require.True(t, ok)
	require.Equal(t, "lifecycle", r.Op)
	require.Equal(t, []int{2100, 1000}, []int{r.Calls, r.Runs})
	require.InDelta(t, 87.0, *r.RedisUsPerRun, 1e-9)     // 20 + 50 + 17
	require.InDelta(t, 115.0, *r.RedisCPUUsPerRun, 1e-9) // 30 + 60 + 25
	require.InDelta(t, 17.3, *r.CallsPerRun, 1e-9)       // 6 + 4.3 + 7
	require.InDelta(t, 87_000.0/2100, r.RedisUsPerCall, 1e-9)
	require.InDelta(t, 115_000.0/2100, r.RedisCPUUsPerOp, 1e-9)
	require.Equal(t, 3, r.Repeats)
	require.InDelta(t, 0.4, r.Spread, 1e-9)
	require.Nil(t, r.InstrPerRun, "no instruction counts")

	// Instruction counts add up as the times do, when every part has one.
	for i, ir := range []float64{150_000, 0, 900_000, 110_000} {
		if ir > 0 {
			rows[i].InstrPerOp = &ir
		}
	}
	_, ok = lifecycleRow(rows, "on")
	require.True(t, ok)
	r, _ = lifecycleRow(rows, "on")
	require.Nil(t, r.InstrPerRun, "the dequeue part has no count")
	ir := 2_400_000.0 // per call of 10 runs
	rows[1].InstrPerOp = &ir
	r, _ = lifecycleRow(rows, "on")
	require.NotNil(t, r.InstrPerRun)
	require.InDelta(t, 150_000+240_000+110_000, *r.InstrPerRun, 1e-6)

	_, ok = lifecycleRow(rows[:3], "on")
	require.False(t, ok, "no ack row")
	_, ok = lifecycleRow(rows, "off")
	require.False(t, ok, "no flag-off rows")
}

func TestParseCPU(t *testing.T) {
	t.Parallel()
	us, err := parseCPU("# CPU\r\nused_cpu_sys:1.250000\r\nused_cpu_user:2.000123\r\nused_cpu_sys_children:9.000000\r\n" +
		"used_cpu_user_children:9.000000\r\nused_cpu_sys_main_thread:1.000000\r\nused_cpu_user_main_thread:2.000000\r\n")
	require.NoError(t, err)
	require.Equal(t, 3_250_123.0, us)
	_, err = parseCPU("# CPU\r\nused_cpu_sys:1.0\r\n")
	require.ErrorContains(t, err, "not found")
	_, err = parseCPU("used_cpu_sys:x\r\nused_cpu_user:1\r\n")
	require.ErrorContains(t, err, "used_cpu_sys:x")
}

func TestFastestRow(t *testing.T) {
	t.Parallel()
	r := fastestRow([]CostRow{{Op: "a", RedisUsPerOp: 12, Calls: 1}, {Op: "a", RedisUsPerOp: 10, Calls: 2}, {Op: "a", RedisUsPerOp: 15, Calls: 3}})
	require.Equal(t, 2, r.Calls, "the fastest repetition, whole")
	require.Equal(t, 3, r.Repeats)
	require.InDelta(t, 0.5, r.Spread, 1e-9)
}

func TestHelpers(t *testing.T) {
	t.Parallel()
	t.Run("Percentile", func(t *testing.T) {
		v := []float64{5, 1, 4, 2, 3, 6, 7, 8, 9, 10}
		require.Equal(t, []float64{5, 10, 10, 1}, []float64{percentile(v, 50), percentile(v, 95), percentile(v, 99), percentile(v, 1)})
		require.Zero(t, percentile(nil, 50))
	})
	t.Run("Segments", func(t *testing.T) {
		require.Equal(t, [][2]int{{0, 40}}, segments(0, 40))
		require.Equal(t, [][2]int{{100, 200}, {200, 300}, {300, 400}}, segments(100, 400))
		require.Nil(t, segments(5, 5))
	})
	t.Run("SweepRunsPerKey", func(t *testing.T) {
		require.Equal(t, 501, sweepRunsPerKey(10, 5000))
		require.Equal(t, 2, sweepRunsPerKey(10_000, 5000))
		require.Equal(t, 2, sweepRunsPerKey(100_000, 5000), "a served key keeps a run")
	})
	t.Run("Threshold", func(t *testing.T) {
		require.Equal(t, "<= 112", prettyThreshold("<= 111.60000000000001"))
		require.Equal(t, "== 636 (flag off)", prettyThreshold("== 636 (flag off)"))
		require.Equal(t, "within 5% of flag off", prettyThreshold("within 5% of flag off"))
	})
	t.Run("BackendLine", func(t *testing.T) {
		rep := &Report{Backend: "redis", RedisVersion: "7.0.15", GoVersion: "go1.26.8", CPUs: 2, GoMaxProcs: 2, DurationSec: 3}
		require.Equal(t, "backend Redis 7.0.15 · go1.26.8 · 2 CPUs · 3.0 s", backendLine(rep))
		rep.GoMaxProcs = 1
		require.Equal(t, "backend Redis 7.0.15 · go1.26.8 · 2 CPUs (GOMAXPROCS 1) · 3.0 s", backendLine(rep))
	})
	t.Run("Num", func(t *testing.T) {
		require.Equal(t, []string{"480", "0.326", "4.50", "61.2", "558", "-"},
			[]string{num(480), num(0.32631), num(4.5), num(61.23), num(557.6), num(math.NaN())})
	})
}

func TestDownsample(t *testing.T) {
	t.Parallel()
	series := make([]int, 1000)
	for i := range series {
		series[i] = i / 3
	}
	xy := downsample(series)
	require.LessOrEqual(t, len(xy), maxPoints+1)
	require.Equal(t, 0.0, xy[0].X)
	require.Equal(t, 999.0, xy[len(xy)-1].X, "the last point is kept")
	require.Equal(t, 333.0, xy[len(xy)-1].Y)
}

func TestThroughputTargets(t *testing.T) {
	t.Parallel()
	rows := []ThroughputRow{
		{Phase: phaseSingle, Flag: "off", RunsPerSec: 60000},
		{Phase: phaseSingle, Flag: "on", RunsPerSec: 49999},
		{Phase: phaseSerial, Flag: "on", RunsPerSec: 90000}, // not a target
		{Phase: phaseEnqueue, Flag: "on", RunsPerSec: 10},   // the prefilled phase: not a target
		{Phase: phaseBulk, Flag: "off", RunsPerSec: 150000},
		{Phase: phaseBulk, Flag: "on", RunsPerSec: 200000},
	}
	opts := Options{SingleProducers: 8, Producers: 4, Batch: 10, BulkBatch: 1000}
	got := map[string]TargetRow{}
	for _, tr := range throughputTargets(rows, opts) {
		got[tr.Op] = tr
	}
	require.Len(t, got, 2)
	// Judged on flag on, against an absolute rate; flag off only shown.
	require.False(t, got[phaseSingle].Met)
	require.Equal(t, 60000.0, got[phaseSingle].Off)
	require.Equal(t, "single Enqueue, 8 producers", got[phaseSingle].Target)
	require.True(t, got[phaseBulk].Met)
	require.Equal(t, ">= 200000 runs/s (flag on)", got[phaseBulk].Limit)
	require.Equal(t, "batch enqueue (EnqueueMany of 1000 runs, 4 producers)", got[phaseBulk].Target)
	// No phase row, no target.
	require.Empty(t, throughputTargets(rows[:1], opts))
}

// TestCallgrindCost: with -callgrind every cost phase gets the instructions
// Redis executed, and two runs count the same within 3% (the count is
// what a busy machine cannot move); batching shows in the counts.
func TestCallgrindCost(t *testing.T) {
	requireCallgrind(t)
	t.Parallel()
	opts := tinyOptions()
	opts.Callgrind, opts.Sections = true, map[string]bool{secCost: true}
	opts.CostRuns, opts.GatedCalls = 200, 80
	var reps [2]*Report
	for i := range reps {
		rep, err := run(context.Background(), opts, io.Discard, io.Discard)
		require.NoError(t, err)
		reps[i] = rep
	}
	require.Len(t, reps[0].Cost, 18) // 9 rows per flag, lifecycle included
	byOp := func(rep *Report, op, flag string) CostRow {
		i := slices.IndexFunc(rep.Cost, func(r CostRow) bool { return r.Op == op && r.Flag == flag })
		require.GreaterOrEqual(t, i, 0, "%s flag %s", op, flag)
		return rep.Cost[i]
	}
	for _, r := range reps[0].Cost {
		require.NotNil(t, r.InstrPerOp, "%s flag %s", r.Op, r.Flag)
		require.Positive(t, *r.InstrPerOp)
		require.Equal(t, r.Runs > 0, r.InstrPerRun != nil, "%s flag %s", r.Op, r.Flag)
		again := byOp(reps[1], r.Op, r.Flag)
		require.InEpsilon(t, *r.InstrPerOp, *again.InstrPerOp, 0.03, "%s flag %s: %.0f then %.0f instructions", r.Op, r.Flag, *r.InstrPerOp, *again.InstrPerOp)
	}
	for _, flag := range []string{"off", "on"} {
		b1, b10 := byOp(reps[0], "dequeue_batch1", flag), byOp(reps[0], "dequeue_batch10", flag)
		require.Greater(t, *b1.InstrPerRun, *b10.InstrPerRun, "a batch of 10 shares its call's fixed work")
	}
	// Flag on, a key's first run registers it with the scheduler: the flag
	// costs a new key's enqueue more than an enqueue behind a key's head
	// (flag off, a new key costs more too: its index entry is new).
	extra := func(op string) float64 {
		return *byOp(reps[0], op, "on").InstrPerRun - *byOp(reps[0], op, "off").InstrPerRun
	}
	require.Greater(t, extra("enqueue_new_key"), 2*extra("enqueue"), "registration shows in the new-key row")
	require.True(t, slices.ContainsFunc(reps[0].Targets, func(tr TargetRow) bool { return tr.Metric == "redis_instructions_per_run" }))
	require.Contains(t, reps[0].Notes[len(reps[0].Notes)-1], "callgrind")
}

// requireCallgrind skips t when valgrind or redis-server is missing, and
// fails it instead under RUNQUEUE_REQUIRE_REDIS=1 (CI installs both).
func requireCallgrind(t *testing.T) {
	t.Helper()
	if _, _, _, err := callgrindTools(); err != nil {
		if os.Getenv("RUNQUEUE_REQUIRE_REDIS") == "1" {
			t.Fatalf("%v (required with RUNQUEUE_REQUIRE_REDIS=1)", err)
		}
		t.Skip(err)
	}
}
