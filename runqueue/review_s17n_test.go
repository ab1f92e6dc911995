package runqueue_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
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

// Reviewer s17n: one node of a Redis Cluster restarted under a live
// ClusterClient, Worker and DequeueShardWait waiters (data kept, data
// lost), and CLIENT PAUSE on a single server under calls with deadlines
// and a Worker. Each test starts its own redis-servers (s17Spawn).

// s17nClusterArgs: cluster mode, every acknowledged write persisted (so a
// SIGKILL keeps it), a node timeout long enough that a short restart is
// never a FAIL.
var s17nClusterArgs = []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
	"--cluster-node-timeout", "5000", "--appendonly", "yes", "--appendfsync", "always"}

// s17nCluster forms a 3-master cluster of servers of the test's own.
func s17nCluster(t *testing.T) []*s17Server {
	t.Helper()
	srvs := make([]*s17Server, 3)
	for i := range srvs {
		srvs[i] = s17Spawn(t, s17nClusterArgs...)
	}
	ctx := context.Background()
	for i, s := range srvs {
		a := s.admin()
		require.NoError(t, a.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err())
		require.NoError(t, a.ClusterAddSlotsRange(ctx, i*16384/3, (i+1)*16384/3-1).Err())
	}
	a0 := srvs[0].admin()
	for _, s := range srvs[1:] {
		require.NoError(t, a0.ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(s.port)).Err())
	}
	for _, s := range srvs {
		s17nClusterOK(t, s, 3)
	}
	return srvs
}

// s17nClusterOK waits until s reports cluster_state:ok, knows n nodes and
// every slot.
// s17nClient is a cluster client of srvs, closed when t ends.
func s17nClient(t *testing.T, srvs []*s17Server) *redis.ClusterClient {
	addrs := make([]string, len(srvs))
	for i, s := range srvs {
		addrs[i] = s.addr
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

func s17nClusterOK(t *testing.T, s *s17Server, n int) {
	t.Helper()
	a := redis.NewClient(&redis.Options{Addr: s.addr, MaxRetries: -1})
	defer func() { _ = a.Close() }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := a.ClusterInfo(context.Background()).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") &&
			strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(n)) &&
			strings.Contains(info, "cluster_slots_ok:16384") {
			return
		}
		require.True(t, time.Now().Before(deadline), "%s: cluster not ok: %v %s", s.addr, err, info)
		time.Sleep(20 * time.Millisecond)
	}
}

// s17nTally counts the deliveries of each run id.
type s17nTally struct {
	mu  sync.Mutex
	got map[string]int
}

func (t *s17nTally) add(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.got == nil {
		t.got = map[string]int{}
	}
	t.got[id]++
}

func (t *s17nTally) count(id string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.got[id]
}

func (t *s17nTally) dups() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for id, n := range t.got {
		if n > 1 {
			out = append(out, fmt.Sprintf("%s x%d", id, n))
		}
	}
	return out
}

// s17nEnvOn finds an env whose shard lives on node addr (want true) or
// elsewhere (want false), and not on shard avoid.
func s17nEnvOn(t *testing.T, ctx context.Context, c redis.UniversalClient, q *runqueue.Queue, space keys.Space, addr string, want bool, avoid ...int) string {
	t.Helper()
next:
	for i := range 1000 {
		e := "e" + strconv.Itoa(i)
		sh := q.ShardOf(e)
		for _, a := range avoid {
			if sh == a {
				continue next
			}
		}
		n, err := redistest.NodeOf(ctx, c, space.Shard(sh).Wake())
		require.NoError(t, err)
		if (n == addr) == want {
			return e
		}
	}
	t.Fatal("no env found")
	return ""
}

