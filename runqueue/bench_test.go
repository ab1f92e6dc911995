package runqueue_test

// Go benchmarks of the hot operations on a real Redis (skipped without one,
// failed under RUNQUEUE_REQUIRE_REDIS=1), both scheduler flag states:
//
//	go test ./runqueue -run '^$' -bench . -count 5 | tee new.txt; benchstat new.txt
//
// Beside ns/op (client round trip included) each reports what Redis spent,
// from INFO commandstats deltas around the timed part:
//
//	redis-us/op    script usec per operation (the redis.calls inside included)
//	redis-us/run   the same per run moved (a dequeue of batch N moves up to N)
//	redis-cmds/op  Redis commands per operation: the redis.calls inside the
//	               scripts plus the candidate reads Go sends before a dequeue
//
// The statistics are server-wide: run the benchmarks alone on their server.
// `go run ./bench -redis ...` measures the same and more (Go's own reads
// timed apart, fully gated dequeues, memory, key sweep, throughput).

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// benchChunk is how many operations run between two untimed refills.
const benchChunk = 100

// benchKeys is how many concurrency keys the runs are spread over.
const benchKeys = 100

func benchFlags(b *testing.B, fn func(b *testing.B, on bool)) {
	for _, on := range []bool{false, true} {
		name := "flag=off"
		if on {
			name = "flag=on"
		}
		b.Run(name, func(b *testing.B) { fn(b, on) })
	}
}

// benchSetup is setup on a real Redis with the flag on or off; the keys it
// writes are removed when the benchmark round ends.
func benchSetup(b *testing.B, on bool, mutate ...func(*runqueue.Config)) *testBundle {
	b.Helper()
	bb := setup(b, redistest.Real(b), func(c *runqueue.Config) {
		c.VtimeScheduling = on
		for _, m := range mutate {
			m(c)
		}
	})
	b.Cleanup(func() {
		ks := bb.keysUnder(b)
		for len(ks) > 0 {
			n := min(len(ks), 1000)
			require.NoError(b, bb.client.Unlink(bb.ctx, ks[:n]...).Err())
			ks = ks[n:]
		}
	})
	return bb
}

// benchRun is run id: key id mod benchKeys, ready id ms after a base in
// the past, so that in age order the keys take turns as they do when runs
// arrive over time.
func benchRun(bb *testBundle, id int) runqueue.EnqueueParams {
	return runqueue.EnqueueParams{Env: "bench", Queue: "q", Key: "k" + strconv.Itoa(id%benchKeys), ID: "r" + strconv.Itoa(id),
		Payload: []byte("0123456789abcdef"), AvailableAt: bb.clock.Now().Add(time.Duration(id-1e9) * time.Millisecond)}
}

