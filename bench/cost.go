package main

import (
	"context"
	"fmt"
	"math"
	"net"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// The cost figures come from INFO commandstats deltas. A script's usec
// already includes the redis.calls it makes, and those calls are also
// counted on their own commands' lines, so:
//
//   - Redis CPU of a phase = script usec + usec of the commands Go sent
//     itself (none for the operations measured now: each is one script
//     call; a dequeue once pipelined candidate reads before its script);
//   - commands of a phase = every non-script command line, which counts the
//     redis.calls inside the scripts and Go's own reads.
//
// Go's own reads cannot be told apart from the scripts' redis.calls by
// name, so a hook on the measuring client reads the statistics just before
// and after each non-script command or pipeline it sends: their delta is
// exactly those commands. The cost phases run one goroutine at a time, so
// nothing else runs on the server in between.
//
// Beside these, each phase reads the Redis process CPU (INFO cpu, see
// cpu.go) before and after: the time inside the commands plus the network
// work around them, which is what a user pays for and what other queues
// publish. The lifecycle row sums enqueue, dequeue (batch 10) and ack.

// meter measures the commands a client sends outside scripts.
type meter struct {
	stats *redis.Client // a client without the hook, for INFO
	on    atomic.Bool

	mu    sync.Mutex
	reads redistest.CmdStat
	err   error
}

var _ redis.Hook = (*meter)(nil)

func (m *meter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (m *meter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !m.on.Load() || scriptCmd(cmd.Name()) {
			return next(ctx, cmd)
		}
		return m.around(ctx, func() error { return next(ctx, cmd) })
	}
}

func (m *meter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !m.on.Load() {
			return next(ctx, cmds)
		}
		for _, c := range cmds {
			if scriptCmd(c.Name()) {
				return next(ctx, cmds)
			}
		}
		return m.around(ctx, func() error { return next(ctx, cmds) })
	}
}

func (m *meter) around(ctx context.Context, send func() error) error {
	before, err := redistest.CommandStats(ctx, m.stats)
	if err != nil {
		m.fail(err)
		return send()
	}
	sendErr := send()
	after, err := redistest.CommandStats(ctx, m.stats)
	if err != nil {
		m.fail(err)
		return sendErr
	}
	d := after.Sub(before).Commands()
	m.mu.Lock()
	m.reads.Calls += d.Calls
	m.reads.Usec += d.Usec
	m.mu.Unlock()
	return sendErr
}

func (m *meter) fail(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err == nil {
		m.err = err
	}
}

func scriptCmd(name string) bool {
	switch name {
	case "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro", "script", "function":
		return true
	}
	return false
}

// sample is what one measured phase cost.
type sample struct {
	scripts redistest.CmdStat // script calls (EVALSHA, FCALL) and their usec (inner calls included)
	cmds    redistest.CmdStat // every non-script command: inner calls and Go's reads
	reads   redistest.CmdStat // Go's own non-script commands
	cpu     float64           // Redis process CPU, µs (INFO cpu: used_cpu_sys + used_cpu_user)
	instr   float64           // instructions Redis executed (-callgrind), else 0
}

// usec is the Redis CPU of the phase: scripts and Go's own commands.
func (s sample) usec() float64 { return float64(s.scripts.Usec + s.reads.Usec) }

// measured is a client whose non-script commands are metered.
type measured struct {
	*redis.Client
	m  *meter
	cg *callgrind // the server runs under callgrind: count its instructions
}

func newMeasured(c *redis.Client, cg *callgrind) *measured {
	mc := redis.NewClient(c.Options())
	m := &meter{stats: c}
	mc.AddHook(m)
	return &measured{Client: mc, m: m, cg: cg}
}

