package metrics_test

// Review s33: the metrics under a realistic Worker load. Every test is
// named TestS33*.

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
	"github.com/runqueue/runqueue/runqueue/metrics"
)

func s33Hash(s string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return h.Sum32()
}

// s33Sum is the sum over collectors of name's series with labels want.
func s33Sum(t testing.TB, name string, want map[string]string, cs ...*metrics.Collector) float64 {
	t.Helper()
	total := 0.0
	for _, c := range cs {
		v, _ := s17Value(s17Gather(t, c), name, want)
		total += v
	}
	return total
}

// TestS33LoadCountersMatchGroundTruth: two Workers (two Queues, two
// Collectors, as two processes) of concurrency 16 on one queue, with a
// key limit, weighted keys, random outcomes (nil, error, NoRetry,
// RetryAfter, panic, a handler outliving its lease), a crashed consumer
// whose runs lease recovery takes back, runs that expire by TTL, and
// idempotent re-enqueues. At rest every counter, summed over the
// collectors, equals what happened, and the gauges equal QueueStats.
func TestS33LoadCountersMatchGroundTruth(t *testing.T) {
	t.Parallel()
	client := redistest.Real(t)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	const env, queue = "env", "w"
	var cs []*metrics.Collector
	var qs []*runqueue.Queue
	for i := 0; i < 3; i++ {
		c, err := metrics.New(&metrics.Options{Logger: slogDiscard()})
		require.NoError(t, err)
		q, err := runqueue.New(ctx, client, &runqueue.Config{Prefix: prefix, Observer: c, VtimeScheduling: i != 1,
			KeyConcurrency: 3, MaxAttempts: 3, BackoffBase: 5 * time.Millisecond, BackoffMax: 20 * time.Millisecond,
			LeaseDuration: 600 * time.Millisecond})
		require.NoError(t, err)
		t.Cleanup(func() { _ = q.Close() })
		c.Watch(q)
		cs = append(cs, c)
		qs = append(qs, q)
	}
	for _, k := range []string{"k0", "k1", "k2"} {
		require.NoError(t, qs[0].SetWeight(ctx, env, queue, k, 3))
	}

	// Monotonic counters, checked by a scraper running through the load.
	stopScrape := make(chan struct{})
	var scraped sync.WaitGroup
	scraped.Add(1)
	go func() {
		defer scraped.Done()
		last := map[string]float64{}
		for {
			select {
			case <-stopScrape:
				return
			case <-time.After(50 * time.Millisecond):
			}
			for i, c := range cs {
				mfs := s17Gather(t, c)
				for name, mf := range mfs {
					if mf.GetType() != dto.MetricType_COUNTER {
						continue
					}
					for _, m := range mf.GetMetric() {
						id := fmt.Sprint(i, name, m.GetLabel())
						v := m.GetCounter().GetValue()
						if v < last[id] {
							t.Errorf("counter %s went back from %v to %v", id, last[id], v)
						}
						last[id] = v
					}
				}
			}
		}
	}()

	var (
		calls, okN, errN, panicN, noRetryN, retryAfterN atomic.Int64
		running                                         atomic.Int64
	)
	handler := func(ctx context.Context, r *runqueue.Run) error {
		running.Add(1)
		defer running.Add(-1)
		calls.Add(1)
		h := s33Hash(fmt.Sprint(r.ID, "/", r.Attempt)) % 100
		switch {
		case h < 2 && r.Attempt == 1: // outlives its lease: the heartbeat keeps it
			time.Sleep(900 * time.Millisecond)
			okN.Add(1)
			return nil
		case h < 55:
			time.Sleep(time.Duration(h%3) * time.Millisecond)
			okN.Add(1)
			return nil
		case h < 70:
			errN.Add(1)
			return errors.New("boom")
		case h < 78:
			noRetryN.Add(1)
			return runqueue.NoRetry(errors.New("final"))
		case h < 88:
			retryAfterN.Add(1)
			return runqueue.RetryAfter(errors.New("later"), 10*time.Millisecond)
		default:
			panicN.Add(1)
			panic("handler panic")
		}
	}

	var newRuns atomic.Int64
	enqueue := func(p runqueue.EnqueueParams) {
		ok, err := qs[0].Enqueue(ctx, p)
		require.NoError(t, err)
		if ok {
			newRuns.Add(1)
		}
	}
	// Runs that expire: delayed past their TTL.
	const expiring = 20
	for i := 0; i < expiring; i++ {
		enqueue(runqueue.EnqueueParams{Env: env, Queue: queue, Key: fmt.Sprintf("k%d", i%7), ID: fmt.Sprintf("ttl-%d", i),
			Delay: time.Hour, TTL: 100 * time.Millisecond})
	}

	// A consumer that crashes: takes runs and never settles them.
	for i := 0; i < 8; i++ {
		enqueue(runqueue.EnqueueParams{Env: env, Queue: queue, Key: fmt.Sprintf("c%d", i), ID: fmt.Sprintf("crash-%d", i)})
	}
	crashRuns, err := qs[2].Dequeue(ctx, env, queue, 8)
	require.NoError(t, err)
	require.Len(t, crashRuns, 8)
	var workers []*runqueue.Worker
	for i := 0; i < 2; i++ {
		wc := &runqueue.WorkerConfig{Queues: []runqueue.WorkerQueue{{Env: env, Queue: queue}}}
		if i == 1 { // the other serves the whole shard (DequeueShard, AckMany)
			wc = &runqueue.WorkerConfig{Shards: []int{qs[i].ShardOf(env)}}
		}
		w, err := runqueue.NewWorker(qs[i], handler, &runqueue.WorkerConfig{
			Queues: wc.Queues, Shards: wc.Shards,
			Concurrency: 16, HeartbeatInterval: 100 * time.Millisecond, SweepInterval: 150 * time.Millisecond,
			IdlePollInterval: 200 * time.Millisecond, Logger: slogDiscard()})
		require.NoError(t, err)
		require.NoError(t, w.Start(ctx))
		workers = append(workers, w)
	}
	const total = 600
	for i := 0; i < total; i++ {
		p := runqueue.EnqueueParams{Env: env, Queue: queue, Key: fmt.Sprintf("k%d", i%12), ID: fmt.Sprintf("r-%d", i),
			Priority: i % 3}
		enqueue(p)
		if i%50 == 0 {
			enqueue(p) // an idempotent retry: counts 0 (or a new run if served already)
		}
	}
	_ = retryAfterN.Load()

	// At rest: nothing queued or in flight, no handler running.
	deadline := time.Now().Add(20 * time.Second)
	var st runqueue.Stats
	for {
		var err error
		st, err = qs[0].QueueStats(ctx, env, queue)
		require.NoError(t, err)
		if st.Ready+st.Delayed+st.InFlight == 0 && running.Load() == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not at rest: %+v running %d", st, running.Load())
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, w := range workers {
		stop, cancel := context.WithTimeout(ctx, 5*time.Second)
		require.NoError(t, w.Shutdown(stop))
		cancel()
	}
	close(stopScrape)
	scraped.Wait()

	q := map[string]string{"env": env, "queue": queue}
	sum := func(n string) float64 { return s33Sum(t, "runqueue_runs_"+n+"_total", q, cs...) }
	outcome := func(o string) float64 {
		total := 0.0
		for _, c := range cs {
			mfs := s17Gather(t, c)
			mf := mfs["runqueue_handler_duration_seconds"]
			if mf == nil {
				continue
			}
		next:
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "outcome" && l.GetValue() != o {
						continue next
					}
				}
				total += float64(m.GetHistogram().GetSampleCount())
			}
		}
		return total
	}
	crashed := 8.0
	leaseLost := outcome("lease_lost")
	t.Logf("calls %d ok %d err %d noretry %d retryafter %d panic %d; lease_lost %v; stats %+v",
		calls.Load(), okN.Load(), errN.Load(), noRetryN.Load(), retryAfterN.Load(), panicN.Load(), leaseLost, st)

	require.Equal(t, float64(newRuns.Load()), sum("enqueued"), "enqueued")
	require.Equal(t, float64(calls.Load())+crashed, sum("dequeued"), "dequeued: handler calls + the crashed consumer's")
	require.Equal(t, float64(okN.Load()), sum("acked"), "acked")
	require.Equal(t, float64(errN.Load()+noRetryN.Load()+retryAfterN.Load()+panicN.Load())-leaseLost, sum("nacked"), "nacked")
	require.Equal(t, float64(st.Dead), sum("dead_lettered"), "dead_lettered vs QueueStats.Dead")
	require.Equal(t, float64(expiring), sum("expired"), "expired")
	require.Equal(t, crashed+leaseLost, sum("recovered"), "recovered")
	require.Equal(t, sum("enqueued"), sum("acked")+float64(st.Dead)+sum("expired"), "every run ended once")

	require.Equal(t, float64(okN.Load()), outcome("ack"), "outcome ack")
	require.Equal(t, float64(panicN.Load()), outcome("panic"), "outcome panic")
	require.Equal(t, float64(calls.Load()), outcome("ack")+outcome("retry")+outcome("dead")+outcome("panic")+leaseLost,
		"one outcome per handler call")

	// Gauges at rest equal QueueStats (collector 0 discovers the queue:
	// it holds dead runs).
	mfs := s17Gather(t, cs[0])
	st, err = qs[0].QueueStats(ctx, env, queue)
	require.NoError(t, err)
	for name, want := range map[string]float64{"ready_runs": float64(st.Ready), "delayed_runs": float64(st.Delayed),
		"in_flight_runs": float64(st.InFlight), "dead_runs": float64(st.Dead),
		"oldest_ready_age_seconds": st.OldestReadyAge.Seconds()} {
		v, ok := s17Value(mfs, "runqueue_queue_"+name, q)
		require.True(t, ok, "gauge %s missing at rest", name)
		require.Equal(t, want, v, name)
	}

	// Label names stay within the documented set.
	allowed := map[string]bool{"env": true, "queue": true, "outcome": true, "rank": true, "le": true}
	for _, c := range cs {
		for name, mf := range s17Gather(t, c) {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					require.True(t, allowed[l.GetName()], "%s has label %s", name, l.GetName())
				}
			}
		}
		problems, err := testutil.CollectAndLint(c)
		require.NoError(t, err)
		require.Empty(t, problems)
	}
	_ = prometheus.Labels{}
}
