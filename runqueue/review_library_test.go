package runqueue_test

// Review of the flag-on Functions library (library.go, scripts.go): the
// situations where running the flag-on scripts by FCALL could differ from
// running them by EVALSHA, or where loading and reloading the library could
// go wrong. Tests that change server-wide settings (maxmemory, ACL users,
// restarts, renamed commands) run on a redis-server of their own
// (rlibSpawn), never on the binary's shared ones.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// rlibSpawn starts a redis-server of the test's own (ownServer: no
// persistence) with extra arguments, and returns it with a client.
func rlibSpawn(t *testing.T, args ...string) (*ownProc, *redis.Client) {
	t.Helper()
	s := ownServer(t, args...)
	return s, clientFor(t, &redis.Options{Addr: s.addr, ReadTimeout: redistest.ReadTimeout})
}

// rlibBundle is a flag-on Queue on c under prefix; scriptsOnly runs the
// scripts by EVALSHA.
func rlibBundle(t *testing.T, c redis.UniversalClient, prefix string, scriptsOnly bool, mutate func(*runqueue.Config)) *testBundle {
	t.Helper()
	b := &testBundle{ctx: context.Background(), client: c, clock: newFakeClock(), prefix: prefix}
	b.cfg = &runqueue.Config{Prefix: prefix, Clock: b.clock, VtimeScheduling: true, ScriptsOnly: scriptsOnly,
		LeaseDuration: time.Minute}
	if mutate != nil {
		mutate(b.cfg)
	}
	q, err := runqueue.New(b.ctx, c, b.cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	b.q = q
	return b
}

// rlibLibrary is the name of the flag-on library this build loads (its
// functions are "<library>_<script>").
func rlibLibrary(t *testing.T) string {
	t.Helper()
	fns, err := runqueue.FlagOnFunctions()
	require.NoError(t, err)
	fn := fns["enqueue_vtime"]
	require.NotEmpty(t, fn)
	return strings.TrimSuffix(fn, "_enqueue_vtime")
}

// TestReviewLibraryOOMSettles: runqueue requires maxmemory-policy
// noeviction, so a full Redis refuses writes (OOM) instead of evicting
// runs. By EVALSHA a flag-on script without a shebang is not refused up
// front: Redis checks memory at its first write, and the settling scripts
// (ack, nack, lease recovery, TTL expiry, the acks a dequeue carries) start
// by deleting (HDEL, ZREM: not refused under OOM), after which the rest of
// the call runs. So workers can still ack and nack, and the sweeps free
// memory, while Redis is full. An FCALL of a function registered without
// flags is refused before it runs ("OOM command not allowed"): with the
// library, every flag-on settle fails until memory is freed some other
// way. Each subtest runs the operation with ScriptsOnly first (must
// succeed: the scenario's baseline), then with the library.
//
// Found by the review (the functions had no flags): the settling
// functions are now registered with 'allow-oom' (libEntry.settles); since
// 2026-12-04 the dequeue too, with acks or without, so it is one function.
func TestReviewLibraryOOMSettles(t *testing.T) {
	_, c := rlibSpawn(t)
	ctx := context.Background()
	mk := func(prefix string, scriptsOnly bool) (*testBundle, []*runqueue.Run) {
		b := rlibBundle(t, c, prefix, scriptsOnly, func(cfg *runqueue.Config) { cfg.KeyConcurrency = 5 })
		for i := 0; i < 10; i++ {
			p := runqueue.EnqueueParams{Key: fmt.Sprintf("k%d", i%3), ID: fmt.Sprintf("r%d", i), Payload: []byte("x")}
			if i >= 8 {
				p.Key, p.Delay, p.TTL = "ttl", 30*time.Second, time.Minute // queued, left to expire
			}
			enqueue(t, b, p)
		}
		held := dequeue(t, b, queueName, 7)
		require.Len(t, held, 7)
		return b, held
	}
	bs, heldS := mk("oom-s", true)
	bf, heldF := mk("oom-f", false)
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "1").Err())
	t.Cleanup(func() { _ = c.ConfigSet(context.Background(), "maxmemory", "0").Err() })
	require.ErrorContains(t, c.Set(ctx, "oom-probe", "x", 0).Err(), "OOM", "Redis is not full")

	ops := []struct {
		name string
		run  func(b *testBundle, held []*runqueue.Run) error
	}{
		{"Ack", func(b *testBundle, held []*runqueue.Run) error { return b.q.Ack(ctx, held[0]) }},
		{"Nack", func(b *testBundle, held []*runqueue.Run) error {
			_, err := b.q.Nack(ctx, held[1], nil)
			return err
		}},
		{"NackDeadLetter", func(b *testBundle, held []*runqueue.Run) error {
			_, err := b.q.Nack(ctx, held[2], &runqueue.NackOptions{DeadLetter: true})
			return err
		}},
		{"AckMany", func(b *testBundle, held []*runqueue.Run) error {
			errs, err := b.q.AckMany(ctx, held[3:5])
			return errors.Join(append(errs, err)...)
		}},
		{"AckAndDequeue", func(b *testBundle, held []*runqueue.Run) error {
			_, errs, err := b.q.AckAndDequeue(ctx, held[5:6], env, queueName, 1)
			return errors.Join(append(errs, err)...)
		}},
		{"RecoverLeases", func(b *testBundle, held []*runqueue.Run) error {
			b.clock.Advance(2 * time.Minute) // past the lease of held[6] and the TTLs
			n, err := b.q.RecoverLeases(ctx, b.q.ShardOf(env), 100)
			if err == nil && n == 0 {
				err = errors.New("recovered no lease")
			}
			return err
		}},
		{"ExpireTTL", func(b *testBundle, held []*runqueue.Run) error {
			n, err := b.q.ExpireTTL(ctx, b.q.ShardOf(env), 100)
			if err == nil && n != 2 {
				err = fmt.Errorf("expired %d runs, want 2", n)
			}
			return err
		}},
	}
	for _, op := range ops {
		t.Run(op.name, func(t *testing.T) {
			require.NoError(t, op.run(bs, heldS), "by EVALSHA (ScriptsOnly) under OOM: the baseline")
			require.NoError(t, op.run(bf, heldF), "by FCALL under OOM: EVALSHA did this, the library is refused")
		})
	}
	// An enqueue (its first write adds) is refused either way; a dequeue
	// without acks serves either way (its first write removes the runs
	// from their ready sets: CHANGES/2026-12-04-full-redis.md).
	_, errS := bs.q.Enqueue(ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, ID: "new"})
	_, errF := bf.q.Enqueue(ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, ID: "new"})
	require.ErrorContains(t, errS, "OOM")
	require.ErrorContains(t, errF, "OOM")
	runsS, errS := bs.q.Dequeue(ctx, env, queueName, 1)
	runsF, errF := bf.q.Dequeue(ctx, env, queueName, 1)
	require.NoError(t, errS, "by EVALSHA")
	require.NoError(t, errF, "by FCALL")
	require.Len(t, runsS, 1, "by EVALSHA")
	require.Len(t, runsF, 1, "by FCALL")
}

