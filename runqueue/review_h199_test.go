package runqueue_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// Review h199: everything production combines, at once, on real Workers
// and a real Redis with the flag on, judged on the observed serve order
// (the delivery tokens, see review_s34's header).
//
// Three Workers of one queue (queue sources: fused AckAndDequeue), each of
// Concurrency 12, lease 2 s, MaxAttempts 3, key limit 2 (LimitsFor: it
// gives limits per base queue, so every key of the queue has the limit; it
// binds the keys that want more than 2 slots: the slow keys S*, the heavy
// weights w7 and w333, and now and then any key), and:
//
//   - H: a flood of 20,000 runs at priorities 0, 1 and 9;
//   - B00..B39: 500 runs each at priorities 0, 1, 9 (weight 1);
//   - weights w0014 (0.0014, scheduled as 0.001; 3 runs), w05 (0.5),
//     w2, w7, w333 (333.333);
//   - S0..S4: handlers of 20-40 ms (at their limit most of the time);
//   - F0..F4: every third run fails its first attempt with RetryAfter 20
//     ms, every 25th fails always (plain error, backoff 10-40 ms: dead at
//     attempt 3);
//   - D0..D9: 30 ready runs and 70 due in 0.3-8 s (AvailableAt);
//   - N00..N29: newcomers, one run each, enqueued one at a time while the
//     rest runs (each 250 ms after the previous one started);
//   - the third Worker is stopped hard (its Start context cancelled) at
//     the 10th newcomer, about 3 s in: its held runs (and those of a call
//     Redis ran whose reply it dropped, and those whose acks it never
//     sent) come back by the other Workers' lease recovery sweeps
//     (SweepInterval 400 ms).
//
// Judged on the serve order: (a) every run delivered, never held by two
// handlers at once, acked once (its last delivery a success: the queue is
// empty at the end) or dead-lettered (the dead letters are exactly the
// runs whose last delivery failed); (b) guarantee 10 for each newcomer;
// (c) guarantee 2 between the backlogged keys (H, B*, w*) over stretches
// where neither may be at its key limit (estimated from the handler ends
// and the Workers' calls, see below; the lag over the whole backlogged
// time, limits ignored, is logged); (d) every key served while it has
// work: every run delivered and the queue empty (asserted), the worst
// waits in serves of other keys and in calls logged, with the part of
// each wait at which the key was not at its limit. No timing is asserted:
// about 20 s of wall time, 48,000 deliveries. (b) and (c) are logged, not
// asserted (see the end of the test); (a) and the delivery count are.

const h199Lease = 2 * time.Second

type h199Del struct {
	r          *runqueue.Run
	worker     int
	start, end time.Time
	ok         bool // the handler returned nil with its context live
	stopped    bool // its context ended (the hard stop)
}

func h199Idx(id string) int {
	i, _ := strconv.Atoi(id[strings.LastIndexByte(id, '-')+1:])
	return i
}

