package runqueue_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// A Worker that stops gracefully leaves its queues' places in their env's
// waiting line (Queue.leaveLine): the mark is cut to the leaving grace, the
// env's free slots go past it to the queues behind, and the queue's other
// consumers are woken to renew it in its place. ewSetup's poll is 30 s (a
// mark lives 61 s): every wait below ends long before a poll could bring
// anything.

// ewOver is a WorkerConfig edit: one queue of env.
func ewOver(queue string) func(*runqueue.WorkerConfig) {
	return func(cfg *runqueue.WorkerConfig) { cfg.Queues = []runqueue.WorkerQueue{{Env: env, Queue: queue}} }
}

func ewNop(context.Context, *runqueue.Run) error { return nil }

// ewWaits waits until queue is in its env's waiting line.
func ewWaits(t *testing.T, b *testBundle, queue string) {
	t.Helper()
	line := ewSpace(t, b).Env(env).Waiting()
	require.Eventually(t, func() bool {
		return b.client.ZScore(b.ctx, line, keys.QueueMember(env, queue)).Err() == nil
	}, 10*time.Second, 5*time.Millisecond, "%s's consumer finds the env full and marks it", queue)
}

// ewServed is a handler that reports each run it is given on the channel.
func ewServed(ch chan<- string) runqueue.Handler {
	return func(_ context.Context, r *runqueue.Run) error {
		ch <- r.ID
		return nil
	}
}

// ewWithin waits for a run on ch for 20 s (two thirds of the waiters'
// poll).
func ewWithin(t *testing.T, ch <-chan string, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: not served in 20 s (the waiters' poll is 30 s)", what)
	}
}

// TestEnvWaitingWorkerLeaves: env limit 1, qa holds the slot, the lone
// Worker over qb waits; it stops: qb's mark is cut to the grace (it lived
// 61 s before, every free slot of the env left to a queue nobody served),
// and qa's call takes the slot its ack frees at once, passing over
// qb's leaving mark without dropping it (and Preview names that run).
func TestEnvWaitingWorkerLeaves(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b, _ := ewSetup(t, c, true, 1)
		ewEnqueue(t, b, "qa", 3)
		ewEnqueue(t, b, "qb", 1)
		a := ewTake(t, b, nil, "qa")
		require.Len(t, a, 1)
		wb := startWorker(t, b.q, ewNop, ewOver("qb"))
		ewWaits(t, b, "qb")
		require.Greater(t, ewUntil(t, b, "qb"), ewServerMs(t, b)+30_000, "a waiting Worker's mark lives two polls and a second")
		require.Empty(t, ewTake(t, b, nil, "qa"), "the env is full")
		shutdown(t, wb)
		require.LessOrEqual(t, ewUntil(t, b, "qb"), ewServerMs(t, b)+500, "the stopped Worker's mark is cut to the grace")
		require.NoError(t, b.q.Ack(b.ctx, a[0]))
		// Preview and Schedule read the line as the script does
		// (envAheadOf): the leaving mark is passed over.
		p, err := b.q.Preview(b.ctx, env, "qa", 1)
		require.NoError(t, err)
		sc, err := b.q.Schedule(b.ctx, env, "qa", 1)
		require.NoError(t, err)
		require.Len(t, sc.Keys, 1)
		require.Empty(t, sc.Keys[0].Reason)
		a2 := ewTake(t, b, nil, "qa")
		require.Len(t, a2, 1, "qb's leaving mark is passed over: the slot is qa's")
		require.Len(t, p, 1)
		require.Equal(t, a2[0].ID, p[0].ID)
		require.True(t, ewMarked(t, b, "qb"), "a leaving mark keeps its place until it lapses")
	})
}

// TestEnvWaitingWorkerLeavesOthersStay: two Workers over qb, qc waiting
// behind qb; one of qb's Workers stops: the other, woken, renews qb's mark
// in its place (a grace of 5 s here: time enough on a loaded machine), and
// the slot qa's ack frees is left to qb (a mark dropped at the stop would
// send qb to the back of the line, behind qc).
func TestEnvWaitingWorkerLeavesOthersStay(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b, _ := ewSetup(t, c, true, 1)
		b.q.SetLeaveGrace(5 * time.Second)
		ewEnqueue(t, b, "qa", 3)
		ewEnqueue(t, b, "qb", 1)
		ewEnqueue(t, b, "qc", 1)
		a := ewTake(t, b, nil, "qa")
		require.Len(t, a, 1)
		wb := startWorker(t, b.q, ewNop, ewOver("qb"))
		startWorker(t, b.q, ewNop, ewOver("qb"))
		ewWaits(t, b, "qb")
		require.Empty(t, ewTake(t, b, nil, "qc"), "the env is full")
		require.True(t, ewMarked(t, b, "qc"), "qc waits behind qb")
		space := ewSpace(t, b)
		line := space.Env(env).Waiting()
		place, err := b.client.ZScore(b.ctx, line, keys.QueueMember(env, "qb")).Result()
		require.NoError(t, err)
		before := ewUntil(t, b, "qb")
		shutdown(t, wb)
		require.Eventually(t, func() bool {
			until, _, err := ewMarkOf(b, space, "qb")
			return err == nil && until > before
		}, 10*time.Second, 5*time.Millisecond, "the Worker left over qb renews the mark")
		again, err := b.client.ZScore(b.ctx, line, keys.QueueMember(env, "qb")).Result()
		require.NoError(t, err)
		require.Equal(t, fmt.Sprint(place), fmt.Sprint(again), "qb keeps its place")
		require.Empty(t, ewTake(t, b, a, "qa"), "the slot qa's ack frees is left to qb")
	})
}