// TestReviewLibraryErrorsMapped: the RQ_ error replies the library's
// functions return by redis.error_reply reach the caller as the same typed
// errors as by EVALSHA (scriptError reads the reply's first word).
func TestReviewLibraryErrorsMapped(t *testing.T) {
	c := redistest.Real(t)
	ctx := context.Background()
	for _, scriptsOnly := range []bool{false, true} {
		t.Run(fmt.Sprintf("scriptsOnly=%v", scriptsOnly), func(t *testing.T) {
			o := otherClient(t, c)
			k := countCommands(o, "")
			b := rlibBundle(t, o, redistest.Prefix(t), scriptsOnly, nil)
			enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "a", Payload: []byte("x")})
			first := dequeue(t, b, queueName, 1)
			require.Len(t, first, 1)
			_, err := b.q.Nack(ctx, first[0], &runqueue.NackOptions{RetryAt: b.clock.Now()})
			require.NoError(t, err)
			second := dequeue(t, b, queueName, 1)
			require.Len(t, second, 1)

			_, err = b.q.Nack(ctx, first[0], nil)
			require.ErrorIs(t, err, runqueue.ErrLeaseLost, "a stale delivery's nack")
			wrongKey := *second[0]
			wrongKey.Key = "other"
			_, err = b.q.Nack(ctx, &wrongKey, nil)
			require.ErrorIs(t, err, runqueue.ErrNotFound, "the run under another key")
			require.NoError(t, b.q.Ack(ctx, second[0]))
			_, err = b.q.Nack(ctx, second[0], nil)
			require.ErrorIs(t, err, runqueue.ErrNotFound, "an acked run")
			require.ErrorIs(t, b.q.Redrive(ctx, env, queueName, "k", "nope"), runqueue.ErrNotFound)

			enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "q", Payload: []byte("x")})
			forged := &runqueue.Run{Env: env, Queue: queueName, Key: "k", ID: "q", Token: 999999}
			_, err = b.q.Nack(ctx, forged, nil)
			require.ErrorIs(t, err, runqueue.ErrNotInFlight, "a queued run")
			_, err = b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: "k", ID: "q", Payload: []byte("y")})
			require.ErrorIs(t, err, runqueue.ErrConflict)

			sent, _ := k.snapshot()
			if scriptsOnly {
				require.Zero(t, sent["fcall"])
			} else {
				require.Positive(t, sent["fcall"], "the library was not used")
			}
		})
	}
}