// TestS17NClusterNodeRestart: a 3-master cluster; a Worker serves two
// shards (one on the node restarted, one elsewhere), a DequeueShardWait
// loop a third shard on the node restarted, a producer enqueues all the
// while. The node restarted is the one whose slot the waker's SUBSCRIBE
// went to. First a restart with its AOF kept: every run whose Enqueue
// succeeded is delivered exactly once (or, served by a fetch whose reply
// the kill cut short, waits in flight for its lease), and the Worker and
// the waiter are
// woken by pub/sub again (their poll fallbacks are a minute away). Then a
// restart with the data lost (AOF and RDB gone, nodes.conf kept: the same
// node, the same slots, no keys, no Functions library): calls recover, the
// library is loaded again on that node, nothing is delivered twice.
func TestS17NClusterNodeRestart(t *testing.T) {
	t.Parallel() // servers of its own (spawned for it), and no tight wall-clock bound
	s17Flags(t, func(t *testing.T, on bool) {
		srvs := s17nCluster(t)
		ctx := context.Background()
		cc := s17nClient(t, srvs)
		b := setup(t, cc, func(cfg *runqueue.Config) { cfg.VtimeScheduling = on; cfg.Clock = nil })
		q := b.q
		space := keySpace(t, b)
		victimAddr, err := redistest.NodeOf(ctx, cc, space.Shard(0).Wake())
		require.NoError(t, err)
		var victim *s17Server
		for _, s := range srvs {
			if s.addr == victimAddr {
				victim = s
			}
		}
		require.NotNil(t, victim)
		envV := s17nEnvOn(t, ctx, cc, q, space, victimAddr, true)
		envO := s17nEnvOn(t, ctx, cc, q, space, victimAddr, false)
		envW := s17nEnvOn(t, ctx, cc, q, space, victimAddr, true, q.ShardOf(envV))
		shardW := q.ShardOf(envW)

		var tally s17nTally
		var handled atomic.Int64
		w, err := runqueue.NewWorker(q, func(ctx context.Context, r *runqueue.Run) error {
			tally.add(r.ID)
			handled.Add(1)
			time.Sleep(time.Duration(rand.N(10)) * time.Millisecond)
			return nil
		}, &runqueue.WorkerConfig{Shards: []int{q.ShardOf(envV), q.ShardOf(envO)}, Concurrency: 8,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		require.NoError(t, err)
		require.NoError(t, w.Start(context.WithoutCancel(ctx)))
		t.Cleanup(func() {
			sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			_ = w.Shutdown(sctx)
		})

		// The waiter: DequeueShardWait on shardW in a loop, acking what it gets.
		wctx, wcancel := context.WithCancel(ctx)
		var waitErrs atomic.Int64
		waiterDone := make(chan struct{})
		go func() {
			defer close(waiterDone)
			for wctx.Err() == nil {
				runs, err := q.DequeueShardWait(wctx, shardW, 1, time.Minute)
				if err != nil {
					waitErrs.Add(1)
					time.Sleep(50 * time.Millisecond)
				}
				for _, r := range runs {
					tally.add(r.ID)
					for q.Ack(wctx, r) != nil && wctx.Err() == nil {
						time.Sleep(50 * time.Millisecond)
					}
				}
			}
		}()
		t.Cleanup(func() { wcancel(); <-waiterDone })

		var seq atomic.Int64
		enq := func(ctx context.Context, e, queue string) (string, error) {
			id := fmt.Sprintf("%s-%d", e, seq.Add(1))
			ok, err := q.Enqueue(ctx, runqueue.EnqueueParams{Env: e, Queue: queue, ID: id, Payload: []byte("x")})
			if err == nil && !ok {
				err = errors.New("not new")
			}
			return id, err
		}
		// live: a run on each of the three shards is delivered within 8s
		// (the Worker's fetch backoff after failures is at most ~7.5s);
		// with the poll fallbacks a minute away, only pub/sub does that.
		live := func(phase string) {
			t.Helper()
			var ids []string
			for _, e := range []string{envV, envO, envW} {
				var id string
				var err error
				deadline := time.Now().Add(8 * time.Second)
				for {
					ectx, cancel := context.WithTimeout(ctx, time.Second)
					id, err = enq(ectx, e, "live")
					cancel()
					if err == nil || time.Now().After(deadline) {
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
				require.NoError(t, err, "%s: enqueue on %s never recovered", phase, e)
				ids = append(ids, id)
			}
			require.Eventually(t, func() bool {
				for _, id := range ids {
					if tally.count(id) == 0 {
						return false
					}
				}
				return true
			}, 8*time.Second, 10*time.Millisecond, "%s: runs %v not delivered (shards on the restarted node: %d, %d)", phase, ids, q.ShardOf(envV), shardW)
		}
		// produce enqueues until stop, returning the ids that succeeded.
		produce := func(stop <-chan struct{}) (ok, failed []string) {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return ok, failed
				default:
				}
				e := []string{envV, envO, envW}[i%3]
				ectx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
				id, err := enq(ectx, e, "p")
				cancel()
				if err == nil {
					ok = append(ok, id)
				} else {
					failed = append(failed, id)
					time.Sleep(20 * time.Millisecond)
				}
				time.Sleep(2 * time.Millisecond)
			}
		}
		restart := func(lose bool) (ok, failed []string) {
			stop := make(chan struct{})
			type res struct{ ok, failed []string }
			done := make(chan res, 1)
			go func() { o, f := produce(stop); done <- res{o, f} }()
			time.Sleep(200 * time.Millisecond)
			victim.kill()
			if lose {
				require.NoError(t, os.RemoveAll(filepath.Join(victim.dir, "appendonlydir")))
				_ = os.Remove(filepath.Join(victim.dir, "dump.rdb"))
			}
			time.Sleep(300 * time.Millisecond)
			victim.start(s17nClusterArgs...)
			s17nClusterOK(t, victim, 3)
			time.Sleep(300 * time.Millisecond)
			close(stop)
			r := <-done
			return r.ok, r.failed
		}

		live("before")

		// 1. Restart with the data kept.
		okIDs, failedIDs := restart(false)
		t.Logf("kept: %d enqueued, %d refused, %d waiter errors", len(okIDs), len(failedIDs), waitErrs.Load())
		require.NotEmpty(t, failedIDs, "the outage was not seen")
		live("after a restart with the data kept")
		// A fetch the kill cut short may have been run and kept (the AOF)
		// with its reply lost: its runs are in flight for nobody until
		// their lease passes (one test run in about eight), and lease
		// recovery gives them back. So every run whose Enqueue succeeded
		// is delivered, or is one of those: once the queues are quiet, the
		// runs not delivered of each queue are exactly its runs in flight.
		require.Eventually(t, func() bool {
			missing := map[string]int64{}
			for _, id := range okIDs {
				if tally.count(id) == 0 {
					missing[id[:strings.LastIndex(id, "-")]]++
				}
			}
			for e, n := range missing {
				st, err := q.QueueStats(ctx, e, "p")
				if err != nil || st.Ready+st.Delayed > 0 || st.InFlight != n {
					return false
				}
			}
			return true
		}, 8*time.Second, 20*time.Millisecond, "runs enqueued before/around the restart (data kept) never delivered: %s",
			s17nLazy(func() string { return s17nMissing(t, q, &tally, okIDs) }))
		require.Empty(t, tally.dups(), "runs delivered twice (data kept)")

		// 2. Restart with the data lost.
		va := victim.admin()
		_, _ = restart(true)
		if on {
			libs, err := va.FunctionList(ctx, redis.FunctionListQuery{}).Result()
			require.NoError(t, err)
			_ = libs // may have been reloaded by a call already
		}
		live("after a restart with the data lost")
		if on {
			libs, err := va.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: "runqueue_*"}).Result()
			require.NoError(t, err)
			require.Len(t, libs, 1, "the library is not loaded again on the restarted node")
		}
		// Calls keep working: a burst on the node restarted.
		var burst []string
		for range 30 {
			id, err := enq(ctx, envV, "burst")
			require.NoError(t, err)
			burst = append(burst, id)
		}
		require.Eventually(t, func() bool {
			for _, id := range burst {
				if tally.count(id) == 0 {
					return false
				}
			}
			return true
		}, 5*time.Second, 10*time.Millisecond)
		time.Sleep(100 * time.Millisecond)
		require.Empty(t, tally.dups(), "runs delivered twice (data lost)")
	})
}

