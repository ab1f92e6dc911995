package runqueue_test

// Review s19, live: a Redis Cluster resharding under a production-like
// workload. While producers enqueue (one run at a time and in batches, new
// and existing concurrency keys, priorities, delays, TTLs), a Worker serves
// one base queue and goroutines serve another by hand (Dequeue,
// AckAndDequeue, Ack, Nack), a migrator moves the hash slot of the envs'
// shard from master to master, a few keys at a time with pauses between
// the MIGRATEs, so that calls meet every half-moved state, and finishes
// each move before it starts the next. Errors while a slot moves are
// expected (TRYAGAIN and the like): every caller retries, as a user
// would, and a producer retries with the same id (Enqueue is idempotent on
// it). Nothing may be lost: once the moves are over and the queues are
// drained, every run whose enqueue succeeded was handled, no run was
// handled that was never enqueued, the runs meant to expire expired (and
// only they, each once), every error a caller saw says the slot was on the
// move (TRYAGAIN, ASK, MOVED), and no key is left under the prefix but the
// scheduler's state, which expires on its own.

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// The classes of run the producers make.
const (
	s19sPlain       = iota // must be handled (some have a delay, a priority, a TTL of an hour)
	s19sExpireLater        // delay 2h, TTL 10m: expires at the drain, never handled
	s19sExpireSoon         // delay 1h, TTL 5s: expires during the soak (worker sweeps), never handled
)

// The soak's sizes.
const (
	s19sMigrations = 6
	s19sProducers  = 3
	s19sConsumers  = 1 // hand consumers per env of the "deploy" queue
	s19sWorkerQ    = "build"
	s19sHandQ      = "deploy"
	s19sLease      = 10 * time.Second // fake time; the fake clock runs about 5x real time in the soak
)

// s19sObserver counts what the Queue reports.
type s19sObserver struct {
	runqueue.NopObserver
	enqueued, acked, expired, recovered, dead, nacked atomic.Int64
}

func (o *s19sObserver) Enqueued(_, _ string, n int) { o.enqueued.Add(int64(n)) }
func (o *s19sObserver) Acked(_, _ string, n int)    { o.acked.Add(int64(n)) }
func (o *s19sObserver) Expired(_, _ string, n int)  { o.expired.Add(int64(n)) }
func (o *s19sObserver) Recovered(_, _ string, n, dead int) {
	o.recovered.Add(int64(n))
	o.dead.Add(int64(dead))
}

func (o *s19sObserver) Nacked(_, _ string, requeued bool) {
	o.nacked.Add(1)
	if !requeued {
		o.dead.Add(1)
	}
}

// s19sErrors counts the errors callers saw, by call and kind, and whether
// a slot was moving when they came.
type s19sErrors struct {
	migrating atomic.Bool
	tally     s19Tally
	mu        sync.Mutex
	during    int
	outside   int
	// strange are errors a caller cannot tell for a slot on the move
	// (redis.IsTryAgainError, IsAskError, IsMovedError, IsClusterDownError).
	strange []string
}

func (e *s19sErrors) note(op string, err error) {
	e.tally.note(op, err)
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ask := redis.IsAskError(err)
	_, moved := redis.IsMovedError(err)
	if !ask && !moved && !redis.IsTryAgainError(err) && !redis.IsClusterDownError(err) && len(e.strange) < 20 {
		e.strange = append(e.strange, op+": "+err.Error())
	}
	if e.migrating.Load() {
		e.during++
	} else {
		e.outside++
	}
}

func (e *s19sErrors) report() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return fmt.Sprintf("%d calls failed while a slot moved, %d outside a move; ", e.during, e.outside) + e.tally.report()
}

// s19Tally counts the errors callers saw, by call and kind (s19sKind),
// with a message of each kind, how many and when the last came. Its zero
// value is ready.
type s19Tally struct {
	mu     sync.Mutex
	n      int
	last   time.Time
	byKind map[string]int
	sample map[string]string
}

func (e *s19Tally) note(op string, err error) {
	kind := s19sKind(err)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.byKind == nil {
		e.byKind, e.sample = map[string]int{}, map[string]string{}
	}
	e.n++
	e.last = time.Now()
	e.byKind[op+": "+kind]++
	if _, ok := e.sample[kind]; !ok {
		e.sample[kind] = err.Error()
	}
}

