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
func ackAndDequeue(ctx context.Context, q *runqueue.Queue, done []*runqueue.Run, maxCount int, wait time.Duration,
	acked func(int)) ([]*runqueue.Run, error) {
	for _, r := range done {
		if err := q.Ack(ctx, r); err != nil {
			return nil, fmt.Errorf("ack: %w", err)
		}
	}
	if len(done) > 0 {
		acked(len(done))
	}
	runs, err := q.DequeueWait(ctx, benchEnv, benchQueue, maxCount, wait)
	if err != nil {
		return nil, fmt.Errorf("dequeue: %w", err)
	}
	return runs, nil
}

// crew runs the producer and worker goroutines of one phase. Its work
// context ends when the phase is over (every run acked), on the first
// error, or when the parent context ends.
type crew struct {
	q      *runqueue.Queue
	work   context.Context
	cancel context.CancelFunc
	target int64 // acks that end the phase; 0: the phase ends with its producers
	wg     sync.WaitGroup

	mu    sync.Mutex
	err   error
	end   time.Time // when the target-th ack was counted
	acked atomic.Int64
}

func newCrew(ctx context.Context, q *runqueue.Queue, target int) *crew {
	work, cancel := context.WithCancel(ctx)
	return &crew{q: q, work: work, cancel: cancel, target: int64(target)}
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

func (c *crew) countAcks(k int) {
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
			}
		})
	}
}

// consume starts workers goroutines that dequeue up to batch runs at a
// time and ack them, until the phase ends; got sees each dequeued batch as
// it arrives.
func (c *crew) consume(workers, batch int, got func([]*runqueue.Run)) {
	for range workers {
		c.wg.Go(func() {
			var held []*runqueue.Run
			for {
				runs, err := ackAndDequeue(c.work, c.q, held, batch, time.Second, c.countAcks)
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

func runThroughput(ctx context.Context, c *redis.Client, ks *keyspace, opts Options, rep *Report, prog *progress) error {
	for _, on := range []bool{false, true} {
		prog.printf("throughput: %d runs, %d producers and %d workers at once, flag %s", opts.ThroughputRuns, opts.Producers, opts.Workers, flagName(on))
		row, err := concurrentThroughput(ctx, c, ks, opts, on)
		if err != nil {
			return fmt.Errorf("throughput, flag %s: %w", flagName(on), err)
		}
		rep.Throughput = append(rep.Throughput, row)
	}
	for _, on := range []bool{false, true} {
		prog.printf("throughput: prefilled queue of %d runs (enqueue, then process), flag %s", opts.ThroughputRuns, flagName(on))
		rows, err := prefilledThroughput(ctx, c, ks, opts, on)
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
func concurrentThroughput(ctx context.Context, c *redis.Client, ks *keyspace, opts Options, on bool) (row ThroughputRow, err error) {
	q, done, err := scratchQueue(ctx, ks, c, on, nil, nil) // the wall clock
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
	w := newCrew(ctx, q, n)
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
		return runqueue.EnqueueParams{Env: benchEnv, Queue: benchQueue, Key: keyName(i % opts.ThroughputKeys),
			ID: "t" + strconv.Itoa(i), Payload: payload}
	})
	end, err := w.wait(ctx)
	if err != nil {
		return row, err
	}
	cpuUsec, err := cpu.stop(ctx)
	if err != nil {
		return row, err
	}
	row = throughputRow(phaseConcurrent, on, opts, opts.Producers, opts.Workers, opts.Batch, end.Sub(start), cpuUsec)
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
func prefilledThroughput(ctx context.Context, c *redis.Client, ks *keyspace, opts Options, on bool) (rows []ThroughputRow, err error) {
	q, done, err := scratchQueue(ctx, ks, c, on, nil, nil) // the wall clock
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
	p := newCrew(ctx, q, 0)
	// Producers take chunks of -batch runs (one EnqueueMany call each, once
	// enqueueRuns uses it).
	p.produce(opts.Producers, n, opts.Batch, func(i int) runqueue.EnqueueParams {
		return runqueue.EnqueueParams{Env: benchEnv, Queue: benchQueue, Key: keyName(i % opts.ThroughputKeys),
			ID: "p" + strconv.Itoa(i), Payload: payload}
	})
	end, err := p.wait(ctx)
	if err != nil {
		return nil, err
	}
	cpuUsec, err := cpu.stop(ctx)
	if err != nil {
		return nil, err
	}
	rows = append(rows, throughputRow(phaseEnqueue, on, opts, opts.Producers, 0, 0, end.Sub(start), cpuUsec))

	if cpu, err = startCPU(ctx, c); err != nil {
		return nil, err
	}
	start = time.Now()
	w := newCrew(ctx, q, n)
	w.consume(opts.Workers, opts.Batch, nil)
	if end, err = w.wait(ctx); err != nil {
		return nil, err
	}
	if cpuUsec, err = cpu.stop(ctx); err != nil {
		return nil, err
	}
	rows = append(rows, throughputRow(phaseProcess, on, opts, 0, opts.Workers, opts.Batch, end.Sub(start), cpuUsec))
	return rows, nil
}
