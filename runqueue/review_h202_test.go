package runqueue_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// Review h202: h200's rolling rollout of Config.VtimeScheduling (real
// Workers of both flags, queue and shard sources, binding env, queue and
// key limits) on a three-master cluster of its own, while a migrator moves
// the hash slots of two envs' shards between masters as s19's does (a few
// keys a MIGRATE, with pauses, so that calls meet half-moved slots).
//
// Three envs, one per master at the start (envsOnMasters), two base queues
// each (qa, qb), the limits of h200 scaled down (LimitsFor, the same on
// every instance); per queue five keys K0..K4 of h202PerKey runs (K1
// weight 8, K0 0.5, K2 4 set through a flag-on instance; priorities 0, 1,
// 9; 20 of K2's runs due in 0.3-3 s; K3 fails every third run once with
// RetryAfter and every 25th always, dead at MaxAttempts 3; K4's handlers
// take 10-30 ms, the others 0-3 ms); a flood key FL of h202Flood runs in
// the first env's qa; the empty key "" in two queues; newcomers, one run
// each, enqueued one at a time every 150 ms while the rest runs. Lease 3
// s, SweepInterval 300 ms, every Worker of Concurrency 6 on its own Queue:
//
//	start:  W1 off (queues), W2 on (queues), W3 on (shards), W4 off
//	        (shards), W5 off (queues)
//	15%:    W1 (off) shut down gracefully, W6 on (queues) in its place
//	30%:    W5 (off) stopped hard (its Start context cancelled)
//	40%:    K0 and K1 swap weights (through the flag-on instance)
//	55%:    W3 (on, shards) rolled back: W7 off (shards) in its place
//	62%:    W6 (on) stopped hard, W9 on (queues) started in its place (a
//	        crash and restart)
//	70%:    W2 (on, queues) rolled back: W8 off (queues) in its place
//
// (percentages of the expected deliveries started). Each step waits until
// a slot is half moved (the migrator between its first and last MIGRATE
// of a move), so the Shutdowns' acks and the new Workers' first calls
// meet it. The migrator moves the slot of envs[0]'s shard (the flood's)
// and of envs[1]'s in turn, from the start until the last step is done
// and h202Moves moves are over.
//
// The verdict is h200's (h200Judge: every run delivered, no overlap of one
// run's clipped intervals, no redelivery after a success but after a hard
// stop or past the lease deadline, dead letters exact, the caps at every
// instant on the handler intervals clipped to Run.LeaseDeadline), plus:
// every queue empty at the end; every error a call of the test saw
// (Enqueue, SetWeight, QueueStats, DeadLetters, retried as a user would)
// and every error a Worker logged is a slot-move one (TRYAGAIN, ASK,
// MOVED, CLUSTERDOWN) or a handler's own (or, on the hard-stopped Worker,
// its context's); every graceful Shutdown returns nil. (A move that stays
// half moved longer, about a second, at a graceful Shutdown makes that
// Shutdown give its acks up: see TestH202ShutdownAcksHalfMovedSlot.)

const (
	h202PerKey = 100
	h202Flood  = 3000
	h202News   = 60
	h202Moves  = 6
)

// h202SlotMove reports whether err is one a caller can tell for a slot on
// the move.
func h202SlotMove(err error) bool {
	if err == nil {
		return false
	}
	_, ask := redis.IsAskError(err)
	_, moved := redis.IsMovedError(err)
	if ask || moved || redis.IsTryAgainError(err) || redis.IsClusterDownError(err) {
		return true
	}
	return h202SlotMoveText(err.Error())
}

