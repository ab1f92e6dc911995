// Command compare measures runqueue beside asynq on one Redis, by the
// method of the comparison table in docs/performance.md: producers enqueue
// N jobs one call each (enqueue phase), then a consumer of concurrency C
// with a no-op handler processes the prefilled queue (process phase). Each
// phase reports jobs/s (wall clock) and Redis process CPU per job (INFO
// cpu: used_cpu_sys + used_cpu_user deltas, every thread of the server),
// which includes the network work, as other queues' published figures do.
// BullMQ is measured by the same method with bullmq/bench.mjs; run.sh runs
// all of them against one Redis, in one run.
//
// It is its own Go module so that the library's go.mod never depends on
// asynq. A run starts with FLUSHALL: use a Redis of its own.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/runqueue/runqueue/runqueue"
)

// row is one system's figures, printed as one JSON line.
type row struct {
	System         string  `json:"system"`
	Jobs           int     `json:"jobs"`
	Producers      int     `json:"producers"`
	Concurrency    int     `json:"concurrency"`
	EnqueuePerSec  float64 `json:"enqueue_jobs_per_s"`
	EnqueueCPUUs   float64 `json:"enqueue_redis_cpu_us_per_job"`
	ProcessPerSec  float64 `json:"process_jobs_per_s"`
	ProcessCPUUs   float64 `json:"process_redis_cpu_us_per_job"`
	RedisCommands  float64 `json:"process_redis_cmds_per_job"`
	EnqueueCommand float64 `json:"enqueue_redis_cmds_per_job"`
}

