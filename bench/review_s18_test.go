package main

// Review s18: the bench's arithmetic on controlled inputs, what its
// measuring window counts, and what a run leaves on the server it is
// pointed at. The tests that need a real Redis use redistest.Private (a
// server of this test binary's own, never REDIS_URL's) because they load
// and delete Functions libraries and read server-wide statistics; they
// are not parallel.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
)

// s18Private returns the URL of database db of the binary's private
// Redis and a client of it, failing when the database holds keys or the
// server holds Functions libraries (a test before this one left them).
func s18Private(t *testing.T, db int) (string, *redis.Client) {
	t.Helper()
	opt := *redistest.Private(t).(*redis.Client).Options()
	opt.DB = db
	c := redis.NewClient(&opt)
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	require.Zero(t, c.DBSize(ctx).Val(), "database %d of the private server holds keys", db)
	require.Empty(t, s18Libraries(t, c), "the private server holds Functions libraries")
	return "redis://" + opt.Addr + "/" + strconv.Itoa(db), c
}

// s18Libraries lists the names of the server's Functions libraries.
func s18Libraries(t *testing.T, c *redis.Client) []string {
	t.Helper()
	libs, err := c.FunctionList(context.Background(), redis.FunctionListQuery{}).Result()
	var reply redis.Error
	if errors.As(err, &reply) {
		t.Skipf("the server has no Functions: %v", err)
	}
	require.NoError(t, err)
	var names []string
	for _, l := range libs {
		names = append(names, l.Name)
	}
	return names
}

// s18ScenarioOptions: one short scenario on both flags, which opens
// flag-on queues (and so loads the flag-on Functions library).
func s18ScenarioOptions(url string) Options {
	opts := tinyOptions()
	opts.RedisURL = url
	opts.Sections = map[string]bool{secScenarios: true}
	return opts
}

// TestS18BenchLeavesNoFunctionLibrary: bench/README.md says the bench
// writes only under its own prefix and removes what it wrote. A flag-on
// Queue loads runqueue's Functions library, which is server-wide (and
// saved with the data where the server persists): the run must not leave
// it behind.
func TestS18BenchLeavesNoFunctionLibrary(t *testing.T) {
	url, c := s18Private(t, 0)
	ctx := context.Background()
	t.Cleanup(func() { _ = c.FunctionFlush(context.Background()).Err() })
	rep, err := run(ctx, s18ScenarioOptions(url), io.Discard, io.Discard)
	require.NoError(t, err)
	require.True(t, rep.allMet())
	require.Zero(t, c.DBSize(ctx).Val())
	require.Empty(t, s18Libraries(t, c), "the bench left its Functions library on the server")
}

// TestS18BenchRefusesOtherRunqueueLibraries: a flag-on Queue deletes the
// Functions libraries of other runqueue versions when it opens, so on a
// server where a program of another version runs, the bench would delete
// that program's library. Like a database that holds keys, such a server
// is refused without -force, and left as it was; with -force the run says
// what it did, removes its own library and touches no other library.
func TestS18BenchRefusesOtherRunqueueLibraries(t *testing.T) {
	url, c := s18Private(t, 1)
	ctx := context.Background()
	t.Cleanup(func() { _ = c.FunctionFlush(context.Background()).Err() })
	const theirs = "runqueue_0123456789abcdef" // another runqueue version's
	for _, lib := range []string{theirs, "s18other"} {
		code := fmt.Sprintf("#!lua name=%s\nredis.register_function('%s_f', function() return 1 end)\n", lib, lib)
		require.NoError(t, c.FunctionLoad(ctx, code).Err())
	}

	_, err := run(ctx, s18ScenarioOptions(url), io.Discard, io.Discard)
	require.ErrorContains(t, err, "-force")
	require.ErrorContains(t, err, theirs)
	require.ElementsMatch(t, []string{theirs, "s18other"}, s18Libraries(t, c), "refused, and left as it was")
	require.Zero(t, c.DBSize(ctx).Val())

	opts := s18ScenarioOptions(url)
	opts.Force = true
	var stdout bytes.Buffer
	_, err = run(ctx, opts, &stdout, io.Discard)
	require.NoError(t, err)
	require.Contains(t, stdout.String(), "Functions libraries", "the run says what it did to them")
	// The other version's library went (the queues' doing, which -force
	// accepts); a library that is not runqueue's stays; the bench's own
	// is removed.
	require.Equal(t, []string{"s18other"}, s18Libraries(t, c))
}

