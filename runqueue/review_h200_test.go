package runqueue_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// Review h200: real Workers on a real three-master Redis Cluster during a
// rolling rollout of Config.VtimeScheduling, judged on what rests on no
// timing.
//
// Three envs, each on another master, two base queues each (qa, qb), with
// env, queue and key limits that bind (LimitsFor; every instance has the
// same); per queue five keys K0..K4 of 250 runs (K1 weight 8, K0 0.5, K2
// 4, set through a flag-on instance; priorities 0, 1, 9; 80 of K2's runs
// due in 0.3-3 s; K3 fails every third run once with RetryAfter and every
// 25th always, dead at MaxAttempts 3; K4's handlers take 10-30 ms, the
// others 0-3 ms); a flood key FL of 8,000 runs in the first env's qa; the
// empty key "" (200 runs) in two queues; newcomers N00..N59, one run each,
// enqueued one at a time every 250 ms while the rest runs. Lease 3 s,
// SweepInterval 300 ms, every Worker of Concurrency 6, each on its own
// Queue (own config, own flag):
//
//	start:  W1 off, W2 off, W3 on (queue sources: the six queues), W4 on
//	        (shard sources: the three envs' shards), W5 off (queue sources),
//	        W11 off (shard sources)
//	15%:    W1 shut down gracefully, W6 on started in its place
//	30%:    W5 stopped hard (its Start context cancelled)
//	40%:    K0 and K1 swap weights (8 and 0.5)
//	45%:    W2 shut down gracefully, W7 on in its place
//	55%:    the Worker still serving with the most handlers running stopped
//	        hard, W10 of its flag and sources started in its place (a crash
//	        and restart; a later step that names the crashed one rolls W10)
//	65%:    W3 (on) rolled back: W8 off in its place
//	80%:    W4 (on, shards) rolled back: W9 off (shards) in its place
//
// (percentages of the expected deliveries started). The handlers of a
// Worker stopped hard ignore their context: they run on until 50 ms before
// the lease deadline their fetch returned, so the crashed Worker's holds
// are judged with handlers in them.
//
// The caps are judged on the handlers' intervals. A handler's [start, end)
// lies inside its run's hold (in flight in Redis, counted against the
// limits) as long as its run is not recovered meanwhile: the run is
// dequeued before the reply that hands it to the handler (start is stamped
// after), and acked (fused AckAndDequeue, or AckMany for a shard source),
// nacked or given back only after the handler returned (finishJob runs
// after the end stamp; addAck then queues the ack for the next fetch). The
// one way a hold ends while its handler runs is lease recovery, and that
// needs a sweeper's clock at or past the run's lease deadline in Redis
// (requeue.lua, held_check: `d <= now`), which is never before the
// deadline the fetch returned (Run.LeaseDeadline: extensions only move it
// later with a clock that moves forward). A hard stop does not wait for
// the handlers (Worker.stop waits for settle only, not handlers: a handler
// that ignores its context keeps running, and Shutdown returns); a stalled
// machine can also let a live Worker's lease pass. So each interval is
// clipped to end at min(end, Run.LeaseDeadline): the clipped interval lies
// inside the hold whatever the timing (same machine, wall clock not
// stepped back). (A forced Shutdown would end holds early too: release
// nacks the runs of handlers still running; every Shutdown here before the
// checks is graceful, its ctx never ends, and a hard-stopped Worker's
// Shutdown releases nothing, Worker.stop.) So at every instant the clipped
// intervals running for one (env, queue, key), one queue, one env are at
// most its limits, and the clipped intervals of one run never overlap.
// Clipping only matters when a handler is still running at its fetch's
// lease deadline (counted and logged: none in our runs).

const h200Lease = 3 * time.Second

type h200Del struct {
	r          *runqueue.Run
	worker     string
	start, end time.Time // wall clock (monotonic reading stripped)
	ok         bool      // the handler returned nil with its context live
	cancelled  bool      // its context had ended when it returned
}

