package runqueue_test

// Review s26 (lifecycle): conservation of runs and consistency of counters
// across the whole lifecycle on a real redis-server, with a flag-off and a
// flag-on Queue sharing one Redis and one fake clock, the instance picked
// at random per operation.
//
// TestS26LifeRandom is a seeded random driver (enqueue, bulk enqueue with
// id reuse and in-batch duplicates, dequeue, DequeueShard, ack-and-dequeue, ack, ack of
// stale deliveries, nack with/without backoff or dead letter, extend,
// lease recovery, TTL expiry, redrive, delete/purge of dead letters,
// weights, limits changed on the fly, clock steps). After every step it
// checks the model against QueueStats, KeyStats, EnvStats, ActiveQueues
// and against what Redis stores (runs hash, held, leases, ttl set, each
// variant's ckIndex/delayIndex entry, master score, env counters);
// at the end it drains with both instances in turn, purges the dead and
// checks that no queue key is left behind (only the scheduler's two keys,
// with a TTL, and weights).
//
// TestS26LifeTargeted* are the targeted states of the brief.
//
// TestS26LifeMasterAfterPartialRead reproduces the defect the review
// found: a flag-off Dequeue that read part of ckIndex left the queue's
// shard-master score below its earliest work (the window's bound was the
// last entry kept, which the call could serve), so ActiveQueues and
// DequeueShard ranked the queue older than it was. The random driver
// checks the master score is exactly the earliest work after every step.
//
// Knobs of TestS26LifeRandom: S26_SEEDS (number), S26_BASE (first seed),
// S26_STEPS (steps per history), S26_KEYS (keys per queue; 4 by default).

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

type s26Run struct {
	env, queue, key, id string
	payload             string
	prio                int
	state               string // queued, held, dead (gone runs are deleted from the model)
	at                  int64
	ttl                 int64 // TTL deadline while queued and never delivered
	attempt             int
	run                 *runqueue.Run
}

type s26QRef struct{ env, queue string }

type s26World struct {
	t      *testing.T
	ctx    context.Context
	c      redis.UniversalClient
	clock  *fakeClock
	space  keys.Space
	prefix string
	on     *runqueue.Queue
	off    *runqueue.Queue
	rng    *rand.Rand
	mu     sync.Mutex
	limits map[s26QRef]runqueue.Limits
	runs   map[string]*s26Run // env/queue/id -> run
	stale  []*runqueue.Run    // deliveries that no longer hold their run
	queues []s26QRef
	keys   []string
	maxQ   int
	maxK   int
	trace  []string
	steps  int
	used   map[string]bool // every key ever enqueued
	// drainMode: 0 both instances in turn, 1 flag on only, 2 flag off only
	drainMode int
	// noEnvCheck: received leaves the env limit to its caller
	noEnvCheck bool
}

func s26Names(runs []*runqueue.Run) []string {
	var out []string
	for _, r := range runs {
		out = append(out, r.Queue+"/"+r.ID)
	}
	return out
}

const s26MaxAttempts = 3

func s26ID(env, queue, id string) string { return env + "/" + queue + "/" + id }

func newS26World(t *testing.T, c redis.UniversalClient, seed int64, maxQ, maxK int) *s26World {
	w := &s26World{t: t, ctx: context.Background(), c: c, clock: newFakeClock(), prefix: redistest.Prefix(t),
		rng: rand.New(rand.NewSource(seed)), limits: map[s26QRef]runqueue.Limits{}, runs: map[string]*s26Run{},
		queues: []s26QRef{{"e1", "qa"}, {"e1", "qb"}, {"e2", "qa"}}, keys: []string{"", "k1", "k2", "k3"},
		maxQ: maxQ, maxK: maxK, used: map[string]bool{}}
	var err error
	w.space, err = keys.NewSpace(w.prefix, 16)
	require.NoError(t, err)
	for i, on := range []bool{true, false} {
		cfg := &runqueue.Config{Prefix: w.prefix, Clock: w.clock, VtimeScheduling: on, LeaseDuration: time.Minute,
			MaxAttempts: s26MaxAttempts, BackoffBase: time.Second, BackoffMax: 20 * time.Second,
			MaxQueueDepth: maxQ, MaxKeyDepth: maxK, ScanLimit: 30, PromoteLimit: 3,
			LimitsFor: func(env, queue string) runqueue.Limits {
				w.mu.Lock()
				defer w.mu.Unlock()
				return w.limits[s26QRef{env, queue}]
			}}
		q, err := runqueue.New(w.ctx, c, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = q.Close() })
		if i == 0 {
			w.on = q
		} else {
			w.off = q
		}
	}
	return w
}

func (w *s26World) logf(format string, a ...any) {
	w.trace = append(w.trace, fmt.Sprintf("%d: ", w.steps)+fmt.Sprintf(format, a...))
	if len(w.trace) > 40 {
		w.trace = w.trace[1:]
	}
}

func (w *s26World) fail(format string, a ...any) {
	w.t.Helper()
	w.t.Fatalf("%s\nlast steps:\n%s", fmt.Sprintf(format, a...), strings.Join(w.trace, "\n"))
}

func (w *s26World) check(cond bool, format string, a ...any) {
	w.t.Helper()
	if !cond {
		w.fail(format, a...)
	}
}

func (w *s26World) noErr(err error, format string, a ...any) {
	w.t.Helper()
	if err != nil {
		w.fail("%s: %v", fmt.Sprintf(format, a...), err)
	}
}

func (w *s26World) now() int64 { return w.clock.Now().UnixMilli() }

func (w *s26World) inst() (*runqueue.Queue, string) {
	if w.rng.Intn(2) == 0 {
		return w.on, "on"
	}
	return w.off, "off"
}

