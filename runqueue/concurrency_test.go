package runqueue_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
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

// Shape of the concurrency test.
const (
	ccRuns        = 10000
	ccKeys        = 50
	ccWorkers     = 8
	ccEnvLimit    = 30
	ccQueueLimit  = 20
	ccKeyLimit    = 3
	ccMaxAttempts = 3
	ccLease       = 200 * time.Millisecond
)

// ccQueues are the three base queues of two envs the runs go to.
var ccQueues = []struct{ env, queue string }{{"env-a", "q1"}, {"env-a", "q2"}, {"env-b", "q1"}}

// ccRun says where run i goes; its payload is its id, so a delivery that
// mixes one run's payload with another's id is caught.
func ccRun(i int) runqueue.EnqueueParams {
	q := ccQueues[i%len(ccQueues)]
	id := fmt.Sprintf("r%05d", i)
	return runqueue.EnqueueParams{Env: q.env, Queue: q.queue, Key: fmt.Sprintf("k%02d", (i/len(ccQueues))%ccKeys),
		ID: id, Payload: []byte(id)}
}

// ccHolder is the latest delivery of a run seen by the workers.
type ccHolder struct {
	token           int64
	deadline        time.Time
	releasing       bool // an ack or nack of this delivery has been sent
	env, queue, key string
}

// ccTracker is the workers' shared bookkeeping; every check that fails is
// recorded (goroutines may not call t.FailNow) and reported at the end.
type ccTracker struct {
	mu    sync.Mutex
	held  map[string]*ccHolder // run id -> latest delivery
	acked map[string]int
	// staleAcks: runs acked (nil) by a delivery older than their latest.
	staleAcks map[string]bool
	nackDead  map[string]bool
	attempts  map[string]int   // highest attempt delivered
	tokens    map[string]int64 // highest token delivered
	deliver   int
	lost      int // acks and nacks refused because the lease was lost
	drops     int
	maxInUse  map[string]int // highest in-flight count seen by the workers, by limit scope
	failures  []string
}

func (tr *ccTracker) fail(format string, args ...any) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.failLocked(format, args...)
}

func (tr *ccTracker) failLocked(format string, args ...any) {
	if len(tr.failures) < 20 {
		tr.failures = append(tr.failures, fmt.Sprintf(format, args...))
	}
}

// delivered records a dequeued run and checks it against the previous
// delivery of the same run and against the limits.
func (tr *ccTracker) delivered(r *runqueue.Run) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	// now is read under the lock. Read before it, it could be older than
	// the clock of a recovery that freed the slot of a delivery recorded
	// while this goroutine waited for the lock: the recovered run would
	// still look live and, with the delivery that took its slot, exceed a
	// limit Redis never exceeded.
	now := time.Now()
	tr.deliver++
	if string(r.Payload) != r.ID {
		tr.failLocked("run %s delivered with payload %q", r.ID, r.Payload)
	}
	if r.Attempt < 1 || r.Attempt > ccMaxAttempts {
		tr.failLocked("run %s delivered at attempt %d", r.ID, r.Attempt)
	}
	switch last := tr.tokens[r.ID]; {
	case r.Token < last:
		// A worker slowed down (by the race detector, a loaded machine)
		// records its delivery after a later one: legitimate only if its
		// lease has passed, since the later delivery needed a recovery.
		if r.LeaseDeadline.After(now) {
			tr.failLocked("run %s has two holders: token %d (lease until %s) recorded after token %d",
				r.ID, r.Token, r.LeaseDeadline.Format(time.StampMilli), last)
		}
		return
	case r.Token == last:
		tr.failLocked("run %s delivered twice with token %d", r.ID, r.Token)
		return
	}
	tr.tokens[r.ID] = r.Token
	if tr.acked[r.ID] > 0 {
		tr.failLocked("run %s delivered again after its ack", r.ID)
	}
	if r.Attempt < tr.attempts[r.ID] {
		tr.failLocked("run %s attempt went back from %d to %d", r.ID, tr.attempts[r.ID], r.Attempt)
	}
	tr.attempts[r.ID] = r.Attempt
	// A later delivery is legitimate only once the previous holder let go
	// or its lease passed (recovery runs no earlier than that).
	if h := tr.held[r.ID]; h != nil && !h.releasing && h.deadline.After(now) {
		tr.failLocked("run %s has two holders: token %d (lease until %s) and token %d",
			r.ID, h.token, h.deadline.Format(time.StampMilli), r.Token)
	}
	tr.held[r.ID] = &ccHolder{token: r.Token, deadline: r.LeaseDeadline, env: r.Env, queue: r.Queue, key: r.Key}

	// Live deliveries (not released, lease not passed) are a subset of what
	// Redis counts in flight at this instant, so they too stay within the
	// limits.
	count := map[string]int{}
	for _, h := range tr.held {
		if h.releasing || !h.deadline.After(now) {
			continue
		}
		count["env|"+h.env]++
		count["queue|"+h.env+"|"+h.queue]++
		count["key|"+h.env+"|"+h.queue+"|"+h.key]++
	}
	for scope, n := range count {
		kind, _, _ := strings.Cut(scope, "|")
		limit := map[string]int{"env": ccEnvLimit, "queue": ccQueueLimit, "key": ccKeyLimit}[kind]
		if n > limit {
			tr.failLocked("workers hold %d runs of %s, limit %d", n, scope, limit)
		}
		tr.maxInUse[kind] = max(tr.maxInUse[kind], n)
	}
}