// h200End is the clipped end: never past the lease deadline the fetch
// returned (see the header).
func (d *h200Del) h200End() time.Time {
	if d.r.LeaseDeadline.Before(d.end) {
		return d.r.LeaseDeadline
	}
	return d.end
}

type h200W struct {
	name   string
	on     bool
	q      *runqueue.Queue
	w      *runqueue.Worker
	cancel context.CancelFunc
}

func TestH200ClusterRolloutSoak(t *testing.T) {
	c := redistest.Cluster(t)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	const maxAttempts = 3

	// Three envs on three masters.
	probe := s34NewQueue(t, c, prefix, nil)
	envs := envsOnMasters(t, c, probe, prefix, "h200e")
	require.Len(t, envs, 3)
	var shards []int
	for _, e := range envs {
		shards = append(shards, probe.ShardOf(e))
	}
	queues := []string{"qa", "qb"}
	limits, mut := h200Config(envs, [3]int{9, 12, 7}, 5, 7, maxAttempts)
	qOn := s34NewQueue(t, c, prefix, mut(true))
	t.Logf("cluster: %s; envs %v (one on each master), shards %v", redistest.ClusterSource(), envs, shards)

	// The workload.
	const news = 60
	load := h200Workload(t, qOn, envs, queues, 200, 250, 80, 8000, 200, news)
	total, alwaysFails := load.total, load.alwaysFails
	expected := len(total) + 3*len(alwaysFails) + 80 // (retries: a rough count, for the triggers only)

	// The handler, and the handlers running per Worker and the newcomers'
	// first starts.
	hs := newH200Handlers("h200", 200)
	var runMu sync.Mutex
	runningBy := map[string]int{}
	startedAt := map[string]time.Time{}
	hs.begin = func(name string, r *runqueue.Run, st time.Time) func() {
		runMu.Lock()
		runningBy[name]++
		if _, ok := startedAt[r.ID]; !ok && strings.HasPrefix(r.Key, "N") {
			startedAt[r.ID] = st
		}
		runMu.Unlock()
		return func() {
			runMu.Lock()
			runningBy[name]--
			runMu.Unlock()
		}
	}
	var wmu sync.Mutex // workers, flagOf

	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var allQ []runqueue.WorkerQueue
	for _, e := range envs {
		for _, qn := range queues {
			allQ = append(allQ, runqueue.WorkerQueue{Env: e, Queue: qn})
		}
	}
	workers := map[string]*h200W{}
	flagOf := map[string]bool{}
	start := func(name string, on, byShard bool) *h200W {
		q := s34NewQueue(t, c, prefix, mut(on))
		cfg := runqueue.WorkerConfig{Concurrency: 6, SweepInterval: 300 * time.Millisecond, Logger: quiet}
		if byShard {
			cfg.Shards = shards
		} else {
			cfg.Queues = allQ
		}
		wctx, cancel := context.WithCancel(ctx)
		w, err := runqueue.NewWorker(q, hs.handler(name), &cfg)
		require.NoError(t, err)
		require.NoError(t, w.Start(wctx))
		hw := &h200W{name: name, on: on, q: q, w: w, cancel: cancel}
		t.Cleanup(func() {
			sctx, c := context.WithTimeout(context.Background(), 10*time.Second)
			defer c()
			_ = w.Shutdown(sctx)
			cancel()
		})
		wmu.Lock()
		workers[name], flagOf[name] = hw, on
		wmu.Unlock()
		return hw
	}
	began := time.Now()
	start("W1", false, false)
	start("W2", false, false)
	start("W3", true, false)
	start("W4", true, true)
	start("W5", false, false)
	start("W11", false, true)

	// Newcomers, one at a time, beside the rollout.
	enqAt := map[string]time.Time{}
	var enqMu sync.Mutex
	newsDone := make(chan error, 1)
	go func() {
		for i := 0; i < news; i++ {
			p := load.newcomer(i)
			enqMu.Lock()
			enqAt[p.Env+"/"+p.ID] = time.Now()
			enqMu.Unlock()
			if _, err := qOn.Enqueue(ctx, p); err != nil {
				newsDone <- err
				return
			}
			time.Sleep(250 * time.Millisecond)
		}
		newsDone <- nil
	}()

	// The rollout, triggered by the deliveries started.
	var logs []string
	hardStop := func(name string) {
		wmu.Lock()
		hw := workers[name]
		wmu.Unlock()
		hs.stoppedHard(name)
		hw.cancel()
		logs = append(logs, fmt.Sprintf("%v: %s (flag %v) stopped hard at %d deliveries started", time.Since(began).Round(time.Millisecond), name, hw.on, hs.started.Load()))
	}
	replacedBy := map[string]string{} // a crashed Worker's role is its replacement's
	roll := func(old, name string, on, byShard bool) {
		if r, ok := replacedBy[old]; ok {
			// (CI, 2026-12-07: W3 was the busiest at 55% and crashed; its
			// Shutdown, called as a graceful one here, said what a hard
			// stop's does: runs unsettled, context canceled.)
			logs = append(logs, fmt.Sprintf("%s crashed earlier: %s, in its place, is rolled instead", old, r))
			old = r
		}
		wmu.Lock()
		ow := workers[old]
		wmu.Unlock()
		t0 := time.Now()
		err := ow.w.Shutdown(context.Background()) // graceful: waits for its handlers, sends their acks
		logs = append(logs, fmt.Sprintf("%v: %s (flag %v) shut down in %v (err %v); %s (flag %v) started", t0.Sub(began).Round(time.Millisecond), old, ow.on, time.Since(t0).Round(time.Millisecond), err, name, on))
		require.NoError(t, err)
		start(name, on, byShard)
	}
	waitFor := func(frac float64) { hs.waitStarted(t, int64(frac*float64(expected)), 120*time.Second) }
	waitFor(0.15)
	roll("W1", "W6", true, false)
	waitFor(0.30)
	hardStop("W5")
	waitFor(0.40)
	// The weights change while the Workers run (K0 and K1 swap).
	for _, e := range envs {
		for _, qn := range queues {
			require.NoError(t, qOn.SetWeight(ctx, e, qn, "K0", 8))
			require.NoError(t, qOn.SetWeight(ctx, e, qn, "K1", 0.5))
		}
	}
	logs = append(logs, fmt.Sprintf("%v: K0 and K1 swapped weights", time.Since(began).Round(time.Millisecond)))
	waitFor(0.45)
	roll("W2", "W7", true, false)
	waitFor(0.55)
	{
		// The busiest Worker still serving (the most handlers running)
		// crashes and restarts: W10, of its flag and sources.
		runMu.Lock()
		busy, most := "", -1
		for _, n := range []string{"W6", "W7", "W3", "W4", "W11"} {
			if runningBy[n] > most {
				busy, most = n, runningBy[n]
			}
		}
		runMu.Unlock()
		wmu.Lock()
		bw := workers[busy]
		wmu.Unlock()
		hardStop(busy)
		start("W10", bw.on, busy == "W4" || busy == "W11")
		replacedBy[busy] = "W10"
		logs = append(logs, fmt.Sprintf("W10 (flag %v) started in %s's place (%d handlers were running on it)", bw.on, busy, most))
	}
	waitFor(0.65)
	roll("W3", "W8", false, false)
	waitFor(0.80)
	roll("W4", "W9", false, true)
	require.NoError(t, <-newsDone)
	for name := range hs.hard {
		sctx, c := context.WithTimeout(ctx, 5*time.Second)
		err := workers[name].w.Shutdown(sctx)
		c()
		logs = append(logs, fmt.Sprintf("%s's Shutdown after the hard stop: %v", name, err))
	}

	drained, dead := hs.drain(t, ctx, qOn, allQ, 150*time.Second, func(_ string, f func() error) error { return f() })
	for _, l := range logs {
		t.Log(l)
	}
	all := hs.deliveries()
	t.Logf("%d runs, %d deliveries, %d dead letters (%d always-failing runs); queues empty at %v",
		len(total), len(all), len(dead), len(alwaysFails), drained.Sub(began).Round(time.Millisecond))

	viol, _ := (&h200Judge{all: all, total: total, alwaysFails: alwaysFails, dead: dead, hard: hs.hard, flagOf: flagOf,
		maxAttempts: maxAttempts, limits: limits, envs: envs, queues: queues}).judge(t)

	// Logged, not asserted: the newcomers' waits and the serves per Worker.
	var waits []time.Duration
	for id, at := range enqAt {
		if s, ok := startedAt[id[strings.IndexByte(id, '/')+1:]]; ok {
			waits = append(waits, s.Sub(at))
		}
	}
	sort.Slice(waits, func(i, j int) bool { return waits[i] < waits[j] })
	if len(waits) > 0 {
		t.Logf("newcomers: %d started; wait from enqueue to first start: median %v, max %v", len(waits), waits[len(waits)/2].Round(time.Millisecond), waits[len(waits)-1].Round(time.Millisecond))
	}
	per := map[string]int{}
	for _, d := range all {
		per[fmt.Sprintf("%s(%v)", d.worker, flagOf[d.worker])]++
	}
	t.Logf("deliveries per Worker (flag): %v", per)

	for _, v := range viol[:min(len(viol), 20)] {
		t.Log("violation: " + v)
	}
	require.Empty(t, viol)
	// (every run of total delivered, and none else: among viol)
}