func (w *s26World) pick(state string) *s26Run {
	var ids []string
	for id, r := range w.runs {
		if r.state == state {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	sort.Strings(ids)
	return w.runs[ids[w.rng.Intn(len(ids))]]
}

func (w *s26World) count(ref s26QRef, key *string, state string) int {
	n := 0
	for _, r := range w.runs {
		if r.env == ref.env && r.queue == ref.queue && r.state == state && (key == nil || r.key == *key) {
			n++
		}
	}
	return n
}

func (w *s26World) envCount(env, state string) int {
	n := 0
	for _, r := range w.runs {
		if r.env == env && r.state == state {
			n++
		}
	}
	return n
}

// enqueueOne applies the model of one enqueue of p (as the script sees it,
// runs in order) and returns what the call should answer: "1", "0",
// "conflict", "full".
func (w *s26World) expectEnqueue(p runqueue.EnqueueParams, now int64) string {
	k := s26ID(p.Env, p.Queue, p.ID)
	w.used[p.Key] = true
	if r, ok := w.runs[k]; ok {
		if r.key == p.Key && r.payload == string(p.Payload) {
			return "0"
		}
		return "conflict"
	}
	ref := s26QRef{p.Env, p.Queue}
	if w.maxQ > 0 && w.count(ref, nil, "queued") >= w.maxQ {
		return "full"
	}
	if w.maxK > 0 && w.count(ref, &p.Key, "queued") >= w.maxK {
		return "full"
	}
	at := now
	if !p.AvailableAt.IsZero() {
		at = p.AvailableAt.UnixMilli()
	}
	if p.Delay > 0 {
		at = now + p.Delay.Milliseconds()
	}
	r := &s26Run{env: p.Env, queue: p.Queue, key: p.Key, id: p.ID, payload: string(p.Payload), prio: p.Priority,
		state: "queued", at: at, attempt: 1}
	if p.TTL > 0 {
		r.ttl = now + p.TTL.Milliseconds()
	}
	w.runs[k] = r
	return "1"
}

func (w *s26World) params(ref s26QRef) runqueue.EnqueueParams {
	key := w.keys[w.rng.Intn(len(w.keys))]
	id := "r" + strconv.Itoa(w.rng.Intn(60+4*len(w.keys)))
	payload := id
	if w.rng.Intn(8) == 0 {
		payload = id + "x" // another body
	}
	if w.rng.Intn(8) == 0 {
		key = w.keys[w.rng.Intn(len(w.keys))] // maybe another key for an existing id
	} else if r, ok := w.runs[s26ID(ref.env, ref.queue, id)]; ok && w.rng.Intn(3) > 0 {
		key, payload = r.key, r.payload
	}
	p := runqueue.EnqueueParams{Env: ref.env, Queue: ref.queue, Key: key, ID: id, Payload: []byte(payload),
		Priority: []int{0, 0, 0, 1, 9}[w.rng.Intn(5)]}
	switch w.rng.Intn(6) {
	case 0:
		p.Delay = time.Duration(1+w.rng.Intn(40)) * time.Second
	case 1:
		p.AvailableAt = w.clock.Now().Add(time.Duration(w.rng.Intn(20)-10) * time.Second)
	}
	if w.rng.Intn(4) == 0 {
		p.TTL = time.Duration(1+w.rng.Intn(30)) * time.Second
	}
	return p
}

func (w *s26World) answer(ok bool, err error) string {
	switch {
	case err == nil && ok:
		return "1"
	case err == nil:
		return "0"
	case errors.Is(err, runqueue.ErrConflict):
		return "conflict"
	case errors.Is(err, runqueue.ErrQueueFull):
		return "full"
	}
	return "error: " + err.Error()
}

// received records runs served by one dequeue of ref and checks them.
// expiredByDequeue takes out of the model the queued runs a dequeue took
// past their TTL, which it deleted instead of serving: a run whose record
// is gone must have passed its TTL (verify checks the rest of the store).
func (w *s26World) expiredByDequeue(who string) {
	now := w.now()
	// The records of every queued run past its TTL, in one pipeline (one
	// read a run, each its own round trip, was most of a big world's time).
	type recordRead struct {
		k      string
		exists *redis.BoolCmd
	}
	var reads []recordRead
	_, err := w.c.Pipelined(w.ctx, func(p redis.Pipeliner) error {
		for k, r := range w.runs {
			if r.state != "queued" || r.ttl == 0 || r.ttl > now {
				continue
			}
			reads = append(reads, recordRead{k, p.HExists(w.ctx, w.space.Env(r.env).Queue(r.queue).Runs(), keys.Segment(r.id))})
		}
		return nil
	})
	w.noErr(err, "%s records of runs past their TTL", who)
	for _, rd := range reads {
		ok, err := rd.exists.Result()
		w.noErr(err, "%s record of %s", who, rd.k)
		if !ok {
			w.logf("%s expired %s at a dequeue", who, rd.k)
			delete(w.runs, rd.k)
		}
	}
}

func (w *s26World) received(who string, ref s26QRef, got []*runqueue.Run) {
	w.t.Helper()
	now := w.now()
	before := map[string]int{}
	for _, r := range w.runs {
		if r.state == "held" && r.env == ref.env && r.queue == ref.queue {
			before[r.key]++
		}
	}
	qBefore := w.count(ref, nil, "held")
	eBefore := w.envCount(ref.env, "held")
	seen := map[string]bool{}
	for _, run := range got {
		k := s26ID(run.Env, run.Queue, run.ID)
		w.check(run.Env == ref.env && run.Queue == ref.queue, "%s served %s of another queue", who, k)
		w.check(!seen[k], "%s served %s twice in one call", who, k)
		seen[k] = true
		r, ok := w.runs[k]
		w.check(ok, "%s served unknown run %s", who, k)
		w.check(r.state == "queued", "%s served %s in state %s", who, k, r.state)
		w.check(r.at <= now, "%s served %s at %d before its time %d", who, k, now, r.at)
		w.check(r.key == run.Key, "%s served %s with key %q, want %q", who, k, run.Key, r.key)
		w.check(r.attempt == run.Attempt, "%s served %s attempt %d, want %d", who, k, run.Attempt, r.attempt)
		w.check(string(run.Payload) == r.payload, "%s served %s payload %q want %q", who, k, run.Payload, r.payload)
		w.check(r.ttl == 0 || r.ttl > now, "%s served %s past its TTL (deadline %d, now %d)", who, k, r.ttl, now)
		r.state, r.run, r.ttl = "held", run, 0
	}
	w.expiredByDequeue(who)
	w.mu.Lock()
	lim := w.limits[ref]
	w.mu.Unlock()
	after := map[string]int{}
	for _, run := range got {
		after[run.Key]++
	}
	for key, n := range after {
		if lim.Key > 0 {
			w.check(before[key]+n <= lim.Key || n == 0, "%s took key %q to %d in flight (limit %d, had %d)", who, key, before[key]+n, lim.Key, before[key])
		}
	}
	if lim.Queue > 0 && len(got) > 0 {
		w.check(qBefore+len(got) <= lim.Queue, "%s took queue to %d in flight (limit %d)", who, qBefore+len(got), lim.Queue)
	}
	if lim.Env > 0 && len(got) > 0 && !w.noEnvCheck {
		w.check(eBefore+len(got) <= lim.Env, "%s took env to %d in flight (limit %d)", who, eBefore+len(got), lim.Env)
	}
}

func (w *s26World) settleAck(who string, run *runqueue.Run, err error) {
	w.t.Helper()
	k := s26ID(run.Env, run.Queue, run.ID)
	r := w.runs[k]
	if r != nil && r.state == "held" && r.run == run {
		w.noErr(err, "%s ack of holder %s", who, k)
		delete(w.runs, k)
		return
	}
	// A stale delivery.
	switch {
	case r == nil:
		w.check(err == nil, "%s stale ack of gone %s: %v, want nil", who, k, err)
	case r.key != run.Key:
		w.check(errors.Is(err, runqueue.ErrNotFound), "%s stale ack of %s under another key: %v", who, k, err)
	case r.state == "held":
		w.check(errors.Is(err, runqueue.ErrLeaseLost), "%s stale ack of %s held by another delivery: %v", who, k, err)
	default:
		w.check(errors.Is(err, runqueue.ErrNotInFlight), "%s stale ack of %s (%s): %v", who, k, r.state, err)
	}
}

func (w *s26World) drop(run *runqueue.Run) {
	w.stale = append(w.stale, run)
	if len(w.stale) > 20 {
		w.stale = w.stale[1:]
	}
}

func (w *s26World) heldOf(ref s26QRef) []*s26Run {
	var out []*s26Run
	for _, r := range w.runs {
		if r.state == "held" && r.env == ref.env && r.queue == ref.queue {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

// recoverAll lets every lease pass and recovers them through q.
func (w *s26World) recoverAll(q *runqueue.Queue, who string) {
	w.t.Helper()
	w.clock.Advance(time.Minute + time.Second)
	now := w.now()
	want := 0
	shards := map[int]bool{}
	for _, r := range w.runs {
		if r.state == "held" {
			want++
		}
	}
	for _, ref := range w.queues {
		shards[q.ShardOf(ref.env)] = true
	}
	got := 0
	for sh := range shards {
		n, err := q.RecoverLeases(w.ctx, sh, 100000)
		w.noErr(err, "%s recover", who)
		got += n
	}
	w.check(got == want, "%s recovered %d, want %d", who, got, want)
	for _, r := range w.runs {
		if r.state != "held" {
			continue
		}
		w.drop(r.run)
		r.run = nil
		r.attempt++
		if r.attempt > s26MaxAttempts {
			r.state = "dead"
		} else {
			r.state, r.at = "queued", now
		}
	}
}

func (w *s26World) step() {
	w.t.Helper()
	w.steps++
	q, who := w.inst()
	ref := w.queues[w.rng.Intn(len(w.queues))]
	now := w.now()
	switch op := w.rng.Intn(100); {
	case op < 18:
		p := w.params(ref)
		want := w.expectEnqueue(p, now)
		ok, err := q.Enqueue(w.ctx, p)
		w.logf("%s enqueue %s/%s key=%q id=%s pl=%q d=%v at=%v ttl=%v pr=%d -> %s", who, p.Env, p.Queue, p.Key, p.ID, p.Payload, p.Delay, p.AvailableAt.UnixMilli(), p.TTL, p.Priority, w.answer(ok, err))
		w.check(w.answer(ok, err) == want, "%s enqueue %+v: got %s want %s", who, p, w.answer(ok, err), want)
	case op < 24:
		n := 1 + w.rng.Intn(8)
		if w.rng.Intn(3) == 0 {
			n = 32 + w.rng.Intn(20)
		}
		var ps []runqueue.EnqueueParams
		for i := 0; i < n; i++ {
			r2 := ref
			if w.rng.Intn(4) == 0 {
				r2 = w.queues[w.rng.Intn(len(w.queues))]
			}
			ps = append(ps, w.params(r2))
		}
		var wants []string
		for _, p := range ps {
			wants = append(wants, w.expectEnqueue(p, now))
		}
		res, err := q.EnqueueMany(w.ctx, ps)
		w.noErr(err, "%s enqueueMany", who)
		var got []string
		for i := range res {
			got = append(got, w.answer(res[i].Queued, res[i].Err))
		}
		w.logf("%s enqueueMany %d -> %v", who, n, got)
		for i := range res {
			w.check(got[i] == wants[i], "%s enqueueMany run %d %+v: got %s want %s", who, i, ps[i], got[i], wants[i])
		}
	case op < 40 && w.rng.Intn(4) == 0:
		// A shard consumer: runs of any queue of the shard.
		m := 1 + w.rng.Intn(6)
		got, err := q.DequeueShard(w.ctx, q.ShardOf(ref.env), m)
		w.noErr(err, "%s dequeue shard", who)
		w.logf("%s dequeueShard %d %d -> %d", who, q.ShardOf(ref.env), m, len(got))
		w.check(len(got) <= m, "DequeueShard(%d) served %d", m, len(got))
		// Runs come in the order of the calls that served them: each run
		// of queue Q was served while its env held fewer than Q's env
		// limit.
		envHeld := map[string]int{}
		for _, r := range w.runs {
			if r.state == "held" {
				envHeld[r.env]++
			}
		}
		by := map[s26QRef][]*runqueue.Run{}
		var order []s26QRef
		for _, r := range got {
			k := s26QRef{r.Env, r.Queue}
			w.mu.Lock()
			lim := w.limits[k].Env
			w.mu.Unlock()
			w.check(lim == 0 || envHeld[r.Env] < lim, "%s shard served %s/%s/%s with env %s at %d in flight (its queue's env limit %d); served %v",
				who, r.Env, r.Queue, r.ID, r.Env, envHeld[r.Env], lim, s26Names(got))
			envHeld[r.Env]++
			if by[k] == nil {
				order = append(order, k)
			}
			by[k] = append(by[k], r)
		}
		w.noEnvCheck = true
		for _, r2 := range order {
			w.received(who+" shard", r2, by[r2])
		}
		w.noEnvCheck = false
		w.expiredByDequeue(who + " shard")
		w.clock.Advance(time.Millisecond)
	case op < 40:
		m := 1 + w.rng.Intn(6)
		got, err := q.Dequeue(w.ctx, ref.env, ref.queue, m)
		w.noErr(err, "%s dequeue", who)
		w.logf("%s dequeue %v %d -> %d", who, ref, m, len(got))
		w.received(who, ref, got)
		w.clock.Advance(time.Millisecond)
	case op < 48:
		held := w.heldOf(ref)
		var acks []*runqueue.Run
		for _, r := range held {
			if w.rng.Intn(2) == 0 {
				acks = append(acks, r.run)
			}
		}
		for _, s := range w.stale {
			if s.Env == ref.env && s.Queue == ref.queue && w.rng.Intn(3) == 0 {
				acks = append(acks, s)
			}
		}
		m := w.rng.Intn(5)
		got, errs, err := q.AckAndDequeue(w.ctx, acks, ref.env, ref.queue, m)
		w.noErr(err, "%s ackAndDequeue", who)
		w.logf("%s ackAndDequeue %v acks=%d m=%d -> %d", who, ref, len(acks), m, len(got))
		// The acks are made first, in order.
		done := map[*runqueue.Run]bool{}
		for i, a := range acks {
			if done[a] {
				continue
			}
			done[a] = true
			w.settleAck(who, a, errs[i])
			if errs[i] == nil {
				w.drop(a)
			}
		}
		w.received(who, ref, got)
		w.clock.Advance(time.Millisecond)
	case op < 56:
		if r := w.pick("held"); r != nil {
			run := r.run
			err := q.Ack(w.ctx, run)
			w.logf("%s ack %s/%s/%s -> %v", who, r.env, r.queue, r.id, err)
			w.settleAck(who, run, err)
			w.drop(run)
		}
	case op < 59:
		if len(w.stale) > 0 {
			run := w.stale[w.rng.Intn(len(w.stale))]
			if w.rng.Intn(2) == 0 {
				err := q.Ack(w.ctx, run)
				w.logf("%s stale ack %s/%s -> %v", who, run.Queue, run.ID, err)
				w.settleAck(who, run, err)
			} else {
				_, err := q.Nack(w.ctx, run, &runqueue.NackOptions{RetryAt: w.clock.Now()})
				w.logf("%s stale nack %s/%s -> %v", who, run.Queue, run.ID, err)
				// A stale nack fails, or (a retried nack of the delivery
				// that settled the current stay) answers what the first
				// answered and changes nothing: verify checks that.
				_ = err
			}
		}
	case op < 68:
		if r := w.pick("held"); r != nil {
			run := r.run
			opts := &runqueue.NackOptions{}
			switch w.rng.Intn(4) {
			case 0:
				opts = nil
			case 1:
				opts.RetryAt = w.clock.Now().Add(time.Duration(w.rng.Intn(30)) * time.Second)
			case 2:
				opts.RetryAt = w.clock.Now().Add(-time.Second)
			case 3:
				opts.DeadLetter = w.rng.Intn(2) == 0
			}
			res, err := q.Nack(w.ctx, run, opts)
			w.logf("%s nack %s/%s/%s opts=%+v -> %+v %v", who, r.env, r.queue, r.id, opts, res, err)
			w.noErr(err, "%s nack", who)
			r.attempt++
			w.check(res.Attempt == r.attempt, "%s nack attempt %d want %d", who, res.Attempt, r.attempt)
			dl := opts != nil && opts.DeadLetter
			if dl || r.attempt > s26MaxAttempts {
				w.check(!res.Requeued, "%s nack requeued a run that should die", who)
				r.state = "dead"
			} else {
				w.check(res.Requeued, "%s nack dead-lettered a run with attempts left", who)
				r.state, r.at = "queued", res.RetryAt.UnixMilli()
				if opts != nil && !opts.RetryAt.IsZero() {
					w.check(res.RetryAt.UnixMilli() == opts.RetryAt.UnixMilli(), "retryAt %v want %v", res.RetryAt, opts.RetryAt)
				}
			}
			r.run = nil
			w.drop(run)
		}
	case op < 71:
		if r := w.pick("held"); r != nil {
			err := q.ExtendLease(w.ctx, r.run, time.Duration(1+w.rng.Intn(50))*time.Second)
			w.logf("%s extend %s -> %v", who, r.id, err)
			w.noErr(err, "%s extend", who)
		}
	case op < 74:
		w.recoverAll(q, who)
		w.logf("%s recoverAll", who)
	case op < 78:
		expected := map[string]bool{}
		for k, r := range w.runs {
			if r.state == "queued" && r.ttl > 0 && r.ttl <= now {
				expected[k] = true
			}
		}
		got := 0
		shards := map[int]bool{}
		for _, ref := range w.queues {
			shards[q.ShardOf(ref.env)] = true
		}
		for sh := range shards {
			n, err := q.ExpireTTL(w.ctx, sh, 100000)
			w.noErr(err, "%s expire", who)
			got += n
		}
		w.logf("%s expireTTL -> %d (want %d)", who, got, len(expected))
		w.check(got == len(expected), "%s expired %d, want %d", who, got, len(expected))
		for k := range expected {
			delete(w.runs, k)
		}
	case op < 83:
		if r := w.pick("dead"); r != nil {
			err := q.Redrive(w.ctx, r.env, r.queue, r.key, r.id)
			w.logf("%s redrive %s/%s/%s -> %v", who, r.env, r.queue, r.id, err)
			w.noErr(err, "%s redrive", who)
			r.state, r.at, r.attempt = "queued", now, 1
		}
	case op < 85:
		if r := w.pick("dead"); r != nil {
			err := q.DeleteDeadLetter(w.ctx, r.env, r.queue, r.key, r.id)
			w.logf("%s deleteDead %s -> %v", who, r.id, err)
			w.noErr(err, "%s delete dead", who)
			delete(w.runs, s26ID(r.env, r.queue, r.id))
		} else if r := w.pick("queued"); r != nil {
			err := q.DeleteDeadLetter(w.ctx, r.env, r.queue, r.key, r.id)
			w.check(errors.Is(err, runqueue.ErrNotFound), "%s deleteDead of queued run: %v", who, err)
		}
	case op < 87:
		// Purge the dead of ref that died at or before now - x.
		limit := 1 + w.rng.Intn(4)
		n, err := q.PurgeDeadLetters(w.ctx, ref.env, ref.queue, w.clock.Now(), limit)
		w.noErr(err, "%s purge", who)
		w.logf("%s purge %v limit=%d -> %d", who, ref, limit, n)
		dead := w.count(ref, nil, "dead")
		w.check(n == min(dead, limit), "%s purged %d, want %d", who, n, min(dead, limit))
		// Which ones: read the dead set afterwards.
		if n > 0 {
			left := map[string]bool{}
			ds, err := q.DeadLetters(w.ctx, ref.env, ref.queue, 0, 10000)
			w.noErr(err, "dead letters")
			for _, d := range ds {
				left[d.ID] = true
			}
			for k, r := range w.runs {
				if r.env == ref.env && r.queue == ref.queue && r.state == "dead" && !left[r.id] {
					delete(w.runs, k)
				}
			}
		}
	case op < 90:
		key := w.keys[w.rng.Intn(len(w.keys))]
		if w.rng.Intn(3) == 0 {
			w.noErr(q.ClearWeight(w.ctx, ref.env, ref.queue, key), "clear weight")
		} else {
			w.noErr(q.SetWeight(w.ctx, ref.env, ref.queue, key, []float64{0.01, 0.5, 2, 50}[w.rng.Intn(4)]), "weight")
		}
		w.logf("%s weight %v %q", who, ref, key)
	case op < 93:
		lim := runqueue.Limits{Key: []int{0, 1, 1, 2}[w.rng.Intn(4)], Queue: []int{0, 0, 3}[w.rng.Intn(3)], Env: []int{0, 0, 5}[w.rng.Intn(3)]}
		w.mu.Lock()
		w.limits[ref] = lim
		w.mu.Unlock()
		w.logf("limits %v = %+v", ref, lim)
	default:
		d := time.Duration(1+w.rng.Intn(15)) * time.Second
		w.clock.Advance(d)
		w.logf("advance %v", d)
	}
	w.verify()
}

// verify checks the API's counts and the stored keys against the model.
func (w *s26World) verify() {
	w.t.Helper()
	now := w.now()
	q := w.on
	if w.rng.Intn(2) == 0 {
		q = w.off
	}
	envs := map[string]bool{}
	shardLeases := map[int]int{}
	shardTTL := map[int]int{}
	// The model's counts by queue, key and state, in one pass (count a
	// queue and key at a time walked every run for each).
	type tallyAt struct {
		ref        s26QRef
		key, state string
		queue      bool // the queue's count (every key; "" is a key too)
	}
	tally := map[tallyAt]int{}
	for _, r := range w.runs {
		ref := s26QRef{r.env, r.queue}
		tally[tallyAt{ref, "", r.state, true}]++
		tally[tallyAt{ref, r.key, r.state, false}]++
	}
	for _, r := range w.runs {
		sh := q.ShardOf(r.env)
		if r.state == "held" {
			shardLeases[sh]++
		}
		if r.state == "queued" && r.ttl > 0 {
			shardTTL[sh]++
		}
	}
	for _, ref := range w.queues {
		envs[ref.env] = true
		qk := w.space.Env(ref.env).Queue(ref.queue)
		st, err := q.QueueStats(w.ctx, ref.env, ref.queue)
		w.noErr(err, "stats")
		queued, held, dead := tally[tallyAt{ref, "", "queued", true}], tally[tallyAt{ref, "", "held", true}], tally[tallyAt{ref, "", "dead", true}]
		w.check(st.Ready+st.Delayed == int64(queued) && st.InFlight == int64(held) && st.Dead == int64(dead),
			"QueueStats %v = %+v, model queued %d held %d dead %d", ref, st, queued, held, dead)
		notDue := 0
		var sumR, sumD int64
		allKeys := map[string]bool{}
		for _, key := range w.keys {
			allKeys[key] = true
		}
		for key := range w.used {
			allKeys[key] = true
		}
		for key := range allKeys {
			ks, err := q.KeyStats(w.ctx, ref.env, ref.queue, key)
			w.noErr(err, "key stats")
			kq, kh := tally[tallyAt{ref, key, "queued", false}], tally[tallyAt{ref, key, "held", false}]
			w.check(ks.Ready+ks.Delayed == int64(kq) && ks.InFlight == int64(kh),
				"KeyStats %v %q = %+v, model queued %d held %d", ref, key, ks, kq, kh)
			sumR += ks.Ready
			sumD += ks.Delayed
		}
		w.check(sumR == st.Ready && sumD == st.Delayed, "QueueStats %v ready/delayed %d/%d, keys sum to %d/%d", ref, st.Ready, st.Delayed, sumR, sumD)
		for _, r := range w.runs {
			if r.env == ref.env && r.queue == ref.queue && r.state == "queued" && r.at > now {
				notDue++
			}
		}
		w.check(st.Delayed >= int64(notDue), "QueueStats %v delayed %d < runs not due %d", ref, st.Delayed, notDue)
		// Stored: each variant's index entries are its sets' heads, and the
		// master's score the queue's earliest work.
		best := -1.0
		// (read in one pipeline: a round trip for all the keys' heads)
		type headRead struct {
			key, set, idx string
			head          *redis.ZSliceCmd
			entry         *redis.FloatCmd
		}
		var reads []headRead
		_, err = w.c.Pipelined(w.ctx, func(p redis.Pipeliner) error {
			for key := range allKeys {
				v := qk.Variant(key)
				for _, pair := range [][2]string{{v.Ready(), qk.CkIndex()}, {v.Delayed(), qk.DelayIndex()}} {
					reads = append(reads, headRead{key, pair[0], pair[1],
						p.ZRangeWithScores(w.ctx, pair[0], 0, 0), p.ZScore(w.ctx, pair[1], v.Member())})
				}
			}
			return nil
		})
		if !errors.Is(err, redis.Nil) {
			w.noErr(err, "heads")
		}
		for _, r := range reads {
			head, err := r.head.Result()
			w.noErr(err, "head")
			sc, err := r.entry.Result()
			if len(head) == 0 {
				w.check(err == redis.Nil, "%v key %q: %s empty but %s holds it (%v)", ref, r.key, r.set, r.idx, sc)
				continue
			}
			w.check(err == nil && sc == head[0].Score, "%v key %q: %s head %v, %s entry %v (%v)", ref, r.key, r.set, head[0].Score, r.idx, sc, err)
			if best < 0 || head[0].Score < best {
				best = head[0].Score
			}
		}
		for _, idx := range []string{qk.CkIndex(), qk.DelayIndex()} {
			members, err := w.c.ZRange(w.ctx, idx, 0, -1).Result()
			w.noErr(err, "index")
			for _, m := range members {
				key, err := keys.DecodeVariantMember(m)
				w.check(err == nil && allKeys[key], "%v: %s holds unknown variant %q", ref, idx, m)
			}
		}
		if best >= 0 {
			ms, err := w.c.ZScore(w.ctx, w.space.Shard(q.ShardOf(ref.env)).Master(), qk.Member()).Result()
			// Exactly the earliest work: above it DequeueShard would skip
			// the queue; below it, it ranks the queue older than it is
			// (TestS26LifeMasterAfterPartialRead).
			w.check(err == nil && ms == best, "%v master score %v (%v), earliest work %v", ref, ms, err, best)
		}
		// Stored: runs hash, master entry.
		hl, err := w.c.HLen(w.ctx, qk.Runs()).Result()
		w.noErr(err, "hlen")
		w.check(hl == int64(queued+held+dead), "%v runs hash holds %d, model %d", ref, hl, queued+held+dead)
		_, err = w.c.ZScore(w.ctx, w.space.Shard(q.ShardOf(ref.env)).Master(), qk.Member()).Result()
		inMaster := err == nil
		w.check(inMaster == (queued > 0), "%v in master %v with %d queued", ref, inMaster, queued)
		if queued == 0 {
			n, err := w.c.Exists(w.ctx, qk.Depth(), qk.CkIndex(), qk.DelayIndex()).Result()
			w.noErr(err, "exists")
			w.check(n == 0, "%v: no queued run but %d of depth/ckIndex/delayIndex exist", ref, n)
		}
		if held == 0 {
			n, err := w.c.Exists(w.ctx, qk.Held(), qk.KeyInflight()).Result()
			w.noErr(err, "exists")
			w.check(n == 0, "%v: nothing in flight but held/kin exist (%d)", ref, n)
		}
	}
	active := 0
	for _, ref := range w.queues {
		if w.count(ref, nil, "queued") > 0 {
			active++
		}
	}
	aq, total, err := q.ActiveQueues(w.ctx, 100)
	w.noErr(err, "active queues")
	w.check(total == int64(active) && len(aq) == active, "ActiveQueues %v (total %d), model %d queues with queued runs", aq, total, active)
	for env := range envs {
		es, err := q.EnvStats(w.ctx, env)
		w.noErr(err, "env stats")
		var queued, held, dead int
		for _, r := range w.runs {
			if r.env != env {
				continue
			}
			switch r.state {
			case "queued":
				queued++
			case "held":
				held++
			case "dead":
				dead++
			}
		}
		w.check(es.Ready+es.Delayed == int64(queued) && es.InFlight == int64(held) && es.Dead == int64(dead),
			"EnvStats %s = %+v, model queued %d held %d dead %d", env, es, queued, held, dead)
	}
	for sh := range map[int]bool{q.ShardOf("e1"): true, q.ShardOf("e2"): true} {
		s := w.space.Shard(sh)
		nl, err := w.c.ZCard(w.ctx, s.Leases()).Result()
		w.noErr(err, "leases")
		w.check(nl == int64(shardLeases[sh]), "shard %d leases %d, model held %d", sh, nl, shardLeases[sh])
		nt, err := w.c.ZCard(w.ctx, s.TTL()).Result()
		w.noErr(err, "ttl")
		w.check(nt == int64(shardTTL[sh]), "shard %d ttl entries %d, model %d", sh, nt, shardTTL[sh])
	}
}

// drain hands every held run back, then both instances take turns
// dequeuing and acking each queue until nothing is queued; purges the dead
// and checks that nothing of the queues is left behind.
func (w *s26World) drain() {
	w.t.Helper()
	w.recoverAll(w.on, "on")
	w.verify()
	// Raise no limits: drain under the limits the history left.
	queued := 0
	for _, r := range w.runs {
		if r.state == "queued" {
			queued++
		}
	}
	bound := queued + 200
	calls := 0
	for ; calls < bound; calls++ {
		left := 0
		for _, r := range w.runs {
			if r.state == "queued" {
				left++
			}
		}
		if left == 0 {
			break
		}
		q, who := w.on, "on"
		if (w.drainMode == 0 && calls%2 == 1) || w.drainMode == 2 {
			q, who = w.off, "off"
		}
		for _, ref := range w.queues {
			got, err := q.Dequeue(w.ctx, ref.env, ref.queue, 1+w.rng.Intn(4))
			w.noErr(err, "drain dequeue")
			w.received(who, ref, got)
			for _, run := range got {
				err := q.Ack(w.ctx, run)
				w.settleAck(who, run, err)
			}
		}
		w.clock.Advance(time.Second)
		w.verify()
	}
	for _, r := range w.runs {
		w.check(r.state == "dead", "after %d drain calls %s/%s/%s (key %q) still %s (at %d, now %d)", calls, r.env, r.queue, r.id, r.key, r.state, r.at, w.now())
	}
	for _, ref := range w.queues {
		n, err := w.off.PurgeDeadLetters(w.ctx, ref.env, ref.queue, w.clock.Now(), 10000)
		w.noErr(err, "final purge")
		w.check(n == w.count(ref, nil, "dead"), "final purge %v: %d, want %d", ref, n, w.count(ref, nil, "dead"))
	}
	w.runs = map[string]*s26Run{}
	w.verify()
	// Keys left: only tokens, layout, the scheduler's two keys (with a TTL)
	// and weights.
	for _, k := range prefixKeys(w.t, w.c, w.prefix) {
		switch {
		case strings.HasSuffix(k, ":tokens"), strings.HasSuffix(k, ":layout"), strings.HasSuffix(k, ":weights"):
		case expiresOnItsOwn(k):
			ttl, err := w.c.PTTL(w.ctx, k).Result()
			w.noErr(err, "pttl")
			// -2: the key expired between the listing and PTTL (the
			// short StateTTL of the state-expiry test); -1 is the defect.
			w.check(ttl > 0 || ttl == -2, "scheduler key %s left without a TTL (%v)", k, ttl)
		default:
			w.fail("key %s (%s) left behind after everything was acked or purged", k, keyValue(w.t, w.c, k))
		}
	}
}

func s26Seeds(def int) []int64 {
	n := def
	if s := os.Getenv("S26_SEEDS"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	base := int64(1)
	if s := os.Getenv("S26_BASE"); s != "" {
		b, _ := strconv.Atoi(s)
		base = int64(b)
	}
	var out []int64
	for i := 0; i < n; i++ {
		out = append(out, base+int64(i))
	}
	return out
}

func TestS26LifeRandom(t *testing.T) {
	t.Parallel() // its own prefix and a fake clock: nothing here depends on timing
	c := redistest.Real(t)
	steps := 250
	if s := os.Getenv("S26_STEPS"); s != "" {
		steps, _ = strconv.Atoi(s)
	}
	for _, seed := range s26Seeds(6) {
		seed := seed
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			maxQ, maxK := 0, 0
			switch seed % 3 {
			case 1:
				maxQ, maxK = 25, 0
			case 2:
				maxQ, maxK = 0, 6
			}
			w := newS26World(t, c, seed, maxQ, maxK)
			if n, _ := strconv.Atoi(os.Getenv("S26_KEYS")); n > 0 {
				w.keys = nil
				for i := 0; i < n; i++ {
					w.keys = append(w.keys, fmt.Sprintf("k%d", i))
				}
			}
			for _, ref := range w.queues {
				w.limits[ref] = runqueue.Limits{Key: []int{0, 1, 2}[w.rng.Intn(3)]}
			}
			for i := 0; i < steps; i++ {
				w.step()
			}
			w.drainMode = int((seed / 3) % 3)
			w.drain()
		})
	}
}

// Helpers for the targeted tests: each applies one operation through q and
// to the model, then verifies.

func (w *s26World) enq(q *runqueue.Queue, p runqueue.EnqueueParams) {
	w.t.Helper()
	if p.Payload == nil {
		p.Payload = []byte(p.ID)
	}
	want := w.expectEnqueue(p, w.now())
	ok, err := q.Enqueue(w.ctx, p)
	w.check(w.answer(ok, err) == want, "enqueue %+v: got %s want %s", p, w.answer(ok, err), want)
	w.verify()
}

func (w *s26World) deq(q *runqueue.Queue, ref s26QRef, m int) []*runqueue.Run {
	w.t.Helper()
	got, err := q.Dequeue(w.ctx, ref.env, ref.queue, m)
	w.noErr(err, "dequeue")
	w.received("deq", ref, got)
	w.verify()
	return got
}

func (w *s26World) ack(q *runqueue.Queue, run *runqueue.Run) {
	w.t.Helper()
	w.settleAck("ack", run, q.Ack(w.ctx, run))
	w.drop(run)
	w.verify()
}

func (w *s26World) nack(q *runqueue.Queue, run *runqueue.Run, opts *runqueue.NackOptions) {
	w.t.Helper()
	r := w.runs[s26ID(run.Env, run.Queue, run.ID)]
	w.check(r != nil && r.run == run, "nack of a run not held")
	res, err := q.Nack(w.ctx, run, opts)
	w.noErr(err, "nack")
	r.attempt++
	if !res.Requeued {
		r.state = "dead"
	} else {
		r.state, r.at = "queued", res.RetryAt.UnixMilli()
	}
	r.run = nil
	w.drop(run)
	w.verify()
}

// serveAll dequeues ref through the instances qs in turn (acking each run
// at once) until nothing of ref is queued, within bound calls.
func (w *s26World) serveAll(ref s26QRef, bound int, qs ...*runqueue.Queue) int {
	w.t.Helper()
	for calls := 0; calls < bound; calls++ {
		if w.count(ref, nil, "queued") == 0 {
			return calls
		}
		q := qs[calls%len(qs)]
		for _, run := range w.deq(q, ref, 1) {
			w.ack(q, run)
		}
		w.clock.Advance(time.Millisecond)
	}
	var left []string
	for _, r := range w.runs {
		if r.state == "queued" && r.env == ref.env && r.queue == ref.queue {
			left = append(left, fmt.Sprintf("%s(key %q at %d)", r.id, r.key, r.at))
		}
	}
	w.fail("%v: still queued after %d calls: %v (now %d)", ref, bound, left, w.now())
	return bound
}

func (w *s26World) setLimits(ref s26QRef, l runqueue.Limits) {
	w.mu.Lock()
	w.limits[ref] = l
	w.mu.Unlock()
}

var s26Q = s26QRef{"e1", "qa"}

// A key at its limit (flag on, gated) while its queued runs expire by TTL
// sweeps of either flag; a new run of the key, and the slot freed by a
// flag-off ack: the new run is served, nothing is left behind.
func TestS26LifeTargetedExpireAtLimit(t *testing.T) {
	w := newS26World(t, redistest.Real(t), 1, 0, 0)
	w.setLimits(s26Q, runqueue.Limits{Key: 1})
	for i := 0; i < 5; i++ {
		w.enq(w.off, runqueue.EnqueueParams{Env: "e1", Queue: "qa", Key: "k1", ID: fmt.Sprintf("a%d", i), TTL: 10 * time.Second})
		w.enq(w.on, runqueue.EnqueueParams{Env: "e1", Queue: "qa", Key: "k2", ID: fmt.Sprintf("b%d", i), TTL: 10 * time.Second})
	}
	held := w.deq(w.on, s26Q, 4) // one of each key; both gated
	w.check(len(held) == 2, "served %d, want 2", len(held))
	w.deq(w.on, s26Q, 4)
	w.clock.Advance(11 * time.Second)
	n, err := w.off.ExpireTTL(w.ctx, w.off.ShardOf("e1"), 3)
	w.noErr(err, "expire")
	m, err := w.on.ExpireTTL(w.ctx, w.on.ShardOf("e1"), 100)
	w.noErr(err, "expire")
	w.check(n+m == 8, "expired %d+%d, want 8", n, m)
	for k, r := range w.runs {
		if r.state == "queued" {
			delete(w.runs, k)
		}
	}
	w.verify()
	w.enq(w.off, runqueue.EnqueueParams{Env: "e1", Queue: "qa", Key: "k1", ID: "a9"})
	w.enq(w.on, runqueue.EnqueueParams{Env: "e1", Queue: "qa", Key: "k2", ID: "b9"})
	w.deq(w.on, s26Q, 4) // both still at their limit
	for _, run := range held {
		w.ack(w.off, run) // flag off: the scheduler is not told
	}
	w.serveAll(s26Q, 6, w.on)
	w.drain()
}

// A flip while runs are in flight: flag-on dequeues take every key to its
// limit, the flag-off instance nacks them (now and later) and enqueues
// more; the flag-on instance alone must serve every run within a bound.
func TestS26LifeTargetedFlipNack(t *testing.T) {
	w := newS26World(t, redistest.Real(t), 2, 0, 0)
	w.setLimits(s26Q, runqueue.Limits{Key: 1})
	for k := 0; k < 6; k++ {
		for i := 0; i < 3; i++ {
			w.enq(w.on, runqueue.EnqueueParams{Env: "e1", Queue: "qa", Key: fmt.Sprintf("k%d", k), ID: fmt.Sprintf("r%d-%d", k, i)})
		}
	}
	held := w.deq(w.on, s26Q, 10)
	w.check(len(held) == 6, "served %d, want 6", len(held))
	for i, run := range held {
		var opts *runqueue.NackOptions
		switch i % 3 {
		case 0:
			opts = &runqueue.NackOptions{RetryAt: w.clock.Now()}
		case 1:
			opts = &runqueue.NackOptions{RetryAt: w.clock.Now().Add(5 * time.Second)}
		case 2:
			opts = &runqueue.NackOptions{DeadLetter: true}
		}
		w.nack(w.off, run, opts)
	}
	w.enq(w.off, runqueue.EnqueueParams{Env: "e1", Queue: "qa", Key: "k0", ID: "late0"})
	w.enq(w.off, runqueue.EnqueueParams{Env: "e1", Queue: "qa", Key: "new", ID: "late1"})
	w.clock.Advance(6 * time.Second)
	w.serveAll(s26Q, 40, w.on)
	w.drain()
}

// Redrive of dead runs into a key at its limit, by either flag; the slot
// then freed by a flag-off ack: the redriven runs are served by the
// flag-on instance.
func TestS26LifeTargetedRedriveAtLimit(t *testing.T) {
	w := newS26World(t, redistest.Real(t), 3, 0, 0)
	w.setLimits(s26Q, runqueue.Limits{Key: 1})
	for i := 0; i < 4; i++ {
		w.enq(w.on, runqueue.EnqueueParams{Env: "e1", Queue: "qa", Key: "k", ID: fmt.Sprintf("d%d", i)})
	}
	for i := 0; i < 3; i++ {
		got := w.deq(w.on, s26Q, 2)
		w.check(len(got) == 1, "served %d", len(got))
		w.nack(w.on, got[0], &runqueue.NackOptions{DeadLetter: true})
	}
	got := w.deq(w.on, s26Q, 2) // d3 held: k at its limit
	w.check(len(got) == 1, "served %d", len(got))
	for i, q := range []*runqueue.Queue{w.off, w.on, w.off} {
		r := w.runs[s26ID("e1", "qa", fmt.Sprintf("d%d", i))]
		w.noErr(q.Redrive(w.ctx, "e1", "qa", "k", r.id), "redrive")
		r.state, r.at, r.attempt = "queued", w.now(), 1
		w.verify()
		w.check(len(w.deq(w.on, s26Q, 3)) == 0, "served past the key limit")
	}
	w.ack(w.off, got[0])
	w.serveAll(s26Q, 6, w.on)
	w.drain()
}

// Purge and delete of dead letters while other runs (and runs of the same
// ids, reused) are in flight; stale holders of purged runs.
func TestS26LifeTargetedPurgeWhileHeld(t *testing.T) {
	w := newS26World(t, redistest.Real(t), 4, 0, 0)
	for i := 0; i < 6; i++ {
		w.enq(w.off, runqueue.EnqueueParams{Env: "e1", Queue: "qa", Key: "k", ID: fmt.Sprintf("p%d", i)})
	}
	got := w.deq(w.on, s26Q, 6)
	var old []*runqueue.Run
	for i, run := range got {
		if i < 3 {
			w.nack(w.off, run, &runqueue.NackOptions{DeadLetter: true})
			old = append(old, run)
		}
	}
	n, err := w.on.PurgeDeadLetters(w.ctx, "e1", "qa", w.clock.Now(), 2)
	w.noErr(err, "purge")
	w.check(n == 2, "purged %d", n)
	ds, err := w.on.DeadLetters(w.ctx, "e1", "qa", 0, 10)
	w.noErr(err, "dead letters")
	w.check(len(ds) == 1, "dead left %d", len(ds))
	for k, r := range w.runs {
		if r.state == "dead" && r.id != ds[0].ID {
			delete(w.runs, k)
		}
	}
	w.verify()
	for _, run := range got[3:] {
		err := w.off.DeleteDeadLetter(w.ctx, "e1", "qa", "k", run.ID)
		w.check(errors.Is(err, runqueue.ErrNotFound), "delete of a held run: %v", err)
	}
	w.verify()
	// Reuse the purged ids, under another key too, and serve them.
	for _, run := range old {
		if run.ID == ds[0].ID {
			continue
		}
		w.enq(w.on, runqueue.EnqueueParams{Env: "e1", Queue: "qa", Key: "k2", ID: run.ID, Payload: []byte("new")})
	}
	fresh := w.deq(w.off, s26Q, 5)
	for _, run := range old {
		w.settleAck("stale", run, w.on.Ack(w.ctx, run))
		res, err := w.off.Nack(w.ctx, run, nil)
		if run.ID == ds[0].ID {
			// The retry of the nack that dead-lettered it: its answer again.
			w.check(err == nil && !res.Requeued, "retried dead-letter nack of %s: %+v %v", run.ID, res, err)
		} else {
			w.check(err != nil, "stale nack of %s succeeded", run.ID)
		}
		w.verify()
	}
	for _, run := range fresh {
		w.ack(w.on, run)
	}
	for _, run := range got[3:] {
		w.ack(w.off, run)
	}
	w.drain()
}

// The scheduler's state expires (StateTTL 1s, real time) while keys are at
// their limit and runs are in flight, twice; flag-off acks and nacks in
// between: nothing is stranded, and the state is left with a TTL.
func TestS26LifeTargetedStateExpiry(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	c := redistest.Real(t)
	w := newS26World(t, c, 5, 0, 0)
	short, err := runqueue.New(w.ctx, c, &runqueue.Config{Prefix: w.prefix, Clock: w.clock, VtimeScheduling: true,
		LeaseDuration: time.Minute, MaxAttempts: s26MaxAttempts, StateTTL: time.Second, ScanLimit: 30, PromoteLimit: 3,
		LimitsFor: func(env, queue string) runqueue.Limits {
			w.mu.Lock()
			defer w.mu.Unlock()
			return w.limits[s26QRef{env, queue}]
		}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = short.Close() })
	w.on = short
	w.setLimits(s26Q, runqueue.Limits{Key: 1})
	for k := 0; k < 4; k++ {
		for i := 0; i < 3; i++ {
			w.enq(w.on, runqueue.EnqueueParams{Env: "e1", Queue: "qa", Key: fmt.Sprintf("k%d", k), ID: fmt.Sprintf("r%d-%d", k, i)})
		}
	}
	held := w.deq(w.on, s26Q, 3)
	held = append(held, w.deq(w.on, s26Q, 3)...)
	for round := 0; round < 2; round++ {
		time.Sleep(1200 * time.Millisecond) // the state expires
		qk := w.space.Env("e1").Queue("qa")
		n, err := c.Exists(w.ctx, qk.CkVtime(), qk.CkVtimeState()).Result()
		require.NoError(t, err)
		require.Zero(t, n, "state still there")
		for i, run := range held {
			if i%2 == 0 {
				w.ack(w.off, run)
			} else {
				w.nack(w.off, run, &runqueue.NackOptions{RetryAt: w.clock.Now()})
			}
		}
		w.enq(w.on, runqueue.EnqueueParams{Env: "e1", Queue: "qa", Key: "k1", ID: fmt.Sprintf("x%d", round)})
		held = w.deq(w.on, s26Q, 4)
		w.check(len(held) > 0, "round %d: nothing served after the state expired", round)
	}
	for _, run := range held {
		w.ack(w.on, run)
	}
	w.serveAll(s26Q, 30, w.on)
	w.drain()
}

// More than 64 runs in flight over more than 64 keys: the held and kin
// hashes get their wide marks; stats, acks by either flag, lease recovery,
// and the keys going when the last run leaves flight.
func TestS26LifeTargetedWide(t *testing.T) {
	t.Parallel() // its own prefix and a fake clock: nothing here depends on timing
	w := newS26World(t, redistest.Real(t), 6, 0, 0)
	w.setLimits(s26Q, runqueue.Limits{Key: 2})
	var ps []runqueue.EnqueueParams
	for k := 0; k < 80; k++ {
		for i := 0; i < 2; i++ {
			ps = append(ps, runqueue.EnqueueParams{Env: "e1", Queue: "qa", Key: fmt.Sprintf("w%02d", k), ID: fmt.Sprintf("w%02d-%d", k, i), Payload: []byte("p")})
		}
	}
	for _, p := range ps {
		w.expectEnqueue(p, w.now())
	}
	res, err := w.on.EnqueueMany(w.ctx, ps)
	w.noErr(err, "enqueue many")
	for _, r := range res {
		w.check(r.Queued && r.Err == nil, "enqueue %+v", r)
	}
	w.verify()
	var held []*runqueue.Run
	for i := 0; i < 4; i++ {
		q := w.on
		if i%2 == 1 {
			q = w.off
		}
		held = append(held, w.deq(q, s26Q, 50)...)
	}
	qk := w.space.Env("e1").Queue("qa")
	mark, err := w.c.HExists(w.ctx, qk.Held(), "~").Result()
	w.noErr(err, "hexists")
	t.Logf("held %d, wide mark %v", len(held), mark)
	// Ack most by either flag, recover the rest.
	for i, run := range held[:len(held)-5] {
		q := w.on
		if i%3 == 0 {
			q = w.off
		}
		w.ack(q, run)
	}
	w.recoverAll(w.off, "off")
	w.verify()
	w.drain()
}

func TestS26LifeRandomCluster(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	c := redistest.Cluster(t)
	for _, seed := range s26Seeds(3) {
		seed := seed
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			w := newS26World(t, c, seed+1000, []int{0, 25, 0}[seed%3], []int{0, 0, 6}[seed%3])
			for _, ref := range w.queues {
				w.limits[ref] = runqueue.Limits{Key: []int{0, 1, 2}[w.rng.Intn(3)]}
			}
			for i := 0; i < 150; i++ {
				w.step()
			}
			w.drain()
		})
	}
}

// s26Conc is the shared record of the concurrent test.
type s26Conc struct {
	mu       sync.Mutex
	held     map[string]*runqueue.Run // run -> its current delivery
	settling map[*runqueue.Run]bool   // deliveries whose ack or nack is in flight
	acked    map[string]int
	errs     []string
	serves   int
}

// Four instances (two per flag) on one Redis, concurrently: enqueues
// (coalesced), dequeues, ack-and-dequeue, acks, nacks, lease recovery and
// TTL sweeps, with limits, under a shared fake clock. No run is served
// while a delivery that is neither settling nor past its lease holds it;
// after a final drain every run was acked once, dead-lettered or expired,
// and the counters and keys are clean.
func TestS26LifeConcurrent(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	c := redistest.Real(t)
	for _, seed := range s26Seeds(2) {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) { s26Concurrent(t, c, seed) })
	}
}