// TestReviewLibraryPipelineFlushed: AckMany over two queues of an
// instance that met a key limit sends one pipeline of two FCALLs (the
// flag-on ack); after the server lost its functions (and its script
// cache), each call is resent once after a reload and acks once. (The
// mix of FCALL and EVALSHA in one pipeline is
// TestReviewLibraryMixedPipeline, internal.)
func TestReviewLibraryPipelineFlushed(t *testing.T) {
	_, c := rlibSpawn(t)
	ctx := context.Background()
	k := countCommands(c, "")
	b := rlibBundle(t, c, "mix", false, func(cfg *runqueue.Config) {
		cfg.LimitsFor = func(_, queue string) runqueue.Limits {
			if queue == "lim" {
				return runqueue.Limits{Key: 3}
			}
			return runqueue.Limits{}
		}
	})
	fns, err := runqueue.FlagOnFunctions()
	require.NoError(t, err)
	ackFn := fns["ack_vtime"]
	for _, qn := range []string{"lim", "free"} {
		for i := 0; i < 6; i++ {
			enqueue(t, b, runqueue.EnqueueParams{Queue: qn, Key: fmt.Sprintf("k%d", i%2), ID: fmt.Sprintf("%s%d", qn, i)})
		}
	}
	var lim, free []*runqueue.Run
	for len(lim) < 4 || len(free) < 4 {
		lim = append(lim, dequeue(t, b, "lim", 4-len(lim))...)
		free = append(free, dequeue(t, b, "free", 4-len(free))...)
	}

	round := func(name string, flush func(), runs []*runqueue.Run) {
		t.Run(name, func(t *testing.T) {
			flush()
			before, _ := k.snapshot()
			errs, err := b.q.AckMany(ctx, runs)
			require.NoError(t, err)
			require.Equal(t, make([]error, len(runs)), errs)
			after, _ := k.snapshot()
			d := func(n string) int { return after[n] - before[n] }
			require.Equal(t, 4, d("fcall "+ackFn), "FCALLs of the flag-on ack: two in the pipeline, two resent")
			require.Zero(t, d("evalsha")+d("eval"))
			t.Logf("FUNCTION LOADs: %d for %d calls that found no function", d("function"), 2)
		})
	}
	round("BothLost", func() {
		require.NoError(t, c.FunctionFlush(ctx).Err())
		require.NoError(t, c.ScriptFlush(ctx).Err())
	}, []*runqueue.Run{lim[0], free[0], lim[1], free[1]})
	round("FunctionsLost", func() { require.NoError(t, c.FunctionFlush(ctx).Err()) },
		[]*runqueue.Run{free[2], lim[2], free[3], lim[3]})

	for _, qn := range []string{"lim", "free"} {
		st := queueStats(t, b, qn)
		require.Zero(t, st.InFlight, qn)
		require.Equal(t, int64(2), st.Ready, qn)
	}
}

// TestReviewLibraryPipelineReloadsOnce: a lease-recovery sweep (one
// pipeline of requeue calls) on a server that lost the library reloads it
// once, not once per call: runPipelined calls reloadAndCall for every call
// that found no function, and each sends the whole library (FUNCTION LOAD,
// some 77 KB; on a cluster to every master) although the first reload
// restored it for all. A restart without persistence under a backlog of
// expired leases sends the library hundreds of times, one round trip each,
// under the library's lock.
//
// Found by the review: runPipelined now loads each library again once
// per batch.
func TestReviewLibraryPipelineReloadsOnce(t *testing.T) {
	_, c := rlibSpawn(t)
	k := countCommands(c, "")
	b := rlibBundle(t, c, "sweep", false, nil)
	const n = 200
	ps := make([]runqueue.EnqueueParams, n)
	for i := range ps {
		ps[i] = runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprintf("k%d", i%20), ID: fmt.Sprint(i)}
	}
	_, err := b.q.EnqueueMany(b.ctx, ps)
	require.NoError(t, err)
	held := 0
	for held < n {
		got := dequeue(t, b, queueName, 1000)
		require.NotEmpty(t, got)
		held += len(got)
	}
	b.clock.Advance(2 * time.Minute)
	require.NoError(t, c.FunctionFlush(b.ctx).Err())
	before, _ := k.snapshot()
	got, err := b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 1000)
	require.NoError(t, err)
	require.Equal(t, n, got)
	after, _ := k.snapshot()
	loads := after["function"] - before["function"]
	lib, err := runqueue.FlagOnLibrary()
	require.NoError(t, err)
	t.Logf("%d FUNCTION LOADs (%d KB sent) to recover %d leases", loads, loads*len(lib["flagon"])/1024, n)
	require.LessOrEqual(t, loads, 1, "the library was sent once per call")
}

