package runqueue_test

import (
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// TestS24MixedStatsAndOrder: a deterministic mixed workload on a real
// Redis, flag on: priorities, delays, TTLs, nacks with backoff, dead
// letters, redrives, lease recovery, key and queue limits, weight changes.
// After every operation QueueStats and KeyStats must match the truth
// (ready+delayed = queued, in flight, dead), every serve must be the
// lowest ready score of its key among the runs due at that call
// (priority is a bounded head start inside a key: ready score =
// available_at - priority*PriorityStep), the per-key and queue caps hold,
// and no run is served while another holder has it.
func TestS24MixedStatsAndOrder(t *testing.T) {
	const keyLimit, queueLimit = 2, 6
	b := s24Setup(t, func(c *runqueue.Config) {
		c.KeyConcurrency = keyLimit
		c.QueueConcurrency = queueLimit
		c.PriorityStep = 2 * time.Second
		c.LeaseDuration = 30 * time.Second
		c.MaxAttempts = 3
		c.BackoffBase = time.Second
		c.BackoffMax = 4 * time.Second
	})
	step := b.cfg.PriorityStep
	type trun struct {
		id, key string
		prio    int
		at      time.Time
		state   string // queued, held, dead, gone
		ttl     time.Time
		everDeq bool
		run     *runqueue.Run
		attempt int
	}
	runs := map[string]*trun{}
	rng := rand.New(rand.NewSource(24))
	keysN := []string{"flood", "a", "b", "c", "d"}
	nextID := 0
	enq := func(key string, prio int, delay, ttl time.Duration) {
		nextID++
		id := fmt.Sprintf("m%d", nextID)
		now := b.clock.Now()
		enqueue(t, b, runqueue.EnqueueParams{Key: key, ID: id, Priority: prio, Delay: delay, TTL: ttl})
		r := &trun{id: id, key: key, prio: prio, at: now.Add(delay), state: "queued", attempt: 1}
		if ttl > 0 {
			r.ttl = now.Add(ttl)
		}
		runs[id] = r
	}
	score := func(r *trun) time.Time { return r.at.Add(-time.Duration(r.prio) * step) }
	check := func(where string) {
		t.Helper()
		tot := map[string][3]int{}
		var all [3]int
		for _, r := range runs {
			var c [3]int
			switch r.state {
			case "queued":
				c[0] = 1
			case "held":
				c[1] = 1
			case "dead":
				c[2] = 1
			}
			x := tot[r.key]
			for i := range c {
				x[i] += c[i]
				all[i] += c[i]
			}
			tot[r.key] = x
		}
		s := queueStats(t, b, queueName)
		require.EqualValues(t, all[0], s.Ready+s.Delayed, "%s: queued (stats %+v)", where, s)
		require.EqualValues(t, all[1], s.InFlight, "%s: in flight (stats %+v)", where, s)
		require.EqualValues(t, all[2], s.Dead, "%s: dead (stats %+v)", where, s)
		require.LessOrEqual(t, s.InFlight, int64(queueLimit), where)
		for _, k := range keysN {
			ks, err := b.q.KeyStats(b.ctx, env, queueName, k)
			require.NoError(t, err)
			require.EqualValues(t, tot[k][0], ks.Ready+ks.Delayed, "%s: key %s queued (%+v)", where, k, ks)
			require.EqualValues(t, tot[k][1], ks.InFlight, "%s: key %s in flight (%+v)", where, k, ks)
			require.LessOrEqual(t, ks.InFlight, int64(keyLimit), where)
		}
	}
	for i := 0; i < 300; i++ {
		enq("flood", rng.Intn(10), 0, 0)
	}
	for _, k := range keysN[1:] {
		for i := 0; i < 10; i++ {
			enq(k, rng.Intn(10), time.Duration(rng.Intn(4))*time.Second, 0)
		}
	}
	check("start")
	for op := 0; op < 1500; op++ {
		now := b.clock.Now()
		switch x := rng.Intn(100); {
		case x < 40:
			n := 1 + rng.Intn(3)
			got := dequeue(t, b, queueName, n)
			// The runs the call took past their TTL were deleted, not
			// served: only a queued run never delivered whose TTL passed.
			for _, r := range runs {
				if r.state != "queued" || r.everDeq || r.ttl.IsZero() || r.ttl.After(now) {
					continue
				}
				if b.client.HExists(b.ctx, keySpace(t, b).Env(env).Queue(queueName).Runs(), keys.Segment(r.id)).Val() {
					continue
				}
				r.state = "gone"
			}
			for _, g := range got {
				r := runs[g.ID]
				require.NotNil(t, r)
				require.Equal(t, "queued", r.state, "op %d: %s served in state %s", op, g.ID, r.state)
				require.True(t, r.everDeq || r.ttl.IsZero() || r.ttl.After(now), "op %d: %s served past its TTL", op, g.ID)
				require.False(t, r.at.After(now), "op %d: %s served before its time", op, g.ID)
				require.Equal(t, r.attempt, g.Attempt, "op %d: %s attempt", op, g.ID)
				// in-key order: no due queued run of the key with a lower score
				for _, o := range runs {
					if o.key == r.key && o.state == "queued" && o != r && !o.at.After(now) && score(o).Before(score(r)) {
						t.Fatalf("op %d: %s (score %v) served before %s (score %v) of key %s", op, r.id, score(r), o.id, score(o), r.key)
					}
				}
				r.state, r.run, r.everDeq = "held", g, true
			}
		case x < 55:
			for _, r := range runs {
				if r.state == "held" {
					require.NoError(t, b.q.Ack(b.ctx, r.run))
					r.state = "gone"
					break
				}
			}
		case x < 65:
			for _, r := range runs {
				if r.state == "held" {
					dl := rng.Intn(6) == 0
					res, err := b.q.Nack(b.ctx, r.run, &runqueue.NackOptions{DeadLetter: dl})
					require.NoError(t, err)
					if dl || r.attempt >= 3 {
						require.False(t, res.Requeued)
						r.state = "dead"
					} else {
						require.True(t, res.Requeued)
						r.state = "queued"
						r.attempt++
						r.at = res.RetryAt
						if r.at.Before(now) {
							r.at = now
						}
					}
					break
				}
			}
		case x < 70:
			for _, r := range runs {
				if r.state == "dead" {
					require.NoError(t, b.q.Redrive(b.ctx, env, queueName, r.key, r.id))
					r.state, r.attempt, r.at = "queued", 1, now
					break
				}
			}
		case x < 80:
			b.clock.Advance(time.Duration(200+rng.Intn(1500)) * time.Millisecond)
		case x < 84:
			b.clock.Advance(31 * time.Second)
			now = b.clock.Now()
			_, err := b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 1000)
			require.NoError(t, err)
			for _, r := range runs {
				if r.state == "held" && !r.run.LeaseDeadline.After(now) {
					if r.attempt >= 3 {
						r.state = "dead"
					} else {
						r.state, r.attempt, r.at = "queued", r.attempt+1, now
					}
				}
			}
		case x < 88:
			k := keysN[rng.Intn(len(keysN))]
			require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, k, []float64{0.01, 0.5, 1, 4, 100}[rng.Intn(5)]))
		case x < 92:
			ttl := time.Duration(1+rng.Intn(3)) * time.Second
			enq(keysN[1+rng.Intn(4)], rng.Intn(10), time.Duration(rng.Intn(2))*time.Second, ttl)
		case x < 95:
			_, err := b.q.ExpireTTL(b.ctx, b.q.ShardOf(env), 1000)
			require.NoError(t, err)
			for _, r := range runs {
				if r.state == "queued" && !r.everDeq && !r.ttl.IsZero() && !r.ttl.After(now) {
					r.state = "gone"
				}
			}
		default:
			enq(keysN[rng.Intn(len(keysN))], rng.Intn(10), time.Duration(rng.Intn(5))*time.Second, 0)
		}
		check(fmt.Sprintf("op %d", op))
	}
}
