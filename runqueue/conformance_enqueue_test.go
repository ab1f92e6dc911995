package runqueue_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// enqueueCases: what Enqueue and EnqueueMany store, accept and refuse.
func enqueueCases() []conformanceCase {
	return []conformanceCase{
		{name: "EnqueueDequeueRoundTrip", fn: func(t *testing.T, b *testBundle) {
			// Payloads are opaque bytes: zero bytes, invalid UTF-8 and an
			// empty payload come back unchanged; names with separator and
			// wildcard characters come back as given.
			payloads := map[string][]byte{
				"bin":   {0, 0xff, 0xfe, 'a', 0, 0x80, 0xc3, 0x28, 0},
				"empty": {},
				"big":   []byte(strings.Repeat("\x00\x01\xfe", 40000)),
			}
			key := "tenant:*{1}"
			for id, p := range payloads {
				enqueue(t, b, runqueue.EnqueueParams{Key: key, ID: "id:" + id + "*", Payload: p})
				b.clock.Advance(time.Millisecond)
			}
			runs := dequeue(t, b, queueName, 10)
			require.Len(t, runs, 3)
			for _, r := range runs {
				id := strings.TrimSuffix(strings.TrimPrefix(r.ID, "id:"), "*")
				require.Contains(t, payloads, id)
				require.Equal(t, payloads[id], r.Payload, "payload of %s", r.ID)
				require.Equal(t, env, r.Env)
				require.Equal(t, queueName, r.Queue)
				require.Equal(t, key, r.Key)
				require.Equal(t, 1, r.Attempt)
				require.Positive(t, r.Token)
				require.Equal(t, b.clock.Now().Add(b.q.Config().LeaseDuration).UnixMilli(), r.LeaseDeadline.UnixMilli())
			}
			require.Empty(t, dequeue(t, b, queueName, 10), "a run in flight is not served again")
			ackAll(t, b, runs)
		}},
		{name: "IdempotentEnqueue", fn: func(t *testing.T, b *testBundle) {
			p := runqueue.EnqueueParams{Env: env, Queue: queueName, Key: "k", ID: "a", Payload: []byte("body\x00")}
			enqueue(t, b, p)
			check := func(name string, p runqueue.EnqueueParams, wantErr error) {
				before := b.dump(t)
				ok, err := b.q.Enqueue(b.ctx, p)
				if wantErr == nil {
					require.NoError(t, err, name)
				} else {
					require.ErrorIs(t, err, wantErr, name)
				}
				require.False(t, ok, name)
				require.Equal(t, before, b.dump(t), "%s must not write", name)
			}
			other := p
			other.Payload = []byte("body\x01")
			otherKey := p
			otherKey.Key = "k2"
			noKey := p
			noKey.Key = ""
			// Priority, delay and TTL are not part of the body: a retry with
			// other scheduling is still the same run.
			resched := p
			resched.Priority, resched.Delay, resched.TTL = 5, time.Hour, time.Minute
			check("SameBody", p, nil)
			check("OtherScheduling", resched, nil)
			check("OtherPayload", other, runqueue.ErrConflict)
			check("OtherKey", otherKey, runqueue.ErrConflict)
			check("NoKey", noKey, runqueue.ErrConflict)

			// Still idempotent while the run is in flight.
			runs := dequeue(t, b, queueName, 10)
			require.Len(t, runs, 1)
			check("SameBodyInFlight", p, nil)
			check("OtherPayloadInFlight", other, runqueue.ErrConflict)

			// The id is unique per (env, queue) only.
			elsewhere := p
			elsewhere.Queue = "q2"
			enqueue(t, b, elsewhere)

			// Once acked, the id is free again.
			ackAll(t, b, runs)
			enqueue(t, b, other)
		}},
		{name: "AdmissionQueueDepth", mutate: func(c *runqueue.Config) { c.MaxQueueDepth = 2 }, fn: func(t *testing.T, b *testBundle) {
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "1"})
			// Delayed runs count towards the depth.
			enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: "2", Delay: time.Minute})
			before := b.dump(t)
			ok, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: "c", ID: "3"})
			require.ErrorIs(t, err, runqueue.ErrQueueFull)
			var full *runqueue.QueueFullError
			require.ErrorAs(t, err, &full)
			require.Equal(t, runqueue.QueueFullError{Scope: "queue", Limit: 2}, *full)
			require.False(t, ok)
			require.Equal(t, before, b.dump(t), "a refused run writes nothing")

			// A retry of an accepted run is a no-op, not a refusal.
			ok, err = b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: "a", ID: "1"})
			require.NoError(t, err)
			require.False(t, ok)

			// Another queue of the env has its own depth.
			enqueue(t, b, runqueue.EnqueueParams{Queue: "other", ID: "3"})

			// Runs in flight are not queued: a dequeue makes room.
			require.Len(t, dequeue(t, b, queueName, 1), 1)
			enqueue(t, b, runqueue.EnqueueParams{Key: "c", ID: "3"})
		}},
		{name: "AdmissionKeyDepth", mutate: func(c *runqueue.Config) { c.MaxKeyDepth = 1 }, fn: func(t *testing.T, b *testBundle) {
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "1", Delay: time.Second})
			before := b.dump(t)
			_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: "a", ID: "2"})
			require.ErrorIs(t, err, runqueue.ErrQueueFull)
			var full *runqueue.QueueFullError
			require.ErrorAs(t, err, &full)
			require.Equal(t, runqueue.QueueFullError{Scope: "key", Limit: 1}, *full)
			require.Equal(t, before, b.dump(t), "a refused run writes nothing")
			// Other keys, and runs without a key, have their own depth.
			enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: "2"})
			enqueue(t, b, runqueue.EnqueueParams{ID: "3"})
		}},
	}
}
