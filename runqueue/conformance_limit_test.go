package runqueue_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// limitCases: the env, queue and key concurrency limits and depth limits.
func limitCases() []conformanceCase {
	return []conformanceCase{
		{name: "EnvConcurrencyAcrossQueues", mutate: func(c *runqueue.Config) { c.EnvConcurrency = 3 }, fn: func(t *testing.T, b *testBundle) {
			for i := range 4 {
				enqueue(t, b, runqueue.EnqueueParams{Queue: "q1", ID: fmt.Sprint("a", i)})
				enqueue(t, b, runqueue.EnqueueParams{Queue: "q2", Key: "k", ID: fmt.Sprint("b", i)})
			}
			// Another env is not affected.
			enqueue(t, b, runqueue.EnqueueParams{Env: "other", ID: "x"})
			got1 := dequeue(t, b, "q1", 2)
			require.Len(t, got1, 2)
			got2 := dequeue(t, b, "q2", 10)
			require.Len(t, got2, 1, "the env limit counts both queues")
			require.Empty(t, dequeue(t, b, "q1", 10))
			require.Empty(t, dequeue(t, b, "q2", 10))
			runs, err := b.q.Dequeue(b.ctx, "other", queueName, 10)
			require.NoError(t, err)
			require.Len(t, runs, 1)

			es, err := b.q.EnvStats(b.ctx, env)
			require.NoError(t, err)
			require.Equal(t, int64(3), es.InFlight)

			// An ack frees one slot, a nack another.
			require.NoError(t, b.q.Ack(b.ctx, got1[0]))
			require.Len(t, dequeue(t, b, "q2", 10), 1)
			_, err = b.q.Nack(b.ctx, got1[1], &runqueue.NackOptions{RetryAt: b.clock.Now().Add(time.Hour)})
			require.NoError(t, err)
			require.Len(t, dequeue(t, b, "q1", 10), 1)
			require.Empty(t, dequeue(t, b, "q2", 10))
		}},
		{name: "QueueConcurrencyAcrossKeys", mutate: func(c *runqueue.Config) { c.QueueConcurrency = 2 }, fn: func(t *testing.T, b *testBundle) {
			for _, k := range []string{"a", "b", "c"} {
				for i := range 2 {
					enqueue(t, b, runqueue.EnqueueParams{Key: k, ID: fmt.Sprint(k, i)})
				}
			}
			enqueue(t, b, runqueue.EnqueueParams{Queue: "q2", ID: "other"})
			got := dequeue(t, b, queueName, 10)
			require.Equal(t, []string{"a0", "a1"}, runIDs(got))
			require.Empty(t, dequeue(t, b, queueName, 10))
			require.Len(t, dequeue(t, b, "q2", 10), 1, "the limit is per queue")
			require.NoError(t, b.q.Ack(b.ctx, got[0]))
			require.Equal(t, []string{"b0"}, runIDs(dequeue(t, b, queueName, 10)))
		}},
		{name: "KeyConcurrencyPerKey", mutate: func(c *runqueue.Config) { c.KeyConcurrency = 1 }, fn: func(t *testing.T, b *testBundle) {
			for i := range 3 {
				for _, k := range []string{"a", "b", ""} {
					enqueue(t, b, runqueue.EnqueueParams{Key: k, ID: fmt.Sprint(k, "-", i)})
					b.clock.Advance(time.Millisecond)
				}
			}
			got := dequeue(t, b, queueName, 10)
			require.Equal(t, []string{"a-0", "b-0", "-0"}, runIDs(got), "one per key, in age order")
			require.Empty(t, dequeue(t, b, queueName, 10))
			ks, err := b.q.KeyStats(b.ctx, env, queueName, "a")
			require.NoError(t, err)
			require.Equal(t, int64(1), ks.InFlight)
			require.Equal(t, int64(2), ks.Ready)
			require.NoError(t, b.q.Ack(b.ctx, got[1]))
			require.Equal(t, []string{"b-1"}, runIDs(dequeue(t, b, queueName, 10)))
		}},
		{name: "LimitsFor", mutate: func(c *runqueue.Config) {
			c.EnvConcurrency = 100
			c.LimitsFor = func(env, queue string) runqueue.Limits {
				if queue == "narrow" {
					return runqueue.Limits{Queue: 1}
				}
				return runqueue.Limits{}
			}
		}, fn: func(t *testing.T, b *testBundle) {
			for i := range 3 {
				enqueue(t, b, runqueue.EnqueueParams{Queue: "narrow", ID: string(rune('a' + i))})
				enqueue(t, b, runqueue.EnqueueParams{Queue: "wide", ID: string(rune('a' + i))})
			}
			require.Len(t, dequeue(t, b, "narrow", 10), 1)
			require.Len(t, dequeue(t, b, "wide", 10), 3)
		}},
	}
}
