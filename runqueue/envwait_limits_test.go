package runqueue_test

import (
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// The env's waiting line where LimitsFor gives an env's queues different
// env limits (layout 9: each mark keeps its queue's limit; helper-219's F1
// and F2, found at layout 8). Flag on, polls of 30 s (a mark lives 61 s):
// every wait below ends long before a poll could bring anything.

// ewLimitsSetup is ewSetup with an env limit per queue (h219Setup's,
// flag on).
func ewLimitsSetup(t *testing.T, c redis.UniversalClient, limits map[string]int) *testBundle {
	return h219Setup(t, c, true, &h219Limits{env: limits})
}

// ewMarkEach marks queues w00 ... w(n-1) of env: one run each, a call the
// env holds back (it is at the queues' limits).
func ewMarkEach(t *testing.T, b *testBundle, n int) {
	t.Helper()
	for i := range n {
		q := fmt.Sprintf("w%02d", i)
		ewEnqueue(t, b, q, 1)
		require.Empty(t, ewTake(t, b, nil, q))
		require.True(t, ewMarked(t, b, q), "%s waits in the line", q)
	}
}

// ewPlace is queue's place in its env's line.
func ewPlace(t *testing.T, b *testBundle, queue string) float64 {
	t.Helper()
	p, err := b.client.ZScore(b.ctx, ewSpace(t, b).Env(env).Waiting(), keys.QueueMember(env, queue)).Result()
	require.NoError(t, err, "%s waits in the line", queue)
	return p
}

// TestEnvWaitingLowerLimitKeepsNoSlot: qa's env limit 1, qb's 2. qa holds
// one run; its next call is held by its own limit and marks qa (limit 1
// kept in the mark). qb's call finds one slot it could use: qa's mark,
// whose limit leaves it none, keeps its place but no slot, and qb takes
// it (layout 8 left the slot to qa: qb served nothing while qa's mark
// lived). Preview agrees with the call.
func TestEnvWaitingLowerLimitKeepsNoSlot(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := ewLimitsSetup(t, c, map[string]int{"qa": 1, "qb": 2})
		ewEnqueue(t, b, "qa", 2)
		ewEnqueue(t, b, "qb", 2)
		require.Len(t, ewTake(t, b, nil, "qa"), 1)
		require.Empty(t, ewTake(t, b, nil, "qa"), "qa is at its env limit")
		place := ewPlace(t, b, "qa")
		_, lim, err := ewMarkOf(b, ewSpace(t, b), "qa")
		require.NoError(t, err)
		require.EqualValues(t, 1, lim, "the mark keeps qa's env limit")

		p, err := b.q.Preview(b.ctx, env, "qb", 2)
		require.NoError(t, err)
		require.Len(t, p, 1, "Preview: one slot is qb's")
		got, _, err := b.q.AckAndDequeue(b.ctx, nil, env, "qb", 2)
		require.NoError(t, err)
		require.Len(t, got, 1, "qb takes the slot qa's limit leaves it no use of")
		require.Equal(t, place, ewPlace(t, b, "qa"), "qa keeps its place")
	})
}

// TestEnvWaitingLowestLimitLeavesItsSlot: qa's env limit 2, qb's 3. qb
// holds two runs, qa's call is held by the env and marks qa; an ack of
// one of qb's frees a slot (count 1). qb's next call may not take it: qa's slot is
// usable only while the count stays below qa's limit, 2, so a serve of qb
// would fill it (layout 8 let qb take one, and qa's call then found the
// count at its limit). qa takes the slot, then qb the env's last one.
func TestEnvWaitingLowestLimitLeavesItsSlot(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := ewLimitsSetup(t, c, map[string]int{"qa": 2, "qb": 3})
		ewEnqueue(t, b, "qa", 1)
		ewEnqueue(t, b, "qb", 4)
		held, err := b.q.Dequeue(b.ctx, env, "qb", 2)
		require.NoError(t, err)
		require.Len(t, held, 2)
		require.Empty(t, ewTake(t, b, nil, "qa"), "the env is at qa's limit")
		ewPlace(t, b, "qa")

		require.NoError(t, b.q.Ack(b.ctx, held[0]))
		p, err := b.q.Preview(b.ctx, env, "qb", 2)
		require.NoError(t, err)
		require.Empty(t, p, "Preview: qb's free slots are qa's")
		got, _, err := b.q.AckAndDequeue(b.ctx, nil, env, "qb", 2)
		require.NoError(t, err)
		require.Empty(t, got, "qb leaves qa the slot the ack freed")
		require.Len(t, ewTake(t, b, nil, "qa"), 1, "qa takes it")
		got, _, err = b.q.AckAndDequeue(b.ctx, nil, env, "qb", 2)
		require.NoError(t, err)
		require.Len(t, got, 1, "qb takes the env's last slot (3)")
	})
}

// TestEnvWaitingReleaseWakesByOwnLimit: qa's env limit 1, qb's 3. qa holds
// one run, qb two: the env is at qb's limit, and qb's Worker waits in the
// line. qa's plain Ack frees a slot its own limit leaves it no use of (2
// in flight, qa's limit 1): it still wakes qb, whose limit does (layout 8
// counted the slots by qa's limit and woke nobody: qb waited its poll).
func TestEnvWaitingReleaseWakesByOwnLimit(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b, a, served := ewQbWaitsAtItsLimit(t, c)
		require.NoError(t, b.q.Ack(b.ctx, a[0]))
		ewWithin(t, served, "qb after qa's ack")
	})
}

// ewQbWaitsAtItsLimit: qa's env limit 1, qb's 3; qa holds one run (a), qb
// two (the env at qb's limit), and qb's Worker, whose handler reports its
// runs on served, waits in the line.
func ewQbWaitsAtItsLimit(t *testing.T, c redis.UniversalClient) (b *testBundle, a []*runqueue.Run, served chan string) {
	t.Helper()
	b = ewLimitsSetup(t, c, map[string]int{"qa": 1, "qb": 3})
	ewEnqueue(t, b, "qa", 1)
	ewEnqueue(t, b, "qb", 3)
	a = ewTake(t, b, nil, "qa")
	require.Len(t, a, 1)
	held, err := b.q.Dequeue(b.ctx, env, "qb", 2)
	require.NoError(t, err)
	require.Len(t, held, 2)
	served = make(chan string, 4)
	startWorker(t, b.q, ewServed(served), ewOver("qb"))
	ewWaits(t, b, "qb")
	return b, a, served
}
