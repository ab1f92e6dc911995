package runqueue_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
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

// Reviewer s17: server-side disruption on redis-servers each test starts
// for itself (restart, DEBUG SLEEP, CONFIG SET and CLIENT KILL would break
// the other tests of the binary on the shared servers).

// s17Server is a redis-server of one test, which it may stop and start
// again on the same port and directory.
type s17Server struct {
	t    *testing.T
	addr string
	port int
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

func s17Spawn(t *testing.T, extra ...string) *s17Server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("RUNQUEUE_REQUIRE_REDIS") == "1" {
			t.Fatal("redis-server is not on PATH (RUNQUEUE_REQUIRE_REDIS=1)")
		}
		t.Skip("redis-server is not on PATH")
	}
	// The port is free when it is picked, but another process may take it,
	// or the cluster bus port 10,000 above it, before redis-server binds
	// them: a server that exits at start is tried again on another port.
	var err error
	for attempt := 1; attempt <= 3; attempt++ {
		port := s17FreePort(t)
		s := &s17Server{t: t, port: port, addr: "127.0.0.1:" + strconv.Itoa(port), dir: t.TempDir()}
		if err = s.launch(extra...); err == nil {
			t.Cleanup(s.kill)
			return s
		}
		s.kill()
	}
	t.Fatalf("redis-server did not start on three ports: %v", err)
	return nil
}

// s17FreePort picks a free port of at most 55535: a cluster node's bus
// port is 10,000 above its port, and redis-server refuses to start in
// cluster mode when that is above 65535.
func s17FreePort(t *testing.T) int {
	t.Helper()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		port := l.Addr().(*net.TCPAddr).Port
		require.NoError(t, l.Close())
		if port <= 55535 {
			return port
		}
	}
}

// start starts the server (again) on its port and directory.
func (s *s17Server) start(extra ...string) {
	s.t.Helper()
	require.NoError(s.t, s.launch(extra...))
}

// launch starts redis-server and waits until it answers PING; an error
// when it exits first or does not answer within 10 s (the tail of its
// log says why).
func (s *s17Server) launch(extra ...string) error {
	args := append([]string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--dir", s.dir, "--enable-debug-command", "yes"}, extra...)
	cmd := exec.Command("redis-server", args...)
	logPath := filepath.Join(s.dir, "log")
	log, err := os.Create(logPath)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = log, log
	err = cmd.Start()
	_ = log.Close()
	if err != nil {
		return err
	}
	s.cmd, s.done = cmd, make(chan struct{})
	done := s.done
	go func() { _ = cmd.Wait(); close(done) }()
	c := redis.NewClient(&redis.Options{Addr: s.addr, MaxRetries: -1})
	defer func() { _ = c.Close() }()
	failed := func(why string) error {
		out, _ := os.ReadFile(logPath)
		if len(out) > 600 {
			out = out[len(out)-600:]
		}
		return fmt.Errorf("redis-server on %s %s: %s", s.addr, why, out)
	}
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		select {
		case <-done:
			s.cmd = nil
			return failed("exited")
		default:
		}
		if time.Now().After(deadline) {
			return failed("did not answer within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The answer must be this child's: two parallel spawns may pick the
	// same free port, one binds it and the other's PING is answered by it
	// (a CI run's OOM test then wrote to another test's full server). Else
	// s17Spawn tries another port.
	info, err := c.Info(context.Background(), "server").Result()
	if err != nil {
		return failed("INFO server: " + err.Error())
	}
	if !strings.Contains(info, "process_id:"+strconv.Itoa(cmd.Process.Pid)+"\r\n") {
		return failed("answered from another process, not the server started")
	}
	return nil
}

func (s *s17Server) kill() {
	if s.cmd != nil {
		_ = s.cmd.Process.Kill()
		<-s.done
		s.cmd = nil
	}
}

// admin is a client of the server for the test's own commands.
func (s *s17Server) admin() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.addr, ReadTimeout: time.Minute})
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

func s17Flags(t *testing.T, fn func(t *testing.T, on bool)) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("vtime=%v", on), func(t *testing.T) {
			t.Parallel()
			fn(t, on)
		})
	}
}