// benchFill enqueues runs from..from+n-1 (benchRun).
func benchFill(b *testing.B, bb *testBundle, from, n int) {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if _, err := bb.q.Enqueue(bb.ctx, benchRun(bb, from+i)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	require.NoError(b, <-errs)
}

// benchStats sums command statistics over the timed parts.
type benchStats struct {
	before        redistest.Stats
	scripts, cmds redistest.CmdStat
}

func (s *benchStats) start(b *testing.B, bb *testBundle) {
	b.Helper()
	var err error
	s.before, err = redistest.CommandStats(bb.ctx, bb.client)
	require.NoError(b, err)
}

func (s *benchStats) stop(b *testing.B, bb *testBundle) {
	b.Helper()
	after, err := redistest.CommandStats(bb.ctx, bb.client)
	require.NoError(b, err)
	d := after.Sub(s.before)
	sc, cm := d.Scripts(), d.Commands()
	s.scripts.Calls += sc.Calls
	s.scripts.Usec += sc.Usec
	s.cmds.Calls += cm.Calls
	s.cmds.Usec += cm.Usec
}

func (s *benchStats) report(b *testing.B, runs int) {
	b.ReportMetric(float64(s.scripts.Usec)/float64(b.N), "redis-us/op")
	b.ReportMetric(float64(s.cmds.Calls)/float64(b.N), "redis-cmds/op")
	if runs > 0 {
		b.ReportMetric(float64(s.scripts.Usec)/float64(runs), "redis-us/run")
	}
}

// BenchmarkEnqueue enqueues ready runs over 100 keys into a growing queue.
func BenchmarkEnqueue(b *testing.B) {
	benchFlags(b, func(b *testing.B, on bool) {
		bb := benchSetup(b, on)
		var st benchStats
		st.start(b, bb)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, err := bb.q.Enqueue(bb.ctx, benchRun(bb, i)); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		st.stop(b, bb)
		st.report(b, b.N)
	})
}

// BenchmarkDequeue dequeues batches of 1, 10 and 100 runs from a queue of
// ready runs over 100 keys, refilled (untimed) every benchChunk calls. The
// runs stay in flight.
func BenchmarkDequeue(b *testing.B) {
	for _, batch := range []int{1, 10, 100} {
		b.Run("batch="+strconv.Itoa(batch), func(b *testing.B) {
			benchFlags(b, func(b *testing.B, on bool) {
				bb := benchSetup(b, on)
				var st benchStats
				served, next := 0, 0
				b.ResetTimer()
				for done := 0; done < b.N; {
					chunk := min(b.N-done, benchChunk)
					b.StopTimer()
					benchFill(b, bb, next, chunk*batch)
					next += chunk * batch
					st.start(b, bb)
					b.StartTimer()
					for range chunk {
						runs, err := bb.q.Dequeue(bb.ctx, "bench", "q", batch)
						if err != nil {
							b.Fatal(err)
						}
						served += len(runs)
					}
					b.StopTimer()
					st.stop(b, bb)
					done += chunk
				}
				if served != b.N*batch {
					b.Fatalf("served %d runs in %d calls of %d", served, b.N, batch)
				}
				st.report(b, served)
			})
		})
	}
}

// BenchmarkAck acks runs dequeued (untimed) from a queue over 100 keys.
func BenchmarkAck(b *testing.B) {
	benchFlags(b, func(b *testing.B, on bool) {
		bb := benchSetup(b, on)
		var st benchStats
		next := 0
		b.ResetTimer()
		for done := 0; done < b.N; {
			chunk := min(b.N-done, benchChunk)
			b.StopTimer()
			benchFill(b, bb, next, chunk)
			next += chunk
			var held []*runqueue.Run
			for len(held) < chunk {
				runs, err := bb.q.Dequeue(bb.ctx, "bench", "q", 100)
				require.NoError(b, err)
				require.NotEmpty(b, runs)
				held = append(held, runs...)
			}
			st.start(b, bb)
			b.StartTimer()
			for _, r := range held {
				if err := bb.q.Ack(bb.ctx, r); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			st.stop(b, bb)
			done += chunk
		}
		st.report(b, b.N)
	})
}

// ackCounter is an Observer that counts acked handler runs and closes
// done at the target-th.
type ackCounter struct {
	runqueue.NopObserver
	n      atomic.Int64
	target int64
	done   chan struct{}
}

func (a *ackCounter) Handled(_, _ string, _ time.Duration, out runqueue.Outcome) {
	if out == runqueue.OutcomeAck && a.n.Add(1) == a.target {
		close(a.done)
	}
}

// BenchmarkWorker measures a Worker at its defaults (Concurrency 100) with
// a no-op handler draining a prefilled queue of b.N runs over benchKeys
// keys, on the wall clock: the timer runs from Start to the b.N-th ack.
// runs/s is the figure to compare; the project's is taken at
// -benchtime 20000x with the flag on:
//
//	go test ./runqueue -run '^$' -bench 'Worker' -benchtime 20000x -count 5
func BenchmarkWorker(b *testing.B) {
	benchFlags(b, func(b *testing.B, on bool) {
		acks := &ackCounter{target: int64(b.N), done: make(chan struct{})}
		bb := benchSetup(b, on, func(c *runqueue.Config) {
			c.Clock = nil
			c.Observer = acks
		})
		ps := make([]runqueue.EnqueueParams, 0, 1000)
		for from := 0; from < b.N; from += 1000 {
			ps = ps[:0]
			for i := from; i < min(from+1000, b.N); i++ {
				ps = append(ps, runqueue.EnqueueParams{Env: "bench", Queue: "q", Key: "k" + strconv.Itoa(i%benchKeys),
					ID: "r" + strconv.Itoa(i), Payload: []byte("01234567")})
			}
			_, err := bb.q.EnqueueMany(bb.ctx, ps)
			require.NoError(b, err)
		}
		w, err := runqueue.NewWorker(bb.q, func(context.Context, *runqueue.Run) error { return nil },
			&runqueue.WorkerConfig{Queues: []runqueue.WorkerQueue{{Env: "bench", Queue: "q"}}})
		require.NoError(b, err)
		var st benchStats
		st.start(b, bb)
		redisBefore := redisCPU(b, bb)
		goBefore, goOK := processCPU()
		b.ResetTimer()
		start := time.Now()
		require.NoError(b, w.Start(bb.ctx))
		<-acks.done
		elapsed := time.Since(start)
		b.StopTimer()
		goAfter, _ := processCPU()
		redisAfter := redisCPU(b, bb)
		st.stop(b, bb)
		require.NoError(b, w.Shutdown(bb.ctx))
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "runs/s")
		st.report(b, b.N)
		b.ReportMetric(float64(b.N)/float64(st.scripts.Calls), "runs/script")
		b.ReportMetric((redisAfter-redisBefore).Seconds()*1e6/float64(b.N), "redis-cpu-us/run")
		if goOK {
			b.ReportMetric((goAfter-goBefore).Seconds()*1e6/float64(b.N), "go-cpu-us/run")
		}
	})
}

// redisCPU is the Redis process's CPU (INFO cpu: used_cpu_sys +
// used_cpu_user), which covers the network work commandstats leaves out.
func redisCPU(b *testing.B, bb *testBundle) time.Duration {
	b.Helper()
	info, err := bb.client.Info(bb.ctx, "cpu").Result()
	require.NoError(b, err)
	var sum float64
	for line := range strings.Lines(info) {
		name, val, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (name == "used_cpu_sys" || name == "used_cpu_user") {
			v, err := strconv.ParseFloat(val, 64)
			require.NoError(b, err)
			sum += v
		}
	}
	return time.Duration(sum * float64(time.Second))
}

// BenchmarkEnqueueParallel enqueues ready runs over 100 keys from 8
// goroutines per CPU, one run per call: the coalesced path that the
// bench's "Enqueue, coalesced" row measures, here under go test's profilers
// (-cpuprofile, -memprofile) to find the client's own cost.
func BenchmarkEnqueueParallel(b *testing.B) {
	benchFlags(b, func(b *testing.B, on bool) {
		bb := benchSetup(b, on)
		var st benchStats
		var next atomic.Int64
		st.start(b, bb)
		b.SetParallelism(4)
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := bb.q.Enqueue(bb.ctx, benchRun(bb, int(next.Add(1)))); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.StopTimer()
		st.stop(b, bb)
		st.report(b, b.N)
	})
}
