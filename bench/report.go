package main

import (
	"cmp"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// section is one titled table of the output, shared by the terminal and
// the Markdown report.
type section struct {
	title string
	t     *table
	notes []string // lines printed under the table
	chart string   // file name of the section's chart, if any
}

func backendLine(rep *Report) string {
	b := "miniredis (embedded; fairness only: no cost, memory or throughput figures)"
	switch rep.Backend {
	case "redis":
		b = "Redis " + rep.RedisVersion
	case "redis-cluster":
		b = fmt.Sprintf("Redis Cluster %s, %d masters", rep.RedisVersion, len(rep.Nodes))
	}
	procs := ""
	if rep.GoMaxProcs != 0 && rep.GoMaxProcs != rep.CPUs {
		procs = fmt.Sprintf(" (GOMAXPROCS %d)", rep.GoMaxProcs)
	}
	return fmt.Sprintf("backend %s · %s · %d CPUs%s · %.1f s", b, rep.GoVersion, rep.CPUs, procs, rep.DurationSec)
}

func sections(rep *Report) []section {
	var out []section
	if len(rep.Scenarios) > 0 {
		out = append(out, scenarioSection(rep), verdictSection(rep))
	}
	if len(rep.Cost) > 0 {
		out = append(out, costSection(rep))
	}
	if len(rep.Targets) > 0 {
		out = append(out, targetSection(rep))
	}
	if len(rep.Memory) > 0 {
		out = append(out, memorySection(rep))
	}
	if len(rep.RunMemory) > 0 {
		out = append(out, runMemorySection(rep))
	}
	if len(rep.Sweep) > 0 {
		out = append(out, sweepSection(rep))
	}
	if slices.ContainsFunc(rep.Throughput, func(r ThroughputRow) bool { return r.Phase == phaseConcurrent }) {
		out = append(out, throughputSection(rep))
	}
	if slices.ContainsFunc(rep.Throughput, func(r ThroughputRow) bool { return r.Phase == phaseProcess }) {
		out = append(out, prefilledSection(rep))
	}
	if slices.ContainsFunc(rep.Throughput, func(r ThroughputRow) bool { return r.Phase == phaseFetch }) {
		out = append(out, fetchSection(rep))
	}
	if slices.ContainsFunc(rep.Throughput, func(r ThroughputRow) bool {
		return r.Phase == phaseSingle || r.Phase == phaseSerial || r.Phase == phaseBulk
	}) {
		out = append(out, enqueueSection(rep))
	}
	if slices.ContainsFunc(rep.Throughput, func(r ThroughputRow) bool { return r.WaitLight != nil || r.WaitHeavy != nil }) {
		out = append(out, waitSection(rep))
	}
	if slices.ContainsFunc(rep.Throughput, func(r ThroughputRow) bool { return len(r.Nodes) > 0 }) {
		out = append(out, nodeSection(rep))
	}
	return out
}

func scenarioSection(rep *Report) section {
	t := &table{header: []string{"SCENARIO", "FIRST LIGHT SERVE", "ALL LIGHT SERVED", "LIGHT MEAN WAIT", "JAIN", "DRAIN STEPS", "THRESHOLDS"},
		right: []bool{false, true, true, true, true, true, false}}
	for i := 0; i+1 < len(rep.Scenarios); i += 2 {
		off, on := rep.Scenarios[i], rep.Scenarios[i+1]
		step := func(v int) string {
			if v < 0 {
				return "never"
			}
			return fmt.Sprint(v)
		}
		first, all, wait := "-", "-", "-"
		if on.light {
			first = arrow(step(off.FirstLightServeStep), step(on.FirstLightServeStep))
			all = arrow(step(off.AllLightFirstServeStep), step(on.AllLightFirstServeStep))
			wait = arrow(num(off.LightMeanWait), num(on.LightMeanWait))
		}
		verdict := fmt.Sprintf("%d/%d met", on.Met, on.Checked)
		if on.Met < on.Checked {
			verdict = fmt.Sprintf("%d/%d met, %d NOT MET", on.Met, on.Checked, on.Checked-on.Met)
		}
		t.add(on.Name, first, all, wait, arrow(fixed(off.Jain, 3), fixed(on.Jain, 3)),
			arrow(fmt.Sprint(off.DrainSteps), fmt.Sprint(on.DrainSteps)), verdict)
	}
	return section{title: "Scenarios (docs/design.md section 8): flag off → flag on, in steps (one dequeue call of up to 10 runs per step)", t: t,
		notes: []string{"light = the scenario's late or small keys; JAIN = Jain's index of per-key serves over contended steps (1 = even)"}}
}

// verdictSection lists every threshold. The two "every run exactly once"
// checks of a scenario (one per arm) show as one line.
func verdictSection(rep *Report) section {
	t := &table{header: []string{"SCENARIO", "THRESHOLD ON", "OFF", "ON", "REQUIRED (FLAG ON)", "VERDICT"},
		right: []bool{false, false, true, true, false, false}}
	met, total := 0, 0
	var failed []string
	for i := 0; i < len(rep.Verdicts); i++ {
		v := rep.Verdicts[i]
		total++
		if v.OK {
			met++
		} else {
			failed = append(failed, v.Scenario+": "+v.Metric)
		}
		if v.Threshold == "every run exactly once" && i+1 < len(rep.Verdicts) {
			w := rep.Verdicts[i+1]
			if w.Scenario == v.Scenario && w.Threshold == v.Threshold {
				i++
				total++
				if w.OK {
					met++
				} else {
					failed = append(failed, w.Scenario+": "+w.Metric)
				}
				t.add(v.Scenario, "runs served (of enqueued)", num(v.Value)+"/"+num(v.Off), num(w.Value)+"/"+num(w.Off),
					"every run exactly once", verdictWord(v.OK && w.OK))
				continue
			}
		}
		t.add(v.Scenario, v.Metric, stepOrNum(v.Off), stepOrNum(v.Value), prettyThreshold(v.Threshold), verdictWord(v.OK))
	}
	s := section{title: "Thresholds of docs/design.md section 8", t: t}
	if len(failed) == 0 {
		s.notes = []string{fmt.Sprintf("all %d thresholds met", total)}
	} else {
		s.notes = []string{fmt.Sprintf("%d of %d thresholds met; NOT MET: %s", met, total, strings.Join(failed, "; "))}
	}
	return s
}

// stepOrNum prints a verdict's value: the harness reports a serve step
// that never happened as -1.
func stepOrNum(v float64) string {
	if v == -1 {
		return "never"
	}
	return num(v)
}

var thresholdNum = regexp.MustCompile(`^(<=|>=|==) (-?[0-9.e+-]+)(.*)$`)

// prettyThreshold rounds the limit of a threshold such as "<= 111.60000000000001".
func prettyThreshold(s string) string {
	m := thresholdNum.FindStringSubmatch(s)
	if m == nil {
		return s
	}
	v, err := strconv.ParseFloat(m[2], 64)
	if err != nil {
		return s
	}
	return m[1] + " " + num(v) + m[3]
}

func costSection(rep *Report) section {
	t := &table{header: []string{"OPERATION", "FLAG", "CALLS", "RUNS", "µs/SCRIPT CALL", "µs/RUN", "CPU µs/RUN", "CMDS/RUN", "INNER/RUN", "READS/CALL", "SPREAD"},
		right: []bool{false, false, true, true, true, true, true, true, true, true, true}}
	opt := func(p *float64, d int) string {
		if p == nil {
			return "-"
		}
		return fixed(*p, d)
	}
	counted := slices.ContainsFunc(rep.Cost, func(r CostRow) bool { return r.InstrPerOp != nil })
	if counted {
		t.header = append(t.header, "INSTR/RUN", "INSTR/CALL")
		t.right = append(t.right, true, true)
	}
	var gated []string
	for _, r := range rep.Cost {
		cells := []string{strings.ReplaceAll(r.Op, "_", " "), r.Flag, fmt.Sprint(r.Calls), fmt.Sprint(r.Runs), fixed(r.RedisUsPerCall, 2),
			opt(r.RedisUsPerRun, 2), opt(r.RedisCPUUsPerRun, 2), opt(r.CallsPerRun, 2), opt(r.InnerCallsPerRun, 2), fixed(r.ReadCallsPerOp, 2), fixed(100*r.Spread, 0) + "%"}
		if counted {
			cells = append(cells, opt(r.InstrPerRun, 0), opt(r.InstrPerOp, 0))
		}
		t.add(cells...)
		if r.Op == "dequeue_gated" {
			gated = append(gated, fmt.Sprintf("%s µs flag %s", fixed(r.RedisCPUUsPerOp, 2), r.Flag))
		}
	}
	st := rep.Settings
	notes := []string{
		"µs/SCRIPT CALL = script usec / script calls (EVALSHA, or FCALL of the flag-on Functions library; the redis.calls inside included)",
		"µs/RUN = (script usec + usec of any command Go sent itself, none here) / runs moved: time inside commands (INFO commandstats)",
		"CPU µs/RUN = Redis process CPU (INFO cpu: used_cpu_sys + used_cpu_user) / runs moved: besides the commands it includes the network work a user pays for " +
			"(reading and parsing requests, writing replies, the event loop), as the figures other queues publish do; the bench's own INFO calls are taken out",
		"CMDS/RUN = Redis commands per run: redis.calls inside the scripts (INNER/RUN) plus Go's own commands (READS/CALL per call; none here: each operation is one script call)",
		"SPREAD = (max - min) / min of Redis µs per call over the repeats (the fastest is kept, whole: other load only adds time); ack runs the same script on both flags, so its off/on gap is noise",
		fmt.Sprintf("enqueue new key: %d enqueues into a fresh queue, each the first run of its key (flag on registers the key with the scheduler): "+
			"a key that drains and comes back pays it again (the key sweep reports it apart, as NEW KEY µs)", st.CostRuns),
		fmt.Sprintf("dequeue gated: %d keys each at its KeyConcurrency limit of 1 with a run queued behind; %d calls of maxCount 10 serving nothing (no runs: per-call figures only)", st.GatedKeys, st.GatedCalls),
	}
	if len(gated) > 0 {
		notes[len(notes)-1] += "; process CPU per call " + strings.Join(gated, ", ")
	}
	notes = append(notes, "lifecycle = enqueue + dequeue batch 10 + ack per run (the sum of those rows; CALLS counts their calls for RUNS runs)")
	if counted {
		notes = append(notes, "INSTR/RUN, INSTR/CALL = instructions Redis executed (valgrind's callgrind, Ir) per run and per API call: "+
			"network work included, the same from run to run whatever the machine's load")
	}
	return section{title: fmt.Sprintf("Cost per operation (Redis CPU from INFO commandstats and INFO cpu; %d runs over %d keys per measurement, fastest of %d)", st.CostRuns, st.CostKeys, st.CostRepeats), t: t,
		notes: notes}
}

func targetSection(rep *Report) section {
	t := &table{header: []string{"TARGET (docs/design.md section 9)", "OFF", "ON", "ON vs OFF", "LIMIT", "VERDICT"},
		right: []bool{false, true, true, true, false, false}}
	for _, r := range rep.Targets {
		cmp := "-"
		switch {
		case r.Ratio != nil:
			cmp = fixed(*r.Ratio, 2) + "x"
		case r.Diff != nil:
			cmp = fmt.Sprintf("%+.2f", *r.Diff)
		case r.Off > 0:
			cmp = fixed(r.On/r.Off, 2) + "x" // an absolute target: the ratio informs
		}
		word := "met"
		if !r.Met {
			word = "not met"
		}
		t.add(r.Target, fixed(r.Off, 2), fixed(r.On, 2), cmp, r.Limit, word)
	}
	return section{title: "Cost targets (informative: they never fail the run)", t: t,
		notes: []string{"run lifecycle: the lifecycle rows above against the absolute limit, flag on; by process CPU (network work included, " +
			"comparable with other queues' published figures) and by commandstats (time inside the scripts and commands only)"}}
}

func memorySection(rep *Report) section {
	t := &table{header: []string{"KEYS", "FLAG", "INDEX BYTES/KEY", "ckIndex", "ckVtime", "ckVtimeState", "ALL KEYS BYTES/KEY"},
		right: []bool{true, false, true, true, true, true, true}}
	for _, m := range rep.Memory {
		t.add(fmt.Sprint(m.Keys), m.Flag, fixed(m.BytesPerKey, 1), fixed(m.IndexBytesPerKey, 1), fixed(m.VtimeBytesPerKey, 1),
			fixed(m.StateBytesPerKey, 1), fixed(m.AllBytesPerKey, 1))
	}
	return section{title: "Memory per registered key (MEMORY USAGE ... SAMPLES 0; one ready run per key)", t: t,
		notes: []string{"INDEX = ckIndex + ckVtime + ckVtimeState; ALL KEYS = every key of the queue's prefix, runs included"}}
}

func runMemorySection(rep *Report) section {
	t := &table{header: []string{"KEYS", "FLAG", "RUNS", "BYTES/RUN"}, right: []bool{true, false, true, true}}
	for _, m := range rep.RunMemory {
		t.add(fmt.Sprint(m.Keys), m.Flag, fmt.Sprint(m.Runs), fixed(m.BytesPerRun, 1))
	}
	return section{title: "Memory per queued run, payload aside (MEMORY USAGE ... SAMPLES 0 of the whole prefix, before and after)", t: t,
		notes: []string{"each run: its record in the queue's runs hash and its member in its variant's ready set; the scheduler " +
			"stores nothing per run, so the two flag states should agree"}}
}

func sweepSection(rep *Report) section {
	t := &table{header: []string{"ACTIVE KEYS", "RUNS/KEY", "µs/RUN OFF", "µs/RUN ON", "ON/OFF", "ENQUEUE µs", "DEQUEUE µs", "ACK µs", "DEQUEUE CMDS/RUN", "NEW KEY µs", "DRAIN µs"},
		right: []bool{true, true, true, true, true, true, true, true, true, true, true}}
	for i := 0; i+1 < len(rep.Sweep); i += 2 {
		off, on := rep.Sweep[i], rep.Sweep[i+1]
		t.add(fmt.Sprint(off.Keys), fmt.Sprint(off.RunsPerKey), fixed(off.RedisUsPerRun, 2), fixed(on.RedisUsPerRun, 2),
			fixed(on.RedisUsPerRun/off.RedisUsPerRun, 2)+"x",
			arrow(fixed(off.EnqueueUsPerRun, 2), fixed(on.EnqueueUsPerRun, 2)),
			arrow(fixed(off.DequeueUsPerRun, 2), fixed(on.DequeueUsPerRun, 2)),
			arrow(fixed(off.AckUsPerRun, 2), fixed(on.AckUsPerRun, 2)),
			arrow(fixed(off.DequeueCallsPerRun, 2), fixed(on.DequeueCallsPerRun, 2)),
			arrow(fixed(off.EnqueueNewKeyUsPerRun, 2), fixed(on.EnqueueNewKeyUsPerRun, 2)),
			arrow(fixed(off.DrainUsPerRun, 2), fixed(on.DrainUsPerRun, 2)))
	}
	runs, batch := 0, 0
	if len(rep.Sweep) > 0 {
		runs, batch = rep.Sweep[0].Runs, rep.Sweep[0].Batch
	}
	return section{title: fmt.Sprintf("Redis CPU per run lifecycle (enqueue + dequeue + ack) against active keys; %d runs dequeued (maxCount %d) and acked per point, cheapest of 3 segments per step; columns off → on", runs, batch),
		t: t, chart: "sweep.svg",
		notes: []string{
			"every key holds at least two runs, so no key registers or drains during the measure (runs are enqueued behind their key's head and served without draining it); the runs per key still differ from point to point, and with them the encoding of each key's ready set (a skiplist from 64 runs, see \"Wide sets\" in docs/performance.md; a listpack below)",
			"NEW KEY µs: the enqueue of each key's first run (flag on, it registers the key with the scheduler), not in the lifecycle; a key that drains and comes back pays it again (see the cost section's \"enqueue new key\" row); below 300 keys it is one sample, not the cheapest of 3 (at 10 keys ten runs, mostly a script call's fixed cost)",
			"DRAIN µs: the dequeue of runs that are each their key's last (every serve drains its key; flag on, the scheduler lets the key go), on a queue of its own with one run per key, up to the measured runs; not in the lifecycle either",
		}}
}

func throughputSection(rep *Report) section {
	t := &table{header: []string{"FLAG", "PRODUCERS", "WORKERS", "RUNS", "KEYS", "BATCH", "RUNS/S", "CPU µs/RUN", "LATENCY p50 ms", "p99 ms", "max ms"},
		right: []bool{false, true, true, true, true, true, true, true, true, true, true}}
	opt := func(p *float64, d int) string {
		if p == nil {
			return "-"
		}
		return fixed(*p, d)
	}
	for _, r := range rep.Throughput {
		if r.Phase != phaseConcurrent {
			continue
		}
		t.add(r.Flag, fmt.Sprint(r.Producers), fmt.Sprint(r.Workers), fmt.Sprint(r.Runs), fmt.Sprint(r.Keys), fmt.Sprint(r.Batch),
			fixed(r.RunsPerSec, 0), fixed(r.RedisCPUUsPerRun, 2), opt(r.LatencyP50Ms, 2), opt(r.LatencyP99Ms, 2), opt(r.LatencyMaxMs, 1))
	}
	return section{title: "End-to-end throughput, producers and workers at once (wall clock; producers: one Enqueue per run; workers: runqueue.Worker, no-op handler; enqueue-to-dequeue latency)", t: t,
		notes: []string{"CPU µs/RUN = Redis process CPU (INFO cpu: used_cpu_sys + used_cpu_user) over the phase / runs: commands, network work and wake-up pub/sub, what a user pays for"}}
}

// prefilledSection pairs the enqueue and process rows of each flag.
func prefilledSection(rep *Report) section {
	t := &table{header: []string{"FLAG", "RUNS", "KEYS", "ENQUEUE RUNS/S", "ENQUEUE CPU µs/RUN", "PROCESS RUNS/S", "PROCESS CPU µs/RUN", "CPU µs/RUN IN ALL"},
		right: []bool{false, true, true, true, true, true, true, true}}
	var producers, workers, conc, batch int
	for _, flag := range []string{"off", "on"} {
		var enq, proc *ThroughputRow
		for i, r := range rep.Throughput {
			switch {
			case r.Flag != flag:
			case r.Phase == phaseEnqueue:
				enq = &rep.Throughput[i]
			case r.Phase == phaseProcess:
				proc = &rep.Throughput[i]
			}
		}
		if enq == nil || proc == nil {
			continue
		}
		producers, workers, conc, batch = enq.Producers, proc.Workers, proc.Concurrency, proc.Batch
		t.add(flag, fmt.Sprint(enq.Runs), fmt.Sprint(enq.Keys), fixed(enq.RunsPerSec, 0), fixed(enq.RedisCPUUsPerRun, 2),
			fixed(proc.RunsPerSec, 0), fixed(proc.RedisCPUUsPerRun, 2), fixed(enq.RedisCPUUsPerRun+proc.RedisCPUUsPerRun, 2))
	}
	return section{title: fmt.Sprintf("Prefilled queue (wall clock): %d producers enqueue every run with no worker running (EnqueueMany calls), "+
		"then %d runqueue.Worker of Concurrency %d processes them (AckAndDequeue of up to %d runs, no-op handler)", producers, workers, conc, batch), t: t,
		notes: []string{
			"the method other queues (BullMQ, asynq) publish: jobs added first, then processed; their per-job Redis CPU is process CPU too",
			"CPU µs/RUN = Redis process CPU (INFO cpu: used_cpu_sys + used_cpu_user) over the phase / runs: commands plus the network work a user pays for",
			"no worker is subscribed while the queue fills, so the enqueues' wake-up PUBLISH reaches nobody (in the concurrent run it reaches the workers)",
		}}
}

// fetchSection shows the fetch phase's rows, by shape, flag off before on.
func fetchSection(rep *Report) section {
	t := &table{header: []string{"FLAG", "FETCHERS", "BATCH", "RUNS", "KEYS", "RUNS/S", "CPU µs/RUN"},
		right: []bool{false, true, true, true, true, true, true}}
	var rows []ThroughputRow
	for _, r := range rep.Throughput {
		if r.Phase == phaseFetch {
			rows = append(rows, r)
		}
	}
	slices.SortStableFunc(rows, func(a, b ThroughputRow) int { return cmp.Compare(a.Fetchers, b.Fetchers) })
	for _, r := range rows {
		t.add(r.Flag, fmt.Sprint(r.Fetchers), fmt.Sprint(r.Batch), fmt.Sprint(r.Runs), fmt.Sprint(r.Keys), fixed(r.RunsPerSec, 0), fixed(r.RedisCPUUsPerRun, 2))
	}
	return section{title: "Prefilled queue, fetched with Dequeue + Ack (the method of the comparison table in docs/performance.md): " +
		"fetcher goroutines drain a full queue without runqueue.Worker (wall clock)", t: t,
		notes: []string{"runs queued first with EnqueueMany (not measured); then FETCHERS goroutines each call Dequeue(BATCH), then Ack per run " +
			"(sleeping 1 ms when none came back) until every run is acked; concurrent Dequeue and Ack calls of one Queue are coalesced; " +
			"CPU µs/RUN = Redis process CPU (INFO cpu) over the phase / runs"}}
}

// enqueueSection shows the enqueue-only phases: single Enqueue calls,
// coalesced and serial, and EnqueueMany calls of many runs.
func enqueueSection(rep *Report) section {
	t := &table{header: []string{"FLAG", "ENQUEUE", "PRODUCERS", "RUNS", "KEYS", "RUNS/S", "CPU µs/RUN"},
		right: []bool{false, false, true, true, true, true, true}}
	for _, r := range rep.Throughput {
		mode := map[string]string{phaseSingle: "Enqueue, coalesced (default)", phaseSerial: "Enqueue, serial (Config.SerialCalls)",
			phaseBulk: fmt.Sprintf("EnqueueMany of %d runs", rep.Settings.BulkBatch)}[r.Phase]
		if mode != "" {
			t.add(r.Flag, mode, fmt.Sprint(r.Producers), fmt.Sprint(r.Runs), fmt.Sprint(r.Keys), fixed(r.RunsPerSec, 0), fixed(r.RedisCPUUsPerRun, 2))
		}
	}
	return section{title: "Enqueue only (wall clock): producer goroutines each enqueue one run at a time with Enqueue, or many with EnqueueMany, no worker running", t: t,
		notes: []string{
			"coalesced: concurrent Enqueue calls of one Queue go together in EnqueueMany calls, at most two in flight; serial: one script call per Enqueue",
			"EnqueueMany of 32 runs or more (with no admission limit) writes them in bulk: one HSET of the records, one ZADD per variant's set",
			"CPU µs/RUN = Redis process CPU (INFO cpu: used_cpu_sys + used_cpu_user) over the phase / runs",
			"with Redis on the same machine, the bench's GOMAXPROCS decides how much CPU its clients take from Redis (see \"The client's GOMAXPROCS\" in docs/performance.md; the first line says when it is not the CPU count)",
		}}
}

// nodeSection breaks each throughput phase down by cluster master, under a
// line for the phase as a whole.
func nodeSection(rep *Report) section {
	t := &table{header: []string{"PHASE", "FLAG", "NODE", "ENV", "WORKERS", "RUNS", "SHARE", "RUNS/S", "CPU µs/RUN"},
		right: []bool{false, false, false, false, true, true, true, true, true}}
	for _, r := range rep.Throughput {
		if len(r.Nodes) == 0 {
			continue
		}
		// The fetch phase has fetchers where the others have workers.
		phase, workers := r.Phase, r.Workers
		if r.Phase == phaseFetch {
			phase, workers = fmt.Sprintf("%s %dx%d", r.Phase, r.Fetchers, r.Batch), r.Fetchers
		}
		t.add(phase, r.Flag, "all", "", fmt.Sprint(workers), fmt.Sprint(r.Runs), "100%", fixed(r.RunsPerSec, 0), fixed(r.RedisCPUUsPerRun, 2))
		for _, n := range r.Nodes {
			workers := n.Workers
			if r.Phase == phaseFetch {
				workers = n.Fetchers
			}
			t.add("", "", n.Addr, n.Env, fmt.Sprint(workers), fmt.Sprint(n.Runs), fixed(100*float64(n.Runs)/float64(r.Runs), 1)+"%",
				fixed(n.RunsPerSec, 0), fixed(n.RedisCPUUsPerRun, 2))
		}
	}
	var masters []string
	for _, n := range rep.Nodes {
		masters = append(masters, fmt.Sprintf("%s (%d slots)", n.Addr, n.Slots))
	}
	return section{title: "Throughput per cluster node: each master holds one env of the bench (its keys share one hash slot), " +
		"and the runs, the workers and the fetchers are dealt to the envs in turn", t: t,
		notes: []string{
			"masters: " + strings.Join(masters, ", "),
			"WORKERS = the node's runqueue.Workers; in the fetch phase (FETCHERS x BATCH), its fetcher goroutines",
			"RUNS = runs the node took: enqueued (enqueue-only phases) or acked (the others); the nodes' runs add up to the phase's",
			"RUNS/S = the node's runs over the time from the start of the phase to its last run: each node drains at its own pace, " +
				"and the phase's RUNS/S is set by the last; CPU µs/RUN = the node's Redis process CPU (INFO cpu) over the phase / its runs",
		}}
}

// printReport writes the human tables.
func printReport(w io.Writer, rep *Report) {
	fmt.Fprintf(w, "runqueue bench: scheduler flag off vs on · %s\n", backendLine(rep))
	for _, s := range sections(rep) {
		fmt.Fprintf(w, "\n%s\n", s.title)
		s.t.text(w)
		for _, n := range s.notes {
			fmt.Fprintf(w, "  %s\n", n)
		}
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(w, "\nnote: %s\n", n)
	}
}

// chartFile is one SVG of the report.
type chartFile struct {
	name, title string
	svg         []byte
}

// writeOut writes report.md and the charts to dir.
func writeOut(dir string, rep *Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# runqueue bench: scheduler flag off vs on\n\n%s, started %s.\n",
		backendLine(rep), rep.StartedAt.Format("2006-01-02 15:04 UTC"))
	written := map[string]bool{}
	for _, c := range rep.charts {
		if err := os.WriteFile(filepath.Join(dir, c.name), c.svg, 0o644); err != nil {
			return err
		}
	}
	chartRef := func(name string) {
		for _, c := range rep.charts {
			if c.name == name && !written[name] {
				written[name] = true
				fmt.Fprintf(&b, "\n![%s](%s)\n", c.title, c.name)
			}
		}
	}
	for i, s := range sections(rep) {
		fmt.Fprintf(&b, "\n## %s\n\n", s.title)
		s.t.markdown(&b)
		if len(s.notes) > 0 {
			b.WriteString("\n")
			for _, n := range s.notes {
				fmt.Fprintf(&b, "* %s\n", n)
			}
		}
		if i == 0 {
			// The scenario charts belong under the scenario table.
			for _, c := range rep.charts {
				if c.name != "sweep.svg" {
					chartRef(c.name)
				}
			}
		}
		if s.chart != "" {
			chartRef(s.chart)
		}
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(&b, "\nNote: %s\n", n)
	}
	return os.WriteFile(filepath.Join(dir, "report.md"), []byte(b.String()), 0o644)
}