// release marks the delivery r as let go before its ack or nack is sent, so
// that a redelivery racing with the reply is not taken for a second holder.
func (tr *ccTracker) release(r *runqueue.Run) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if h := tr.held[r.ID]; h != nil && h.token == r.Token {
		h.releasing = true
	}
}

// settled records the outcome of an ack (nack == nil) or a nack.
func (tr *ccTracker) settled(r *runqueue.Run, nack *runqueue.NackResult, err error) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	switch {
	case errors.Is(err, runqueue.ErrLeaseLost), errors.Is(err, runqueue.ErrNotInFlight), errors.Is(err, runqueue.ErrNotFound):
		// The lease passed and the run was recovered (and maybe delivered
		// again, acked or dead-lettered): this holder did nothing.
		tr.lost++
		return
	case err != nil:
		tr.failLocked("settling run %s: %v", r.ID, err)
		return
	}
	h := tr.held[r.ID]
	if nack == nil {
		// An ack by a delivery whose lease passed succeeds only when the run
		// is gone (a later delivery acked it: Ack is idempotent); while a
		// later holder has it, the ack is ErrLeaseLost. Checked at the end:
		// such a run must have been acked by its latest delivery.
		if r.Token < tr.tokens[r.ID] {
			tr.staleAcks[r.ID] = true
			return
		}
		// An ack succeeds only for the latest delivery, and nothing can
		// deliver the run after it.
		if h != nil && h.token != r.Token {
			tr.failLocked("run %s acked by token %d while token %d holds it", r.ID, r.Token, h.token)
		}
		tr.acked[r.ID]++
		if tr.acked[r.ID] > 1 {
			tr.failLocked("run %s acked %d times", r.ID, tr.acked[r.ID])
		}
	} else if !nack.Requeued {
		tr.nackDead[r.ID] = true
	}
	// A nacked run may already be delivered again (h is then the new
	// holder); only this delivery's entry goes.
	if h != nil && h.token == r.Token {
		delete(tr.held, r.ID)
	}
}

func (tr *ccTracker) ackedCount() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return len(tr.acked)
}

