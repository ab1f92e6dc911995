package runqueue_test

import (
	"context"
	"fmt"
	"math/rand"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// Review s34: the guarantees of docs/design.md section 7 checked on the
// schedule a runqueue.Worker produces (flag on, real Redis), not on direct
// Dequeue calls. Two views of the schedule are recorded:
//
//   - the serve order: every delivery's Run.Token is the shard's delivery
//     counter, taken by INCRBY inside the dequeue script, token0+i for the
//     i-th serve of a call (lua/lib/dequeue.lua). Each test has its own
//     prefix, so its shard's counter is dealt only to its runs: sorting the
//     started runs by Token gives the exact serve sequence the Worker's
//     calls (fused AckAndDequeue, two in flight, gathered) made;
//   - the handler start order, which adds the Worker's dispatch: a run
//     served before another may start after it while both are held, and a
//     Worker holds at most Concurrency runs ("The worker never holds more
//     runs than this").

const s34Env, s34Queue = "s34", "work"

type s34Rec struct {
	mu     sync.Mutex
	starts []*runqueue.Run
	at     []s34Stamp // the starts with their times
	ends   []s34Stamp // handlers' ends, in order
	notify map[string]chan struct{}
	dur    func(r *runqueue.Run) time.Duration
	inKey  map[string]int // handlers running per key
	maxIn  map[string]int
}

func s34NewRec(dur func(r *runqueue.Run) time.Duration) *s34Rec {
	return &s34Rec{notify: map[string]chan struct{}{}, dur: dur, inKey: map[string]int{}, maxIn: map[string]int{}}
}

// s34Stamp is a handler's start or end and when.
type s34Stamp struct {
	r  *runqueue.Run
	at time.Time
}

func (h *s34Rec) handler(ctx context.Context, r *runqueue.Run) error {
	h.mu.Lock()
	h.starts = append(h.starts, r)
	h.at = append(h.at, s34Stamp{r, time.Now()})
	if ch := h.notify[r.ID]; ch != nil {
		close(ch)
		delete(h.notify, r.ID)
	}
	h.inKey[r.Key]++
	if h.inKey[r.Key] > h.maxIn[r.Key] {
		h.maxIn[r.Key] = h.inKey[r.Key]
	}
	h.mu.Unlock()
	if d := h.dur(r); d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
	}
	h.mu.Lock()
	h.inKey[r.Key]--
	h.ends = append(h.ends, s34Stamp{r, time.Now()})
	h.mu.Unlock()
	return nil
}

// stamps are the starts with their times; ends the handlers' ends.
func (h *s34Rec) stamps() (starts, ends []s34Stamp) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]s34Stamp(nil), h.at...), append([]s34Stamp(nil), h.ends...)
}

// expect registers id before its enqueue: the channel closes at its start.
func (h *s34Rec) expect(id string) chan struct{} {
	ch := make(chan struct{})
	h.mu.Lock()
	h.notify[id] = ch
	h.mu.Unlock()
	return ch
}

func (h *s34Rec) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.starts)
}

func (h *s34Rec) snapshot() []*runqueue.Run {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*runqueue.Run(nil), h.starts...)
}

