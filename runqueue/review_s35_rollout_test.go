package runqueue_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math/rand"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// Review s35: a rolling rollout and partial rollback of the scheduler flag
// under a load driven by Workers, on a real Redis of the test's own:
//
//	P1 (0-6s)    two flag-off and two flag-on Workers on one queue
//	P2 (6-10s)   the flag-off Workers stop: flag on only
//	P3 (10-13s)  the flag-on Workers stop (a pause of every flag-on dequeue
//	             three times StateTTL) and one flag-off Worker comes back
//	             (the partial rollback); flag-on producers keep enqueueing
//	P4 (13-18s)  two flag-on Workers again beside the flag-off one
//	drain        producers stop; every Worker runs until the queue is empty
//
// Producers (one on a flag-off Queue, one on a flag-on Queue) enqueue a
// trickle on 44 keys (priorities, delays, TTLs) and bursts on one flood
// key; handlers fail now and then (a plain error: backoff; RetryAfter),
// some outlast the lease (the Worker's heartbeat extends it), poison runs
// always fail (dead after MaxAttempts); a consumer that "crashes" takes 3
// runs every 400 ms by Dequeue (flag on and off in turn, flag off only
// during the pause) and drops them, for the sweeps of both flags to
// recover. Weights 3, 3, 2, 2 and 0.5 on five trickle keys. StateTTL 1 s,
// lease 600 ms, key limit 20 (the flood can take every Worker slot) or 3
// with trickle bursts (trickle keys are gated).
//
// Asserted: every run queued succeeded exactly once (handler returns nil
// counted per run id), but runs expired by TTL (as many as the Observer's
// Expired) and runs that failed or were dropped MaxAttempts times (dead);
// QueueStats at rest zero but the dead; after StateTTL only the layout
// version, the weights hash and the shard's token counter left under the
// prefix; guarantee 10's bound (3 x 45 flag-on serves of the flood key)
// for every trickle run a flag-on Worker served. Logged: the waits of the
// trickle keys per phase (from when the key was servable: a run ready, its
// previous serve done, below its limit), in ms and in serves of the flood
// key meanwhile. S35_DUMP=1 prints the serve sequence.

const (
	s35rEnv, s35rQueue = "s35", "work"
	s35rTrickle        = 44
	s35rMaxAttempts    = 5
)

type s35rDelivery struct {
	id, key       string
	attempt       int
	token         int64
	avail, served time.Time // AvailableAt; the dequeue's now (Observer.Dequeued)
	start, end    time.Time // handler
	ok            bool
	x             float64
	why           string
	worker        string
	flagOn        bool
}

type s35rObs struct {
	runqueue.NopObserver
	mu        sync.Mutex
	served    map[int64]time.Time // token -> dequeue now
	expired   atomic.Int64
	recovered atomic.Int64
	recDead   atomic.Int64
	lost      atomic.Int64
	acked     atomic.Int64
}

func (o *s35rObs) Dequeued(runs []*runqueue.Run, now time.Time) {
	o.mu.Lock()
	for _, r := range runs {
		o.served[r.Token] = now
	}
	o.mu.Unlock()
}
func (o *s35rObs) Expired(_, _ string, n int) { o.expired.Add(int64(n)) }
func (o *s35rObs) Recovered(_, _ string, n, dead int) {
	o.recovered.Add(int64(n))
	o.recDead.Add(int64(dead))
}
func (o *s35rObs) Acked(_, _ string, n int) { o.acked.Add(int64(n)) }
func (o *s35rObs) Handled(_, _ string, _ time.Duration, out runqueue.Outcome) {
	if out == runqueue.OutcomeLeaseLost {
		o.lost.Add(1)
	}
}

type s35rRun struct {
	key     string
	ttl     bool
	poison  bool
	delayed bool
}

type s35rRec struct {
	mu    sync.Mutex
	dels  []*s35rDelivery
	succ  map[string]int
	fails map[string]int
	runs  map[string]s35rRun
	crash map[string]int // deliveries a "crashed consumer" took and dropped
}

