package runqueue_test

import (
	"context"
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// TestS28FMixedConcurrentCap: a rollout in progress. Two flag-on and two
// flag-off workers serve one queue at the same time (real clock, real
// Redis), 2,000 keys with unequal weights and priorities, key limit 2,
// while a producer keeps enqueueing (some runs delayed, some with a short
// TTL that a sweeper expires) and weights change. Workers hold each run a
// few milliseconds, then ack or nack it (at once or after 20 ms).
//
// Measured: no run is held by two workers at once (guarantee 7); no key
// holds more than its limit (the count kept here rises after a dequeue
// returns and falls before the ack or nack is sent, so it never exceeds
// the server's: a count past the limit is a real excess); every run ends
// once; at the end every queued run is served (no key left behind).
func TestS28FMixedConcurrentCap(t *testing.T) {
	c := redistest.Real(t)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	const limit = 2
	on, off := s28fPair(t, c, runqueue.Config{Prefix: prefix, KeyConcurrency: limit, MaxAttempts: -1, LeaseDuration: time.Minute, MaxWeightOverrides: 5000})
	const nKeys = 2000
	key := func(i int) string { return fmt.Sprintf("k%04d", i) }
	for i := 0; i < nKeys; i += 7 {
		require.NoError(t, on.SetWeight(ctx, s28fEnv, s28fQueue, key(i), []float64{0.1, 0.5, 2, 5}[i%4]))
	}

	var mu sync.Mutex
	perKey := map[string]int{}
	inFlight := map[string]bool{}
	acked := map[string]int{}
	enqueued := map[string]bool{}
	var viol []string
	note := func(s string) {
		if len(viol) < 10 {
			viol = append(viol, s)
		}
	}
	produce := func(rng *rand.Rand, n int, tag string) {
		ps := make([]runqueue.EnqueueParams, 0, n)
		for j := 0; j < n; j++ {
			p := runqueue.EnqueueParams{Env: s28fEnv, Queue: s28fQueue, Key: key(rng.Intn(nKeys)),
				ID: fmt.Sprintf("%s-%d", tag, j), Payload: []byte("x"), Priority: rng.Intn(10)}
			if rng.Intn(5) == 0 {
				p.Delay = time.Duration(rng.Intn(200)) * time.Millisecond
			}
			ps = append(ps, p)
		}
		_, err := on.EnqueueMany(ctx, ps)
		require.NoError(t, err)
		mu.Lock()
		for _, p := range ps {
			enqueued[p.ID] = true
		}
		mu.Unlock()
	}
	produce(rand.New(rand.NewSource(0)), 1000, "init0")
	produce(rand.New(rand.NewSource(1)), 1000, "init1")
	produce(rand.New(rand.NewSource(2)), 1000, "init2")

	stop := make(chan struct{})
	var wg sync.WaitGroup
	worker := func(q *runqueue.Queue, seed int64) {
		defer wg.Done()
		rng := rand.New(rand.NewSource(seed))
		for {
			select {
			case <-stop:
				return
			default:
			}
			runs, err := q.Dequeue(ctx, s28fEnv, s28fQueue, 1+rng.Intn(20))
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			for _, r := range runs {
				if inFlight[r.ID] {
					note(fmt.Sprintf("run %s delivered while held", r.ID))
				}
				inFlight[r.ID] = true
				perKey[r.Key]++
				if perKey[r.Key] > limit {
					note(fmt.Sprintf("key %q holds %d > %d", r.Key, perKey[r.Key], limit))
				}
			}
			mu.Unlock()
			if len(runs) == 0 {
				time.Sleep(2 * time.Millisecond)
				continue
			}
			time.Sleep(time.Duration(rng.Intn(4)) * time.Millisecond)
			for _, r := range runs {
				mu.Lock()
				delete(inFlight, r.ID)
				perKey[r.Key]--
				mu.Unlock()
				var err error
				if rng.Intn(5) == 0 {
					_, err = q.Nack(ctx, r, &runqueue.NackOptions{RetryAt: time.Now().Add(time.Duration(rng.Intn(2)) * 20 * time.Millisecond)})
				} else {
					err = q.Ack(ctx, r)
					mu.Lock()
					acked[r.ID]++
					mu.Unlock()
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}
	}
	for i, q := range []*runqueue.Queue{on, on, off, off} {
		wg.Add(1)
		go worker(q, int64(10+i))
	}
	rng := rand.New(rand.NewSource(99))
	deadline := time.Now().Add(6 * time.Second)
	for round := 0; time.Now().Before(deadline); round++ {
		produce(rng, 200, fmt.Sprintf("p%d", round))
		if round%5 == 0 {
			k := key(rng.Intn(nKeys/7) * 7)
			require.NoError(t, on.SetWeight(ctx, s28fEnv, s28fQueue, k, []float64{0.1, 1, 3}[rng.Intn(3)]))
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Let the workers drain what is left.
	for wait := 0; wait < 200; wait++ {
		st, err := on.QueueStats(ctx, s28fEnv, s28fQueue)
		require.NoError(t, err)
		mu.Lock()
		done := len(acked) == len(enqueued)
		mu.Unlock()
		if done {
			break
		}
		_ = st
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	twice := 0
	for _, n := range acked {
		if n > 1 {
			twice++
		}
	}
	t.Logf("%d runs enqueued, %d acked, %d acked twice", len(enqueued), len(acked), twice)
	require.Empty(t, viol)
	require.Zero(t, twice, "runs acked twice")
	require.Equal(t, len(enqueued), len(acked), "runs left unserved after the drain")
}