// TestS17NTokenAfterDataLoss: a holder of a delivery from before its
// server lost its data (a restart without persistence, a failover to a
// replica behind) must not act on a delivery made after it: Run.Token
// "identifies this delivery" and the shards' token counters "live for
// ever by design (a token never repeats)".
//
// DEFECT (fixed since: a counter found missing starts at the call's time
// in microseconds): the token counter is one key of the shard
// (keys.Shard.Tokens), lost with the data; it started again at 1, so the first deliveries after
// the loss repeat the tokens of the deliveries before it. A producer that
// re-enqueues the lost runs (the same ids) gets them delivered under
// tokens a stale holder still has: the stale holder's Nack requeues the
// new holder's run (delivered again while the new holder runs it: two
// concurrent deliveries), its Ack removes it, its ExtendLease extends it.
// Fix: seed the counter when it is missing (INCRBY answered n), e.g. at
// the server's TIME in microseconds (below 2^53 until year 2255), so a
// token after a loss is above every token before it.
func TestS17NTokenAfterDataLoss(t *testing.T) {
	s17Flags(t, func(t *testing.T, on bool) {
		srv := s17Spawn(t)
		c := redis.NewClient(&redis.Options{Addr: srv.addr})
		t.Cleanup(func() { _ = c.Close() })
		b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = on; cfg.Clock = nil })
		ctx := b.ctx
		enqueue(t, b, runqueue.EnqueueParams{ID: "x", Payload: []byte("x")})
		stale := dequeue(t, b, queueName, 1) // consumer A, whose handler is slow
		require.Len(t, stale, 1)

		srv.kill() // data lost: no RDB, no AOF
		srv.start()

		// The producer enqueues the run again; consumer B gets it.
		enqueue(t, b, runqueue.EnqueueParams{ID: "x", Payload: []byte("x")})
		fresh := dequeue(t, b, queueName, 1)
		require.Len(t, fresh, 1)
		t.Logf("stale token %d, fresh token %d", stale[0].Token, fresh[0].Token)

		// A's handler fails: its Nack must not touch B's delivery.
		_, err := b.q.Nack(ctx, stale[0], &runqueue.NackOptions{RetryAt: time.Now()})
		again := dequeue(t, b, queueName, 1)
		require.Empty(t, runIDs(again), "the run B holds was delivered again (stale Nack err=%v)", err)
		require.Error(t, err, "a Nack of a delivery from before the data loss acted on the new delivery")
		require.NotEqual(t, stale[0].Token, fresh[0].Token, "a delivery token repeated")
	})
}

