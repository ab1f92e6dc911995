package main

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/runqueue"
)

// The throughput phases. Each runs on a fresh queue per flag state, on the
// wall clock, with a no-op handler.
const (
	// phaseConcurrent: producers enqueue while workers dequeue and ack; the
	// phase ends when every run is acked. It also measures the latency from
	// enqueue to dequeue.
	phaseConcurrent = "concurrent"
	// phaseEnqueue and phaseProcess are the two halves of the prefilled
	// run, the method other queues publish: producers enqueue every run
	// with no worker running (phaseEnqueue), then workers drain the full
	// queue (phaseProcess).
	phaseEnqueue = "enqueue"
	phaseProcess = "process"
	// phaseSteady: one producer enqueues at a steady rate (-steady-rate,
	// default half the process phase's runs/s on the same flag) while the
	// workers serve; it measures the wait of a queue that keeps up.
	phaseSteady = "steady"
	// phaseSingle and phaseSerial: -single-producers goroutines each call
	// Enqueue for one run at a time, with no worker running; phaseSingle
	// on a default Queue (concurrent calls coalesced), phaseSerial with
	// Config.SerialCalls (a script call per run).
	phaseSingle = "enqueue-single"
	phaseSerial = "enqueue-serial"
	// phaseBulk: -producers goroutines each call EnqueueMany with
	// -bulk-batch runs at a time, with no worker running: the rate of a
	// batch enqueue of many runs.
	phaseBulk = "enqueue-bulk"
	// phaseFetch: the producers queue every run first (EnqueueMany calls,
	// not measured), then F goroutines drain the queue with no
	// runqueue.Worker, each calling Dequeue(batch) and one Ack per run it
	// got: the method of the comparison with other queues in
	// docs/performance.md. One row per shape of fetchShapes.
	phaseFetch = "fetch"
)

var phaseOrder = []string{phaseConcurrent, phaseEnqueue, phaseProcess, phaseSteady, phaseSingle, phaseSerial, phaseBulk, phaseFetch}

// fetchShapes are the fetch phase's shapes: fetcher goroutines x the
// maxCount of each one's Dequeue calls.
var fetchShapes = []struct{ fetchers, batch int }{{10, 10}, {100, 1}}

// ThroughputRow is one throughput phase on one flag state.
type ThroughputRow struct {
	Flag string `json:"flag"`
	// Phase is one of phaseOrder (see phaseConcurrent and the constants after it).
	Phase string `json:"phase"`
	// Producers are the producer goroutines of the phase, Workers its
	// runqueue.Worker instances, each running Concurrency no-op handlers
	// (0: none ran); Batch is the most runs one fetch of a Worker asks for,
	// or the fetch phase's Dequeue maxCount (0: no worker or fetcher).
	Producers   int     `json:"producers"`
	Workers     int     `json:"workers"`
	Runs        int     `json:"runs"`
	Keys        int     `json:"keys"`
	Batch       int     `json:"batch"`
	DurationSec float64 `json:"duration_s"`
	RunsPerSec  float64 `json:"runs_per_sec"`
	// RedisCPUUsPerRun is the Redis process CPU of the phase (INFO cpu:
	// used_cpu_sys + used_cpu_user) per run: the commands, the network
	// work around them and the wake-up pub/sub.
	RedisCPUUsPerRun float64 `json:"redis_cpu_us_per_run"`
	// Latency from enqueue (the time in the payload) to the dequeue that
	// returned the run; concurrent phase only.
	LatencyP50Ms *float64 `json:"latency_p50_ms,omitempty"`
	LatencyP99Ms *float64 `json:"latency_p99_ms,omitempty"`
	LatencyMaxMs *float64 `json:"latency_max_ms,omitempty"`
	// Concurrency is each Worker's WorkerConfig.Concurrency (0: no
	// worker).
	Concurrency int `json:"concurrency,omitempty"`
	// Fetchers are the fetch phase's goroutines, each calling Dequeue of
	// up to Batch runs and Ack per run (0: another phase).
	Fetchers int `json:"fetchers,omitempty"`
	// RateTarget is the steady phase's enqueue rate, runs/s.
	RateTarget float64 `json:"rate_target_per_sec,omitempty"`
	// WaitLight and WaitHeavy are the waits from a run's available time
	// to the dequeue that took it (Observer.Dequeued), over the runs of
	// the light and of the heavy keys (see keyOf); phases with workers.
	WaitLight *WaitStats `json:"wait_light,omitempty"`
	WaitHeavy *WaitStats `json:"wait_heavy,omitempty"`
	// Nodes breaks the phase down by master, on a Redis Cluster only.
	Nodes []NodeThroughput `json:"nodes,omitempty"`
}

