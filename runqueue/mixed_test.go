package runqueue_test

import (
	"fmt"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// mixedRun is the test's record of one run.
type mixedRun struct {
	key   string
	state string // queued, held, dead, acked, expired
	at    int64  // available at (ms), while queued
	ttl   int64  // TTL deadline (ms) while queued; 0 for none
	acks  int
	run   *runqueue.Run // the delivery, while held
}

// TestMixedDeploy is the rolling-deploy property of issue 3: random
// operations on one queue, each run by a flag-off or a flag-on instance
// picked at random (enqueue, dequeue, ack, nack, dead letter, redrive,
// lease recovery, TTL expiry, weights, clock steps). No script errors; no
// run is delivered while another delivery holds it, or after it was acked,
// dead-lettered or expired; and a final drain by the two instances in turn
// serves every queued run (every key reachable) within a bounded number of
// calls, after which every run was acked exactly once, dead-lettered or
// expired.
func TestMixedDeploy(t *testing.T) {
	t.Parallel()
	vpCheck(t, func(rt *rapid.T, pl *vpPool) {
		cfg := vpConfig{
			WM:          rapid.IntRange(1, 3).Draw(rt, "wm"),
			Quantum:     rapid.SampledFrom([]float64{1, 0.3}).Draw(rt, "quantum"),
			IdleMax:     rapid.SampledFrom([]int{10000, 2}).Draw(rt, "idleMax"),
			MaxAttempts: 3,
			Limits: runqueue.Limits{
				Key:   rapid.SampledFrom([]int{0, 0, 1, 2}).Draw(rt, "keyLimit"),
				Queue: rapid.SampledFrom([]int{0, 0, 4}).Draw(rt, "queueLimit"),
			},
		}
		p := pl.get(cfg)
		runs := map[string]*mixedRun{}
		nkeys := rapid.IntRange(1, 8).Draw(rt, "keys")
		pick := func(state string) (string, bool) {
			var ids []string
			for id, r := range runs {
				if r.state == state {
					ids = append(ids, id)
				}
			}
			if len(ids) == 0 {
				return "", false
			}
			sort.Strings(ids)
			return ids[rapid.IntRange(0, len(ids)-1).Draw(rt, "pick")], true
		}
		instance := func() (*runqueue.Queue, string) {
			if rapid.Bool().Draw(rt, "flagOn") {
				return p.on, "on"
			}
			return p.off, "off"
		}
		// received checks one dequeue's runs against the record.
		received := func(got []*runqueue.Run, who string) {
			now := p.clock.Now().UnixMilli()
			for _, run := range got {
				r, ok := runs[run.ID]
				require.True(rt, ok, "%s served unknown run %s", who, run.ID)
				require.Equal(rt, "queued", r.state, "%s served %s in state %s", who, run.ID, r.state)
				require.LessOrEqual(rt, r.at, now, "%s served %s before its time", who, run.ID)
				require.Equal(rt, r.key, run.Key)
				require.True(rt, r.ttl == 0 || r.ttl > now, "%s served %s past its TTL (deadline %d, now %d)",
					who, run.ID, r.ttl, now)
				r.state, r.run, r.ttl = "held", run, 0
			}
			// Runs the call took past their TTL were expired, not served.
			for id, r := range runs {
				if r.state != "queued" {
					continue
				}
				exists, err := p.c.HExists(p.ctx, p.qk.Runs(), keys.Segment(id)).Result()
				require.NoError(rt, err)
				if !exists {
					require.True(rt, r.ttl > 0 && r.ttl <= now, "%s: %s (TTL deadline %d, now %d) gone at a dequeue",
						who, id, r.ttl, now)
					r.state = "expired"
				}
			}
		}
		lastV := 0.0
		for i := rapid.IntRange(1, 40).Draw(rt, "ops"); i > 0; i-- {
			q, who := instance()
			now := p.clock.Now().UnixMilli()
			switch op := rapid.IntRange(0, 99).Draw(rt, "op"); {
			case op < 35:
				key := vpKey(rapid.IntRange(0, nkeys-1).Draw(rt, "key"))
				delay := time.Duration(rapid.SampledFrom([]int{0, 0, 0, 5, 40}).Draw(rt, "delay")) * time.Second
				life := time.Duration(rapid.SampledFrom([]int{0, 0, 0, 20}).Draw(rt, "ttl")) * time.Second
				p.next++
				id := "r" + strconv.Itoa(p.next)
				ok, err := q.Enqueue(p.ctx, runqueue.EnqueueParams{Env: vpEnv, Queue: p.queue, Key: key, ID: id,
					Payload: []byte(id), Priority: rapid.SampledFrom([]int{0, 0, 1, 9}).Draw(rt, "prio"),
					Delay: delay, TTL: life})
				require.NoError(rt, err, "%s enqueue", who)
				require.True(rt, ok)
				r := &mixedRun{key: key, state: "queued", at: now + delay.Milliseconds()}
				if life > 0 {
					r.ttl = now + life.Milliseconds()
				}
				runs[id] = r
			case op < 65:
				got, err := q.Dequeue(p.ctx, vpEnv, p.queue, rapid.IntRange(1, 6).Draw(rt, "maxCount"))
				require.NoError(rt, err, "%s dequeue", who)
				received(got, who)
				p.clock.Advance(time.Millisecond)
			case op < 75:
				if id, ok := pick("held"); ok {
					require.NoError(rt, q.Ack(p.ctx, runs[id].run), "%s ack", who)
					runs[id].state, runs[id].run = "acked", nil
					runs[id].acks++
				}
			case op < 83:
				if id, ok := pick("held"); ok {
					r := runs[id]
					retry := p.clock.Now().Add(time.Duration(rapid.SampledFrom([]int{0, 3, 30}).Draw(rt, "retry")) * time.Second)
					res, err := q.Nack(p.ctx, r.run, &runqueue.NackOptions{RetryAt: retry,
						DeadLetter: rapid.IntRange(0, 5).Draw(rt, "kill") == 0})
					require.NoError(rt, err, "%s nack", who)
					r.run = nil
					if res.Requeued {
						r.state, r.at = "queued", retry.UnixMilli()
					} else {
						r.state = "dead"
					}
				}
			case op < 87:
				if id, ok := pick("dead"); ok {
					require.NoError(rt, q.Redrive(p.ctx, vpEnv, p.queue, runs[id].key, id), "%s redrive", who)
					runs[id].state, runs[id].at = "queued", now
				}
			case op < 90:
				mixedRecover(rt, p, q, runs)
			case op < 94:
				_, err := q.ExpireTTL(p.ctx, q.ShardOf(vpEnv), 1000)
				require.NoError(rt, err, "%s expire", who)
				mixedExpired(rt, p, runs, now)
			case op < 96:
				key := vpKey(rapid.IntRange(0, nkeys-1).Draw(rt, "weightKey"))
				require.NoError(rt, q.SetWeight(p.ctx, vpEnv, p.queue, key, rapid.SampledFrom([]float64{0.5, 3}).Draw(rt, "w")))
			default:
				p.clock.Advance(time.Duration(rapid.IntRange(1, 30).Draw(rt, "advance")) * time.Second)
			}
			v := p.v(rt)
			require.GreaterOrEqual(rt, v, lastV, "V decreased")
			lastV = v
		}

		// Drain: hand every held run back, then the instances take turns,
		// acking what they get, the clock moving 1s per call so delayed runs
		// come due.
		mixedRecover(rt, p, p.on, runs)
		queued := 0
		pending := map[string]bool{}
		for _, r := range runs {
			if r.state == "queued" {
				queued++
				pending[r.key] = true
			}
		}
		m := rapid.IntRange(1, 5).Draw(rt, "drainMaxCount")
		bound := queued + 45
		calls := 0
		for ; calls < bound && len(pending) > 0; calls++ {
			q, who := p.on, "on"
			if calls%2 == 1 {
				q, who = p.off, "off"
			}
			got, err := q.Dequeue(p.ctx, vpEnv, p.queue, m)
			require.NoError(rt, err, "%s dequeue while draining", who)
			received(got, who)
			for _, run := range got {
				require.NoError(rt, q.Ack(p.ctx, run))
				runs[run.ID].state, runs[run.ID].run = "acked", nil
				runs[run.ID].acks++
			}
			p.clock.Advance(time.Second)
			pending = map[string]bool{}
			for _, r := range runs {
				if r.state == "queued" {
					pending[r.key] = true
				}
			}
		}
		require.Empty(rt, pending, "keys still queued after %d drain calls (%d runs were queued)", calls, queued)
		dead := 0
		for id, r := range runs {
			switch r.state {
			case "acked":
				require.Equal(rt, 1, r.acks, "%s acked %d times", id, r.acks)
			case "dead":
				dead++
				require.Zero(rt, r.acks)
			case "expired":
				require.Zero(rt, r.acks)
			default:
				require.Fail(rt, fmt.Sprintf("%s ended %s", id, r.state))
			}
		}
		st, err := p.off.QueueStats(p.ctx, vpEnv, p.queue)
		require.NoError(rt, err)
		require.Equal(rt, runqueue.Stats{Dead: int64(dead)}, st)
	})
}

// mixedRecover lets every lease of the queue pass and recovers them through
// q: each held run is requeued, ready now, or dead-lettered when it has no
// attempts left.
func mixedRecover(t require.TestingT, p *vp, q *runqueue.Queue, runs map[string]*mixedRun) {
	p.clock.Advance(time.Minute + time.Second)
	_, err := q.RecoverLeases(p.ctx, q.ShardOf(vpEnv), 100000)
	require.NoError(t, err, "recover")
	now := p.clock.Now().UnixMilli()
	for id, r := range runs {
		if r.state != "held" {
			continue
		}
		if _, err := q.DeadLetter(p.ctx, vpEnv, p.queue, r.key, id); err == nil {
			r.state = "dead"
		} else {
			require.ErrorIs(t, err, runqueue.ErrNotFound)
			r.state, r.at = "queued", now
		}
		r.run = nil
	}
}

// mixedExpired records the runs a TTL sweep at now removed, checking that
// exactly the queued runs whose deadline passed are gone.
func mixedExpired(t require.TestingT, p *vp, runs map[string]*mixedRun, now int64) {
	for id, r := range runs {
		if r.state != "queued" || r.ttl == 0 {
			continue
		}
		exists, err := p.c.HExists(p.ctx, p.qk.Runs(), keys.Segment(id)).Result()
		require.NoError(t, err)
		require.Equal(t, r.ttl > now, exists, "%s (TTL deadline %d, now %d) exists: %v", id, r.ttl, now, exists)
		if !exists {
			r.state = "expired"
		}
	}
}
