package metrics_test

// Review s17: adversarial probes of the Prometheus exporter (Collector,
// Options, Watch, scrape) and of what the Queue and the Worker report to
// it. Every test is named TestS17Metrics*. A test that shows a defect says
// DEFECT in its comment and fails until the defect is fixed.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
	"github.com/runqueue/runqueue/runqueue/metrics"
)

// s17Gather collects c through a pedantic registry (which checks what it
// collects against what it describes) and returns the families by name.
// It fails t with Errorf, so it may run on any goroutine.
func s17Gather(t testing.TB, c prometheus.Collector) map[string]*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Errorf("register: %v", err)
		return nil
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Errorf("gather: %v", err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// s17Value is the value of the series of name whose labels include want;
// ok false when there is none.
func s17Value(mfs map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	mf := mfs[name]
	if mf == nil {
		return 0, false
	}
next:
	for _, m := range mf.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

func s17Q(queue string) map[string]string { return map[string]string{"env": "env", "queue": queue} }

// s17Counters are the seven run counters of env/queue, by short name.
func s17Counters(t testing.TB, c prometheus.Collector, queue string) map[string]float64 {
	t.Helper()
	mfs := s17Gather(t, c)
	out := map[string]float64{}
	for _, n := range []string{"enqueued", "dequeued", "acked", "nacked", "dead_lettered", "expired", "recovered"} {
		v, _ := s17Value(mfs, "runqueue_runs_"+n+"_total", s17Q(queue))
		out[n] = v
	}
	return out
}

var s17Backends = []redistest.Backend{
	{Name: "Mini", Client: redistest.Mini},
	{Name: "Real", Client: redistest.Real},
}

// TestS17MetricsCountersOddPaths: duplicates inside one EnqueueMany, one
// AckMany and one AckAndDequeue count once; DequeueShard counts its runs;
// a Nack that dead-letters counts in nacked and dead_lettered; a lease
// recovery that dead-letters counts in recovered and dead_lettered; a
// redrive counts nothing; ExpireTTL counts what it removed.
func TestS17MetricsCountersOddPaths(t *testing.T) {
	t.Parallel()
	redistest.ForEachBackend(t, s17Backends, func(t *testing.T, client redis.UniversalClient) {
		b := setup(t, client, metrics.Options{}, func(cfg *runqueue.Config) {
			cfg.MaxAttempts = 1
			cfg.LeaseDuration = 10 * time.Second
		})
		ctx := b.ctx
		p := func(id string) runqueue.EnqueueParams {
			return runqueue.EnqueueParams{Env: "env", Queue: "a", ID: id}
		}
		res, err := b.q.EnqueueMany(ctx, []runqueue.EnqueueParams{p("1"), p("1"), p("2"), p("3"), p("4"), p("5")})
		require.NoError(t, err)
		require.True(t, res[0].Queued)
		require.False(t, res[1].Queued)
		require.Equal(t, 5.0, s17Counters(t, b.c, "a")["enqueued"])

		runs, err := b.q.DequeueShard(ctx, b.q.ShardOf("env"), 2)
		require.NoError(t, err)
		require.Len(t, runs, 2)
		require.Equal(t, 2.0, s17Counters(t, b.c, "a")["dequeued"])

		errs, err := b.q.AckMany(ctx, []*runqueue.Run{runs[0], runs[0]})
		require.NoError(t, err)
		require.NoError(t, errs[0])
		require.NoError(t, errs[1])
		require.Equal(t, 1.0, s17Counters(t, b.c, "a")["acked"], "one run acked, sent twice in one batch")

		more, ackErrs, err := b.q.AckAndDequeue(ctx, []*runqueue.Run{runs[1], runs[1]}, "env", "a", 3)
		require.NoError(t, err)
		require.NoError(t, ackErrs[0])
		require.NoError(t, ackErrs[1])
		require.Len(t, more, 3)
		got := s17Counters(t, b.c, "a")
		require.Equal(t, 2.0, got["acked"])
		require.Equal(t, 5.0, got["dequeued"])

		// Nack that dead-letters (MaxAttempts 1): nacked and dead.
		nr, err := b.q.Nack(ctx, more[0], nil)
		require.NoError(t, err)
		require.False(t, nr.Requeued)
		// A lease recovery that dead-letters: recovered and dead.
		b.clock.Advance(11 * time.Second)
		n, err := b.q.RecoverLeases(ctx, b.q.ShardOf("env"), 100)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		got = s17Counters(t, b.c, "a")
		require.Equal(t, 1.0, got["nacked"])
		require.Equal(t, 2.0, got["recovered"])
		require.Equal(t, 3.0, got["dead_lettered"])

		// Redrive (twice: idempotent) counts nothing.
		require.NoError(t, b.q.Redrive(ctx, "env", "a", "", more[0].ID))
		require.NoError(t, b.q.Redrive(ctx, "env", "a", "", more[0].ID))
		require.Equal(t, got, s17Counters(t, b.c, "a"))

		// ExpireTTL counts the runs it removed.
		require.True(t, b.enqueue(t, runqueue.EnqueueParams{Queue: "a", ID: "ttl1", TTL: time.Second}))
		require.True(t, b.enqueue(t, runqueue.EnqueueParams{Queue: "a", ID: "ttl2", TTL: time.Second}))
		b.clock.Advance(2 * time.Second)
		n, err = b.q.ExpireTTL(ctx, b.q.ShardOf("env"), 100)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		n, err = b.q.ExpireTTL(ctx, b.q.ShardOf("env"), 100)
		require.NoError(t, err)
		require.Zero(t, n)
		require.Equal(t, 2.0, s17Counters(t, b.c, "a")["expired"])

		// The gauges agree with Redis: the redriven run is ready, two dead.
		st, err := b.q.QueueStats(ctx, "env", "a")
		require.NoError(t, err)
		mfs := s17Gather(t, b.c)
		for name, want := range map[string]int64{"ready": st.Ready, "delayed": st.Delayed, "in_flight": st.InFlight,
			"dead": st.Dead} {
			v, ok := s17Value(mfs, "runqueue_queue_"+name+"_runs", s17Q("a"))
			require.True(t, ok, name)
			require.Equal(t, float64(want), v, name)
		}
		require.Equal(t, int64(1), st.Ready)
		require.Equal(t, int64(2), st.Dead)
	})
}

// TestS17MetricsCoalescedCallsCountOnce: concurrent Enqueue calls of the
// same run and concurrent Ack calls of the same run (coalesced into one
// EnqueueMany / AckMany) count once.
func TestS17MetricsCoalescedCallsCountOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, redistest.Real(t), metrics.Options{}, nil)
	const callers = 16
	var wg sync.WaitGroup
	var queued atomic.Int32
	for range callers {
		wg.Go(func() {
			ok, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: "env", Queue: "a", ID: "same"})
			if err == nil && ok {
				queued.Add(1)
			}
		})
	}
	wg.Wait()
	require.Equal(t, int32(1), queued.Load())
	runs := b.dequeue(t, "a", 1)
	require.Len(t, runs, 1)
	for range callers {
		wg.Go(func() { _ = b.q.Ack(b.ctx, runs[0]) })
	}
	wg.Wait()
	got := s17Counters(t, b.c, "a")
	require.Equal(t, 1.0, got["enqueued"])
	require.Equal(t, 1.0, got["dequeued"])
	require.Equal(t, 1.0, got["acked"])
}