func (h *s35rRec) handler(name string, flagOn bool) runqueue.Handler {
	return func(ctx context.Context, r *runqueue.Run) error {
		d := &s35rDelivery{id: r.ID, key: r.Key, attempt: r.Attempt, token: r.Token, avail: r.AvailableAt,
			start: time.Now(), worker: name, flagOn: flagOn}
		h.mu.Lock()
		info := h.runs[r.ID]
		// Drawn per (run, attempt) from a hash, not from one shared
		// math/rand stream: with that stream, runs failed all five attempts
		// far more often than 0.08^5 allows (one drew x 0.034, 0.060,
		// 0.060, 0.061, 0.097), as if a run retried at a steady rate met
		// correlated draws of the stream (not investigated further).
		x := s35rUniform(r.ID, r.Attempt, 1)
		y := s35rUniform(r.ID, r.Attempt, 2)
		d.x = x
		h.dels = append(h.dels, d)
		h.mu.Unlock()
		var sleep time.Duration
		switch {
		case !info.poison && (x < 0.005 && info.key != "flood" || x < 0.001):
			sleep = 1500 * time.Millisecond // 2.5 leases: the heartbeat must extend it
		default:
			sleep = time.Duration(y*30000) * time.Microsecond // 0-30 ms
		}
		select {
		case <-time.After(sleep):
		case <-ctx.Done():
			d.why = "ctx: " + context.Cause(ctx).Error()
			h.fin(d, false)
			return ctx.Err()
		}
		if info.poison {
			d.why = "poison"
			h.fin(d, false)
			return errors.New("poison")
		}
		switch {
		case x >= 0.03 && x < 0.07:
			d.why = "flaky"
			h.fin(d, false)
			return errors.New("flaky") // backoff
		case x >= 0.07 && x < 0.11:
			d.why = "rate"
			h.fin(d, false)
			return runqueue.RetryAfter(errors.New("rate limited"), 30*time.Millisecond)
		}
		h.fin(d, true)
		return nil
	}
}

// s35rUniform is a uniform value in [0, 1) drawn from id, attempt and k.
func s35rUniform(id string, attempt, k int) float64 {
	f := fnv.New64a()
	fmt.Fprintf(f, "%s|%d|%d", id, attempt, k)
	v := f.Sum64()
	v ^= v >> 33 // fmix64: FNV's high bits mix poorly
	v *= 0xff51afd7ed558ccd
	v ^= v >> 33
	v *= 0xc4ceb9fe1a85ec53
	v ^= v >> 33
	return float64(v>>11) / (1 << 53)
}

func (h *s35rRec) fin(d *s35rDelivery, ok bool) {
	h.mu.Lock()
	d.end, d.ok = time.Now(), ok
	if ok {
		h.succ[d.id]++
	} else {
		h.fails[d.id]++
	}
	h.mu.Unlock()
}

type s35rParams struct {
	keyLimit int           // Config.KeyConcurrency
	burst    int           // a trickle tick enqueues 1..burst runs of one key
	tick     time.Duration // between trickle ticks, per producer
	floodPre int           // flood runs queued before the Workers start, per writer flag
	floodSec int           // flood runs a producer adds each second
}

// TestS35RolloutRollbackUnderWorkers: a key limit of 20 (the flood key can
// take every Worker slot: only the scheduler keeps the trickle keys going).
func TestS35RolloutRollbackUnderWorkers(t *testing.T) {
	t.Parallel() // its own redis-server; its checks count runs and serves, not time
	if testing.Short() {
		t.Skip("about 30 s")
	}
	s35rScenario(t, s35rParams{keyLimit: 20, burst: 1, tick: 12 * time.Millisecond, floodPre: 4000, floodSec: 300})
}

