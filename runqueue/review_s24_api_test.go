package runqueue_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// Probe 24, operations the fairness oracle does not drive: Redrive,
// EnqueueMany of many new keys, coalesced concurrent Dequeue(1), the
// Worker (AckAndDequeue), and Stats after them. Real Redis, flag on.

func s24Setup(t *testing.T, mutate func(*runqueue.Config)) *testBundle {
	return setup(t, redistest.Real(t), func(c *runqueue.Config) {
		c.VtimeScheduling = true
		if mutate != nil {
			mutate(c)
		}
	})
}

func s24Enq(t *testing.T, b *testBundle, key string, n int, tag string) {
	t.Helper()
	var ps []runqueue.EnqueueParams
	for i := 0; i < n; i++ {
		ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: key, ID: fmt.Sprintf("%s-%s-%d", key, tag, i)})
		if len(ps) == 1000 || i == n-1 {
			res, err := b.q.EnqueueMany(b.ctx, ps)
			require.NoError(t, err)
			for _, r := range res {
				require.NoError(t, r.Err)
				require.True(t, r.Queued)
			}
			ps = nil
		}
	}
}

// maxOther: the most serves any single other key got in log[from:] before
// the first serve of k; -1 if k is not served.
func s24WaitOf(log []string, from int, k string) int {
	counts := map[string]int{}
	for i := from; i < len(log); i++ {
		if log[i] == k {
			m := 0
			for _, c := range counts {
				m = max(m, c)
			}
			return m
		}
		counts[log[i]]++
	}
	return -1
}

// TestS24RedriveIntoFlood: dead runs of key d are redriven, one at a
// time, into a queue where a flood key and two backlogged keys compete.
// A redrive is a newcomer registration (section 6): with equal weights d
// must be served within 3 serves per other active key (guarantee 10).
// Then PurgeDeadLetters and Stats are compared with the truth.
func TestS24RedriveIntoFlood(t *testing.T) {
	b := s24Setup(t, func(c *runqueue.Config) { c.MaxAttempts = 2 })
	s24Enq(t, b, "d", 6, "x")
	// kill d's runs: dequeue and dead-letter
	for {
		runs := dequeue(t, b, queueName, 10)
		if len(runs) == 0 {
			break
		}
		for _, r := range runs {
			res, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{DeadLetter: true})
			require.NoError(t, err)
			require.False(t, res.Requeued)
		}
	}
	require.EqualValues(t, 6, queueStats(t, b, queueName).Dead)
	s24Enq(t, b, "flood", 5000, "x")
	s24Enq(t, b, "a", 300, "x")
	s24Enq(t, b, "b", 300, "x")
	var log []string
	serve := func(n int) { log = s24Serve(t, b, log, n) }
	for i := 0; i < 20; i++ {
		serve(1)
	}
	worst := 0
	for i := 0; i < 4; i++ {
		from := len(log)
		require.NoError(t, b.q.Redrive(b.ctx, env, queueName, "d", fmt.Sprintf("d-x-%d", i)))
		for j := 0; j < 40; j++ {
			serve(1 + i%2)
		}
		w := s24WaitOf(log, from, "d")
		require.GreaterOrEqual(t, w, 0, "redriven run %d never served", i)
		worst = max(worst, w)
	}
	t.Logf("worst serves of one other key before a redriven key: %d", worst)
	require.LessOrEqual(t, worst, 3)
	// Stats: 2 dead runs left; purge them
	s := queueStats(t, b, queueName)
	require.EqualValues(t, 2, s.Dead)
	require.Zero(t, s.InFlight)
	n, err := b.q.PurgeDeadLetters(b.ctx, env, queueName, b.clock.Now().Add(time.Hour), 100)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	s = queueStats(t, b, queueName)
	require.Zero(t, s.Dead)
	ks, err := b.q.KeyStats(b.ctx, env, queueName, "flood")
	require.NoError(t, err)
	floodServed := 0
	for _, k := range log {
		if k == "flood" {
			floodServed++
		}
	}
	require.EqualValues(t, 5000-floodServed, ks.Ready)
	require.EqualValues(t, 5000-floodServed+300+300-countKey(log, "a")-countKey(log, "b"), s.Ready)
}