// h200VK is a run's variant: env, queue and concurrency key.
type h200VK struct{ env, queue, key string }

// h200Judge is what the verdict of a rollout soak (h200, h202) judges:
// the deliveries, the runs enqueued (env/id -> variant), the runs that
// always fail, the dead letters (env/id), the Workers stopped hard and the
// flag of each Worker, the Config's MaxAttempts and limits, and the envs
// and base queues (for the log of the highest counts).
type h200Judge struct {
	all          []*h200Del
	total        map[string]h200VK
	alwaysFails  map[string]bool
	dead         map[string]runqueue.DeadRun
	hard, flagOf map[string]bool
	maxAttempts  int
	limits       func(env, queue string) runqueue.Limits
	envs, queues []string
}

// judge logs and returns the violations of (a) every run delivered, (b)
// the clipped intervals of one run never overlapping, no redelivery after
// a success but after a hard stop or a possible lease pass, (c) the dead
// letters exact, and (d) the caps at every instant on the clipped
// intervals (see h200's header); capViol counts (d)'s violations (the
// first five are among viol).
func (j *h200Judge) judge(t *testing.T) (viol []string, capViol int) {
	t.Helper()
	type vk = h200VK
	all, total, alwaysFails, dead, hard, flagOf, maxAttempts, limits, envs, queues :=
		j.all, j.total, j.alwaysFails, j.dead, j.hard, j.flagOf, j.maxAttempts, j.limits, j.envs, j.queues
	// (a) every run delivered; (b) the clipped intervals of one run never
	// overlap; no delivery after a success but a lease pass; (c) the dead
	// letters.
	byID := map[string][]*h200Del{}
	for _, d := range all {
		id := d.r.Env + "/" + d.r.ID
		if _, ok := total[id]; !ok {
			viol = append(viol, "delivered a run never enqueued: "+id)
		}
		byID[id] = append(byID[id], d)
	}
	for id := range total {
		if len(byID[id]) == 0 {
			viol = append(viol, "never delivered: "+id)
		}
	}
	var rawOverlap, clipped, cancelledLive, afterOkPass, hardLost, deadAfterOkLast int
	cancelledBy := map[string]int{}
	for id, ds := range byID {
		sort.Slice(ds, func(i, j int) bool { return ds[i].r.Token < ds[j].r.Token })
		for i, d := range ds {
			if d.h200End().Before(d.end) {
				clipped++
			}
			if d.cancelled {
				cancelledBy[d.worker]++
				if !hard[d.worker] {
					cancelledLive++
				}
			}
			if i == 0 {
				continue
			}
			p := ds[i-1]
			if d.start.Before(p.end) {
				rawOverlap++
			}
			if d.start.Before(p.h200End()) {
				viol = append(viol, fmt.Sprintf("%s: delivery %d (%s, token %d, attempt %d) started at %v, before delivery %d (%s, token %d) ended (clipped) at %v",
					id, i+1, d.worker, d.r.Token, d.r.Attempt, d.start.Format("15:04:05.000"), i, p.worker, p.r.Token, p.h200End().Format("15:04:05.000")))
			}
			if p.ok {
				switch {
				case hard[p.worker]:
					hardLost++ // its ack may have been lost to the hard stop
				case !d.start.Before(p.r.LeaseDeadline):
					afterOkPass++ // the lease may have passed before the ack went
				default:
					viol = append(viol, fmt.Sprintf("%s: delivered again (%s, token %d) at %v after a success on %s (token %d), before its lease deadline %v",
						id, d.worker, d.r.Token, d.start.Format("15:04:05.000"), p.worker, p.r.Token, p.r.LeaseDeadline.Format("15:04:05.000")))
				}
			}
		}
		last := ds[len(ds)-1]
		_, isDead := dead[id]
		switch {
		case !last.ok && !isDead:
			viol = append(viol, fmt.Sprintf("%s: its last delivery (%s, attempt %d) failed, not dead-lettered", id, last.worker, last.r.Attempt))
		case last.ok && isDead && last.r.Attempt < maxAttempts:
			viol = append(viol, fmt.Sprintf("%s: dead-lettered after a success (%s, attempt %d)", id, last.worker, last.r.Attempt))
		case last.ok && isDead:
			deadAfterOkLast++ // at the last attempt: recovered after its lease passed, the ack lost
		}
		if alwaysFails[id] && !isDead {
			viol = append(viol, id+": always fails, not dead-lettered")
		}
	}
	for id := range dead {
		if len(byID[id]) == 0 {
			viol = append(viol, id+": dead-lettered, never delivered")
		}
	}
	t.Logf("(a-c) %d distinct runs delivered of %d; %d unclipped overlaps of one run's deliveries, %d intervals clipped at their lease deadline; handlers cancelled %v (%d on live Workers); redeliveries after a success: %d on a hard-stopped Worker, %d after a possible lease pass; %d dead after a success at the last attempt",
		len(byID), len(total), rawOverlap, clipped, cancelledBy, cancelledLive, hardLost, afterOkPass, deadAfterOkLast)

	// (d) the caps on the clipped intervals.
	type ev struct {
		at  time.Time
		d   int
		del *h200Del
	}
	var evs []ev
	for _, d := range all {
		if e := d.h200End(); d.start.Before(e) {
			evs = append(evs, ev{d.start, 1, d}, ev{e, -1, d})
		}
	}
	sort.SliceStable(evs, func(i, j int) bool {
		if !evs[i].at.Equal(evs[j].at) {
			return evs[i].at.Before(evs[j].at)
		}
		return evs[i].d < evs[j].d // half-open: ends first
	})
	inKey, inQ, inEnv := map[vk]int{}, map[vk]int{}, map[string]int{}
	maxKey, maxQ, maxEnv := map[vk]int{}, map[vk]int{}, map[string]int{}
	running := map[*h200Del]bool{}
	for _, e := range evs {
		r := e.del.r
		k, qk := vk{r.Env, r.Queue, r.Key}, vk{r.Env, r.Queue, ""}
		inKey[k] += e.d
		inQ[qk] += e.d
		inEnv[r.Env] += e.d
		if e.d < 0 {
			delete(running, e.del)
			continue
		}
		running[e.del] = true
		maxKey[k] = max(maxKey[k], inKey[k])
		maxQ[qk] = max(maxQ[qk], inQ[qk])
		maxEnv[r.Env] = max(maxEnv[r.Env], inEnv[r.Env])
		l := limits(r.Env, r.Queue)
		var what string
		switch {
		case inKey[k] > l.Key:
			what = fmt.Sprintf("key %s/%s/%s: %d running, limit %d", r.Env, r.Queue, r.Key, inKey[k], l.Key)
		case inQ[qk] > l.Queue:
			what = fmt.Sprintf("queue %s/%s: %d running, limit %d", r.Env, r.Queue, inQ[qk], l.Queue)
		case inEnv[r.Env] > l.Env:
			what = fmt.Sprintf("env %s: %d running, limit %d", r.Env, inEnv[r.Env], l.Env)
		}
		if what == "" {
			continue
		}
		capViol++
		if capViol <= 5 {
			var who []string
			for o := range running {
				if o.r.Env == r.Env {
					who = append(who, fmt.Sprintf("%s/%s/%s (%s, %v, token %d, attempt %d, %s..%s)", o.r.Queue, o.r.Key, o.r.ID, o.worker, flagOf[o.worker],
						o.r.Token, o.r.Attempt, o.start.Format("05.000000"), o.h200End().Format("05.000000")))
				}
			}
			sort.Strings(who)
			viol = append(viol, fmt.Sprintf("at %s: %s; running in the env: %s", e.at.Format("15:04:05.000000"), what, strings.Join(who, "; ")))
		}
	}
	var ml []string
	for _, e := range envs {
		ml = append(ml, fmt.Sprintf("env %s %d/%d", e, maxEnv[e], limits(e, queues[0]).Env))
		for _, qn := range queues {
			l := limits(e, qn)
			mkey := 0
			for k, n := range maxKey {
				if k.env == e && k.queue == qn {
					mkey = max(mkey, n)
				}
			}
			ml = append(ml, fmt.Sprintf("%s/%s %d/%d (keys max %d/%d)", e, qn, maxQ[vk{e, qn, ""}], l.Queue, mkey, l.Key))
		}
	}
	t.Logf("(d) %d intervals judged; highest running (clipped) against the limits: %s; %d cap violations", len(evs)/2, strings.Join(ml, ", "), capViol)
	return viol, capViol
}

