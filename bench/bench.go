package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// The sections of a run. Every section but scenarios needs a real Redis:
// miniredis has no command statistics, no MEMORY USAGE and is no model of
// Redis performance, so on it those sections are left out, never estimated.
const (
	secScenarios  = "scenarios"
	secCost       = "cost"
	secMemory     = "memory"
	secSweep      = "sweep"
	secThroughput = "throughput"
)

var allSections = []string{secScenarios, secCost, secMemory, secSweep, secThroughput}

func knownSection(s string) bool { return slices.Contains(allSections, s) }

// Options are the knobs of one bench run. Tests use small sizes.
type Options struct {
	RedisURL string // "" for the embedded miniredis
	Force    bool   // accept a non-empty database
	JSONPath string
	OutDir   string
	Strict   bool
	Progress bool // progress line on stderr
	// Callgrind: start a redis-server under valgrind's callgrind and count
	// the instructions of each cost phase (the cost section alone; see
	// callgrind.go).
	Callgrind bool

	Sections  map[string]bool // nil: all
	Scenarios []string        // scenario names; empty: all

	CostRuns    int // runs per cost measurement
	CostRepeats int // repetitions of each cost measurement (the fastest is kept)
	CostKeys    int // keys the cost runs are spread over
	GatedCalls  int // fully gated dequeue calls
	GatedKeys   int // keys held at their limit in the gated measurement

	MemoryKeys []int
	// RunMemoryKeys are the key counts over which the memory section
	// queues MemoryRuns runs to measure the bytes of a queued run.
	RunMemoryKeys []int
	MemoryRuns    int
	SweepKeys     []int
	SweepRuns     int

	Producers, Workers, ThroughputRuns, ThroughputKeys, Batch int
	// SingleProducers are the goroutines of the single-Enqueue phases.
	SingleProducers int
	// BulkBatch is the runs per EnqueueMany call of the bulk-enqueue phase
	// (its producers are Producers).
	BulkBatch int
	// Concurrency is each throughput Worker's WorkerConfig.Concurrency
	// (0: its default, 100).
	Concurrency int
	// SteadyRate is the steady phase's enqueue rate in runs/s (0: half the
	// process phase's runs/s on the same flag).
	SteadyRate float64
}

// DefaultOptions are the sizes of `go run ./bench`: a few minutes in all
// on a real Redis on 2 cores.
func DefaultOptions() Options {
	return Options{
		CostRuns: 10000, CostRepeats: 3, CostKeys: 100, GatedCalls: 2000, GatedKeys: 80,
		MemoryKeys: []int{100, 1000, 10000, 100000}, RunMemoryKeys: []int{10, 1000}, MemoryRuns: 20000,
		SweepKeys: []int{10, 100, 1000, 10000, 100000},
		SweepRuns: 5000,
		Producers: 4, Workers: 1, ThroughputRuns: 20000, ThroughputKeys: 100, Batch: 10,
		SingleProducers: 8, BulkBatch: 1000,
	}
}

func (o Options) validate() error {
	for name, v := range map[string]int{"cost-runs": o.CostRuns, "cost-repeats": o.CostRepeats, "cost-keys": o.CostKeys, "gated-calls": o.GatedCalls,
		"sweep-runs": o.SweepRuns, "producers": o.Producers, "workers": o.Workers, "runs": o.ThroughputRuns,
		"keys": o.ThroughputKeys, "batch": o.Batch, "single-producers": o.SingleProducers, "bulk-batch": o.BulkBatch} {
		if v < 1 {
			return fmt.Errorf("-%s must be at least 1, got %d", name, v)
		}
	}
	if o.MemoryRuns < 0 {
		return fmt.Errorf("-memory-runs must be 0 or more, got %d", o.MemoryRuns)
	}
	if o.GatedKeys < 1 {
		return fmt.Errorf("gated keys must be at least 1, got %d", o.GatedKeys)
	}
	if o.Concurrency < 0 || o.SteadyRate < 0 {
		return fmt.Errorf("-concurrency and -steady-rate must not be negative")
	}
	if o.Batch > 1000 {
		return fmt.Errorf("-batch must be at most 1000, got %d", o.Batch)
	}
	if o.BulkBatch > 1000 {
		return fmt.Errorf("-bulk-batch must be at most 1000, got %d", o.BulkBatch)
	}
	if o.Callgrind {
		if o.RedisURL != "" {
			return fmt.Errorf("-callgrind starts its own redis-server: leave out -redis (and REDIS_URL)")
		}
		if len(o.Sections) != 1 || !o.Sections[secCost] {
			return fmt.Errorf("-callgrind measures the cost section alone (valgrind runs Redis some 50 times slower): add -sections cost")
		}
	}
	return nil
}

func (o Options) want(section string) bool { return o.Sections == nil || o.Sections[section] }