// TestEnvWaitingLeaveFreesSlotLater (helper-205's probe): env limit 1, qa's
// Worker holds the slot, qb's and qc's Workers wait (qb ahead); qb's
// Worker stops, then qa's run ends: its ack passes the slot over qb's
// leaving mark to qc and wakes qc (the first version left it to the cut
// mark, woke only qb, and nothing woke qc once the mark lapsed: qc was
// served at its 30 s poll).
func TestEnvWaitingLeaveFreesSlotLater(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b, _ := ewSetup(t, c, true, 1)
		ewEnqueue(t, b, "qa", 1)
		ewEnqueue(t, b, "qb", 1)
		ewEnqueue(t, b, "qc", 1)
		startedA, release := make(chan struct{}), make(chan struct{})
		startWorker(t, b.q, func(context.Context, *runqueue.Run) error { close(startedA); <-release; return nil }, ewOver("qa"))
		waitClosed(t, startedA)
		wb := startWorker(t, b.q, ewNop, ewOver("qb"))
		ewWaits(t, b, "qb")
		servedC := make(chan string, 1)
		startWorker(t, b.q, ewServed(servedC), ewOver("qc"))
		ewWaits(t, b, "qc")
		shutdown(t, wb)
		close(release)
		ewWithin(t, servedC, "qc's run")
	})
}

// TestEnvWaitingLeaveWakesBehind: env limit 1, a run of qa holds the slot;
// one Worker over some queues of the env waits (each marked), qc's Worker
// waits behind them; a flag-off instance's Ack frees the slot (it wakes
// nobody: the slot is the first queue's while its mark lives, its
// consumer not woken); the Worker stops:
// its leaves cut its queues' marks, and the leave wakes qc for the free
// slot. Over five queues (helper-206's probe): a read of the line asked
// for as many marks as free slots, at most 4 reads, so the 4 leaving marks
// in front used them all, and qc waited for its poll.
func TestEnvWaitingLeaveWakesBehind(t *testing.T) {
	t.Parallel()
	for _, qs := range [][]string{{"qb"}, {"q1", "q2", "q3", "q4", "q5"}} {
		t.Run(fmt.Sprintf("queues=%d", len(qs)), func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
				b, _ := ewSetup(t, c, true, 1)
				ewEnqueue(t, b, "qa", 1)
				for _, q := range qs {
					ewEnqueue(t, b, q, 1)
				}
				ewEnqueue(t, b, "qc", 1)
				a := ewTake(t, b, nil, "qa")
				require.Len(t, a, 1)
				w := startWorker(t, b.q, ewNop, func(cfg *runqueue.WorkerConfig) {
					cfg.Queues = nil
					for _, q := range qs {
						cfg.Queues = append(cfg.Queues, runqueue.WorkerQueue{Env: env, Queue: q})
					}
				})
				for _, q := range qs {
					ewWaits(t, b, q)
				}
				servedC := make(chan string, 1)
				startWorker(t, b.q, ewServed(servedC), ewOver("qc"))
				ewWaits(t, b, "qc")
				// (acked by a flag-off instance, which wakes nobody: a
				// flag-on release wakes qs[0]'s consumer, which takes the slot)
				off := s34NewQueue(t, b.client, b.prefix, func(cfg *runqueue.Config) {
					cfg.VtimeScheduling, cfg.Clock = false, b.clock
				})
				require.NoError(t, off.Ack(b.ctx, a[0]))
				select {
				case id := <-servedC:
					t.Fatalf("qc served %s before the Worker ahead stopped: the slot was %s's", id, qs[0])
				default:
				}
				shutdown(t, w)
				for _, q := range qs {
					require.LessOrEqual(t, ewUntil(t, b, q), ewServerMs(t, b)+500, "%s's mark is cut to the grace", q)
				}
				ewWithin(t, servedC, "qc's run")
			})
		})
	}
}

// TestEnvWaitingLeaveThenOwnAck (helper-206's probe): env limit 1; qa's
// Worker runs qa's first run (the env's slot) and its next call, held by
// the env, marks qa; qc's Worker waits behind qa. qa's Worker stops: its
// leave cuts qa's mark (no free slot: nothing to wake); then its handler
// ends and the ack goes as an ack-only call (maxCount 0), which passes
// over its own leaving mark and wakes qc for the slot it frees (it woke
// only the marks ahead of its own: qc waited for its poll). (A grace of 5
// s: the ack comes well within it on a loaded machine.)
func TestEnvWaitingLeaveThenOwnAck(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b, _ := ewSetup(t, c, true, 1)
		b.q.SetLeaveGrace(5 * time.Second)
		ewEnqueue(t, b, "qa", 2)
		ewEnqueue(t, b, "qc", 1)
		startedA, release := make(chan struct{}), make(chan struct{})
		wa := startWorker(t, b.q, func(context.Context, *runqueue.Run) error { close(startedA); <-release; return nil }, ewOver("qa"))
		waitClosed(t, startedA)
		ewWaits(t, b, "qa")
		servedC := make(chan string, 1)
		startWorker(t, b.q, ewServed(servedC), ewOver("qc"))
		ewWaits(t, b, "qc")
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			done <- wa.Shutdown(ctx)
		}()
		space := ewSpace(t, b)
		require.Eventually(t, func() bool {
			until, _, err := ewMarkOf(b, space, "qa")
			return err == nil && until <= ewServerMs(t, b)+5_000
		}, 10*time.Second, 5*time.Millisecond, "qa's Worker leaves: its mark is cut to the grace")
		close(release)
		require.NoError(t, <-done)
		ewWithin(t, servedC, fmt.Sprintf("qc's run (qa's mark until %d, now %d)", ewUntil(t, b, "qa"), ewServerMs(t, b)))
	})
}