// TestReviewLibraryRestart: a server restarted without persistence has
// neither the library nor the scripts; the next calls (pipelined enqueue,
// single dequeue, pipelined ack with a key limit, nack) load the library
// again and run once each.
func TestReviewLibraryRestart(t *testing.T) {
	srv, c := rlibSpawn(t)
	lib := rlibLibrary(t)
	b := rlibBundle(t, c, "rst", false, func(cfg *runqueue.Config) { cfg.KeyConcurrency = 2 })
	enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "0"})
	require.Equal(t, []string{lib}, libraryNames(t, b.ctx, c))

	srv.restart(t)
	require.Empty(t, libraryNames(t, b.ctx, c), "the restart kept the library")
	// The data went with it: the runs are queued anew (coalesced enqueues
	// are pipelined), the first finding no function.
	enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "1"})
	require.Equal(t, []string{lib}, libraryNames(t, b.ctx, c))
	enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: "2"})

	// Later losses keep the data (FUNCTION FLUSH): a single dequeue, a
	// pipelined ack (the key limit makes it the flag-on ack), a nack.
	require.NoError(t, c.FunctionFlush(b.ctx).Err())
	runs := dequeue(t, b, queueName, 5)
	require.ElementsMatch(t, []string{"1", "2"}, runIDs(runs))
	require.NoError(t, c.FunctionFlush(b.ctx).Err())
	require.NoError(t, b.q.Ack(b.ctx, runs[0]))
	require.NoError(t, c.FunctionFlush(b.ctx).Err())
	res, err := b.q.Nack(b.ctx, runs[1], &runqueue.NackOptions{RetryAt: b.clock.Now()})
	require.NoError(t, err)
	require.True(t, res.Requeued)
	require.Equal(t, 2, res.Attempt, "the nack ran once")
	st := queueStats(t, b, queueName)
	require.Equal(t, int64(1), st.Ready)
	require.Zero(t, st.InFlight)
}

// TestReviewLibraryReloadCancelled: a call whose context is cancelled
// between the FCALL that found no function and the reload fails (or
// succeeds) without running twice; the next call reloads and runs.
func TestReviewLibraryReloadCancelled(t *testing.T) {
	_, c := rlibSpawn(t)
	b := rlibBundle(t, c, "cx", false, nil)
	enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "1"})
	o := otherClient(t, c)
	ob := &testBundle{ctx: b.ctx, client: o, clock: b.clock, prefix: b.prefix}
	ob.cfg = &runqueue.Config{Prefix: b.prefix, Clock: b.clock, VtimeScheduling: true, LeaseDuration: time.Minute}
	q, err := runqueue.New(b.ctx, o, ob.cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	ob.q = q
	ctx, cancel := context.WithCancel(context.Background())
	// Cancel at the FCALL that finds no function: the reload that follows
	// runs on a cancelled context.
	o.AddHook(afterEach(func(cmd redis.Cmder, err error) {
		if cmd.Name() == "fcall" && err != nil && strings.Contains(err.Error(), "Function not found") {
			cancel()
		}
	}))

	require.NoError(t, c.FunctionFlush(b.ctx).Err())
	got, err := q.Dequeue(ctx, env, queueName, 1)
	t.Logf("dequeue on a context cancelled mid-reload: %d runs, err %v", len(got), err)
	if err == nil {
		require.Len(t, got, 1)
		require.Equal(t, 1, got[0].Attempt)
		return
	}
	require.ErrorIs(t, err, context.Canceled)
	st := queueStats(t, ob, queueName)
	require.Equal(t, int64(1), st.Ready, "the cancelled call ran")
	got = dequeue(t, ob, queueName, 1)
	require.Len(t, got, 1)
	require.Equal(t, 1, got[0].Attempt, "delivered before")
	require.NotEmpty(t, libraryNames(t, b.ctx, c))
}

// TestReviewLibraryConcurrentReload: many goroutines of one Queue find the
// library gone at once; each reloads (one at a time) and runs once.
func TestReviewLibraryConcurrentReload(t *testing.T) {
	_, c := rlibSpawn(t)
	b := rlibBundle(t, c, "conc", false, nil)
	const n = 24
	for i := 0; i < n; i++ {
		enqueue(t, b, runqueue.EnqueueParams{Key: fmt.Sprintf("k%d", i), ID: fmt.Sprint(i)})
	}
	require.NoError(t, c.FunctionFlush(b.ctx).Err())
	var wg sync.WaitGroup
	errs := make([]error, n)
	got := make([][]*runqueue.Run, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if i%2 == 0 {
				got[i], errs[i] = b.q.Dequeue(b.ctx, env, queueName, 1)
				return
			}
			_, errs[i] = b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: "other", Key: "k", ID: fmt.Sprint(i)})
		}(i)
	}
	wg.Wait()
	seen := map[string]bool{}
	for i := 0; i < n; i++ {
		require.NoError(t, errs[i], "call %d", i)
		for _, r := range got[i] {
			require.False(t, seen[r.ID], "run %s delivered twice", r.ID)
			seen[r.ID] = true
		}
	}
	require.Len(t, seen, n/2)
	require.Equal(t, int64(n/2), queueStats(t, b, "other").Ready)
	require.Len(t, libraryNames(t, b.ctx, c), 1)
}

