package metrics

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/runqueue/runqueue/runqueue"
)

// Other is the env and queue label of the series that take every env/queue
// pair past Options.MaxQueues.
const Other = "other"

// Default histogram buckets, in seconds.
var (
	// DefaultWaitBuckets spans a busy queue (10 ms) to a backlog (1 h).
	DefaultWaitBuckets = []float64{0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600}
	// DefaultHandlerBuckets spans a cache hit (5 ms) to a batch job (5 min).
	DefaultHandlerBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}
)

// Options configure a Collector. The zero value of every field means its
// default; nil Options mean every default.
type Options struct {
	// Namespace starts every metric name. Defaults to "runqueue".
	Namespace string
	// ConstLabels are added to every metric (for example the instance's
	// role). Defaults to none. The label names of the metrics (env, queue,
	// outcome, rank, key, and the histograms' le) are refused.
	ConstLabels prometheus.Labels

	// MaxQueues bounds the env/queue pairs of the counters and histograms:
	// the first MaxQueues pairs observed get series of their own, for the
	// Collector's life (counters never go back); every later pair is
	// counted under env="other", queue="other". Defaults to 100.
	MaxQueues int
	// WaitBuckets are the buckets of runqueue_run_wait_seconds: strictly
	// increasing upper bounds, no NaN (a last +Inf is implicit anyway).
	// Defaults (nil) to DefaultWaitBuckets; empty is refused.
	WaitBuckets []float64
	// HandlerBuckets are the buckets of runqueue_handler_duration_seconds,
	// as WaitBuckets. Defaults (nil) to DefaultHandlerBuckets.
	HandlerBuckets []float64

	// Queues are the env/queue pairs whose gauges each scrape reads from
	// Redis, each valid (QueueRef.Validate); a queue listed twice is read
	// once. Defaults to none: each scrape discovers the queues that hold
	// queued runs (Queue.ActiveQueues), up to MaxScrapeQueues, and in the
	// room left reads those it read before that still hold runs in flight
	// or dead, then those whose runs the Collector, as the Observer, saw
	// dequeued or dead-lettered since the last scrape. A queue whose runs
	// all died (or are all in flight) before any scrape found it, in a
	// process whose Observer is not this Collector, has no gauges: list the
	// queues you alert on.
	Queues []runqueue.QueueRef
	// MaxScrapeQueues bounds the queues a discovering scrape reads; the
	// queues past it are counted in runqueue_scrape_queues_skipped. Not
	// used with Queues. 1..10000. Defaults to 50.
	MaxScrapeQueues int
	// ScrapeTimeout bounds the scrape of one collection, its wait for a
	// concurrent collection's scrape to end included; what was not read by
	// then is left out of that scrape, which counts as failed. go-redis
	// interrupts a command already sent only when the client has
	// ContextTimeoutEnabled; otherwise that command ends at the client's
	// ReadTimeout (go-redis's default is 5s) and no command starts after
	// the timeout.
	// Defaults to 5s.
	ScrapeTimeout time.Duration
	// TopLagKeys is K of runqueue_scheduler_top_lag_quanta: the K largest
	// per-key lags of each scraped queue (with the fair scheduler on).
	// 1..1000. Defaults to 10; negative reads no lags.
	TopLagKeys int
	// LagKeyLabel adds the key label to the lag series. A scrape still
	// has at most TopLagKeys lag series per queue, but every key that ever
	// reaches the top leaves a series in the time-series database's
	// history. Defaults to false: the series are labelled by rank only.
	LagKeyLabel bool

	// Logger receives scrape errors. Defaults to slog.Default().
	Logger *slog.Logger
}