// TestS17DisruptFlushInFlight: producers, consumers (AckAndDequeue) and
// SCRIPT FLUSH + FUNCTION FLUSH in a tight loop, all at once. Every call
// must recover from NOSCRIPT and a missing function: no error, every run
// delivered exactly once, nothing left.
func TestS17DisruptFlushInFlight(t *testing.T) {
	s17Flags(t, func(t *testing.T, on bool) {
		srv := s17Spawn(t)
		admin := srv.admin()
		b := setup(t, srv.admin(), func(cfg *runqueue.Config) { cfg.VtimeScheduling = on })
		ctx := b.ctx
		const producers, perProducer, consumers = 4, 100, 2
		const total = producers * perProducer
		var stop atomic.Bool
		var flushes atomic.Int64
		flushDone := make(chan struct{})
		go func() {
			defer close(flushDone)
			for !stop.Load() {
				_ = admin.ScriptFlush(ctx).Err()
				_ = admin.FunctionFlush(ctx).Err()
				flushes.Add(1)
				time.Sleep(time.Millisecond)
			}
		}()
		var mu sync.Mutex
		seen := map[string]int{}
		var errs []error
		record := func(err error) {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
		var wg sync.WaitGroup
		for p := range producers {
			wg.Go(func() {
				for i := range perProducer {
					id := fmt.Sprintf("p%d-%d", p, i)
					ok, err := b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprint("k", i%7), ID: id, Payload: []byte(id)})
					if err != nil || !ok {
						record(fmt.Errorf("enqueue %s: ok=%v err=%v", id, ok, err))
					}
				}
			})
		}
		var acked atomic.Int64
		for range consumers {
			wg.Go(func() {
				var held []*runqueue.Run
				deadline := time.Now().Add(20 * time.Second)
				for acked.Load() < total && time.Now().Before(deadline) {
					runs, aerrs, err := b.q.AckAndDequeue(ctx, held, env, queueName, 10)
					if err != nil {
						record(fmt.Errorf("ackAndDequeue: %w", err))
						return
					}
					for _, e := range aerrs {
						if e != nil {
							record(e)
						}
					}
					acked.Add(int64(len(held)))
					mu.Lock()
					for _, r := range runs {
						seen[r.ID]++
					}
					mu.Unlock()
					held = runs
					if len(runs) == 0 {
						time.Sleep(time.Millisecond)
					}
				}
				if len(held) > 0 {
					aerrs, err := b.q.AckMany(ctx, held)
					if err != nil {
						record(err)
					}
					for _, e := range aerrs {
						if e != nil {
							record(e)
						}
					}
					acked.Add(int64(len(held)))
				}
			})
		}
		wg.Wait()
		stop.Store(true)
		<-flushDone
		require.Empty(t, errs)
		require.Len(t, seen, total)
		for id, n := range seen {
			require.Equal(t, 1, n, "run %s delivered %d times", id, n)
		}
		require.Greater(t, flushes.Load(), int64(10))
		require.Equal(t, runqueue.Stats{}, queueStats(t, b, queueName))
	})
}

