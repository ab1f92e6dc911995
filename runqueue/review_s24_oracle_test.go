package runqueue_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/fairness"
	"github.com/runqueue/runqueue/internal/redistest"
)

// Probe 24: scripted combinations through the fairness oracle on a real
// Redis; every check of internal/fairness judges the observed schedule,
// and some probes add a bound of their own on top.

type s24Probe struct {
	t   *testing.T
	o   *fairness.Oracle
	err error
	// serve log: key per serve, in order
	log []string
}

func s24Oracle(t *testing.T, vEvery int) *s24Probe {
	t.Helper()
	c := redistest.Real(t)
	p, err := fairness.NewLuaPool(context.Background(), fairness.LuaConfig{Client: c, Prefix: redistest.Prefix(t),
		Lease: time.Minute, MaxAttempts: 1000})
	require.NoError(t, err)
	t.Cleanup(p.Close)
	d, err := p.NewDriver(context.Background())
	require.NoError(t, err)
	return &s24Probe{t: t, o: fairness.New(d, fairness.Config{Lease: time.Minute, MaxAttempts: 1000, VEvery: vEvery})}
}

func (s *s24Probe) do(err error) {
	if s.err == nil {
		s.err = err
	}
}

func (s *s24Probe) enq(key string, n, prio int, delay, ttl time.Duration) []string {
	var ids []string
	for i := 0; i < n && s.err == nil; i++ {
		id, err := s.o.Enqueue(key, prio, delay, ttl)
		s.do(err)
		ids = append(ids, id)
	}
	return ids
}

func (s *s24Probe) deq(n int) []fairness.Served {
	if s.err != nil {
		return nil
	}
	served, err := s.o.Dequeue(n)
	s.do(err)
	for _, x := range served {
		s.log = append(s.log, x.Key)
	}
	return served
}

func (s *s24Probe) ackAll(served []fairness.Served) {
	for _, x := range served {
		if s.err == nil {
			s.do(s.o.Ack(x.ID))
		}
	}
}

func (s *s24Probe) finish() {
	t := s.t
	require.NoError(t, s.err)
	require.NoError(t, s.o.Finish())
	t.Logf("%d operations, %d calls, %d serves", s.o.H.Ops, s.o.H.Calls, s.o.H.Serves)
	if vs := fairness.Run(&s.o.H, fairness.Checks...); len(vs) > 0 {
		t.Fatalf("%s", fairness.Report(&s.o.H, vs))
	}
}

// maxOtherServesBefore returns, for each serve of key k at index i that
// follows a moment "since" (serve index) where k became ready, the largest
// number of serves any single other key got in between.
func s24MaxOthers(log []string, from int, k string) (int, int) {
	counts := map[string]int{}
	for i := from; i < len(log); i++ {
		if log[i] == k {
			m := 0
			for _, c := range counts {
				m = max(m, c)
			}
			return m, i
		}
		counts[log[i]]++
	}
	return -1, -1
}

// TestS24WeightWhileGated: keys at key limit 1 (held for 2 calls) get
// their weights changed while gated, next to a flood key; every oracle
// check (lag with the new weights, newcomer, reachability, work
// conservation, exactly-once, clock) must hold.
func TestS24WeightWhileGated(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	s := s24Oracle(t, 1)
	s.do(s.o.SetLimits(fairness.Limits{Key: 1}))
	s.enq("f", 400, 0, 0, 0)
	for _, k := range []string{"a", "b", "c", "d"} {
		s.enq(k, 60, 0, 0, 0)
	}
	weights := []float64{10, 0.01, 1000, 0.5, 1, 3, 0.001, 2}
	type held struct {
		id  string
		due int
	}
	var hs []held
	for step := 0; step < 400 && s.err == nil; step++ {
		for _, x := range s.deq(2) {
			hs = append(hs, held{x.ID, step + 2})
		}
		if step%7 == 3 {
			// change the weight of a key that is gated right now
			k := []string{"a", "b", "c", "d", "f"}[step%5]
			s.do(s.o.SetWeight(k, weights[step%len(weights)]))
		}
		var keep []held
		for _, h := range hs {
			if h.due <= step && s.err == nil {
				s.do(s.o.Ack(h.id))
			} else {
				keep = append(keep, h)
			}
		}
		hs = keep
	}
	s.finish()
}

// TestS24DrainReturnFlood: a flood key with 10^4 runs; key r holds
// one run at a time and comes back right after each serve (drain and
// return, every call). A returning key registers at its parked tag, at
// most one serve of its own past V (guarantee 3: no credit, but no debt
// beyond its own serve either), so with equal weights it waits at most
// 3 serves of the flood key (guarantee 10's bound, 3 per other active
// key).
func TestS24DrainReturnFlood(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	s := s24Oracle(t, 100)
	s.enq("flood", 10000, 0, 0, 0)
	worst := 0
	for round := 0; round < 400 && s.err == nil; round++ {
		from := len(s.log)
		s.enq("r", 1, 0, 0, 0)
		for i := 0; i < 20 && s.o.Ready("r") > 0 && s.err == nil; i++ {
			s.ackAll(s.deq(1))
		}
		m, _ := s24MaxOthers(s.log, from, "r")
		require.GreaterOrEqual(t, m, 0, "round %d: r never served", round)
		worst = max(worst, m)
		// sometimes let flood run alone a while (r idle: earns no credit)
		if round%50 == 49 {
			for i := 0; i < 30; i++ {
				s.ackAll(s.deq(1))
			}
		}
	}
	t.Logf("worst flood serves before the returning key: %d", worst)
	require.LessOrEqual(t, worst, 3)
	// drain the flood quickly through bigger calls before finish
	for s.o.Ready("flood") > 0 && s.err == nil {
		s.ackAll(s.deq(500))
	}
	s.finish()
}