// measure runs fn and returns the command statistics and the Redis process
// CPU it caused.
func (mc *measured) measure(ctx context.Context, fn func() error) (sample, error) {
	cpu, err := startCPU(ctx, mc.m.stats)
	if err != nil {
		return sample{}, err
	}
	before, err := redistest.CommandStats(ctx, mc.m.stats)
	if err != nil {
		return sample{}, err
	}
	mc.m.mu.Lock()
	mc.m.reads, mc.m.err = redistest.CmdStat{}, nil
	mc.m.mu.Unlock()
	var instr float64
	if mc.cg != nil {
		// The meter's INFO calls would be counted with the phase: it
		// stays off, and Go's own reads count with the scripts.
		instr, err = mc.cg.count(ctx, fn)
	} else {
		mc.m.on.Store(true)
		err = fn()
		mc.m.on.Store(false)
	}
	if err != nil {
		return sample{}, err
	}
	cpuUsec, err := cpu.stop(ctx)
	if err != nil {
		return sample{}, err
	}
	after, err := redistest.CommandStats(ctx, mc.m.stats)
	if err != nil {
		return sample{}, err
	}
	mc.m.mu.Lock()
	defer mc.m.mu.Unlock()
	if mc.m.err != nil {
		return sample{}, mc.m.err
	}
	d := after.Sub(before)
	// The process CPU window holds the bench's own INFO calls: the first
	// commandstats snapshot, the meter's (around Go's reads) and the
	// closing INFO cpu. Their time inside Redis is on the "info" line of
	// the delta; take it out, so that only the operations' CPU remains.
	cpuUsec = max(0, cpuUsec-float64(d["info"].Usec))
	return sample{scripts: d.Scripts(), cmds: d.Commands(), reads: mc.m.reads, cpu: cpuUsec, instr: instr}, nil
}

// CostRow is the cost of one operation on one flag state. Per-run figures
// are absent where no run moved (the fully gated dequeue).
type CostRow struct {
	Op   string `json:"op"`
	Flag string `json:"flag"`
	// Calls is the API calls measured, Runs the runs they moved.
	Calls int `json:"calls"`
	Runs  int `json:"runs"`
	// RedisUsPerCall is Redis CPU per script call: script usec / script
	// calls (the redis.calls inside included).
	RedisUsPerCall float64 `json:"redis_us_per_call"`
	// RedisUsPerOp and RedisUsPerRun are Redis CPU of the scripts and of
	// Go's own reads, per API call and per run.
	RedisUsPerOp  float64  `json:"redis_us_per_op"`
	RedisUsPerRun *float64 `json:"redis_us_per_run,omitempty"`
	// RedisCPUUsPerOp and RedisCPUUsPerRun are the Redis process CPU
	// (INFO cpu: used_cpu_sys + used_cpu_user) of the phase, per API call
	// and per run: the commands' time plus the network work around them
	// (reading requests, writing replies, the event loop).
	RedisCPUUsPerOp  float64  `json:"redis_cpu_us_per_op"`
	RedisCPUUsPerRun *float64 `json:"redis_cpu_us_per_run,omitempty"`
	// CallsPerRun counts Redis commands per run: the redis.calls inside the
	// scripts plus Go's own reads; InnerCallsPerRun the first only.
	CallsPerOp       float64  `json:"calls_per_op"`
	CallsPerRun      *float64 `json:"calls_per_run,omitempty"`
	InnerCallsPerRun *float64 `json:"inner_calls_per_run,omitempty"`
	ReadCallsPerOp   float64  `json:"read_calls_per_op"`
	ScriptCallsPerOp float64  `json:"script_calls_per_op"`
	// InstrPerOp and InstrPerRun are the instructions Redis executed per
	// API call and per run, counted under callgrind (-callgrind only).
	InstrPerOp  *float64 `json:"redis_instructions_per_op,omitempty"`
	InstrPerRun *float64 `json:"redis_instructions_per_run,omitempty"`
	// Repeats is how many times the measurement ran; the row is the one
	// with the least RedisUsPerOp, and Spread is (max - min) / min of
	// RedisUsPerOp over the repeats: the noise of the machine.
	Repeats int     `json:"repeats"`
	Spread  float64 `json:"spread"`
}

// costTotals are the totals of a measured phase.
type costTotals struct {
	scriptCalls, scriptUsec float64 // script calls and their usec (inner calls included)
	cmds                    float64 // non-script commands: inner calls and Go's reads
	reads, readUsec         float64 // Go's own non-script commands
	cpuUsec                 float64 // Redis process CPU
	instr                   float64 // instructions Redis executed (-callgrind), else 0
}

func (s sample) totals() costTotals {
	return costTotals{scriptCalls: float64(s.scripts.Calls), scriptUsec: float64(s.scripts.Usec), cmds: float64(s.cmds.Calls),
		reads: float64(s.reads.Calls), readUsec: float64(s.reads.Usec), cpuUsec: s.cpu, instr: s.instr}
}

