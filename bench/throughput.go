package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
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
)

var phaseOrder = []string{phaseConcurrent, phaseEnqueue, phaseProcess}

// ThroughputRow is one throughput phase on one flag state.
type ThroughputRow struct {
	Flag string `json:"flag"`
	// Phase is "concurrent", "enqueue" or "process" (see phaseConcurrent).
	Phase string `json:"phase"`
	// Producers and Workers are the goroutines of the phase (0: none ran);
	// Batch is the maxCount of each worker's dequeue (0: no worker).
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
	// Nodes breaks the phase down by master, on a Redis Cluster only.
	Nodes []NodeThroughput `json:"nodes,omitempty"`
}

// NodeThroughput is one cluster master's part of a throughput phase: the
// runs of the env that lives on it.
type NodeThroughput struct {
	Addr string `json:"addr"`
	Env  string `json:"env"`
	// Workers is how many of the phase's workers dequeue this node's env
	// (0 in the enqueue phase).
	Workers int `json:"workers"`
	// Runs is how many runs the node took: enqueued (enqueue phase) or
	// acked (concurrent and process phases). The nodes' runs add up to
	// the phase's.
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

// node is the index of the node, and of its env, that takes run i and
// worker i: both are dealt to the nodes in turn.
func (l layout) node(i int) int { return i % len(l.envs) }

// throughputQueue opens a fresh queue for a phase and lays its envs out:
// on a cluster (topo not nil), one per master. A prefix whose shards miss a
// master is given up for a fresh one.
func throughputQueue(ctx context.Context, ks *keyspace, c redis.UniversalClient, topo *topology, on bool) (*runqueue.Queue, layout, func(*error), error) {
	if topo == nil {
		q, done, err := scratchQueue(ctx, ks, c, on, nil, nil) // the wall clock
		return q, layout{envs: []string{benchEnv}}, done, err
	}
	shards := clusterShards(len(topo.nodes))
	const attempts = 20
	for range attempts {
		q, done, err := scratchQueue(ctx, ks, c, on, nil, func(cfg *runqueue.Config) { cfg.Shards = shards })
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

// enqueueRuns enqueues ps with one Enqueue call per run. Producers hand it
// their runs in chunks; it is the one function to change to enqueue a
// chunk in one call once the Queue has a batch enqueue (EnqueueMany).
func enqueueRuns(ctx context.Context, q *runqueue.Queue, ps []runqueue.EnqueueParams) error {
	for _, p := range ps {
		if _, err := q.Enqueue(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

// ackAndDequeue acks done, the runs of the worker's previous dequeue (none
// at first), calls acked with their number, then dequeues up to maxCount
// runs, waiting up to wait for some. It is the one function to change to
// ack and dequeue in one call once the Queue has a fused AckAndDequeue:
// acked must still be called as soon as the acks are done, before any
// wait for new runs, since the phase ends at the last ack.
func ackAndDequeue(ctx context.Context, q *runqueue.Queue, env string, done []*runqueue.Run, maxCount int, wait time.Duration,
	acked func(int)) ([]*runqueue.Run, error) {
	for _, r := range done {
		if err := q.Ack(ctx, r); err != nil {
			return nil, fmt.Errorf("ack: %w", err)
		}
	}
	if len(done) > 0 {
		acked(len(done))
	}
	runs, err := q.DequeueWait(ctx, env, benchQueue, maxCount, wait)
	if err != nil {
		return nil, fmt.Errorf("dequeue: %w", err)
	}
	return runs, nil
}

// crew runs the producer and worker goroutines of one phase. Its work
// context ends when the phase is over (every run acked), on the first
// error, or when the parent context ends.
type crew struct {
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
	c := &crew{q: q, lay: lay, nodeOfEnv: map[string]int{}, work: work, cancel: cancel, target: int64(target),
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

// consume starts workers goroutines that dequeue up to batch runs at a
// time and ack them, until the phase ends; got sees each dequeued batch as
// it arrives. Worker w serves the env of node lay.node(w).
func (c *crew) consume(workers, batch int, got func([]*runqueue.Run)) {
	for w := range workers {
		node := c.lay.node(w)
		acked := func(k int) { c.countAcks(node, k) }
		c.wg.Go(func() {
			var held []*runqueue.Run
			for {
				runs, err := ackAndDequeue(c.work, c.q, c.lay.envs[node], held, batch, time.Second, acked)
				if err != nil {
					c.fail(err)
					return
				}
				if got != nil {
					got(runs)
				}
				held = runs
			}
		})
	}
}

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
// workers workers (0: a phase of producers alone) and cpu µs of process CPU
// per node address; nil off a cluster. A node's runs are those acked on it,
// or enqueued when no worker ran.
func (c *crew) nodes(start time.Time, workers int, cpu map[string]float64) []NodeThroughput {
	if !c.lay.clustered() {
		return nil
	}
	took := c.served
	if workers == 0 {
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

// runThroughput runs both phases on both flag states. topo is the slot map
// of a cluster, nil on a single server.
func runThroughput(ctx context.Context, c redis.UniversalClient, topo *topology, ks *keyspace, opts Options, rep *Report, prog *progress) error {
	if topo != nil && opts.Workers < len(topo.nodes) {
		return fmt.Errorf("-workers %d: the cluster has %d masters, and each master's env needs a worker", opts.Workers, len(topo.nodes))
	}
	for _, on := range []bool{false, true} {
		prog.printf("throughput: %d runs, %d producers and %d workers at once, flag %s", opts.ThroughputRuns, opts.Producers, opts.Workers, flagName(on))
		row, err := concurrentThroughput(ctx, c, topo, ks, opts, on)
		if err != nil {
			return fmt.Errorf("throughput, flag %s: %w", flagName(on), err)
		}
		rep.Throughput = append(rep.Throughput, row)
	}
	for _, on := range []bool{false, true} {
		prog.printf("throughput: prefilled queue of %d runs (enqueue, then process), flag %s", opts.ThroughputRuns, flagName(on))
		rows, err := prefilledThroughput(ctx, c, topo, ks, opts, on)
		if err != nil {
			return fmt.Errorf("prefilled throughput, flag %s: %w", flagName(on), err)
		}
		rep.Throughput = append(rep.Throughput, rows...)
	}
	sortThroughput(rep.Throughput)
	return nil
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
	return ThroughputRow{Flag: flagName(on), Phase: phase, Producers: producers, Workers: workers, Runs: n,
		Keys: opts.ThroughputKeys, Batch: batch, DurationSec: d.Seconds(), RunsPerSec: float64(n) / d.Seconds(),
		RedisCPUUsPerRun: cpuUsec / float64(n)}
}

// concurrentThroughput runs producers and workers at once: ThroughputRuns
// runs, each enqueued with its enqueue time in the payload, dequeued and
// acked.
func concurrentThroughput(ctx context.Context, c redis.UniversalClient, topo *topology, ks *keyspace, opts Options, on bool) (row ThroughputRow, err error) {
	q, lay, done, err := throughputQueue(ctx, ks, c, topo, on)
	if err != nil {
		return row, err
	}
	defer done(&err)
	n := opts.ThroughputRuns
	// A guard against a stall: the bench must end.
	ctx, cancelAll := context.WithTimeout(ctx, 10*time.Minute)
	defer cancelAll()

	var (
		mu  sync.Mutex
		lat []float64
	)
	cpu, err := startCPU(ctx, c)
	if err != nil {
		return row, err
	}
	start := time.Now()
	w := newCrew(ctx, q, lay, n)
	w.consume(opts.Workers, opts.Batch, func(runs []*runqueue.Run) {
		if len(runs) == 0 {
			return
		}
		got := time.Now()
		mu.Lock()
		defer mu.Unlock()
		for _, r := range runs {
			if len(r.Payload) == 8 {
				sent := time.Unix(0, int64(binary.BigEndian.Uint64(r.Payload)))
				lat = append(lat, float64(got.Sub(sent))/float64(time.Millisecond))
			}
		}
	})
	// Chunks of one run: the time in the payload is the time of its Enqueue.
	w.produce(opts.Producers, n, 1, func(i int) runqueue.EnqueueParams {
		payload := make([]byte, 8)
		binary.BigEndian.PutUint64(payload, uint64(time.Now().UnixNano()))
		return runqueue.EnqueueParams{Env: lay.envs[lay.node(i)], Queue: benchQueue, Key: keyName(i % opts.ThroughputKeys),
			ID: "t" + strconv.Itoa(i), Payload: payload}
	})
	end, err := w.wait(ctx)
	if err != nil {
		return row, err
	}
	cpuUsec, cpuByNode, err := cpu.stopNodes(ctx)
	if err != nil {
		return row, err
	}
	row = throughputRow(phaseConcurrent, on, opts, opts.Producers, opts.Workers, opts.Batch, end.Sub(start), cpuUsec)
	row.Nodes = w.nodes(start, opts.Workers, cpuByNode)
	p50, p99 := percentile(lat, 50), percentile(lat, 99)
	row.LatencyP50Ms, row.LatencyP99Ms = &p50, &p99
	if len(lat) > 0 {
		row.LatencyMaxMs = &lat[len(lat)-1] // percentile sorted lat
	}
	return row, nil
}

// prefilledThroughput enqueues ThroughputRuns runs with the producers and
// no worker (the enqueue row), then drains the queue with the workers (the
// process row).
func prefilledThroughput(ctx context.Context, c redis.UniversalClient, topo *topology, ks *keyspace, opts Options, on bool) (rows []ThroughputRow, err error) {
	q, lay, done, err := throughputQueue(ctx, ks, c, topo, on)
	if err != nil {
		return nil, err
	}
	defer done(&err)
	n := opts.ThroughputRuns
	ctx, cancelAll := context.WithTimeout(ctx, 10*time.Minute)
	defer cancelAll()
	// The payload has the size of the concurrent phase's.
	payload := []byte("01234567")

	cpu, err := startCPU(ctx, c)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	p := newCrew(ctx, q, lay, 0)
	// Producers take chunks of -batch runs (one EnqueueMany call each, once
	// enqueueRuns uses it).
	p.produce(opts.Producers, n, opts.Batch, func(i int) runqueue.EnqueueParams {
		return runqueue.EnqueueParams{Env: lay.envs[lay.node(i)], Queue: benchQueue, Key: keyName(i % opts.ThroughputKeys),
			ID: "p" + strconv.Itoa(i), Payload: payload}
	})
	end, err := p.wait(ctx)
	if err != nil {
		return nil, err
	}
	cpuUsec, cpuByNode, err := cpu.stopNodes(ctx)
	if err != nil {
		return nil, err
	}
	row := throughputRow(phaseEnqueue, on, opts, opts.Producers, 0, 0, end.Sub(start), cpuUsec)
	row.Nodes = p.nodes(start, 0, cpuByNode)
	rows = append(rows, row)

	if cpu, err = startCPU(ctx, c); err != nil {
		return nil, err
	}
	start = time.Now()
	w := newCrew(ctx, q, lay, n)
	w.consume(opts.Workers, opts.Batch, nil)
	if end, err = w.wait(ctx); err != nil {
		return nil, err
	}
	if cpuUsec, cpuByNode, err = cpu.stopNodes(ctx); err != nil {
		return nil, err
	}
	row = throughputRow(phaseProcess, on, opts, 0, opts.Workers, opts.Batch, end.Sub(start), cpuUsec)
	row.Nodes = w.nodes(start, opts.Workers, cpuByNode)
	rows = append(rows, row)
	return rows, nil
}