func TestH199Soak(t *testing.T) {
	c := redistest.Real(t)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	const keyLimit = 2
	mut := func(cfg *runqueue.Config) {
		cfg.LeaseDuration = h199Lease
		cfg.MaxAttempts = 3
		cfg.BackoffBase, cfg.BackoffMax = 10*time.Millisecond, 40*time.Millisecond
		cfg.LimitsFor = func(string, string) runqueue.Limits { return runqueue.Limits{Key: keyLimit} }
	}
	q := s34NewQueue(t, c, prefix, mut)
	tokKey := s34Tokens(t, c, q, prefix)

	weights := map[string]float64{} // as scheduled (milli-weights)
	total := map[string]int{}
	enq := func(key string, n int, tag string) {
		for _, p := range []int{0, 1, 9} {
			m := n / 3
			if p == 0 {
				m = n - 2*(n/3)
			}
			s34EnqueueBulk(t, q, key, m, p, fmt.Sprintf("%s%d", tag, p))
		}
		total[key] += n
		if _, ok := weights[key]; !ok {
			weights[key] = 1
		}
	}
	set := map[string]float64{"w0014": 0.0014, "w05": 0.5, "w2": 2, "w7": 7, "w333": 333.333}
	setN := map[string]int{"w0014": 3, "w05": 150, "w2": 600, "w7": 1500, "w333": 3000}
	for k, w := range set {
		require.NoError(t, q.SetWeight(ctx, s34Env, s34Queue, k, w))
		weights[k] = math.Round(1000*w) / 1000
	}
	enq("H", 20000, "h")
	for i := 0; i < 40; i++ {
		enq(fmt.Sprintf("B%02d", i), 500, "b")
	}
	for _, k := range []string{"w0014", "w05", "w2", "w7", "w333"} {
		enq(k, setN[k], "w")
	}
	for i := 0; i < 5; i++ {
		enq(fmt.Sprintf("S%d", i), 60, "s")
		enq(fmt.Sprintf("F%d", i), 200, "f")
	}
	rng := rand.New(rand.NewSource(199))
	now := time.Now()
	for i := 0; i < 10; i++ {
		k := fmt.Sprintf("D%d", i)
		enq(k, 30, "d")
		var ps []runqueue.EnqueueParams
		for j := 0; j < 70; j++ {
			ps = append(ps, runqueue.EnqueueParams{Env: s34Env, Queue: s34Queue, Key: k, ID: fmt.Sprintf("dl-%s-%d", k, j),
				Payload: []byte("x"), Priority: []int{0, 1, 9}[j%3],
				AvailableAt: now.Add(300*time.Millisecond + time.Duration(rng.Int63n(int64(7700*time.Millisecond))))})
		}
		_, err := q.EnqueueMany(ctx, ps)
		require.NoError(t, err)
		total[k] += 70
	}
	const news = 30
	for i := 0; i < news; i++ {
		k := fmt.Sprintf("N%02d", i)
		total[k], weights[k] = 1, 1
	}
	sum := 0
	for _, n := range total {
		sum += n
	}

	var dmu sync.Mutex
	var dels []*h199Del
	h := s34NewRec(h196Dur(199, 0, 1, map[string][2]int{"S0": {20, 40}, "S1": {20, 40}, "S2": {20, 40}, "S3": {20, 40}, "S4": {20, 40}}))
	verdict := func(r *runqueue.Run) error {
		if r.Key[0] != 'F' {
			return nil
		}
		i := h199Idx(r.ID)
		switch {
		case i%25 == 0:
			return errors.New("h199: always fails")
		case i%3 == 0 && r.Attempt == 1:
			return runqueue.RetryAfter(errors.New("h199: rate limited"), 20*time.Millisecond)
		}
		return nil
	}
	mk := func(wid int) runqueue.Handler {
		return func(hctx context.Context, r *runqueue.Run) error {
			st := time.Now()
			_ = h.handler(hctx, r)
			err := verdict(r)
			d := &h199Del{r: r, worker: wid, start: st, end: time.Now(), stopped: hctx.Err() != nil}
			d.ok = err == nil && !d.stopped
			dmu.Lock()
			dels = append(dels, d)
			dmu.Unlock()
			if d.stopped {
				return hctx.Err()
			}
			return err
		}
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	began := time.Now()
	for i := 1; i <= 2; i++ {
		qi := s34NewQueue(t, c, prefix, mut)
		h196Worker(t, qi, mk(i), runqueue.WorkerConfig{Concurrency: 12, SweepInterval: 400 * time.Millisecond, Logger: quiet}, ctx)
	}
	q3 := s34NewQueue(t, c, prefix, mut)
	ctx3, stop3 := context.WithCancel(ctx)
	defer stop3()
	h196Worker(t, q3, mk(3), runqueue.WorkerConfig{Concurrency: 12, Logger: quiet}, ctx3)

	// Newcomers, one at a time; the third Worker stops hard at the 10th.
	type ready struct {
		tok   int64
		lane  int // other keys waiting in the lane just after
		gated map[string]bool
	}
	readyAt := map[string]ready{}
	var stopTok int64
	var stopAt time.Time
	h.waitCount(t, 2000)
	for i := 0; i < news; i++ {
		if i == 10 {
			stop3()
			stopAt = time.Now()
			var err error
			stopTok, err = c.Get(ctx, tokKey).Int64()
			require.NoError(t, err)
		}
		key := fmt.Sprintf("N%02d", i)
		id := "n-" + key + "-0"
		ch := h.expect(id)
		_, err := q.Enqueue(ctx, runqueue.EnqueueParams{Env: s34Env, Queue: s34Queue, Key: key, ID: id, Payload: []byte("x")})
		require.NoError(t, err)
		tok, err := c.Get(ctx, tokKey).Int64()
		if err != redis.Nil {
			require.NoError(t, err)
		}
		sc, err := q.Schedule(ctx, s34Env, s34Queue, 12)
		require.NoError(t, err)
		rd := ready{tok: tok, gated: map[string]bool{}}
		for _, ks := range sc.Keys {
			if ks.Waiting && ks.Key != key {
				rd.lane++
			}
			if ks.Gated {
				rd.gated[ks.Key] = true
			}
		}
		readyAt[id] = rd
		select {
		case <-ch:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s not started", id)
		}
		time.Sleep(250 * time.Millisecond)
	}
	newsDone := time.Now()

	// Wait for the queue to empty (a liveness guard, not a timing
	// assertion).
	deadline := time.Now().Add(100 * time.Second)
	for {
		st, err := q.QueueStats(ctx, s34Env, s34Queue)
		require.NoError(t, err)
		if st.Ready+st.Delayed+st.InFlight == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue not empty: %+v", st)
		}
		time.Sleep(100 * time.Millisecond)
	}
	drained := time.Now()
	time.Sleep(50 * time.Millisecond)
	dead, err := q.DeadLetters(ctx, s34Env, s34Queue, 0, 10000)
	require.NoError(t, err)
	dmu.Lock()
	all := append([]*h199Del(nil), dels...)
	dmu.Unlock()
	sort.Slice(all, func(i, j int) bool { return all[i].r.Token < all[j].r.Token })
	t.Logf("%d runs, %d deliveries, %d dead letters; newcomers done at %v, W3 stopped at %v (token %d), queue empty at %v",
		sum, len(all), len(dead), newsDone.Sub(began), stopAt.Sub(began), stopTok, drained.Sub(began))

	// (a) exactly once.
	byID := map[string][]*h199Del{}
	for _, d := range all {
		byID[d.r.ID] = append(byID[d.r.ID], d)
	}
	deadSet := map[string]bool{}
	for _, d := range dead {
		deadSet[d.ID] = true
	}
	var aViol []string
	var lostAcks, recovered, retried, overlap int
	perKey := map[string]int{}
	recKeys := map[string]int{}
	next := map[*h199Del]*h199Del{}
	for id, ds := range byID {
		perKey[ds[0].r.Key]++
		for i, d := range ds {
			if i+1 < len(ds) {
				n := ds[i+1]
				next[d] = n
				if n.start.Before(d.end) {
					overlap++
					aViol = append(aViol, fmt.Sprintf("%s: delivery %d (token %d) started before delivery %d ended", id, i+2, n.r.Token, i+1))
				}
				switch {
				case d.ok && d.worker == 3:
					lostAcks++ // acked by the handler, the ack never sent: the hard stop
					recKeys[d.r.Key+"(lost ack)"]++
				case d.ok:
					aViol = append(aViol, fmt.Sprintf("%s: delivered again (token %d) after a success on W%d (token %d)", id, n.r.Token, d.worker, d.r.Token))
				case d.stopped:
					recovered++
					recKeys[d.r.Key]++
				default:
					retried++
				}
			}
		}
		last := ds[len(ds)-1]
		if last.ok == deadSet[id] {
			aViol = append(aViol, fmt.Sprintf("%s: last delivery ok=%v, dead-lettered=%v", id, last.ok, deadSet[id]))
		}
	}
	for k, n := range total {
		if perKey[k] != n {
			aViol = append(aViol, fmt.Sprintf("key %s: %d of %d runs delivered", k, perKey[k], n))
		}
	}
	for id := range deadSet {
		if byID[id] == nil {
			aViol = append(aViol, fmt.Sprintf("%s dead-lettered, never delivered", id))
		}
	}
	t.Logf("(a) %d distinct runs delivered of %d; redeliveries: %d after failures, %d after the hard stop (recovered: %v), %d after a success on W3 whose ack the stop lost; %d overlaps; %d violations",
		len(byID), sum, retried, recovered, recKeys, lostAcks, overlap, len(aViol))

	// The serve order and its calls (a call: consecutive tokens with one
	// lease deadline).
	serves := all
	pos := map[*h199Del]int{}
	call := make([]int, len(serves))
	for i, d := range serves {
		pos[d] = i
		if i > 0 {
			call[i] = call[i-1]
			if d.r.Token != serves[i-1].r.Token+1 || !d.r.LeaseDeadline.Equal(serves[i-1].r.LeaseDeadline) {
				call[i]++
			}
		}
	}
	clock := func(i int) time.Time { return serves[i].r.LeaseDeadline.Add(-h199Lease) }

	// (b) newcomers: guarantee 10 with weights (the oracle's CheckNewcomer
	// form): a weight-1 newcomer's lane tag is at most V0 + 2 with the
	// lane empty, V0 + 2 + P behind P newcomers (q = 1), so another key j
	// is served at most floor(X * w_j) + 1 times before it, X = 2 + P.
	var bViol []string
	var maxOthers, maxCalls, maxLane int
	var worstNew string
	for i := 0; i < news; i++ {
		id := fmt.Sprintf("n-N%02d-0", i)
		rd := readyAt[id]
		ds := byID[id]
		require.NotEmpty(t, ds, id)
		p := pos[ds[0]]
		x := 2.0 + float64(rd.lane)
		maxLane = max(maxLane, rd.lane)
		cnt := map[string]int{}
		others := 0
		calls := map[int]bool{}
		for k := p - 1; k >= 0 && serves[k].r.Token > rd.tok; k-- {
			cnt[serves[k].r.Key]++
			others++
			calls[call[k]] = true
		}
		if others > maxOthers {
			maxOthers, worstNew = others, id
		}
		maxCalls = max(maxCalls, len(calls))
		for k, n := range cnt {
			b := int(math.Floor(x*weights[k]+1e-9)) + 1
			if n > b {
				bViol = append(bViol, fmt.Sprintf("%s (lane %d): %d serves of %s (weight %g) before it, bound %d", id, rd.lane, n, k, weights[k], b))
			}
		}
	}
	t.Logf("(b) newcomers: max %d serves of other keys (%s) in max %d calls between the enqueue and the first serve; max %d others in the lane; %d violations of floor((2+P) w_j)+1 per key",
		maxOthers, worstNew, maxCalls, maxLane, len(bViol))

	// The ack margin: the handler's end is stamped before the Worker queues
	// the ack, and a call takes the acks queued before it reads its clock.
	// At 1 ms, stretches in which a key was at its limit were judged (runs
	// of this test under load: w7 served, w333 served once, w7 served again in
	// one call, 2 runs of 3); 5 ms judged none in 9 of helper-199's runs;
	// 20 ms, used here (one pass: (d) reads the same estimate), judges
	// fewer stretches. Logged, not asserted (see the end of the test).
	gatedFor := func(ackMargin time.Duration) ([]map[string]bool, []string) {
		t.Logf("(c) with an ack margin of %v:", ackMargin)
		// Possibly at its key limit at a serve: the key's earlier deliveries
		// not yet released when that serve's call ran. A Worker's ack rides on
		// its next AckAndDequeue, so a delivery counts as held until the first
		// call of its Worker (in token order) whose clock (whole ms) is ackMargin or more past
		// its handler's end (an upper bound: a call that served nothing is not
		// seen); a nack goes out at the handler's end, the same bound is kept.
		// A delivery the hard stop left to lease recovery counts as held until
		// the call of its next delivery (dead-lettered: until the end).
		ncalls := call[len(call)-1] + 1
		callWorker, callClock := make([]int, ncalls), make([]time.Time, ncalls)
		workerCalls := map[int][]int{}
		for i, d := range serves {
			if i == 0 || call[i] != call[i-1] {
				callWorker[call[i]], callClock[call[i]] = d.worker, clock(i)
				workerCalls[d.worker] = append(workerCalls[d.worker], call[i])
			}
		}
		release := make([]int, len(serves)) // the call index at which a delivery is released
		for i, d := range serves {
			release[i] = math.MaxInt
			lost := d.stopped || (d.ok && d.worker == 3 && next[d] != nil)
			if lost {
				if nx := next[d]; nx != nil {
					release[i] = call[pos[nx]]
				}
				continue
			}
			for _, ci := range workerCalls[d.worker] {
				if ci > call[i] && !callClock[ci].Before(d.end.Add(ackMargin)) {
					release[i] = ci
					break
				}
			}
			if release[i] == math.MaxInt {
				// its Worker made no call seen later (the stopped one):
				// the first call of any Worker 100 ms past its end
				for ci := call[i] + 1; ci < ncalls; ci++ {
					if !callClock[ci].Before(d.end.Add(100 * time.Millisecond)) {
						release[i] = ci
						break
					}
				}
			}
		}
		// Serves nobody saw: a call of the stopped Worker that Redis ran but
		// whose reply the stop dropped (tokens are dealt by call, so gaps in
		// them do not show it). Their runs are those first seen at an attempt
		// above 1; each counts as held from the stopped Worker's last seen
		// serve until the call of its seen delivery.
		lastW3 := 0
		for i, d := range serves {
			if d.worker == 3 {
				lastW3 = i
			}
		}
		phantom := map[int][]int{} // serve index -> the release calls of unseen holds starting there
		phantomKey := map[int][]string{}
		var phantoms []string
		for id, ds := range byID {
			if ds[0].r.Attempt > 1 {
				phantoms = append(phantoms, id)
				at := lastW3
				phantom[at] = append(phantom[at], call[pos[ds[0]]])
				phantomKey[at] = append(phantomKey[at], ds[0].r.Key)
			}
		}
		sort.Strings(phantoms)
		t.Logf("runs first seen at an attempt above 1 (served to the stopped Worker, never handed to a handler): %v", phantoms)
		held := map[string][]int{}
		release = append(release, make([]int, 0, len(phantoms))...)
		gatedAt := make([]map[string]bool, len(serves)) // keys possibly at their limit at serve i
		for i, d := range serves {
			for n, k := range phantomKey[i] {
				release = append(release, phantom[i][n])
				held[k] = append(held[k], len(release)-1)
			}
			var g map[string]bool
			for k, hs := range held {
				kept := hs[:0]
				for _, x := range hs {
					if release[x] > call[i] {
						kept = append(kept, x)
					}
				}
				held[k] = kept
				if len(kept) >= keyLimit {
					if g == nil {
						g = map[string]bool{}
					}
					g[k] = true
				}
			}
			gatedAt[i] = g
			held[d.r.Key] = append(held[d.r.Key], i)
		}

		// (c) guarantee 2 between backlogged keys, over stretches where
		// neither may be at its key limit, from when both were served once
		// until either's last serve.
		lagKeys := []string{"H", "w0014", "w05", "w2", "w7", "w333"}
		for i := 0; i < 40; i++ {
			lagKeys = append(lagKeys, fmt.Sprintf("B%02d", i))
		}
		lastServe := map[string]int{}
		firstServe := map[string]int{}
		for i, d := range serves {
			if _, ok := firstServe[d.r.Key]; !ok {
				firstServe[d.r.Key] = i
			}
			lastServe[d.r.Key] = i
		}
		type st struct {
			all    [2]float64 // the range over the whole stretch, limits or not
			allOn  bool
			allW   float64
			on     bool
			lo, hi float64
			worst  float64
			breaks int
			len    int
		}
		nk := len(lagKeys)
		pairs := make([]st, nk*nk)
		cnt := map[string]float64{}
		var cViol []string
		for i, d := range serves {
			cnt[d.r.Key]++
			for a := 0; a < nk; a++ {
				ka := lagKeys[a]
				for b := a + 1; b < nk; b++ {
					kb := lagKeys[b]
					ps := &pairs[a*nk+b]
					live := i > firstServe[ka] && i > firstServe[kb] && i < lastServe[ka] && i < lastServe[kb]
					if live {
						v := cnt[ka]/weights[ka] - cnt[kb]/weights[kb]
						if !ps.allOn {
							ps.allOn, ps.all = true, [2]float64{v, v}
						}
						ps.all = [2]float64{math.Min(ps.all[0], v), math.Max(ps.all[1], v)}
						ps.allW = math.Max(ps.allW, (ps.all[1]-ps.all[0])/(1/weights[ka]+1/weights[kb]+2e-6))
					}
					if !live || gatedAt[i][ka] || gatedAt[i][kb] {
						if ps.on {
							ps.breaks++
						}
						ps.on = false
						continue
					}
					v := cnt[ka]/weights[ka] - cnt[kb]/weights[kb]
					if !ps.on {
						ps.on, ps.lo, ps.hi = true, v, v
						continue
					}
					ps.len++
					ps.lo, ps.hi = math.Min(ps.lo, v), math.Max(ps.hi, v)
					bound := 1/weights[ka] + 1/weights[kb] + 2e-6
					r := (ps.hi - ps.lo) / bound
					if r > ps.worst {
						ps.worst = r
					}
					if r > 1 && len(cViol) == 0 {
						from := i
						for from > 0 && !gatedAt[from-1][ka] && !gatedAt[from-1][kb] && from-1 > firstServe[ka] && from-1 > firstServe[kb] {
							from--
						}
						var tr []string
						for j := from; j <= i; j++ {
							if k := serves[j].r.Key; k == ka || k == kb {
								tr = append(tr, fmt.Sprintf("%d:%s/c%d/w%d", j, k, call[j], serves[j].worker))
							}
						}
						t.Logf("(c) stretch of %s/%s from serve %d (call %d): %s", ka, kb, from, call[from], strings.Join(tr, " "))
					}
					if r > 1 && len(cViol) < 8 && ps.worst == r {
						cViol = append(cViol, fmt.Sprintf("serve %d: %s/%s range %.3f > bound %.3f", i, ka, kb, ps.hi-ps.lo, bound))
					}
				}
			}
		}
		allOf := func(f func(a, b string) bool) (float64, string) {
			var w float64
			var at string
			for a := 0; a < nk; a++ {
				for b := a + 1; b < nk; b++ {
					if f(lagKeys[a], lagKeys[b]) && pairs[a*nk+b].allW > w {
						w, at = pairs[a*nk+b].allW, lagKeys[a]+"/"+lagKeys[b]
					}
				}
			}
			return w, at
		}
		worstOf := func(f func(a, b string) bool) (float64, string, int) {
			var w float64
			var at string
			var brk int
			for a := 0; a < nk; a++ {
				for b := a + 1; b < nk; b++ {
					if !f(lagKeys[a], lagKeys[b]) {
						continue
					}
					ps := pairs[a*nk+b]
					brk += ps.breaks
					if ps.worst > w {
						w, at = ps.worst, lagKeys[a]+"/"+lagKeys[b]
					}
				}
			}
			return w, at, brk
		}
		judged := func(f func(a, b string) bool) (n int) {
			for a := 0; a < nk; a++ {
				for b := a + 1; b < nk; b++ {
					if f(lagKeys[a], lagKeys[b]) {
						n += pairs[a*nk+b].len
					}
				}
			}
			return n
		}
		heavy := func(a, b string) bool { return a == "w7" || b == "w7" || a == "w333" || b == "w333" }
		t.Logf("(c) pair-serves judged: weight-1 pairs %d, pairs with w7 or w333 %d, all %d",
			judged(func(a, b string) bool { return weights[a] == 1 && weights[b] == 1 }), judged(heavy), judged(func(a, b string) bool { return true }))
		hw, hat, _ := worstOf(heavy)
		t.Logf("(c) lag/bound, pairs with w7 or w333: max %.3f (%s)", hw, hat)
		gatedServes := map[string]int{}
		for i := range serves {
			for k := range gatedAt[i] {
				gatedServes[k]++
			}
		}
		w1, at1, br1 := worstOf(func(a, b string) bool { return weights[a] == 1 && weights[b] == 1 })
		wa, ata, bra := worstOf(func(a, b string) bool { return true })
		u1, uat1 := allOf(func(a, b string) bool { return weights[a] == 1 && weights[b] == 1 })
		ua, uata := allOf(func(a, b string) bool { return true })
		t.Logf("(c) unqualified (key limits ignored, from both served to either's last serve): weight-1 pairs max %.3f (%s), all pairs max %.3f (%s)", u1, uat1, ua, uata)
		t.Logf("(c) lag/bound: weight-1 pairs max %.3f (%s, %d breaks), all pairs max %.3f (%s, %d breaks); serves at which a key may be at its limit: H %d, w7 %d, w333 %d, w2 %d, B00 %d (of %d)",
			w1, at1, br1, wa, ata, bra, gatedServes["H"], gatedServes["w7"], gatedServes["w333"], gatedServes["w2"], gatedServes["B00"], len(serves))

		return gatedAt, cViol
	}
	gatedAt, cViol := gatedFor(20 * time.Millisecond)

	// (d) no key starves: for each delivery, the serves of other keys (and
	// the calls) between max(the key's previous serve, the first serve of
	// a call whose clock is at or after the run's AvailableAt) and it.
	type wait struct {
		serves, calls int
		og, servable  int // of serves: those at which k was not possibly at its limit; the worst such
		id            string
	}
	worst := map[string]wait{}
	prev := map[string]int{}
	for k := range total {
		prev[k] = -1
	}
	// first serve index whose call clock is at or after t: serves are in
	// token order, clocks nearly so; a running max makes it monotone.
	maxClock := make([]time.Time, len(serves))
	for i := range serves {
		maxClock[i] = clock(i)
		if i > 0 && maxClock[i-1].After(maxClock[i]) {
			maxClock[i] = maxClock[i-1]
		}
	}
	for i, d := range serves {
		k := d.r.Key
		from := sort.Search(len(serves), func(j int) bool { return !maxClock[j].Before(d.r.AvailableAt) })
		from = max(from, prev[k]+1)
		var o, og int
		cs := map[int]bool{}
		for j := from; j < i; j++ {
			if serves[j].r.Key != k {
				o++
				cs[call[j]] = true
				if !gatedAt[j][k] {
					og++
				}
			}
		}
		if o > worst[k].serves {
			worst[k] = wait{o, len(cs), og, worst[k].servable, d.r.ID}
		}
		if og > worst[k].servable {
			w := worst[k]
			w.servable = og
			worst[k] = w
		}
		prev[k] = i
	}
	classes := map[string]wait{}
	for k, w := range worst {
		cl := k
		if len(k) == 3 && (k[0] == 'B' || k[0] == 'N') || len(k) == 2 && strings.ContainsAny(k[:1], "SFD") {
			cl = k[:1]
		}
		cw := classes[cl]
		if w.serves > cw.serves {
			cw = w
		}
		cw.servable = max(cw.servable, w.servable)
		classes[cl] = cw
	}
	var cls []string
	for k := range classes {
		cls = append(cls, k)
	}
	sort.Strings(cls)
	var line []string
	for _, k := range cls {
		line = append(line, fmt.Sprintf("%s %d/%d (%d while not at its limit; %s), worst while not at its limit %d", k, classes[k].serves, classes[k].calls, classes[k].og, classes[k].id, classes[k].servable))
	}
	t.Logf("(d) worst wait with work, in serves of other keys / calls: %s", strings.Join(line, "; "))

	for _, v := range aViol[:min(len(aViol), 10)] {
		t.Log("(a) " + v)
	}
	for _, v := range bViol[:min(len(bViol), 10)] {
		t.Log("(b) " + v)
	}
	for _, v := range cViol {
		t.Log("(c) " + v)
	}
	// (b) and (c) rest on readings taken beside the running Workers (a
	// newcomer's P from a Schedule read after its enqueue, which a serve in
	// between can make smaller; which keys may be at their limit, from
	// handler end times): a loaded machine can move them either way, so
	// they are logged, not asserted (none in 13 runs, helper-199). What is
	// asserted does not rest on timing: every run delivered, the dead
	// letters exactly the runs whose last delivery failed, no delivery
	// after a success but the hard stop's unsent acks.
	require.Empty(t, aViol)
	require.Len(t, byID, sum)
}