func countKey(log []string, k string) int {
	n := 0
	for _, x := range log {
		if x == k {
			n++
		}
	}
	return n
}

// TestS24EnqueueManyNewcomers: 300 one-run keys register in one
// EnqueueMany next to two backlogged keys. Newcomers together get the
// share of one key (section 6): a and b each keep at least a third of
// the serves (lag bound between a and the lane as one key: 2 serves), the
// newcomers are served in registration order (guarantee 10, ties), and a
// key h registered after the batch is served after every one of them.
func TestS24EnqueueManyNewcomers(t *testing.T) {
	b := s24Setup(t, nil)
	s24Enq(t, b, "a", 1000, "x")
	s24Enq(t, b, "b", 1000, "x")
	var log []string
	serve := func(n int) { log = s24Serve(t, b, log, n) }
	for i := 0; i < 10; i++ {
		serve(1)
	}
	var ps []runqueue.EnqueueParams
	for i := 0; i < 300; i++ {
		ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprintf("n%03d", 299-i), ID: fmt.Sprintf("n%d", i)})
	}
	res, err := b.q.EnqueueMany(b.ctx, ps)
	require.NoError(t, err)
	for _, r := range res {
		require.NoError(t, r.Err)
	}
	enqueue(t, b, runqueue.EnqueueParams{Key: "h", ID: "h"})
	from := len(log)
	for len(log)-from < 1000 && countKey(log[from:], "h") == 0 {
		serve(1 + (len(log) % 7))
	}
	window := log[from:]
	// registration order of the batch is its run order: n299, n298, ...
	next := 299
	na, nb, nn := 0, 0, 0
	for i, k := range window {
		switch k {
		case "a":
			na++
		case "b":
			nb++
		case "h":
			require.Equal(t, -1, next, "h served at %d before newcomer n%03d", i, next)
		default:
			require.Equal(t, fmt.Sprintf("n%03d", next), k, "newcomer order at serve %d", i)
			next--
			nn++
		}
		// lane as one key vs a and vs b: lag bound 1 + 1 (+1 for the
		// lane's head queuing one quantum behind)
		require.LessOrEqual(t, nn-na, 3, "newcomers ahead of a at serve %d", i)
		require.LessOrEqual(t, nn-nb, 3, "newcomers ahead of b at serve %d", i)
		require.LessOrEqual(t, na-nn, 3, "a ahead of newcomers at serve %d (newcomers waiting)", i)
	}
	t.Logf("window %d serves: a %d b %d newcomers %d", len(window), na, nb, nn)
	require.Equal(t, -1, next)
}