// TestConcurrency runs 10,000 runs through 8 concurrent workers on a real
// Redis, with random acks, nacks and dropped runs whose leases expire, under
// env, queue and key limits. Every run must end acked or dead-lettered
// exactly once, no run may have two live holders, and no limit may be
// exceeded at any sampled moment.
func TestConcurrency(t *testing.T) {
	t.Parallel()
	c := redistest.Real(t)
	b := setup(t, c, func(cfg *runqueue.Config) {
		cfg.Clock = nil // leases expire in real time
		cfg.LeaseDuration = ccLease
		cfg.MaxAttempts = ccMaxAttempts
		cfg.EnvConcurrency, cfg.QueueConcurrency, cfg.KeyConcurrency = ccEnvLimit, ccQueueLimit, ccKeyLimit
	})
	space, err := keys.NewSpace(b.prefix, b.q.Shards())
	require.NoError(t, err)
	shards := map[int]bool{}
	for _, q := range ccQueues {
		shards[b.q.ShardOf(q.env)] = true
	}
	var shardList []int
	for s := range shards {
		shardList = append(shardList, s)
	}
	sort.Ints(shardList)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// work ends when every run has settled; ctx bounds the whole test.
	work, stop := context.WithCancel(ctx)
	defer stop()

	tr := &ccTracker{held: map[string]*ccHolder{}, acked: map[string]int{}, staleAcks: map[string]bool{}, nackDead: map[string]bool{},
		attempts: map[string]int{}, tokens: map[string]int64{}, maxInUse: map[string]int{}}
	var wg sync.WaitGroup

	// Producers run alongside the workers.
	var produced sync.WaitGroup
	for p := range 4 {
		produced.Go(func() {
			for i := p; i < ccRuns; i += 4 {
				ok, err := b.q.Enqueue(work, ccRun(i))
				if err != nil || !ok {
					tr.fail("enqueue %d: %v %v", i, ok, err)
					return
				}
			}
		})
	}

	late := make(chan *runqueue.Run, ccRuns) // runs held past their lease
	for w := range ccWorkers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(42, uint64(w)))
			for work.Err() == nil {
				n := 1 + rng.IntN(10)
				var runs []*runqueue.Run
				var err error
				// Half the workers serve base queues, half serve shards.
				if w%2 == 0 {
					q := ccQueues[rng.IntN(len(ccQueues))]
					runs, err = b.q.Dequeue(work, q.env, q.queue, n)
				} else {
					runs, err = b.q.DequeueShard(work, shardList[rng.IntN(len(shardList))], n)
				}
				if err != nil {
					if work.Err() == nil {
						tr.fail("worker %d dequeue: %v", w, err)
					}
					return
				}
				if len(runs) == 0 {
					time.Sleep(time.Millisecond)
					continue
				}
				// Record the whole batch first: a holder is known as soon
				// as possible.
				for _, r := range runs {
					tr.delivered(r)
				}
				for _, r := range runs {
					switch x := rng.IntN(100); {
					case x < 70:
						tr.release(r)
						tr.settled(r, nil, b.q.Ack(ctx, r))
					case x < 90:
						tr.release(r)
						res, err := b.q.Nack(ctx, r, &runqueue.NackOptions{RetryAt: time.Now()})
						tr.settled(r, &res, err)
					case x < 95:
						// Drop it: the worker "crashes"; lease recovery must
						// bring it back.
						tr.mu.Lock()
						tr.drops++
						tr.mu.Unlock()
					default:
						// A worker too slow for its lease acks after it
						// passed: the ack must fail once the run was
						// recovered.
						late <- r
					}
				}
			}
		})
	}

	// The slow workers' acks, each sent a little after its lease passed.
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(42, 1000))
		for {
			select {
			case <-work.Done():
				return
			case r := <-late:
				time.Sleep(time.Until(r.LeaseDeadline.Add(time.Duration(rng.IntN(60)) * time.Millisecond)))
				tr.release(r)
				tr.settled(r, nil, b.q.Ack(ctx, r))
			}
		}
	})

	// Recovery, as any instance would run it.
	wg.Go(func() {
		for work.Err() == nil {
			for _, s := range shardList {
				if _, err := b.q.RecoverLeases(work, s, 1000); err != nil && work.Err() == nil {
					tr.fail("recover: %v", err)
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	})

	// The sampler reads every in-flight count while the workers run: each
	// env's counter, each queue's held hash, each key's count.
	type count struct {
		name  string
		cmd   []any // a read returning the count (nil: 0)
		limit int
	}
	var counts []count
	seenEnv := map[string]bool{}
	for _, q := range ccQueues {
		e := space.Env(q.env)
		qk := e.Queue(q.queue)
		if !seenEnv[q.env] {
			seenEnv[q.env] = true
			counts = append(counts, count{"env " + q.env, []any{"GET", e.InflightCount()}, ccEnvLimit})
		}
		counts = append(counts, count{"queue " + q.queue, []any{"HLEN", qk.Held()}, ccQueueLimit})
		for k := range ccKeys {
			vm := qk.Variant(fmt.Sprintf("k%02d", k)).Member()
			counts = append(counts, count{"key " + vm, []any{"HGET", qk.KeyInflight(), vm}, ccKeyLimit})
		}
	}
	maxSampled := map[string]int64{}
	samples := 0
	wg.Go(func() {
		for work.Err() == nil {
			cmds := make([]*redis.Cmd, len(counts))
			_, err := c.Pipelined(work, func(p redis.Pipeliner) error {
				for i, k := range counts {
					cmds[i] = p.Do(work, k.cmd...)
				}
				return nil
			})
			if err != nil && !errors.Is(err, redis.Nil) {
				if work.Err() == nil {
					tr.fail("sampler: %v", err)
				}
				return
			}
			samples++
			for i, k := range counts {
				n, _ := cmds[i].Int64()
				if n > int64(k.limit) {
					tr.fail("in flight %s = %d, limit %d", k.name, n, k.limit)
				}
				kind, _, _ := strings.Cut(k.name, " ")
				maxSampled[kind] = max(maxSampled[kind], n)
			}
			time.Sleep(2 * time.Millisecond)
		}
	})

	// The monitor ends the work once every run has settled. Acks and dead
	// letters are final, so their sum only grows and reaching ccRuns is
	// exact, unlike queue lengths read one after another.
	wg.Go(func() {
		for work.Err() == nil {
			time.Sleep(20 * time.Millisecond)
			settled := int64(tr.ackedCount())
			for _, q := range ccQueues {
				n, err := c.ZCard(work, space.Env(q.env).Queue(q.queue).Dead()).Result()
				if err != nil {
					break
				}
				settled += n
			}
			if settled >= ccRuns {
				stop()
			}
		}
	})

	wg.Wait()
	produced.Wait()
	require.NoError(t, ctx.Err(), "the runs did not settle in time")
	require.Empty(t, tr.failures)
	for id := range tr.staleAcks {
		require.Equal(t, 1, tr.acked[id], "run %s: an old delivery's ack succeeded, so its latest delivery must have acked it", id)
	}
	for _, q := range ccQueues {
		s, err := b.q.QueueStats(b.ctx, q.env, q.queue)
		require.NoError(t, err)
		require.Equal(t, runqueue.Stats{Dead: s.Dead}, s, "%s/%s holds runs after the last settled", q.env, q.queue)
	}

	// Every run ended exactly once: acked, or dead-lettered after its last
	// attempt.
	dead := map[string]bool{}
	var want []string // the keys left: each queue's dead letters and runs, each env's dead counts
	envDead := map[string]bool{}
	for _, q := range ccQueues {
		d, err := b.q.DeadLetters(b.ctx, q.env, q.queue, 0, 10000)
		require.NoError(t, err)
		if len(d) > 0 {
			want = append(want, "dead", "runs")
			if !envDead[q.env] {
				envDead[q.env] = true
				want = append(want, "dead")
			}
		}
		for _, r := range d {
			require.False(t, dead[r.ID], "run %s dead twice", r.ID)
			dead[r.ID] = true
			require.Equal(t, ccMaxAttempts+1, r.Attempt, "run %s died early", r.ID)
			require.Equal(t, []byte(r.ID), r.Payload)
		}
	}
	for i := range ccRuns {
		id := ccRun(i).ID
		switch {
		case tr.acked[id] == 1:
			require.False(t, dead[id], "run %s acked and dead", id)
		case dead[id]:
		default:
			t.Fatalf("run %s neither acked nor dead (acks %d)", id, tr.acked[id])
		}
	}
	for id := range tr.nackDead {
		require.True(t, dead[id], "run %s dead-lettered by nack but not in the dead letters", id)
	}
	require.Len(t, tr.acked, ccRuns-len(dead))

	// Nothing is left but the dead letters: their runs hash (metadata and
	// payloads), the queues' dead sets and the envs' dead counts.
	var left []string
	for _, k := range b.keysUnder(t) {
		left = append(left, k[strings.LastIndex(k, ":")+1:])
	}
	sort.Strings(left)
	sort.Strings(want)
	require.Equal(t, want, left)

	t.Logf("%d deliveries, %d acked, %d dead (%d by nack), %d dropped, %d lost acks/nacks; %d samples; max in flight sampled %v, held by workers %v",
		tr.deliver, len(tr.acked), len(dead), len(tr.nackDead), tr.drops, tr.lost, samples, maxSampled, tr.maxInUse)
	// The limits were reached, so the test exercised them.
	require.Equal(t, int64(ccKeyLimit), maxSampled["key"])
	require.Positive(t, len(dead))
	require.Positive(t, tr.lost, "some late acks lost their lease")
}