func newCostRow(op string, on bool, s sample, calls, runs int) CostRow {
	return costRowOf(op, flagName(on), s.totals(), calls, runs)
}

func costRowOf(op, flag string, t costTotals, calls, runs int) CostRow {
	r := CostRow{Op: op, Flag: flag, Calls: calls, Runs: runs}
	usec := t.scriptUsec + t.readUsec
	if t.scriptCalls > 0 {
		r.RedisUsPerCall = t.scriptUsec / t.scriptCalls
	}
	if calls > 0 {
		r.RedisUsPerOp = usec / float64(calls)
		r.RedisCPUUsPerOp = t.cpuUsec / float64(calls)
		r.CallsPerOp = t.cmds / float64(calls)
		r.ReadCallsPerOp = t.reads / float64(calls)
		r.ScriptCallsPerOp = t.scriptCalls / float64(calls)
		if t.instr > 0 {
			x := t.instr / float64(calls)
			r.InstrPerOp = &x
		}
	}
	if runs > 0 {
		perRun := func(v float64) *float64 { x := v / float64(runs); return &x }
		r.RedisUsPerRun = perRun(usec)
		r.RedisCPUUsPerRun = perRun(t.cpuUsec)
		r.CallsPerRun = perRun(t.cmds)
		r.InnerCallsPerRun = perRun(t.cmds - t.reads)
		if t.instr > 0 {
			r.InstrPerRun = perRun(t.instr)
		}
	}
	return r
}

// lifecycleOps are the operations of one run's life in the lifecycle row:
// enqueue, dequeue at batch 10, ack.
var lifecycleOps = []string{"enqueue", "dequeue_batch10", "ack"}

// lifecycleLimitUs is the lifecycle target: Redis CPU per run, flag on.
const lifecycleLimitUs = 30.0

// lifecycleRow sums the enqueue, dequeue batch 10 and ack rows of flag into
// the cost of one run's whole life, per run of the dequeue row. Each part
// counts as it was measured (its fastest repetition); Spread is the
// largest of the parts'. ok is false when a part is missing.
func lifecycleRow(rows []CostRow, flag string) (row CostRow, ok bool) {
	var parts []CostRow
	for _, op := range lifecycleOps {
		i := slices.IndexFunc(rows, func(r CostRow) bool { return r.Op == op && r.Flag == flag })
		if i < 0 || rows[i].Runs == 0 {
			return row, false
		}
		parts = append(parts, rows[i])
	}
	n := parts[1].Runs
	var t costTotals
	calls, repeats, spread := 0.0, parts[0].Repeats, 0.0
	counted := true // every part has an instruction count
	for _, p := range parts {
		k := float64(p.Calls) * float64(n) / float64(p.Runs) // the part's API calls for n runs
		calls += k
		scriptUsec := p.RedisUsPerCall * p.ScriptCallsPerOp * k
		t.scriptCalls += p.ScriptCallsPerOp * k
		t.scriptUsec += scriptUsec
		t.cmds += p.CallsPerOp * k
		t.reads += p.ReadCallsPerOp * k
		t.readUsec += max(0, p.RedisUsPerOp*k-scriptUsec)
		t.cpuUsec += p.RedisCPUUsPerOp * k
		if p.InstrPerOp != nil {
			t.instr += *p.InstrPerOp * k
		} else {
			counted = false
		}
		repeats, spread = min(repeats, p.Repeats), max(spread, p.Spread)
	}
	if !counted {
		t.instr = 0
	}
	row = costRowOf("lifecycle", flag, t, int(math.Round(calls)), n)
	row.Repeats, row.Spread = repeats, spread
	return row, true
}

// TargetRow is one cost target of docs/design.md section 9: flag on against
// flag off in the same run, or flag on against an absolute limit (the
// lifecycle). It informs; it never fails the run.
type TargetRow struct {
	Target string  `json:"target"`
	Op     string  `json:"op"`
	Metric string  `json:"metric"`
	Off    float64 `json:"off"`
	On     float64 `json:"on"`
	// Ratio is on/off for a ratio target; Diff is on-off for an additive
	// one; an absolute target (on against Limit) has neither.
	Ratio *float64 `json:"ratio,omitempty"`
	Diff  *float64 `json:"diff,omitempty"`
	Limit string   `json:"limit"`
	Met   bool     `json:"met"`
}