// TestS17DisruptRestart: a server restart with its data kept (RDB), then
// one that lost everything. Runs in flight and delayed survive the first;
// after both, every call works again (scripts and functions reloaded), the
// blocking dequeue's listener reconnects and is woken by an enqueue of
// another process, and a holder from before the data loss acks without an
// error.
func TestS17DisruptRestart(t *testing.T) {
	s17Flags(t, func(t *testing.T, on bool) {
		srv := s17Spawn(t)
		admin := srv.admin()
		c := redis.NewClient(&redis.Options{Addr: srv.addr, ReadTimeout: time.Minute})
		t.Cleanup(func() { _ = c.Close() })
		b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = on; cfg.Clock = nil; cfg.KeyConcurrency = 1 })
		ctx := b.ctx
		producer, err := runqueue.New(ctx, admin, &runqueue.Config{Prefix: b.prefix, VtimeScheduling: on, KeyConcurrency: 1})
		require.NoError(t, err)
		t.Cleanup(func() { _ = producer.Close() })
		for _, p := range []runqueue.EnqueueParams{
			{ID: "a", Key: "k"}, {ID: "b", Key: "k"}, {ID: "c", Key: "k2", Delay: time.Hour},
		} {
			p.Env, p.Queue, p.Payload = env, queueName, []byte(p.ID)
			ok, err := b.q.Enqueue(ctx, p)
			require.NoError(t, err)
			require.True(t, ok)
		}
		held := dequeue(t, b, queueName, 10)
		require.Equal(t, []string{"a"}, runIDs(held))
		// Open the listener before the restarts.
		none, err := b.q.DequeueWait(ctx, env, "other", 1, 10*time.Millisecond)
		require.NoError(t, err)
		require.Empty(t, none)

		waitWoken := func(t *testing.T, id string) {
			got := make(chan []*runqueue.Run, 1)
			errc := make(chan error, 1)
			wctx, cancel := context.WithTimeout(ctx, 6*time.Second)
			defer cancel()
			go func() {
				runs, err := b.q.DequeueWait(wctx, env, "w", 1, 5*time.Second)
				errc <- err
				got <- runs
			}()
			time.Sleep(200 * time.Millisecond)
			ok, err := producer.Enqueue(ctx, runqueue.EnqueueParams{Env: env, Queue: "w", ID: id, Payload: []byte("x")})
			require.NoError(t, err)
			require.True(t, ok)
			require.NoError(t, <-errc)
			runs := <-got
			require.Equal(t, []string{id}, runIDs(runs))
			require.NoError(t, b.q.Ack(ctx, runs[0]))
		}

		// Restart with the data kept.
		require.NoError(t, admin.Save(ctx).Err())
		srv.kill()
		srv.start("--dbfilename", "dump.rdb")
		time.Sleep(300 * time.Millisecond) // the listener reconnects
		st := queueStats(t, b, queueName)
		require.Equal(t, runqueue.Stats{Ready: 1, Delayed: 1, InFlight: 1, OldestReadyAge: st.OldestReadyAge}, st)
		more, errs, err := b.q.AckAndDequeue(ctx, held, env, queueName, 10)
		require.NoError(t, err)
		require.NoError(t, errs[0])
		require.Equal(t, []string{"b"}, runIDs(more))
		waitWoken(t, "w1")

		// Restart with the data lost.
		srv.kill()
		require.NoError(t, os.Remove(filepath.Join(srv.dir, "dump.rdb")))
		srv.start()
		time.Sleep(300 * time.Millisecond)
		require.NoError(t, b.q.Ack(ctx, more[0]), "a run that is gone acks as done")
		enqueue(t, b, runqueue.EnqueueParams{ID: "d", Key: "k", Payload: []byte("d")})
		got := dequeue(t, b, queueName, 10)
		require.Equal(t, []string{"d"}, runIDs(got))
		nr, err := b.q.Nack(ctx, got[0], &runqueue.NackOptions{RetryAt: time.Now()})
		require.NoError(t, err)
		require.True(t, nr.Requeued)
		got = dequeue(t, b, queueName, 10)
		require.Equal(t, []string{"d"}, runIDs(got))
		ackAll(t, b, got)
		waitWoken(t, "w2")
	})
}

