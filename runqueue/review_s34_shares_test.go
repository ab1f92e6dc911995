package runqueue_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// s34Lag checks guarantee 2 on the serve sequence (by delivery token) from
// its start until the first serve that takes some key's last run (every
// key has a ready run until then: all runs were enqueued before the Worker
// started and none is nacked). Guarantee 2 (docs/design.md section 7):
// "Two keys i and j that stay servable over a stretch of the serve sequence
// get n_i, n_j serves with |n_i/w_i - n_j/w_j| <= 1/w_i + 1/w_j (plus 2
// units of rounding), at every prefix, inside a batch too."
// It returns the largest ratio of the deviation to the bound, and on the
// handler start order (logged only) the same figure.
func s34Lag(t *testing.T, seq []*runqueue.Run, w map[string]float64, total map[string]int) (float64, []string) {
	n := map[string]float64{}
	left := map[string]int{}
	for k, x := range total {
		left[k] = x
	}
	var worst float64
	var viol []string
	ks := make([]string, 0, len(w))
	for k := range w {
		ks = append(ks, k)
	}
	for idx, r := range seq {
		n[r.Key]++
		left[r.Key]--
		for a := 0; a < len(ks); a++ {
			for b := a + 1; b < len(ks); b++ {
				i, j := ks[a], ks[b]
				d := math.Abs(n[i]/w[i] - n[j]/w[j])
				bound := 1/w[i] + 1/w[j] + 2e-6
				worst = math.Max(worst, d/bound)
				if d > bound && len(viol) < 5 {
					viol = append(viol, fmt.Sprintf("serve %d: |n_%s/%g - n_%s/%g| = |%g/%g - %g/%g| = %g > %g",
						idx, i, w[i], j, w[j], n[i], w[i], n[j], w[j], d, bound))
				}
			}
		}
		if left[r.Key] == 0 {
			break
		}
	}
	return worst, viol
}

// TestS34WorkerWeights: keys A, B, C at weights 1, 2, 4 with 1000 x w runs
// each, served by a Worker (concurrency 32 and 100, handlers 0-3 ms; and
// a queue-source Worker next to a shard-source Worker): guarantee 2 at
// every prefix of the serve sequence while all three are backlogged.
func TestS34WorkerWeights(t *testing.T) {
	for _, mode := range []struct {
		name string
		conc int
		two  bool
	}{{"c32", 32, false}, {"c100", 100, false}, {"queue+shard-c32", 32, true}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			c := redistest.Real(t)
			prefix := redistest.Prefix(t)
			q := s34NewQueue(t, c, prefix, nil)
			w := map[string]float64{"A": 1, "B": 2, "C": 4}
			total := map[string]int{}
			sum := 0
			for k, x := range w {
				require.NoError(t, q.SetWeight(t.Context(), s34Env, s34Queue, k, x))
				total[k] = int(1000 * x)
				sum += total[k]
			}
			for _, k := range []string{"A", "B", "C"} {
				s34EnqueueBulk(t, q, k, total[k], 0, "w")
			}
			h := s34NewRec(s34RandDur(3))
			s34Start(t, q, h, runqueue.WorkerConfig{Queues: []runqueue.WorkerQueue{{Env: s34Env, Queue: s34Queue}},
				Concurrency: mode.conc})
			if mode.two {
				q2 := s34NewQueue(t, c, prefix, nil)
				s34Start(t, q2, h, runqueue.WorkerConfig{Shards: []int{q2.ShardOf(s34Env)}, Concurrency: mode.conc})
			}
			h.waitCount(t, sum)
			starts := h.snapshot()
			worst, viol := s34Lag(t, s34Serves(starts), w, total)
			sworst, _ := s34Lag(t, starts, w, total)
			t.Logf("%s: lag/bound max %.3f on the serve sequence, %.3f on the handler start order", mode.name, worst, sworst)
			require.Empty(t, viol)
		})
	}
}