func h202SlotMoveText(s string) bool {
	for _, w := range []string{"TRYAGAIN", "ASK ", "MOVED ", "CLUSTERDOWN"} {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}

// h202Log is one Worker's logger: it counts warnings and errors in a
// shared s19sLog and keeps those whose error is neither a slot move's nor
// a handler's own (nor, on a Worker stopped hard, its context's).
type h202Log struct {
	name    string
	counts  *s19sLog
	hard    func(string) bool
	mu      *sync.Mutex
	strange *[]string
	slotErr *atomic.Int64
}

func (h *h202Log) Enabled(ctx context.Context, l slog.Level) bool { return h.counts.Enabled(ctx, l) }
func (h *h202Log) WithAttrs([]slog.Attr) slog.Handler             { return h }
func (h *h202Log) WithGroup(string) slog.Handler                  { return h }
func (h *h202Log) Handle(ctx context.Context, r slog.Record) error {
	_ = h.counts.Handle(ctx, r)
	var errs []string
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "err" || a.Key == "nack_err" {
			errs = append(errs, a.Value.String())
		}
		return true
	})
	for _, e := range errs {
		switch {
		case h202SlotMoveText(e):
			h.slotErr.Add(1)
		case strings.HasPrefix(e, "h202: "): // a handler's own
		case h.hard(h.name) && strings.Contains(e, context.Canceled.Error()):
		default:
			h.mu.Lock()
			*h.strange = append(*h.strange, fmt.Sprintf("%s: %s %s: %s", h.name, r.Level, r.Message, e))
			h.mu.Unlock()
		}
	}
	if len(errs) == 0 && r.Level >= slog.LevelError {
		h.mu.Lock()
		*h.strange = append(*h.strange, fmt.Sprintf("%s: %s %s", h.name, r.Level, r.Message))
		h.mu.Unlock()
	}
	return nil
}