// TestS17MetricsWorkerOutcomes: a Worker's handler outcomes land in the
// handler histogram with the documented labels, and its acks and nacks in
// the counters.
func TestS17MetricsWorkerOutcomes(t *testing.T) {
	t.Parallel()
	for _, byShard := range []bool{false, true} {
		t.Run(fmt.Sprintf("shard=%v", byShard), func(t *testing.T) {
			t.Parallel()
			s17WorkerOutcomes(t, byShard)
		})
	}
}

func s17WorkerOutcomes(t *testing.T, byShard bool) {
	c, err := metrics.New(&metrics.Options{})
	require.NoError(t, err)
	client := redistest.Real(t)
	q, err := runqueue.New(context.Background(), client, &runqueue.Config{Prefix: redistest.Prefix(t), Observer: c,
		MaxAttempts: 2, BackoffBase: time.Hour, BackoffMax: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	ctx := context.Background()
	for _, id := range []string{"ok", "fail", "noretry", "panic"} {
		_, err := q.Enqueue(ctx, runqueue.EnqueueParams{Env: "env", Queue: "w", ID: id})
		require.NoError(t, err)
	}
	var done sync.WaitGroup
	done.Add(4)
	w, err := runqueue.NewWorker(q, func(ctx context.Context, r *runqueue.Run) error {
		defer done.Done()
		switch r.ID {
		case "fail":
			return errors.New("boom")
		case "noretry":
			return runqueue.NoRetry(errors.New("bad"))
		case "panic":
			panic("handler panic")
		}
		return nil
	}, s17WorkerConfig(q, byShard))
	require.NoError(t, err)
	require.NoError(t, w.Start(ctx))
	done.Wait()
	stop, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	require.NoError(t, w.Shutdown(stop))
	mfs := s17Gather(t, c)
	for outcome, want := range map[string]float64{"ack": 1, "retry": 1, "dead": 1, "panic": 1} {
		v, _ := s17Value(mfs, "runqueue_handler_duration_seconds",
			map[string]string{"env": "env", "queue": "w", "outcome": outcome})
		require.Equal(t, want, v, outcome)
	}
	got := s17Counters(t, c, "w")
	require.Equal(t, 4.0, got["dequeued"])
	require.Equal(t, 1.0, got["acked"])
	require.Equal(t, 3.0, got["nacked"])
	require.Equal(t, 1.0, got["dead_lettered"])
}

// TestS17MetricsUnsortedBucketsRejected: New validates its Options, but
// not the histogram buckets.
//
// DEFECT (fixed since: Options.validate refuses buckets that are not
// strictly increasing, NaN or empty): New accepted WaitBuckets (or
// HandlerBuckets) that are not strictly increasing; prometheus builds a
// histogram only at its first observation, so the panic ("histogram
// buckets must be in increasing order") came later, in Collector.Dequeued / Handled: on the Queue's caller goroutine
// (or a coalesced sender's), taking the application down at its first
// dequeue instead of failing New.
func TestS17MetricsUnsortedBucketsRejected(t *testing.T) {
	t.Parallel()
	for name, o := range map[string]metrics.Options{
		"wait":    {WaitBuckets: []float64{10, 1}},
		"handler": {HandlerBuckets: []float64{1, 1}},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := metrics.New(&o)
			if err == nil {
				require.NotPanics(t, func() {
					c.Dequeued([]*runqueue.Run{{Env: "env", Queue: "a", AvailableAt: time.Now()}}, time.Now())
					c.Handled("env", "a", time.Second, runqueue.OutcomeAck)
				}, "an Options New accepted panics at the first observation")
			}
			require.Error(t, err, "New accepted buckets that are not strictly increasing")
		})
	}
}

