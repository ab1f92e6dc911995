package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/runqueue"
)

// ThroughputRow is one end-to-end run: producers enqueue, workers dequeue
// (blocking) and ack with a no-op handler, on the wall clock.
type ThroughputRow struct {
	Flag        string  `json:"flag"`
	Producers   int     `json:"producers"`
	Workers     int     `json:"workers"`
	Runs        int     `json:"runs"`
	Keys        int     `json:"keys"`
	Batch       int     `json:"batch"`
	DurationSec float64 `json:"duration_s"`
	RunsPerSec  float64 `json:"runs_per_sec"`
	// Latency from enqueue (the time in the payload) to the dequeue that
	// returned the run.
	LatencyP50Ms float64 `json:"latency_p50_ms"`
	LatencyP99Ms float64 `json:"latency_p99_ms"`
	LatencyMaxMs float64 `json:"latency_max_ms"`
}

func runThroughput(ctx context.Context, c *redis.Client, ks *keyspace, opts Options, rep *Report, prog *progress) error {
	for _, on := range []bool{false, true} {
		prog.printf("throughput: %d runs, %d producers, %d workers, flag %s", opts.ThroughputRuns, opts.Producers, opts.Workers, flagName(on))
		row, err := throughput(ctx, c, ks, opts, on)
		if err != nil {
			return fmt.Errorf("throughput, flag %s: %w", flagName(on), err)
		}
		rep.Throughput = append(rep.Throughput, row)
	}
	return nil
}

func throughput(ctx context.Context, c *redis.Client, ks *keyspace, opts Options, on bool) (row ThroughputRow, err error) {
	q, done, err := scratchQueue(ctx, ks, c, on, nil, nil) // the wall clock
	if err != nil {
		return row, err
	}
	defer done(&err)

	n := opts.ThroughputRuns
	// A guard against a stall: the bench must end.
	ctx, cancelAll := context.WithTimeout(ctx, 10*time.Minute)
	defer cancelAll()
	work, stop := context.WithCancel(ctx)
	defer stop()

	var (
		mu       sync.Mutex
		firstErr error
		lat      []float64
		acked    atomic.Int64
		end      time.Time
		wg       sync.WaitGroup
	)
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
		stop()
	}
	start := time.Now()
	for range opts.Workers {
		wg.Go(func() {
			var mine []float64
			defer func() {
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			}()
			for work.Err() == nil {
				runs, err := q.DequeueWait(work, benchEnv, benchQueue, opts.Batch, time.Second)
				if err != nil {
					if work.Err() == nil {
						fail(fmt.Errorf("dequeue: %w", err))
					}
					return
				}
				got := time.Now()
				for _, r := range runs {
					if len(r.Payload) == 8 {
						sent := time.Unix(0, int64(binary.BigEndian.Uint64(r.Payload)))
						mine = append(mine, float64(got.Sub(sent))/float64(time.Millisecond))
					}
					if err := q.Ack(ctx, r); err != nil {
						fail(fmt.Errorf("ack: %w", err))
						return
					}
					if acked.Add(1) == int64(n) {
						mu.Lock()
						end = time.Now()
						mu.Unlock()
						stop()
					}
				}
			}
		})
	}
	var next atomic.Int64
	for range opts.Producers {
		wg.Go(func() {
			var payload [8]byte
			for {
				i := int(next.Add(1)) - 1
				if i >= n || work.Err() != nil {
					return
				}
				binary.BigEndian.PutUint64(payload[:], uint64(time.Now().UnixNano()))
				if _, err := q.Enqueue(work, runqueue.EnqueueParams{Env: benchEnv, Queue: benchQueue,
					Key: keyName(i % opts.ThroughputKeys), ID: "t" + strconv.Itoa(i), Payload: payload[:]}); err != nil {
					if work.Err() == nil {
						fail(fmt.Errorf("enqueue: %w", err))
					}
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return row, firstErr
	}
	if got := acked.Load(); got != int64(n) {
		if err := ctx.Err(); err != nil {
			return row, fmt.Errorf("%d of %d runs acked: %w", got, n, err)
		}
		return row, errors.New("workers stopped early")
	}
	d := end.Sub(start)
	row = ThroughputRow{Flag: flagName(on), Producers: opts.Producers, Workers: opts.Workers, Runs: n,
		Keys: opts.ThroughputKeys, Batch: opts.Batch, DurationSec: d.Seconds(), RunsPerSec: float64(n) / d.Seconds()}
	row.LatencyP50Ms, row.LatencyP99Ms = percentile(lat, 50), percentile(lat, 99)
	if len(lat) > 0 {
		row.LatencyMaxMs = lat[len(lat)-1] // percentile sorted lat
	}
	return row, nil
}
