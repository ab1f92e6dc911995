package metrics_test

// Review s17r: adversarial probes of the uncommitted exporter changes
// (Options validation in New, the 1-slot turn of scrape.go with the
// ScrapeTimeout started before the wait). Every test is named
// TestS17RMetrics*. A test that shows a defect says DEFECT and fails until
// the defect is fixed; the others check what holds.

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
	"github.com/runqueue/runqueue/runqueue/metrics"
)

// TestS17RMetricsConcurrentScrapesHealthySlowRedis: Redis answers every
// command (120 ms a round trip); one scrape takes about 40% of
// ScrapeTimeout. Four collections at once (two Prometheus servers and a
// couple of retries, or promhttp handlers overlapping) should all read
// everything: nothing is hung.
//
// DEFECT (fixed since: concurrent collections share the scrape in
// progress): collections took turns and each one's ScrapeTimeout ran while
// it waits for the turn, so the k-th collection gets ScrapeTimeout minus
// (k-1) scrapes: the third and fourth here run out of time (one mid-scrape,
// one before its turn) and report scrape_success 0, count an error in
// runqueue_scrape_errors_total, log "scrape of Redis failed ... scrape
// timed out" and leave out every queue gauge, with Redis healthy. Before
// the change the waiter's timeout started with its turn (no spurious
// failure, but K x ScrapeTimeout when hung). Cause: scraper.collect
// (scrape.go) makes each waiter do a scrape of its own after the one in
// progress, on a clock that started before the wait. Fix: share the scrape
// in progress (singleflight): a collection that finds one running waits
// (until its deadline) for that scrape's result and sends the same gauges
// (a Metric slice kept with the result), so K concurrent collections cost
// one scrape and each ends within ScrapeTimeout, hung or not.
func TestS17RMetricsConcurrentScrapesHealthySlowRedis(t *testing.T) {
	t.Parallel()
	m, _ := redistest.MiniServer(t)
	// (Scaled up from 40ms and 800ms, so that the shared scrape has about
	// a second to spare for the stalls of a loaded machine.)
	proxy := newSlowHole(t, m.Addr(), 120*time.Millisecond)
	client := redis.NewClient(&redis.Options{Addr: proxy.ln.Addr().String(), MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	const timeout = 1800 * time.Millisecond
	b := setup(t, client, metrics.Options{ScrapeTimeout: timeout,
		Queues: []runqueue.QueueRef{{Env: "env", Queue: "a"}, {Env: "env", Queue: "b"}}}, nil)
	b.enqueue(t, runqueue.EnqueueParams{Queue: "a", ID: "1"})
	b.enqueue(t, runqueue.EnqueueParams{Queue: "b", ID: "1"})

	start := time.Now()
	mfs := s17Gather(t, b.c)
	solo := time.Since(start)
	ok, _ := s17Value(mfs, "runqueue_scrape_success", nil)
	require.Equal(t, 1.0, ok, "a lone scrape reads everything")
	// The test can judge when a lone scrape takes more than a quarter of
	// ScrapeTimeout (four in turns overrun it) and well under the whole.
	require.Greater(t, solo, timeout/4, "a lone scrape too fast for the test to judge (%s)", solo)
	require.Less(t, solo, timeout*6/10, "a lone scrape takes well under ScrapeTimeout (%s)", solo)

	const scrapers = 4
	success := make([]float64, scrapers)
	var wg sync.WaitGroup
	for i := range scrapers {
		wg.Go(func() {
			mfs := s17Gather(t, b.c)
			success[i], _ = s17Value(mfs, "runqueue_scrape_success", nil)
		})
	}
	wg.Wait()
	require.Equal(t, []float64{1, 1, 1, 1}, success,
		"scrape_success of %d concurrent collections, Redis healthy, one scrape %s of ScrapeTimeout %s; log:\n%s",
		scrapers, solo, timeout, b.log.String())
}

// TestS17RMetricsBucketsCopied: New checks the histogram buckets so that
// a bad list fails there, not at an observation on the Queue's caller.
//
// DEFECT (fixed since: New keeps copies): New checked the caller's
// WaitBuckets / HandlerBuckets slice but
// keeps it (the Options copy shares its array, and prometheus's
// HistogramVec keeps opts.Buckets as is: each histogram is built, and its
// buckets checked, at the first observation of its env/queue pair). A
// caller that reuses or edits its slice after New (or edits
// DefaultWaitBuckets, an exported slice every default Collector shares)
// gets the panic New was meant to rule out, at the first dequeue of a new
// queue, on the Queue's caller goroutine; an edit also races with the
// observations. Cause: withDefaults clones Queues ("the caller's slice is
// left alone") but not the buckets. Fix: slices.Clone WaitBuckets and
// HandlerBuckets (defaults included) in withDefaults before validating.
func TestS17RMetricsBucketsCopied(t *testing.T) {
	t.Parallel()
	wb := []float64{1, 2, 3}
	hb := []float64{1, 2, 3}
	c, err := metrics.New(&metrics.Options{WaitBuckets: wb, HandlerBuckets: hb})
	require.NoError(t, err)
	wb[0], hb[0] = 10, 10 // the caller reuses its slices
	require.NotPanics(t, func() {
		c.Dequeued([]*runqueue.Run{{Env: "env", Queue: "a", AvailableAt: time.Now()}}, time.Now())
	}, "buckets New accepted panic at the first observation")
	require.NotPanics(t, func() { c.Handled("env", "a", time.Second, runqueue.OutcomeAck) })
}

// TestS17RMetricsQueuesErrorIndex: the error of a bad Options.Queues entry
// names it by its index.
//
// DEFECT (minor; fixed since: Queues are checked before de-duplication):
// the index was that of the de-duplicated copy, not of the
// caller's slice: with a repeat before the bad entry, the error points at
// the wrong entry (Queues[1], a good one, for the bad Queues[2]). Cause:
// withDefaults drops the repeats before validate numbers the entries.
// Fix: validate the caller's Queues (or keep the original indexes) before
// de-duplicating.
func TestS17RMetricsQueuesErrorIndex(t *testing.T) {
	t.Parallel()
	_, err := metrics.New(&metrics.Options{Queues: []runqueue.QueueRef{
		{Env: "env", Queue: "a"}, {Env: "env", Queue: "a"}, {Env: "env", Queue: "bad\nname"}}})
	require.ErrorIs(t, err, runqueue.ErrInvalid)
	require.Contains(t, err.Error(), "Options.Queues[2]", "the index of the bad entry in the caller's slice")
}

// TestS17RMetricsTinyTimeoutMessage: with a ScrapeTimeout so small that it
// has passed by the time a collection looks for its turn, and no other
// collection running, the log should not blame a scrape in progress.
//
// DEFECT (minor, diagnostics; fixed since: a collection waits only for a
// scrape it found in progress): the select in scraper.collect had both
// cases ready (the turn free, the context done) and Go picks one at
// random, so about half of these collections log "waiting for the scrape
// in progress" when none was. (Either way the scrape fails.) Fix: take a
// free turn first (a select with default), then wait with the deadline.
func TestS17RMetricsTinyTimeoutMessage(t *testing.T) {
	t.Parallel()
	b := setup(t, redistest.Mini(t), metrics.Options{ScrapeTimeout: time.Nanosecond,
		Queues: []runqueue.QueueRef{{Env: "env", Queue: "a"}}}, nil)
	for range 30 {
		mfs := s17Gather(t, b.c)
		ok, _ := s17Value(mfs, "runqueue_scrape_success", nil)
		require.Equal(t, 0.0, ok)
	}
	require.Zero(t, strings.Count(b.log.String(), "waiting for the scrape in progress"),
		"of 30 collections, one after the other, that logged a scrape in progress when none was")
}

// TestS17RMetricsDeduplicatedQueues: holds. A queue listed twice is read
// once; the caller's slice is left as it was; the pedantic registry is
// satisfied.
func TestS17RMetricsDeduplicatedQueues(t *testing.T) {
	t.Parallel()
	refs := []runqueue.QueueRef{{Env: "env", Queue: "a"}, {Env: "env", Queue: "b"}, {Env: "env", Queue: "a"},
		{Env: "env", Queue: "c"}, {Env: "env", Queue: "b"}}
	orig := slices.Clone(refs)
	b := setup(t, redistest.Mini(t), metrics.Options{Queues: refs}, nil)
	require.Equal(t, orig, refs, "the caller's Queues are left alone")
	b.enqueue(t, runqueue.EnqueueParams{Queue: "a", ID: "1"})
	mfs := s17Gather(t, b.c)
	require.Len(t, mfs["runqueue_queue_ready_runs"].GetMetric(), 3)
	n, _ := s17Value(mfs, "runqueue_scrape_queues", nil)
	require.Equal(t, 3.0, n)
	ok, _ := s17Value(mfs, "runqueue_scrape_success", nil)
	require.Equal(t, 1.0, ok)
}

// TestS17RMetricsWaiterTimesOut: holds. A collection whose ScrapeTimeout
// passes while another collection's scrape is stuck in a command (no
// ContextTimeoutEnabled: the command ends at ReadTimeout, well after
// ScrapeTimeout) ends at its own deadline, reads nothing, re-sends no
// gauge of an earlier scrape, reports scrape_success 0 and scrape_queues
// 0 with a duration of about ScrapeTimeout, and the pedantic registry
// accepts it.
func TestS17RMetricsWaiterTimesOut(t *testing.T) {
	t.Parallel()
	m, _ := redistest.MiniServer(t)
	hole := newBlackHole(t, m.Addr())
	client := redis.NewClient(&redis.Options{Addr: hole.addr(), MaxRetries: -1, ReadTimeout: 1500 * time.Millisecond})
	t.Cleanup(func() { _ = client.Close() })
	const timeout = 200 * time.Millisecond
	b := setup(t, client, metrics.Options{Queues: []runqueue.QueueRef{{Env: "env", Queue: "a"}},
		ScrapeTimeout: timeout}, nil)
	b.enqueue(t, runqueue.EnqueueParams{Queue: "a", ID: "1"})
	mfs := s17Gather(t, b.c)
	require.Len(t, mfs["runqueue_queue_ready_runs"].GetMetric(), 1, "a first, healthy scrape")
	hole.swallow.Store(true)

	first := make(chan struct{})
	go func() {
		defer close(first)
		s17Gather(t, b.c) // stuck in a command until ReadTimeout
	}()
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	mfs = s17Gather(t, b.c)
	took := time.Since(start)
	<-first
	require.Less(t, took, 3*timeout, "the waiter ends at its own deadline")
	require.Nil(t, mfs["runqueue_queue_ready_runs"], "no queue gauge, stale or new")
	ok, _ := s17Value(mfs, "runqueue_scrape_success", nil)
	require.Equal(t, 0.0, ok)
	n, has := s17Value(mfs, "runqueue_scrape_queues", nil)
	require.True(t, has)
	require.Equal(t, 0.0, n)
	d, _ := s17Value(mfs, "runqueue_scrape_duration_seconds", nil)
	require.GreaterOrEqual(t, d, timeout.Seconds())
	require.Less(t, d, 3*timeout.Seconds())
	// (A give-up is logged at Debug since review s17s: the scrape in
	// progress logs its own failure, once.)
}

// (TestS17RMetricsTurnReleasedOnPanic, which closed the collection's
// channel under it, was dropped: the scrape now writes into a sink of its
// own, so it no longer panicked mid-scrape, and closing a channel that
// Collect sends on is a data race. TestS17SMetricsLeaderPanicsFollower-
// ReportsFailure tests a panic of the scrape in progress.)

// TestS17RMetricsOptionsEdges: holds. ScrapeTimeout 0 is the default;
// every reserved ConstLabels name and empty or unordered buckets are
// refused; an invalid Namespace or ConstLabels name fails New, not
// Register; New starts nothing that outlives it (goleak in TestMain).
func TestS17RMetricsOptionsEdges(t *testing.T) {
	t.Parallel()
	for _, l := range []string{"env", "queue", "outcome", "rank", "key", "le"} {
		_, err := metrics.New(&metrics.Options{ConstLabels: prometheus.Labels{l: "x"}})
		require.Error(t, err, l)
	}
	for _, o := range []metrics.Options{
		{WaitBuckets: []float64{}}, {HandlerBuckets: []float64{1, 1}}, {WaitBuckets: []float64{1, 2, 2}},
		{ConstLabels: prometheus.Labels{"__reserved": "x"}}, {ConstLabels: prometheus.Labels{"ok": "\xff"}},
	} {
		_, err := metrics.New(&o)
		require.Error(t, err, "%+v", o)
	}
	for range 100 {
		c, err := metrics.New(&metrics.Options{ConstLabels: prometheus.Labels{"role": "r"}, Namespace: "ns"})
		require.NoError(t, err)
		require.NoError(t, prometheus.NewPedanticRegistry().Register(c))
	}
	// Two Collectors with the same Namespace and ConstLabels: both pass
	// New, the second Register on one registry is refused (New cannot know
	// the caller's registry).
	c1, err := metrics.New(nil)
	require.NoError(t, err)
	c2, err := metrics.New(nil)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(c1))
	var are prometheus.AlreadyRegisteredError
	require.ErrorAs(t, reg.Register(c2), &are)
}