// h200Load is the rollout soaks' workload (h200, h202), enqueued through
// a flag-on instance: per env and queue five keys K0..K4 of perKey runs
// (priorities 0, 1, 9 in turn; the first `delayed` of K2's due in 0.3-3 s;
// K1 weight 8, K0 0.5, K2 4; K3's every 25th run always fails), a flood
// key FL (weight 2) in the first env's qa, `empty` runs of the empty key
// (a variant too, under the key limit) in envs[0]/qa and envs[1]/qb, and
// `news` newcomers, one run each, that the soak enqueues later (newcomer).
type h200Load struct {
	envs, queues []string
	total        map[string]h200VK // env/id -> its variant
	alwaysFails  map[string]bool   // env/id
}

func h200Workload(t *testing.T, q *runqueue.Queue, envs, queues []string, seed int64, perKey, delayed, flood, empty, news int) *h200Load {
	ctx := context.Background()
	l := &h200Load{envs: envs, queues: queues, total: map[string]h200VK{}, alwaysFails: map[string]bool{}}
	rng := rand.New(rand.NewSource(seed))
	now := time.Now()
	var ps []runqueue.EnqueueParams
	add := func(env, queue, key string, n int, delayed int) {
		for i := 0; i < n; i++ {
			id := fmt.Sprintf("%s-%s-%d", queue, key, i)
			p := runqueue.EnqueueParams{Env: env, Queue: queue, Key: key, ID: id, Payload: []byte("x"), Priority: []int{0, 1, 9}[i%3]}
			if i < delayed {
				p.AvailableAt = now.Add(300*time.Millisecond + time.Duration(rng.Int63n(int64(2700*time.Millisecond))))
			}
			ps = append(ps, p)
			l.total[env+"/"+id] = h200VK{env, queue, key}
			if key == "K3" && i%25 == 0 {
				l.alwaysFails[env+"/"+id] = true
			}
		}
	}
	for _, e := range envs {
		for _, qn := range queues {
			for k := 0; k < 5; k++ {
				d := 0
				if k == 2 {
					d = delayed
				}
				add(e, qn, fmt.Sprintf("K%d", k), perKey, d)
			}
			for k, w := range map[string]float64{"K0": 0.5, "K1": 8, "K2": 4} {
				require.NoError(t, q.SetWeight(ctx, e, qn, k, w))
			}
		}
	}
	require.NoError(t, q.SetWeight(ctx, envs[0], "qa", "FL", 2))
	add(envs[0], "qa", "FL", flood, 0)
	add(envs[0], "qa", "", empty, 0)
	add(envs[1], "qb", "", empty, 0)
	for len(ps) > 0 {
		n := min(len(ps), 500)
		res, err := q.EnqueueMany(ctx, ps[:n])
		require.NoError(t, err)
		for i, r := range res {
			require.NoError(t, r.Err)
			require.True(t, r.Queued, ps[i].ID)
		}
		ps = ps[n:]
	}
	for i := 0; i < news; i++ {
		p := l.newcomer(i)
		l.total[p.Env+"/"+p.ID] = h200VK{p.Env, p.Queue, p.Key}
	}
	return l
}