func (e *s19Tally) report() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d errors\n", e.n)
	for _, k := range sortedKeys(e.byKind) {
		fmt.Fprintf(&sb, "  %5d  %s\n", e.byKind[k], k)
	}
	for _, k := range sortedKeys(e.sample) {
		fmt.Fprintf(&sb, "  e.g. %s: %q\n", k, e.sample[k])
	}
	return sb.String()
}

// kinds counts the errors by kind, whatever the call.
func (e *s19Tally) kinds() map[string]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[string]int{}
	for k, n := range e.byKind {
		_, kind, _ := strings.Cut(k, ": ")
		out[kind] += n
	}
	return out
}

// s19sKind names the kind of a call's error: the Redis error code, or
// what the message says.
func s19sKind(err error) string {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "non local key"):
		return "non-local-key"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "context"
	}
	code, _, _ := strings.Cut(msg, " ")
	if code == "ERR" || code == "" {
		if len(msg) > 60 {
			msg = msg[:60]
		}
		return msg
	}
	return code
}

// s19sLog is a slog handler that counts the Worker's warnings and errors.
type s19sLog struct {
	mu     sync.Mutex
	counts map[string]int
	sample map[string]string
}

func (h *s19sLog) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h *s19sLog) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h *s19sLog) WithGroup(string) slog.Handler                { return h }
func (h *s19sLog) Handle(_ context.Context, r slog.Record) error {
	var errText string
	r.Attrs(func(a slog.Attr) bool {
		switch {
		case a.Key == "nack_err": // the Redis error of a failed nack, rather than the handler's
			errText = a.Value.String()
		case a.Key == "err" && errText == "":
			errText = a.Value.String()
		}
		return true
	})
	k := r.Level.String() + " " + r.Message
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.counts == nil {
		h.counts, h.sample = map[string]int{}, map[string]string{}
	}
	h.counts[k]++
	if _, ok := h.sample[k]; !ok && errText != "" {
		h.sample[k] = errText
	}
	return nil
}

func (h *s19sLog) report() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var sb strings.Builder
	for _, k := range sortedKeys(h.counts) {
		fmt.Fprintf(&sb, "  %5d  %s", h.counts[k], k)
		if s := h.sample[k]; s != "" {
			fmt.Fprintf(&sb, " (e.g. %q)", s)
		}
		sb.WriteString("\n")
	}
	return sb.String()
}

// s19sBook is what the test knows of every run: what was enqueued (the
// call succeeded) and what was handled (a handler returned nil, or an ack
// succeeded), and anything that must not happen.
type s19sBook struct {
	mu       sync.Mutex
	enqueued map[string]int // run name -> class
	handled  map[string]int // run name -> times
	queued   map[string]int // run name -> calls that said they queued it (Queued true)
	problems []string
}

func s19sName(env, queue, id string) string { return env + "/" + queue + "/" + id }

func (b *s19sBook) enqueuedOK(p runqueue.EnqueueParams, class int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.enqueued[s19sName(p.Env, p.Queue, p.ID)] = class
}

func (b *s19sBook) queuedBy(p runqueue.EnqueueParams) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.queued[s19sName(p.Env, p.Queue, p.ID)]++
}

func (b *s19sBook) handle(r *runqueue.Run) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.handled[s19sName(r.Env, r.Queue, r.ID)]++
}

func (b *s19sBook) problem(format string, args ...any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.problems) < 50 {
		b.problems = append(b.problems, fmt.Sprintf(format, args...))
	}
}

func (b *s19sBook) checkPayload(r *runqueue.Run) {
	if want := "payload " + r.ID; string(r.Payload) != want {
		b.problem("run %s: payload %q, want %q", s19sName(r.Env, r.Queue, r.ID), r.Payload, want)
	}
}

// plainLeft says how many plain runs enqueued are not handled yet.
func (b *s19sBook) plainLeft(only func(name string) bool) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for name, class := range b.enqueued {
		if class == s19sPlain && b.handled[name] == 0 && (only == nil || only(name)) {
			n++
		}
	}
	return n
}

func s19sHash(s string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return h.Sum32()
}