// WaitStats are the percentiles of the waits of one key class.
type WaitStats struct {
	Runs   int     `json:"runs"`
	P50Ms  float64 `json:"p50_ms"`
	P99Ms  float64 `json:"p99_ms"`
	P999Ms float64 `json:"p999_ms"`
}

func waitStats(ms []float64) *WaitStats {
	if len(ms) == 0 {
		return nil
	}
	return &WaitStats{Runs: len(ms), P50Ms: percentile(ms, 50), P99Ms: percentile(ms, 99), P999Ms: percentile(ms, 99.9)}
}

// keyOf is the key of run i of a throughput phase over keys keys: the even
// runs go to the heavy keys, the first tenth of the keys (at least one),
// the odd runs to the light keys, the others; so a heavy key has about
// nine times the runs of a light one. With one key, every run is heavy.
func keyOf(i, keys int) string {
	heavy := max(1, keys/10)
	if i%2 == 0 || keys == heavy {
		return keyName((i / 2) % heavy)
	}
	return keyName(heavy + (i/2)%(keys-heavy))
}

// heavyKey says whether key k is one of the heavy keys of keyOf.
func heavyKey(k string, keys int) bool {
	n, err := strconv.Atoi(strings.TrimPrefix(k, "k"))
	return err == nil && n < max(1, keys/10)
}

// phaseObserver is the Observer of a throughput queue: it counts the acks
// of the current phase's crew and records the waits of its dequeues.
type phaseObserver struct {
	runqueue.NopObserver
	keys int
	crew atomic.Pointer[crew]

	mu           sync.Mutex
	light, heavy []float64 // wait, ms
	latency      []float64 // enqueue (the time in the payload) to dequeue, ms
}

func (o *phaseObserver) start(c *crew) {
	o.mu.Lock()
	o.light, o.heavy, o.latency = nil, nil, nil
	o.mu.Unlock()
	o.crew.Store(c)
}

func (o *phaseObserver) Dequeued(runs []*runqueue.Run, now time.Time) {
	got := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, r := range runs {
		wait := float64(now.Sub(r.AvailableAt)) / float64(time.Millisecond)
		if heavyKey(r.Key, o.keys) {
			o.heavy = append(o.heavy, wait)
		} else {
			o.light = append(o.light, wait)
		}
		if len(r.Payload) == 8 {
			if sent := int64(binary.BigEndian.Uint64(r.Payload)); sent > 0 {
				o.latency = append(o.latency, float64(got.Sub(time.Unix(0, sent)))/float64(time.Millisecond))
			}
		}
	}
}

func (o *phaseObserver) Handled(env, _ string, _ time.Duration, out runqueue.Outcome) {
	if c := o.crew.Load(); c != nil && out == runqueue.OutcomeAck {
		c.countAcks(c.nodeOfEnv[env], 1)
	}
}

// waits fills row's wait fields from what the phase observed.
func (o *phaseObserver) waits(row *ThroughputRow, latency bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	row.WaitLight, row.WaitHeavy = waitStats(o.light), waitStats(o.heavy)
	if latency && len(o.latency) > 0 {
		p50, p99 := percentile(o.latency, 50), percentile(o.latency, 99)
		row.LatencyP50Ms, row.LatencyP99Ms = &p50, &p99
		row.LatencyMaxMs = &o.latency[len(o.latency)-1] // percentile sorted it
	}
}

// NodeThroughput is one cluster master's part of a throughput phase: the
// runs of the env that lives on it.
type NodeThroughput struct {
	Addr string `json:"addr"`
	Env  string `json:"env"`
	// Workers is how many of the phase's workers dequeue this node's env
	// (0 in the enqueue and fetch phases).
	Workers int `json:"workers"`
	// Fetchers is how many of the fetch phase's fetchers dequeue this
	// node's env (0: another phase).
	Fetchers int `json:"fetchers,omitempty"`
	// Runs is how many runs the node took: enqueued (the enqueue-only
	// phases) or acked (the others). The nodes' runs add up to the
	// phase's.
	Runs int `json:"runs"`
	// DurationSec runs from the start of the phase to the node's last run;
	// RunsPerSec is Runs over it.
	DurationSec float64 `json:"duration_s"`
	RunsPerSec  float64 `json:"runs_per_sec"`
	// RedisCPUUsPerRun is the node's process CPU over the whole phase per
	// run it took.
	RedisCPUUsPerRun float64 `json:"redis_cpu_us_per_run"`
}

// layout is where a throughput phase puts its runs: env envs[i] lives on
// node addrs[i]. On a single server there is one env and no addrs.
type layout struct {
	envs  []string
	addrs []string
}

// clustered reports whether the phase runs on a Redis Cluster.
func (l layout) clustered() bool { return l.addrs != nil }