func s26Concurrent(t *testing.T, c redis.UniversalClient, seed int64) {
	w := newS26World(t, c, seed, 0, 0)
	w.setLimits(s26Q, runqueue.Limits{Key: 2, Queue: 6})
	w.setLimits(s26QRef{"e1", "qb"}, runqueue.Limits{Key: 1, Env: 8})
	qs := []*runqueue.Queue{w.on, w.off}
	for _, on := range []bool{true, false} {
		q, err := runqueue.New(w.ctx, otherClient(t, c), &runqueue.Config{Prefix: w.prefix, Clock: w.clock, VtimeScheduling: on,
			LeaseDuration: time.Minute, MaxAttempts: s26MaxAttempts, BackoffBase: time.Second, BackoffMax: 5 * time.Second,
			LimitsFor: func(env, queue string) runqueue.Limits {
				w.mu.Lock()
				defer w.mu.Unlock()
				return w.limits[s26QRef{env, queue}]
			}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = q.Close() })
		qs = append(qs, q)
	}
	st := &s26Conc{held: map[string]*runqueue.Run{}, settling: map[*runqueue.Run]bool{}, acked: map[string]int{}}
	refs := []s26QRef{s26Q, {"e1", "qb"}}
	var next int64
	var nextMu sync.Mutex
	newID := func() string {
		nextMu.Lock()
		defer nextMu.Unlock()
		next++
		return "c" + strconv.FormatInt(next, 10)
	}
	served := func(got []*runqueue.Run) {
		st.mu.Lock()
		defer st.mu.Unlock()
		now := w.clock.Now()
		for _, r := range got {
			k := s26ID(r.Env, r.Queue, r.ID)
			if prev, ok := st.held[k]; ok && !st.settling[prev] && prev.LeaseDeadline.After(now) {
				st.errs = append(st.errs, fmt.Sprintf("%s served (token %d) while delivery %d holds it until %v (now %v)", k, r.Token, prev.Token, prev.LeaseDeadline, now))
			}
			st.held[k] = r
			st.serves++
		}
	}
	settle := func(r *runqueue.Run, f func() error) {
		st.mu.Lock()
		st.settling[r] = true
		st.mu.Unlock()
		err := f()
		st.mu.Lock()
		defer st.mu.Unlock()
		delete(st.settling, r)
		k := s26ID(r.Env, r.Queue, r.ID)
		if err == nil && st.held[k] == r {
			delete(st.held, k)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := 0; g < 6; g++ {
		g := g
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed*100 + int64(g)))
			var mine []*runqueue.Run
			for i := 0; ; i++ {
				select {
				case <-stop:
					for _, r := range mine {
						settle(r, func() error { return qs[g%4].Ack(w.ctx, r) })
					}
					return
				default:
				}
				q := qs[rng.Intn(4)]
				ref := refs[rng.Intn(2)]
				switch op := rng.Intn(10); {
				case op < 2:
					p := runqueue.EnqueueParams{Env: ref.env, Queue: ref.queue, Key: fmt.Sprintf("k%d", rng.Intn(5)), ID: newID(), Payload: []byte("x")}
					if rng.Intn(4) == 0 {
						p.Delay = time.Duration(rng.Intn(3000)) * time.Millisecond
					}
					if rng.Intn(5) == 0 {
						p.TTL = time.Duration(1+rng.Intn(3000)) * time.Millisecond
					}
					if _, err := q.Enqueue(w.ctx, p); err != nil {
						t.Errorf("enqueue: %v", err)
						return
					}
				case op < 4 && rng.Intn(2) == 0:
					// A plain Dequeue (coalesced with concurrent ones of the
					// same instance and queue).
					got, err := q.Dequeue(w.ctx, ref.env, ref.queue, 1+rng.Intn(3))
					if err != nil {
						t.Errorf("dequeue: %v", err)
						return
					}
					served(got)
					mine = append(mine, got...)
				case op < 4:
					if rng.Intn(3) == 0 {
						w.setLimits(ref, runqueue.Limits{Key: rng.Intn(3), Queue: []int{0, 6}[rng.Intn(2)]})
					} else if err := q.SetWeight(w.ctx, ref.env, ref.queue, fmt.Sprintf("k%d", rng.Intn(5)), []float64{0.5, 1, 4}[rng.Intn(3)]); err != nil {
						t.Errorf("weight: %v", err)
						return
					}
				case op < 6:
					var acks []*runqueue.Run
					keep := mine[:0]
					for _, r := range mine {
						if r.Env == ref.env && r.Queue == ref.queue && rng.Intn(2) == 0 {
							acks = append(acks, r)
						} else {
							keep = append(keep, r)
						}
					}
					mine = keep
					st.mu.Lock()
					for _, r := range acks {
						st.settling[r] = true
					}
					st.mu.Unlock()
					got, errs, err := q.AckAndDequeue(w.ctx, acks, ref.env, ref.queue, 1+rng.Intn(3))
					if err != nil {
						t.Errorf("ackAndDequeue: %v", err)
						return
					}
					st.mu.Lock()
					for i, r := range acks {
						delete(st.settling, r)
						k := s26ID(r.Env, r.Queue, r.ID)
						if errs[i] == nil && st.held[k] == r {
							delete(st.held, k)
						}
					}
					st.mu.Unlock()
					served(got)
					mine = append(mine, got...)
				case op < 8:
					if len(mine) > 0 {
						j := rng.Intn(len(mine))
						r := mine[j]
						mine = append(mine[:j], mine[j+1:]...)
						if rng.Intn(2) == 0 {
							settle(r, func() error { return q.Ack(w.ctx, r) })
						} else {
							settle(r, func() error {
								_, err := q.Nack(w.ctx, r, &runqueue.NackOptions{RetryAt: w.clock.Now().Add(time.Duration(rng.Intn(2000)) * time.Millisecond)})
								return err
							})
						}
					}
				case op < 9:
					if _, err := q.RecoverLeases(w.ctx, q.ShardOf("e1"), 1000); err != nil {
						t.Errorf("recover: %v", err)
						return
					}
				default:
					if _, err := q.ExpireTTL(w.ctx, q.ShardOf("e1"), 1000); err != nil {
						t.Errorf("expire: %v", err)
						return
					}
				}
				if i%20 == 19 {
					w.clock.Advance(time.Duration(rng.Intn(400)) * time.Millisecond)
				}
			}
		}()
	}
	time.Sleep(4 * time.Second)
	close(stop)
	wg.Wait()
	st.mu.Lock()
	for _, e := range st.errs {
		t.Error(e)
	}
	t.Logf("%d runs enqueued, %d serves while concurrent", next, st.serves)
	require.Greater(t, st.serves, 100)
	st.mu.Unlock()
	// Drain: let every lease pass, recover, expire, and serve the rest.
	w.clock.Advance(2 * time.Minute)
	_, err := w.on.RecoverLeases(w.ctx, w.on.ShardOf("e1"), 100000)
	require.NoError(t, err)
	for calls := 0; calls < 5000; calls++ {
		busy := false
		for _, ref := range refs {
			s, err := w.off.QueueStats(w.ctx, ref.env, ref.queue)
			require.NoError(t, err)
			require.Zero(t, s.InFlight)
			if s.Ready+s.Delayed == 0 {
				continue
			}
			busy = true
			q := qs[calls%4]
			got, err := q.Dequeue(w.ctx, ref.env, ref.queue, 5)
			require.NoError(t, err)
			for _, r := range got {
				require.NoError(t, q.Ack(w.ctx, r))
			}
		}
		if !busy {
			break
		}
		w.clock.Advance(time.Second)
	}
	for _, ref := range refs {
		s, err := w.off.QueueStats(w.ctx, ref.env, ref.queue)
		require.NoError(t, err)
		require.Zero(t, s.Ready+s.Delayed+s.InFlight, "%v left %+v", ref, s)
		qk := w.space.Env(ref.env).Queue(ref.queue)
		hl, err := c.HLen(w.ctx, qk.Runs()).Result()
		require.NoError(t, err)
		require.Equal(t, s.Dead, hl, "%v runs hash holds %d, dead %d", ref, hl, s.Dead)
		_, err = w.off.PurgeDeadLetters(w.ctx, ref.env, ref.queue, w.clock.Now(), 10000)
		require.NoError(t, err)
	}
	es, err := w.on.EnvStats(w.ctx, "e1")
	require.NoError(t, err)
	require.Equal(t, runqueue.Stats{}, es)
	for _, k := range prefixKeys(t, c, w.prefix) {
		switch {
		case strings.HasSuffix(k, ":tokens"), strings.HasSuffix(k, ":layout"), strings.HasSuffix(k, ":weights"):
		case expiresOnItsOwn(k):
			ttl, err := c.PTTL(w.ctx, k).Result()
			require.NoError(t, err)
			require.Positive(t, ttl, "scheduler key %s without TTL", k)
		default:
			t.Errorf("key %s left: %s", k, keyValue(t, c, k))
		}
	}
}