// TestS17DisruptListenerGap: the listener's connection is killed and cannot
// come back at once (the server is at maxclients); an enqueue of another
// process, over a connection it already had, publishes while nobody
// listens. Once the listener is back, a blocked DequeueWait must still get
// the run before its context ends (well before its own timeout): after a
// resubscription the waiters must look again, since any publish of the gap
// was lost.
//
// DEFECT (fixed since: the waker reads ChannelWithSubscriptions and wakes
// every waiter at a resubscribe): the waker (wake.go) read ps.Channel(),
// which hides go-redis's
// reconnect and resubscription; nothing wakes the waiters after the gap, so
// DequeueWait sleeps until its timeout (or ctx) with a ready run in the
// queue. Fix: read ps.ChannelWithSubscriptions() (or Receive) and, on a
// *redis.Subscription message after the first subscribe, notify every
// topic's waiters.
func TestS17DisruptListenerGap(t *testing.T) {
	srv := s17Spawn(t)
	admin := srv.admin()
	name := "s17gap"
	c := redis.NewClient(&redis.Options{Addr: srv.addr, ClientName: name, ReadTimeout: time.Minute})
	t.Cleanup(func() { _ = c.Close() })
	b := setup(t, c, func(cfg *runqueue.Config) { cfg.Clock = nil })
	ctx := b.ctx
	pc := redis.NewClient(&redis.Options{Addr: srv.addr, ReadTimeout: time.Minute, PoolSize: 2, MinIdleConns: 2})
	t.Cleanup(func() { _ = pc.Close() })
	producer, err := runqueue.New(ctx, pc, &runqueue.Config{Prefix: b.prefix, SerialCalls: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = producer.Close() })

	wctx, cancel := context.WithTimeout(ctx, 4*time.Second)
	defer cancel()
	got := make(chan []*runqueue.Run, 1)
	errc := make(chan error, 1)
	go func() {
		runs, err := b.q.DequeueWait(wctx, env, queueName, 1, time.Minute)
		errc <- err
		got <- runs
	}()
	// The waiter subscribes on its first call: wait for its connection
	// (a fixed 200ms sleep failed the count below when the goroutine was
	// slower than that on a loaded machine), then let it reach its wait.
	var list string
	require.Eventually(t, func() bool {
		l, err := admin.ClientList(ctx).Result()
		if err != nil {
			return false
		}
		for _, line := range splitLines(l) {
			if fieldOf(line, "name") == name && strings.Contains(fieldOf(line, "cmd"), "subscribe") {
				list = l
				return true
			}
		}
		return false
	}, 3*time.Second, 10*time.Millisecond, "the waiter's listener never subscribed")
	time.Sleep(100 * time.Millisecond)
	old := admin.ConfigGet(ctx, "maxclients").Val()["maxclients"]
	require.NotEmpty(t, old)
	require.NoError(t, admin.ConfigSet(ctx, "maxclients", "1").Err())
	killed := 0
	for _, line := range splitLines(list) {
		if fieldOf(line, "name") == name && strings.Contains(fieldOf(line, "cmd"), "subscribe") {
			require.NoError(t, admin.ClientKillByFilter(ctx, "ID", fieldOf(line, "id")).Err())
			killed++
		}
	}
	require.Equal(t, 1, killed, "the listener's connection")
	time.Sleep(100 * time.Millisecond)
	ok, err := producer.Enqueue(ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, ID: "gap", Payload: []byte("x")})
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, admin.ConfigSet(ctx, "maxclients", old).Err())

	err = <-errc
	runs := <-got
	// The listener is back: a wait that starts now is woken.
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 4*time.Second)
		defer cancel()
		runs, err := b.q.DequeueWait(wctx, env, "after", 1, time.Minute)
		errc <- err
		got <- runs
	}()
	time.Sleep(200 * time.Millisecond)
	ok, err2 := producer.Enqueue(ctx, runqueue.EnqueueParams{Env: env, Queue: "after", ID: "after", Payload: []byte("x")})
	require.NoError(t, err2)
	require.True(t, ok)
	require.NoError(t, <-errc, "the listener did not come back")
	require.Equal(t, []string{"after"}, runIDs(<-got))

	require.NoError(t, err, "the waiter was not woken after the listener came back")
	require.Equal(t, []string{"gap"}, runIDs(runs))
}