// newcomer is the i-th newcomer's run.
func (l *h200Load) newcomer(i int) runqueue.EnqueueParams {
	qn := l.queues[(i/3)%2]
	return runqueue.EnqueueParams{Env: l.envs[i%3], Queue: qn, Key: fmt.Sprintf("N%02d", i), ID: fmt.Sprintf("n-%s-N%02d", qn, i), Payload: []byte("x")}
}

// h200Handlers are the soaks' handlers and what they record. A handler
// takes 0-3 ms (K4's 10-30 ms); K3 fails every third run once with
// RetryAfter and every 25th always; one of a Worker stopped hard ignores
// its context and runs on until 50 ms before the lease deadline its fetch
// returned (see the header). Each delivery is recorded as it ends.
type h200Handlers struct {
	tag   string
	dur   func(*runqueue.Run) time.Duration
	durMu sync.Mutex
	slow  *rand.Rand
	// begin, when set, runs as a handler starts; what it returns, as the
	// handler returns.
	begin func(name string, r *runqueue.Run, st time.Time) func()

	started, inHandler atomic.Int64
	mu                 sync.Mutex
	dels               []*h200Del
	hard               map[string]bool // the Workers stopped hard
}

func newH200Handlers(tag string, seed int64) *h200Handlers {
	return &h200Handlers{tag: tag, dur: h196Dur(seed, 0, 3, nil), slow: rand.New(rand.NewSource(10 * seed)), hard: map[string]bool{}}
}

