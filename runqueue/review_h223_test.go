package runqueue_test

// helper-223: 84ad056 (layout 9, "^" and the wake of ew_settle), read with
// 6e1ca0a. Polls of 30 s (a mark lives 61 s): every bound below (20 s)
// ends long before a poll could bring anything.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// TestH223DeadOwnMarkLosesCaret: a call whose own mark is dead and the
// line's last reads "^" (HMGET) before ew_drop deletes the keys, then
// writes its new mark into the re-made hash without "^" (its limit is not
// above the stale value). The line then holds qb's mark (limit 5) with no
// "^": a release by a queue whose own limit leaves no free slot reads "^"
// as 0 and wakes nobody, though qb's limit leaves it a slot.
//
// qL 1, qf 10, qx 10, qb 5. qL holds 1 run, qf 4 (count 5). qb's call is
// held (mark qb:5, "^" 5); qx passes by and marks (limit 10: "^" 10), then
// leaves the line. qb's mark is lapsed by hand (its consumer was away past
// its life: e.g. a Worker whose handlers were busy left, and its mark
// lapsed after the grace). qb's Worker calls: its dead mark is dropped,
// the line with it, and it marks anew. qL's Ack (count 4, qL's limit 1).
func TestH223DeadOwnMarkLosesCaret(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := ewLimitsSetup(t, c, map[string]int{"qL": 1, "qf": 10, "qx": 10, "qb": 5})
		lives := ewSpace(t, b).Env(env).WaitingUntil()
		ewEnqueue(t, b, "qL", 1)
		l := ewTake(t, b, nil, "qL")
		require.Len(t, l, 1)
		ewEnqueue(t, b, "qf", 4)
		f, err := b.q.Dequeue(b.ctx, env, "qf", 4)
		require.NoError(t, err)
		require.Len(t, f, 4)
		require.Equal(t, 5, h219EnvCount(t, b))

		ewEnqueue(t, b, "qb", 3)
		require.Empty(t, ewTake(t, b, nil, "qb"), "qb is at its limit, 5")
		require.True(t, ewMarked(t, b, "qb"))

		ewEnqueue(t, b, "qx", 6)
		x, err := b.q.Dequeue(b.ctx, env, "qx", 10)
		require.NoError(t, err)
		require.Len(t, x, 5)
		require.True(t, ewMarked(t, b, "qx"))
		require.Equal(t, "10", b.client.HGet(b.ctx, lives, "^").Val())
		for _, r := range x {
			require.NoError(t, b.q.Ack(b.ctx, r))
		}
		x, err = b.q.Dequeue(b.ctx, env, "qx", 10)
		require.NoError(t, err)
		require.Len(t, x, 1)
		require.False(t, ewMarked(t, b, "qx"), "qx served all it had: it left the line")
		require.NoError(t, b.q.Ack(b.ctx, x[0]))
		require.Equal(t, 5, h219EnvCount(t, b))

		// (qb's mark lapsed: a life in the past, its limit kept)
		require.NoError(t, b.client.HSet(b.ctx, lives, keys.QueueMember(env, "qb"), "1:5").Err())

		served := make(chan string, 16)
		startWorker(t, b.q, ewServed(served), ewOver("qb"))
		// (the Worker's call wrote qb's mark anew)
		require.Eventually(t, func() bool {
			till, _, err := ewMarkOf(b, ewSpace(t, b), "qb")
			return err == nil && till > 1
		}, 10*time.Second, 5*time.Millisecond)
		_, lim, err := ewMarkOf(b, ewSpace(t, b), "qb")
		require.NoError(t, err)
		require.EqualValues(t, 5, lim)
		top, err := b.client.HGet(b.ctx, lives, "^").Result()
		t.Logf("line after qb's call: qb's mark limit %d, \"^\" %q (err %v)", lim, top, err)

		require.NoError(t, b.q.Ack(b.ctx, l[0])) // (count 4: qb's limit leaves it one)
		ewWithin(t, served, "qb (limit 5, count 4) after qL's ack")
	})
}