// TestS17DisruptSlowServer: DEBUG SLEEP stalls the server while Dequeue,
// DequeueShard and AckAndDequeue calls with short context deadlines wait
// on it. Whatever each returns, no run may be left in flight that no
// caller holds.
func TestS17DisruptSlowServer(t *testing.T) {
	s17Flags(t, func(t *testing.T, on bool) {
		srv := s17Spawn(t)
		admin := srv.admin()
		b := setup(t, srv.admin(), func(cfg *runqueue.Config) { cfg.VtimeScheduling = on })
		ctx := b.ctx
		for i := range 30 {
			enqueue(t, b, runqueue.EnqueueParams{ID: fmt.Sprint(i), Key: fmt.Sprint("k", i%3), Payload: []byte("x")})
		}
		sleeping := make(chan struct{})
		slept := make(chan error, 1)
		go func() {
			close(sleeping)
			slept <- admin.Do(ctx, "DEBUG", "SLEEP", "0.6").Err()
		}()
		<-sleeping
		time.Sleep(50 * time.Millisecond)
		var mu sync.Mutex
		var holding []*runqueue.Run
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Go(func() {
				dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
				defer cancel()
				var runs []*runqueue.Run
				switch i % 3 {
				case 0:
					runs, _ = b.q.Dequeue(dctx, env, queueName, 3)
				case 1:
					runs, _ = b.q.DequeueShard(dctx, b.q.ShardOf(env), 3)
				default:
					runs, _, _ = b.q.AckAndDequeue(dctx, nil, env, queueName, 3)
				}
				mu.Lock()
				holding = append(holding, runs...)
				mu.Unlock()
			})
		}
		wg.Wait()
		require.NoError(t, <-slept)
		st := queueStats(t, b, queueName)
		require.Equal(t, int64(len(holding)), st.InFlight, "runs in flight that no caller got")
		require.Equal(t, int64(30-len(holding)), st.Ready)
	})
}

// TestS17DisruptOOM: at maxmemory (noeviction), calls that add are refused
// with Redis's OOM error and write nothing; calls that settle (Ack, Nack,
// an AckAndDequeue with acks, RecoverLeases) still work, also after SCRIPT
// FLUSH and FUNCTION FLUSH (the library cannot be loaded when full).
func TestS17DisruptOOM(t *testing.T) {
	s17Flags(t, func(t *testing.T, on bool) {
		srv := s17Spawn(t)
		admin := srv.admin()
		b := setup(t, srv.admin(), func(cfg *runqueue.Config) {
			cfg.VtimeScheduling = on
			cfg.LeaseDuration = time.Minute
		})
		ctx := b.ctx
		for i := range 8 {
			enqueue(t, b, runqueue.EnqueueParams{ID: fmt.Sprint(i), Key: fmt.Sprint("k", i%4), Payload: []byte("x")})
		}
		held := dequeue(t, b, queueName, 5)
		require.Len(t, held, 5)
		require.NoError(t, admin.ConfigSet(ctx, "maxmemory", "1").Err())
		t.Cleanup(func() { _ = admin.ConfigSet(context.Background(), "maxmemory", "0").Err() })

		isOOM := func(err error) bool { return err != nil && strings.Contains(err.Error(), "OOM") }
		before := b.dump(t)
		_, err := b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, ID: "new", Payload: []byte("x")})
		require.True(t, isOOM(err), "enqueue at maxmemory: %v", err)
		var rerr redis.Error
		require.True(t, errors.As(err, &rerr), "the OOM reply stays a redis.Error: %T", err)
		res, err := b.q.EnqueueMany(ctx, []runqueue.EnqueueParams{
			{Env: env, Queue: queueName, ID: "n1", Payload: []byte("x")},
			{Env: "other", Queue: queueName, ID: "n2", Payload: []byte("x")},
		})
		if err == nil {
			for _, r := range res {
				require.True(t, isOOM(r.Err), "%v", r.Err)
				require.False(t, r.Queued)
			}
		} else {
			require.True(t, isOOM(err), "%v", err)
		}
		require.Equal(t, before, b.dump(t), "a refused call wrote something")
		// A dequeue without acks is served whole on both flags: its first
		// write removes (EVALSHA runs it) and its function carries
		// allow-oom (CHANGES/2026-12-04-full-redis.md): workers on a full
		// Redis get the runs whose acks free memory.
		extra, err := b.q.Dequeue(ctx, env, queueName, 2)
		require.NoError(t, err)
		require.Len(t, extra, 2)
		held = append(held, extra...)

		require.NoError(t, admin.ScriptFlush(ctx).Err())
		require.NoError(t, admin.FunctionFlush(ctx).Err())
		require.NoError(t, b.q.Ack(ctx, held[0]))
		nr, err := b.q.Nack(ctx, held[1], &runqueue.NackOptions{RetryAt: b.clock.Now()})
		require.NoError(t, err)
		require.True(t, nr.Requeued)
		more, errs, err := b.q.AckAndDequeue(ctx, held[2:3], env, queueName, 1)
		require.NoError(t, err)
		require.NoError(t, errs[0])
		b.clock.Advance(2 * time.Minute)
		n, err := b.q.RecoverLeases(ctx, b.q.ShardOf(env), 100)
		require.NoError(t, err)
		require.Equal(t, len(held)-3+len(more), n)

		require.NoError(t, admin.ConfigSet(ctx, "maxmemory", "0").Err())
		runs := dequeue(t, b, queueName, 10)
		require.Len(t, runs, 8-2)
		ackAll(t, b, runs)
		require.Equal(t, runqueue.Stats{}, queueStats(t, b, queueName))
	})
}