func (h *h200Handlers) isHard(name string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.hard[name]
}

// stoppedHard notes that Worker name is stopped hard (before its Start
// context is cancelled).
func (h *h200Handlers) stoppedHard(name string) {
	h.mu.Lock()
	h.hard[name] = true
	h.mu.Unlock()
}

// deliveries are the deliveries recorded so far.
func (h *h200Handlers) deliveries() []*h200Del {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*h200Del(nil), h.dels...)
}

// waitStarted waits until n deliveries have started (guard: a liveness
// guard).
func (h *h200Handlers) waitStarted(t *testing.T, n int64, guard time.Duration) {
	deadline := time.Now().Add(guard)
	for h.started.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d deliveries started", h.started.Load(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (h *h200Handlers) handler(name string) runqueue.Handler {
	return func(hctx context.Context, r *runqueue.Run) error {
		st := time.Now()
		h.started.Add(1)
		h.inHandler.Add(1)
		defer h.inHandler.Add(-1)
		if h.begin != nil {
			defer h.begin(name, r, st)()
		}
		d := h.dur(r)
		if r.Key == "K4" {
			h.durMu.Lock()
			d = time.Duration(10000+h.slow.Intn(20001)) * time.Microsecond
			h.durMu.Unlock()
		}
		if d > 0 {
			select {
			case <-time.After(d):
			case <-hctx.Done():
			}
		}
		var err error
		if r.Key == "K3" {
			i := h199Idx(r.ID)
			switch {
			case i%25 == 0:
				err = errors.New(h.tag + ": always fails")
			case i%3 == 0 && r.Attempt == 1:
				err = runqueue.RetryAfter(errors.New(h.tag+": rate limited"), 20*time.Millisecond)
			}
		}
		if hctx.Err() != nil && h.isHard(name) {
			// A handler of a Worker stopped hard that ignores its
			// context (Shutdown does not wait for it): it runs on until
			// just before the lease deadline its fetch returned, so that
			// the caps are judged with the crashed Worker's holds still
			// running, up to the time lease recovery may free them.
			if w := time.Until(r.LeaseDeadline) - 50*time.Millisecond; w > 0 {
				time.Sleep(w)
			}
		}
		del := &h200Del{r: r, worker: name, start: st.Round(0), end: time.Now().Round(0), cancelled: hctx.Err() != nil}
		del.ok = err == nil && !del.cancelled
		h.mu.Lock()
		h.dels = append(h.dels, del)
		h.mu.Unlock()
		if del.cancelled {
			return hctx.Err()
		}
		return err
	}
}

