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
// waiting line (Queue.leaveLine): the mark is cut to a second, and the
// queue's other consumers are woken to renew it.

// ewLeaveSetup: env limit 1 (poll 30 s: a mark lives 61 s), qa holding the
// env's one slot with runs left, and workers Workers over qb (one run),
// each idle once qb is marked. It returns the run qa holds.
func ewLeaveSetup(t *testing.T, b *testBundle, workers int) ([]*runqueue.Run, []*runqueue.Worker) {
	ewEnqueue(t, b, "qa", 3)
	ewEnqueue(t, b, "qb", 1)
	a := ewTake(t, b, nil, "qa")
	require.Len(t, a, 1)
	ws := make([]*runqueue.Worker, workers)
	for i := range ws {
		ws[i] = startWorker(t, b.q, func(context.Context, *runqueue.Run) error { return nil }, func(cfg *runqueue.WorkerConfig) {
			cfg.Queues = []runqueue.WorkerQueue{{Env: env, Queue: "qb"}}
		})
	}
	require.Eventually(t, func() bool { return ewMarked(t, b, "qb") }, 10*time.Second, 5*time.Millisecond,
		"the Workers' dequeues find the env full and mark qb")
	return a, ws
}

// TestEnvWaitingWorkerLeaves: the lone Worker over qb stops: qb's mark is
// cut to a second past the stop by Redis's clock (before: it lived its 61
// s, every free slot of the env left to a queue nobody served), and once
// it lapses qa's fused call takes its slot back.
func TestEnvWaitingWorkerLeaves(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b, _ := ewSetup(t, c, true, 1)
		a, ws := ewLeaveSetup(t, b, 1)
		require.Greater(t, ewUntil(t, b, "qb"), ewServerMs(t, b)+30_000, "a held Worker's mark lives two polls and a second")
		require.Empty(t, ewTake(t, b, nil, "qa"), "the env is full")
		shutdown(t, ws[0])
		after := ewServerMs(t, b)
		until := ewUntil(t, b, "qb")
		require.LessOrEqual(t, until, after+1000, "the stopped Worker's mark is cut to a second")
		for ewServerMs(t, b) <= until {
			time.Sleep(50 * time.Millisecond)
		}
		a2 := ewTake(t, b, a, "qa")
		require.Len(t, a2, 1, "qb's mark lapsed: the slot is qa's")
		require.False(t, ewMarked(t, b, "qb"))
	})
}

// TestEnvWaitingWorkerLeavesOthersStay: two Workers over qb, and qc waiting
// behind qb; one of qb's Workers stops: the other, woken, renews qb's mark
// in its place, and the slot qa's ack frees is still left to qb after the
// cut second (a mark dropped at the stop would send qb to the back of the
// line, behind qc).
func TestEnvWaitingWorkerLeavesOthersStay(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b, _ := ewSetup(t, c, true, 1)
		a, ws := ewLeaveSetup(t, b, 2)
		ewEnqueue(t, b, "qc", 1)
		require.Empty(t, ewTake(t, b, nil, "qc"), "the env is full")
		require.True(t, ewMarked(t, b, "qc"), "qc waits behind qb")
		line := ewSpace(t, b).Env(env).Waiting()
		place, err := b.client.ZScore(b.ctx, line, keys.QueueMember(env, "qb")).Result()
		require.NoError(t, err)
		shutdown(t, ws[0])
		cut := ewServerMs(t, b) + 1000
		lives := ewSpace(t, b).Env(env).WaitingUntil()
		require.Eventually(t, func() bool {
			until, err := b.client.HGet(b.ctx, lives, keys.QueueMember(env, "qb")).Int64()
			return err == nil && until > cut+10_000
		}, 10*time.Second, 5*time.Millisecond,
			"the Worker left over qb renews the mark")
		for ewServerMs(t, b) <= cut {
			time.Sleep(50 * time.Millisecond)
		}
		again, err := b.client.ZScore(b.ctx, line, keys.QueueMember(env, "qb")).Result()
		require.NoError(t, err)
		require.Equal(t, fmt.Sprint(place), fmt.Sprint(again), "qb keeps its place")
		require.Empty(t, ewTake(t, b, a, "qa"), "the slot qa's ack frees is left to qb")
	})
}