// TestS24DrainReturnBatchFlood: the same with 5 returners and
// maxCount 5 (section 8 drain-and-return shape) next to a 10^4 flood:
// the flood keeps at least its share of one key among 6 (lag bound), and
// each returner waits at most 3 serves per other active key.
func TestS24DrainReturnBatchFlood(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	s := s24Oracle(t, 100)
	s.enq("flood", 10000, 0, 0, 0)
	rs := []string{"r0", "r1", "r2", "r3", "r4"}
	floodServes, total := 0, 0
	for call := 0; call < 300 && s.err == nil; call++ {
		for _, r := range rs {
			if s.o.Ready(r) == 0 {
				s.enq(r, 1, 0, 0, 0)
			}
		}
		served := s.deq(5)
		for _, x := range served {
			total++
			if x.Key == "flood" {
				floodServes++
			}
		}
		s.ackAll(served)
	}
	t.Logf("flood %d of %d serves", floodServes, total)
	// 6 keys always servable: flood gets >= total/6 - 2
	require.GreaterOrEqual(t, floodServes, total/6-2)
	for s.o.Ready("flood") > 0 && s.err == nil {
		s.ackAll(s.deq(500))
	}
	s.finish()
}

// TestS24NackBackoffFlood: two flood keys; key n's runs are nacked
// with a backoff each time they are served; when a retry comes due it is
// promoted (a newcomer) and must be served within the newcomer bound.
func TestS24NackBackoffFlood(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	s := s24Oracle(t, 1)
	s.enq("f1", 2000, 0, 0, 0)
	s.enq("f2", 2000, 0, 0, 0)
	s.enq("n", 3, 0, 0, 0)
	nacks := map[string]int{}
	for step := 0; step < 600 && s.err == nil; step++ {
		served := s.deq(2)
		for _, x := range served {
			if x.Key == "n" && nacks[x.ID] < 6 {
				nacks[x.ID]++
				s.do(s.o.Nack(x.ID, time.Duration(1+step%4)*time.Second, false))
				continue
			}
			s.do(s.o.Ack(x.ID))
		}
		s.do(s.o.Advance(700 * time.Millisecond))
		if step%40 == 0 {
			s.enq("n", 1, 3, 0, 0)
		}
	}
	for s.o.Ready("f1")+s.o.Ready("f2") > 0 && s.err == nil {
		s.ackAll(s.deq(500))
	}
	s.finish()
}

// TestS24LeaseRecoveryFlood: a flood key holds its key limit of runs,
// workers crash (nothing acked), leases pass and sweeps recover them
// (ready now, attempt+1) while light keys keep arriving.
func TestS24LeaseRecoveryFlood(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	s := s24Oracle(t, 1)
	s.do(s.o.SetLimits(fairness.Limits{Key: 3}))
	s.enq("flood", 3000, 0, 0, 0)
	s.enq("l1", 30, 0, 0, 0)
	s.enq("l2", 30, 0, 0, 0)
	for step := 0; step < 300 && s.err == nil; step++ {
		served := s.deq(3)
		for _, x := range served {
			// light runs finish; flood runs crash half the time
			if x.Key != "flood" || step%2 == 0 {
				s.do(s.o.Ack(x.ID))
			}
		}
		if step%5 == 4 {
			s.do(s.o.Advance(61 * time.Second))
			s.do(s.o.RecoverLeases())
		}
		if step%30 == 0 {
			s.enq(fmt.Sprintf("new%d", step), 2, 0, 0, 0)
		}
	}
	s.do(s.o.SetLimits(fairness.Limits{}))
	for s.o.Ready("flood") > 0 && s.err == nil {
		s.ackAll(s.deq(500))
	}
	s.finish()
}

// TestS24PriorityDelayedLimits: priority runs and delayed runs under
// key limits, with weights and a state expiry mid-flood.
func TestS24PriorityDelayedLimits(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	s := s24Oracle(t, 1)
	s.do(s.o.SetLimits(fairness.Limits{Key: 2, Queue: 5}))
	s.do(s.o.SetWeight("a", 3))
	s.do(s.o.SetWeight("b", 0.5))
	s.enq("a", 500, 0, 0, 0)
	s.enq("b", 500, 0, 0, 0)
	s.enq("c", 500, 9, 0, 0)
	var hs []string
	for step := 0; step < 500 && s.err == nil; step++ {
		for _, x := range s.deq(3) {
			hs = append(hs, x.ID)
		}
		// ack the oldest held
		for len(hs) > 3 && s.err == nil {
			s.do(s.o.Ack(hs[0]))
			hs = hs[1:]
		}
		switch step % 25 {
		case 3:
			s.enq("p", 2, 9, 0, 0)
			s.enq("p", 2, 0, 3*time.Second, 0)
		case 7:
			s.enq("a", 3, 9, 2*time.Second, 0)
			s.enq("d", 3, 1, time.Second, 0)
		case 11:
			s.do(s.o.Advance(time.Second))
		case 19:
			if step == 219 {
				s.do(s.o.ExpireState())
			}
		}
	}
	for _, id := range hs {
		s.do(s.o.Ack(id))
	}
	s.do(s.o.SetLimits(fairness.Limits{}))
	for s.o.Queued() > 0 && s.err == nil {
		s.do(s.o.Advance(time.Second))
		s.ackAll(s.deq(500))
	}
	s.finish()
}