// drain waits (a liveness guard, not a timing assertion: within) until
// every queue of allQ is empty and every handler returned, and reads the
// queues' dead letters (by env/id); call makes each of those reads (h202
// retries those a moving slot refuses). It returns when the queues were
// empty.
func (hs *h200Handlers) drain(t *testing.T, ctx context.Context, q *runqueue.Queue, allQ []runqueue.WorkerQueue, within time.Duration,
	call func(op string, f func() error) error) (time.Time, map[string]runqueue.DeadRun) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var left []string
		for _, wq := range allQ {
			var st runqueue.Stats
			require.NoError(t, call("QueueStats", func() (err error) { st, err = q.QueueStats(ctx, wq.Env, wq.Queue); return err }))
			if st.Ready+st.Delayed+st.InFlight != 0 {
				left = append(left, fmt.Sprintf("%s/%s %+v", wq.Env, wq.Queue, st))
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("queues not empty: %v", left)
		}
		time.Sleep(100 * time.Millisecond)
	}
	drained := time.Now()
	for hs.inHandler.Load() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d handlers still running", hs.inHandler.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	dead := map[string]runqueue.DeadRun{}
	for _, wq := range allQ {
		var ds []runqueue.DeadRun
		require.NoError(t, call("DeadLetters", func() (err error) { ds, err = q.DeadLetters(ctx, wq.Env, wq.Queue, 0, 10000); return err }))
		for _, d := range ds {
			dead[d.Env+"/"+d.ID] = d
		}
	}
	return drained, dead
}

// h200Config is the soaks' limits (every instance has the same): each
// env's limit, qa's queue limit and key limit 2, qb's queue limit and key
// limit 3, and key limit 1 in the second env's qa; and each instance's
// config, of its flag.
func h200Config(envs []string, envLim [3]int, qaLimit, qbLimit, maxAttempts int) (func(env, queue string) runqueue.Limits, func(on bool) func(*runqueue.Config)) {
	limits := func(env, queue string) runqueue.Limits {
		l := runqueue.Limits{Queue: qaLimit, Key: 2}
		if i := slices.Index(envs, env); i >= 0 {
			l.Env = envLim[i]
		}
		if queue == "qb" {
			l.Queue, l.Key = qbLimit, 3
		}
		if env == envs[1] && queue == "qa" {
			l.Key = 1
		}
		return l
	}
	mut := func(on bool) func(*runqueue.Config) {
		return func(cfg *runqueue.Config) {
			cfg.VtimeScheduling = on
			cfg.LeaseDuration = h200Lease
			cfg.MaxAttempts = maxAttempts
			cfg.BackoffBase, cfg.BackoffMax = 10*time.Millisecond, 40*time.Millisecond
			cfg.LimitsFor = limits
		}
	}
	return limits, mut
}