// TestS34WorkerPriorities: ten keys P0..P9, key Pp holding 300 runs at
// priority p, and a key M holding 300 runs of mixed priorities, all
// enqueued before the Worker starts. Priority orders runs inside a key
// only ("priority inside a key, as a bounded head start"; section 6, Ties:
// "Inside a key, priority and age order hold"), so across keys the equal
// weights give guarantee 2: |n_i - n_j| <= 2 at every prefix while all are
// backlogged, whatever their priorities (P0 is not starved by P9). Inside
// M, the serve sequence holds priorities in non-increasing order (all of
// M's runs were enqueued within PriorityStep of each other).
func TestS34WorkerPriorities(t *testing.T) {
	t.Parallel()
	c := redistest.Real(t)
	prefix := redistest.Prefix(t)
	q := s34NewQueue(t, c, prefix, nil)
	w := map[string]float64{}
	total := map[string]int{}
	sum := 0
	for p := 0; p <= runqueue.MaxPriority; p++ {
		k := fmt.Sprintf("P%d", p)
		w[k], total[k] = 1, 300
		s34EnqueueBulk(t, q, k, 300, p, "p")
		sum += 300
	}
	for i := 0; i < 300; i++ {
		s34EnqueueBulk(t, q, "M", 1, (i*7)%(runqueue.MaxPriority+1), fmt.Sprintf("m%d", i))
	}
	w["M"], total["M"] = 1, 300
	sum += 300
	h := s34NewRec(s34RandDur(3))
	s34Start(t, q, h, runqueue.WorkerConfig{Queues: []runqueue.WorkerQueue{{Env: s34Env, Queue: s34Queue}},
		Concurrency: 32})
	h.waitCount(t, sum)
	serves := s34Serves(h.snapshot())
	worst, viol := s34Lag(t, serves, w, total)
	last := runqueue.MaxPriority + 1
	var inv []string
	for i, r := range serves {
		if r.Key != "M" {
			continue
		}
		if r.Priority > last && len(inv) < 5 {
			inv = append(inv, fmt.Sprintf("serve %d: M's %s at priority %d after one at %d", i, r.ID, r.Priority, last))
		}
		last = r.Priority
	}
	t.Logf("priorities: lag/bound max %.3f", worst)
	require.Empty(t, viol)
	require.Empty(t, inv)
}

// TestS34WorkerWeightRaised: A and B at weight 1, 4000 runs each, served
// by a Worker of concurrency 32 (handlers 0-3 ms); once 1,000 handlers
// started, B's weight is raised to 4 under load. Guarantee 2: "another
// servable key j gets n_j / w_j <= D + 1/w_j before k's next serve, with D
// = 1/w_k (the cap) for a competing ... key": A gets at most 1/4 + 1, so 1
// serve, between the change (the token read after SetWeight returned) and
// B's next serve; and from once both are served after the change, |n_A/1
// - n_B/4| <= 1 + 1/4 at every prefix while both are backlogged.
func TestS34WorkerWeightRaised(t *testing.T) {
	t.Parallel()
	c := redistest.Real(t)
	prefix := redistest.Prefix(t)
	q := s34NewQueue(t, c, prefix, nil)
	tokKey := s34Tokens(t, c, q, prefix)
	s34EnqueueBulk(t, q, "A", 4000, 0, "a")
	s34EnqueueBulk(t, q, "B", 4000, 0, "b")
	h := s34NewRec(s34RandDur(3))
	s34Start(t, q, h, runqueue.WorkerConfig{Queues: []runqueue.WorkerQueue{{Env: s34Env, Queue: s34Queue}},
		Concurrency: 32})
	h.waitCount(t, 1000)
	require.NoError(t, q.SetWeight(t.Context(), s34Env, s34Queue, "B", 4))
	tok, err := c.Get(t.Context(), tokKey).Int64()
	require.NoError(t, err)
	h.waitCount(t, 8000)
	serves := s34Serves(h.snapshot())
	var after []*runqueue.Run
	left := map[string]int{"A": 4000, "B": 4000}
	for _, r := range serves {
		if r.Token > tok {
			after = append(after, r)
		} else {
			left[r.Key]--
		}
	}
	var aBefore int
	for _, r := range after {
		if r.Key == "B" {
			break
		}
		aBefore++
	}
	seen := map[string]bool{}
	i := 0
	for ; i < len(after) && !(seen["A"] && seen["B"]); i++ {
		seen[after[i].Key] = true
	}
	for _, r := range after[:i] {
		left[r.Key]--
	}
	worst, viol := s34Lag(t, after[i:], map[string]float64{"A": 1, "B": 4}, left)
	t.Logf("weight raised: %d serves of A before B's next serve (bound 1); lag/bound max %.3f after", aBefore, worst)
	require.LessOrEqual(t, aBefore, 1)
	require.Empty(t, viol)
}