func (o *Options) withDefaults() Options {
	var out Options
	if o != nil {
		out = *o
	}
	if out.Namespace == "" {
		out.Namespace = "runqueue"
	}
	if out.MaxQueues == 0 {
		out.MaxQueues = 100
	}
	if out.WaitBuckets == nil {
		out.WaitBuckets = DefaultWaitBuckets
	}
	if out.HandlerBuckets == nil {
		out.HandlerBuckets = DefaultHandlerBuckets
	}
	// Copies: prometheus keeps the buckets it is given and reads them at
	// each new series, so a caller's later edit (or one of the exported
	// defaults) must not reach them.
	out.WaitBuckets = slices.Clone(out.WaitBuckets)
	out.HandlerBuckets = slices.Clone(out.HandlerBuckets)
	out.Queues = slices.Clone(out.Queues)
	if out.MaxScrapeQueues == 0 {
		out.MaxScrapeQueues = 50
	}
	if out.ScrapeTimeout == 0 {
		out.ScrapeTimeout = 5 * time.Second
	}
	if out.TopLagKeys == 0 {
		out.TopLagKeys = 10
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out
}

func (o *Options) validate() error {
	switch {
	case o.MaxQueues < 1:
		return fmt.Errorf("metrics: Options.MaxQueues %d must be positive", o.MaxQueues)
	case o.MaxScrapeQueues < 1 || o.MaxScrapeQueues > runqueue.MaxInspectVariants:
		return fmt.Errorf("metrics: Options.MaxScrapeQueues %d is outside 1..%d", o.MaxScrapeQueues, runqueue.MaxInspectVariants)
	case o.ScrapeTimeout < 0:
		return fmt.Errorf("metrics: Options.ScrapeTimeout %s must not be negative", o.ScrapeTimeout)
	case o.TopLagKeys > 1000:
		return fmt.Errorf("metrics: Options.TopLagKeys %d is above 1000", o.TopLagKeys)
	}
	// prometheus checks buckets and an le label only when a histogram
	// gets its first series: at an observation, on the Queue's caller.
	if err := checkBuckets("WaitBuckets", o.WaitBuckets); err != nil {
		return err
	}
	if err := checkBuckets("HandlerBuckets", o.HandlerBuckets); err != nil {
		return err
	}
	for name := range o.ConstLabels {
		if slices.Contains(ownLabels, name) {
			return fmt.Errorf("metrics: Options.ConstLabels uses %q, a label of the metrics", name)
		}
	}
	// A name runqueue refuses would fail every scrape at that queue.
	for i, r := range o.Queues {
		if err := r.Validate(); err != nil {
			return fmt.Errorf("metrics: Options.Queues[%d] %q/%q: %w", i, r.Env, r.Queue, err)
		}
	}
	return nil
}

// ownLabels are the label names of the metrics (le: the histograms').
var ownLabels = []string{"env", "queue", "outcome", "rank", "key", "le"}

// checkBuckets refuses what prometheus would panic on, or mis-bin (NaN).
func checkBuckets(field string, b []float64) error {
	if len(b) == 0 { // (nil was made the default)
		return fmt.Errorf("metrics: Options.%s is empty (nil means the default)", field)
	}
	for i, v := range b {
		if math.IsNaN(v) || i > 0 && !(v > b[i-1]) {
			return fmt.Errorf("metrics: Options.%s %v are not strictly increasing", field, b)
		}
	}
	return nil
}

// Collector is a prometheus.Collector and a runqueue.Observer: set it as
// Config.Observer of the Queue it counts, register it, and Watch the Queue
// for the gauges read from Redis. It is safe for concurrent use.
type Collector struct {
	opts Options

	enqueued, dequeued, acked, nacked, dead, expired, recovered *prometheus.CounterVec
	wait, handler                                               *prometheus.HistogramVec

	mu     sync.RWMutex
	byPair map[pair]*series
	other  *series
	full   atomic.Bool // byPair holds MaxQueues pairs

	queue atomic.Pointer[runqueue.Queue]
	scr   *scraper
}

type pair struct{ env, queue string }

// series are one env/queue pair's counters, resolved once.
type series struct {
	env, queue                                                  string
	enqueued, dequeued, acked, nacked, dead, expired, recovered prometheus.Counter
	wait                                                        prometheus.Observer
	// held is set when runs of the pair were dequeued or dead-lettered
	// since the last discovering scrape: such a queue may hold runs in
	// flight or dead and no queued run, which discovery would not find.
	held atomic.Bool
}

// hold marks s for the next discovering scrape (held).
func (s *series) hold() {
	if !s.held.Load() {
		s.held.Store(true)
	}
}

// heldQueues returns the pairs marked held since the last call and clears
// their marks ("other" is no queue: left out).
func (c *Collector) heldQueues() []runqueue.QueueRef {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []runqueue.QueueRef
	for k, s := range c.byPair {
		if s.held.Load() && s.held.CompareAndSwap(true, false) {
			out = append(out, runqueue.QueueRef{Env: k.env, Queue: k.queue})
		}
	}
	slices.SortFunc(out, func(a, b runqueue.QueueRef) int {
		return cmp.Or(strings.Compare(a.Env, b.Env), strings.Compare(a.Queue, b.Queue))
	})
	return out
}

var _ runqueue.Observer = (*Collector)(nil)
var _ prometheus.Collector = (*Collector)(nil)

// New returns a Collector. opts may be nil for defaults.
func New(opts *Options) (*Collector, error) {
	o := opts.withDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	// A queue listed twice is read once: its gauges sent twice would fail
	// the whole Gather. (o.Queues is New's copy.)
	seen := map[runqueue.QueueRef]bool{}
	o.Queues = slices.DeleteFunc(o.Queues, func(r runqueue.QueueRef) bool {
		dup := seen[r]
		seen[r] = true
		return dup
	})
	c := &Collector{opts: o, byPair: map[pair]*series{}}
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: o.Namespace, Name: name, Help: help,
			ConstLabels: o.ConstLabels}, []string{"env", "queue"})
	}
	c.enqueued = counter("runs_enqueued_total", "Runs newly queued by Enqueue and EnqueueMany (idempotent retries not counted).")
	c.dequeued = counter("runs_dequeued_total", "Runs delivered by any dequeue call.")
	c.acked = counter("runs_acked_total", "Runs acked (runs gone already not counted).")
	c.nacked = counter("runs_nacked_total", "Runs given back by Nack, requeued or dead-lettered.")
	c.dead = counter("runs_dead_lettered_total", "Runs moved to the dead letter, by Nack or by lease recovery.")
	c.expired = counter("runs_expired_total", "Queued runs removed by ExpireTTL after their TTL passed.")
	c.recovered = counter("runs_recovered_total", "Runs taken back by RecoverLeases after their lease passed (requeued or dead-lettered).")
	c.wait = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: o.Namespace, Name: "run_wait_seconds",
		Help:        "Time from a run's available time (enqueue plus delay, or retry time) to its delivery.",
		ConstLabels: o.ConstLabels, Buckets: o.WaitBuckets}, []string{"env", "queue"})
	c.handler = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: o.Namespace, Name: "handler_duration_seconds",
		Help:        "Time a worker's handler ran, by outcome (ack, retry, dead, panic, lease_lost).",
		ConstLabels: o.ConstLabels, Buckets: o.HandlerBuckets}, []string{"env", "queue", "outcome"})
	c.scr = newScraper(&c.opts, c.heldQueues)
	// Refuse here what Register would (an invalid namespace or label
	// name), not once the Queue already reports to c.
	if err := prometheus.NewRegistry().Register(c); err != nil {
		return nil, fmt.Errorf("metrics: Options refused by prometheus: %w", err)
	}
	return c, nil
}