// TestS17MetricsBadQueuesOption: Options.Queues are checked for empty
// names only.
//
// DEFECT (fixed since: Options.validate checks each entry with
// QueueRef.Validate; the error names the entry and wraps the
// *InvalidError): a name runqueue refuses (a control character, over
// MaxNameBytes, " padded") passed New; every scrape then failed at that
// queue with an *InvalidError (scrape_success 0 forever), and, as a scrape stops at its
// first error, the queues listed after it are never read.
func TestS17MetricsBadQueuesOption(t *testing.T) {
	t.Parallel()
	_, err := metrics.New(&metrics.Options{Queues: []runqueue.QueueRef{{Env: "env", Queue: "bad\nname"}}})
	require.Error(t, err, "New accepted a queue name runqueue refuses")
}

// TestS17MetricsDuplicateQueuesOption: the same queue twice in
// Options.Queues.
//
// DEFECT (fixed since: New drops the repeats from its copy of
// Options.Queues, so a scrape reads the queue once; the test builds its
// Collector through setup, which requires New to accept the Options):
// New accepted it and each scrape sent the queue's gauges twice
// with the same labels; the registry then fails the whole Gather ("was
// collected before with the same name and label values"), so /metrics
// serves an error instead of any metric, counters included, although the
// docs say a scrape "never fails the collection".
func TestS17MetricsDuplicateQueuesOption(t *testing.T) {
	t.Parallel()
	b := setup(t, redistest.Mini(t), metrics.Options{Queues: []runqueue.QueueRef{{Env: "env", Queue: "a"},
		{Env: "env", Queue: "a"}}}, nil)
	b.enqueue(t, runqueue.EnqueueParams{Queue: "a", ID: "1"})
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(b.c))
	_, err := reg.Gather()
	require.NoError(t, err, "a duplicate in Options.Queues fails every collection")
}