// s19sEnvs returns n envs of the shard of env "s19s-0", and one env of
// another shard, the control, whose slot does not move.
func s19sEnvs(q *runqueue.Queue, n int) (moving []string, control string) {
	shard := q.ShardOf("s19s-0")
	for i := 0; len(moving) < n || control == ""; i++ {
		e := fmt.Sprintf("s19s-%d", i)
		switch {
		case q.ShardOf(e) == shard && len(moving) < n:
			moving = append(moving, e)
		case q.ShardOf(e) != shard && control == "":
			control = e
		}
	}
	return moving, control
}

// s19sParams builds a run of a producer: its key is none, a new one or one
// of a few used again and again; some have a delay, a priority or a TTL.
func s19sParams(rng *rand.Rand, env, queue, id string) (runqueue.EnqueueParams, int) {
	p := runqueue.EnqueueParams{Env: env, Queue: queue, ID: id, Payload: []byte("payload " + id)}
	switch rng.IntN(4) {
	case 0:
	case 1:
		p.Key = "new-" + id
	default:
		p.Key = fmt.Sprintf("k%d", rng.IntN(4))
	}
	class := s19sPlain
	switch r := rng.IntN(20); {
	case r < 3:
		p.Delay = time.Duration(200+rng.IntN(2800)) * time.Millisecond
	case r == 3:
		p.TTL = time.Hour
		p.Delay = time.Duration(rng.IntN(1000)) * time.Millisecond
	case r == 4:
		p.Delay, p.TTL, class = 2*time.Hour, 10*time.Minute, s19sExpireLater
	case r == 5:
		p.Delay, p.TTL, class = time.Hour, 5*time.Second, s19sExpireSoon
	case r < 8:
		p.Priority = 1 + rng.IntN(9)
	}
	return p, class
}

// TestS19ReshardLive moves the hash slot of two envs' shard between the
// masters of a private three-node cluster, six times, a few keys at a time,
// while producers, a Worker and hand consumers work on those envs and on a
// control env whose slot stays; then drains and checks that no run was
// lost, none was made up, the TTL'd runs expired, every error was one a
// caller can tell for a slot on the move, and no key is left (but the
// scheduler's state, with its TTL).
func TestS19ReshardLive(t *testing.T) {
	t.Parallel() // servers of its own (spawned for it), and no tight wall-clock bound
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			s19sReshardLive(t, on)
		})
	}
}

