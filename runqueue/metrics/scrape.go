package metrics

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/runqueue/runqueue/runqueue"
)

// scraper reads the gauges of a bounded set of queues from Redis at each
// collection.
type scraper struct {
	opts  *Options
	ranks []string

	ready, delayed, inflight, dead, age, lag *prometheus.Desc
	duration, success, read, skipped         *prometheus.Desc
	tracked                                  *prometheus.Desc // the Collector's, declared here with the others
	errors                                   prometheus.Counter

	// cur is the scrape in progress (mu), which concurrent collections
	// (two Prometheus servers, say) share rather than each reading Redis:
	// one scrape at a time, and a collection that finds one running waits
	// for its result only until its own deadline.
	mu  sync.Mutex
	cur *flight
	// known are the queues the last discovering scrape read (only the
	// scrape in progress touches it): a queue stays in the list while it
	// holds runs in flight or dead, after its last queued run left the
	// shard master.
	known []runqueue.QueueRef
	// held returns the queues whose runs the Collector saw dequeued or
	// dead-lettered since the last discovering scrape (and clears them).
	held func() []runqueue.QueueRef
}

func newScraper(o *Options, held func() []runqueue.QueueRef) *scraper {
	name := func(n string) string { return prometheus.BuildFQName(o.Namespace, "", n) }
	desc := func(n, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name(n), help, labels, o.ConstLabels)
	}
	lagLabels := []string{"env", "queue", "rank"}
	if o.LagKeyLabel {
		lagLabels = append(lagLabels, "key")
	}
	return &scraper{
		opts:  o,
		held:  held,
		ranks: rankLabels(o.TopLagKeys),
		ready: desc("queue_ready_runs", "Runs queued and ready (read from Redis at scrape).", "env", "queue"),
		delayed: desc("queue_delayed_runs",
			"Runs queued with a future available time, or due and not yet promoted by a dequeue (read from Redis at scrape).", "env", "queue"),
		inflight: desc("queue_in_flight_runs", "Runs dequeued and not yet acked, nacked or recovered (read from Redis at scrape).", "env", "queue"),
		dead:     desc("queue_dead_runs", "Runs in the dead letter (read from Redis at scrape).", "env", "queue"),
		age: desc("queue_oldest_ready_age_seconds",
			"Now minus the available time of the ready run first in age order, or of the earliest delayed run when it is due; 0 when none is ready or due.", "env", "queue"),
		lag: desc("scheduler_top_lag_quanta",
			"The largest per-key lags (tag minus the queue's virtual clock, in quanta) of the fair scheduler, rank 1 largest.",
			lagLabels...),
		duration: desc("scrape_duration_seconds",
			"Time the last scrape took reading Redis (a collection that shared a scrape in progress reports that scrape's; one that gave up waiting for it, its wait)."),
		success: desc("scrape_success", "1 when the last scrape read every queue it meant to, 0 when it failed."),
		read:    desc("scrape_queues", "Queues whose gauges the last scrape read."),
		skipped: desc("scrape_queues_skipped",
			"Queues holding queued runs that the last scrape did not read (past MaxScrapeQueues)."),
		tracked: desc("observed_queues",
			"Env/queue pairs with counters of their own; at MaxQueues, later pairs are counted as env=\"other\", queue=\"other\"."),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: o.Namespace, Name: "scrape_errors_total",
			Help: "Scrapes of Redis that failed (Redis unreachable, timeout); see the log.", ConstLabels: o.ConstLabels}),
	}
}

func (s *scraper) describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{s.ready, s.delayed, s.inflight, s.dead, s.age, s.lag, s.duration, s.success,
		s.read, s.skipped} {
		ch <- d
	}
	s.errors.Describe(ch)
}

// flight is one scrape and the metrics it produced, for every collection
// that shares it.
type flight struct {
	done     chan struct{} // closed when metrics is set (nil: the scrape panicked)
	deadline time.Time     // the scrape's ScrapeTimeout
	metrics  []prometheus.Metric
}

// shareGrace is how long past the scrape's own deadline a collection that
// shares it waits for it: a scrape that times out still needs a moment to
// see the timeout and report what it read (else collections that started
// with it would give up first and report nothing).
const shareGrace = 250 * time.Millisecond

func (s *scraper) collect(q *runqueue.Queue, ch chan<- prometheus.Metric) {
	start := time.Now()
	s.mu.Lock()
	f := s.cur
	if f == nil {
		f = &flight{done: make(chan struct{}), deadline: start.Add(s.opts.ScrapeTimeout)}
		s.cur = f
		s.mu.Unlock()
		s.run(f, q, start)
	} else {
		s.mu.Unlock()
		// At most ScrapeTimeout from now, or the scrape's deadline and a
		// grace when later: with Redis hung, K collections end within
		// about one ScrapeTimeout, not K of them. (A give-up is logged at
		// Debug: the scrape logs its own failure.)
		t := time.NewTimer(max(s.opts.ScrapeTimeout, time.Until(f.deadline.Add(shareGrace))))
		select {
		case <-f.done:
			t.Stop()
		case <-t.C:
			err := fmt.Errorf("%w after %s: waiting for the scrape in progress", errScrapeTimeout, s.opts.ScrapeTimeout)
			s.opts.Logger.Debug("runqueue metrics: gave up waiting for the scrape in progress", "err", err)
			for _, m := range s.status(start, err, 0, 0) {
				ch <- m
			}
			s.errors.Collect(ch)
			return
		}
	}
	ms := f.metrics
	if ms == nil {
		ms = s.status(start, errors.New("the scrape in progress panicked"), 0, 0)
	}
	for _, m := range ms {
		ch <- m
	}
	s.errors.Collect(ch)
}

