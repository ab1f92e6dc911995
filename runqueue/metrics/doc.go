// Package metrics exports a runqueue.Queue to Prometheus: what the Queue
// does (counters and histograms, fed by the Queue as its Observer) and what
// its queues hold (gauges read from Redis when Prometheus scrapes).
//
// # Use
//
//	c, err := metrics.New(&metrics.Options{MaxQueues: 200})
//	q, err := runqueue.New(ctx, rdb, &runqueue.Config{Observer: c})
//	c.Watch(q) // gauges read from Redis at each scrape
//	prometheus.MustRegister(c)
//	http.Handle("/metrics", promhttp.Handler())
//
// New checks its Options, so that what would fail later fails there:
// histogram buckets not strictly increasing (prometheus would panic at the
// first observation, on the Queue's caller), a queue of Options.Queues
// that runqueue refuses (QueueRef.Validate; the error wraps its
// *InvalidError), ConstLabels using a label of the metrics (env, queue,
// outcome, rank, key, le), and anything else Register refuses of this
// Collector on its own (New registers it once on a registry of its own; a
// clash with another collector's metrics shows only at Register). A queue
// listed twice in Options.Queues is read once. New keeps its own copies of
// the bucket and queue lists.
//
// The Queue reports each operation after its Redis call succeeded, on the
// caller's goroutine; the Collector only updates in-memory counters there
// (no I/O). Without Watch a scrape reports the counters and histograms
// only.
//
// # Metrics
//
// Names start with Options.Namespace ("runqueue"); every metric also carries
// Options.ConstLabels.
//
//	name                                    type       labels                  what
//	runqueue_runs_enqueued_total            counter    env, queue              runs newly queued (an idempotent retry counts 0)
//	runqueue_runs_dequeued_total            counter    env, queue              runs delivered, by any dequeue path
//	runqueue_runs_acked_total               counter    env, queue              runs acked (an ack of a run gone already counts 0)
//	runqueue_runs_nacked_total              counter    env, queue              Nack calls that requeued or dead-lettered a run
//	runqueue_runs_dead_lettered_total       counter    env, queue              runs dead-lettered by Nack or by lease recovery
//	runqueue_runs_expired_total             counter    env, queue              queued runs removed by ExpireTTL
//	runqueue_runs_recovered_total           counter    env, queue              runs taken back by RecoverLeases (requeued or dead-lettered)
//	runqueue_run_wait_seconds               histogram  env, queue              delivery time minus the run's AvailableAt
//	runqueue_handler_duration_seconds       histogram  env, queue, outcome     handler time (Observer.Handled); outcome ack, retry, dead, panic, lease_lost
//	runqueue_observed_queues                gauge      -                       env/queue pairs with counters of their own (at most MaxQueues)
//	runqueue_queue_ready_runs               gauge      env, queue              ready runs                         (scrape)
//	runqueue_queue_delayed_runs             gauge      env, queue              delayed runs, due ones not yet promoted included (scrape)
//	runqueue_queue_in_flight_runs           gauge      env, queue              runs in flight                     (scrape)
//	runqueue_queue_dead_runs                gauge      env, queue              dead-lettered runs                 (scrape)
//	runqueue_queue_oldest_ready_age_seconds gauge      env, queue              age of the ready run first in line, or of a due one (scrape; Stats.OldestReadyAge)
//	runqueue_scheduler_top_lag_quanta       gauge      env, queue, rank [,key] the K largest per-key lags         (scrape, flag on)
//	runqueue_scrape_duration_seconds        gauge      -                       time the last scrape took (shared, or the wait given up)
//	runqueue_scrape_success                 gauge      -                       1 when the last scrape read everything, else 0
//	runqueue_scrape_queues                  gauge      -                       queues the last scrape read
//	runqueue_scrape_queues_skipped          gauge      -                       queues with queued runs past MaxScrapeQueues
//	runqueue_scrape_errors_total            counter    -                       failed scrapes (also logged to Options.Logger)
//
// The scrape gauges are those of Queue.QueueStats; the lag is that of
// Queue.Schedule and Queue.TopLags (tag minus the queue's virtual clock, in
// quanta; positive: the key was served ahead of the others and waits).
// Counts that Redis holds (ready, in flight, dead) are gauges read at
// scrape, not derived from the counters, so they stay right across
// restarts and across processes sharing a Redis; the counters and
// histograms count what this process did, so sum them over instances.
//
// A nack that dead-letters a run counts in runs_nacked_total and in
// runs_dead_lettered_total; a lease recovery that dead-letters one counts
// in runs_recovered_total and in runs_dead_lettered_total. A call whose
// reply was lost (a timeout) reports nothing: what it does not learn it
// cannot report. An enqueue or ack repeated after such a loss finds its work
// done and counts nothing, so those counters can fall short of what
// happened; a Nack repeated with the same token answers what the first did
// and counts again.
//
// # Cardinality
//
// Every label is bounded by configuration, whatever the number of envs,
// queues and concurrency keys:
//
//   - counters and histograms: at most MaxQueues (default 100) env/queue
//     pairs, plus the pair env="other", queue="other" that counts all later
//     pairs. A pair keeps its series for the Collector's life. Per pair: 7
//     counters, a wait histogram (buckets + 3 series) and one handler
//     histogram per outcome seen (at most 5).
//   - scrape gauges: at most len(Queues), or MaxScrapeQueues (default 50)
//     discovered queues, each with 5 gauges and at most TopLagKeys (K,
//     default 10) lag series. The lag series are labelled by rank 1..K,
//     never one series per key; LagKeyLabel adds the key's name (still K
//     series per scrape, but each key that reaches the top leaves a series
//     in the time-series database's history).
//
// # Redis cost of a scrape
//
// A collection scrapes Redis once, from one goroutine, within
// Options.ScrapeTimeout (default 5s). One scrape runs at a time, and
// concurrent collections share it: a collection that finds a scrape in
// progress reads nothing itself and reports that scrape's gauges once it
// ends, so concurrent scrapers do not multiply the reads. It waits for
// that until ScrapeTimeout from its own start or, when later, a quarter
// second past the scrape's own deadline (a scrape that times out still
// reports the queues it read), so K concurrent collections each end
// within about ScrapeTimeout even with Redis hung; one that gives up
// waiting reports a failed scrape with no queue gauges. A scrape stops at the first error (the queues read so far are
// reported), logs it, counts it in runqueue_scrape_errors_total and
// reports runqueue_scrape_success 0. It never fails the collection, so
// the counters and histograms stay visible while Redis is down.
//
//   - discovery, only without Options.Queues: one pipeline of a ZCARD and
//     a ZRANGE (at most MaxScrapeQueues members) per shard's master ZSET
//     (Queue.ActiveQueues).
//   - per queue (Queue.QueueStats): one MULTI/EXEC of HMGET (depth), HLEN
//     and HEXISTS (held and its wide mark), ZCARD (dead), ZRANGE 0 0
//     (ckIndex head) and ZRANGE 0 0 WITHSCORES (delayIndex head); with a
//     ready run, a ZRANGE 0 0 of that key's ready set and an HGET of its
//     record: at most 3 round trips and 8 commands (MULTI and EXEC aside),
//     each O(1) or O(log n). When Redis, over maxmemory, refuses the
//     MULTI, the 6 reads go again in a plain pipeline: one round trip
//     more.
//   - per queue, with the fair scheduler on and K > 0: one pipeline of an
//     HMGET of the clock and its epoch and one ZREVRANGEBYSCORE ...
//     WITHSCORES LIMIT 0 K over the competing keys' tags (Queue.TopLags;
//     gated keys and the newcomer lane are not read): O(log n + K),
//     whatever the number of keys.
//
// So a scrape of N queues costs at most 1 + 4N round trips and
// 2*Shards + 10N commands (MULTI and EXEC aside; N round trips and 6N
// commands more over maxmemory). A discovered queue stays in the list
// while it holds runs in flight or dead, after its last queued run was
// served (so its in-flight gauge goes back to 0 rather than vanishing),
// and a queue whose runs the Collector (as the Observer) saw dequeued or
// dead-lettered since the last scrape joins it, even if it holds no queued
// run by then; queues that hold queued runs take the room first.
package metrics
