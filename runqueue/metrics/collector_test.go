package metrics_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
	"github.com/runqueue/runqueue/runqueue/metrics"
)

// counterText is the exposition of the seven run counters, each with the
// given value for env/a and env/b.
func counterText(values map[string][2]int) string {
	help := map[string]string{
		"enqueued":      "Runs newly queued by Enqueue and EnqueueMany (idempotent retries not counted).",
		"dequeued":      "Runs delivered by any dequeue call.",
		"acked":         "Runs acked (runs gone already not counted).",
		"nacked":        "Runs given back by Nack, requeued or dead-lettered.",
		"dead_lettered": "Runs moved to the dead letter, by Nack or by lease recovery.",
		"expired":       "Queued runs removed by ExpireTTL after their TTL passed.",
		"recovered":     "Runs taken back by RecoverLeases after their lease passed (requeued or dead-lettered).",
	}
	var b strings.Builder
	for _, name := range []string{"enqueued", "dequeued", "acked", "nacked", "dead_lettered", "expired", "recovered"} {
		full := "runqueue_runs_" + name + "_total"
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s counter\n", full, help[name], full)
		fmt.Fprintf(&b, "%s{env=\"env\",queue=\"a\"} %d\n", full, values[name][0])
		fmt.Fprintf(&b, "%s{env=\"env\",queue=\"b\"} %d\n", full, values[name][1])
	}
	return b.String()
}

var counterNames = []string{"runqueue_runs_enqueued_total", "runqueue_runs_dequeued_total", "runqueue_runs_acked_total",
	"runqueue_runs_nacked_total", "runqueue_runs_dead_lettered_total", "runqueue_runs_expired_total",
	"runqueue_runs_recovered_total"}