// TestS17MetricsOptionsPrometheusRejects: Options that prometheus cannot
// register (a label name of the metrics in ConstLabels, an invalid
// Namespace).
//
// DEFECT (fixed since: Options.validate refuses ConstLabels named as a
// label of the metrics, and New refuses what Register would): New
// accepted them and returned a Collector that can never be
// registered (Register fails, MustRegister panics) while it already works
// as the Queue's Observer: the error surfaces far from New, which is
// where the other Options are checked.
func TestS17MetricsOptionsPrometheusRejects(t *testing.T) {
	t.Parallel()
	for name, o := range map[string]metrics.Options{
		"const label env": {ConstLabels: prometheus.Labels{"env": "prod"}},
		"namespace":       {Namespace: "my-app"},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := metrics.New(&o)
			if err == nil {
				require.NoError(t, prometheus.NewRegistry().Register(c), "New accepted Options prometheus rejects")
			}
		})
	}
}

// TestS17MetricsTwoCollectorsOneRegistry: registering the same Collector
// twice is refused (AlreadyRegisteredError); two Collectors need
// ConstLabels to tell them apart, and then both register.
func TestS17MetricsTwoCollectorsOneRegistry(t *testing.T) {
	t.Parallel()
	c1, err := metrics.New(&metrics.Options{ConstLabels: prometheus.Labels{"instance_role": "a"}})
	require.NoError(t, err)
	c2, err := metrics.New(&metrics.Options{ConstLabels: prometheus.Labels{"instance_role": "b"}})
	require.NoError(t, err)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c1))
	var are prometheus.AlreadyRegisteredError
	require.ErrorAs(t, reg.Register(c1), &are)
	require.NoError(t, reg.Register(c2))
	c1.Enqueued("env", "a", 1)
	c2.Enqueued("env", "a", 2)
	_, err = reg.Gather()
	require.NoError(t, err)
}