// TestS17DisruptOOMStats: at maxmemory an operator reads the stats of the
// queues (the moment they matter most). Reads add nothing to Redis.
//
// DEFECT (fixed since: on EXECABORT or OOM the reads go again in a plain
// pipeline, readTx): QueueStats (and EnvStats, KeyStats through readHeld) read in a
// MULTI/EXEC (TxPipelined); Redis refuses every command queued in a MULTI
// when used memory is over maxmemory (processCommand: reject_cmd_on_oom for
// a client in MULTI), so the stats fail with "EXECABORT Transaction
// discarded because of previous errors" on a full Redis. Fix: read with a
// read-only script (EVAL_RO / a no-writes function) or a plain pipeline
// (the keys share one slot), or fall back to one on EXECABORT/OOM.
func TestS17DisruptOOMStats(t *testing.T) {
	srv := s17Spawn(t)
	admin := srv.admin()
	b := setup(t, srv.admin(), nil)
	ctx := b.ctx
	for i := range 4 {
		enqueue(t, b, runqueue.EnqueueParams{ID: fmt.Sprint(i), Key: fmt.Sprint("k", i%2), Payload: []byte("x")})
	}
	require.Len(t, dequeue(t, b, queueName, 1), 1)
	want := queueStats(t, b, queueName)
	wantEnv, err := b.q.EnvStats(ctx, env)
	require.NoError(t, err)
	require.NoError(t, admin.ConfigSet(ctx, "maxmemory", "1").Err())
	t.Cleanup(func() { _ = admin.ConfigSet(context.Background(), "maxmemory", "0").Err() })
	got, err := b.q.QueueStats(ctx, env, queueName)
	require.NoError(t, err, "QueueStats on a full Redis")
	require.Equal(t, want, got)
	gotEnv, err := b.q.EnvStats(ctx, env)
	require.NoError(t, err, "EnvStats on a full Redis")
	require.Equal(t, wantEnv, gotEnv)
}