// node is the index of the node, and of its env, that takes run i, worker
// i and fetcher i: each is dealt to the nodes in turn.
func (l layout) node(i int) int { return i % len(l.envs) }

// throughputQueue opens a fresh queue for a phase and lays its envs out:
// on a cluster (topo not nil), one per master. A prefix whose shards miss a
// master is given up for a fresh one.
func throughputQueue(ctx context.Context, ks *keyspace, c redis.UniversalClient, topo *topology, on bool, obs runqueue.Observer,
	mutate ...func(*runqueue.Config)) (*runqueue.Queue, layout, func(*error), error) {
	observe := func(cfg *runqueue.Config) {
		cfg.Observer = obs
		for _, m := range mutate {
			m(cfg)
		}
	}
	if topo == nil {
		q, done, err := scratchQueue(ctx, ks, c, on, nil, observe) // the wall clock
		return q, layout{envs: []string{benchEnv}}, done, err
	}
	shards := clusterShards(len(topo.nodes))
	const attempts = 20
	for range attempts {
		q, done, err := scratchQueue(ctx, ks, c, on, nil, func(cfg *runqueue.Config) {
			cfg.Shards = shards
			observe(cfg)
		})
		if err != nil {
			return nil, layout{}, nil, err
		}
		envs, ok, err := topo.spread(q)
		if err == nil && ok {
			l := layout{envs: envs}
			for _, n := range topo.nodes {
				l.addrs = append(l.addrs, n.Addr)
			}
			return q, l, done, nil
		}
		done(&err)
		if err != nil {
			return nil, layout{}, nil, err
		}
	}
	return nil, layout{}, nil, fmt.Errorf("under %d fresh prefixes, the %d shards of the bench's queue always missed one of the %d masters", attempts, shards, len(topo.nodes))
}

// enqueueRuns enqueues ps, a producer's chunk: a chunk of one run with
// Enqueue, a longer one in one EnqueueMany call (one script call per base
// queue, in one pipeline).
func enqueueRuns(ctx context.Context, q *runqueue.Queue, ps []runqueue.EnqueueParams) error {
	if len(ps) == 1 {
		_, err := q.Enqueue(ctx, ps[0])
		if err != nil {
			return fmt.Errorf("run %s: %w", ps[0].ID, err)
		}
		return nil
	}
	res, err := q.EnqueueMany(ctx, ps)
	if err != nil {
		return err
	}
	for i, r := range res {
		if r.Err != nil {
			return fmt.Errorf("run %s: %w", ps[i].ID, r.Err)
		}
	}
	return nil
}

// crew runs the producer, worker and fetcher goroutines of one phase. Its
// work context ends when the phase is over (every run acked), on the first
// error, or when the parent context ends.
type crew struct {
	parent    context.Context
	q         *runqueue.Queue
	lay       layout
	nodeOfEnv map[string]int
	work      context.Context
	cancel    context.CancelFunc
	target    int64 // acks that end the phase; 0: the phase ends with its producers
	wg        sync.WaitGroup

	mu    sync.Mutex
	err   error
	end   time.Time // when the target-th ack was counted
	acked atomic.Int64

	// Runs enqueued and acked, per node.
	enqueued, served []tally
}

// tally counts runs and remembers when the last one was counted.
type tally struct {
	runs atomic.Int64
	last atomic.Int64 // Unix ns
}

func (t *tally) add(k int) {
	t.runs.Add(int64(k))
	now := time.Now().UnixNano()
	for {
		last := t.last.Load()
		if last >= now || t.last.CompareAndSwap(last, now) {
			return
		}
	}
}

func newCrew(ctx context.Context, q *runqueue.Queue, lay layout, target int) *crew {
	work, cancel := context.WithCancel(ctx)
	c := &crew{parent: ctx, q: q, lay: lay, nodeOfEnv: map[string]int{}, work: work, cancel: cancel, target: int64(target),
		enqueued: make([]tally, len(lay.envs)), served: make([]tally, len(lay.envs))}
	for i, e := range lay.envs {
		c.nodeOfEnv[e] = i
	}
	return c
}

// fail records err unless the phase is already over (an error after the
// end is the end's, not a failure).
func (c *crew) fail(err error) {
	if c.work.Err() != nil {
		return
	}
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
	c.cancel()
}

func (c *crew) countAcks(node, k int) {
	c.served[node].add(k)
	if c.acked.Add(int64(k)) == c.target {
		c.mu.Lock()
		c.end = time.Now()
		c.mu.Unlock()
		c.cancel()
	}
}