// TestS17NClientPause: CLIENT PAUSE (WRITE, then ALL, 1.5s each) on a
// single server while producers Enqueue and a consumer Dequeues and Acks
// with 80ms deadlines (client with ContextTimeoutEnabled, so a deadline
// bounds a call once sent), and a Worker serves another queue. Every call
// must end by its deadline (+ slack); every run whose Enqueue succeeded is
// delivered exactly once to a caller; a Dequeue whose reply its deadline
// cut short may have served runs nobody holds (once in about ten runs of
// this test: Redis ran it as the pause ended), which lease recovery gives
// back, so nothing is left in flight after it; the Worker serves after
// the pauses.
func TestS17NClientPause(t *testing.T) {
	s17Flags(t, func(t *testing.T, on bool) {
		srv := s17Spawn(t)
		admin := srv.admin()
		c := redis.NewClient(&redis.Options{Addr: srv.addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		b := setup(t, c, func(cfg *runqueue.Config) {
			cfg.VtimeScheduling = on
			cfg.Clock = nil
			cfg.LeaseDuration = time.Second
		})
		ctx := b.ctx
		q := b.q
		const deadline = 80 * time.Millisecond
		// A call that outlives its deadline by waiting out a pause takes up
		// to the pause (1.5s): the slack stays well below it, and leaves
		// 1.1s for the stalls of a loaded machine (the pauses were 300ms
		// and the slack 250ms, which a stall of the calling goroutine
		// could exceed).
		const pause, slack = 1500, 1100 * time.Millisecond

		var tally s17nTally
		w, err := runqueue.NewWorker(q, func(ctx context.Context, r *runqueue.Run) error {
			tally.add(r.ID)
			return nil
		}, &runqueue.WorkerConfig{Queues: []runqueue.WorkerQueue{{Env: env, Queue: "wq"}}, Concurrency: 4,
			// No sweeps: a pause (1.5s) outlasts the lease (1s), so a sweep
			// the Worker sent during a pause runs when it ends, before the
			// consumer's next ack, and rightly takes back the run that ack
			// is for (ErrNotInFlight: with sweeps every 300ms, 3 refusals in
			// 2 runs). The test recovers leases itself at the end.
			SweepInterval: -1,
			Logger:        slog.New(slog.NewTextHandler(io.Discard, nil))})
		require.NoError(t, err)
		require.NoError(t, w.Start(context.WithoutCancel(ctx)))
		t.Cleanup(func() {
			sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			_ = w.Shutdown(sctx)
		})

		var mu sync.Mutex
		var okIDs, failedIDs, slow []string
		late := func(what string, start time.Time) {
			if d := time.Since(start); d > deadline+slack {
				mu.Lock()
				slow = append(slow, fmt.Sprintf("%s took %v", what, d))
				mu.Unlock()
			}
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for p := range 2 {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					queue := []string{"pq", "wq"}[i%2]
					id := fmt.Sprintf("p%d-%d", p, i)
					cctx, cancel := context.WithTimeout(ctx, deadline)
					start := time.Now()
					ok, err := q.Enqueue(cctx, runqueue.EnqueueParams{Env: env, Queue: queue, ID: id, Payload: []byte("x")})
					cancel()
					late("Enqueue", start)
					mu.Lock()
					if err == nil && ok {
						okIDs = append(okIDs, id)
					} else {
						failedIDs = append(failedIDs, id)
					}
					mu.Unlock()
					time.Sleep(3 * time.Millisecond)
				}
			})
		}
		var consumerHeld []*runqueue.Run
		var refused []string // why each of consumerHeld was refused, and when
		consume := func(untilEmpty bool) {
			for {
				select {
				case <-stop:
					if !untilEmpty {
						return
					}
				default:
				}
				cctx, cancel := context.WithTimeout(ctx, deadline)
				start := time.Now()
				runs, err := q.Dequeue(cctx, env, "pq", 5)
				cancel()
				late("Dequeue", start)
				if untilEmpty && err == nil && len(runs) == 0 {
					return
				}
				served := time.Now()
				for _, r := range runs {
					tally.add(r.ID)
					for {
						actx, cancel := context.WithTimeout(ctx, deadline)
						start := time.Now()
						err := q.Ack(actx, r)
						cancel()
						late("Ack", start)
						if err == nil {
							break
						}
						if errors.Is(err, runqueue.ErrLeaseLost) || errors.Is(err, runqueue.ErrNotInFlight) {
							consumerHeld = append(consumerHeld, r)
							refused = append(refused, fmt.Sprintf("%s: %v, %v after its Dequeue returned, lease until %v, at %v",
								r.ID, err, time.Since(served).Round(time.Millisecond), r.LeaseDeadline.Format("15:04:05.000"),
								time.Now().Format("15:04:05.000")))
							break
						}
					}
				}
				if len(runs) == 0 {
					time.Sleep(5 * time.Millisecond)
				}
			}
		}
		wg.Go(func() { consume(false) })

		time.Sleep(300 * time.Millisecond)
		require.NoError(t, admin.Do(ctx, "CLIENT", "PAUSE", pause, "WRITE").Err())
		time.Sleep((pause + 300) * time.Millisecond)
		require.NoError(t, admin.Do(ctx, "CLIENT", "PAUSE", pause, "ALL").Err())
		time.Sleep((pause + 300) * time.Millisecond)
		close(stop)
		wg.Wait()
		consume(true)
		// A Dequeue whose deadline cut its reply short (ContextTimeoutEnabled)
		// may have been run by Redis all the same once the pause ended: its
		// runs are in flight for nobody until their lease passes, as the
		// Dequeue doc says. Lease recovery gives them back.
		time.Sleep(1100 * time.Millisecond)
		_, err = q.RecoverLeases(ctx, q.ShardOf(env), 1000)
		require.NoError(t, err)
		consume(true)
		require.Empty(t, consumerHeld, "acks refused: %v", refused)
		t.Logf("%d enqueued, %d failed", len(okIDs), len(failedIDs))
		require.NotEmpty(t, failedIDs, "the pauses were not felt")
		require.Empty(t, slow, "calls that outlived their deadline")

		require.Eventually(t, func() bool {
			for _, id := range okIDs {
				if tally.count(id) == 0 {
					return false
				}
			}
			return true
		}, 15*time.Second, 10*time.Millisecond, "runs enqueued never delivered: %s", s17nMissingIn(&tally, okIDs, b))
		require.Empty(t, tally.dups(), "runs delivered twice")
		st := queueStats(t, b, "pq")
		require.Zero(t, st.InFlight, "runs in flight that no caller holds (served after their Dequeue timed out)")
		require.Zero(t, st.Ready)

		// The Worker still serves.
		ok, err := q.Enqueue(ctx, runqueue.EnqueueParams{Env: env, Queue: "wq", ID: "after", Payload: []byte("x")})
		require.NoError(t, err)
		require.True(t, ok)
		// (The Worker's fetch backoff after the pauses' failures can reach
		// 4.8s; its idle poll is a minute away.)
		require.Eventually(t, func() bool { return tally.count("after") == 1 }, 15*time.Second, 10*time.Millisecond)
		require.Eventually(t, func() bool { return queueStats(t, b, "wq").InFlight == 0 }, 15*time.Second, 10*time.Millisecond)
	})
}

