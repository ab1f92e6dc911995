package metrics_test

import (
	"context"
	"log"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/runqueue"
	"github.com/runqueue/runqueue/runqueue/metrics"
)

// A Collector is the Queue's Observer, watches the Queue for the gauges,
// and is registered like any other collector.
func Example() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})

	c, err := metrics.New(&metrics.Options{
		MaxQueues:  200, // env/queue pairs with counters of their own
		TopLagKeys: 5,   // lag series per scraped queue
	})
	if err != nil {
		log.Fatal(err)
	}
	q, err := runqueue.New(ctx, rdb, &runqueue.Config{VtimeScheduling: true, Observer: c})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = q.Close() }()
	c.Watch(q)

	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	log.Fatal(http.ListenAndServe(":9100", nil))
}