// produce starts producers goroutines that enqueue runs 0..n-1, taking
// chunks of chunk runs in turn; params describes run i.
func (c *crew) produce(producers, n, chunk int, params func(i int) runqueue.EnqueueParams) {
	var next atomic.Int64
	for range producers {
		c.wg.Go(func() {
			ps := make([]runqueue.EnqueueParams, 0, chunk)
			for c.work.Err() == nil {
				from := int(next.Add(int64(chunk))) - chunk
				if from >= n {
					return
				}
				ps = ps[:0]
				for i := from; i < min(from+chunk, n); i++ {
					ps = append(ps, params(i))
				}
				if err := enqueueRuns(c.work, c.q, ps); err != nil {
					c.fail(fmt.Errorf("enqueue: %w", err))
					return
				}
				for _, p := range ps {
					c.enqueued[c.nodeOfEnv[p.Env]].add(1)
				}
			}
		})
	}
}

// serve starts workers runqueue.Workers, each at concurrency (0: the
// default) with a no-op handler; Worker w serves the bench queue of the
// env of node lay.node(w). Their acks reach the crew through the queue's
// phaseObserver. They are shut down when the phase ends.
func (c *crew) serve(workers, concurrency int) error {
	var ws []*runqueue.Worker
	for i := range workers {
		qs := []runqueue.WorkerQueue{{Env: c.lay.envs[c.lay.node(i)], Queue: benchQueue}}
		w, err := runqueue.NewWorker(c.q, func(context.Context, *runqueue.Run) error { return nil },
			&runqueue.WorkerConfig{Queues: qs, Concurrency: concurrency, Logger: slog.New(slog.DiscardHandler)})
		if err == nil {
			err = w.Start(c.parent) // the parent's end (Ctrl-C) is a hard stop
		}
		if err != nil {
			for _, w := range ws {
				_ = w.Shutdown(c.parent)
			}
			return err
		}
		ws = append(ws, w)
	}
	c.wg.Go(func() {
		<-c.work.Done()
		stop, cancel := context.WithTimeout(context.WithoutCancel(c.parent), 30*time.Second)
		defer cancel()
		for _, w := range ws {
			if err := w.Shutdown(stop); err != nil && c.parent.Err() == nil {
				c.mu.Lock()
				if c.err == nil && c.end.IsZero() {
					c.err = fmt.Errorf("worker shutdown: %w", err)
				}
				c.mu.Unlock()
			}
		}
	})
	return nil
}

// fetch starts a fetcher of the bench queue of node's env: it calls
// Dequeue of up to batch runs and Ack for each run it got, one call per
// run, and sleeps 1 ms when Dequeue returns none, until the phase ends.
func (c *crew) fetch(node, batch int) {
	env := c.lay.envs[node]
	c.wg.Go(func() {
		for c.work.Err() == nil {
			runs, err := c.q.Dequeue(c.work, env, benchQueue, batch)
			if err != nil {
				c.fail(fmt.Errorf("dequeue: %w", err))
				return
			}
			if len(runs) == 0 {
				select {
				case <-time.After(time.Millisecond):
				case <-c.work.Done():
				}
				continue
			}
			for _, r := range runs {
				if err := c.q.Ack(c.work, r); err != nil {
					c.fail(fmt.Errorf("ack run %s: %w", r.ID, err))
					return
				}
				c.countAcks(node, 1)
			}
		}
	})
}

// fetchMax is the most runs one fetch of a Worker at concurrency asks for.
func fetchMax(q *runqueue.Queue, concurrency int) int {
	if concurrency == 0 {
		concurrency = defaultConcurrency
	}
	return min(concurrency, q.Config().MaxDequeueCount)
}

// defaultConcurrency is WorkerConfig.Concurrency's default.
const defaultConcurrency = 100

// wait waits for every goroutine and returns the first error and the time
// the phase ended: at the target-th ack, or now when the phase has no
// target.
func (c *crew) wait(ctx context.Context) (time.Time, error) {
	c.wg.Wait()
	c.cancel()
	if c.err != nil {
		return time.Time{}, c.err
	}
	if c.target == 0 {
		if err := ctx.Err(); err != nil {
			return time.Time{}, err
		}
		return time.Now(), nil
	}
	if got := c.acked.Load(); got != c.target {
		if err := ctx.Err(); err != nil {
			return time.Time{}, fmt.Errorf("%d of %d runs acked: %w", got, c.target, err)
		}
		return time.Time{}, errors.New("workers stopped early")
	}
	return c.end, nil
}

