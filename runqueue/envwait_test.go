package runqueue_test

import (
	"context"
	"fmt"
	"maps"
	"strconv"
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

// The queues of an env wait for its slots in turn (lua/lib/envwait.lua,
// layout 8): a flag-on dequeue leaves a slot its acks free to another
// queue of the env that found the env at its limit with ready runs, so a
// consumer that acks and takes in one call no longer takes back every slot
// while another queue waits for its backlog to drain.

func ewSetup(t *testing.T, c redis.UniversalClient, on bool, envLimit int) (*testBundle, string) {
	b := setup(t, c, func(cfg *runqueue.Config) {
		cfg.VtimeScheduling = on
		cfg.LimitsFor = func(string, string) runqueue.Limits { return runqueue.Limits{Env: envLimit} }
		cfg.BlockPollInterval = 30 * time.Second // (a mark lives 61 s: the tests' calls are well within it)
	})
	sp, err := keys.NewSpace(b.prefix, b.q.Shards())
	require.NoError(t, err)
	return b, sp.Env(env).Waiting()
}

// ewPeer is a second Queue on b's prefix with its own clock and poll
// interval (so its own mark life).
func ewPeer(t *testing.T, b *testBundle, clock *fakeClock, poll time.Duration, envLimit int) *runqueue.Queue {
	return s34NewQueue(t, b.client, b.prefix, func(cfg *runqueue.Config) {
		cfg.Clock, cfg.BlockPollInterval = clock, poll
		cfg.LimitsFor = func(string, string) runqueue.Limits { return runqueue.Limits{Env: envLimit} }
	})
}

// ewUntil is the live-until time (ms) of queue's mark.
func ewUntil(t *testing.T, b *testBundle, queue string) int64 {
	t.Helper()
	until, _, err := ewMarkOf(b, ewSpace(t, b), queue)
	require.NoError(t, err)
	return until
}

// ewMarkOf reads queue's mark, "till:limit" (layout 9): the time it lives
// until (ms) and the env limit of the call that wrote it. (No require: it
// may be called in a require.Eventually condition.)
func ewMarkOf(b *testBundle, space keys.Space, queue string) (until, limit int64, err error) {
	v, err := b.client.HGet(b.ctx, space.Env(env).WaitingUntil(), keys.QueueMember(env, queue)).Result()
	if err != nil {
		return 0, 0, err
	}
	a, l, ok := strings.Cut(v, ":")
	if !ok {
		return 0, 0, fmt.Errorf("mark %q is not till:limit", v)
	}
	if until, err = strconv.ParseInt(a, 10, 64); err == nil {
		limit, err = strconv.ParseInt(l, 10, 64)
	}
	return until, limit, err
}

// ewMarked says whether queue is in its env's waiting line.
func ewMarked(t *testing.T, b *testBundle, queue string) bool {
	t.Helper()
	err := b.client.ZScore(b.ctx, ewSpace(t, b).Env(env).Waiting(), keys.QueueMember(env, queue)).Err()
	if err == redis.Nil {
		return false
	}
	require.NoError(t, err)
	return true
}

func ewSpace(t *testing.T, b *testBundle) keys.Space {
	sp, err := keys.NewSpace(b.prefix, b.q.Shards())
	require.NoError(t, err)
	return sp
}

// ewServerMs is Redis's clock (TIME), in ms: the marks' clock.
func ewServerMs(t *testing.T, b *testBundle) int64 {
	t.Helper()
	if cc, ok := b.client.(*redis.ClusterClient); ok {
		// (the node that holds the env's keys)
		sp, err := keys.NewSpace(b.prefix, b.q.Shards())
		require.NoError(t, err)
		n, err := cc.MasterForKey(b.ctx, sp.Env(env).Waiting())
		require.NoError(t, err)
		tm, err := n.Time(b.ctx).Result()
		require.NoError(t, err)
		return tm.UnixMilli()
	}
	tm, err := b.client.Time(b.ctx).Result()
	require.NoError(t, err)
	return tm.UnixMilli()
}

func ewEnqueue(t *testing.T, b *testBundle, queue string, n int) {
	t.Helper()
	for i := range n {
		_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: queue, Key: "k", ID: fmt.Sprintf("%s-%03d", queue, i)})
		require.NoError(t, err)
		b.clock.Advance(time.Millisecond)
	}
}

func ewTake(t *testing.T, b *testBundle, acks []*runqueue.Run, queue string) []*runqueue.Run {
	t.Helper()
	runs, errs, err := b.q.AckAndDequeue(b.ctx, acks, env, queue, 1)
	require.NoError(t, err)
	for _, e := range errs {
		require.NoError(t, e)
	}
	return runs
}