// run makes the scrape of flight f and ends it, whatever happens.
func (s *scraper) run(f *flight, q *runqueue.Queue, start time.Time) {
	defer func() {
		s.mu.Lock()
		s.cur = nil
		s.mu.Unlock()
		close(f.done)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.ScrapeTimeout)
	defer cancel()
	var ms []prometheus.Metric
	read, skipped, err := s.scrape(ctx, q, &ms)
	if err != nil {
		// go-redis reports a deadline as a context error or, with
		// ContextTimeoutEnabled, as an i/o timeout of the connection, which
		// may fire a moment before the context's own timer.
		if deadline, _ := ctx.Deadline(); ctx.Err() != nil || !time.Now().Before(deadline) {
			err = fmt.Errorf("%w after %s: %w", errScrapeTimeout, s.opts.ScrapeTimeout, err)
		}
		s.errors.Inc()
		s.opts.Logger.Warn("runqueue metrics: scrape of Redis failed", "err", err, "queues_read", read)
	}
	ms = append(ms, s.status(start, err, read, skipped)...)
	f.metrics = ms
}

// status is the scrape's own gauges.
func (s *scraper) status(start time.Time, err error, read, skipped int) []prometheus.Metric {
	ok := 1.0
	if err != nil {
		ok = 0
	}
	gauge := func(d *prometheus.Desc, v float64) prometheus.Metric {
		return prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	return []prometheus.Metric{gauge(s.duration, time.Since(start).Seconds()), gauge(s.success, ok),
		gauge(s.read, float64(read)), gauge(s.skipped, float64(skipped))}
}

// scrape sends the gauges of every queue of this scrape's list, and
// returns how many queues it read and how many queues with queued runs it
// left out. It stops at the first error: what follows would most likely
// fail the same way (Redis down) and each failure could take the whole
// timeout.
func (s *scraper) scrape(ctx context.Context, q *runqueue.Queue, ms *[]prometheus.Metric) (read, skipped int, err error) {
	list, total, discovering, err := s.list(ctx, q)
	if err != nil {
		return 0, 0, err
	}
	lags := len(s.ranks) > 0 && q.Config().VtimeScheduling
	active := 0
	var keep []runqueue.QueueRef
	for _, ref := range list {
		st, err := q.QueueStats(ctx, ref.Env, ref.Queue)
		if err != nil {
			return read, 0, fmt.Errorf("queue %s/%s: %w", ref.Env, ref.Queue, err)
		}
		gauge := func(d *prometheus.Desc, v float64) {
			*ms = append(*ms, prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, ref.Env, ref.Queue))
		}
		gauge(s.ready, float64(st.Ready))
		gauge(s.delayed, float64(st.Delayed))
		gauge(s.inflight, float64(st.InFlight))
		gauge(s.dead, float64(st.Dead))
		gauge(s.age, st.OldestReadyAge.Seconds())
		read++
		if st.Ready+st.Delayed > 0 {
			active++
		}
		if st != (runqueue.Stats{}) {
			keep = append(keep, ref)
		}
		if lags {
			if err := s.lags(ctx, q, ref, ms); err != nil {
				return read, 0, err
			}
		}
	}
	if discovering {
		// A queue read empty is reported at zero once, then forgotten.
		s.known = keep
		skipped = max(0, int(total)-active)
	}
	return read, skipped, nil
}

// list returns the queues of this scrape: Options.Queues, or else the
// queues holding queued runs (up to MaxScrapeQueues) and, in the room left,
// those of the last scrape that still hold runs in flight or dead, then
// those whose runs this Collector, as the Observer, saw dequeued or
// dead-lettered since the last scrape (a queue whose runs all died, or are
// all in flight, between two scrapes holds no queued run to be found by).
func (s *scraper) list(ctx context.Context, q *runqueue.Queue) (refs []runqueue.QueueRef, total int64,
	discovering bool, err error) {
	if len(s.opts.Queues) > 0 {
		return s.opts.Queues, 0, false, nil
	}
	found, total, err := q.ActiveQueues(ctx, s.opts.MaxScrapeQueues)
	if err != nil {
		return nil, 0, true, fmt.Errorf("discovering queues: %w", err)
	}
	seen := make(map[runqueue.QueueRef]bool, len(found))
	for _, r := range found {
		seen[r] = true
	}
	for _, r := range slices.Concat(s.known, s.held()) {
		if len(found) >= s.opts.MaxScrapeQueues {
			break
		}
		if !seen[r] {
			seen[r] = true
			found = append(found, r)
		}
	}
	return found, total, true, nil
}

func (s *scraper) lags(ctx context.Context, q *runqueue.Queue, ref runqueue.QueueRef, ms *[]prometheus.Metric) error {
	top, err := q.TopLags(ctx, ref.Env, ref.Queue, len(s.ranks))
	if err != nil {
		return fmt.Errorf("lags of %s/%s: %w", ref.Env, ref.Queue, err)
	}
	for i, kl := range top {
		labels := []string{ref.Env, ref.Queue, s.ranks[i]}
		if s.opts.LagKeyLabel {
			labels = append(labels, kl.Key)
		}
		*ms = append(*ms, prometheus.MustNewConstMetric(s.lag, prometheus.GaugeValue, kl.Lag, labels...))
	}
	return nil
}
