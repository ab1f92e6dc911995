package runqueue_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"

	"github.com/runqueue/runqueue/runqueue"
)

// TestTokenNotDealtAgainByResentDequeue: a Dequeue that go-redis sends
// again after the master it first went to died reaches the replica that
// took over with its caller's time from before the failover. The replica
// never got the first send's writes: the run is ready there again and the
// shard's token counter is where it was. The tokens must not repeat all
// the same, or the holder of the first delivery (whose reply did reach it,
// or a delivery the dead master dealt to another caller at that time)
// could settle the new one: the counter is moved up to the server's clock
// too, not only to the time the call carries.
//
// The failover is played on one server: every key under the prefix is
// saved (DUMP) before the first Dequeue and put back (RESTORE) after it,
// 30 ms later by the server's clock, as the replica had them; the second
// Dequeue carries the first one's time (the instance's clock does not
// move). Before the fix both Dequeues dealt the run the same token, and
// the first holder's Ack removed the second holder's delivery (found in
// TestS19FFailover, forced: two tokens each dealt to two runs).
//
// On a real server and a cluster: miniredis's DUMP takes strings only.
func TestTokenNotDealtAgainByResentDequeue(t *testing.T) {
	servers := []backend{{Name: "Real", Client: redistest.Real}, {Name: "Cluster", Client: redistest.Cluster}}
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			redistest.ForEachBackend(t, servers, func(t *testing.T, c redis.UniversalClient) {
				tokenResendCase(t, setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = on }))
			})
		})
	}
}

// tokenResendCase plays the failover on b.
func tokenResendCase(t *testing.T, b *testBundle) {
	ctx := b.ctx
	// The instance's clock reads the server's: the token counter's
	// floor then comes from the call's time and the server's alike.
	s16SetClock(b.clock, time.Now())
	enqueue(t, b, runqueue.EnqueueParams{ID: "x", Payload: []byte("x")})

	saved := tokenResendDump(t, b)
	first := dequeue(t, b, queueName, 1) // the dead master's delivery
	require.Len(t, first, 1)

	time.Sleep(30 * time.Millisecond) // the failover, by the server's clock
	tokenResendRestore(t, b, saved)
	second := dequeue(t, b, queueName, 1) // the resent call, the same time
	require.Len(t, second, 1)
	require.Equal(t, "x", second[0].ID)
	t.Logf("first token %d, second token %d", first[0].Token, second[0].Token)
	require.NotEqual(t, first[0].Token, second[0].Token, "a resent Dequeue dealt a token again")

	// The first holder cannot act on the second delivery.
	require.Error(t, b.q.Ack(ctx, first[0]), "the first holder's Ack was taken for the second delivery")
	require.Equal(t, int64(1), queueStats(t, b, queueName).InFlight)
	require.NoError(t, b.q.Ack(ctx, second[0]))
}

// tokenResendKey is one key's DUMP and time to live.
type tokenResendKey struct {
	dump string
	pttl time.Duration
}

// tokenResendDump saves every key under b's prefix.
func tokenResendDump(t *testing.T, b *testBundle) map[string]tokenResendKey {
	t.Helper()
	out := map[string]tokenResendKey{}
	for _, k := range prefixKeys(t, b.client, b.prefix) {
		d, err := b.client.Dump(b.ctx, k).Result()
		require.NoError(t, err)
		ttl, err := b.client.PTTL(b.ctx, k).Result()
		require.NoError(t, err)
		if ttl < 0 {
			ttl = 0
		}
		out[k] = tokenResendKey{dump: d, pttl: ttl}
	}
	return out
}

// tokenResendRestore deletes every key under b's prefix and restores saved.
func tokenResendRestore(t *testing.T, b *testBundle, saved map[string]tokenResendKey) {
	t.Helper()
	ctx := context.Background()
	for _, k := range prefixKeys(t, b.client, b.prefix) {
		require.NoError(t, b.client.Del(ctx, k).Err())
	}
	for k, v := range saved {
		require.NoError(t, b.client.Restore(ctx, k, v.pttl, v.dump).Err(), k)
	}
}