// nodes returns the per-node part of a phase that started at start, with
// workers workers and cpu µs of process CPU per node address; nil off a
// cluster. A node's runs are those acked on it, or enqueued when the phase
// ends with its producers (no target of acks).
func (c *crew) nodes(start time.Time, workers int, cpu map[string]float64) []NodeThroughput {
	if !c.lay.clustered() {
		return nil
	}
	took := c.served
	if c.target == 0 {
		took = c.enqueued
	}
	out := make([]NodeThroughput, len(c.lay.envs))
	for w := range workers {
		out[c.lay.node(w)].Workers++
	}
	for i := range out {
		n := &out[i]
		n.Addr, n.Env, n.Runs = c.lay.addrs[i], c.lay.envs[i], int(took[i].runs.Load())
		if n.Runs == 0 {
			continue
		}
		d := time.Unix(0, took[i].last.Load()).Sub(start)
		n.DurationSec, n.RunsPerSec = d.Seconds(), float64(n.Runs)/d.Seconds()
		n.RedisCPUUsPerRun = cpu[n.Addr] / float64(n.Runs)
	}
	return out
}

// runThroughput runs the phases on both flag states. topo is the slot map
// of a cluster, nil on a single server.
func runThroughput(ctx context.Context, c redis.UniversalClient, topo *topology, ks *keyspace, opts Options, rep *Report, prog *progress) error {
	if topo != nil && opts.Workers < len(topo.nodes) {
		return fmt.Errorf("-workers %d: the cluster has %d masters, and each master's env needs a worker", opts.Workers, len(topo.nodes))
	}
	for _, s := range fetchShapes {
		if topo != nil && s.fetchers < len(topo.nodes) {
			return fmt.Errorf("the fetch phase's %d fetchers cannot serve the envs of the cluster's %d masters (one fetcher each at least)", s.fetchers, len(topo.nodes))
		}
	}
	for _, on := range []bool{false, true} {
		prog.printf("throughput: %d runs, %d producers and %d workers at once, flag %s", opts.ThroughputRuns, opts.Producers, opts.Workers, flagName(on))
		row, err := concurrentThroughput(ctx, c, topo, ks, opts, on)
		if err != nil {
			return fmt.Errorf("throughput, flag %s: %w", flagName(on), err)
		}
		rep.Throughput = append(rep.Throughput, row)
	}
	processed := map[bool]float64{}
	for _, on := range []bool{false, true} {
		prog.printf("throughput: prefilled queue of %d runs (enqueue, then process), flag %s", opts.ThroughputRuns, flagName(on))
		rows, err := prefilledThroughput(ctx, c, topo, ks, opts, on)
		if err != nil {
			return fmt.Errorf("prefilled throughput, flag %s: %w", flagName(on), err)
		}
		rep.Throughput = append(rep.Throughput, rows...)
		processed[on] = rows[len(rows)-1].RunsPerSec
	}
	for _, on := range []bool{false, true} {
		for _, s := range fetchShapes {
			prog.printf("throughput: prefilled queue of %d runs, %d fetchers each calling Dequeue(%d) and Ack per run, flag %s",
				opts.ThroughputRuns, s.fetchers, s.batch, flagName(on))
			row, err := fetchThroughput(ctx, c, topo, ks, opts, on, s.fetchers, s.batch)
			if err != nil {
				return fmt.Errorf("fetch throughput, %d fetchers x %d, flag %s: %w", s.fetchers, s.batch, flagName(on), err)
			}
			rep.Throughput = append(rep.Throughput, row)
		}
	}
	for _, on := range []bool{false, true} {
		for _, serial := range []bool{false, true} {
			prog.printf("throughput: %d runs, %d producers each calling Enqueue, flag %s%s", opts.ThroughputRuns, opts.SingleProducers,
				flagName(on), map[bool]string{true: ", serial"}[serial])
			row, err := singleThroughput(ctx, c, topo, ks, opts, on, serial)
			if err != nil {
				return fmt.Errorf("single enqueue throughput, flag %s: %w", flagName(on), err)
			}
			rep.Throughput = append(rep.Throughput, row)
		}
	}
	for _, on := range []bool{false, true} {
		prog.printf("throughput: %d runs, %d producers each calling EnqueueMany with %d runs, flag %s", opts.ThroughputRuns, opts.Producers,
			opts.BulkBatch, flagName(on))
		row, err := bulkThroughput(ctx, c, topo, ks, opts, on)
		if err != nil {
			return fmt.Errorf("bulk enqueue throughput, flag %s: %w", flagName(on), err)
		}
		rep.Throughput = append(rep.Throughput, row)
	}
	for _, on := range []bool{false, true} {
		rate := opts.SteadyRate
		if rate == 0 {
			rate = processed[on] / 2
		}
		prog.printf("throughput: %d runs at a steady %.0f runs/s, flag %s", opts.ThroughputRuns, rate, flagName(on))
		row, err := steadyThroughput(ctx, c, topo, ks, opts, on, rate)
		if err != nil {
			return fmt.Errorf("steady throughput, flag %s: %w", flagName(on), err)
		}
		rep.Throughput = append(rep.Throughput, row)
	}
	sortThroughput(rep.Throughput)
	rep.Targets = append(rep.Targets, throughputTargets(rep.Throughput, opts)...)
	return nil
}