func main() {
	addr := flag.String("redis", "127.0.0.1:6379", "Redis address (host:port); flushed before the run")
	system := flag.String("system", "runqueue-on", "runqueue-off, runqueue-on or asynq")
	jobs := flag.Int("jobs", 20000, "jobs per phase")
	producers := flag.Int("producers", 8, "goroutines enqueueing one job a call")
	conc := flag.Int("concurrency", 100, "the consumer's concurrency")
	keys := flag.Int("keys", 100, "runqueue concurrency keys the jobs spread over (asynq has none)")
	table := flag.String("table", "", "print the rows of this file of JSON lines (one per system and round) as a table, and measure nothing")
	flag.Parse()
	if *table != "" {
		if err := printTable(*table); err != nil {
			fmt.Fprintln(os.Stderr, "compare:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(*addr, *system, *jobs, *producers, *conc, *keys); err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
}

func run(addr, system string, jobs, producers, conc, keys int) error {
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	if err := c.FlushAll(ctx).Err(); err != nil {
		return err
	}
	var sys queueSystem
	switch system {
	case "runqueue-off", "runqueue-on":
		rq := &rqSystem{keys: keys}
		q, err := runqueue.New(ctx, c, &runqueue.Config{VtimeScheduling: system == "runqueue-on", Observer: rq})
		if err != nil {
			return err
		}
		rq.q = q
		sys = rq
	case "asynq":
		sys = &asynqSystem{addr: addr}
	default:
		return fmt.Errorf("unknown system %q", system)
	}
	r := row{System: system, Jobs: jobs, Producers: producers, Concurrency: conc}
	payload := []byte("0123456789abcdef")

	m, err := startMeter(ctx, c)
	if err != nil {
		return err
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	start := time.Now()
	for range producers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= jobs {
					return
				}
				if err := sys.enqueue(ctx, i, payload); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	d := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return fmt.Errorf("enqueue: %w", err)
	}
	cpu, cmds, err := m.stop(ctx)
	if err != nil {
		return err
	}
	r.EnqueuePerSec = float64(jobs) / d.Seconds()
	r.EnqueueCPUUs = cpu / float64(jobs)
	r.EnqueueCommand = cmds / float64(jobs)

	if m, err = startMeter(ctx, c); err != nil {
		return err
	}
	start = time.Now()
	shutdown, err := sys.process(ctx, c, jobs, conc)
	if err != nil {
		return fmt.Errorf("process: %w", err)
	}
	d = time.Since(start)
	if cpu, cmds, err = m.stop(ctx); err != nil {
		return err
	}
	// The consumer stops outside the measure: asynq's Shutdown waits out
	// its processor's idle sleep (about a second), which is not work.
	if err := shutdown(); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	r.ProcessPerSec = float64(jobs) / d.Seconds()
	r.ProcessCPUUs = cpu / float64(jobs)
	r.RedisCommands = cmds / float64(jobs)
	return json.NewEncoder(os.Stdout).Encode(r)
}

// queueSystem is one queue under test.
type queueSystem interface {
	enqueue(ctx context.Context, i int, payload []byte) error
	// process consumes the n prefilled jobs with a no-op handler and
	// returns once every one is settled (acked or completed), with the
	// function that stops its consumer.
	process(ctx context.Context, c *redis.Client, n, conc int) (shutdown func() error, err error)
}

type rqSystem struct {
	runqueue.NopObserver
	q     *runqueue.Queue
	keys  int
	acked atomic.Int64
	goal  int64
	all   chan struct{}
}

// Acked counts the settled runs of the process phase.
func (s *rqSystem) Acked(_, _ string, n int) {
	if s.all != nil && s.acked.Add(int64(n)) == s.goal {
		close(s.all)
	}
}

func (s *rqSystem) enqueue(ctx context.Context, i int, payload []byte) error {
	_, err := s.q.Enqueue(ctx, runqueue.EnqueueParams{Env: "e", Queue: "q", Key: "k" + strconv.Itoa(i%s.keys),
		ID: "r" + strconv.Itoa(i), Payload: payload})
	return err
}

func (s *rqSystem) process(ctx context.Context, _ *redis.Client, n, conc int) (func() error, error) {
	s.goal, s.all = int64(n), make(chan struct{})
	w, err := runqueue.NewWorker(s.q, func(context.Context, *runqueue.Run) error { return nil },
		&runqueue.WorkerConfig{Queues: []runqueue.WorkerQueue{{Env: "e", Queue: "q"}}, Concurrency: conc})
	if err != nil {
		return nil, err
	}
	if err := w.Start(ctx); err != nil {
		return nil, err
	}
	<-s.all
	return func() error { return w.Shutdown(ctx) }, nil
}

type asynqSystem struct {
	addr   string
	client *asynq.Client
	once   sync.Once
}

func (s *asynqSystem) enqueue(_ context.Context, i int, payload []byte) error {
	s.once.Do(func() { s.client = asynq.NewClient(asynq.RedisClientOpt{Addr: s.addr}) })
	_, err := s.client.Enqueue(asynq.NewTask("job", payload))
	return err
}

func (s *asynqSystem) process(ctx context.Context, c *redis.Client, n, conc int) (func() error, error) {
	var done atomic.Int64
	all := make(chan struct{})
	srv := asynq.NewServer(asynq.RedisClientOpt{Addr: s.addr}, asynq.Config{Concurrency: conc,
		LogLevel: asynq.WarnLevel})
	mux := asynq.NewServeMux()
	mux.HandleFunc("job", func(context.Context, *asynq.Task) error {
		if done.Add(1) == int64(n) {
			close(all)
		}
		return nil
	})
	if err := srv.Start(mux); err != nil {
		return nil, err
	}
	<-all
	// The last handlers have returned; their tasks are settled once the
	// active list is empty (asynq deletes a task that succeeded).
	for {
		l, err := c.LLen(ctx, "asynq:{default}:active").Result()
		if err != nil {
			return nil, err
		}
		if l == 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	return func() error { srv.Shutdown(); return nil }, nil
}

// meter reads the Redis process CPU and the command count at start and
// stop.
type meter struct {
	c          *redis.Client
	cpu, calls float64
}

func startMeter(ctx context.Context, c *redis.Client) (*meter, error) {
	m := &meter{c: c}
	var err error
	m.cpu, m.calls, err = readInfo(ctx, c)
	return m, err
}

func (m *meter) stop(ctx context.Context) (cpu, calls float64, err error) {
	cpu, calls, err = readInfo(ctx, m.c)
	return cpu - m.cpu, calls - m.calls, err
}

// readInfo returns used_cpu_sys + used_cpu_user in µs and the calls of
// every command (INFO commandstats; a script's redis.calls included).
func readInfo(ctx context.Context, c *redis.Client) (cpu, calls float64, err error) {
	info, err := c.Info(ctx, "cpu", "commandstats").Result()
	if err != nil {
		return 0, 0, err
	}
	for line := range strings.Lines(info) {
		name, val, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch {
		case name == "used_cpu_sys" || name == "used_cpu_user":
			v, err := strconv.ParseFloat(val, 64)
			if err != nil {
				return 0, 0, err
			}
			cpu += v * 1e6
		case strings.HasPrefix(name, "cmdstat_") && name != "cmdstat_info":
			f, _, _ := strings.Cut(strings.TrimPrefix(val, "calls="), ",")
			v, err := strconv.ParseFloat(f, 64)
			if err != nil {
				return 0, 0, err
			}
			calls += v
		}
	}
	return math.Round(cpu), calls, nil
}

// printTable prints the rows of file (JSON lines) as a Markdown table, one
// line per system in the order first met, each figure as the range of its
// rounds.
func printTable(file string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var order []string
	rows := map[string][]row{}
	for line := range strings.Lines(string(data)) {
		if strings.TrimSpace(line) == "" {
			continue
		}
		var r row
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return fmt.Errorf("%s: %q: %w", file, line, err)
		}
		if rows[r.System] == nil {
			order = append(order, r.System)
		}
		rows[r.System] = append(rows[r.System], r)
	}
	fmt.Println("| system | rounds | enqueue jobs/s | enqueue µs/job | enqueue cmds/job | process jobs/s | process µs/job | process cmds/job |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for _, sys := range order {
		rs := rows[sys]
		col := func(f func(row) float64, prec int) string {
			lo, hi := math.Inf(1), math.Inf(-1)
			for _, r := range rs {
				lo, hi = math.Min(lo, f(r)), math.Max(hi, f(r))
			}
			if strconv.FormatFloat(lo, 'f', prec, 64) == strconv.FormatFloat(hi, 'f', prec, 64) {
				return strconv.FormatFloat(lo, 'f', prec, 64)
			}
			return strconv.FormatFloat(lo, 'f', prec, 64) + "-" + strconv.FormatFloat(hi, 'f', prec, 64)
		}
		fmt.Printf("| %s | %d | %s | %s | %s | %s | %s | %s |\n", sys, len(rs),
			col(func(r row) float64 { return r.EnqueuePerSec }, 0), col(func(r row) float64 { return r.EnqueueCPUUs }, 1),
			col(func(r row) float64 { return r.EnqueueCommand }, 2), col(func(r row) float64 { return r.ProcessPerSec }, 0),
			col(func(r row) float64 { return r.ProcessCPUUs }, 1), col(func(r row) float64 { return r.RedisCommands }, 2))
	}
	return nil
}