// TestCountersAfterKnownSequence drives one life of every kind through a
// Queue and compares every counter and histogram with what happened.
func TestCountersAfterKnownSequence(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, client redis.UniversalClient) {
		b := setup(t, client, metrics.Options{WaitBuckets: []float64{1, 10}, HandlerBuckets: []float64{0.1, 1}},
			func(cfg *runqueue.Config) {
				cfg.MaxAttempts = 2
				cfg.LeaseDuration = 10 * time.Second
			})
		shard := b.q.ShardOf("env")
		for _, id := range []string{"1", "2", "3", "4"} {
			require.True(t, b.enqueue(t, runqueue.EnqueueParams{Queue: "a", ID: id}))
		}
		require.True(t, b.enqueue(t, runqueue.EnqueueParams{Queue: "a", ID: "5", TTL: time.Second}))
		require.True(t, b.enqueue(t, runqueue.EnqueueParams{Queue: "b", ID: "x"}))
		require.False(t, b.enqueue(t, runqueue.EnqueueParams{Queue: "a", ID: "1"}), "idempotent retry")

		b.clock.Advance(2 * time.Second)
		first := b.dequeue(t, "a", 2) // 1, 2: waited 2s
		require.Equal(t, "1", first[0].ID)
		require.NoError(t, b.q.Ack(b.ctx, first[0]))
		require.NoError(t, b.q.Ack(b.ctx, first[0]), "gone already: not counted")
		res, err := b.q.Nack(b.ctx, first[1], &runqueue.NackOptions{RetryAt: b.clock.Now()})
		require.NoError(t, err)
		require.True(t, res.Requeued)
		n, err := b.q.ExpireTTL(b.ctx, shard, 100) // 5
		require.NoError(t, err)
		require.Equal(t, 1, n)
		next, _, err := b.q.AckAndDequeue(b.ctx, nil, "env", "a", 3) // 3, 4 waited 2s; 2 waited 0s
		require.NoError(t, err)
		require.Len(t, next, 3)
		require.Len(t, b.dequeue(t, "b", 1), 1) // x waited 2s

		b.clock.Advance(11 * time.Second)
		n, err = b.q.RecoverLeases(b.ctx, shard, 100) // 3, 4, x requeued; 2 dead (second attempt)
		require.NoError(t, err)
		require.Equal(t, 4, n)
		x := b.dequeue(t, "b", 1) // waited 0s since its recovery
		require.Len(t, x, 1)
		res, err = b.q.Nack(b.ctx, x[0], nil) // last attempt: dead-lettered
		require.NoError(t, err)
		require.False(t, res.Requeued)

		b.c.Handled("env", "a", 50*time.Millisecond, runqueue.OutcomeAck)
		b.c.Handled("env", "a", 2*time.Second, runqueue.OutcomeRetry)
		b.c.Handled("env", "a", 500*time.Millisecond, runqueue.Outcome("bogus"))

		want := counterText(map[string][2]int{
			"enqueued": {5, 1}, "dequeued": {5, 2}, "acked": {1, 0}, "nacked": {1, 1},
			"dead_lettered": {1, 1}, "expired": {1, 0}, "recovered": {3, 1},
		})
		require.NoError(t, testutil.CollectAndCompare(b.c, strings.NewReader(want), counterNames...))

		const hist = `
# HELP runqueue_run_wait_seconds Time from a run's available time (enqueue plus delay, or retry time) to its delivery.
# TYPE runqueue_run_wait_seconds histogram
runqueue_run_wait_seconds_bucket{env="env",queue="a",le="1"} 1
runqueue_run_wait_seconds_bucket{env="env",queue="a",le="10"} 5
runqueue_run_wait_seconds_bucket{env="env",queue="a",le="+Inf"} 5
runqueue_run_wait_seconds_sum{env="env",queue="a"} 8
runqueue_run_wait_seconds_count{env="env",queue="a"} 5
runqueue_run_wait_seconds_bucket{env="env",queue="b",le="1"} 1
runqueue_run_wait_seconds_bucket{env="env",queue="b",le="10"} 2
runqueue_run_wait_seconds_bucket{env="env",queue="b",le="+Inf"} 2
runqueue_run_wait_seconds_sum{env="env",queue="b"} 2
runqueue_run_wait_seconds_count{env="env",queue="b"} 2
# HELP runqueue_handler_duration_seconds Time a worker's handler ran, by outcome (ack, retry, dead, panic, lease_lost).
# TYPE runqueue_handler_duration_seconds histogram
runqueue_handler_duration_seconds_bucket{env="env",outcome="ack",queue="a",le="0.1"} 1
runqueue_handler_duration_seconds_bucket{env="env",outcome="ack",queue="a",le="1"} 1
runqueue_handler_duration_seconds_bucket{env="env",outcome="ack",queue="a",le="+Inf"} 1
runqueue_handler_duration_seconds_sum{env="env",outcome="ack",queue="a"} 0.05
runqueue_handler_duration_seconds_count{env="env",outcome="ack",queue="a"} 1
runqueue_handler_duration_seconds_bucket{env="env",outcome="other",queue="a",le="0.1"} 0
runqueue_handler_duration_seconds_bucket{env="env",outcome="other",queue="a",le="1"} 1
runqueue_handler_duration_seconds_bucket{env="env",outcome="other",queue="a",le="+Inf"} 1
runqueue_handler_duration_seconds_sum{env="env",outcome="other",queue="a"} 0.5
runqueue_handler_duration_seconds_count{env="env",outcome="other",queue="a"} 1
runqueue_handler_duration_seconds_bucket{env="env",outcome="retry",queue="a",le="0.1"} 0
runqueue_handler_duration_seconds_bucket{env="env",outcome="retry",queue="a",le="1"} 0
runqueue_handler_duration_seconds_bucket{env="env",outcome="retry",queue="a",le="+Inf"} 1
runqueue_handler_duration_seconds_sum{env="env",outcome="retry",queue="a"} 2
runqueue_handler_duration_seconds_count{env="env",outcome="retry",queue="a"} 1
`
		require.NoError(t, testutil.CollectAndCompare(b.c, strings.NewReader(hist),
			"runqueue_run_wait_seconds", "runqueue_handler_duration_seconds"))
	})
}

