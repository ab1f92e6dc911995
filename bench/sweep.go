package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// MemoryRow is the memory a queue's scheduling indexes take per registered
// key, with one ready run per key, from MEMORY USAGE (SAMPLES 0: exact).
type MemoryRow struct {
	Keys int    `json:"keys"`
	Flag string `json:"flag"`
	// BytesPerKey is ckIndex + ckVtime + ckVtimeState bytes over keys:
	// what the key index costs (flag off: ckIndex alone).
	BytesPerKey      float64 `json:"bytes_per_key"`
	IndexBytesPerKey float64 `json:"index_bytes_per_key"`
	VtimeBytesPerKey float64 `json:"vtime_bytes_per_key"`
	StateBytesPerKey float64 `json:"state_bytes_per_key"`
	// AllBytesPerKey is every key of the queue's prefix (variants' ZSETs,
	// run hashes, indexes) over keys: the whole footprint of a key with
	// one run.
	AllBytesPerKey float64 `json:"all_bytes_per_key"`
}

// RunMemoryRow is what a queued run adds to Redis's memory, payload aside
// (the runs carry an empty payload): its record in the queue's runs hash
// and its member in its variant's ready set, measured as the whole
// prefix's MEMORY USAGE before and after Runs more runs are queued over
// Keys keys that each hold one already.
type RunMemoryRow struct {
	Keys        int     `json:"keys"`
	Flag        string  `json:"flag"`
	Runs        int     `json:"runs"`
	BytesPerRun float64 `json:"bytes_per_run"`
}

// SweepRow is the Redis CPU of a run's lifecycle with keys active keys.
type SweepRow struct {
	Keys       int    `json:"keys"`
	Flag       string `json:"flag"`
	RunsPerKey int    `json:"runs_per_key"`
	Runs       int    `json:"runs"`  // runs dequeued and acked (measured)
	Batch      int    `json:"batch"` // maxCount of each dequeue
	// Redis CPU per run (scripts plus Go's own reads) of each step and of
	// the three together; the enqueue is of runs behind their keys' heads.
	EnqueueUsPerRun float64 `json:"enqueue_us_per_run"`
	// EnqueueNewKeyUsPerRun is the enqueue of each key's first run (flag
	// on, its registration with the scheduler): not in RedisUsPerRun; one
	// sample below 300 keys (see segments).
	EnqueueNewKeyUsPerRun float64 `json:"enqueue_new_key_us_per_run"`
	DequeueUsPerRun       float64 `json:"dequeue_us_per_run"`
	AckUsPerRun           float64 `json:"ack_us_per_run"`
	RedisUsPerRun         float64 `json:"redis_us_per_run"`
	// Commands per run of the dequeue step (redis.calls and Go's reads).
	DequeueCallsPerRun float64 `json:"dequeue_calls_per_run"`
	// DrainUsPerRun is the dequeue of runs that are each their key's last
	// (every serve drains its key), on a queue of the point's key count
	// with one run per key: not in RedisUsPerRun (see sweepDrain).
	DrainUsPerRun float64 `json:"drain_us_per_run"`
}

const sweepBatch = 10