// waitCount waits until n handlers started (a liveness guard, not a
// timing assertion).
func (h *s34Rec) waitCount(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for h.count() < n {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d runs started", h.count(), n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// s34Serves is the serve sequence: the started runs by delivery token.
func s34Serves(starts []*runqueue.Run) []*runqueue.Run {
	out := append([]*runqueue.Run(nil), starts...)
	sort.Slice(out, func(i, j int) bool { return out[i].Token < out[j].Token })
	return out
}

// s34Lease is the lease of s34NewQueue's queues: a serve's lease deadline
// minus it is the clock its dequeue call read.
const s34Lease = time.Minute

func s34NewQueue(t *testing.T, c redis.UniversalClient, prefix string, mut func(*runqueue.Config)) *runqueue.Queue {
	t.Helper()
	cfg := runqueue.Config{Prefix: prefix, VtimeScheduling: true, LeaseDuration: s34Lease}
	if mut != nil {
		mut(&cfg)
	}
	q, err := runqueue.New(context.Background(), c, &cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	return q
}

func s34Start(t *testing.T, q *runqueue.Queue, h *s34Rec, cfg runqueue.WorkerConfig) *runqueue.Worker {
	t.Helper()
	if cfg.SweepInterval == 0 {
		cfg.SweepInterval = -1
	}
	w, err := runqueue.NewWorker(q, h.handler, &cfg)
	require.NoError(t, err)
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = w.Shutdown(ctx)
	})
	return w
}

func s34Tokens(t *testing.T, c redis.UniversalClient, q *runqueue.Queue, prefix string) string {
	t.Helper()
	sp, err := keys.NewSpace(prefix, q.Config().Shards)
	require.NoError(t, err)
	return sp.Shard(q.ShardOf(s34Env)).Tokens()
}

func s34EnqueueBulk(t *testing.T, q *runqueue.Queue, key string, n, prio int, tag string) {
	t.Helper()
	ps := make([]runqueue.EnqueueParams, 0, 1000)
	flush := func() {
		if len(ps) == 0 {
			return
		}
		_, err := q.EnqueueMany(context.Background(), ps)
		require.NoError(t, err)
		ps = ps[:0]
	}
	for i := 0; i < n; i++ {
		ps = append(ps, runqueue.EnqueueParams{Env: s34Env, Queue: s34Queue, Key: key,
			ID: fmt.Sprintf("%s-%s-%d", tag, key, i), Payload: []byte("x"), Priority: prio})
		if len(ps) == 1000 {
			flush()
		}
	}
	flush()
}

func s34RandDur(maxMs int) func(*runqueue.Run) time.Duration {
	var mu sync.Mutex
	rng := rand.New(rand.NewSource(34))
	return func(*runqueue.Run) time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return time.Duration(rng.Int63n(int64(maxMs)*1000+1)) * time.Microsecond
	}
}

