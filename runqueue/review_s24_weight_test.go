package runqueue_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// TestS24WeightRaisedOwesOneServe: three keys, all backlogged and
// servable throughout (no limits, every serve acked at once). The
// operator sets x's weight to 0.001 by mistake; x is served once at that
// weight; the operator corrects it back to 1. From the correction on, x
// and y both stay servable with equal, unchanged weights 1, so guarantee
// 2 (docs/design.md section 7, "under weight changes": guarantee 12)
// bounds |n_x/1 - n_y/1| by 1/1 + 1/1 (+ rounding) at every prefix of
// the serves that follow. Maxcount 1 per call.
func TestS24WeightRaisedOwesOneServe(t *testing.T) {
	b := s24Setup(t, nil)
	for _, k := range []string{"x", "y", "z"} {
		s24Enq(t, b, k, 2200, "x")
	}
	require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, "x", 0.001))
	// serve until x has been served once at weight 0.001
	servedX := false
	for i := 0; i < 10 && !servedX; i++ {
		runs := dequeue(t, b, queueName, 1)
		for _, r := range runs {
			servedX = servedX || r.Key == "x"
		}
		ackAll(t, b, runs)
	}
	require.True(t, servedX)
	require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, "x", 1)) // the correction
	nx, ny, worst := 0, 0, 0
	firstX := -1
	for i := 0; i < 2150 && firstX < 0; i++ {
		runs := dequeue(t, b, queueName, 1)
		require.Len(t, runs, 1)
		switch runs[0].Key {
		case "x":
			nx++
			if firstX < 0 {
				firstX = i
			}
		case "y":
			ny++
		}
		worst = max(worst, ny-nx, nx-ny)
		ackAll(t, b, runs)
	}
	t.Logf("after the correction: x first served at serve %d; x %d, y %d serves; worst |n_x - n_y| = %d", firstX, nx, ny, worst)
	require.LessOrEqual(t, worst, 2, "lag bound 1/w_x + 1/w_y = 2 broken: x (weight 1 again) waits out the stride of its old weight")
}

// TestS24WeightRaisedWhileGated: the same through a gated key: x is
// at its key limit (1) when its weight is corrected from 0.001 to 1;
// after its slot frees, x and y (both weight 1) stay servable, and
// guarantee 2 bounds |n_x - n_y| by 2 at every prefix.
func TestS24WeightRaisedWhileGated(t *testing.T) {
	b := s24Setup(t, func(c *runqueue.Config) { c.KeyConcurrency = 1 })
	for _, k := range []string{"x", "y", "z"} {
		s24Enq(t, b, k, 400, "x")
	}
	require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, "x", 0.001))
	var heldX *runqueue.Run
	for i := 0; i < 10 && heldX == nil; i++ {
		for _, r := range dequeue(t, b, queueName, 1) {
			if r.Key == "x" {
				heldX = r
			} else {
				require.NoError(t, b.q.Ack(b.ctx, r))
			}
		}
	}
	require.NotNil(t, heldX)
	require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, "x", 1)) // corrected while x is gated
	require.NoError(t, b.q.Ack(b.ctx, heldX))                        // x competes again
	nx, ny, worst := s24Lag(t, b, 300)
	t.Logf("after the correction and release: x %d, y %d serves; worst |n_x - n_y| = %d", nx, ny, worst)
	require.LessOrEqual(t, worst, 2)
}

// TestS24WeightRaisedWhileParked: the same through a parked tag: x, at
// weight 0.001, is served its only run and drains, its tag parked 1000
// serves ahead; its weight is corrected to 1 while it has no run; when x
// comes back it returns at the parked tag, which the correction capped at
// one serve ahead of V, so guarantee 2 bounds |n_x - n_y| by 2 from its
// return on.
func TestS24WeightRaisedWhileParked(t *testing.T) {
	b := s24Setup(t, nil)
	s24Enq(t, b, "x", 1, "a")
	for _, k := range []string{"y", "z"} {
		s24Enq(t, b, k, 400, "a")
	}
	require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, "x", 0.001))
	drained := false
	for i := 0; i < 10 && !drained; i++ {
		runs := dequeue(t, b, queueName, 1)
		for _, r := range runs {
			drained = drained || r.Key == "x"
		}
		ackAll(t, b, runs)
	}
	require.True(t, drained)
	ks, err := b.q.KeyStats(b.ctx, env, queueName, "x")
	require.NoError(t, err)
	require.Zero(t, ks.Ready, "x has drained")
	require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, "x", 1)) // corrected while parked
	s24Enq(t, b, "x", 300, "b")
	nx, ny, worst := s24Lag(t, b, 300)
	t.Logf("after the correction and return: x %d, y %d serves; worst |n_x - n_y| = %d", nx, ny, worst)
	require.LessOrEqual(t, worst, 2)
}

// s24Lag serves n runs one call each, acking each, and returns the serves
// of x and y and the largest |n_x - n_y| at any prefix.
func s24Lag(t *testing.T, b *testBundle, n int) (nx, ny, worst int) {
	t.Helper()
	for range n {
		runs := dequeue(t, b, queueName, 1)
		require.Len(t, runs, 1)
		switch runs[0].Key {
		case "x":
			nx++
		case "y":
			ny++
		}
		worst = max(worst, ny-nx, nx-ny)
		ackAll(t, b, runs)
	}
	return nx, ny, worst
}