// Fixed defect (flag off): a flag-off Dequeue that reads only part of
// ckIndex (more variants than min(ScanLimit, maxCount) + 1 without a key
// limit) and serves the last variant of its window wrote the queue's master
// score from the window's bound, the served run's old score, instead of
// the queue's new earliest work (lua/dequeue.lua: dq.ck_head =
// window_low(age); window_low returns bound.s, list[n].s, after entry n
// itself moved out). The master then says the queue's oldest work is older
// than any run it holds: ActiveQueues and DequeueShard (which serve a
// shard's queues oldest work first) put it ahead of a queue whose run is
// older. Docs: design.md section 2 / lifecycle.md, master = "the earliest
// time it has work (lowest ready head or earliest delayed run)".
//
// Steps: queue X, key A runs at now-30s and now-20s, key B a run at
// now-25s; queue Y of the same env, one run at now-28s. Flag-off
// Dequeue(X, 1) serves A's first run. Expected: X's master score
// now-25s (B's head), Y's run (now-28s) the oldest work of the shard, so
// ActiveQueues lists Y first and DequeueShard(1) serves Y's run. Observed:
// X's master score stays now-30s; ActiveQueues lists X first and
// DequeueShard(1) serves X's B run (25s old) before Y's (28s old).
func TestS26LifeMasterAfterPartialRead(t *testing.T) {
	for _, flag := range []bool{false, true} {
		t.Run(fmt.Sprintf("flag=%v", flag), func(t *testing.T) {
			c := redistest.Real(t)
			w := newS26World(t, c, 7, 0, 0)
			q := w.off
			if flag {
				q = w.on
			}
			at := func(d time.Duration) time.Time { return w.clock.Now().Add(-d) }
			for _, p := range []runqueue.EnqueueParams{
				{Env: "e1", Queue: "X", Key: "A", ID: "a1", AvailableAt: at(30 * time.Second)},
				{Env: "e1", Queue: "X", Key: "A", ID: "a2", AvailableAt: at(20 * time.Second)},
				{Env: "e1", Queue: "X", Key: "B", ID: "b1", AvailableAt: at(25 * time.Second)},
				{Env: "e1", Queue: "Y", Key: "", ID: "y1", AvailableAt: at(28 * time.Second)},
			} {
				p.Payload = []byte(p.ID)
				_, err := q.Enqueue(w.ctx, p)
				require.NoError(t, err)
			}
			got, err := q.Dequeue(w.ctx, "e1", "X", 1)
			require.NoError(t, err)
			require.Len(t, got, 1)
			require.Equal(t, "a1", got[0].ID)
			qk := w.space.Env("e1").Queue("X")
			score, err := c.ZScore(w.ctx, w.space.Shard(q.ShardOf("e1")).Master(), qk.Member()).Result()
			require.NoError(t, err)
			aq, _, err := q.ActiveQueues(w.ctx, 10)
			require.NoError(t, err)
			next, err := q.DequeueShard(w.ctx, q.ShardOf("e1"), 1)
			require.NoError(t, err)
			require.Len(t, next, 1)
			t.Logf("X master %d ms before now; ActiveQueues %v; DequeueShard served %s/%s", w.now()-int64(score), aq, next[0].Queue, next[0].ID)
			assert := func(cond bool, format string, a ...any) {
				if !cond {
					t.Errorf(format, a...)
				}
			}
			assert(int64(score) == at(25*time.Second).UnixMilli(), "X's master score is %d ms before now, want 25000 (B's head; a1 at 30000 was served)", w.now()-int64(score))
			assert(aq[0].Queue == "Y", "ActiveQueues lists %v: X first although Y's run is older", aq)
			assert(next[0].ID == "y1", "DequeueShard(1) served %s/%s (25s old) before Y's y1 (28s old)", next[0].Queue, next[0].ID)
		})
	}
}