// Watch gives the Collector the Queue whose queues each scrape reads
// (ready, delayed, in flight, dead, oldest ready age and the scheduler's
// lags). Until then a scrape reports only what was observed.
func (c *Collector) Watch(q *runqueue.Queue) { c.queue.Store(q) }

// series returns the counters of env/queue, or those of "other" past
// MaxQueues. The fast path takes a read lock and allocates nothing.
func (c *Collector) series(env, queue string) *series {
	k := pair{env, queue}
	c.mu.RLock()
	s := c.byPair[k]
	c.mu.RUnlock()
	if s != nil {
		return s
	}
	if c.full.Load() {
		return c.otherSeries()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if s = c.byPair[k]; s != nil {
		return s
	}
	if len(c.byPair) >= c.opts.MaxQueues {
		c.full.Store(true)
		return c.otherLocked()
	}
	s = c.newSeries(env, queue)
	c.byPair[k] = s
	return s
}

func (c *Collector) otherSeries() *series {
	c.mu.RLock()
	s := c.other
	c.mu.RUnlock()
	if s != nil {
		return s
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.otherLocked()
}

func (c *Collector) otherLocked() *series {
	if c.other == nil {
		c.other = c.newSeries(Other, Other)
	}
	return c.other
}

// newSeries creates every counter of a pair at zero, so that rates start
// from its first observation.
func (c *Collector) newSeries(env, queue string) *series {
	return &series{env: env, queue: queue,
		enqueued: c.enqueued.WithLabelValues(env, queue), dequeued: c.dequeued.WithLabelValues(env, queue),
		acked: c.acked.WithLabelValues(env, queue), nacked: c.nacked.WithLabelValues(env, queue),
		dead: c.dead.WithLabelValues(env, queue), expired: c.expired.WithLabelValues(env, queue),
		recovered: c.recovered.WithLabelValues(env, queue), wait: c.wait.WithLabelValues(env, queue)}
}

// Enqueued implements runqueue.Observer.
func (c *Collector) Enqueued(env, queue string, n int) { c.series(env, queue).enqueued.Add(float64(n)) }

// Dequeued implements runqueue.Observer: each run counts once and its wait
// (now minus AvailableAt, 0 when negative) goes to the histogram.
func (c *Collector) Dequeued(runs []*runqueue.Run, now time.Time) {
	var s *series
	for _, r := range runs {
		if s == nil || s.env != r.Env || s.queue != r.Queue {
			s = c.series(r.Env, r.Queue)
		}
		s.dequeued.Inc()
		s.wait.Observe(max(0, now.Sub(r.AvailableAt).Seconds()))
		s.hold()
	}
}

// Acked implements runqueue.Observer.
func (c *Collector) Acked(env, queue string, n int) { c.series(env, queue).acked.Add(float64(n)) }

// Nacked implements runqueue.Observer: every nack counts, and a nack that
// dead-lettered counts as dead-lettered too.
func (c *Collector) Nacked(env, queue string, requeued bool) {
	s := c.series(env, queue)
	s.nacked.Inc()
	if !requeued {
		s.dead.Inc()
		s.hold()
	}
}

// Expired implements runqueue.Observer.
func (c *Collector) Expired(env, queue string, n int) { c.series(env, queue).expired.Add(float64(n)) }

// Recovered implements runqueue.Observer: n runs recovered, dead of them
// dead-lettered.
func (c *Collector) Recovered(env, queue string, n, dead int) {
	s := c.series(env, queue)
	s.recovered.Add(float64(n))
	if dead > 0 {
		s.dead.Add(float64(dead))
		s.hold()
	}
}

// Handled implements runqueue.Observer. An outcome this package does not
// know is labelled "other", so the label stays bounded.
func (c *Collector) Handled(env, queue string, d time.Duration, outcome runqueue.Outcome) {
	s := c.series(env, queue)
	o := string(outcome)
	switch outcome {
	case runqueue.OutcomeAck, runqueue.OutcomeRetry, runqueue.OutcomeDead, runqueue.OutcomePanic,
		runqueue.OutcomeLeaseLost:
	default:
		o = Other
	}
	c.handler.WithLabelValues(s.env, s.queue, o).Observe(max(0, d.Seconds()))
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, v := range c.vecs() {
		v.Describe(ch)
	}
	ch <- c.scr.tracked
	c.scr.describe(ch)
}

// Collect implements prometheus.Collector: the observed counters and
// histograms, then, once a Queue is watched, what one bounded scrape of
// Redis reads. A failed scrape is logged and counted
// (runqueue_scrape_errors_total, runqueue_scrape_success 0); it never
// fails the whole collection.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, v := range c.vecs() {
		v.Collect(ch)
	}
	c.mu.RLock()
	n := len(c.byPair)
	c.mu.RUnlock()
	ch <- prometheus.MustNewConstMetric(c.scr.tracked, prometheus.GaugeValue, float64(n))
	if q := c.queue.Load(); q != nil {
		c.scr.collect(q, ch)
	}
}

func (c *Collector) vecs() []prometheus.Collector {
	return []prometheus.Collector{c.enqueued, c.dequeued, c.acked, c.nacked, c.dead, c.expired, c.recovered,
		c.wait, c.handler}
}

// errScrapeTimeout wraps a scrape that ran out of Options.ScrapeTimeout.
var errScrapeTimeout = errors.New("metrics: scrape timed out")

// rankLabels are the rank label values "1".."K".
func rankLabels(k int) []string {
	out := make([]string, max(k, 0))
	for i := range out {
		out[i] = strconv.Itoa(i + 1)
	}
	return out
}