// throughputTargets judges the enqueue rates of docs/design.md section 9,
// flag on, flag off beside it: single Enqueue calls (the coalesced phase)
// and a batch enqueue of many runs (the bulk phase's EnqueueMany calls).
func throughputTargets(rows []ThroughputRow, opts Options) []TargetRow {
	var out []TargetRow
	add := func(target, phase string, limit float64) {
		var r TargetRow
		seen := false
		for _, row := range rows {
			if row.Phase != phase {
				continue
			}
			if row.Flag == "on" {
				r.On, seen = row.RunsPerSec, true
			} else {
				r.Off = row.RunsPerSec
			}
		}
		if !seen {
			return
		}
		r.Target, r.Op, r.Metric = target, phase, "runs_per_sec"
		r.Limit, r.Met = fmt.Sprintf(">= %s runs/s (flag on)", num(limit)), r.On >= limit
		out = append(out, r)
	}
	add(fmt.Sprintf("single Enqueue, %d producers", opts.SingleProducers), phaseSingle, 50000)
	add(fmt.Sprintf("batch enqueue (EnqueueMany of %d runs, %d producers)", opts.BulkBatch, opts.Producers), phaseBulk, 200000)
	return out
}

// sortThroughput orders the rows by phase, then flag off before on.
func sortThroughput(rows []ThroughputRow) {
	rank := func(r ThroughputRow) int {
		i := slices.Index(phaseOrder, r.Phase)
		if i < 0 {
			i = len(phaseOrder)
		}
		return 2*i + boolInt(r.Flag == "on")
	}
	sort.SliceStable(rows, func(i, j int) bool { return rank(rows[i]) < rank(rows[j]) })
}

func throughputRow(phase string, on bool, opts Options, producers, workers, batch int, d time.Duration, cpuUsec float64) ThroughputRow {
	n := opts.ThroughputRuns
	row := ThroughputRow{Flag: flagName(on), Phase: phase, Producers: producers, Workers: workers, Runs: n,
		Keys: opts.ThroughputKeys, Batch: batch, DurationSec: d.Seconds(), RunsPerSec: float64(n) / d.Seconds(),
		RedisCPUUsPerRun: cpuUsec / float64(n)}
	if workers > 0 {
		row.Concurrency = cmp.Or(opts.Concurrency, defaultConcurrency)
	}
	return row
}

// phase is one measured stretch of a throughput phase: its crew, the Redis
// CPU meter started with it, and when it started.
type phase struct {
	crew  *crew
	cpu   *cpuMeter
	start time.Time
}