func s19sReshardLive(t *testing.T, on bool) {
	start := time.Now()
	c := redistest.OwnCluster(t)
	obs := &s19sObserver{}
	b := setup(t, c, func(cfg *runqueue.Config) {
		cfg.VtimeScheduling = on
		cfg.LeaseDuration = s19sLease
		cfg.MaxAttempts = -1 // no dead letters: every run ends acked or expired
		cfg.BackoffBase = 500 * time.Millisecond
		cfg.BackoffMax = 2 * time.Second
		cfg.BlockPollInterval = 20 * time.Millisecond
		cfg.Observer = obs
	})
	up := time.Since(start)
	ctx := b.ctx
	q := b.q
	moving, control := s19sEnvs(q, 2)
	envs := append(slices.Clone(moving), control)
	shard := q.ShardOf(moving[0])
	slot := keys.Slot(keySpace(t, b).Shard(shard).Master())
	shards := []int{shard, q.ShardOf(control)}
	t.Logf("envs %v on shard %d (slot %d) move; %s on shard %d stays", moving, shard, slot, control, q.ShardOf(control))

	// A weight on one key of every queue, as a flag-on deployment has: the
	// weights hash exists, so the flag-on scripts, which declare it, run
	// on a slot's source while its other keys are there too.
	for _, e := range envs {
		for _, qn := range []string{s19sWorkerQ, s19sHandQ} {
			require.NoError(t, q.SetWeight(ctx, e, qn, "k0", 2))
		}
	}

	book := &s19sBook{enqueued: map[string]int{}, handled: map[string]int{}, queued: map[string]int{}}
	errs := &s19sErrors{}
	logs := &s19sLog{}

	// The fake clock runs at about 5x real time, so that delays, nack
	// retries and TTLs come due during the soak.
	clockStop := make(chan struct{})
	var clockDone sync.WaitGroup
	clockDone.Go(func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-clockStop:
				return
			case <-tick.C:
				b.clock.Advance(25 * time.Millisecond)
			}
		}
	})
	stopClock := sync.OnceFunc(func() { close(clockStop); clockDone.Wait() })
	t.Cleanup(stopClock)

	// enqueue sends one run until a call succeeds.
	enqueue := func(p runqueue.EnqueueParams, class int) {
		for attempt := 1; ; attempt++ {
			queued, err := q.Enqueue(ctx, p)
			if queued {
				book.queuedBy(p)
			}
			if err == nil {
				book.enqueuedOK(p, class)
				return
			}
			if errors.Is(err, runqueue.ErrInvalid) || errors.Is(err, runqueue.ErrConflict) || errors.Is(err, runqueue.ErrQueueFull) {
				book.problem("Enqueue %s: %v", s19sName(p.Env, p.Queue, p.ID), err)
				return
			}
			errs.note("Enqueue", err)
			if attempt == 5000 {
				book.problem("Enqueue %s: gave up: %v", s19sName(p.Env, p.Queue, p.ID), err)
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	// enqueueMany sends a batch, then again the runs whose result is
	// unknown (Err the call's error), until none is left. (A retry of the
	// whole batch, which EnqueueMany's doc calls safe, queues again the runs
	// whose call had succeeded and that were served meanwhile: in a version
	// of this test that did so, a run of the control env ran nine times.)
	enqueueMany := func(ps []runqueue.EnqueueParams, classes []int) {
		for attempt := 1; len(ps) > 0; attempt++ {
			res, err := q.EnqueueMany(ctx, ps)
			var again []runqueue.EnqueueParams
			var againC []int
			for i, r := range res {
				switch {
				case r.Queued:
					book.queuedBy(ps[i])
					book.enqueuedOK(ps[i], classes[i])
				case r.Err == nil:
					book.enqueuedOK(ps[i], classes[i])
				case errors.Is(r.Err, runqueue.ErrInvalid) || errors.Is(r.Err, runqueue.ErrConflict) || errors.Is(r.Err, runqueue.ErrQueueFull):
					book.problem("EnqueueMany %s: %v", s19sName(ps[i].Env, ps[i].Queue, ps[i].ID), r.Err)
				default:
					again, againC = append(again, ps[i]), append(againC, classes[i])
				}
			}
			if err == nil && len(again) > 0 {
				book.problem("EnqueueMany: %d results with errors, the call without", len(again))
				return
			}
			if err != nil {
				errs.note("EnqueueMany", err)
			}
			if attempt == 5000 && len(again) > 0 {
				book.problem("EnqueueMany of %d runs: gave up: %v", len(again), err)
				return
			}
			ps, classes = again, againC
			if len(ps) > 0 {
				time.Sleep(2 * time.Millisecond)
			}
		}
	}

	// The Worker serves the "build" queue of every env.
	var wqs []runqueue.WorkerQueue
	for _, e := range envs {
		wqs = append(wqs, runqueue.WorkerQueue{Env: e, Queue: s19sWorkerQ})
	}
	w, err := runqueue.NewWorker(q, func(_ context.Context, r *runqueue.Run) error {
		book.checkPayload(r)
		if r.Attempt == 1 && s19sHash(r.ID)%7 == 0 {
			return errors.New("s19s: a first attempt that fails")
		}
		book.handle(r)
		return nil
	}, &runqueue.WorkerConfig{
		Queues:           wqs,
		Concurrency:      16,
		SweepInterval:    100 * time.Millisecond,
		IdlePollInterval: 50 * time.Millisecond,
		Logger:           slog.New(logs),
	})
	require.NoError(t, err)
	require.NoError(t, w.Start(context.WithoutCancel(ctx)))
	shutdown := sync.OnceValue(func() error {
		sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		return w.Shutdown(sctx)
	})
	t.Cleanup(func() { _ = shutdown() })

	// Hand consumers serve the "deploy" queue of every env: Dequeue or
	// AckAndDequeue, then an Ack of its own, a Nack (first attempts of some
	// runs), or the ack rides on the next AckAndDequeue.
	settle := func(r *runqueue.Run, err error) bool {
		switch {
		case err == nil:
			book.handle(r)
			return true
		case errors.Is(err, runqueue.ErrLeaseLost), errors.Is(err, runqueue.ErrNotInFlight):
			return true // recovered meanwhile: it runs again
		}
		return false
	}
	ack := func(r *runqueue.Run) {
		for attempt := 1; ; attempt++ {
			err := q.Ack(context.Background(), r)
			if settle(r, err) {
				return
			}
			errs.note("Ack", err)
			if attempt == 5000 {
				book.problem("Ack %s: gave up: %v", s19sName(r.Env, r.Queue, r.ID), err)
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	nack := func(r *runqueue.Run, at time.Time) {
		for attempt := 1; ; attempt++ {
			_, err := q.Nack(context.Background(), r, &runqueue.NackOptions{RetryAt: at})
			if err == nil || errors.Is(err, runqueue.ErrLeaseLost) || errors.Is(err, runqueue.ErrNotInFlight) {
				return
			}
			errs.note("Nack", err)
			if attempt == 5000 {
				book.problem("Nack %s: gave up: %v", s19sName(r.Env, r.Queue, r.ID), err)
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	consumeCtx, cancelConsumers := context.WithCancel(ctx)
	var consumers sync.WaitGroup
	stopConsumers := func() { cancelConsumers(); consumers.Wait() }
	defer stopConsumers() // on a failure below, too
	for ci, e := range envs {
		for k := range s19sConsumers {
			consumers.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(ci), uint64(k)))
				var pending []*runqueue.Run
				for consumeCtx.Err() == nil {
					var runs []*runqueue.Run
					var err error
					op := "Dequeue"
					if len(pending) > 0 || rng.IntN(2) == 0 {
						op = "AckAndDequeue"
						var ackErrs []error
						runs, ackErrs, err = q.AckAndDequeue(consumeCtx, pending, e, s19sHandQ, 1+rng.IntN(4))
						if err == nil {
							for i, r := range pending {
								if !settle(r, ackErrs[i]) {
									book.problem("AckAndDequeue's ack of %s: %v", s19sName(r.Env, r.Queue, r.ID), ackErrs[i])
								}
							}
							pending = nil
						}
					} else {
						runs, err = q.Dequeue(consumeCtx, e, s19sHandQ, 1+rng.IntN(4))
					}
					if err != nil {
						if consumeCtx.Err() == nil {
							errs.note(op, err)
						}
						time.Sleep(2 * time.Millisecond)
						continue
					}
					for _, r := range runs {
						book.checkPayload(r)
						switch h := s19sHash(r.ID); {
						case r.Attempt == 1 && h%5 == 0:
							nack(r, b.clock.Now().Add(time.Duration(300+rng.IntN(1200))*time.Millisecond))
						case h%3 == 0:
							ack(r)
						default:
							pending = append(pending, r)
						}
					}
					if len(runs) == 0 {
						time.Sleep(2 * time.Millisecond)
					}
				}
				for _, r := range pending {
					ack(r)
				}
			})
		}
	}

	// Producers: single Enqueues and EnqueueMany batches over every env
	// and both queues, until the migrator is done.
	var producing atomic.Bool
	producing.Store(true)
	var producers sync.WaitGroup
	stopProducers := func() { producing.Store(false); producers.Wait() }
	defer stopProducers() // on a failure below, too
	for pi := range s19sProducers {
		producers.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(pi), 19))
			queues := []string{s19sWorkerQ, s19sHandQ}
			next := 0
			newRun := func() (runqueue.EnqueueParams, int) {
				next++
				return s19sParams(rng, envs[rng.IntN(len(envs))], queues[rng.IntN(2)], fmt.Sprintf("p%d-%d", pi, next))
			}
			for producing.Load() {
				if rng.IntN(10) < 3 {
					n := 2 + rng.IntN(5)
					ps, classes := make([]runqueue.EnqueueParams, n), make([]int, n)
					for i := range ps {
						ps[i], classes[i] = newRun()
					}
					enqueueMany(ps, classes)
				} else {
					enqueue(newRun())
				}
				time.Sleep(time.Duration(1+rng.IntN(3)) * time.Millisecond)
			}
		})
	}

	// The migrator: moves the slot to another master, 1 to 3 keys a MIGRATE
	// with a short pause after each, finishes, lets the work flow a little,
	// and again.
	var migrations, movedKeys int
	migStart := time.Now()
	func() {
		mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		rng := rand.New(rand.NewPCG(uint64(slot), 7))
		time.Sleep(200 * time.Millisecond) // some work first
		for range s19sMigrations {
			m, err := redistest.StartMigration(mctx, c, slot)
			require.NoError(t, err)
			from := m.From.Options().Addr
			errs.migrating.Store(true)
			for {
				n, err := m.MoveKeys(mctx, 1+rng.IntN(3))
				require.NoError(t, err)
				if n == 0 {
					break
				}
				movedKeys += n
				time.Sleep(time.Duration(1+rng.IntN(4)) * time.Millisecond)
			}
			require.NoError(t, m.Finish(mctx))
			errs.migrating.Store(false)
			migrations++
			t.Logf("move %d: slot %d from %s to %s (%v in)", migrations, slot, from, m.To.Options().Addr, time.Since(migStart).Round(time.Millisecond))
			time.Sleep(time.Duration(100+rng.IntN(100)) * time.Millisecond)
		}
	}()
	migDur := time.Since(migStart)
	stopProducers()

	// After the moves: runs of both queues, now, which the Worker and the
	// hand consumers must serve (a Worker that stopped shows here).
	for i := range 20 {
		e := envs[i%len(envs)]
		for _, qn := range []string{s19sWorkerQ, s19sHandQ} {
			enqueue(runqueue.EnqueueParams{Env: e, Queue: qn, ID: fmt.Sprintf("post-%d", i), Payload: []byte(fmt.Sprintf("payload post-%d", i))}, s19sPlain)
		}
	}
	postLeft := func(queue string) int {
		return book.plainLeft(func(name string) bool {
			return strings.Contains(name, "/"+queue+"/post-")
		})
	}
	deadline := time.Now().Add(10 * time.Second)
	for (postLeft(s19sWorkerQ) > 0 || postLeft(s19sHandQ) > 0) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	require.Zero(t, postLeft(s19sWorkerQ), "the Worker did not handle the runs enqueued after the moves")
	require.Zero(t, postLeft(s19sHandQ), "the hand consumers did not handle the runs enqueued after the moves")
	// Let the soak's delayed and retried runs come due and be served.
	for book.plainLeft(nil) > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	stopConsumers()
	require.NoError(t, shutdown(), "Worker.Shutdown")
	stopClock()
	soak := time.Since(start)

	// Drain: what is left (runs whose ack was lost are recovered once
	// their lease passes), in fake-time steps that stay well short of the
	// plain runs' one-hour TTL, then jump past the expiring runs' delays.
	drainRound := func() int {
		n := 0
		for _, s := range shards {
			_, err := q.RecoverLeases(ctx, s, 1000)
			require.NoError(t, err)
		}
		for _, e := range envs {
			for _, qn := range []string{s19sWorkerQ, s19sHandQ} {
				for {
					runs, err := q.Dequeue(ctx, e, qn, 100)
					require.NoError(t, err)
					if len(runs) == 0 {
						break
					}
					n += len(runs)
					for _, r := range runs {
						book.checkPayload(r)
						require.NoError(t, q.Ack(ctx, r))
						book.handle(r)
					}
				}
			}
		}
		return n
	}
	drained := 0
	for round := 0; round < 40; round++ {
		b.clock.Advance(5 * time.Second)
		n := drainRound()
		drained += n
		if n == 0 && book.plainLeft(nil) == 0 {
			break
		}
	}
	b.clock.Advance(3 * time.Hour)
	for _, s := range shards {
		for {
			n, err := q.ExpireTTL(ctx, s, 1000)
			require.NoError(t, err)
			if n == 0 {
				break
			}
		}
	}
	drained += drainRound()

	// The verdict.
	book.mu.Lock()
	var lost, madeUp, expiredHandled []string
	want := map[int]int{}
	for name, class := range book.enqueued {
		want[class]++
		switch {
		case class == s19sPlain && book.handled[name] == 0:
			lost = append(lost, name)
		case class != s19sPlain && book.handled[name] > 0:
			expiredHandled = append(expiredHandled, name)
		}
	}
	dups, replayed := 0, 0
	for name, n := range book.handled {
		if _, ok := book.enqueued[name]; !ok {
			madeUp = append(madeUp, name)
		}
		if n > 1 {
			dups++
		}
		if n > book.queued[name] {
			// Served more often than any call said it queued the run: a
			// call queued it and reported "there already" (see below).
			replayed++
		}
	}
	problems := slices.Clone(book.problems)
	handled := len(book.handled)
	book.mu.Unlock()
	sort.Strings(lost)
	sort.Strings(madeUp)
	sort.Strings(expiredHandled)

	for _, e := range envs {
		for _, qn := range []string{s19sWorkerQ, s19sHandQ} {
			require.NoError(t, q.ClearWeight(ctx, e, qn, "k0"))
		}
	}
	left := map[string]string{}
	var schedKeys []string
	for _, k := range b.keysUnder(t) {
		if on && expiresOnItsOwn(k) {
			schedKeys = append(schedKeys, k)
			continue
		}
		left[k] = s19sDescribe(t, b, k)
	}

	t.Logf("%v: %d moves of slot %d (%d keys moved one to three at a time) in %v; cluster up in %v, soak and settle %v, whole test %v",
		fmt.Sprintf("vtime=%v", on), migrations, slot, movedKeys, migDur.Round(time.Millisecond),
		up.Round(time.Millisecond), (soak - up).Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	t.Logf("runs enqueued: %d plain, %d expiring at the drain, %d expiring in the soak; %d handled (%d more than once), %d left to the drain",
		want[s19sPlain], want[s19sExpireLater], want[s19sExpireSoon], handled, dups, drained)
	// Observer.Enqueued and the runs served balance: go-redis's cluster
	// pipeline, when the first call a node gets fails with TRYAGAIN, sends
	// that node's whole batch again, calls that ran included (an enqueue
	// that ran then reported Queued false, or queued again a run served
	// meanwhile); runqueue starts each node's batch with a TYPE of the
	// fence so that it never does (runPipelined).
	t.Logf("observer: enqueued %d, acked %d, expired %d, recovered %d, nacked %d, dead %d; %d runs served more often than a call said it queued them",
		obs.enqueued.Load(), obs.acked.Load(), obs.expired.Load(), obs.recovered.Load(), obs.nacked.Load(), obs.dead.Load(), replayed)
	t.Logf("errors the callers saw and retried: %s", errs.report())
	t.Logf("worker warnings and errors:\n%s", logs.report())

	assert.Empty(t, problems, "calls that failed in a way no retry mends, or wrong payloads")
	assert.Equal(t, s19sMigrations, migrations)
	assert.Empty(t, lost, "%d runs whose enqueue succeeded were never handled (of %d)", len(lost), want[s19sPlain])
	assert.Empty(t, madeUp, "runs handled that were never enqueued")
	assert.Empty(t, expiredHandled, "runs that were to expire (delay past their TTL) were handled")
	assert.Empty(t, left, "keys left under the prefix after the drain: records without their index entries, index entries without a run, counters not back to zero")
	for _, k := range schedKeys {
		pttl, err := c.PTTL(ctx, k).Result()
		require.NoError(t, err)
		assert.Greater(t, pttl, time.Duration(0), "the scheduler's state %s has no TTL", k)
	}
	// A run whose lease passed while its ack waited out a move (TRYAGAIN)
	// is recovered and handled again: the documented redelivery, one per
	// recovery. Any more is a pipeline that sent calls that ran again.
	assert.LessOrEqual(t, int64(replayed), obs.recovered.Load(),
		"runs served more often than a call said it queued them, beyond the lease recoveries: a pipeline sent calls that ran again")
	assert.Equal(t, obs.acked.Load()+obs.expired.Load(), obs.enqueued.Load(), "every run the Observer saw queued was acked or expired, once")
	assert.Zero(t, obs.dead.Load(), "no run may be dead-lettered (MaxAttempts is unlimited)")
	assert.Equal(t, int64(want[s19sExpireLater]+want[s19sExpireSoon]), obs.expired.Load(), "every run meant to expire expired, once")
	errs.mu.Lock()
	assert.Empty(t, errs.strange, "errors a caller cannot tell for a slot on the move (TRYAGAIN, ASK, MOVED, CLUSTERDOWN)")
	errs.mu.Unlock()
}

// s19sDescribe renders a key left after the drain: its type and what it
// holds (at most a few members).
func s19sDescribe(t *testing.T, b *testBundle, k string) string {
	t.Helper()
	typ, err := b.client.Type(b.ctx, k).Result()
	require.NoError(t, err)
	var v any
	switch typ {
	case "string":
		v, err = b.client.Get(b.ctx, k).Result()
	case "hash":
		v, err = b.client.HKeys(b.ctx, k).Result()
	case "zset":
		v, err = b.client.ZRangeWithScores(b.ctx, k, 0, 4).Result()
	default:
		v = "?"
	}
	require.NoError(t, err)
	s := fmt.Sprintf("%s %v", typ, v)
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}