// TestEnvWaitingSlotLeft: env limit 1, queue qa with a backlog, qb with
// one run. Flag on, qa's fused ack leaves the slot to qb, which found the
// env full; qa then waits its turn behind qb; once qb has nothing more,
// qa takes again and the waiting hash is gone. Flag off (pinned, age
// order per queue) qa takes the slot back.
func TestEnvWaitingSlotLeft(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		for _, on := range []bool{false, true} {
			t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
				b, waiting := ewSetup(t, c, on, 1)
				ewEnqueue(t, b, "qa", 5)
				ewEnqueue(t, b, "qb", 1)
				a := ewTake(t, b, nil, "qa")
				require.Len(t, a, 1)
				require.Empty(t, ewTake(t, b, nil, "qb"), "the env is at its limit")
				a2 := ewTake(t, b, a, "qa")
				if !on {
					require.Len(t, a2, 1, "flag off, the fused call takes its slot back")
					require.Zero(t, b.client.Exists(b.ctx, waiting, ewSpace(t, b).Env(env).WaitingUntil()).Val(), "flag off writes no waiting mark")
					return
				}
				require.Empty(t, a2, "the slot qa's ack freed is left to qb, which waits")
				require.True(t, ewMarked(t, b, "qb"))
				bb := ewTake(t, b, nil, "qb")
				require.Len(t, bb, 1)
				require.Equal(t, "qb-000", bb[0].ID)
				require.Empty(t, ewTake(t, b, nil, "qa"), "the env is at its limit")
				require.Empty(t, ewTake(t, b, bb, "qb"), "qb has nothing more")
				require.False(t, ewMarked(t, b, "qb"), "qb's mark is dropped")
				a3 := ewTake(t, b, nil, "qa")
				require.Len(t, a3, 1)
				require.Equal(t, "qa-001", a3[0].ID)
				require.Zero(t, b.client.Exists(b.ctx, waiting, ewSpace(t, b).Env(env).WaitingUntil()).Val(), "no queue waits")
			})
		}
	})
}

// TestEnvWaitingMarkLapses: a waiting queue whose consumer is gone holds
// nothing back once its mark's life (2 x BlockPollInterval + 1 s, by
// Redis's clock, TIME) is over: the consumer of qb has a poll of 1 ms (a
// life of 1.002 s); the test waits until Redis's clock is past the mark's
// until, and qa's fused call takes its slot back and drops the mark.
func TestEnvWaitingMarkLapses(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b, _ := ewSetup(t, c, true, 1)
		quick := ewPeer(t, b, b.clock, time.Millisecond, 1)
		ewEnqueue(t, b, "qa", 3)
		ewEnqueue(t, b, "qb", 1)
		a := ewTake(t, b, nil, "qa")
		require.Len(t, a, 1)
		before := ewServerMs(t, b)
		r, err := quick.Dequeue(b.ctx, env, "qb", 1)
		require.NoError(t, err)
		require.Empty(t, r, "the env is full")
		after := ewServerMs(t, b)
		until := ewUntil(t, b, "qb")
		life := int64(1002)
		require.GreaterOrEqual(t, until, before+life, "the mark lives its life by Redis's clock")
		require.LessOrEqual(t, until, after+life)
		for ewServerMs(t, b) <= until {
			time.Sleep(50 * time.Millisecond)
		}
		a2 := ewTake(t, b, a, "qa")
		require.Len(t, a2, 1, "qb's mark lapsed")
		require.False(t, ewMarked(t, b, "qb"), "the lapsed mark is dropped")
	})
}

// TestEnvWaitingTurns: env limit 2, three queues with backlogs, each
// consumer acking and taking one run a call in turn. Flag on, every
// queue's serves in any window of calls stay within one of the others'
// (the slots go round); flag off, the third queue is never served while
// the first two have runs.
func TestEnvWaitingTurns(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		for _, on := range []bool{false, true} {
			t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
				b, _ := ewSetup(t, c, on, 2)
				qs := []string{"qa", "qb", "qc"}
				for _, q := range qs {
					ewEnqueue(t, b, q, 20)
				}
				held := map[string][]*runqueue.Run{}
				served := map[string]int{}
				var order []string
				for range 10 {
					for _, q := range qs {
						runs := ewTake(t, b, held[q], q)
						held[q] = runs
						for range runs {
							served[q]++
							order = append(order, q)
						}
					}
				}
				t.Logf("serve order: %v", order)
				if !on {
					require.Zero(t, served["qc"], "flag off, the fused calls of qa and qb take their slots back")
					return
				}
				lo, hi := served["qa"], served["qa"]
				for _, q := range qs {
					lo, hi = min(lo, served[q]), max(hi, served[q])
				}
				require.LessOrEqual(t, hi-lo, 1, "served %v", served)
				require.GreaterOrEqual(t, lo, 3, "served %v", served)
			})
		}
	})
}