// TestH223FusedAckWakesNobody: qa's env limit 1, qb's 3. qa holds one run,
// qb two: the env is at qb's limit and qb's Worker waits in the line. qa's
// consumer acks its run in a dequeue call (AckAndDequeue: what a Worker of
// qa sends), which frees a slot qa's own limit leaves it no use of (2 in
// flight). A plain Ack wakes qb then (TestEnvWaitingReleaseWakesByOwnLimit:
// hooks_finish reads "^"); the dequeue's acks go through ew_capacity (a
// wake only while free > 0 by qa's own limit) and ew_settle (84ad056's
// wake: only with a mark of qa's own, and only behind it).
func TestH223FusedAckWakesNobody(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		more     int  // qa's ready runs left behind the ack
		max      int  // the ack's call's maxCount
		markedQa bool // qa marked (behind qb) before its ack
	}{
		{"ack-and-take-nothing-left", 0, 1, false},
		{"ack-only", 0, 0, false},
		{"ack-and-take-more-ready", 2, 1, false},
		{"qa-marked-behind-qb", 2, 1, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
				b, a, served := ewQbWaitsAtItsLimit(t, c)
				if tc.more > 0 {
					for i := range tc.more {
						_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: "qa", Key: "k2", ID: "qa-more-" + string(rune('a'+i))})
						require.NoError(t, err)
					}
				}
				if tc.markedQa {
					require.Empty(t, ewTake(t, b, nil, "qa"))
					require.True(t, ewMarked(t, b, "qa"))
					require.Less(t, ewPlace(t, b, "qb"), ewPlace(t, b, "qa"))
				}
				got, errs, err := b.q.AckAndDequeue(b.ctx, a, env, "qa", tc.max)
				require.NoError(t, err)
				for _, e := range errs {
					require.NoError(t, e)
				}
				require.Empty(t, got) // (count 2: qb's limit leaves it one)
				ewWithin(t, served, "qb (limit 3, count 2) after qa's fused ack")
			})
		})
	}
}

// TestH223WorkerAckWakesNobody: as TestH223FusedAckWakesNobody, with qa
// served by a Worker (its acks ride on its next fetch, AckAndDequeue): qa's
// handler finishes, the env's count falls to 2, and qb's Worker (limit 3)
// waits for its poll. plainAck is the control: the same state, the run
// acked by a plain Ack (hooks_finish), which wakes qb.
func TestH223WorkerAckWakesNobody(t *testing.T) {
	t.Parallel()
	for _, plainAck := range []bool{false, true} {
		t.Run(map[bool]string{false: "worker", true: "plain-ack"}[plainAck], func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
				b := ewLimitsSetup(t, c, map[string]int{"qa": 1, "qb": 3})
				ewEnqueue(t, b, "qa", 1)
				ewEnqueue(t, b, "qb", 3)
				var a []*runqueue.Run
				release := make(chan struct{})
				if plainAck {
					a = ewTake(t, b, nil, "qa")
					require.Len(t, a, 1)
				} else {
					startWorker(t, b.q, func(ctx context.Context, r *runqueue.Run) error {
						<-release
						return nil
					}, ewOver("qa"))
					require.Eventually(t, func() bool { return h219EnvCount(t, b) == 1 }, 10*time.Second, 5*time.Millisecond)
				}
				held, err := b.q.Dequeue(b.ctx, env, "qb", 2)
				require.NoError(t, err)
				require.Len(t, held, 2)
				served := make(chan string, 4)
				startWorker(t, b.q, ewServed(served), ewOver("qb"))
				ewWaits(t, b, "qb")
				if plainAck {
					require.NoError(t, b.q.Ack(b.ctx, a[0]))
				} else {
					close(release)
				}
				require.Eventually(t, func() bool { return h219EnvCount(t, b) == 2 || len(served) > 0 }, 10*time.Second, 5*time.Millisecond, "qa's run acked")
				ewWithin(t, served, "qb (limit 3, count 2) after qa's ack")
			})
		})
	}
}

