package runqueue_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// TestS21EmptyPollStartsNoState: with the flag on, a dequeue of a queue
// that has no scheduler state and nothing ready (never used, only delayed
// work not yet due, or idle past StateTTL) writes nothing at all, as with
// the flag off; the first work that becomes ready starts the state and is
// served as before.
func TestS21EmptyPollStartsNoState(t *testing.T) {
	s16EachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := s17Setup(t, c, true, nil)
		before := s17AllKeys(t, c, b.prefix)
		requireUnwritten := func(what string) {
			t.Helper()
			require.Equal(t, before, s17AllKeys(t, c, b.prefix), "%s wrote", what)
		}

		// Never used: polls with and without a batch leave every key as it was.
		require.Empty(t, dequeue(t, b, queueName, 1))
		require.Empty(t, dequeue(t, b, queueName, 10))
		requireUnwritten("a poll of a queue never used")

		// Only delayed work, not yet due: still nothing to serve, no state.
		enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "later", Delay: time.Minute})
		before = s17AllKeys(t, c, b.prefix)
		require.Empty(t, dequeue(t, b, queueName, 10))
		requireUnwritten("a poll of a queue whose only run is not due")
		require.False(t, s18SchedOf(t, b, env, queueName).exists)

		// Due: promoted, registered and served; the state now exists.
		b.clock.Advance(time.Minute)
		runs := dequeue(t, b, queueName, 10)
		require.Equal(t, []string{"later"}, runIDs(runs))
		ackAll(t, b, runs)
		require.True(t, s18SchedOf(t, b, env, queueName).exists)

		// The state lost (as after StateTTL) on an empty queue: a poll does
		// not start it again; new work is served as from a fresh state.
		s21rDropState(t, b, queueName)
		before = s17AllKeys(t, c, b.prefix)
		require.Empty(t, dequeue(t, b, queueName, 10))
		requireUnwritten("a poll of an empty queue whose state expired")
		enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "1"})
		enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: "2"})
		runs = dequeue(t, b, queueName, 10)
		require.ElementsMatch(t, []string{"1", "2"}, runIDs(runs))
		require.True(t, s18SchedOf(t, b, env, queueName).exists)
	})
}

// TestS21EmptyPollFindsFlagOffWork: work a flag-off instance queued, with
// no scheduler state, is still found and served by the first flag-on
// dequeue (the state starts then).
func TestS21EmptyPollFindsFlagOffWork(t *testing.T) {
	s16EachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := s17Setup(t, c, true, nil)
		off, err := runqueue.New(b.ctx, c, &runqueue.Config{Prefix: b.prefix, Clock: b.clock, SerialCalls: true})
		require.NoError(t, err)
		t.Cleanup(func() { _ = off.Close() })
		ok, err := off.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: "a", ID: "1"})
		require.NoError(t, err)
		require.True(t, ok)
		require.False(t, s18SchedOf(t, b, env, queueName).exists)
		runs := dequeue(t, b, queueName, 1)
		require.Equal(t, []string{"1"}, runIDs(runs))
		require.True(t, s18SchedOf(t, b, env, queueName).exists)
	})
}