func TestH202RolloutDuringMigration(t *testing.T) {
	// Serial, as h200: a cluster of its own, six Workers, and a migrator.
	c := redistest.OwnCluster(t)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	const maxAttempts = 3
	began := time.Now()

	probe := s34NewQueue(t, c, prefix, nil)
	envs := envsOnMasters(t, c, probe, prefix, "h202e")
	require.Len(t, envs, 3)
	space, err := keys.NewSpace(prefix, probe.Shards())
	require.NoError(t, err)
	var shards, slots []int
	for _, e := range envs {
		s := probe.ShardOf(e)
		shards = append(shards, s)
		slots = append(slots, keys.Slot(space.Shard(s).Master()))
	}
	queues := []string{"qa", "qb"}
	limits, mut := h200Config(envs, [3]int{6, 8, 5}, 4, 5, maxAttempts)
	qOn := s34NewQueue(t, c, prefix, mut(true))
	t.Logf("envs %v (one on each master), shards %v, slots %v; the slots of %s and %s move",
		envs, shards, slots, envs[0], envs[1])

	// The test's own calls retry what a slot move refuses, as a user would.
	errs := &s19sErrors{}
	retry := func(op string, f func() error) error {
		for attempt := 1; ; attempt++ {
			err := f()
			if err == nil || attempt == 2000 {
				return err
			}
			errs.note(op, err)
			if !h202SlotMove(err) {
				return err
			}
			time.Sleep(2 * time.Millisecond)
		}
	}

	// The workload (h200's).
	load := h200Workload(t, qOn, envs, queues, 202, h202PerKey, 20, h202Flood, 60, h202News)
	total, alwaysFails := load.total, load.alwaysFails
	retries := 0
	for id, v := range total {
		if v.key == "K3" && h199Idx(id)%3 == 0 {
			retries++
		}
	}
	expected := len(total) + 2*len(alwaysFails) + retries

	// The handler (h200's).
	hs := newH200Handlers("h202", 202)
	var wmu sync.Mutex // workers, flagOf

	counts := &s19sLog{}
	var logMu sync.Mutex
	var strangeLogs []string
	var slotLogs atomic.Int64
	var allQ []runqueue.WorkerQueue
	for _, e := range envs {
		for _, qn := range queues {
			allQ = append(allQ, runqueue.WorkerQueue{Env: e, Queue: qn})
		}
	}
	workers := map[string]*h200W{}
	flagOf := map[string]bool{}
	start := func(name string, on, byShard bool) {
		q := s34NewQueue(t, c, prefix, mut(on))
		cfg := runqueue.WorkerConfig{Concurrency: 6, SweepInterval: 300 * time.Millisecond,
			Logger: slog.New(&h202Log{name: name, counts: counts, hard: hs.isHard, mu: &logMu, strange: &strangeLogs, slotErr: &slotLogs})}
		if byShard {
			cfg.Shards = shards
		} else {
			cfg.Queues = allQ
		}
		wctx, cancel := context.WithCancel(ctx)
		w, err := runqueue.NewWorker(q, hs.handler(name), &cfg)
		require.NoError(t, err)
		require.NoError(t, retry("Worker.Start", func() error { return w.Start(wctx) }))
		t.Cleanup(func() {
			sctx, c := context.WithTimeout(context.Background(), 10*time.Second)
			defer c()
			_ = w.Shutdown(sctx)
			cancel()
		})
		wmu.Lock()
		workers[name], flagOf[name] = &h200W{name: name, on: on, q: q, w: w, cancel: cancel}, on
		wmu.Unlock()
	}

	// The migrator: the slots of envs[0]'s and envs[1]'s shards in turn,
	// 1 to 3 keys a MIGRATE with a pause after each, until told to stop
	// and h202Moves moves are over. halfMoved is set between a move's
	// first and last MIGRATE.
	var halfMoved, stopMig atomic.Bool
	var moves, movedKeys int
	var moveLog []string
	migDone := make(chan error, 1)
	go func() {
		mrng := rand.New(rand.NewSource(2021))
		mctx, cancel := context.WithTimeout(ctx, 90*time.Second)
		defer cancel()
		for i := 0; !stopMig.Load() || moves < h202Moves; i++ {
			slot := slots[i%2]
			m, err := redistest.StartMigration(mctx, c, slot)
			if err != nil {
				migDone <- err
				return
			}
			errs.migrating.Store(true)
			t0 := time.Now()
			n := 0
			for {
				k, err := m.MoveKeys(mctx, 1+mrng.Intn(3))
				if err != nil {
					migDone <- err
					return
				}
				if k == 0 {
					break
				}
				n += k
				halfMoved.Store(true)
				time.Sleep(time.Duration(2+mrng.Intn(6)) * time.Millisecond)
			}
			halfMoved.Store(false)
			if err := m.Finish(mctx); err != nil {
				migDone <- err
				return
			}
			errs.migrating.Store(false)
			moves++
			movedKeys += n
			moveLog = append(moveLog, fmt.Sprintf("move %d: slot %d (%s) %s -> %s, %d keys in %v, at %v", moves, slot,
				envs[i%2], m.From.Options().Addr, m.To.Options().Addr, n, time.Since(t0).Round(time.Millisecond), t0.Sub(began).Round(time.Millisecond)))
			time.Sleep(time.Duration(50+mrng.Intn(100)) * time.Millisecond)
		}
		migDone <- nil
	}()
	waitHalf := func() bool {
		deadline := time.Now().Add(10 * time.Second)
		for !halfMoved.Load() {
			if time.Now().After(deadline) {
				return false
			}
			time.Sleep(time.Millisecond)
		}
		return true
	}

	start("W1", false, false)
	start("W2", true, false)
	start("W3", true, true)
	start("W4", false, true)
	start("W5", false, false)

	// Newcomers, one at a time, beside the rollout and the moves.
	newsDone := make(chan error, 1)
	go func() {
		for i := 0; i < h202News; i++ {
			p := load.newcomer(i)
			if err := retry("Enqueue", func() error { _, err := qOn.Enqueue(ctx, p); return err }); err != nil {
				newsDone <- err
				return
			}
			time.Sleep(150 * time.Millisecond)
		}
		newsDone <- nil
	}()

	var logs []string
	step := func(what string) {
		half := waitHalf()
		logs = append(logs, fmt.Sprintf("%v: %s (%d deliveries started; slot half moved: %v)", time.Since(began).Round(time.Millisecond), what, hs.started.Load(), half))
	}
	var shutdownErrs []string
	roll := func(old, name string, on, byShard bool) {
		step(fmt.Sprintf("%s (flag %v) shut down gracefully, %s (flag %v) in its place", old, flagOf[old], name, on))
		wmu.Lock()
		ow := workers[old]
		wmu.Unlock()
		t0 := time.Now()
		err := ow.w.Shutdown(context.Background())
		logs = append(logs, fmt.Sprintf("  %s's Shutdown took %v: %v", old, time.Since(t0).Round(time.Millisecond), err))
		if err != nil {
			shutdownErrs = append(shutdownErrs, old+": "+err.Error())
		}
		start(name, on, byShard)
	}
	waitFor := func(frac float64) { hs.waitStarted(t, int64(frac*float64(expected)), 60*time.Second) }
	waitFor(0.15)
	roll("W1", "W6", true, false)
	waitFor(0.30)
	step("W5 (flag false) stopped hard")
	hs.stoppedHard("W5")
	workers["W5"].cancel()
	waitFor(0.40)
	step("K0 and K1 swap weights")
	for _, e := range envs {
		for _, qn := range queues {
			require.NoError(t, retry("SetWeight", func() error { return qOn.SetWeight(ctx, e, qn, "K0", 8) }))
			require.NoError(t, retry("SetWeight", func() error { return qOn.SetWeight(ctx, e, qn, "K1", 0.5) }))
		}
	}
	waitFor(0.55)
	roll("W3", "W7", false, true)
	waitFor(0.62)
	step("W6 (flag true) stopped hard, W9 (flag true, queues) started in its place")
	hs.stoppedHard("W6")
	workers["W6"].cancel()
	start("W9", true, false)
	waitFor(0.70)
	roll("W2", "W8", false, false)
	stopMig.Store(true)
	require.NoError(t, <-newsDone)
	require.NoError(t, <-migDone)
	for _, name := range []string{"W5", "W6"} {
		sctx, c := context.WithTimeout(ctx, 5*time.Second)
		err := workers[name].w.Shutdown(sctx)
		c()
		logs = append(logs, fmt.Sprintf("%s's Shutdown after the hard stop: %v", name, err))
	}

	drained, dead := hs.drain(t, ctx, qOn, allQ, 60*time.Second, retry)
	for _, l := range moveLog {
		t.Log(l)
	}
	for _, l := range logs {
		t.Log(l)
	}
	all := hs.deliveries()
	redelivered := 0
	seen := map[string]int{}
	for _, d := range all {
		seen[d.r.Env+"/"+d.r.ID]++
	}
	for _, n := range seen {
		redelivered += n - 1
	}
	t.Logf("%d runs, %d deliveries (%d beyond the first of a run: retries, dead letters' attempts, recoveries), %d dead letters (%d always-failing runs); %d moves (%d keys moved); queues empty at %v",
		len(total), len(all), redelivered, len(dead), len(alwaysFails), moves, movedKeys, drained.Sub(began).Round(time.Millisecond))

	viol, capViol := (&h200Judge{all: all, total: total, alwaysFails: alwaysFails, dead: dead, hard: hs.hard, flagOf: flagOf,
		maxAttempts: maxAttempts, limits: limits, envs: envs, queues: queues}).judge(t)

	per := map[string]int{}
	for _, d := range all {
		per[fmt.Sprintf("%s(%v)", d.worker, flagOf[d.worker])]++
	}
	t.Logf("deliveries per Worker (flag): %v", per)
	t.Logf("errors the test's calls saw and retried: %s", errs.report())
	t.Logf("Worker warnings and errors (%d with a slot-move error):\n%s", slotLogs.Load(), counts.report())

	for _, v := range viol[:min(len(viol), 20)] {
		t.Log("violation: " + v)
	}
	require.Empty(t, viol, "%d cap violations", capViol)
	require.GreaterOrEqual(t, moves, h202Moves)
	require.Empty(t, shutdownErrs, "graceful Shutdowns that returned an error")
	errs.mu.Lock()
	strange := append([]string(nil), errs.strange...)
	errs.mu.Unlock()
	require.Empty(t, strange, "errors of the test's calls that are not a slot move's")
	logMu.Lock()
	defer logMu.Unlock()
	require.Empty(t, strangeLogs[:min(len(strangeLogs), 20)], "Worker logs of errors that are not a slot move's (%d)", len(strangeLogs))
}