// TestH223LoweredLimitHeldCallsRead: one env limit for every queue, 10,
// lowered to 1 while five queues wait (their marks renewed at 1; "^" was
// 10). The env holds 3. Every held call of a waiting queue had n <= 0 and
// min("^", lowest) = 10 > 3: ew_settle read the line behind its mark (up
// to its four reads) to wake nobody, at every call, for as long as the
// line lived (layout 8 and 6e1ca0a read nothing then). Now the next
// release over the limit reads the whole line, wakes nobody and lowers
// "^" to 1, the highest limit it met; the held calls after it read
// nothing of the line behind them.
func TestH223LoweredLimitHeldCallsRead(t *testing.T) {
	lim := &h219Limits{def: 10}
	b := h222OwnSetup(t, lim)
	ewEnqueue(t, b, "qa", 10)
	runs, err := b.q.Dequeue(b.ctx, env, "qa", 10)
	require.NoError(t, err)
	require.Len(t, runs, 10)
	ws := []string{"w00", "w01", "w02", "w03", "w04"}
	for _, q := range ws {
		ewEnqueue(t, b, q, 1)
		require.Empty(t, ewTake(t, b, nil, q))
		require.True(t, ewMarked(t, b, q))
	}
	for _, r := range runs[:7] {
		require.NoError(t, b.q.Ack(b.ctx, r))
	}
	lim.setAll(1)
	for _, q := range ws { // (each renews its mark at 1: no stale limit left)
		require.Empty(t, ewTake(t, b, nil, q))
		_, l, err := ewMarkOf(b, ewSpace(t, b), q)
		require.NoError(t, err)
		require.EqualValues(t, 1, l)
	}
	require.Equal(t, 3, h219EnvCount(t, b))
	require.NoError(t, b.q.Ack(b.ctx, runs[7]))
	caret, err := b.client.HGet(b.ctx, ewSpace(t, b).Env(env).WaitingUntil(), "^").Result()
	require.NoError(t, err)
	require.Equal(t, "1", caret, "the release over the limit read the whole line: \"^\" lowered")
	require.NoError(t, b.client.ConfigResetStat(b.ctx).Err())
	require.Empty(t, ewTake(t, b, nil, "w00"))
	st := h222Stats(t, b)
	t.Logf("held call of w00 (front), limit 1, count 2, \"^\" 1: %s", h222Fmt(st))
	require.Zero(t, st["zrangebyscore"], "a held call at a single (lowered) limit reads nothing of the line behind it")
}

// TestH223PreviewMatchesDequeueLapses: TestH222PreviewMatchesDequeueMixed
// with marks lapsed and cut to leaving by hand between the steps (dead
// marks met and dropped in the reads, the call's own mark dead or
// leaving, ties of a passed mark and a dead one in one batch): before
// each Dequeue, Preview of the same call must name as many runs, and no
// call may take the env past its own queue's limit.
func TestH223PreviewMatchesDequeueLapses(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		lims := map[string]int{"qa": 1, "qb": 2, "qc": 3, "qd": 5, "qe": 5, "qf": 1, "qg": 2}
		b := ewLimitsSetup(t, c, lims)
		b.q.SetLeaveGrace(30 * time.Second) // (a mark cut to leaving stays so for the test's length)
		lives := ewSpace(t, b).Env(env).WaitingUntil()
		qs := []string{"qa", "qb", "qc", "qd", "qe", "qf", "qg"}
		w := &h222Walk{t: t, b: b, lims: lims, next: map[string]int{}}
		for _, q := range qs {
			w.put(q, 4)
		}
		r := rand.New(rand.NewPCG(223, 9))
		lapsed, leaving := 0, 0
		for step := range 500 {
			q := qs[r.IntN(len(qs))]
			switch r.IntN(8) {
			case 0, 1, 2:
				if len(w.held) > 0 {
					w.ack(r.IntN(len(w.held)))
					continue
				}
			case 3:
				m := keys.QueueMember(env, qs[r.IntN(len(qs))])
				if v, err := b.client.HGet(b.ctx, lives, m).Result(); err == nil {
					_, l, _ := strings.Cut(v, ":")
					till := int64(1)
					if r.IntN(2) == 0 {
						till = ewServerMs(t, b) + 15_000 // (leaving: grace 30 s)
						leaving++
					} else {
						lapsed++
					}
					require.NoError(t, b.client.HSet(b.ctx, lives, m, fmt.Sprintf("%d:%s", till, l)).Err())
				}
			}
			w.take(step, q, 1+r.IntN(3))
			if r.IntN(3) == 0 {
				w.put(q, 2)
			}
		}
		t.Logf("marks lapsed by hand %d, cut to leaving %d", lapsed, leaving)
		require.Zero(t, w.bad, "Preview disagreed with the dequeue")
	})
}