// Report is everything one run measured; it is also the JSON document.
// Sections a backend cannot measure stay empty and are omitted.
type Report struct {
	Backend      string        `json:"backend"` // "miniredis", "redis" or "redis-cluster"
	RedisVersion string        `json:"redis_version,omitempty"`
	Nodes        []ClusterNode `json:"nodes,omitempty"` // the masters of a Redis Cluster, by address
	GoVersion    string        `json:"go_version"`
	CPUs         int           `json:"cpus"`
	GoMaxProcs   int           `json:"gomaxprocs"` // the bench process's, which its clients run on
	StartedAt    time.Time     `json:"started_at"`
	DurationSec  float64       `json:"duration_s"`
	Settings     Settings      `json:"settings"`

	Scenarios  []ScenarioResult `json:"scenarios,omitempty"`
	Verdicts   []VerdictRow     `json:"verdicts,omitempty"`
	Cost       []CostRow        `json:"cost,omitempty"`
	Targets    []TargetRow      `json:"targets,omitempty"`
	Memory     []MemoryRow      `json:"memory,omitempty"`
	RunMemory  []RunMemoryRow   `json:"run_memory,omitempty"`
	Sweep      []SweepRow       `json:"sweep,omitempty"`
	Throughput []ThroughputRow  `json:"throughput,omitempty"`

	// Notes are caveats printed under the tables (e.g. a shared server).
	Notes []string `json:"notes,omitempty"`

	charts []chartFile
}

// Settings records the sizes used, so that two JSON documents can be
// compared knowingly.
type Settings struct {
	CostRuns       int   `json:"cost_runs,omitempty"`
	CostRepeats    int   `json:"cost_repeats,omitempty"`
	CostKeys       int   `json:"cost_keys,omitempty"`
	GatedCalls     int   `json:"gated_calls,omitempty"`
	GatedKeys      int   `json:"gated_keys,omitempty"`
	MemoryKeys     []int `json:"memory_keys,omitempty"`
	RunMemoryKeys  []int `json:"run_memory_keys,omitempty"`
	MemoryRuns     int   `json:"memory_runs,omitempty"`
	SweepKeys      []int `json:"sweep_keys,omitempty"`
	SweepRuns      int   `json:"sweep_runs,omitempty"`
	Producers      int   `json:"producers,omitempty"`
	Workers        int   `json:"workers,omitempty"`
	ThroughputRuns int   `json:"throughput_runs,omitempty"`
	ThroughputKeys int   `json:"throughput_keys,omitempty"`
	Batch          int   `json:"batch,omitempty"`
	BulkBatch      int   `json:"bulk_batch,omitempty"`
}

// allMet reports whether every scenario threshold was met.
func (r *Report) allMet() bool {
	for _, v := range r.Verdicts {
		if !v.OK {
			return false
		}
	}
	return true
}