// ewFloodWorker runs a flag-on Worker (Concurrency conc) over a queue
// "flood" of n runs and the light queues of an env with a limit of
// envLimit, BlockPollInterval a minute (so that only the wake-up a dequeue
// publishes when it leaves a slot can bring a light queue's fetch early);
// once 10 flood runs are served each light queue gets one run. It returns,
// per light queue, how many flood runs were served before its run.
func ewFloodWorker(t *testing.T, c redis.UniversalClient, envLimit, n int, light []string, conc int) map[string]int64 {
	b := setup(t, c, func(cfg *runqueue.Config) {
		cfg.VtimeScheduling = true
		cfg.BlockPollInterval = time.Minute
		cfg.LimitsFor = func(string, string) runqueue.Limits { return runqueue.Limits{Env: envLimit} }
	})
	ewEnqueue(t, b, "flood", n)
	var floodDone atomic.Int64
	var mu sync.Mutex
	at := map[string]int64{}
	all := make(chan struct{})
	tenth := make(chan struct{})
	var once, onceAll sync.Once
	h := func(_ context.Context, r *runqueue.Run) error {
		if r.Queue != "flood" {
			mu.Lock()
			at[r.Queue] = floodDone.Load()
			if len(at) == len(light) {
				onceAll.Do(func() { close(all) })
			}
			mu.Unlock()
			return nil
		}
		if floodDone.Add(1) == 10 {
			once.Do(func() { close(tenth) })
		}
		return nil
	}
	qs := []runqueue.WorkerQueue{{Env: env, Queue: "flood"}}
	for _, q := range light {
		qs = append(qs, runqueue.WorkerQueue{Env: env, Queue: q})
	}
	startWorker(t, b.q, h, func(cfg *runqueue.WorkerConfig) {
		cfg.Queues = qs
		cfg.Concurrency = conc
	})
	select {
	case <-tenth:
	case <-time.After(time.Minute):
		t.Fatal("the flood is not served")
	}
	for _, q := range light {
		_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: q, Key: "k", ID: "r"})
		require.NoError(t, err)
	}
	select {
	case <-all:
	case <-time.After(2 * time.Minute):
		t.Fatal("the light runs are not all served")
	}
	mu.Lock()
	defer mu.Unlock()
	return maps.Clone(at)
}

// TestEnvWaitingWorker: env limit 1, a flood of 400 runs and one other
// queue, a Worker over both: a run enqueued into the other after 10 flood
// serves is served long before the flood drains (the first version of the
// library: after all 400).
func TestEnvWaitingWorker(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		at := ewFloodWorker(t, c, 1, 400, []string{"qb"}, 2)["qb"]
		t.Logf("qb's run served after %d of the flood's 400", at)
		require.Less(t, at, int64(200), "qb's run waited for the flood")
	})
}

// TestEnvWaitingPreview: Preview and Schedule count the env's free slots
// left to the queues waiting ahead (envAhead): env limit 2, three queues
// with backlogs, each consumer acking apart (AckMany) and then dequeuing
// one run, in turn; before each dequeue, Preview of one run names the run
// the dequeue then takes, or none when it takes none, and Schedule says
// "queue or env at its limit" exactly when it takes none.
func TestEnvWaitingPreview(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b, _ := ewSetup(t, c, true, 2)
		qs := []string{"qa", "qb", "qc"}
		for _, q := range qs {
			ewEnqueue(t, b, q, 12)
		}
		held := map[string][]*runqueue.Run{}
		served := map[string]int{}
		for range 8 {
			for _, q := range qs {
				errs, err := b.q.AckMany(b.ctx, held[q])
				require.NoError(t, err)
				for _, e := range errs {
					require.NoError(t, e)
				}
				p, err := b.q.Preview(b.ctx, env, q, 1)
				require.NoError(t, err)
				sc, err := b.q.Schedule(b.ctx, env, q, 1)
				require.NoError(t, err)
				require.Len(t, sc.Keys, 1)
				runs, err := b.q.Dequeue(b.ctx, env, q, 1)
				require.NoError(t, err)
				held[q] = runs
				if len(runs) == 0 {
					require.Empty(t, p, "%s", q)
					require.Equal(t, "queue or env at its limit", sc.Keys[0].Reason, "%s", q)
					continue
				}
				served[q]++
				require.Len(t, p, 1, "%s", q)
				require.Equal(t, runs[0].ID, p[0].ID, "%s", q)
				require.Empty(t, sc.Keys[0].Reason, "%s", q)
			}
		}
		t.Logf("served %v", served)
		lo, hi := served["qa"], served["qa"]
		for _, q := range qs {
			lo, hi = min(lo, served[q]), max(hi, served[q])
		}
		require.LessOrEqual(t, hi-lo, 1, "served %v", served)
		require.GreaterOrEqual(t, lo, 3, "served %v", served)
	})
}

// TestEnvWaitingWorkerManyQueues: env limit 5, a flood of 2,000 runs and
// 49 other queues, a Worker (Concurrency 10) over all: every light run is
// served long before the flood drains (flag off, or before layout 8, some
// were served only after the flood's 2,000: helper-180).
func TestEnvWaitingWorkerManyQueues(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		var light []string
		for i := range 49 {
			light = append(light, fmt.Sprintf("l%02d", i))
		}
		at := ewFloodWorker(t, c, 5, 2000, light, 10)
		last := int64(0)
		for _, n := range at {
			last = max(last, n)
		}
		t.Logf("the last light run served after %d of the flood's 2,000", last)
		require.Less(t, last, int64(1000), "a light queue waited for the flood: %v", at)
	})
}