// EnqueueMany of more runs than one script call takes (several calls per
// queue), with ids repeated across the calls' boundaries (same body and
// another), over two queues, with and without an admission limit: every
// answer is what runs queued one at a time would get, and the counts hold.
func TestS26LifeTargetedBigBatch(t *testing.T) {
	t.Parallel() // its own prefix and a fake clock: nothing here depends on timing
	c := redistest.Real(t)
	for _, maxQ := range []int{0, 1700} {
		t.Run(fmt.Sprintf("maxQ=%d", maxQ), func(t *testing.T) {
			w := newS26World(t, c, 8, maxQ, 0)
			var ps []runqueue.EnqueueParams
			for i := 0; i < 2300; i++ {
				ref := w.queues[i%2]
				id := i / 2
				if i >= 2000 {
					id = (i - 2000) * 3 // repeats of ids of the first calls
				}
				payload := fmt.Sprintf("p%d", id)
				if i >= 2000 && i%4 == 0 {
					payload += "x"
				}
				p := runqueue.EnqueueParams{Env: ref.env, Queue: ref.queue, Key: fmt.Sprintf("k%d", id%7), ID: fmt.Sprintf("b%d", id), Payload: []byte(payload)}
				if i%5 == 0 {
					p.Delay = time.Duration(i%17) * time.Second
				}
				if i%3 == 0 {
					p.TTL = time.Minute
				}
				ps = append(ps, p)
			}
			var wants []string
			for _, p := range ps {
				wants = append(wants, w.expectEnqueue(p, w.now()))
			}
			res, err := w.on.EnqueueMany(w.ctx, ps)
			w.noErr(err, "enqueue many")
			for i := range res {
				got := w.answer(res[i].Queued, res[i].Err)
				w.check(got == wants[i], "run %d %+v: %s, want %s", i, ps[i], got, wants[i])
			}
			w.verify()
			w.drainMode = 1
			w.drain()
		})
	}
}

func TestS26LifeConcurrentCluster(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	c := redistest.Cluster(t)
	for _, seed := range s26Seeds(1) {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) { s26Concurrent(t, c, seed+50) })
	}
}