// fixedClock tells one time: the cost phases need no clock, only times
// that do not move while they run.
type fixedClock struct{ t time.Time }

// costNow is a cost phase's fixed time: an hour ahead of the real time, so
// that the shard's token counter, which a dequeue moves up to the later of
// the call's time and the server's clock (lib/dequeue.lua), moves at the
// phase's first dequeue and not again. Natively it would move once per
// 10.24 ms, a few times in a phase; under callgrind, which slows Redis
// some 50 times against the server's clock, on every call, and the
// instruction counts would depend on the machine's speed.
func costNow() time.Time { return time.Now().Add(time.Hour) }

func (c fixedClock) Now() time.Time { return c.t }

const (
	benchEnv   = "bench"
	benchQueue = "q"
)

func keyName(i int) string { return "k" + strconv.Itoa(i) }

// newQueue is a Queue under prefix p with the flag on or off.
func newQueue(ctx context.Context, c redis.UniversalClient, p string, on bool, clock runqueue.Clock, mutate func(*runqueue.Config)) (*runqueue.Queue, error) {
	cfg := &runqueue.Config{Prefix: p, VtimeScheduling: on, Clock: clock}
	if mutate != nil {
		mutate(cfg)
	}
	return runqueue.New(ctx, c, cfg)
}

// scratchQueue opens a queue under a fresh prefix of ks. done closes it and
// removes the prefix's keys, keeping the first error in *err.
func scratchQueue(ctx context.Context, ks *keyspace, c redis.UniversalClient, on bool, clock runqueue.Clock,
	mutate func(*runqueue.Config)) (q *runqueue.Queue, done func(err *error), err error) {
	p := ks.prefix()
	cleanup := func(err *error) {
		if cerr := ks.cleanup(context.WithoutCancel(ctx), p); cerr != nil && *err == nil {
			*err = cerr
		}
	}
	if q, err = newQueue(ctx, c, p, on, clock, mutate); err != nil {
		cleanup(&err)
		return nil, nil, err
	}
	return q, func(err *error) {
		_ = q.Close()
		cleanup(err)
	}, nil
}

// fill enqueues runs from..to-1 with workers goroutines: run i gets key
// keyOf(i), available at at(i) and id id+i.
func fill(ctx context.Context, q *runqueue.Queue, workers, from, to int, id string, keyOf func(int) string, at func(int) time.Time) error {
	return fillPayload(ctx, q, workers, from, to, id, keyOf, at, []byte("0123456789abcdef"))
}

// fillPayload is fill with the runs' payload.
func fillPayload(ctx context.Context, q *runqueue.Queue, workers, from, to int, id string, keyOf func(int) string, at func(int) time.Time,
	payload []byte) error {
	var next atomic.Int64
	next.Store(int64(from))
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range max(1, min(workers, to-from)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= to {
					return
				}
				_, err := q.Enqueue(ctx, runqueue.EnqueueParams{Env: benchEnv, Queue: benchQueue, Key: keyOf(i),
					ID: id + strconv.Itoa(i), AvailableAt: at(i), Payload: payload})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// runCost measures enqueue (of a queue's keys and of new keys), dequeue
// (batch 1, 10, 100), ack, nack and a fully gated dequeue, each on both
// flag states, and derives the targets.
func runCost(ctx context.Context, c *redis.Client, ks *keyspace, opts Options, rep *Report, prog *progress, cg *callgrind) error {
	mc := newMeasured(c, cg)
	defer func() { _ = mc.Close() }()
	all := map[string][]CostRow{} // op|flag -> one row per repetition
	add := func(rows ...CostRow) {
		for _, r := range rows {
			all[r.Op+"|"+r.Flag] = append(all[r.Op+"|"+r.Flag], r)
		}
	}
	step, steps := 0, opts.CostRepeats*2*5
	for i := range opts.CostRepeats {
		// Alternate which flag goes first, so that a drift of the machine
		// does not favour one.
		flags := []bool{i%2 == 1, i%2 == 0}
		for _, batch := range []int{1, 10, 100} {
			for _, on := range flags {
				step++
				prog.printf("cost %d/%d: dequeue batch %d, flag %s", step, steps, batch, flagName(on))
				rows, err := costBatch(ctx, mc, ks, opts, on, batch)
				if err != nil {
					return fmt.Errorf("cost of dequeue batch %d, flag %s: %w", batch, flagName(on), err)
				}
				add(rows...)
			}
		}
		// The phases of one row each.
		for _, ph := range []struct {
			name    string
			measure func(context.Context, *measured, *keyspace, Options, bool) (CostRow, error)
		}{{"enqueue of new keys", costNewKeys}, {"fully gated dequeue", costGated}} {
			for _, on := range flags {
				step++
				prog.printf("cost %d/%d: %s, flag %s", step, steps, ph.name, flagName(on))
				row, err := ph.measure(ctx, mc, ks, opts, on)
				if err != nil {
					return fmt.Errorf("cost of %s, flag %s: %w", ph.name, flagName(on), err)
				}
				add(row)
			}
		}
	}
	for _, rows := range all {
		rep.Cost = append(rep.Cost, fastestRow(rows))
	}
	for _, flag := range []string{"off", "on"} {
		if row, ok := lifecycleRow(rep.Cost, flag); ok {
			rep.Cost = append(rep.Cost, row)
		}
	}
	sortCost(rep.Cost)
	rep.Targets = targets(rep.Cost)
	worst := 0.0
	for _, r := range rep.Cost {
		worst = max(worst, r.Spread)
	}
	if worst > 0.25 && opts.CostRepeats > 1 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("repeats of one cost measurement differ by up to %.0f%%: the machine is busy "+
			"and the Redis CPU figures are noisy (command counts and memory are exact); run again on a quiet machine", 100*worst))
	}
	return nil
}

