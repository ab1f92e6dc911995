package runqueue_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/fairness"
)

// h195StaleHead: a and b backlogged (served once each); h (weight 1)
// registers as the lane's head; a flag-off call drains it (the scheduler
// keeps it waiting in the lane, stale); the flag on again, u of weight w
// registers behind it. The oracle gives u P = 0 (h holds no ready run), so
// its bound is 2q = 2/w, but u becomes head only at h's stale tag (up to
// V0 + 2) when pass 1 collects h.
func h195StaleHead(t *testing.T, o *fairness.Oracle, w float64) {
	t.Helper()
	do := func(err error) { t.Helper(); require.NoError(t, err) }
	enq := func(k string, prio int) { t.Helper(); _, err := o.Enqueue(k, prio, 0, 0); do(err) }
	deq := func(n int) {
		t.Helper()
		served, err := o.Dequeue(n)
		do(err)
		for _, s := range served {
			do(o.Ack(s.ID))
		}
	}
	for i := 0; i < 3; i++ {
		enq("a", 0)
		enq("b", 0)
	}
	deq(2)
	do(o.Advance(time.Millisecond))
	enq("h", 9) // priority: the flag-off age order serves it first
	do(o.SetFlag(false))
	deq(1)
	do(o.SetFlag(true))
	do(o.SetWeight("u", w))
	enq("u", 0)
	for i := 0; i < 6; i++ {
		enq("a", 0)
		enq("b", 0)
		deq(1)
	}
	do(o.Finish())
}

// TestReviewH195StaleLaneHead: at weight 8 the schedule (a and b twice
// each before u, as the lane gives: u heads the lane at h's stale tag,
// V0 + 2) failed CheckNewcomer's 2q = 0.25 at 58cd1cc: a false positive
// of the new bound (the weight-1 bound, 2 + P = 2, held it). With a key a
// flag-off call drained (Event.Stale) the bound is 2 + P again: both
// weights pass, and u registers with Stale set.
func TestReviewH195StaleLaneHead(t *testing.T) {
	for _, b := range foBackends {
		t.Run(b.name, func(t *testing.T) {
			for _, w := range []float64{1, 8} {
				p, mini := foPool(t, b, 0)
				o := foOracleOn(t, p, mini, 1)
				h195StaleHead(t, o, w)
				vs := fairness.Run(&o.H, fairness.Checks...)
				for _, v := range vs {
					t.Logf("w=%g: %s", w, v.Msg)
				}
				require.Empty(t, vs)
				stale := false
				for _, e := range o.H.Events {
					if e.Kind == fairness.EvRegister && e.Key == "u" {
						stale = e.Stale
					}
				}
				require.True(t, stale, "u registers beside h, which a flag-off call drained")
			}
		})
	}
}