// TestReviewLibraryRollingUpgrade: an instance of another version (its
// library of other code, loaded first) and this one keep their own
// functions side by side; neither replaces the other's (New deletes the
// other's library, which its instance loads again), and two instances of
// this version share one library.
func TestReviewLibraryRollingUpgrade(t *testing.T) {
	_, c := rlibSpawn(t)
	ctx := context.Background()
	old := "runqueue_0123456789abcdef"
	var code strings.Builder
	fmt.Fprintf(&code, "#!lua name=%s\n", old)
	for _, s := range []string{"enqueue_vtime", "dequeue_vtime", "ack_vtime", "requeue_vtime", "expire_vtime", "redrive_vtime"} {
		fmt.Fprintf(&code, "redis.register_function('%s_%s', function(keys, args) return 'old %s' end)\n", old, s, s)
	}
	require.NoError(t, c.FunctionLoad(ctx, code.String()).Err())

	b1 := rlibBundle(t, c, "up", false, nil)
	// New deleted the other version's library (library.prune): an
	// instance of that version loads it again at its next call, as here.
	require.Equal(t, []string{rlibLibrary(t)}, libraryNames(t, ctx, c))
	require.NoError(t, c.FunctionLoad(ctx, code.String()).Err())
	b2 := rlibBundle(t, c, "up", false, nil) // prunes it again; then it is back once more
	require.NoError(t, c.FunctionLoad(ctx, code.String()).Err())
	enqueue(t, b1, runqueue.EnqueueParams{Key: "a", ID: "1"})
	require.Equal(t, []string{"1"}, runIDs(dequeue(t, b2, queueName, 1)))
	require.ElementsMatch(t, []string{old, rlibLibrary(t)}, libraryNames(t, ctx, c))
	v, err := c.FCall(ctx, old+"_enqueue_vtime", []string{"x"}).Result()
	require.NoError(t, err)
	require.Equal(t, "old enqueue_vtime", v, "the old version's function was replaced")
}

// TestReviewLibraryForeignFunctionName: FUNCTION LOAD of this version's
// library fails with "Function <name> already exists" when another
// library (of another name) registered one of its function names; load
// takes any "already exists" for "this library is loaded", so New
// succeeds and the flag-on calls run the other library's code.
//
// Found by the review: library.load now takes only "Library '<its name>'
// already exists" for loaded; a function name taken by another library
// makes New run the scripts by EVALSHA.
func TestReviewLibraryForeignFunctionName(t *testing.T) {
	_, c := rlibSpawn(t)
	ctx := context.Background()
	fns, err := runqueue.FlagOnFunctions()
	require.NoError(t, err)
	code := "#!lua name=impostor\nredis.register_function('" + fns["enqueue_vtime"] +
		"', function(keys, args) return redis.error_reply('IMPOSTOR not runqueue') end)\n"
	require.NoError(t, c.FunctionLoad(ctx, code).Err())

	b := &testBundle{ctx: ctx, client: c, clock: newFakeClock(), prefix: "imp"}
	b.cfg = &runqueue.Config{Prefix: "imp", Clock: b.clock, VtimeScheduling: true}
	q, err := runqueue.New(ctx, c, b.cfg)
	if err != nil {
		return // refusing to start is a right answer
	}
	t.Cleanup(func() { _ = q.Close() })
	b.q = q
	_, err = q.Enqueue(ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: "k", ID: "1"})
	require.NoError(t, err, "New took a foreign library's function for its own; libraries: %v", libraryNames(t, ctx, c))
}

// TestReviewLibraryNoRuntimeFallback: New falls back to EVALSHA where
// FUNCTION is refused, but an instance that loaded the library never
// does: when the server later loses the library (a restart without
// persistence, FUNCTION FLUSH) and refuses FUNCTION to the user (an ACL
// tightened meanwhile), every flag-on write of that instance fails with
// errNoFunctions for good, while an instance started now on the same
// server and user works by EVALSHA.
//
// Found by the review: a call whose library cannot be loaded again now
// runs by EVALSHA (for good when the server refuses the library).
func TestReviewLibraryNoRuntimeFallback(t *testing.T) {
	_, c := rlibSpawn(t)
	ctx := context.Background()
	require.NoError(t, c.Do(ctx, "ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all").Err())
	opts := *c.Options()
	opts.Username, opts.Password = "app", "pw"
	u := redis.NewClient(&opts)
	t.Cleanup(func() { _ = u.Close() })
	old := rlibBundle(t, u, "rt", false, nil)
	enqueue(t, old, runqueue.EnqueueParams{Key: "a", ID: "1"})

	require.NoError(t, c.Do(ctx, "ACL", "SETUSER", "app", "-function").Err())
	require.NoError(t, c.FunctionFlush(ctx).Err())

	fresh := rlibBundle(t, u, "rt", false, nil)
	enqueue(t, fresh, runqueue.EnqueueParams{Key: "a", ID: "2"})
	_, err := old.q.Enqueue(ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: "a", ID: "3"})
	require.NoError(t, err, "the instance that loaded the library cannot write any more")
}