// runSweep fills one queue per key count and flag state and measures its
// index memory (memory section) and the Redis CPU of enqueue, dequeue and
// ack per run (sweep section).
func runSweep(ctx context.Context, c *redis.Client, ks *keyspace, opts Options, rep *Report, prog *progress) error {
	mem, sweep := map[int]bool{}, map[int]bool{}
	var points []int
	if opts.want(secMemory) {
		for _, n := range opts.MemoryKeys {
			mem[n] = true
			points = append(points, n)
		}
	}
	if opts.want(secSweep) {
		for _, n := range opts.SweepKeys {
			sweep[n] = true
			points = append(points, n)
		}
	}
	slices.Sort(points)
	points = slices.Compact(points)
	mc := newMeasured(c, nil)
	defer func() { _ = mc.Close() }()
	for i, n := range points {
		for _, on := range []bool{false, true} {
			prog.printf("memory and key sweep %d/%d: %d keys, flag %s", 2*i+1+boolInt(on), 2*len(points), n, flagName(on))
			m, s, err := sweepPoint(ctx, mc, ks, opts, n, on, mem[n], sweep[n])
			if err != nil {
				return fmt.Errorf("%d keys, flag %s: %w", n, flagName(on), err)
			}
			if m != nil {
				rep.Memory = append(rep.Memory, *m)
			}
			if s != nil {
				rep.Sweep = append(rep.Sweep, *s)
			}
		}
	}
	if opts.want(secMemory) && opts.MemoryRuns > 0 {
		for _, n := range opts.RunMemoryKeys {
			for _, on := range []bool{false, true} {
				prog.printf("memory of queued runs: %d runs over %d keys, flag %s", opts.MemoryRuns, n, flagName(on))
				row, err := runMemory(ctx, mc, ks, n, opts.MemoryRuns, on)
				if err != nil {
					return fmt.Errorf("memory of queued runs over %d keys, flag %s: %w", n, flagName(on), err)
				}
				rep.RunMemory = append(rep.RunMemory, row)
			}
		}
	}
	if len(rep.Sweep) > 0 {
		svg, err := sweepChart(rep.Sweep)
		if err != nil {
			return fmt.Errorf("sweep chart: %w", err)
		}
		rep.charts = append(rep.charts, chartFile{name: "sweep.svg", title: "Redis CPU per run against active keys", svg: svg})
	}
	return nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// sweepRunsPerKey is how many runs each key gets at a sweep point: enough
// that the measured runs leave every key active (at least two: a served key
// keeps a run), so that no key registers or drains during the measure at
// any point. A key's first run (its registration) is measured apart
// (SweepRow.EnqueueNewKeyUsPerRun), and so is a key's drain
// (SweepRow.DrainUsPerRun).
func sweepRunsPerKey(keys, runs int) int {
	return (runs+keys-1)/keys + 1
}

func sweepPoint(ctx context.Context, mc *measured, ks *keyspace, opts Options, n int, on, wantMem, wantSweep bool) (mem *MemoryRow, row *SweepRow, err error) {
	now := costNow()
	q, done, err := scratchQueue(ctx, ks, mc, on, fixedClock{now}, nil)
	if err != nil {
		return nil, nil, err
	}
	defer done(&err)
	rpk := 1
	if wantSweep {
		rpk = sweepRunsPerKey(n, opts.SweepRuns)
	}
	// Run i is of key i mod n, available at base + i ms: the keys' runs
	// interleave in age order, as they do when runs arrive over time.
	base := now.Add(-time.Duration(rpk*n) * time.Millisecond)
	keyOf := func(i int) string { return keyName(i % n) }
	at := func(i int) time.Time { return base.Add(time.Duration(i) * time.Millisecond) }
	const workers = 16
	// Each step is measured in segments and the cheapest segment per run is
	// kept: other load on the machine only adds time.
	enqueue := func(from, to int) (float64, error) {
		us := math.Inf(1)
		for _, seg := range segments(from, to) {
			s, err := mc.measure(ctx, func() error { return fill(ctx, q, workers, seg[0], seg[1], "r", keyOf, at) })
			if err != nil {
				return 0, err
			}
			us = math.Min(us, s.usec()/float64(seg[1]-seg[0]))
		}
		return us, nil
	}
	newKeyUs, err := enqueue(0, n) // one run per key: each registers its key
	if err != nil {
		return nil, nil, err
	}
	if wantMem {
		if mem, err = memoryRow(ctx, mc.m.stats, q.Config().Prefix, q.Shards(), n, on); err != nil {
			return nil, nil, err
		}
	}
	if !wantSweep {
		return mem, nil, nil
	}
	enqUs, err := enqueue(n, rpk*n) // runs behind their keys' heads
	if err != nil {
		return nil, nil, err
	}
	held, deqUs, deqCmds, err := measureDequeues(ctx, mc, q, opts.SweepRuns)
	if err != nil {
		return nil, nil, err
	}
	ackUs := math.Inf(1)
	for _, seg := range segments(0, len(held)) {
		s, err := mc.measure(ctx, func() error {
			for _, r := range held[seg[0]:seg[1]] {
				if err := q.Ack(ctx, r); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return nil, nil, err
		}
		ackUs = math.Min(ackUs, s.usec()/float64(seg[1]-seg[0]))
	}
	drainUs, err := sweepDrain(ctx, mc, ks, opts, n, on)
	if err != nil {
		return nil, nil, err
	}
	row = &SweepRow{Keys: n, Flag: flagName(on), RunsPerKey: rpk, Runs: len(held), Batch: sweepBatch,
		EnqueueUsPerRun: enqUs, EnqueueNewKeyUsPerRun: newKeyUs, DequeueUsPerRun: deqUs, AckUsPerRun: ackUs,
		DequeueCallsPerRun: deqCmds, DrainUsPerRun: drainUs}
	row.RedisUsPerRun = row.EnqueueUsPerRun + row.DequeueUsPerRun + row.AckUsPerRun
	return mem, row, nil
}

// measureDequeues dequeues m runs of q in calls of up to sweepBatch,
// measured in segments, and returns the runs and the cheapest segment's
// Redis µs and commands per run.
func measureDequeues(ctx context.Context, mc *measured, q *runqueue.Queue, m int) (held []*runqueue.Run, us, cmds float64, err error) {
	us = math.Inf(1)
	for _, seg := range segments(0, m) {
		from := len(held)
		s, err := mc.measure(ctx, func() error {
			for len(held) < seg[1] {
				runs, err := q.Dequeue(ctx, benchEnv, benchQueue, min(sweepBatch, seg[1]-len(held)))
				if err != nil {
					return err
				}
				if len(runs) == 0 {
					return errors.New("dequeue served nothing")
				}
				held = append(held, runs...)
			}
			return nil
		})
		if err != nil {
			return nil, 0, 0, err
		}
		if x := s.usec() / float64(len(held)-from); x < us {
			us, cmds = x, float64(s.cmds.Calls)/float64(len(held)-from)
		}
	}
	return held, us, cmds, nil
}

// sweepDrain measures, on a queue of its own, the dequeue of runs that are
// each their key's only one: every serve drains its key (flag on, the
// scheduler lets the key go). n keys hold a run each, and min(n,
// SweepRuns) of them are served, so the key count is the point's.
func sweepDrain(ctx context.Context, mc *measured, ks *keyspace, opts Options, n int, on bool) (us float64, err error) {
	now := costNow()
	q, done, err := scratchQueue(ctx, ks, mc, on, fixedClock{now}, nil)
	if err != nil {
		return 0, err
	}
	defer done(&err)
	base := now.Add(-time.Duration(n) * time.Millisecond)
	if err := fill(ctx, q, 16, 0, n, "d", keyName,
		func(i int) time.Time { return base.Add(time.Duration(i) * time.Millisecond) }); err != nil {
		return 0, err
	}
	_, us, _, err = measureDequeues(ctx, mc, q, min(n, opts.SweepRuns))
	return us, err
}

// segments splits [from, to) into sweepParts equal segments when each
// holds at least minSegment runs, else returns it whole (no segment when
// empty): a minimum of a few tiny segments would be luck, not cost.
func segments(from, to int) [][2]int {
	const sweepParts, minSegment = 3, 100
	switch {
	case to <= from:
		return nil
	case to-from < sweepParts*minSegment:
		return [][2]int{{from, to}}
	}
	out := make([][2]int, sweepParts)
	for i := range out {
		out[i] = [2]int{from + i*(to-from)/sweepParts, from + (i+1)*(to-from)/sweepParts}
	}
	return out
}

// memoryRow reads MEMORY USAGE of the queue's indexes and of every key of
// prefix p.
func memoryRow(ctx context.Context, c *redis.Client, p string, shards, n int, on bool) (*MemoryRow, error) {
	space, err := keys.NewSpace(p, shards)
	if err != nil {
		return nil, err
	}
	qk := space.Env(benchEnv).Queue(benchQueue)
	usage := func(key string) (int64, error) {
		v, err := c.MemoryUsage(ctx, key, 0).Result()
		if errors.Is(err, redis.Nil) {
			return 0, nil // no such key
		}
		return v, err
	}
	// ckVtime holds the registrations and the parked tags; the state hash
	// the clock and one field per registered key.
	var b [3]int64
	for i, k := range []string{qk.CkIndex(), qk.CkVtime(), qk.CkVtimeState()} {
		if b[i], err = usage(k); err != nil {
			return nil, fmt.Errorf("MEMORY USAGE %s: %w", k, err)
		}
	}
	all, err := prefixMemory(ctx, c, p)
	if err != nil {
		return nil, err
	}
	fn := float64(n)
	return &MemoryRow{Keys: n, Flag: flagName(on),
		BytesPerKey:      float64(b[0]+b[1]+b[2]) / fn,
		IndexBytesPerKey: float64(b[0]) / fn, VtimeBytesPerKey: float64(b[1]) / fn, StateBytesPerKey: float64(b[2]) / fn,
		AllBytesPerKey: float64(all) / fn}, nil
}

// runMemory queues one run of each of n keys, then m more over the same
// keys, all with an empty payload, and returns the bytes the m runs added
// to the prefix, per run. A variant's ready set of at most 128 members is
// a listpack in Redis and a larger one a skiplist: 20,000 runs over 1,000
// keys (20 a key) and over 10 keys (2,000 a key) measure both.
func runMemory(ctx context.Context, mc *measured, ks *keyspace, n, m int, on bool) (row RunMemoryRow, err error) {
	now := costNow()
	q, done, err := scratchQueue(ctx, ks, mc, on, fixedClock{now}, nil)
	if err != nil {
		return row, err
	}
	defer done(&err)
	keyOf := func(i int) string { return keyName(i % n) }
	at := func(i int) time.Time { return now.Add(-time.Duration(n+m-i) * time.Millisecond) }
	const workers = 16
	if err := fillPayload(ctx, q, workers, 0, n, "r", keyOf, at, nil); err != nil {
		return row, err
	}
	before, err := prefixMemory(ctx, mc.m.stats, q.Config().Prefix)
	if err != nil {
		return row, err
	}
	if err := fillPayload(ctx, q, workers, n, n+m, "r", keyOf, at, nil); err != nil {
		return row, err
	}
	after, err := prefixMemory(ctx, mc.m.stats, q.Config().Prefix)
	if err != nil {
		return row, err
	}
	return RunMemoryRow{Keys: n, Flag: flagName(on), Runs: m, BytesPerRun: float64(after-before) / float64(m)}, nil
}

// prefixMemory sums MEMORY USAGE over every key of prefix p.
func prefixMemory(ctx context.Context, c *redis.Client, p string) (int64, error) {
	var total int64
	var cursor uint64
	for {
		batch, next, err := c.Scan(ctx, cursor, "{"+p+":*", 1000).Result()
		if err != nil {
			return 0, err
		}
		cmds := make([]*redis.IntCmd, len(batch))
		if _, err := c.Pipelined(ctx, func(pl redis.Pipeliner) error {
			for i, k := range batch {
				cmds[i] = pl.MemoryUsage(ctx, k, 0)
			}
			return nil
		}); err != nil && !errors.Is(err, redis.Nil) {
			return 0, err
		}
		for _, cmd := range cmds {
			total += cmd.Val() // a key deleted since SCAN counts 0
		}
		if cursor = next; cursor == 0 {
			return total, nil
		}
	}
}