// TestS17DisruptEvictedRecord: under an evicting policy (AllowEviction), the
// runs hash of a queue with a run in flight is evicted. A lease sweep of the
// shard must not fail on the orphan lease, and must still recover the
// expired lease of another queue of the shard.
//
// DEFECT (fixed since: requeue.lua answers RQ_NOT_FOUND, the hold
// released, and the sweep goes on): requeue.lua parsed the record it read
// after releasing the
// lease (rec_parse(redis.call('HGET', q.runs, id)) with no record): a Lua
// runtime error ("bad argument #1 to 'match'") that RecoverLeases returns
// as an untyped ERR for the whole sweep, after the script's first writes
// (held, lease, counters) were made. Scripts are meant to fail only with
// RQ_* codes. Fix: when the record is gone, finish the release and return
// {0, 0} (or a "gone" code the sweep skips) before rec_parse.
func TestS17DisruptEvictedRecord(t *testing.T) {
	s17Flags(t, func(t *testing.T, on bool) {
		srv := s17Spawn(t, "--maxmemory-policy", "allkeys-lru")
		b := setup(t, srv.admin(), func(cfg *runqueue.Config) {
			cfg.VtimeScheduling = on
			cfg.AllowEviction = true
			cfg.LeaseDuration = time.Minute
		})
		ctx := b.ctx
		enqueue(t, b, runqueue.EnqueueParams{Queue: "q1", ID: "a", Payload: []byte("x")})
		b.clock.Advance(time.Second)
		enqueue(t, b, runqueue.EnqueueParams{Queue: "q2", ID: "b", Payload: []byte("x")})
		require.Len(t, dequeue(t, b, "q1", 1), 1)
		require.Len(t, dequeue(t, b, "q2", 1), 1)
		qk := keySpace(t, b).Env(env).Queue("q1")
		require.NoError(t, b.client.Del(ctx, qk.Runs()).Err()) // evicted
		b.clock.Advance(2 * time.Minute)
		n, err := b.q.RecoverLeases(ctx, b.q.ShardOf(env), 100)
		if err != nil {
			_, err2 := b.q.RecoverLeases(ctx, b.q.ShardOf(env), 100)
			t.Logf("second sweep: %v", err2)
		}
		require.NoError(t, err, "one evicted record must not fail the shard's sweep")
		require.GreaterOrEqual(t, n, 1)
		runs := dequeue(t, b, "q2", 1)
		require.Equal(t, []string{"b"}, runIDs(runs), "q2's run was recovered")
	})
}

// TestS17DisruptEvictedRecordDequeue: the runs hash of a queue with ready
// and delayed runs is evicted (AllowEviction). The dequeue that meets the
// orphans (ready ones served, delayed ones promoted) must not fail, must
// not deliver them, and must not leave them holding slots: a key at its
// limit of 1 serves its next run at once, and the counts come back right.
func TestS17DisruptEvictedRecordDequeue(t *testing.T) {
	s17Flags(t, func(t *testing.T, on bool) {
		srv := s17Spawn(t, "--maxmemory-policy", "allkeys-lru")
		b := setup(t, srv.admin(), func(cfg *runqueue.Config) {
			cfg.VtimeScheduling = on
			cfg.AllowEviction = true
			cfg.KeyConcurrency = 1
		})
		for i := range 3 {
			enqueue(t, b, runqueue.EnqueueParams{Key: fmt.Sprint("k", i), ID: fmt.Sprint("r", i), Payload: []byte("x")})
			enqueue(t, b, runqueue.EnqueueParams{Key: fmt.Sprint("k", i), ID: fmt.Sprint("d", i), Payload: []byte("x"),
				Delay: time.Second})
		}
		qk := keySpace(t, b).Env(env).Queue(queueName)
		require.NoError(t, b.client.Del(b.ctx, qk.Runs()).Err()) // evicted
		runs, err := b.q.Dequeue(b.ctx, env, queueName, 10)
		require.NoError(t, err)
		require.Empty(t, runs, "runs without a record are not delivered")
		b.clock.Advance(2 * time.Second)
		runs, err = b.q.Dequeue(b.ctx, env, queueName, 10)
		require.NoError(t, err)
		require.Empty(t, runs, "delayed runs without a record are not promoted")
		require.Equal(t, runqueue.Stats{}, queueStats(t, b, queueName), "nothing left queued or held")
		// The keys' slots are free: new runs of each are served at once.
		for i := range 3 {
			enqueue(t, b, runqueue.EnqueueParams{Key: fmt.Sprint("k", i), ID: fmt.Sprint("n", i), Payload: []byte("x")})
		}
		runs, err = b.q.Dequeue(b.ctx, env, queueName, 10)
		require.NoError(t, err)
		require.ElementsMatch(t, []string{"n0", "n1", "n2"}, runIDs(runs))
		ackAll(t, b, runs)
		require.Equal(t, runqueue.Stats{}, queueStats(t, b, queueName))
	})
}