// TestS24CoalescedDequeueCaps: 24 goroutines call Dequeue(1) at once
// (coalesced into shared calls) and ack after a short hold, with env,
// queue and key limits. Observed in-flight counts (raised after Dequeue
// returns, lowered before Ack is sent, so never above the true ones) must
// stay within every cap; every run is served exactly once.
func TestS24CoalescedDequeueCaps(t *testing.T) {
	const keyLimit, queueLimit = 2, 7
	b := s24Setup(t, func(c *runqueue.Config) {
		c.KeyConcurrency = keyLimit
		c.QueueConcurrency = queueLimit
	})
	total := 0
	for i, n := range []int{1500, 50, 50, 20, 20, 10, 10, 5} {
		s24Enq(t, b, fmt.Sprintf("k%d", i), n, "x")
		total += n
	}
	var mu sync.Mutex
	perKey := map[string]int{}
	inQueue := 0
	seen := map[string]int{}
	var served atomic.Int64
	var violation atomic.Value
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for g := 0; g < 24; g++ {
		wg.Go(func() {
			empty := 0
			for ctx.Err() == nil && served.Load() < int64(total) && empty < 2000 {
				runs, err := b.q.Dequeue(ctx, env, queueName, 1)
				if err != nil {
					violation.Store(err.Error())
					return
				}
				if len(runs) == 0 {
					empty++
					time.Sleep(time.Millisecond)
					continue
				}
				for _, r := range runs {
					mu.Lock()
					perKey[r.Key]++
					inQueue++
					seen[r.ID]++
					if perKey[r.Key] > keyLimit {
						violation.Store(fmt.Sprintf("key %s has %d in flight", r.Key, perKey[r.Key]))
					}
					if inQueue > queueLimit {
						violation.Store(fmt.Sprintf("queue has %d in flight", inQueue))
					}
					if seen[r.ID] > 1 {
						violation.Store(fmt.Sprintf("run %s served twice", r.ID))
					}
					mu.Unlock()
				}
				time.Sleep(200 * time.Microsecond)
				for _, r := range runs {
					mu.Lock()
					perKey[r.Key]--
					inQueue--
					mu.Unlock()
					served.Add(1)
					if err := b.q.Ack(ctx, r); err != nil {
						violation.Store(err.Error())
					}
				}
			}
		})
	}
	wg.Wait()
	if v := violation.Load(); v != nil {
		t.Fatalf("violation: %v", v)
	}
	require.EqualValues(t, total, served.Load())
	require.Len(t, seen, total)
	s := queueStats(t, b, queueName)
	require.Zero(t, s.Ready+s.Delayed+s.InFlight+s.Dead, "%+v", s)
}

// TestS24WorkerCaps: a Worker (AckAndDequeue fetches, Concurrency 8)
// with key limit 1 and queue limit 5 on a flood plus light keys; handlers
// must never run more than the caps (handler start/end bracket the true
// in-flight window), and every run is handled once.
func TestS24WorkerCaps(t *testing.T) {
	const keyLimit, queueLimit = 1, 5
	b := s24Setup(t, func(c *runqueue.Config) {
		wallClock(c)
		c.KeyConcurrency = keyLimit
		c.QueueConcurrency = queueLimit
		c.LeaseDuration = time.Minute
	})
	total := 0
	for i, n := range []int{600, 40, 40, 40, 40, 40, 40} {
		s24Enq(t, b, fmt.Sprintf("k%d", i), n, "x")
		total += n
	}
	var mu sync.Mutex
	perKey := map[string]int{}
	inQ := 0
	seen := map[string]int{}
	var bad []string
	done := make(chan struct{})
	var count atomic.Int64
	w, err := runqueue.NewWorker(b.q, func(_ context.Context, r *runqueue.Run) error {
		mu.Lock()
		perKey[r.Key]++
		inQ++
		seen[r.ID]++
		if perKey[r.Key] > keyLimit || inQ > queueLimit || seen[r.ID] > 1 {
			bad = append(bad, fmt.Sprintf("%s: key %d queue %d seen %d", r.ID, perKey[r.Key], inQ, seen[r.ID]))
		}
		mu.Unlock()
		time.Sleep(100 * time.Microsecond)
		mu.Lock()
		perKey[r.Key]--
		inQ--
		mu.Unlock()
		if count.Add(1) == int64(total) {
			close(done)
		}
		return nil
	}, &runqueue.WorkerConfig{Queues: []runqueue.WorkerQueue{{Env: env, Queue: queueName}}, Concurrency: 8,
		SweepInterval: -1, Logger: quietLogger})
	require.NoError(t, err)
	require.NoError(t, w.Start(context.Background()))
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("worker handled %d of %d", count.Load(), total)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, w.Shutdown(ctx))
	require.Empty(t, bad)
	require.Len(t, seen, total)
	s := queueStats(t, b, queueName)
	require.Zero(t, s.Ready+s.Delayed+s.InFlight+s.Dead, "%+v", s)
}

// s24Serve makes one dequeue call of n, acks what it served and returns
// log with the served runs' keys appended.
func s24Serve(t *testing.T, b *testBundle, log []string, n int) []string {
	t.Helper()
	runs := dequeue(t, b, queueName, n)
	for _, r := range runs {
		log = append(log, r.Key)
	}
	ackAll(t, b, runs)
	return log
}