// startPhase starts the Redis CPU meter and a crew of target runs; with
// workers > 0 its Workers serve at once (obs watches their waits).
func startPhase(ctx context.Context, c redis.UniversalClient, q *runqueue.Queue, lay layout, target int, obs *phaseObserver, opts Options, workers int) (*phase, error) {
	cpu, err := startCPU(ctx, c)
	if err != nil {
		return nil, err
	}
	p := &phase{crew: newCrew(ctx, q, lay, target), cpu: cpu, start: time.Now()}
	if workers > 0 {
		obs.start(p.crew)
		if err := p.crew.serve(workers, opts.Concurrency); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// finish waits for the crew and reads the CPU meter: the phase's row
// (throughputRow's arguments after phase and flag) with its nodes.
func (p *phase) finish(ctx context.Context, name string, on bool, opts Options, producers, workers, batch int) (ThroughputRow, error) {
	end, err := p.crew.wait(ctx)
	if err != nil {
		return ThroughputRow{}, err
	}
	cpuUsec, cpuByNode, err := p.cpu.stopNodes(ctx)
	if err != nil {
		return ThroughputRow{}, err
	}
	row := throughputRow(name, on, opts, producers, workers, batch, end.Sub(p.start), cpuUsec)
	row.Nodes = p.crew.nodes(p.start, workers, cpuByNode)
	return row, nil
}

// concurrentThroughput runs producers and Workers at once: ThroughputRuns
// runs, each enqueued with its enqueue time in the payload, dequeued and
// acked.
func concurrentThroughput(ctx context.Context, c redis.UniversalClient, topo *topology, ks *keyspace, opts Options, on bool) (row ThroughputRow, err error) {
	obs := &phaseObserver{keys: opts.ThroughputKeys}
	q, lay, done, err := throughputQueue(ctx, ks, c, topo, on, obs)
	if err != nil {
		return row, err
	}
	defer done(&err)
	n := opts.ThroughputRuns
	// A guard against a stall: the bench must end.
	ctx, cancelAll := context.WithTimeout(ctx, 10*time.Minute)
	defer cancelAll()

	ph, err := startPhase(ctx, c, q, lay, n, obs, opts, opts.Workers)
	if err != nil {
		return row, err
	}
	// Chunks of one run: the time in the payload is the time of its Enqueue.
	ph.crew.produce(opts.Producers, n, 1, func(i int) runqueue.EnqueueParams {
		payload := make([]byte, 8)
		binary.BigEndian.PutUint64(payload, uint64(time.Now().UnixNano()))
		return runqueue.EnqueueParams{Env: lay.envs[lay.node(i)], Queue: benchQueue, Key: keyOf(i, opts.ThroughputKeys),
			ID: "t" + strconv.Itoa(i), Payload: payload}
	})
	if row, err = ph.finish(ctx, phaseConcurrent, on, opts, opts.Producers, opts.Workers, fetchMax(q, opts.Concurrency)); err != nil {
		return row, err
	}
	obs.waits(&row, true)
	return row, nil
}

// prefilledThroughput enqueues ThroughputRuns runs with the producers and
// no worker (the enqueue row), then drains the queue with the Workers (the
// process row).
func prefilledThroughput(ctx context.Context, c redis.UniversalClient, topo *topology, ks *keyspace, opts Options, on bool) (rows []ThroughputRow, err error) {
	obs := &phaseObserver{keys: opts.ThroughputKeys}
	q, lay, done, err := throughputQueue(ctx, ks, c, topo, on, obs)
	if err != nil {
		return nil, err
	}
	defer done(&err)
	n := opts.ThroughputRuns
	ctx, cancelAll := context.WithTimeout(ctx, 10*time.Minute)
	defer cancelAll()
	// Producers take chunks of -batch runs, one EnqueueMany call each.
	row, err := enqueuePhase(ctx, c, q, lay, obs, opts, phaseEnqueue, on, opts.Producers, opts.Batch)
	if err != nil {
		return nil, err
	}
	rows = append(rows, row)

	ph, err := startPhase(ctx, c, q, lay, n, obs, opts, opts.Workers)
	if err != nil {
		return nil, err
	}
	if row, err = ph.finish(ctx, phaseProcess, on, opts, 0, opts.Workers, fetchMax(q, opts.Concurrency)); err != nil {
		return nil, err
	}
	obs.waits(&row, false)
	rows = append(rows, row)
	return rows, nil
}

// fetchThroughput queues ThroughputRuns runs as the enqueue phase does
// (the producers' EnqueueMany calls of -batch runs, no worker; not
// measured), then measures fetchers goroutines draining the queue, each
// calling Dequeue of up to batch runs and Ack for each run it got, as a
// user's loop without runqueue.Worker would: the fetch row. The queue has
// no Observer, like a user's.
func fetchThroughput(ctx context.Context, c redis.UniversalClient, topo *topology, ks *keyspace, opts Options, on bool,
	fetchers, batch int) (row ThroughputRow, err error) {
	q, lay, done, err := throughputQueue(ctx, ks, c, topo, on, nil)
	if err != nil {
		return row, err
	}
	defer done(&err)
	ctx, cancelAll := context.WithTimeout(ctx, 10*time.Minute)
	defer cancelAll()
	if _, err := enqueuePhase(ctx, c, q, lay, nil, opts, phaseFetch, on, opts.Producers, opts.Batch); err != nil {
		return row, err
	}
	ph, err := startPhase(ctx, c, q, lay, opts.ThroughputRuns, nil, opts, 0)
	if err != nil {
		return row, err
	}
	for f := range fetchers {
		ph.crew.fetch(lay.node(f), batch)
	}
	if row, err = ph.finish(ctx, phaseFetch, on, opts, 0, 0, batch); err != nil {
		return row, err
	}
	row.Fetchers = fetchers
	if row.Nodes != nil {
		for f := range fetchers {
			row.Nodes[lay.node(f)].Fetchers++
		}
	}
	return row, nil
}

// singleThroughput enqueues ThroughputRuns runs from SingleProducers
// goroutines, each calling Enqueue for one run at a time, with no worker:
// coalesced (a default Queue) or, with serial, a script call per run.
func singleThroughput(ctx context.Context, c redis.UniversalClient, topo *topology, ks *keyspace, opts Options, on, serial bool) (ThroughputRow, error) {
	name := phaseSingle
	if serial {
		name = phaseSerial
	}
	return enqueueOnly(ctx, c, topo, ks, opts, on, name, opts.SingleProducers, 1, func(cfg *runqueue.Config) { cfg.SerialCalls = serial })
}

// bulkThroughput enqueues ThroughputRuns runs from Producers goroutines,
// each calling EnqueueMany with BulkBatch runs at a time, with no worker.
func bulkThroughput(ctx context.Context, c redis.UniversalClient, topo *topology, ks *keyspace, opts Options, on bool) (ThroughputRow, error) {
	return enqueueOnly(ctx, c, topo, ks, opts, on, phaseBulk, opts.Producers, opts.BulkBatch)
}

// enqueueOnly runs enqueuePhase on a fresh queue (mutate changes its
// Config) and cleans the queue up.
func enqueueOnly(ctx context.Context, c redis.UniversalClient, topo *topology, ks *keyspace, opts Options, on bool,
	name string, producers, chunk int, mutate ...func(*runqueue.Config)) (row ThroughputRow, err error) {
	obs := &phaseObserver{keys: opts.ThroughputKeys}
	q, lay, done, err := throughputQueue(ctx, ks, c, topo, on, obs, mutate...)
	if err != nil {
		return row, err
	}
	defer done(&err)
	ctx, cancelAll := context.WithTimeout(ctx, 10*time.Minute)
	defer cancelAll()
	return enqueuePhase(ctx, c, q, lay, obs, opts, name, on, producers, chunk)
}

// enqueuePhase enqueues ThroughputRuns runs on q from producers goroutines
// with no worker, each taking chunks of chunk runs (Enqueue for a chunk of
// one, else EnqueueMany): the row of phase name.
func enqueuePhase(ctx context.Context, c redis.UniversalClient, q *runqueue.Queue, lay layout, obs *phaseObserver, opts Options,
	name string, on bool, producers, chunk int) (ThroughputRow, error) {
	// The payload has the size of the concurrent phase's (no time in it).
	payload := []byte{0, 0, 0, 0, 0, 0, 0, 0}
	ph, err := startPhase(ctx, c, q, lay, 0, obs, opts, 0)
	if err != nil {
		return ThroughputRow{}, err
	}
	ph.crew.produce(producers, opts.ThroughputRuns, chunk, func(i int) runqueue.EnqueueParams {
		return runqueue.EnqueueParams{Env: lay.envs[lay.node(i)], Queue: benchQueue, Key: keyOf(i, opts.ThroughputKeys),
			ID: name + "-" + strconv.Itoa(i), Payload: payload}
	})
	return ph.finish(ctx, name, on, opts, producers, 0, 0)
}

// steadyThroughput enqueues ThroughputRuns runs at rate runs/s from one
// paced producer (an EnqueueMany of the runs due every millisecond or so)
// while the Workers serve them: the waits of a queue that keeps up.
func steadyThroughput(ctx context.Context, c redis.UniversalClient, topo *topology, ks *keyspace, opts Options, on bool, rate float64) (row ThroughputRow, err error) {
	obs := &phaseObserver{keys: opts.ThroughputKeys}
	q, lay, done, err := throughputQueue(ctx, ks, c, topo, on, obs)
	if err != nil {
		return row, err
	}
	defer done(&err)
	n := opts.ThroughputRuns
	ctx, cancelAll := context.WithTimeout(ctx, 10*time.Minute)
	defer cancelAll()
	ph, err := startPhase(ctx, c, q, lay, n, obs, opts, opts.Workers)
	if err != nil {
		return row, err
	}
	w, start := ph.crew, ph.start
	w.wg.Go(func() {
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		sent := 0
		ps := make([]runqueue.EnqueueParams, 0, 1000)
		for sent < n && w.work.Err() == nil {
			due := min(n, int(time.Since(start).Seconds()*rate)+1)
			for sent < due {
				ps = ps[:0]
				payload := make([]byte, 8)
				binary.BigEndian.PutUint64(payload, uint64(time.Now().UnixNano()))
				for ; sent < due && len(ps) < 1000; sent++ {
					ps = append(ps, runqueue.EnqueueParams{Env: lay.envs[lay.node(sent)], Queue: benchQueue,
						Key: keyOf(sent, opts.ThroughputKeys), ID: "s" + strconv.Itoa(sent), Payload: payload})
				}
				if err := enqueueRuns(w.work, q, ps); err != nil {
					w.fail(fmt.Errorf("enqueue: %w", err))
					return
				}
			}
			select {
			case <-t.C:
			case <-w.work.Done():
			}
		}
	})
	if row, err = ph.finish(ctx, phaseSteady, on, opts, 1, opts.Workers, fetchMax(q, opts.Concurrency)); err != nil {
		return row, err
	}
	row.RateTarget = rate
	obs.waits(&row, true)
	return row, nil
}
