package runqueue_test

import (
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// TestPreviewMatchesDequeuePastManyDead: Preview(n) shows what Dequeue(n)
// delivers (flag on) with many runs past their TTL spread over keys, more
// than a call sweeps (vtime.TTLLook) in all, with and without a key limit.
// (helper-153: with one budget of further reads for all keys, the keys
// read last looked dead or empty to Preview.)
func TestPreviewMatchesDequeuePastManyDead(t *testing.T) {
	for _, bk := range backends[:2] {
		for seed := int64(0); seed < 40; seed++ {
			t.Run(fmt.Sprintf("%s/seed=%d", bk.Name, seed), func(t *testing.T) {
				rng := rand.New(rand.NewSource(seed))
				kl := []int{0, 0, 1, 2}[rng.Intn(4)]
				b := setup(t, bk.Client(t), func(cfg *runqueue.Config) { cfg.VtimeScheduling = true; cfg.KeyConcurrency = kl })
				var ps []runqueue.EnqueueParams
				desc := ""
				for k := range 1 + rng.Intn(4) {
					dead := []int{0, 1, 50, 99, 100, 101, 150, 250}[rng.Intn(8)]
					live := rng.Intn(4)
					desc += fmt.Sprintf("k%d: %d dead, %d live; ", k, dead, live)
					for i := range dead {
						ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprintf("k%d", k),
							ID: fmt.Sprintf("k%d-d%03d", k, i), TTL: time.Second})
					}
					for i := range live {
						ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprintf("k%d", k),
							ID: fmt.Sprintf("k%d-l%d", k, i)})
					}
				}
				rng.Shuffle(len(ps), func(i, j int) { ps[i], ps[j] = ps[j], ps[i] })
				for i := 0; i < len(ps); i += 50 {
					b.clock.Advance(time.Millisecond)
					res, err := b.q.EnqueueMany(b.ctx, ps[i:min(i+50, len(ps))])
					require.NoError(t, err)
					for _, r := range res {
						require.NoError(t, r.Err)
					}
				}
				if rng.Intn(2) == 0 { // a serve first: the keys' tags differ
					b.clock.Advance(time.Millisecond)
					_, err := b.q.Dequeue(b.ctx, env, queueName, 1)
					require.NoError(t, err)
				}
				b.clock.Advance(2 * time.Second)
				n := []int{1, 2, 3, 10}[rng.Intn(4)]
				p, err := b.q.Preview(b.ctx, env, queueName, n)
				require.NoError(t, err)
				var pre []string
				for _, r := range p {
					pre = append(pre, r.ID)
				}
				got := runIDs(dequeue(t, b, queueName, n))
				if len(got) == 0 {
					got = nil
				}
				require.Equal(t, pre, got, "key limit %d, n %d, %s", kl, n, desc)
			})
		}
	}
}

// TestDequeueStaleTTLEntry: a TTL entry due whose run's record has no
// deadline, or a later one (a hand edit: no API writes one), does not get
// its run swept: the record decides, the run stays queued at its place
// (not delivered past the call's maxCount or its key's limit, which a
// sweep does not count) and its entry is mended, so the next call serves
// it. (helper-153: such runs were delivered past both, up to 100.)
func TestDequeueStaleTTLEntry(t *testing.T) {
	for _, later := range []bool{false, true} {
		t.Run(fmt.Sprintf("record deadline later=%v", later), func(t *testing.T) {
			forEachFlagWith(t, func(c *runqueue.Config) { c.KeyConcurrency = 1 }, func(t *testing.T, b *testBundle, on bool) {
				qk := keySpace(t, b).Env(env).Queue(queueName)
				ttlKey := keySpace(t, b).Shard(b.q.ShardOf(env)).TTL()
				var members []string
				for i := range 5 {
					p := runqueue.EnqueueParams{Key: "a", ID: fmt.Sprintf("a%d", i)}
					if later {
						p.TTL = time.Hour
					}
					enqueue(t, b, p)
					b.clock.Advance(time.Millisecond)
					m := qk.RunPrefix() + keys.VariantMember("a") + ":" + keys.Segment(p.ID)
					members = append(members, m)
					require.NoError(t, b.client.ZAdd(b.ctx, ttlKey, redis.Z{Score: 1, Member: m}).Err())
				}
				got := dequeue(t, b, queueName, 1)
				require.LessOrEqual(t, len(got), 1, "maxCount 1")
				st := queueStats(t, b, queueName)
				require.EqualValues(t, 5, st.Ready+st.InFlight, "every run still queued or held")
				require.LessOrEqual(t, st.InFlight, int64(1), "key limit 1")
				for _, m := range members {
					score, err := b.client.ZScore(b.ctx, ttlKey, m).Result()
					if later {
						require.NoError(t, err)
						require.Greater(t, score, float64(b.clock.Now().UnixMilli()), "the record's deadline back in the entry")
					} else {
						require.ErrorIs(t, err, redis.Nil, "a stale entry without a deadline in its record goes")
					}
				}
				if len(got) == 0 {
					got = dequeue(t, b, queueName, 1)
				}
				require.Equal(t, []string{"a0"}, runIDs(got))
			})
		})
	}
}
