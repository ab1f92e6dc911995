package metrics_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
	"github.com/runqueue/runqueue/runqueue/metrics"
)

// TestMetricsEndpoint serves a Collector over HTTP as an application would
// and reads /metrics after a little fair-scheduled work; go test -v shows
// the page.
func TestMetricsEndpoint(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, client redis.UniversalClient) {
		b := setup(t, client, metrics.Options{TopLagKeys: 3}, func(cfg *runqueue.Config) {
			cfg.VtimeScheduling = true
			cfg.MaxAttempts = 2
		})
		require.NoError(t, b.q.SetWeight(b.ctx, "env", "emails", "light", 0.25))
		for _, key := range []string{"heavy", "light", "other"} {
			for i := range 4 {
				b.enqueue(t, runqueue.EnqueueParams{Queue: "emails", Key: key, ID: fmt.Sprintf("%s-%d", key, i)})
			}
		}
		b.enqueue(t, runqueue.EnqueueParams{Queue: "reports", ID: "r1", Delay: time.Minute})
		b.clock.Advance(1500 * time.Millisecond)
		runs := b.dequeue(t, "emails", 6)
		require.NoError(t, b.q.Ack(b.ctx, runs[0]))
		b.c.Handled("env", "emails", 120*time.Millisecond, runqueue.OutcomeAck)
		_, err := b.q.Nack(b.ctx, runs[1], nil)
		require.NoError(t, err)
		b.c.Handled("env", "emails", 40*time.Millisecond, runqueue.OutcomeRetry)

		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(b.c)
		srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		defer srv.Close()
		resp, err := http.Get(srv.URL + "/metrics")
		require.NoError(t, err)
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		page := string(body)
		for _, line := range []string{
			`runqueue_runs_enqueued_total{env="env",queue="emails"} 12`,
			`runqueue_runs_dequeued_total{env="env",queue="emails"} 6`,
			`runqueue_queue_ready_runs{env="env",queue="emails"} 6`,
			`runqueue_queue_in_flight_runs{env="env",queue="emails"} 4`,
			`runqueue_queue_delayed_runs{env="env",queue="reports"} 1`,
			`runqueue_scheduler_top_lag_quanta{env="env",queue="emails",rank="3"}`,
			`runqueue_scrape_success 1`,
		} {
			require.Contains(t, page, line)
		}
		t.Logf("GET /metrics:\n%s", page)
	})
}