// fastestRow returns the repetition with the least Redis CPU per call,
// whole (its figures belong together), with the spread of the repetitions.
// commandstats time is elapsed time inside Redis: other processes on the
// machine can only add to it, so the fastest repetition is the closest to
// what the operation costs.
func fastestRow(rows []CostRow) CostRow {
	sort.Slice(rows, func(i, j int) bool { return rows[i].RedisUsPerOp < rows[j].RedisUsPerOp })
	m := rows[0]
	m.Repeats = len(rows)
	if m.RedisUsPerOp > 0 {
		m.Spread = (rows[len(rows)-1].RedisUsPerOp - m.RedisUsPerOp) / m.RedisUsPerOp
	}
	return m
}

var costOrder = []string{"enqueue", "enqueue_new_key", "dequeue_batch1", "dequeue_batch10", "dequeue_batch100", "dequeue_gated", "ack", "nack", "lifecycle"}

func sortCost(rows []CostRow) {
	rank := func(r CostRow) int {
		i := slices.Index(costOrder, r.Op)
		if i < 0 {
			i = len(costOrder)
		}
		if r.Flag == "on" {
			return 2*i + 1
		}
		return 2 * i
	}
	sort.SliceStable(rows, func(i, j int) bool { return rank(rows[i]) < rank(rows[j]) })
}