// TestS17DisruptRing: a Queue on a go-redis Ring of two servers (New
// accepts a ring). A blocking dequeue of an env whose shard lives on either
// server must be woken by an enqueue of another process.
//
// DEFECT (fixed since: on a Ring each ring server's channels are
// subscribed on that server): the waker subscribed every shard's wake channel with one
// Ring.Subscribe, which puts them all on the ring shard of the first
// channel; a script on the other server PUBLISHes there, where nobody
// listens (PUBLISH does not cross ring shards as it crosses cluster
// nodes), so a DequeueWait of such an env sleeps until its timeout.
// Fix: on a Ring, subscribe each wake channel on the ring shard that owns
// it (one PubSub per ring shard), or document that Ring is unsupported
// for blocking dequeues.
func TestS17DisruptRing(t *testing.T) {
	s1, s2 := s17Spawn(t), s17Spawn(t)
	opt := &redis.RingOptions{Addrs: map[string]string{"s1": s1.addr, "s2": s2.addr}, ReadTimeout: time.Minute}
	ring := redis.NewRing(opt)
	t.Cleanup(func() { _ = ring.Close() })
	ring2 := redis.NewRing(opt)
	t.Cleanup(func() { _ = ring2.Close() })
	ctx := context.Background()
	require.Eventually(t, func() bool { return ring.Ping(ctx).Err() == nil && ring2.Ping(ctx).Err() == nil }, 5*time.Second, 20*time.Millisecond)
	prefix := redistest.Prefix(t)
	q, err := runqueue.New(ctx, ring, &runqueue.Config{Prefix: prefix, Shards: 16})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	producer, err := runqueue.New(ctx, ring2, &runqueue.Config{Prefix: prefix, Shards: 16})
	require.NoError(t, err)
	t.Cleanup(func() { _ = producer.Close() })

	// One env per ring shard (server).
	space, err := keys.NewSpace(prefix, 16)
	require.NoError(t, err)
	direct := map[string]*redis.Client{s1.addr: s1.admin(), s2.addr: s2.admin()}
	byServer := map[string]string{}
	for i := 0; len(byServer) < 2 && i < 200; i++ {
		e := fmt.Sprint("r", i)
		key := space.Shard(q.ShardOf(e)).Master()
		require.NoError(t, ring.ZAdd(ctx, key, redis.Z{Score: 0, Member: "probe"}).Err())
		for addr, c := range direct {
			if c.Exists(ctx, key).Val() == 1 {
				byServer[addr] = e
			}
		}
		require.NoError(t, ring.Del(ctx, key).Err())
	}
	require.Len(t, byServer, 2)
	// Open the listener first.
	_, err = q.DequeueWait(ctx, "x", "q", 1, time.Millisecond)
	require.NoError(t, err)

	for addr, e := range byServer {
		wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		got := make(chan []*runqueue.Run, 1)
		errc := make(chan error, 1)
		go func() {
			runs, err := q.DequeueWait(wctx, e, "q", 1, time.Minute)
			errc <- err
			got <- runs
		}()
		time.Sleep(150 * time.Millisecond)
		ok, err := producer.Enqueue(ctx, runqueue.EnqueueParams{Env: e, Queue: "q", ID: "r", Payload: []byte("x")})
		require.NoError(t, err)
		require.True(t, ok)
		werr := <-errc
		runs := <-got
		cancel()
		require.NoError(t, werr, "env %s on %s: the enqueue did not wake the wait", e, addr)
		require.Equal(t, []string{"r"}, runIDs(runs), "env %s on %s", e, addr)
	}
}
