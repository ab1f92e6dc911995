package runqueue_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// TestWorkerDrainsLastQueueUnderEnvLimit: helper-209's stall. Flag on, env
// limit 2: a Worker over qa and qb (Concurrency 2) and a Worker over qc on
// another Queue share the env's two slots; 300 runs a queue. Every run is
// handled once, within 20 s (the polls are 30 s). Before, once two queues
// drained, the Worker's remaining queue sat idle for its whole poll with
// its ready runs and the env free: its last call that asked for runs was
// held (its mark then dropped by a call of its own that Redis ran after
// it), and its acks went alone while the Worker's slots were busy with its
// other queue's runs; nothing woke it again (29.9 s in 3 runs of 3 on a
// real Redis).
func TestWorkerDrainsLastQueueUnderEnvLimit(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		prefix := redistest.Prefix(t)
		limits := func(cfg *runqueue.Config) {
			cfg.LimitsFor = func(string, string) runqueue.Limits { return runqueue.Limits{Env: 2} }
			cfg.BlockPollInterval = 30 * time.Second
		}
		q1 := s34NewQueue(t, c, prefix, limits)
		q2 := s34NewQueue(t, c, prefix, limits)
		const per = 300
		queues := []string{"qa", "qb", "qc"}
		for _, qu := range queues {
			ps := make([]runqueue.EnqueueParams, per)
			for i := range ps {
				ps[i] = runqueue.EnqueueParams{Env: env, Queue: qu, Key: "k", ID: fmt.Sprintf("%s-%03d", qu, i)}
			}
			_, err := q1.EnqueueMany(context.Background(), ps)
			require.NoError(t, err)
		}
		rec := newDrainLog()
		handle := rec.handler(2 * time.Millisecond)
		w1 := startWorker(t, q1, handle, func(cfg *runqueue.WorkerConfig) {
			cfg.Queues = []runqueue.WorkerQueue{{Env: env, Queue: "qa"}, {Env: env, Queue: "qb"}}
			cfg.Concurrency = 2
		})
		w2 := startWorker(t, q2, handle, func(cfg *runqueue.WorkerConfig) {
			cfg.Queues = []runqueue.WorkerQueue{{Env: env, Queue: "qc"}}
			cfg.Concurrency = 2
		})
		want := map[string]int{}
		for _, qu := range queues {
			want[qu] = per
		}
		rec.await(t, want)
		shutdown(t, w1)
		shutdown(t, w2)
		rec.once(t)
	})
}

// TestWorkerQueueLimitAtSaturationDrains: helper-210's stall: a Worker of
// Concurrency 4 over an unlimited queue q00 (800 runs) and ten queues of
// queue limit 1 (40 runs each), polls of 30 s. Every run is handled within
// 20 s. Before, a queue of limit 1 sat out a whole poll in about half the
// runs: its ack went alone (every slot busy), a slot freed meanwhile, and
// its call for runs ran in Redis before the ack (nothing: its one run still
// held the queue), then the ack; the short reply left the source idle and
// nothing woke it.
func TestWorkerQueueLimitAtSaturationDrains(t *testing.T) {
	t.Parallel()
	for _, flag := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", flag), func(t *testing.T) {
			c := redistest.Real(t)
			prefix := redistest.Prefix(t)
			q := s34NewQueue(t, c, prefix, func(cfg *runqueue.Config) {
				cfg.VtimeScheduling = flag
				cfg.BlockPollInterval = 30 * time.Second
				cfg.LimitsFor = func(_, queue string) runqueue.Limits {
					if queue == "q00" {
						return runqueue.Limits{}
					}
					return runqueue.Limits{Queue: 1}
				}
			})
			const queues = 11
			want := map[string]int{}
			for i := range queues {
				n := 40
				if i == 0 {
					n = 800
				}
				ps := make([]runqueue.EnqueueParams, n)
				for k := range ps {
					ps[k] = runqueue.EnqueueParams{Env: env, Queue: fmt.Sprintf("q%02d", i), Key: "k", ID: fmt.Sprintf("q%02d-%03d", i, k)}
				}
				_, err := q.EnqueueMany(context.Background(), ps)
				require.NoError(t, err)
				want[fmt.Sprintf("q%02d", i)] = n
			}
			rec := newDrainLog()
			w := startWorker(t, q, rec.handler(time.Millisecond), func(cfg *runqueue.WorkerConfig) {
				cfg.Queues = nil
				for i := range queues {
					cfg.Queues = append(cfg.Queues, runqueue.WorkerQueue{Env: env, Queue: fmt.Sprintf("q%02d", i)})
				}
				cfg.Concurrency = 4
			})
			rec.await(t, want)
			shutdown(t, w)
			rec.once(t)
		})
	}
}

// drainLog counts how often each run was handled, by ID (a run's queue is
// its ID up to the "-").
type drainLog struct {
	mu   sync.Mutex
	seen map[string]int
	last map[string]time.Time // by queue: its last run handled
}

func newDrainLog() *drainLog {
	return &drainLog{seen: map[string]int{}, last: map[string]time.Time{}}
}

// handler takes d per run and counts it.
func (l *drainLog) handler(d time.Duration) runqueue.Handler {
	return func(_ context.Context, r *runqueue.Run) error {
		time.Sleep(d)
		l.mu.Lock()
		l.seen[r.ID]++
		qu, _, _ := strings.Cut(r.ID, "-")
		l.last[qu] = time.Now()
		l.mu.Unlock()
		return nil
	}
}

// drainStall is how long a queue with runs left may go without one
// handled: a third of the tests' 30 s polls. A queue sitting out a poll
// shows as such a gap whatever the machine's speed, where a deadline on
// the whole drain (20 s, before) measured the machine too: a loaded run
// took 10 s of it on the Cluster backend.
const drainStall = 10 * time.Second

// await waits until the runs of want (by queue) were handled, failing as
// soon as a queue with runs left had none handled for drainStall (from
// the call, for a queue not served yet); 2 min in all is a liveness guard.
func (l *drainLog) await(t *testing.T, want map[string]int) {
	t.Helper()
	total := 0
	for _, n := range want {
		total += n
	}
	began := time.Now()
	for {
		l.mu.Lock()
		n, by := len(l.seen), map[string]int{}
		for id := range l.seen {
			qu, _, _ := strings.Cut(id, "-")
			by[qu]++
		}
		var stalled []string
		for qu, m := range want {
			at := l.last[qu]
			if at.IsZero() {
				at = began
			}
			if by[qu] < m && time.Since(at) > drainStall {
				stalled = append(stalled, fmt.Sprintf("%s (%d of %d, the last %v ago)", qu, by[qu], m, time.Since(at).Round(time.Millisecond)))
			}
		}
		l.mu.Unlock()
		if n == total {
			return
		}
		if len(stalled) > 0 {
			t.Fatalf("%d of %d runs handled in %v (by queue %v): a queue with runs left had none handled for %v, it waits for its 30 s poll: %v",
				n, total, time.Since(began).Round(time.Millisecond), by, drainStall, stalled)
		}
		if time.Since(began) > 2*time.Minute {
			t.Fatalf("%d of %d runs handled in 2 min (by queue %v)", n, total, by)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// once checks that every run was handled once.
func (l *drainLog) once(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, n := range l.seen {
		require.Equal(t, 1, n, "%s handled once", id)
	}
}
