// Command bench compares the fair scheduler (flag on) with age order (flag
// off): the scenario suite of docs/design.md section 8 on both flag states
// and, on a real Redis, the cost, memory and throughput figures of
// docs/design.md section 9.
//
//	go run ./bench                                  # embedded miniredis: fairness only
//	go run ./bench -redis redis://127.0.0.1:6379/0  # real Redis: fairness, cost, memory, throughput
//	go run ./bench -redis redis+cluster://127.0.0.1:7000,127.0.0.1:7001  # Redis Cluster: fairness, throughput per node
//	go run ./bench -json out.json -out report/      # also a JSON document and a report with charts
//
// On a real Redis it writes only keys under its own random prefix, removes
// them when it ends (also on Ctrl-C), and refuses a database (on a cluster,
// any master) that holds any key unless -force is given.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/redis/go-redis/v9"
)

func main() {
	opts, err := parseFlags(os.Args[1:], os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	opts.Progress = isTerminal(os.Stderr)
	// go-redis logs each failed dial; the error the bench returns says it once.
	redis.SetLogger(quietLogger{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, opts, os.Stdout, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	if opts.Strict && !rep.allMet() {
		fmt.Fprintln(os.Stderr, "bench: some scenario thresholds are not met (-strict)")
		os.Exit(3)
	}
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// isTerminal reports whether f is a terminal (a character device), where a
// progress line is welcome; a file or a pipe gets none.
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// parseFlags reads the command line into Options; getenv supplies REDIS_URL.
func parseFlags(args []string, getenv func(string) string, errOut io.Writer) (Options, error) {
	o := DefaultOptions()
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(errOut)
	fs.Usage = func() {
		fmt.Fprintf(errOut, "usage: go run ./bench [flags]\n\n"+
			"Runs the scenario suite with the scheduler flag off and on and prints the\n"+
			"results. Without -redis (and REDIS_URL) it uses an embedded miniredis, which\n"+
			"measures fairness only; with a real Redis it also measures cost per operation\n"+
			"(commandstats and process CPU), memory per key, cost against key count and\n"+
			"throughput (concurrent, and a prefilled queue enqueued then processed). On a\n"+
			"Redis Cluster it runs the scenarios and the throughput phases, with one env\n"+
			"on each master, and reports the throughput of each node.\n\nflags:\n")
		fs.PrintDefaults()
	}
	fs.StringVar(&o.RedisURL, "redis", getenv("REDIS_URL"), "real Redis `URL`: one server, redis://host:port/db; or a Redis Cluster, "+
		"redis+cluster://host:port,host:port (any of its nodes) or host:port,host:port; default $REDIS_URL, else embedded miniredis")
	fs.BoolVar(&o.Force, "force", false, "run on a database that already holds keys (the bench still touches only its own prefix), "+
		"or on a server that holds runqueue Functions libraries (the bench's flag-on queues delete those of other runqueue versions)")
	fs.StringVar(&o.JSONPath, "json", "", "write the results as JSON to `FILE`")
	fs.StringVar(&o.OutDir, "out", "", "write report.md and SVG charts to `DIR`")
	fs.BoolVar(&o.Strict, "strict", false, "exit with status 3 when a scenario threshold is not met")
	fs.BoolVar(&o.Callgrind, "callgrind", false, "start a redis-server under valgrind's callgrind and count the instructions Redis "+
		"executes in each cost phase, which do not vary with the machine's load (with -sections cost; needs valgrind and redis-server)")
	sections := fs.String("sections", strings.Join(allSections, ","), "comma-separated sections to run (real Redis only for all but scenarios)")
	scen := fs.String("scenarios", "", "comma-separated scenario names to run (default: all)")
	fs.IntVar(&o.CostRuns, "cost-runs", o.CostRuns, "runs per cost measurement")
	fs.IntVar(&o.CostRepeats, "cost-repeats", o.CostRepeats, "repetitions of each cost measurement; the fastest is reported")
	fs.IntVar(&o.CostKeys, "cost-keys", o.CostKeys, "concurrency keys the cost measurements spread runs over")
	fs.IntVar(&o.GatedCalls, "gated-calls", o.GatedCalls, "fully gated dequeue calls measured")
	memKeys := fs.String("memory-keys", joinInts(o.MemoryKeys), "key counts of the memory measurement")
	fs.IntVar(&o.MemoryRuns, "memory-runs", o.MemoryRuns, "runs queued over 10 and over 1,000 keys to measure the bytes of a queued run (0: not measured)")
	sweepKeys := fs.String("sweep-keys", joinInts(o.SweepKeys), "active key counts of the cost sweep")
	fs.IntVar(&o.SweepRuns, "sweep-runs", o.SweepRuns, "runs dequeued and acked at each sweep point")
	fs.IntVar(&o.Producers, "producers", o.Producers, "throughput: producer goroutines (concurrent and prefilled phases)")
	fs.IntVar(&o.SingleProducers, "single-producers", o.SingleProducers, "throughput: producer goroutines of the single-Enqueue phases")
	fs.IntVar(&o.Workers, "workers", o.Workers, "throughput: runqueue.Worker instances, each serving every env of the bench")
	fs.IntVar(&o.Concurrency, "concurrency", o.Concurrency, "throughput: each Worker's Concurrency (0: its default, 100)")
	fs.Float64Var(&o.SteadyRate, "steady-rate", o.SteadyRate, "throughput: enqueue rate (runs/s) of the steady phase (0: half the process phase's runs/s)")
	fs.IntVar(&o.ThroughputRuns, "runs", o.ThroughputRuns, "throughput: runs per flag state in each phase (concurrent; prefilled: enqueued, then processed)")
	fs.IntVar(&o.ThroughputKeys, "keys", o.ThroughputKeys, "throughput: concurrency keys the runs are spread over")
	fs.IntVar(&o.Batch, "batch", o.Batch, "throughput: runs per EnqueueMany call of the prefilled (enqueue) and fetch phases' producers")
	fs.IntVar(&o.BulkBatch, "bulk-batch", o.BulkBatch, "throughput: runs per EnqueueMany call of the bulk-enqueue phase's producers (at most 1000)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	var err error
	if o.MemoryKeys, err = parseInts(*memKeys); err != nil {
		return o, fmt.Errorf("-memory-keys: %w", err)
	}
	if o.SweepKeys, err = parseInts(*sweepKeys); err != nil {
		return o, fmt.Errorf("-sweep-keys: %w", err)
	}
	o.Sections = map[string]bool{}
	for _, s := range splitList(*sections) {
		if !knownSection(s) {
			return o, fmt.Errorf("-sections: unknown section %q (have %s)", s, strings.Join(allSections, ", "))
		}
		o.Sections[s] = true
	}
	o.Scenarios = splitList(*scen)
	if o.RedisURL != "" {
		if _, err := parseTarget(o.RedisURL); err != nil {
			return o, err
		}
	}
	return o, o.validate()
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}