// TestS18BenchReportsCleanupFailure: the keys are removed by a deferred
// cleanup, after the sections (also after a Ctrl-C). When that cleanup
// fails, the run must say so, with the prefix, rather than end as if
// nothing were left. The user here may not SCAN, which only the cleanup
// needs when no section runs.
func TestS18BenchReportsCleanupFailure(t *testing.T) {
	_, c := s18Private(t, 2)
	ctx := context.Background()
	require.NoError(t, c.Do(ctx, "ACL", "SETUSER", "s18noscan", "reset", "on", ">pw", "~*", "&*", "+@all", "-scan").Err())
	t.Cleanup(func() { _ = c.Do(context.Background(), "ACL", "DELUSER", "s18noscan").Err() })
	opts := tinyOptions()
	opts.RedisURL = "redis://s18noscan:pw@" + c.Options().Addr + "/2"
	opts.Sections = map[string]bool{}
	_, err := run(ctx, opts, io.Discard, io.Discard)
	require.Error(t, err, "the cleanup could not SCAN, and the run said nothing")
	require.ErrorContains(t, err, "removing the bench keys (prefix bench")
}

// TestS18BenchMeasureWindow: what one measured phase counts, by exact
// command counts. Script calls are EVALSHA and FCALL alike (one each,
// however many redis.calls inside); the redis.calls inside and the
// commands Go sends itself are the commands; Go's own commands are also
// the reads, timed by the hook; FUNCTION LOAD (and the bench's INFO
// snapshots) count as neither; commands sent before or after the phase
// are not in it.
func TestS18BenchMeasureWindow(t *testing.T) {
	_, c := s18Private(t, 3)
	ctx := context.Background()
	t.Cleanup(func() {
		_ = c.FunctionDelete(context.Background(), "s18lib").Err()
		_ = c.Del(context.Background(), "s18a", "s18b", "s18c").Err()
	})
	mc := newMeasured(c, nil)
	defer func() { _ = mc.Close() }()
	script := redis.NewScript(`redis.call('INCR', KEYS[1]); redis.call('INCR', KEYS[1]); return redis.call('GET', KEYS[1])`)
	require.NoError(t, script.Load(ctx, c).Err())
	lib := "#!lua name=s18lib\nredis.register_function('s18f', function(keys) redis.call('INCR', keys[1]); redis.call('INCR', keys[1]); return redis.call('GET', keys[1]) end)\n"
	require.NoError(t, c.FunctionLoad(ctx, lib).Err())
	require.NoError(t, c.FunctionDelete(ctx, "s18lib").Err())

	for range 5 { // before the phase: not counted
		require.NoError(t, c.Incr(ctx, "s18c").Err())
	}
	s, err := mc.measure(ctx, func() error {
		if err := mc.FunctionLoad(ctx, lib).Err(); err != nil {
			return err
		}
		for range 6 {
			if err := script.EvalSha(ctx, mc, []string{"s18a"}).Err(); err != nil {
				return err
			}
			if err := mc.FCall(ctx, "s18f", []string{"s18b"}).Err(); err != nil {
				return err
			}
		}
		for range 4 {
			if err := mc.Get(ctx, "s18a").Err(); err != nil {
				return err
			}
		}
		_, err := mc.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.Get(ctx, "s18a")
			p.Get(ctx, "s18b")
			return nil
		})
		return err
	})
	require.NoError(t, err)
	for range 5 { // after the phase: not counted
		require.NoError(t, c.Incr(ctx, "s18c").Err())
	}
	require.EqualValues(t, 12, s.scripts.Calls, "6 EVALSHA and 6 FCALL, one script call each")
	require.EqualValues(t, 12*3+4+2, s.cmds.Calls, "3 redis.calls per script call, and Go's 6 GETs")
	require.EqualValues(t, 6, s.reads.Calls, "Go's own GETs, alone and pipelined")
	require.Equal(t, float64(s.scripts.Usec+s.reads.Usec), s.usec())
	require.GreaterOrEqual(t, s.cpu, 0.0)

	// The row divides by the calls and the runs it is given.
	row := newCostRow("x", true, s, 3, 12)
	require.InDelta(t, float64(s.scripts.Usec)/12, row.RedisUsPerCall, 1e-9)
	require.InDelta(t, s.usec()/3, row.RedisUsPerOp, 1e-9)
	require.InDelta(t, s.usec()/12, *row.RedisUsPerRun, 1e-9)
	require.InDelta(t, s.cpu/12, *row.RedisCPUUsPerRun, 1e-9)
	require.InDelta(t, 42.0/12, *row.CallsPerRun, 1e-9)
	require.InDelta(t, 36.0/12, *row.InnerCallsPerRun, 1e-9)
	require.InDelta(t, 2.0, row.ReadCallsPerOp, 1e-9)
	require.InDelta(t, 4.0, row.ScriptCallsPerOp, 1e-9)
}