func slogDiscard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestS17MetricsConcurrentScrapesWhileRedisHung: scrapes are serialised;
// with Redis hung each one costs ScrapeTimeout.
//
// DEFECT (fixed since: the turn is a 1-slot channel and ScrapeTimeout
// starts before the wait for it; a collection whose deadline passes while
// it waits reads nothing and reports a failed scrape): the scrape mutex
// was held for a whole scrape and a waiting collection then ran a full
// scrape of its own, its ScrapeTimeout starting only once it held the
// mutex. K concurrent collections (two
// Prometheus servers, a retrying scraper, promhttp handlers piling up while
// Redis hangs) take up to K x ScrapeTimeout, so the documented bound ("with
// Options.ScrapeTimeout for the whole") does not hold for a collection,
// and the reads are not shared ("concurrent scrapers do not multiply the
// reads": they run one after the other, each reading Redis). Cause:
// scraper.collect in scrape.go (s.mu.Lock before the context is made).
// Fix: share the scrape in progress (singleflight: a collection that finds
// one running waits for its result), or start the timeout before taking
// the mutex.
func TestS17MetricsConcurrentScrapesWhileRedisHung(t *testing.T) {
	t.Parallel()
	m, _ := redistest.MiniServer(t)
	hole := newBlackHole(t, m.Addr())
	client := redis.NewClient(&redis.Options{Addr: hole.ln.Addr().String(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	const timeout = 250 * time.Millisecond
	b := setup(t, client, metrics.Options{Queues: []runqueue.QueueRef{{Env: "env", Queue: "a"}},
		ScrapeTimeout: timeout}, nil)
	b.enqueue(t, runqueue.EnqueueParams{Queue: "a", ID: "1"})
	hole.swallow.Store(true)

	const scrapers = 6
	took := make([]time.Duration, scrapers)
	var wg sync.WaitGroup
	for i := range scrapers {
		wg.Go(func() {
			start := time.Now()
			reg := prometheus.NewRegistry()
			if err := reg.Register(b.c); err == nil {
				_, _ = reg.Gather()
			}
			took[i] = time.Since(start)
		})
	}
	wg.Wait()
	slowest := time.Duration(0)
	for _, d := range took {
		slowest = max(slowest, d)
	}
	require.Less(t, slowest, 3*timeout, "a collection took %s with ScrapeTimeout %s (%d concurrent)", slowest,
		timeout, scrapers)
}

// TestS17MetricsOddNames: names with quotes, backslashes, spaces, '%',
// ':' and non-ASCII letters come out as labels exactly, for the counters
// and for the discovered gauges, and the registry accepts them.
func TestS17MetricsOddNames(t *testing.T) {
	t.Parallel()
	redistest.ForEachBackend(t, s17Backends, func(t *testing.T, client redis.UniversalClient) {
		b := setup(t, client, metrics.Options{}, nil)
		env, queue := `e"v\n:1`, "ü mail/%2F:{x}"
		_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: queue, Key: "k ü", ID: "i%d"})
		require.NoError(t, err)
		mfs := s17Gather(t, b.c)
		lbl := map[string]string{"env": env, "queue": queue}
		v, ok := s17Value(mfs, "runqueue_runs_enqueued_total", lbl)
		require.True(t, ok)
		require.Equal(t, 1.0, v)
		v, ok = s17Value(mfs, "runqueue_queue_ready_runs", lbl)
		require.True(t, ok)
		require.Equal(t, 1.0, v)
	})
}

// TestS17MetricsGaugesAcrossFlagStates: a flag-on Queue and a flag-off
// Queue on one prefix, each watched by a Collector, with keys at their
// concurrency limit, delayed and dead runs: both scrapes read what
// QueueStats reads; only the flag-on one reports lags, and those are
// TopLags (gated keys left out).
func TestS17MetricsGaugesAcrossFlagStates(t *testing.T) {
	t.Parallel()
	redistest.ForEachBackend(t, s17Backends, func(t *testing.T, client redis.UniversalClient) {
		on := setup(t, client, metrics.Options{TopLagKeys: 20}, func(cfg *runqueue.Config) {
			cfg.VtimeScheduling = true
			cfg.KeyConcurrency = 1
		})
		cOff, err := metrics.New(&metrics.Options{TopLagKeys: 20, Logger: slogDiscard()})
		require.NoError(t, err)
		qOff, err := runqueue.New(on.ctx, client, &runqueue.Config{Prefix: on.q.Config().Prefix, Clock: on.clock,
			KeyConcurrency: 1, Observer: cOff})
		require.NoError(t, err)
		t.Cleanup(func() { _ = qOff.Close() })
		cOff.Watch(qOff)

		for k := range 6 {
			for i := range 3 {
				on.enqueue(t, runqueue.EnqueueParams{Queue: "a", Key: fmt.Sprintf("k%d", k), ID: fmt.Sprintf("%d-%d", k, i)})
			}
		}
		on.enqueue(t, runqueue.EnqueueParams{Queue: "a", Key: "late", ID: "d", Delay: time.Hour})
		on.clock.Advance(3 * time.Second)
		runs := on.dequeue(t, "a", 4) // four keys at their limit
		require.Len(t, runs, 4)
		_, err = on.q.Nack(on.ctx, runs[0], &runqueue.NackOptions{DeadLetter: true})
		require.NoError(t, err)
		more, err := qOff.Dequeue(on.ctx, "env", "a", 1) // flag-off instance serves too
		require.NoError(t, err)
		require.Len(t, more, 1)

		st, err := on.q.QueueStats(on.ctx, "env", "a")
		require.NoError(t, err)
		require.Equal(t, runqueue.Stats{Ready: 18 - 5, Delayed: 1, InFlight: 4, Dead: 1, OldestReadyAge: 3 * time.Second}, st)
		for name, c := range map[string]*metrics.Collector{"on": on.c, "off": cOff} {
			mfs := s17Gather(t, c)
			for g, want := range map[string]float64{"ready_runs": 13, "delayed_runs": 1, "in_flight_runs": 4,
				"dead_runs": 1, "oldest_ready_age_seconds": 3} {
				v, ok := s17Value(mfs, "runqueue_queue_"+g, s17Q("a"))
				require.True(t, ok, "%s %s", name, g)
				require.Equal(t, want, v, "%s %s", name, g)
			}
			ok, _ := s17Value(mfs, "runqueue_scrape_success", nil)
			require.Equal(t, 1.0, ok, name)
		}
		top, err := on.q.TopLags(on.ctx, "env", "a", 20)
		require.NoError(t, err)
		mfs := s17Gather(t, on.c)
		lags := mfs["runqueue_scheduler_top_lag_quanta"]
		require.NotNil(t, lags)
		require.Len(t, lags.GetMetric(), len(top))
		require.Nil(t, s17Gather(t, cOff)["runqueue_scheduler_top_lag_quanta"], "flag off: no lags")
	})
}

// TestS17MetricsTenThousandKeys: a queue of 10,000 keys with scheduler
// state scrapes in one bounded read: the gauges are right, exactly K lag
// series, scrape_success 1.
func TestS17MetricsTenThousandKeys(t *testing.T) {
	t.Parallel()
	b := setup(t, redistest.Real(t), metrics.Options{TopLagKeys: 5}, func(cfg *runqueue.Config) {
		cfg.VtimeScheduling = true
	})
	const nkeys = 10000
	batch := make([]runqueue.EnqueueParams, 0, nkeys)
	for i := range nkeys {
		batch = append(batch, runqueue.EnqueueParams{Env: "env", Queue: "big", Key: fmt.Sprintf("k%05d", i),
			ID: fmt.Sprint(i)})
	}
	res, err := b.q.EnqueueMany(b.ctx, batch)
	require.NoError(t, err)
	for _, r := range res {
		require.True(t, r.Queued)
	}
	served := 0
	for range 4 {
		served += len(b.dequeue(t, "big", 100))
	}
	mfs := s17Gather(t, b.c)
	v, _ := s17Value(mfs, "runqueue_queue_ready_runs", s17Q("big"))
	require.Equal(t, float64(nkeys-served), v)
	v, _ = s17Value(mfs, "runqueue_queue_in_flight_runs", s17Q("big"))
	require.Equal(t, float64(served), v)
	require.Len(t, mfs["runqueue_scheduler_top_lag_quanta"].GetMetric(), 5)
	v, _ = s17Value(mfs, "runqueue_scrape_success", nil)
	require.Equal(t, 1.0, v)
	v, _ = s17Value(mfs, "runqueue_runs_enqueued_total", s17Q("big"))
	require.Equal(t, float64(nkeys), v)
}

// TestS17MetricsDueRunsLookDelayed: a run whose delay (or retry backoff)
// has passed is ready to run, and a queue no consumer serves should show
// it waiting.
//
// DEFECT (fixed since: the age counts from the earliest delayed run when it
// is due; a due run not yet promoted still counts in delayed_runs, which
// QueueStats documents and the help text now says, since telling due from
// future runs apart would read every key's delayed set): until some
// dequeue promoted it, a due run stayed counted as
// runqueue_queue_delayed_runs, whose help says "Runs queued with a future
// available time", and runqueue_queue_oldest_ready_age_seconds stays 0.
// So when the consumers are down (the outage the age gauge is there to
// alert on) every retried run (Nack's backoff puts it in the delayed set)
// and every delayed run shows as "delayed, nothing ready, age 0" for ever.
// QueueStats documents "(or a due one not yet promoted)"; the exporter's
// help text and the "age of the oldest ready run" do not. Cause:
// QueueStats (stats.go) reads only the depth counters and the ckIndex head;
// the delayIndex head (the earliest due time) is not read. Fix: read
// ZRANGE delayIndex 0 0 WITHSCORES in the same MULTI and, when its score is
// due, count the age from it (and say in the help that due runs not yet
// promoted count as delayed).
func TestS17MetricsDueRunsLookDelayed(t *testing.T) {
	t.Parallel()
	b := setup(t, redistest.Mini(t), metrics.Options{}, nil)
	b.enqueue(t, runqueue.EnqueueParams{Queue: "a", ID: "1", Delay: time.Minute})
	b.clock.Advance(10 * time.Minute) // due for 9 minutes; no consumer ran
	mfs := s17Gather(t, b.c)
	delayed, _ := s17Value(mfs, "runqueue_queue_delayed_runs", s17Q("a"))
	age, _ := s17Value(mfs, "runqueue_queue_oldest_ready_age_seconds", s17Q("a"))
	require.Equal(t, 1.0, delayed, "a due run not yet promoted counts as delayed (documented)")
	require.Equal(t, (9 * time.Minute).Seconds(), age, "oldest ready age of a run due 9 minutes ago")
	// Its help says so, rather than "a future available time" alone.
	for _, mf := range mfs {
		if mf.GetName() == "runqueue_queue_delayed_runs" {
			require.Contains(t, mf.GetHelp(), "not yet promoted")
		}
	}
}

func s17WorkerConfig(q *runqueue.Queue, byShard bool) *runqueue.WorkerConfig {
	cfg := &runqueue.WorkerConfig{Concurrency: 4, SweepInterval: -1, Logger: slogDiscard()}
	if byShard {
		cfg.Shards = []int{q.ShardOf("env")}
	} else {
		cfg.Queues = []runqueue.WorkerQueue{{Env: "env", Queue: "w"}}
	}
	return cfg
}