// TestGaugesAfterKnownState reads the gauges of configured queues, one
// with runs in every state and one empty.
func TestGaugesAfterKnownState(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, client redis.UniversalClient) {
		b := setup(t, client, metrics.Options{Queues: []runqueue.QueueRef{{Env: "env", Queue: "a"}, {Env: "env", Queue: "empty"}}}, nil)
		for _, id := range []string{"1", "2", "3", "4"} {
			b.enqueue(t, runqueue.EnqueueParams{Queue: "a", ID: id})
		}
		b.enqueue(t, runqueue.EnqueueParams{Queue: "a", ID: "later", Delay: time.Hour})
		b.clock.Advance(7 * time.Second)
		runs := b.dequeue(t, "a", 2)
		_, err := b.q.Nack(b.ctx, runs[1], &runqueue.NackOptions{DeadLetter: true})
		require.NoError(t, err)

		const want = `
# HELP runqueue_queue_ready_runs Runs queued and ready (read from Redis at scrape).
# TYPE runqueue_queue_ready_runs gauge
runqueue_queue_ready_runs{env="env",queue="a"} 2
runqueue_queue_ready_runs{env="env",queue="empty"} 0
# HELP runqueue_queue_delayed_runs Runs queued with a future available time, or due and not yet promoted by a dequeue (read from Redis at scrape).
# TYPE runqueue_queue_delayed_runs gauge
runqueue_queue_delayed_runs{env="env",queue="a"} 1
runqueue_queue_delayed_runs{env="env",queue="empty"} 0
# HELP runqueue_queue_in_flight_runs Runs dequeued and not yet acked, nacked or recovered (read from Redis at scrape).
# TYPE runqueue_queue_in_flight_runs gauge
runqueue_queue_in_flight_runs{env="env",queue="a"} 1
runqueue_queue_in_flight_runs{env="env",queue="empty"} 0
# HELP runqueue_queue_dead_runs Runs in the dead letter (read from Redis at scrape).
# TYPE runqueue_queue_dead_runs gauge
runqueue_queue_dead_runs{env="env",queue="a"} 1
runqueue_queue_dead_runs{env="env",queue="empty"} 0
# HELP runqueue_queue_oldest_ready_age_seconds Now minus the available time of the ready run first in age order, or of the earliest delayed run when it is due; 0 when none is ready or due.
# TYPE runqueue_queue_oldest_ready_age_seconds gauge
runqueue_queue_oldest_ready_age_seconds{env="env",queue="a"} 7
runqueue_queue_oldest_ready_age_seconds{env="env",queue="empty"} 0
# HELP runqueue_scrape_success 1 when the last scrape read every queue it meant to, 0 when it failed.
# TYPE runqueue_scrape_success gauge
runqueue_scrape_success 1
# HELP runqueue_scrape_queues Queues whose gauges the last scrape read.
# TYPE runqueue_scrape_queues gauge
runqueue_scrape_queues 2
# HELP runqueue_scrape_errors_total Scrapes of Redis that failed (Redis unreachable, timeout); see the log.
# TYPE runqueue_scrape_errors_total counter
runqueue_scrape_errors_total 0
`
		require.NoError(t, testutil.CollectAndCompare(b.c, strings.NewReader(want),
			"runqueue_queue_ready_runs", "runqueue_queue_delayed_runs", "runqueue_queue_in_flight_runs",
			"runqueue_queue_dead_runs", "runqueue_queue_oldest_ready_age_seconds", "runqueue_scrape_success",
			"runqueue_scrape_queues", "runqueue_scrape_errors_total"))
		// The flag is off: no scheduler lags.
		require.Zero(t, testutil.CollectAndCount(b.c, "runqueue_scheduler_top_lag_quanta"))
		require.Empty(t, b.log.String())
	})
}

// TestDiscoveryIsBounded: without configured queues a scrape reads at most
// MaxScrapeQueues queues and counts the others as skipped.
func TestDiscoveryIsBounded(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, client redis.UniversalClient) {
		b := setup(t, client, metrics.Options{MaxScrapeQueues: 2}, nil)
		for _, q := range []string{"q0", "q1", "q2"} {
			b.enqueue(t, runqueue.EnqueueParams{Queue: q, ID: "1"})
		}
		const want = `
# HELP runqueue_scrape_queues Queues whose gauges the last scrape read.
# TYPE runqueue_scrape_queues gauge
runqueue_scrape_queues 2
# HELP runqueue_scrape_queues_skipped Queues holding queued runs that the last scrape did not read (past MaxScrapeQueues).
# TYPE runqueue_scrape_queues_skipped gauge
runqueue_scrape_queues_skipped 1
`
		require.NoError(t, testutil.CollectAndCompare(b.c, strings.NewReader(want),
			"runqueue_scrape_queues", "runqueue_scrape_queues_skipped"))
		require.Equal(t, 2, testutil.CollectAndCount(b.c, "runqueue_queue_ready_runs"))
	})
}