// TestS18BenchCostTableIsTheJSON: every figure of the cost table is the
// JSON field of the same row, rounded as printed; a row that moved no run
// prints "-" where the JSON has no field.
func TestS18BenchCostTableIsTheJSON(t *testing.T) {
	t.Parallel()
	tot := func(scripts, scriptUs, cmds, reads, readUs, cpu float64) costTotals {
		return costTotals{scriptCalls: scripts, scriptUsec: scriptUs, cmds: cmds, reads: reads, readUsec: readUs, cpuUsec: cpu}
	}
	rows := []CostRow{
		costRowOf("enqueue", "off", tot(1000, 20_123, 4020, 0, 0, 36_456), 1000, 1000),
		costRowOf("dequeue_batch10", "on", tot(100, 39_517, 380, 100, 913, 41_222), 100, 1000),
		costRowOf("dequeue_gated", "on", tot(2000, 283_400, 20_000, 0, 0, 314_400), 2000, 0),
	}
	rows[0].Repeats, rows[0].Spread = 3, 0.256
	rep := &Report{Cost: rows, Settings: Settings{CostRuns: 1000, CostKeys: 100, CostRepeats: 3, GatedCalls: 2000, GatedKeys: 80}}
	b, err := json.Marshal(rep)
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(b, &doc))
	var text bytes.Buffer
	costSection(rep).t.text(&text)
	lines := strings.Split(strings.TrimSpace(text.String()), "\n")
	require.Len(t, lines, 1+len(rows))
	f2 := func(v any) string {
		if v == nil {
			return "-"
		}
		return fixed(v.(float64), 2)
	}
	for i, r := range objects(t, doc, "cost") {
		cells := strings.Fields(lines[1+i])
		// The operation's name is printed in words ("dequeue batch10").
		n := len(strings.Split(r["op"].(string), "_"))
		cells = cells[n:]
		require.Equal(t, []string{
			r["flag"].(string), fmt.Sprint(r["calls"]), fmt.Sprint(r["runs"]), f2(r["redis_us_per_call"]), f2(r["redis_us_per_run"]),
			f2(r["redis_cpu_us_per_run"]), f2(r["calls_per_run"]), f2(r["inner_calls_per_run"]), f2(r["read_calls_per_op"]),
			fixed(100*r["spread"].(float64), 0) + "%",
		}, cells, "row %d: %s", i, lines[1+i])
	}
	// Per run is per run moved, per op per API call.
	require.InDelta(t, (39_517+913)/1000.0, *rows[1].RedisUsPerRun, 1e-9)
	require.InDelta(t, (39_517+913)/100.0, rows[1].RedisUsPerOp, 1e-9)
	require.InDelta(t, 280.0/1000, *rows[1].InnerCallsPerRun, 1e-9)
	require.InDelta(t, 314_400.0/2000, rows[2].RedisCPUUsPerOp, 1e-9)
	require.Nil(t, rows[2].RedisUsPerRun)
	require.NotContains(t, objects(t, doc, "cost")[2], "redis_cpu_us_per_run")
	require.Contains(t, costSection(rep).notes[6], "process CPU per call 157.20 µs flag on", "the gated row's process CPU per call, in the notes")
}

// TestS18BenchThroughputArithmetic: runs/s is the phase's runs over its
// duration, CPU per run the phase's process CPU over its runs; on a
// cluster, each node's runs over the time to its own last run, its CPU
// over its runs, and the workers dealt in turn.
func TestS18BenchThroughputArithmetic(t *testing.T) {
	t.Parallel()
	opts := Options{ThroughputRuns: 20_000, ThroughputKeys: 100}
	row := throughputRow(phaseProcess, true, opts, 0, 2, 100, 400*time.Millisecond, 500_000)
	require.InDelta(t, 50_000.0, row.RunsPerSec, 1e-6)
	require.InDelta(t, 25.0, row.RedisCPUUsPerRun, 1e-9)
	require.Equal(t, defaultConcurrency, row.Concurrency, "a phase with workers records their concurrency")
	row = throughputRow(phaseEnqueue, true, opts, 4, 0, 0, time.Second, 100_000)
	require.Zero(t, row.Concurrency, "no worker, no concurrency")
	require.InDelta(t, 20_000.0, row.RunsPerSec, 1e-6)

	start := time.Unix(100, 0)
	lay := layout{envs: []string{"bench0", "bench4"}, addrs: []string{"a:1", "b:2"}}
	c := newCrew(context.Background(), nil, lay, 300)
	defer c.cancel()
	set := func(t *tally, runs int64, after time.Duration) {
		t.runs.Store(runs)
		t.last.Store(start.Add(after).UnixNano())
	}
	set(&c.served[0], 200, 2*time.Second)
	set(&c.served[1], 100, 500*time.Millisecond)
	set(&c.enqueued[0], 7, time.Second) // not the runs of a phase that ends with its acks
	nodes := c.nodes(start, 3, map[string]float64{"a:1": 4000, "b:2": 3000})
	require.Len(t, nodes, 2)
	require.Equal(t, NodeThroughput{Addr: "a:1", Env: "bench0", Workers: 2, Runs: 200, DurationSec: 2, RunsPerSec: 100, RedisCPUUsPerRun: 20}, nodes[0])
	require.Equal(t, NodeThroughput{Addr: "b:2", Env: "bench4", Workers: 1, Runs: 100, DurationSec: 0.5, RunsPerSec: 200, RedisCPUUsPerRun: 30}, nodes[1])
	// A phase without a target of acks counts the runs enqueued.
	c0 := newCrew(context.Background(), nil, lay, 0)
	defer c0.cancel()
	c0.enqueued = c.enqueued
	c0.served = c.served
	require.Equal(t, 7, c0.nodes(start, 0, nil)[0].Runs)
	one := newCrew(context.Background(), nil, layout{envs: []string{benchEnv}}, 1)
	defer one.cancel()
	require.Nil(t, one.nodes(start, 1, nil), "one server: no nodes")
}