// TestS35RolloutRollbackGated: a key limit of 3 and trickle bursts of up to
// 8 runs of a key, so that trickle keys reach their limit and are gated by
// flag-on dequeues while flag-off Workers free their slots (the gated
// probe's exception of guarantee 6).
func TestS35RolloutRollbackGated(t *testing.T) {
	t.Parallel() // its own redis-server; its checks count runs and serves, not time
	if testing.Short() {
		t.Skip("about 30 s")
	}
	s35rScenario(t, s35rParams{keyLimit: 3, burst: 8, tick: 50 * time.Millisecond, floodPre: 600, floodSec: 40})
}

func s35rScenario(t *testing.T, pr s35rParams) {
	addr := ownRedis(t)
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	const prefix = "s35"
	const stateTTL = time.Second

	obs := &s35rObs{served: map[int64]time.Time{}}
	newQ := func(on bool) *runqueue.Queue {
		cfg := runqueue.Config{Prefix: prefix, VtimeScheduling: on, LeaseDuration: 600 * time.Millisecond,
			StateTTL: stateTTL, KeyConcurrency: pr.keyLimit, MaxAttempts: s35rMaxAttempts,
			BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond, Observer: obs}
		q, err := runqueue.New(ctx, c, &cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = q.Close() })
		return q
	}
	offA, offB, onA, onB := newQ(false), newQ(false), newQ(true), newQ(true)
	sp, err := keys.NewSpace(prefix, onA.Config().Shards)
	require.NoError(t, err)
	qk := sp.Env(s35rEnv).Queue(s35rQueue)

	h := &s35rRec{succ: map[string]int{}, fails: map[string]int{}, runs: map[string]s35rRun{}, crash: map[string]int{}}
	weights := map[string]float64{"t00": 3, "t01": 3, "t02": 2, "t03": 2, "t04": 0.5}
	for k, w := range weights {
		require.NoError(t, onA.SetWeight(ctx, s35rEnv, s35rQueue, k, w))
	}

	var enqMu sync.Mutex
	enqAt := map[string]time.Time{}
	enq := func(q *runqueue.Queue, ps []runqueue.EnqueueParams, meta []s35rRun) {
		h.mu.Lock()
		for i, p := range ps {
			h.runs[p.ID] = meta[i]
		}
		h.mu.Unlock()
		now := time.Now()
		res, err := q.EnqueueMany(ctx, ps)
		require.NoError(t, err)
		enqMu.Lock()
		for i, r := range res {
			require.NoError(t, r.Err)
			require.True(t, r.Queued, ps[i].ID)
			enqAt[ps[i].ID] = now
		}
		enqMu.Unlock()
	}
	flood := func(q *runqueue.Queue, tag string, n int) {
		ps := make([]runqueue.EnqueueParams, 0, n)
		meta := make([]s35rRun, 0, n)
		for i := range n {
			p := runqueue.EnqueueParams{Env: s35rEnv, Queue: s35rQueue, Key: "flood", ID: fmt.Sprintf("f-%s-%d", tag, i), Payload: []byte("f")}
			if i%10 == 0 {
				p.Priority = 5
			}
			ps = append(ps, p)
			meta = append(meta, s35rRun{key: "flood"})
		}
		for i := 0; i < n; i += 1000 {
			enq(q, ps[i:min(i+1000, n)], meta[i:min(i+1000, n)])
		}
	}
	// The backlog: half written flag off (found by discovery), half flag on.
	flood(offA, "pre-off", pr.floodPre)
	flood(onA, "pre-on", pr.floodPre)

	// Workers.
	type wk struct {
		w    *runqueue.Worker
		name string
	}
	startW := func(q *runqueue.Queue, name string) *wk {
		w, err := runqueue.NewWorker(q, h.handler(name, q.Config().VtimeScheduling), &runqueue.WorkerConfig{
			Queues:        []runqueue.WorkerQueue{{Env: s35rEnv, Queue: s35rQueue}},
			Concurrency:   6,
			SweepInterval: 300 * time.Millisecond,
			Logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		require.NoError(t, err)
		require.NoError(t, w.Start(context.Background()))
		x := &wk{w: w, name: name}
		t.Cleanup(func() {
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = w.Shutdown(sctx)
		})
		return x
	}
	stopW := func(x *wk) {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, x.w.Shutdown(sctx), x.name)
	}

	// State watcher: counts the lapses of the scheduler state.
	var lapses, appear atomic.Int64
	var lapseAt, resetAt atomic.Value // last lapse, reset, since t0
	var resets atomic.Int64
	t0 := time.Now()
	watchStop := make(chan struct{})
	var watchWG sync.WaitGroup
	watchWG.Add(1)
	go func() {
		defer watchWG.Done()
		prev := false
		var lastV, lastE int64
		for {
			select {
			case <-watchStop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			vs, err := c.HMGet(ctx, qk.CkVtimeState(), "v", "e").Result()
			if err != nil {
				continue
			}
			n := int64(0)
			if vs[0] != nil {
				n = 1
				var v, e int64
				_, _ = fmt.Sscan(vs[0].(string), &v)
				if vs[1] != nil {
					_, _ = fmt.Sscan(vs[1].(string), &e)
				}
				if e < lastE || e == lastE && v < lastV {
					resets.Add(1) // the clock went back: a new state (missed lapse)
					resetAt.Store(time.Since(t0).Round(10 * time.Millisecond).String())
				}
				lastV, lastE = v, e
			}
			if prev && n == 0 {
				lapses.Add(1)
				lapseAt.Store(time.Since(t0).Round(10 * time.Millisecond).String())
			}
			if !prev && n == 1 {
				appear.Add(1)
			}
			prev = n == 1
		}
	}()

	// Phase boundaries, set as they happen (a Shutdown waits for running
	// handlers, up to 1.5 s; a Worker stops fetching when its Shutdown
	// starts).
	var bounds [4]time.Time // P2, P3, P4, drain
	phaseOf := func(at time.Time) string {
		names := []string{"P1 mixed", "P2 on-only", "P3 off-only (on paused)", "P4 on+off", "drain"}
		for i, b := range bounds {
			if b.IsZero() || at.Before(b) {
				return names[i]
			}
		}
		return names[4]
	}
	stopAll := func(ws ...*wk) {
		var wg sync.WaitGroup
		for _, x := range ws {
			wg.Add(1)
			go func() { defer wg.Done(); stopW(x) }()
		}
		wg.Wait()
	}
	sampleStop := make(chan struct{})
	var sampleWG sync.WaitGroup
	sampleWG.Add(1)
	go func() {
		defer sampleWG.Done()
		for {
			select {
			case <-sampleStop:
				return
			case <-time.After(time.Second):
			}
			qs, err1 := onA.QueueStats(ctx, s35rEnv, s35rQueue)
			fs, err2 := onA.KeyStats(ctx, s35rEnv, s35rQueue, "flood")
			if err1 == nil && err2 == nil {
				t.Logf("t=%4.1fs queue ready %5d delayed %3d in flight %3d | flood ready %5d in flight %2d",
					time.Since(t0).Seconds(), qs.Ready, qs.Delayed, qs.InFlight, fs.Ready, fs.InFlight)
			}
		}
	}()

	wOffA, wOffB := startW(offA, "offA"), startW(offB, "offB")
	wOnA, wOnB := startW(onA, "onA"), startW(onB, "onB")

	// Producers.
	prodStop := make(chan struct{})
	var prodWG sync.WaitGroup
	produce := func(q *runqueue.Queue, tag string, seed int64) {
		defer prodWG.Done()
		rng := rand.New(rand.NewSource(seed))
		i := 0
		lastBurst := time.Now()
		for {
			select {
			case <-prodStop:
				return
			case <-time.After(pr.tick):
			}
			k := fmt.Sprintf("t%02d", rng.Intn(s35rTrickle))
			nb := 1 + rng.Intn(pr.burst)
			for range nb - 1 {
				enq(q, []runqueue.EnqueueParams{{Env: s35rEnv, Queue: s35rQueue, Key: k, ID: fmt.Sprintf("t-%s-%d", tag, i), Payload: []byte("b")}}, []s35rRun{{key: k}})
				i++
			}
			p := runqueue.EnqueueParams{Env: s35rEnv, Queue: s35rQueue, Key: k, ID: fmt.Sprintf("t-%s-%d", tag, i), Payload: []byte("t")}
			m := s35rRun{key: k}
			if rng.Float64() < 0.3 {
				p.Priority = rng.Intn(10)
			}
			if rng.Float64() < 0.2 {
				p.Delay = time.Duration(100+rng.Intn(400)) * time.Millisecond
				m.delayed = true
			}
			if i%150 != 7 && rng.Float64() < 0.15 {
				p.TTL = time.Duration(300+rng.Intn(1700)) * time.Millisecond
				m.ttl = true
			}
			if i%150 == 7 {
				p.ID = "poison-" + p.ID
				m.poison = true
			}
			enq(q, []runqueue.EnqueueParams{p}, []s35rRun{m})
			i++
			if time.Since(lastBurst) > time.Second {
				lastBurst = time.Now()
				flood(q, fmt.Sprintf("%s-%d", tag, i), pr.floodSec)
			}
		}
	}
	var onPaused atomic.Bool
	prodWG.Add(3)
	go produce(offB, "off", 1)
	go produce(onB, "on", 2)
	// A consumer that crashes: every 400 ms it takes 3 runs (by a flag-on
	// and a flag-off Queue in turn) and never settles them; the Workers'
	// sweeps (both flags) recover them once their lease passes.
	go func() {
		defer prodWG.Done()
		for i := 0; ; i++ {
			select {
			case <-prodStop:
				return
			case <-time.After(400 * time.Millisecond):
			}
			q := onB
			if i%2 == 1 || onPaused.Load() {
				q = offB // no flag-on dequeue during the pause
			}
			runs, err := q.Dequeue(ctx, s35rEnv, s35rQueue, 3)
			if err != nil {
				t.Errorf("crasher dequeue: %v", err)
				return
			}
			h.mu.Lock()
			for _, r := range runs {
				h.crash[r.ID]++
			}
			h.mu.Unlock()
		}
	}()

	sleepUntil := func(d time.Duration) { time.Sleep(time.Until(t0.Add(d))) }
	sleepUntil(6 * time.Second)
	bounds[0] = time.Now()
	stopAll(wOffA, wOffB)
	t.Logf("P2 at %v (off Workers stopped at %v)", bounds[0].Sub(t0), time.Since(t0))
	sleepUntil(10 * time.Second)
	offC := newQ(false)
	wOffC := startW(offC, "offC")
	bounds[1] = time.Now()
	onPaused.Store(true)
	stopAll(wOnA, wOnB)
	t.Logf("P3 (flag-on pause) at %v (on Workers stopped at %v)", bounds[1].Sub(t0), time.Since(t0))
	time.Sleep(time.Until(bounds[1].Add(3 * stateTTL)))
	bounds[2] = time.Now()
	onPaused.Store(false)
	wOnC, wOnD := startW(onA, "onC"), startW(onB, "onD")
	t.Logf("P4 at %v (flag-on fetches paused %v)", bounds[2].Sub(t0), bounds[2].Sub(bounds[1]))
	sleepUntil(18 * time.Second)
	bounds[3] = time.Now()
	close(prodStop)
	prodWG.Wait()
	t.Logf("producers stopped at %v", time.Since(t0))

	// Drain: until the queue is empty (dead letters aside) for 500ms.
	deadline := time.Now().Add(30 * time.Second)
	var st runqueue.Stats
	calm := 0
	for calm < 5 {
		require.True(t, time.Now().Before(deadline), "not drained: %+v", st)
		time.Sleep(100 * time.Millisecond)
		st, err = onA.QueueStats(ctx, s35rEnv, s35rQueue)
		require.NoError(t, err)
		if st.Ready == 0 && st.Delayed == 0 && st.InFlight == 0 {
			calm++
		} else {
			calm = 0
		}
	}
	drainedAt := time.Since(t0)
	stopAll(wOffC, wOnC, wOnD)
	close(sampleStop)
	sampleWG.Wait()
	close(watchStop)
	watchWG.Wait()
	t.Logf("drained at %v; stats %+v; scheduler state appeared %d times, lapsed %d times (last at %v), its clock V went back %d times (last at %v)",
		drainedAt, st, appear.Load(), lapses.Load(), lapseAt.Load(), resets.Load(), resetAt.Load())

	// --- Exactly once.
	h.mu.Lock()
	defer h.mu.Unlock()
	var nRuns, nTTL, nTTLgone, nPoison, nDelayed, nCrashed, nDeadOther int
	var problems []string
	for id, m := range h.runs {
		nRuns++
		s, f := h.succ[id], h.fails[id]+h.crash[id]
		if h.crash[id] > 0 {
			nCrashed++
		}
		switch {
		case m.poison:
			nPoison++
			if s != 0 || f != s35rMaxAttempts {
				problems = append(problems, fmt.Sprintf("poison %s: %d successes, %d failures or drops (want 0, %d)", id, s, f, s35rMaxAttempts))
			}
		case s == 0 && f == s35rMaxAttempts:
			nDeadOther++ // failed or dropped MaxAttempts times: dead as designed
			t.Logf("dead as designed: %s (key %s): %d handler failures, %d drops by the crasher", id, m.key, h.fails[id], h.crash[id])
			for _, d := range h.dels {
				if d.id == id {
					t.Logf("  attempt %d token %d by %s avail %s start %s end %s ok %v x %.4f why %s", d.attempt, d.token, d.worker,
						d.avail.Format("15:04:05.000"), d.start.Format("15:04:05.000"), d.end.Format("15:04:05.000"), d.ok, d.x, d.why)
				}
			}
		case m.ttl && s == 0:
			nTTL++
			nTTLgone++
		case s != 1:
			problems = append(problems, fmt.Sprintf("%s (key %s, ttl %v, delayed %v): %d successes, %d failures", id, m.key, m.ttl, m.delayed, s, f))
		default:
			if m.ttl {
				nTTL++
			}
		}
		if m.delayed {
			nDelayed++
		}
	}
	sort.Strings(problems)
	{
		var n, nf [8]int
		var xs [8]float64
		for _, d := range h.dels {
			if h.runs[d.id].poison || d.attempt >= 8 {
				continue
			}
			n[d.attempt]++
			xs[d.attempt] += d.x
			if !d.ok {
				nf[d.attempt]++
			}
		}
		for a := 1; a < 8 && n[a] > 0; a++ {
			t.Logf("attempt %d: %d deliveries, %d failed (%.3f), mean x %.3f", a, n[a], nf[a], float64(nf[a])/float64(n[a]), xs[a]/float64(n[a]))
		}
	}
	t.Logf("runs %d (delayed %d, with TTL %d of which %d never succeeded, poison %d, dropped by the crasher %d, dead otherwise %d); deliveries %d; acked %d; expired %d; leases recovered %d (dead %d); lease-lost outcomes %d",
		nRuns, nDelayed, nTTL, nTTLgone, nPoison, nCrashed, nDeadOther, len(h.dels), obs.acked.Load(), obs.expired.Load(), obs.recovered.Load(), obs.recDead.Load(), obs.lost.Load())
	if len(problems) > 0 {
		t.Errorf("%d runs not handled exactly once: %s", len(problems), strings.Join(problems[:min(20, len(problems))], "; "))
	}
	require.Equal(t, int64(nTTLgone), obs.expired.Load(), "TTL runs never handled vs runs expired")

	// At rest: only dead letters (the poison runs).
	for _, q := range []*runqueue.Queue{onA, offA} {
		st, err := q.QueueStats(ctx, s35rEnv, s35rQueue)
		require.NoError(t, err)
		require.Equal(t, runqueue.Stats{Dead: int64(nPoison + nDeadOther)}, st)
	}
	n, err := onA.PurgeDeadLetters(ctx, s35rEnv, s35rQueue, time.Now().Add(time.Second), 10000)
	require.NoError(t, err)
	require.Equal(t, nPoison+nDeadOther, n)

	// --- Waits of the trickle keys.
	s35rWaits(t, h.dels, obs, phaseOf, pr.keyLimit)

	// --- Keys left after StateTTL.
	time.Sleep(stateTTL + 500*time.Millisecond)
	left := prefixKeys(t, c, prefix)
	sort.Strings(left)
	var desc []string
	for _, k := range left {
		typ := c.Type(ctx, k).Val()
		desc = append(desc, k+" ("+typ+")")
	}
	t.Logf("keys left under the prefix after StateTTL: %s", strings.Join(desc, ", "))
	want := map[string]bool{
		sp.Layout():                             true, // layout version
		qk.Weights():                            true, // weights stay
		sp.Shard(onA.ShardOf(s35rEnv)).Tokens(): true, // delivery-token counter
	}
	for _, k := range left {
		if !want[k] {
			t.Errorf("key left under the prefix at rest: %s (%s)", k, c.Type(ctx, k).Val())
		}
	}
}

// s35rWaits reports, per phase, each trickle key's waits from becoming
// ready (Run.AvailableAt) to its serve, in ms and in serves of the flood
// key meanwhile, for the deliveries whose key was below its limit when
// they became ready.
func s35rWaits(t *testing.T, dels []*s35rDelivery, obs *s35rObs, phaseOf func(time.Time) string, keyLimit int) {
	t.Helper()
	obs.mu.Lock()
	for _, d := range dels {
		d.served = obs.served[d.token]
	}
	obs.mu.Unlock()
	byTok := append([]*s35rDelivery(nil), dels...)
	sort.Slice(byTok, func(i, j int) bool { return byTok[i].token < byTok[j].token })
	// floodBefore[i]: flood serves among byTok[:i].
	floodBefore := make([]int, len(byTok)+1)
	floodOnBefore := make([]int, len(byTok)+1) // by flag-on Workers only
	for i, d := range byTok {
		floodBefore[i+1] = floodBefore[i]
		floodOnBefore[i+1] = floodOnBefore[i]
		if d.key == "flood" {
			floodBefore[i+1]++
			if d.flagOn {
				floodOnBefore[i+1]++
			}
		}
	}
	idx := map[int64]int{}
	for i, d := range byTok {
		idx[d.token] = i
	}
	// first index whose serve time is after t: serves are in token order and
	// serve times nearly so (two calls in flight may interleave by a ms).
	firstAfter := func(at time.Time) int {
		return sort.Search(len(byTok), func(i int) bool { return byTok[i].served.After(at) })
	}
	perKey := map[string][]*s35rDelivery{}
	for _, d := range dels {
		perKey[d.key] = append(perKey[d.key], d)
	}
	inflightAt := func(key string, at time.Time) int {
		n := 0
		for _, d := range perKey[key] {
			if !d.served.After(at) && (d.end.IsZero() || d.end.After(at)) {
				n++
			}
		}
		return n
	}
	type agg struct {
		ms     []float64
		floods []int
		onFl   []float64 // flood serves by flag-on Workers meanwhile, for runs a flag-on Worker served
		worst  *s35rDelivery
		wf     int
	}
	// since[d]: when d's key became servable for d: d ready, the key's
	// previous serve done, and the key below its limit (handler end is
	// used for a freed slot; the Worker's ack reaches Redis a little later).
	since := map[*s35rDelivery]time.Time{}
	for k, ds := range perKey {
		if k == "flood" {
			continue
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i].token < ds[j].token })
		ends := make([]time.Time, 0, len(ds))
		for _, d := range ds {
			if !d.end.IsZero() {
				ends = append(ends, d.end)
			}
		}
		sort.Slice(ends, func(i, j int) bool { return ends[i].Before(ends[j]) })
		// The key is servable from the earliest AvailableAt among its runs
		// not yet served (priority may serve a later run first).
		sufMin := make([]time.Time, len(ds)+1)
		for i := len(ds) - 1; i >= 0; i-- {
			sufMin[i] = ds[i].avail
			if i+1 < len(ds) && sufMin[i+1].Before(sufMin[i]) {
				sufMin[i] = sufMin[i+1]
			}
		}
		var prev time.Time
		for i, d := range ds {
			at := sufMin[i]
			if prev.After(at) {
				at = prev
			}
			if inflightAt(k, at) >= keyLimit {
				for _, e := range ends {
					if e.After(at) && inflightAt(k, e) < keyLimit {
						at = e
						break
					}
				}
			}
			since[d] = at
			prev = d.served
		}
	}
	phases := map[string]*agg{}
	keyWorst := map[string]float64{}
	for _, d := range dels {
		if d.key == "flood" || d.served.IsZero() {
			continue
		}
		avail := since[d]
		ph := phaseOf(avail)
		a := phases[ph]
		if a == nil {
			a = &agg{}
			phases[ph] = a
		}
		w := float64(d.served.Sub(avail).Microseconds()) / 1000
		if w < 0 {
			w = 0
		}
		fl, onFl := 0, 0
		if i := firstAfter(avail); i < idx[d.token] {
			fl = floodBefore[idx[d.token]] - floodBefore[i]
			onFl = floodOnBefore[idx[d.token]] - floodOnBefore[i]
		}
		if d.flagOn {
			a.onFl = append(a.onFl, float64(onFl))
			// Guarantee 10 (design.md section 7): a newcomer is served
			// within 3 serves per other active key (45 keys here), counted
			// in the flag-on serve sequence from the state's last start.
			if onFl > 3*45 {
				t.Errorf("%s (key %s, attempt %d) waited %d flag-on serves of the flood key (%v) before a flag-on Worker served it",
					d.id, d.key, d.attempt, onFl, d.served.Sub(avail))
			}
		}
		a.ms = append(a.ms, w)
		a.floods = append(a.floods, fl)
		if a.worst == nil || fl > a.wf {
			a.worst, a.wf = d, fl
		}
		if w > keyWorst[d.key] {
			keyWorst[d.key] = w
		}
	}
	pct := func(xs []float64, p float64) float64 {
		s := append([]float64(nil), xs...)
		sort.Float64s(s)
		if len(s) == 0 {
			return 0
		}
		return s[min(len(s)-1, int(p*float64(len(s))))]
	}
	names := sortedKeys(phases)
	for _, ph := range names {
		a := phases[ph]
		fs := make([]float64, len(a.floods))
		for i, f := range a.floods {
			fs[i] = float64(f)
		}
		t.Logf("%-24s n=%4d wait ms p50 %.0f p90 %.0f p99 %.0f max %.0f | flood serves meanwhile p50 %.0f p99 %.0f max %.0f | served flag on (n=%d): flag-on flood serves meanwhile p50 %.0f p99 %.0f max %.0f (worst: %s key %s attempt %d by %s, %.0f ms)",
			ph, len(a.ms), pct(a.ms, .5), pct(a.ms, .9), pct(a.ms, .99), pct(a.ms, 1), pct(fs, .5), pct(fs, .99), pct(fs, 1),
			len(a.onFl), pct(a.onFl, .5), pct(a.onFl, .99), pct(a.onFl, 1),
			a.worst.id, a.worst.key, a.worst.attempt, a.worst.worker, max(0, float64(a.worst.served.Sub(since[a.worst]).Milliseconds())))
	}
	var kw []float64
	for _, w := range keyWorst {
		kw = append(kw, w)
	}
	t.Logf("per trickle key, longest wait (ms): min %.0f p50 %.0f p90 %.0f max %.0f over %d keys",
		pct(kw, 0), pct(kw, .5), pct(kw, .9), pct(kw, 1), len(kw))
	if os.Getenv("S35_DUMP") != "" {
		for _, d := range byTok {
			fmt.Fprintf(os.Stderr, "%d %s %s a%d %s avail+%d served %s\n", d.token, d.key, d.id, d.attempt, d.worker,
				d.served.Sub(d.avail).Milliseconds(), d.served.Format("15:04:05.000"))
		}
	}
}
