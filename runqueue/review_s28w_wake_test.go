package runqueue_test

// Review s28w: an idle Worker (queue and shard sources) across a restart of
// a real redis-server without persistence.

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// TestS28WIdleWorkerWakesAfterRestart: a Worker, idle (IdlePollInterval
// 1 m, so only a wake-up brings it back soon), serves a queue and a whole
// shard. The server restarts with its data lost (scripts, functions and
// the pub/sub subscription go with it). A producer with a connection of
// its own then enqueues into the queue and into another queue of the
// shard. Expected: both runs are handled within a few seconds, not at the
// next idle poll a minute later.
func TestS28WIdleWorkerWakesAfterRestart(t *testing.T) {
	s17Flags(t, func(t *testing.T, on bool) {
		srv := s17Spawn(t)
		c := redis.NewClient(&redis.Options{Addr: srv.addr, ReadTimeout: 2 * time.Second})
		t.Cleanup(func() { _ = c.Close() })
		b, o := workerSetup(t, c, func(cfg *runqueue.Config) {
			cfg.VtimeScheduling = on
			cfg.Clock = nil
		})
		producer, err := runqueue.New(b.ctx, srv.admin(), &runqueue.Config{Prefix: b.prefix, VtimeScheduling: on})
		require.NoError(t, err)
		t.Cleanup(func() { _ = producer.Close() })
		const other = "env2"
		shard := b.q.ShardOf(other)
		if shard == b.q.ShardOf(env) {
			t.Skip("env and env2 share a shard")
		}
		handled := make(chan string, 10)
		startWorker(t, b.q, func(ctx context.Context, r *runqueue.Run) error {
			handled <- r.Env + "/" + r.ID
			return nil
		}, func(wc *runqueue.WorkerConfig) {
			wc.Shards = []int{shard}
			wc.IdlePollInterval = time.Minute
		})
		put := func(e, id string) {
			qn := "w" // a queue of the shard, which no Queues entry names
			if e == env {
				qn = queueName
			}
			ok, err := producer.Enqueue(b.ctx, runqueue.EnqueueParams{Env: e, Queue: qn, ID: id, Payload: []byte("x")})
			require.NoError(t, err)
			require.True(t, ok)
		}
		waitFor := func(want string, within time.Duration) {
			t.Helper()
			select {
			case got := <-handled:
				require.Equal(t, want, got)
			case <-time.After(within):
				t.Fatalf("%s was not handled within %v", want, within)
			}
		}
		put(env, "before")
		waitFor(env+"/before", 5*time.Second)
		o.until(t, runqueue.OutcomeAck, 1)
		time.Sleep(300 * time.Millisecond) // idle now

		srv.kill()
		srv.start()
		time.Sleep(1500 * time.Millisecond) // the listener reconnects
		began := time.Now()
		put(env, "after")
		waitFor(env+"/after", 5*time.Second)
		put(other, "shard-after")
		waitFor(other+"/shard-after", 5*time.Second)
		t.Logf("flag=%v: both handled %v after their enqueues", on, time.Since(began).Round(time.Millisecond))
	})
}