// TestDiscoveredQueueKeptWhileItHoldsRuns: a discovered queue whose runs
// are all in flight has left the shard master but stays in the scrape
// until it is read empty, reported at zero once, then forgotten.
func TestDiscoveredQueueKeptWhileItHoldsRuns(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, client redis.UniversalClient) {
		b := setup(t, client, metrics.Options{}, nil)
		b.enqueue(t, runqueue.EnqueueParams{Queue: "busy", ID: "1"})
		gauges := func(ready, inflight int) string {
			return fmt.Sprintf(`
# HELP runqueue_queue_ready_runs Runs queued and ready (read from Redis at scrape).
# TYPE runqueue_queue_ready_runs gauge
runqueue_queue_ready_runs{env="env",queue="busy"} %d
# HELP runqueue_queue_in_flight_runs Runs dequeued and not yet acked, nacked or recovered (read from Redis at scrape).
# TYPE runqueue_queue_in_flight_runs gauge
runqueue_queue_in_flight_runs{env="env",queue="busy"} %d
`, ready, inflight)
		}
		names := []string{"runqueue_queue_ready_runs", "runqueue_queue_in_flight_runs"}
		require.NoError(t, testutil.CollectAndCompare(b.c, strings.NewReader(gauges(1, 0)), names...))
		runs := b.dequeue(t, "busy", 1)
		require.NoError(t, testutil.CollectAndCompare(b.c, strings.NewReader(gauges(0, 1)), names...))
		require.NoError(t, b.q.Ack(b.ctx, runs[0]))
		require.NoError(t, testutil.CollectAndCompare(b.c, strings.NewReader(gauges(0, 0)), names...))
		require.Zero(t, testutil.CollectAndCount(b.c, names...))
	})
}

// TestTopLagsAreBounded: 500 keys with scheduler state give exactly K lag
// series, the K largest lags.
func TestTopLagsAreBounded(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, client redis.UniversalClient) {
		for _, keyLabel := range []bool{false, true} {
			t.Run(fmt.Sprintf("KeyLabel=%t", keyLabel), func(t *testing.T) {
				t.Parallel()
				b := setup(t, client, metrics.Options{Queues: []runqueue.QueueRef{{Env: "env", Queue: "fair"}},
					LagKeyLabel: keyLabel}, func(cfg *runqueue.Config) { cfg.VtimeScheduling = true })
				const nkeys = 500
				var batch []runqueue.EnqueueParams
				for i := range nkeys {
					key := fmt.Sprintf("k%03d", i)
					if i%50 == 0 {
						// A few light keys: their tags jump 1/w per serve.
						require.NoError(t, b.q.SetWeight(b.ctx, "env", "fair", key, 0.1+float64(i)/1000))
					}
					for j := range 2 {
						batch = append(batch, runqueue.EnqueueParams{Env: "env", Queue: "fair", Key: key, ID: fmt.Sprintf("%s-%d", key, j)})
					}
				}
				res, err := b.q.EnqueueMany(b.ctx, batch)
				require.NoError(t, err)
				require.Len(t, res, 2*nkeys)
				// Small calls: a long script on miniredis under the race
				// detector outlasts go-redis's read timeout and is retried.
				for range 4 {
					require.Len(t, b.dequeue(t, "fair", 50), 50)
				}

				require.Equal(t, 10, testutil.CollectAndCount(b.c, "runqueue_scheduler_top_lag_quanta"))
				top, err := b.q.TopLags(b.ctx, "env", "fair", 10)
				require.NoError(t, err)
				require.Len(t, top, 10)
				var want strings.Builder
				want.WriteString("# HELP runqueue_scheduler_top_lag_quanta The largest per-key lags (tag minus the queue's virtual clock, in quanta) of the fair scheduler, rank 1 largest.\n")
				want.WriteString("# TYPE runqueue_scheduler_top_lag_quanta gauge\n")
				for i, kl := range top {
					key := ""
					if keyLabel {
						key = fmt.Sprintf(",key=%q", kl.Key)
					}
					fmt.Fprintf(&want, "runqueue_scheduler_top_lag_quanta{env=\"env\"%s,queue=\"fair\",rank=\"%d\"} %v\n", key, i+1, kl.Lag)
				}
				require.NoError(t, testutil.CollectAndCompare(b.c, strings.NewReader(want.String()),
					"runqueue_scheduler_top_lag_quanta"))
				// The light keys were served once each, ahead by 1/w.
				require.Greater(t, top[0].Lag, 1.0)
			})
		}
	})
}