// TestS18BenchSweepKeepsKeysActive: the sweep's claim that no key drains
// during the measure, in age order (run i is key i mod n, and the first
// m runs are served): each key keeps a run at every default point and at
// the tests' sizes; and segments cover their range exactly.
func TestS18BenchSweepKeepsKeysActive(t *testing.T) {
	t.Parallel()
	for _, m := range []int{1, 40, 299, 300, 600, 5000} {
		for _, n := range []int{1, 3, 10, 50, 100, 1000, 10_000, 100_000} {
			rpk := sweepRunsPerKey(n, m)
			// The key served most in age order is key 0: ceil(m/n) serves.
			served := (m + n - 1) / n
			require.Less(t, served, rpk, "%d keys, %d runs: a key drains", n, m)
			require.GreaterOrEqual(t, rpk, 2)
			segs := segments(n, rpk*n)
			next := n
			for _, s := range segs {
				require.Equal(t, next, s[0])
				require.Greater(t, s[1], s[0])
				next = s[1]
			}
			require.Equal(t, rpk*n, next, "the segments cover the runs behind the heads")
		}
	}
}

// TestS18BenchMemoryRow: the memory row is MEMORY USAGE (SAMPLES 0) of
// the queue's ckIndex, ckVtime and ckVtimeState over the key count, and
// of every key of the prefix (none of another prefix) over the key count.
func TestS18BenchMemoryRow(t *testing.T) {
	_, c := s18Private(t, 4)
	ctx := context.Background()
	const p, shards, n = "bench0123456789ab.7", 16, 40
	space, err := keys.NewSpace(p, shards)
	require.NoError(t, err)
	qk := space.Env(benchEnv).Queue(benchQueue)
	other, err := keys.NewSpace(p+"0", shards)
	require.NoError(t, err)
	for i := range n {
		k := keyName(i)
		require.NoError(t, c.ZAdd(ctx, qk.CkIndex(), redis.Z{Score: float64(i), Member: k}).Err())
		require.NoError(t, c.ZAdd(ctx, qk.CkVtime(), redis.Z{Score: float64(2 * i), Member: k}).Err())
		require.NoError(t, c.HSet(ctx, qk.CkVtimeState(), k, strings.Repeat("x", i)).Err())
		require.NoError(t, c.ZAdd(ctx, qk.Variant(k).Ready(), redis.Z{Score: float64(i), Member: "r" + strconv.Itoa(i)}).Err())
	}
	require.NoError(t, c.Set(ctx, other.Env(benchEnv).Queue(benchQueue).CkIndex(), strings.Repeat("y", 5000), 0).Err())
	t.Cleanup(func() {
		ctx := context.Background()
		for _, pat := range []string{"{" + p + ":*", "{" + p + "0:*"} {
			if ks := c.Keys(ctx, pat).Val(); len(ks) > 0 {
				_ = c.Del(ctx, ks...).Err()
			}
		}
	})

	usage := func(k string) float64 {
		v, err := c.MemoryUsage(ctx, k, 0).Result()
		require.NoError(t, err)
		return float64(v)
	}
	all := 0.0
	for _, k := range c.Keys(ctx, "{"+p+":*").Val() {
		all += usage(k)
	}
	require.Len(t, c.Keys(ctx, "{"+p+":*").Val(), 3+n)
	row, err := memoryRow(ctx, c, p, shards, n, true)
	require.NoError(t, err)
	ix, vt, st := usage(qk.CkIndex()), usage(qk.CkVtime()), usage(qk.CkVtimeState())
	require.Equal(t, MemoryRow{Keys: n, Flag: "on", BytesPerKey: (ix + vt + st) / n, IndexBytesPerKey: ix / n, VtimeBytesPerKey: vt / n,
		StateBytesPerKey: st / n, AllBytesPerKey: all / n}, *row)
	require.False(t, math.IsNaN(row.BytesPerKey))
}