// s17nMissing describes the runs of ids not delivered, and the stats of
// their queues.
func s17nMissing(t *testing.T, q *runqueue.Queue, tally *s17nTally, ids []string) string {
	var out []string
	envs := map[string]bool{}
	for _, id := range ids {
		if tally.count(id) == 0 {
			out = append(out, id)
			envs[id[:strings.LastIndex(id, "-")]] = true
		}
	}
	for e := range envs {
		st, err := q.QueueStats(context.Background(), e, "p")
		out = append(out, fmt.Sprintf("%s/p (shard %d): %+v %v", e, q.ShardOf(e), st, err))
	}
	return strings.Join(out, "; ")
}

// s17nMissingIn lists the ids not delivered and the stats of the pause
// test's two queues (evaluated when the message is built).
func s17nMissingIn(tally *s17nTally, ids []string, b *testBundle) fmt.Stringer {
	return s17nLazy(func() string {
		var out []string
		for _, id := range ids {
			if tally.count(id) == 0 {
				out = append(out, id)
			}
		}
		for _, qn := range []string{"pq", "wq"} {
			st, err := b.q.QueueStats(context.Background(), env, qn)
			out = append(out, fmt.Sprintf("%s: %+v %v", qn, st, err))
		}
		return strings.Join(out, "; ")
	})
}

type s17nLazy func() string

func (f s17nLazy) String() string { return f() }