// TestCardinalityCap: past MaxQueues env/queue pairs every observation goes
// to env="other", queue="other"; nothing is lost and nothing grows.
func TestCardinalityCap(t *testing.T) {
	t.Parallel()
	c, err := metrics.New(&metrics.Options{MaxQueues: 3})
	require.NoError(t, err)
	for i := range 5 {
		c.Enqueued("env", fmt.Sprintf("q%d", i), i+1)
	}
	c.Handled("env", "q4", time.Millisecond, runqueue.OutcomeAck)
	c.Handled("env", "q9", time.Millisecond, runqueue.OutcomeAck)
	const want = `
# HELP runqueue_runs_enqueued_total Runs newly queued by Enqueue and EnqueueMany (idempotent retries not counted).
# TYPE runqueue_runs_enqueued_total counter
runqueue_runs_enqueued_total{env="env",queue="q0"} 1
runqueue_runs_enqueued_total{env="env",queue="q1"} 2
runqueue_runs_enqueued_total{env="env",queue="q2"} 3
runqueue_runs_enqueued_total{env="other",queue="other"} 9
# HELP runqueue_observed_queues Env/queue pairs with counters of their own; at MaxQueues, later pairs are counted as env="other", queue="other".
# TYPE runqueue_observed_queues gauge
runqueue_observed_queues 3
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want),
		"runqueue_runs_enqueued_total", "runqueue_observed_queues"))
	// One handler histogram (other/ack): buckets + sum + count.
	require.Equal(t, 1, testutil.CollectAndCount(c, "runqueue_handler_duration_seconds"))
}

// TestConcurrentObservations: many goroutines over more pairs than the cap
// lose no count and create no more than MaxQueues + 1 series.
func TestConcurrentObservations(t *testing.T) {
	t.Parallel()
	c, err := metrics.New(&metrics.Options{MaxQueues: 50})
	require.NoError(t, err)
	const workers, queues = 8, 200
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range queues {
				c.Enqueued(fmt.Sprintf("env%d", (i+w)%queues%7), fmt.Sprintf("q%d", (i+w)%queues), 1)
			}
		})
	}
	wg.Wait()
	require.Equal(t, 51, testutil.CollectAndCount(c, "runqueue_runs_enqueued_total"))
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() == "runqueue_runs_enqueued_total" {
			for _, m := range mf.GetMetric() {
				total += m.GetCounter().GetValue()
			}
		}
	}
	require.Equal(t, float64(workers*queues), total)
}

// TestScrapeWithRedisDown: the scrape fails, logs and counts the failure;
// the collection still succeeds with the observed counters.
func TestScrapeWithRedisDown(t *testing.T) {
	t.Parallel()
	m, _ := redistest.MiniServer(t)
	// No retries: each scrape fails at its first refused dial.
	client := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = client.Close() })
	b := setup(t, client, metrics.Options{}, nil)
	b.enqueue(t, runqueue.EnqueueParams{Queue: "a", ID: "1"})
	m.Close()

	const want = `
# HELP runqueue_runs_enqueued_total Runs newly queued by Enqueue and EnqueueMany (idempotent retries not counted).
# TYPE runqueue_runs_enqueued_total counter
runqueue_runs_enqueued_total{env="env",queue="a"} 1
# HELP runqueue_scrape_success 1 when the last scrape read every queue it meant to, 0 when it failed.
# TYPE runqueue_scrape_success gauge
runqueue_scrape_success 0
# HELP runqueue_scrape_errors_total Scrapes of Redis that failed (Redis unreachable, timeout); see the log.
# TYPE runqueue_scrape_errors_total counter
runqueue_scrape_errors_total 1
`
	require.NoError(t, testutil.CollectAndCompare(b.c, strings.NewReader(want),
		"runqueue_runs_enqueued_total", "runqueue_scrape_success", "runqueue_scrape_errors_total"))
	require.Zero(t, testutil.CollectAndCount(b.c, "runqueue_queue_ready_runs"))
	require.Contains(t, b.log.String(), "scrape of Redis failed")
	require.Contains(t, b.log.String(), "discovering queues")
}

// TestScrapeWithRedisHung: a Redis that stops answering costs a scrape its
// timeout, not more, and the scrape reports the failure.
func TestScrapeWithRedisHung(t *testing.T) {
	t.Parallel()
	m, _ := redistest.MiniServer(t)
	hole := newBlackHole(t, m.Addr())
	client := redis.NewClient(&redis.Options{Addr: hole.addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	b := setup(t, client, metrics.Options{Queues: []runqueue.QueueRef{{Env: "env", Queue: "a"}},
		ScrapeTimeout: 100 * time.Millisecond}, nil)
	b.enqueue(t, runqueue.EnqueueParams{Queue: "a", ID: "1"})
	hole.swallow.Store(true)

	const want = `
# HELP runqueue_scrape_success 1 when the last scrape read every queue it meant to, 0 when it failed.
# TYPE runqueue_scrape_success gauge
runqueue_scrape_success 0
# HELP runqueue_scrape_errors_total Scrapes of Redis that failed (Redis unreachable, timeout); see the log.
# TYPE runqueue_scrape_errors_total counter
runqueue_scrape_errors_total 1
`
	require.NoError(t, testutil.CollectAndCompare(b.c, strings.NewReader(want),
		"runqueue_scrape_success", "runqueue_scrape_errors_total"))
	require.Contains(t, b.log.String(), "scrape timed out")
}

// TestLint runs promlint over everything a Collector exports.
func TestLint(t *testing.T) {
	t.Parallel()
	b := setup(t, redistest.Mini(t), metrics.Options{}, func(cfg *runqueue.Config) { cfg.VtimeScheduling = true })
	b.enqueue(t, runqueue.EnqueueParams{Queue: "a", Key: "k", ID: "1"})
	b.enqueue(t, runqueue.EnqueueParams{Queue: "a", Key: "k", ID: "2"})
	b.dequeue(t, "a", 1)
	b.c.Handled("env", "a", time.Second, runqueue.OutcomeAck)
	problems, err := testutil.CollectAndLint(b.c)
	require.NoError(t, err)
	require.Empty(t, problems)
}

func TestOptionsValidated(t *testing.T) {
	t.Parallel()
	for _, o := range []metrics.Options{
		{MaxQueues: -1}, {MaxScrapeQueues: -1}, {MaxScrapeQueues: 10001}, {ScrapeTimeout: -time.Second},
		{TopLagKeys: 1001}, {Queues: []runqueue.QueueRef{{Env: "env"}}},
	} {
		_, err := metrics.New(&o)
		require.Error(t, err, "%+v", o)
	}
	_, err := metrics.New(nil)
	require.NoError(t, err)
}

// TestObservingAllocatesNothing: the Observer methods run on the Queue's
// hot path; once a pair has its series they allocate nothing.
func TestObservingAllocatesNothing(t *testing.T) {
	c, err := metrics.New(&metrics.Options{MaxQueues: 1})
	require.NoError(t, err)
	runs := []*runqueue.Run{{Env: "env", Queue: "a", AvailableAt: time.UnixMilli(1000)},
		{Env: "env", Queue: "a", AvailableAt: time.UnixMilli(2000)}}
	now := time.UnixMilli(5000)
	observe := func() {
		c.Enqueued("env", "a", 2)
		c.Dequeued(runs, now)
		c.Acked("env", "a", 1)
		c.Nacked("env", "a", false)
		c.Expired("env", "a", 1)
		c.Recovered("env", "a", 2, 1)
		c.Enqueued("env", "past-the-cap", 1)
	}
	observe() // creates the series
	require.Zero(t, testing.AllocsPerRun(100, observe))
}