// costBatch fills a fresh queue with CostRuns runs over CostKeys keys
// (measured: the enqueue row, from the batch-1 phase), dequeues them all in
// calls of batch (measured), then acks them (batch 1) or nacks them
// (batch 10), measured.
func costBatch(ctx context.Context, mc *measured, ks *keyspace, opts Options, on bool, batch int) (rows []CostRow, err error) {
	now := costNow()
	q, done, err := scratchQueue(ctx, ks, mc, on, fixedClock{now}, nil)
	if err != nil {
		return nil, err
	}
	defer done(&err)
	n := opts.CostRuns
	keyOf := func(i int) string { return keyName(i % opts.CostKeys) }
	at := func(i int) time.Time { return now.Add(-time.Duration(n-i) * time.Millisecond) }
	// One goroutine: the enqueue cost of a queue filled in order.
	s, err := mc.measure(ctx, func() error { return fill(ctx, q, 1, 0, n, "r", keyOf, at) })
	if err != nil {
		return nil, err
	}
	if batch == 1 {
		rows = append(rows, newCostRow("enqueue", on, s, n, n))
	}
	var held []*runqueue.Run
	calls := 0
	s, err = mc.measure(ctx, func() error {
		for len(held) < n {
			runs, err := q.Dequeue(ctx, benchEnv, benchQueue, batch)
			if err != nil {
				return err
			}
			if len(runs) == 0 {
				return fmt.Errorf("dequeue served nothing with %d of %d runs served", len(held), n)
			}
			calls++
			held = append(held, runs...)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	rows = append(rows, newCostRow(fmt.Sprintf("dequeue_batch%d", batch), on, s, calls, len(held)))
	switch batch {
	case 1:
		s, err = mc.measure(ctx, func() error {
			for _, r := range held {
				if err := q.Ack(ctx, r); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		rows = append(rows, newCostRow("ack", on, s, len(held), len(held)))
	case 10:
		retry := now.Add(time.Hour)
		s, err = mc.measure(ctx, func() error {
			for _, r := range held {
				if _, err := q.Nack(ctx, r, &runqueue.NackOptions{RetryAt: retry}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		rows = append(rows, newCostRow("nack", on, s, len(held), len(held)))
	}
	return rows, nil
}

// costNewKeys measures CostRuns enqueues into a fresh queue, each of a key
// that has no run yet: the first run of a key, which flag on registers
// with the scheduler. A key that drains and comes back pays it again (the
// key sweep reports it apart: SweepRow.EnqueueNewKeyUsPerRun).
func costNewKeys(ctx context.Context, mc *measured, ks *keyspace, opts Options, on bool) (row CostRow, err error) {
	now := costNow()
	q, done, err := scratchQueue(ctx, ks, mc, on, fixedClock{now}, nil)
	if err != nil {
		return row, err
	}
	defer done(&err)
	n := opts.CostRuns
	s, err := mc.measure(ctx, func() error {
		return fill(ctx, q, 1, 0, n, "n", keyName, func(i int) time.Time { return now.Add(-time.Duration(n-i) * time.Millisecond) })
	})
	if err != nil {
		return row, err
	}
	return newCostRow("enqueue_new_key", on, s, n, n), nil
}

// costGated holds GatedKeys keys at their KeyConcurrency limit of 1, each
// with a queued run behind, and measures dequeue calls that serve nothing.
func costGated(ctx context.Context, mc *measured, ks *keyspace, opts Options, on bool) (row CostRow, err error) {
	now := costNow()
	q, done, err := scratchQueue(ctx, ks, mc, on, fixedClock{now}, func(c *runqueue.Config) { c.KeyConcurrency = 1 })
	if err != nil {
		return row, err
	}
	defer done(&err)
	k := opts.GatedKeys
	if err := fill(ctx, q, 8, 0, 2*k, "g", func(i int) string { return keyName(i % k) },
		func(i int) time.Time { return now.Add(-time.Duration(2*k-i) * time.Millisecond) }); err != nil {
		return row, err
	}
	held, err := q.Dequeue(ctx, benchEnv, benchQueue, 1000)
	if err != nil {
		return row, err
	}
	if len(held) != k {
		return row, fmt.Errorf("holding the keys at their limit: served %d runs, want %d", len(held), k)
	}
	s, err := mc.measure(ctx, func() error {
		for range opts.GatedCalls {
			runs, err := q.Dequeue(ctx, benchEnv, benchQueue, 10)
			if err != nil {
				return err
			}
			if len(runs) > 0 {
				return fmt.Errorf("a gated dequeue served %d runs", len(runs))
			}
		}
		return nil
	})
	if err != nil {
		return row, err
	}
	return newCostRow("dequeue_gated", on, s, opts.GatedCalls, 0), nil
}

// targets compares flag on with flag off, and the lifecycle of flag on with
// its limit, against docs/design.md section 9.
func targets(rows []CostRow) []TargetRow {
	find := func(op, flag string) *CostRow {
		for i := range rows {
			if rows[i].Op == op && rows[i].Flag == flag {
				return &rows[i]
			}
		}
		return nil
	}
	var out []TargetRow
	// absolute compares flag on with limit; flag off is shown beside it.
	absolute := func(target, op, metric string, get func(*CostRow) *float64, limit float64) {
		off, on := find(op, "off"), find(op, "on")
		if on == nil || get(on) == nil {
			return
		}
		r := TargetRow{Target: target, Op: op, Metric: metric, On: *get(on),
			Limit: fmt.Sprintf("<= %s µs (flag on)", num(limit)), Met: *get(on) <= limit}
		if off != nil && get(off) != nil {
			r.Off = *get(off)
		}
		out = append(out, r)
	}
	ratio := func(target, op, metric string, get func(*CostRow) *float64, limit float64) {
		off, on := find(op, "off"), find(op, "on")
		if off == nil || on == nil || get(off) == nil || get(on) == nil || *get(off) <= 0 {
			return
		}
		r := *get(on) / *get(off)
		out = append(out, TargetRow{Target: target, Op: op, Metric: metric, Off: *get(off), On: *get(on),
			Ratio: &r, Limit: fmt.Sprintf("<= %.2fx", limit), Met: r <= limit})
	}
	diff := func(target, op, metric string, get func(*CostRow) *float64, limit float64) {
		off, on := find(op, "off"), find(op, "on")
		if off == nil || on == nil || get(off) == nil || get(on) == nil {
			return
		}
		d := *get(on) - *get(off)
		out = append(out, TargetRow{Target: target, Op: op, Metric: metric, Off: *get(off), On: *get(on),
			Diff: &d, Limit: fmt.Sprintf("<= off + %.1f", limit), Met: d <= limit})
	}
	perRun := func(r *CostRow) *float64 { return r.RedisUsPerRun }
	perOp := func(r *CostRow) *float64 { return &r.RedisUsPerOp }
	callsPerRun := func(r *CostRow) *float64 { return r.CallsPerRun }
	cpuPerRun := func(r *CostRow) *float64 { return r.RedisCPUUsPerRun }
	// The ratio targets, by a per-run and a per-call metric; "what" names
	// the metric in the target's words.
	ratios := func(what, runMetric, opMetric string, runGet, opGet func(*CostRow) *float64) {
		ratio("enqueue "+what, "enqueue", runMetric, runGet, 1.10)
		for _, b := range []int{1, 10, 100} {
			op := fmt.Sprintf("dequeue_batch%d", b)
			ratio(fmt.Sprintf("servable dequeue (batch %d) %s per run", b, what), op, runMetric, runGet, 1.10)
		}
		ratio("ack "+what, "ack", runMetric, runGet, 1.10)
		ratio("nack "+what, "nack", runMetric, runGet, 1.10)
		ratio("fully gated dequeue "+what+" per call", "dequeue_gated", opMetric, opGet, 1.5)
		// Batch 1 stays cheap: a batch-1 dequeue costs at most twice the
		// per-run cost at batch 10 (each flag on its own).
		for _, flag := range []string{"off", "on"} {
			b1, b10 := find("dequeue_batch1", flag), find("dequeue_batch10", flag)
			if b1 == nil || b10 == nil || runGet(b1) == nil || runGet(b10) == nil || *runGet(b10) <= 0 {
				continue
			}
			r := *runGet(b1) / *runGet(b10)
			// The OFF and ON columns hold batch 10 and batch 1 here.
			out = append(out, TargetRow{Target: "flag " + flag + ": batch-1 dequeue " + what + " per run (ON column) vs batch 10 (OFF column)",
				Op: "dequeue_batch1/" + flag, Metric: runMetric, Off: *runGet(b10), On: *runGet(b1),
				Ratio: &r, Limit: "<= 2.00x batch 10", Met: r <= 2})
		}
	}
	absolute("run lifecycle (enqueue + dequeue batch 10 + ack) Redis process CPU per run", "lifecycle", "redis_cpu_us_per_run", cpuPerRun, lifecycleLimitUs)
	absolute("run lifecycle (enqueue + dequeue batch 10 + ack) Redis µs per run in commands", "lifecycle", "redis_us_per_run", perRun, lifecycleLimitUs)
	ratios("Redis CPU", "redis_us_per_run", "redis_us_per_op", perRun, perOp)
	for _, b := range []int{1, 10, 100} {
		op := fmt.Sprintf("dequeue_batch%d", b)
		diff(fmt.Sprintf("Redis commands per dequeued run (batch %d)", b), op, "calls_per_run", callsPerRun, 1.5)
	}
	// Counted under callgrind: the same ratios by instructions, which the
	// machine's load does not move.
	ratios("Redis instructions", "redis_instructions_per_run", "redis_instructions_per_op",
		func(r *CostRow) *float64 { return r.InstrPerRun }, func(r *CostRow) *float64 { return r.InstrPerOp })
	return out
}