// waitSection gives, for each phase with workers, the waits from a run's
// available time to its dequeue, per key class.
func waitSection(rep *Report) section {
	t := &table{header: []string{"PHASE", "FLAG", "RATE runs/s", "KEYS", "RUNS", "p50 ms", "p99 ms", "p99.9 ms"},
		right: []bool{false, false, true, false, true, true, true, true}}
	for _, r := range rep.Throughput {
		rate := "max"
		if r.RateTarget > 0 {
			rate = fixed(r.RateTarget, 0)
		}
		for _, c := range []struct {
			name string
			w    *WaitStats
		}{{"light", r.WaitLight}, {"heavy", r.WaitHeavy}} {
			if c.w == nil {
				continue
			}
			t.add(r.Phase, r.Flag, rate, c.name, fmt.Sprint(c.w.Runs), fixed(c.w.P50Ms, 2), fixed(c.w.P99Ms, 2), fixed(c.w.P999Ms, 2))
		}
	}
	return section{title: "Wait from available to dequeued, by key class (runqueue.Worker; Observer.Dequeued: the dequeue's time minus the run's AvailableAt)", t: t,
		notes: []string{
			"heavy keys = the first tenth of the keys, with half the runs; light keys = the others, with the other half (about 1/9 of a heavy key's runs each)",
			"steady: one producer enqueues at the given rate (default half the process phase's runs/s on the same flag) while the workers serve",
			"process: the whole queue is ready at the start, so waits grow with the backlog; the flag's fair order shows in light against heavy",
		}}
}