// run runs the bench and writes its outputs: the table to stdout, progress
// to stderr when opts.Progress, and the -json and -out files.
func run(ctx context.Context, opts Options, stdout, stderr io.Writer) (rep *Report, err error) {
	start := time.Now()
	rep = &Report{GoVersion: runtime.Version(), CPUs: runtime.NumCPU(), GoMaxProcs: runtime.GOMAXPROCS(0), StartedAt: start.UTC().Truncate(time.Second)}
	prog := newProgress(stderr, opts.Progress)
	defer prog.done()

	var client redis.UniversalClient
	var topo *topology // the slot map of a cluster
	var ks *keyspace
	var cg *callgrind
	if opts.Callgrind {
		prog.printf("starting redis-server under callgrind")
		if cg, err = startCallgrind(ctx); err != nil {
			return nil, err
		}
		defer cg.stop()
		opts.RedisURL = cg.url()
		rep.Notes = append(rep.Notes, "run with -callgrind: Redis ran under valgrind's callgrind, so its times are some 50 times "+
			"longer than natively; INSTR/RUN counts the instructions Redis executed, the same from run to run on any load")
	}
	if opts.RedisURL == "" {
		rep.Backend = "miniredis"
		m, err := miniredis.Run()
		if err != nil {
			return nil, fmt.Errorf("starting miniredis: %w", err)
		}
		defer m.Close()
		client = redis.NewClient(&redis.Options{Addr: m.Addr()})
		defer func() { _ = client.Close() }()
		ks = newKeyspace(client)
	} else {
		var t target // err is run's: the deferred cleanup below reports into it
		if t, err = parseTarget(opts.RedisURL); err != nil {
			return nil, err
		}
		rep.Backend = "redis"
		if t.cluster != nil {
			rep.Backend = "redis-cluster"
		}
		client, err = connect(ctx, t)
		if err != nil {
			return nil, err
		}
		defer func() { _ = client.Close() }()
		if cc, ok := client.(*redis.ClusterClient); ok {
			if topo, err = readTopology(ctx, cc); err != nil {
				return nil, err
			}
			rep.Nodes = topo.nodes
		}
		if err := checkEmpty(ctx, client, opts.Force); err != nil {
			return nil, err
		}
		var libs map[string][]string // the runqueue Functions libraries before the run
		if libs, err = runqueueLibraries(ctx, client); err != nil {
			return nil, err
		}
		if err := checkLibraries(libs, opts.Force); err != nil {
			return nil, err
		}
		if len(libs) > 0 {
			rep.Notes = append(rep.Notes, "run with -force on a server that held runqueue Functions libraries: the bench's "+
				"flag-on queues delete those of other runqueue versions than the bench's (their programs load them again at their next call)")
		}
		if rep.RedisVersion, err = redisVersion(ctx, client); err != nil {
			return nil, err
		}
		if opts.Force {
			rep.Notes = append(rep.Notes, "run with -force on a database that held keys: command statistics are "+
				"server-wide, so other clients' work would inflate the cost figures")
		}
		ks = newKeyspace(client)
		// Remove everything written under the bench prefix, whatever
		// happened, with a context of its own: ctx may be cancelled by now.
		defer func() {
			cctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if cerr := ks.cleanupAll(cctx); cerr != nil {
				err = errors.Join(err, fmt.Errorf("removing the bench keys (prefix %s): %w", ks.base, cerr))
			}
			if cerr := dropLibraries(cctx, client, libs); cerr != nil {
				err = errors.Join(err, fmt.Errorf("removing the Functions library the bench loaded: %w", cerr))
			}
		}()
	}

	real := rep.Backend != "miniredis"
	// Cost, memory and the sweep measure one server's work per operation.
	// Each queue of the bench lives on one master of a cluster, so there
	// they would only repeat what one server shows: they run on a single
	// server (single) alone.
	single, _ := client.(*redis.Client)
	if !real {
		single = nil
	}
	if topo != nil {
		var skipped []string
		for _, sec := range []string{secCost, secMemory, secSweep} {
			if opts.want(sec) {
				skipped = append(skipped, sec)
			}
		}
		if len(skipped) > 0 {
			rep.Notes = append(rep.Notes, "sections "+strings.Join(skipped, ", ")+" not run on a Redis Cluster: they measure one "+
				"server's cost per operation, which one master shows alone; run them with -redis redis://host:port")
		}
	}
	if opts.want(secScenarios) {
		if err := runScenarios(ctx, client, ks, opts, rep, prog); err != nil {
			return rep, err
		}
	}
	if single != nil && opts.want(secCost) {
		rep.Settings.CostRuns, rep.Settings.CostRepeats, rep.Settings.CostKeys = opts.CostRuns, opts.CostRepeats, opts.CostKeys
		rep.Settings.GatedCalls, rep.Settings.GatedKeys = opts.GatedCalls, opts.GatedKeys
		if err := runCost(ctx, single, ks, opts, rep, prog, cg); err != nil {
			return rep, err
		}
	}
	if single != nil && (opts.want(secMemory) || opts.want(secSweep)) {
		if opts.want(secMemory) {
			rep.Settings.MemoryKeys = opts.MemoryKeys
			if opts.MemoryRuns > 0 {
				rep.Settings.RunMemoryKeys, rep.Settings.MemoryRuns = opts.RunMemoryKeys, opts.MemoryRuns
			}
		}
		if opts.want(secSweep) {
			rep.Settings.SweepKeys, rep.Settings.SweepRuns = opts.SweepKeys, opts.SweepRuns
		}
		if err := runSweep(ctx, single, ks, opts, rep, prog); err != nil {
			return rep, err
		}
	}
	if real && opts.want(secThroughput) {
		rep.Settings.Producers, rep.Settings.Workers = opts.Producers, opts.Workers
		rep.Settings.ThroughputRuns, rep.Settings.ThroughputKeys, rep.Settings.Batch = opts.ThroughputRuns, opts.ThroughputKeys, opts.Batch
		rep.Settings.BulkBatch = opts.BulkBatch
		if err := runThroughput(ctx, client, topo, ks, opts, rep, prog); err != nil {
			return rep, err
		}
	}
	rep.DurationSec = math.Round(time.Since(start).Seconds()*100) / 100
	prog.done()

	printReport(stdout, rep)
	if opts.JSONPath != "" {
		if err := writeJSON(opts.JSONPath, rep); err != nil {
			return rep, err
		}
	}
	if opts.OutDir != "" {
		if err := writeOut(opts.OutDir, rep); err != nil {
			return rep, err
		}
		fmt.Fprintf(stdout, "\nreport: %s\n", filepath.Join(opts.OutDir, "report.md"))
	}
	return rep, nil
}

func writeJSON(path string, rep *Report) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