// TestS34WorkerFloodTrickle: one key floods (H x heavy), 50 light keys
// trickle one run at a time while the Worker runs (each enqueues its next
// run once its previous one started), handlers of 0-3 ms, Worker
// concurrency 32 and 100 (queue source), and two Workers on the same
// queue, one with a queue source and one with a shard source.
//
// Guarantee 10 (docs/design.md section 7): "With equal weights, a key
// that registers when the lane is empty is served within 3 serves per
// other active key, whatever expired, drained, returned or was minted
// before it; the k-th newcomer waiting in the lane after about k rounds".
// A light run that finds its key parked above V returns at its tag (one
// serve of the key past V at most, within guarantee 2's D for a parked
// key). At most 50 other keys are active (H and 49 lights), and a light
// newcomer has at most 49 newcomers ahead in the lane, each leaving it
// within a round (here a round is one serve of H and one of the lane head,
// the other lights being in the lane or returning at their own tags, so
// about 2 x 49 serves at worst), so the wait bound used is 3 x 50 serves of
// other keys per light run, counted in the serve sequence from the delivery token
// read just after its Enqueue returned (later than it became ready: the
// measured wait is at most the true one) to its own serve. On the
// handler start order, the runs served before it became ready but held
// unstarted (at most Concurrency per Worker) and the runs served after it
// but started first (at most Concurrency per Worker) are added.
func TestS34WorkerFloodTrickle(t *testing.T) {
	for _, mode := range []struct {
		name  string
		conc  int
		two   bool
		heavy int
		delay time.Duration // lights' runs enqueued with this delay
		twoQ  bool          // the second Worker has a queue source too
	}{
		{"queue-c32", 32, false, 20000, 0, false},
		{"queue-c100", 100, false, 20000, 0, false},
		{"queue+shard-c32", 32, true, 20000, 0, false},
		{"queue+queue-c100", 100, true, 20000, 0, true},
		{"delayed-c32", 32, false, 20000, 3 * time.Millisecond, false},
		{"delayed-queue+shard-c100", 100, true, 20000, 3 * time.Millisecond, false},
	} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			c := redistest.Real(t)
			ctx := context.Background()
			prefix := redistest.Prefix(t)
			q := s34NewQueue(t, c, prefix, nil)
			tokKey := s34Tokens(t, c, q, prefix)
			s34EnqueueBulk(t, q, "H", mode.heavy, 0, "h")
			h := s34NewRec(s34RandDur(3))
			workers := 1
			s34Start(t, q, h, runqueue.WorkerConfig{Queues: []runqueue.WorkerQueue{{Env: s34Env, Queue: s34Queue}},
				Concurrency: mode.conc})
			if mode.two {
				q2 := s34NewQueue(t, c, prefix, nil)
				cfg := runqueue.WorkerConfig{Shards: []int{q2.ShardOf(s34Env)}, Concurrency: mode.conc}
				if mode.twoQ {
					cfg = runqueue.WorkerConfig{Queues: []runqueue.WorkerQueue{{Env: s34Env, Queue: s34Queue}}, Concurrency: mode.conc}
				}
				s34Start(t, q2, h, cfg)
				workers = 2
			}
			const lights, per = 50, 15
			type ready struct {
				tok   int64
				start int // handler starts when its Enqueue returned
			}
			var rmu sync.Mutex
			readyAt := map[string]ready{}
			var wg sync.WaitGroup
			errs := make(chan error, lights)
			for i := 0; i < lights; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					rng := rand.New(rand.NewSource(int64(i)))
					key := fmt.Sprintf("L%02d", i)
					for j := 0; j < per; j++ {
						id := fmt.Sprintf("%s-%d", key, j)
						ch := h.expect(id)
						if _, err := q.Enqueue(ctx, runqueue.EnqueueParams{Env: s34Env, Queue: s34Queue, Key: key, ID: id,
							Payload: []byte("x"), Delay: mode.delay}); err != nil {
							errs <- err
							return
						}
						if mode.delay > 0 {
							// ready once due: the token is read after that
							time.Sleep(mode.delay + time.Millisecond)
						}
						n := h.count()
						tok, err := c.Get(ctx, tokKey).Int64()
						if err != nil && err != redis.Nil {
							errs <- err
							return
						}
						rmu.Lock()
						readyAt[id] = ready{tok, n}
						rmu.Unlock()
						select {
						case <-ch:
						case <-time.After(30 * time.Second):
							errs <- fmt.Errorf("%s not started", id)
							return
						}
						time.Sleep(time.Duration(rng.Intn(2000)) * time.Microsecond)
					}
				}(i)
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			h.waitCount(t, mode.heavy+lights*per)
			starts := h.snapshot()
			serves := s34Serves(starts)
			pos := map[string]int{}
			for i, r := range serves {
				pos[r.ID] = i
			}
			spos := map[string]int{}
			for i, r := range starts {
				spos[r.ID] = i
			}
			boundServe := 3 * lights
			boundStart := boundServe + 2*workers*mode.conc
			var maxServe, maxStart, maxH, stale int
			var worstServe, worstStart string
			var viol []string
			for id, rd := range readyAt {
				p := pos[id]
				key := serves[p].Key
				// serves of other keys with token in (rd.tok, own token)
				var others, hs int
				due := serves[p].AvailableAt
				for k := p - 1; k >= 0 && serves[k].Token > rd.tok; k-- {
					// A delayed run is due at AvailableAt but ready
					// only once a call promotes it, and a call whose
					// clock was read before that (the Worker keeps calls
					// in flight) does not, whenever Redis runs it: its
					// serves are not the scheduler's choice over this
					// run (CI at 63e3ce8 counted 159 serves of H, up to
					// Concurrency a call). The call's clock is its
					// lease deadline minus the lease (s34Lease).
					if mode.delay > 0 && serves[k].LeaseDeadline.Add(-s34Lease).Before(due) {
						stale++
						continue
					}
					if serves[k].Key != key {
						others++
						if serves[k].Key == "H" {
							hs++
						}
					}
				}
				if others > maxServe {
					maxServe, worstServe = others, id
				}
				maxH = max(maxH, hs)
				var so int
				for k := rd.start; k < spos[id]; k++ {
					if starts[k].Key != key {
						so++
					}
				}
				if so > maxStart {
					maxStart, worstStart = so, id
				}
				if others > boundServe && len(viol) < 5 {
					viol = append(viol, fmt.Sprintf("%s: %d serves of other keys (%d of H) before its serve", id, others, hs))
				}
				if so > boundStart && len(viol) < 10 {
					viol = append(viol, fmt.Sprintf("%s: %d handler starts of other keys before its start", id, so))
				}
			}
			t.Logf("%s: light wait max %d serves of others (%s; max %d of H in one wait; bound %d; %d serves of calls whose clock was before the run was due not counted), max %d handler starts of others (%s; bound %d)",
				mode.name, maxServe, worstServe, maxH, boundServe, stale, maxStart, worstStart, boundStart)
			require.Empty(t, viol)
		})
	}
}