// TestReviewLibraryClusterEveryMaster: on a cluster the library is on
// every master after New; a master that lost it (FUNCTION FLUSH on that
// node alone) gets it back at the first call routed there, the calls run
// once, and no FCALL was sent to a node that does not own its first key
// (no MOVED answered).
func TestReviewLibraryClusterEveryMaster(t *testing.T) {
	c := redistest.PrivateCluster(t)
	cc, ok := c.(*redis.ClusterClient)
	require.True(t, ok)
	ctx := context.Background()
	lib := rlibLibrary(t)
	k := countCommands(c, "")
	b := rlibBundle(t, c, redistest.Prefix(t), false, func(cfg *runqueue.Config) { cfg.KeyConcurrency = 2 })
	onEach := func() map[string][]string {
		out := map[string][]string{}
		var mu sync.Mutex
		require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			libs, err := n.FunctionList(ctx, redis.FunctionListQuery{}).Result()
			if err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			for _, l := range libs {
				out[n.Options().Addr] = append(out[n.Options().Addr], l.Name)
			}
			if len(libs) == 0 {
				out[n.Options().Addr] = nil
			}
			return nil
		}))
		return out
	}
	masters := onEach()
	require.Len(t, masters, 3)
	for addr, libs := range masters {
		require.Contains(t, libs, lib, "master %s", addr)
	}
	moved := func() int64 {
		var total int64
		var mu sync.Mutex
		require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			info, err := n.Info(ctx, "errorstats").Result()
			if err != nil {
				return err
			}
			for _, line := range strings.Split(info, "\r\n") {
				if rest, ok := strings.CutPrefix(line, "errorstat_MOVED:count="); ok {
					v, _ := strconv.ParseInt(rest, 10, 64)
					mu.Lock()
					total += v
					mu.Unlock()
				}
			}
			return nil
		}))
		return total
	}

	// Envs over every master.
	envs := []string{}
	nodes := map[string]bool{}
	for i := 0; len(nodes) < 3 && i < 200; i++ {
		e := fmt.Sprintf("e%d", i)
		addr, err := redistest.NodeOf(ctx, cc, fmt.Sprintf("{%s:%d}", b.prefix, b.q.ShardOf(e)))
		require.NoError(t, err)
		if !nodes[addr] {
			nodes[addr] = true
			envs = append(envs, e)
		}
	}
	require.Len(t, envs, 3)
	movedBefore := moved()
	victim, err := redistest.NodeOf(ctx, cc, fmt.Sprintf("{%s:%d}", b.prefix, b.q.ShardOf(envs[0])))
	require.NoError(t, err)
	require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		if n.Options().Addr == victim {
			return n.FunctionFlush(ctx).Err()
		}
		return nil
	}))
	require.Empty(t, onEach()[victim])

	var held []*runqueue.Run
	for _, e := range envs {
		for i := 0; i < 4; i++ {
			ok, err := b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: e, Queue: queueName, Key: fmt.Sprintf("k%d", i%2), ID: fmt.Sprint(i)})
			require.NoError(t, err)
			require.True(t, ok)
		}
		runs, err := b.q.Dequeue(ctx, e, queueName, 4)
		require.NoError(t, err)
		require.Len(t, runs, 4)
		require.NoError(t, b.q.Ack(ctx, runs[0]))
		res, err := b.q.Nack(ctx, runs[1], &runqueue.NackOptions{RetryAt: b.clock.Now()})
		require.NoError(t, err)
		require.Equal(t, 2, res.Attempt)
		st, err := b.q.QueueStats(ctx, e, queueName)
		require.NoError(t, err)
		require.Equal(t, runqueue.Stats{Ready: 1, InFlight: 2}, runqueue.Stats{Ready: st.Ready, InFlight: st.InFlight}, e)
		held = append(held, runs[2:]...)
	}
	// A pipeline over every master (AckMany of runs of every env) while
	// one master lost the library again.
	require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		if n.Options().Addr == victim {
			return n.FunctionFlush(ctx).Err()
		}
		return nil
	}))
	errs, err := b.q.AckMany(ctx, held)
	require.NoError(t, err)
	require.Equal(t, make([]error, len(held)), errs)
	for _, e := range envs {
		st, err := b.q.QueueStats(ctx, e, queueName)
		require.NoError(t, err)
		require.Zero(t, st.InFlight, e)
	}
	for addr, libs := range onEach() {
		require.Contains(t, libs, lib, "master %s", addr)
	}
	require.Equal(t, movedBefore, moved(), "an FCALL went to a node that does not own its first key")
	sent, _ := k.snapshot()
	require.Positive(t, sent["fcall"])
}

// TestReviewLibraryFallbacks: where the server cannot run the library the
// flag-on Queue falls back to EVALSHA at New: miniredis (no FUNCTION), a
// server with FUNCTION renamed away; a read-only instance sends neither
// FUNCTION nor FCALL.
func TestReviewLibraryFallbacks(t *testing.T) {
	check := func(t *testing.T, c redis.UniversalClient, prefix string) {
		k := countCommands(c, "")
		b := rlibBundle(t, c, prefix, false, func(cfg *runqueue.Config) { cfg.KeyConcurrency = 2 })
		enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "1"})
		runs := dequeue(t, b, queueName, 1)
		require.Len(t, runs, 1)
		require.NoError(t, b.q.Ack(b.ctx, runs[0]))
		sent, _ := k.snapshot()
		require.Zero(t, sent["fcall"])
		require.Positive(t, sent["evalsha"])
	}
	t.Run("Mini", func(t *testing.T) { check(t, redistest.Mini(t), "mini") })
	t.Run("RenamedFunction", func(t *testing.T) {
		_, c := rlibSpawn(t, "--rename-command", "FUNCTION", "")
		check(t, c, "ren")
	})
	t.Run("ReadOnly", func(t *testing.T) {
		_, c := rlibSpawn(t)
		k := countCommands(c, "")
		ro := rlibBundle(t, c, "ro", false, func(cfg *runqueue.Config) { cfg.ReadOnly = true })
		_, err := ro.q.Enqueue(ro.ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, ID: "1"})
		require.ErrorIs(t, err, runqueue.ErrReadOnly)
		sent, _ := k.snapshot()
		require.Zero(t, sent["fcall"]+sent["function"]+sent["evalsha"]+sent["script"])
		require.Empty(t, libraryNames(t, ro.ctx, c))
	})
}

// TestReviewLibraryLargeCalls: the largest calls (1,000-run enqueues, a
// 1,000-run dequeue, 1,000 acks carried by a 1,000-run dequeue, 1,000 acks
// in one ack call) give the same answers and data by FCALL as by EVALSHA (the
// unpack limits are the same in a function).
func TestReviewLibraryLargeCalls(t *testing.T) {
	c := redistest.Real(t)
	ctx := context.Background()
	run := func(scriptsOnly bool) (string, map[string]string) {
		o := otherClient(t, c)
		k := countCommands(o, "")
		defer func() {
			sent, _ := k.snapshot()
			require.Equal(t, scriptsOnly, sent["fcall"] == 0, "fcalls: %d", sent["fcall"])
		}()
		b := rlibBundle(t, o, redistest.Prefix(t), scriptsOnly, func(cfg *runqueue.Config) { cfg.KeyConcurrency = 1000 })
		var out strings.Builder
		var ps []runqueue.EnqueueParams
		for i := 0; i < 3000; i++ {
			ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprintf("k%d", i%700),
				ID: fmt.Sprint(i), Payload: []byte("p"), Priority: i % 3})
		}
		res, err := b.q.EnqueueMany(ctx, ps)
		require.NoError(t, err)
		fmt.Fprintln(&out, len(res))
		got, err := b.q.Dequeue(ctx, env, queueName, 1000)
		require.NoError(t, err)
		require.Len(t, got, 1000)
		fmt.Fprintln(&out, runView(got))
		more, errs, err := b.q.AckAndDequeue(ctx, got, env, queueName, 1000)
		require.NoError(t, err)
		require.Len(t, more, 1000)
		fmt.Fprintln(&out, errs, runView(more))
		errs, err = b.q.AckMany(ctx, more)
		require.NoError(t, err)
		fmt.Fprintln(&out, errs)
		return out.String(), normDump(t, b)
	}
	outF, dumpF := run(false)
	outS, dumpS := run(true)
	require.Equal(t, outS, outF)
	require.Equal(t, dumpS, dumpF)
}

// rlibProxy is a RESP2 proxy in front of a Redis server that answers the
// commands refuse picks with a reply of its own (as a proxy that does not
// support them would) and passes everything else through, in order.
func rlibProxy(t *testing.T, upstream string, refuse func(name string) (string, bool)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go rlibProxyConn(conn, upstream, refuse)
		}
	}()
	return ln.Addr().String()
}

func rlibProxyConn(conn net.Conn, upstream string, refuse func(string) (string, bool)) {
	defer func() { _ = conn.Close() }()
	up, err := net.Dial("tcp", upstream)
	if err != nil {
		return
	}
	defer func() { _ = up.Close() }()
	replies := make(chan string, 4096) // "": the upstream's next reply; else this reply
	go func() {
		ur := bufio.NewReader(up)
		for p := range replies {
			raw := []byte(p)
			if p == "" {
				var err error
				if raw, err = rlibReadReply(ur); err != nil {
					_ = conn.Close()
					return
				}
			}
			if _, err := conn.Write(raw); err != nil {
				return
			}
		}
	}()
	defer close(replies)
	cr := bufio.NewReader(conn)
	for {
		raw, name, err := rlibReadRequest(cr)
		if err != nil {
			return
		}
		if rep, ok := refuse(strings.ToLower(name)); ok {
			replies <- rep
			continue
		}
		if _, err := up.Write(raw); err != nil {
			return
		}
		replies <- ""
	}
}

// rlibReadRequest reads one request (an array of bulk strings) and returns
// its bytes and its command name.
func rlibReadRequest(r *bufio.Reader) ([]byte, string, error) {
	line, err := r.ReadBytes('\n')
	if err != nil {
		return nil, "", err
	}
	if len(line) < 3 || line[0] != '*' {
		return nil, "", fmt.Errorf("unexpected request %q", line)
	}
	n, err := strconv.Atoi(string(line[1 : len(line)-2]))
	if err != nil {
		return nil, "", err
	}
	raw, name := line, ""
	for i := 0; i < n; i++ {
		hdr, err := r.ReadBytes('\n')
		if err != nil {
			return nil, "", err
		}
		size, err := strconv.Atoi(string(hdr[1 : len(hdr)-2]))
		if err != nil {
			return nil, "", err
		}
		data := make([]byte, size+2)
		if _, err := io.ReadFull(r, data); err != nil {
			return nil, "", err
		}
		if i == 0 {
			name = string(data[:size])
		}
		raw = append(append(raw, hdr...), data...)
	}
	return raw, name, nil
}

// rlibReadReply reads one RESP2 reply whole.
func rlibReadReply(r *bufio.Reader) ([]byte, error) {
	line, err := r.ReadBytes('\n')
	if err != nil {
		return nil, err
	}
	if len(line) < 3 {
		return nil, fmt.Errorf("short reply %q", line)
	}
	switch line[0] {
	case '+', '-', ':':
		return line, nil
	case '$', '*':
		n, err := strconv.Atoi(string(line[1 : len(line)-2]))
		if err != nil || n < 0 {
			return line, err
		}
		if line[0] == '$' {
			data := make([]byte, n+2)
			_, err := io.ReadFull(r, data)
			return append(line, data...), err
		}
		for i := 0; i < n; i++ {
			sub, err := rlibReadReply(r)
			if err != nil {
				return nil, err
			}
			line = append(line, sub...)
		}
		return line, nil
	}
	return nil, fmt.Errorf("unexpected reply %q", line)
}

// TestReviewLibraryProxyRefusesFunction: behind a proxy that passes EVALSHA
// through but refuses FUNCTION with a text of its own (proxies list the
// commands they route; FUNCTION has no key to route by), the flag-on
// Queue started before the change and ran its scripts by EVALSHA. load
// falls back only on a reply that starts with NOPERM or holds "unknown
// command"; any other refusal makes New fail. The "unknown command"
// subtest passes (the fallback works); "unsupported command" fails.
//
// Found by the review: library.load now falls back on any refusal but a
// compile or registration error of the library's own code.
func TestReviewLibraryProxyRefusesFunction(t *testing.T) {
	srv, _ := rlibSpawn(t)
	for _, tc := range []struct{ name, reply string }{
		{"UnknownCommand", "-ERR unknown command 'function', with args beginning with: 'LOAD'\r\n"},
		{"UnsupportedCommand", "-ERR unsupported command 'function'\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := rlibProxy(t, srv.addr, func(name string) (string, bool) {
				return tc.reply, name == "function" || name == "fcall"
			})
			c := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, ReadTimeout: redistest.ReadTimeout})
			t.Cleanup(func() { _ = c.Close() })
			require.NoError(t, c.Ping(context.Background()).Err())
			b := &testBundle{ctx: context.Background(), client: c, clock: newFakeClock(), prefix: "px" + tc.name}
			b.cfg = &runqueue.Config{Prefix: b.prefix, Clock: b.clock, VtimeScheduling: true}
			q, err := runqueue.New(b.ctx, c, b.cfg)
			require.NoError(t, err, "New behind a proxy that runs EVALSHA but not FUNCTION")
			t.Cleanup(func() { _ = q.Close() })
			b.q = q
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "1"})
			require.Equal(t, []string{"1"}, runIDs(dequeue(t, b, queueName, 1)))
		})
	}
}
