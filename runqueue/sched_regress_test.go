package runqueue_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
	"github.com/runqueue/runqueue/vtime"
)

// Regressions found by an adversarial review of the fair scheduler (flag
// on). Each test is the minimal sequence that broke an earlier version and
// checks the behaviour that replaced it.

const reviewEnv, reviewQueue = "env", "q"

func reviewEnqueue(t testing.TB, b *testBundle, key, id string) {
	t.Helper()
	ok, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: reviewEnv, Queue: reviewQueue, Key: key, ID: id,
		Payload: []byte(id)})
	require.NoError(t, err)
	require.True(t, ok)
}

func reviewQK(t testing.TB, b *testBundle) keys.Queue {
	t.Helper()
	space, err := keys.NewSpace(b.prefix, b.q.Shards())
	require.NoError(t, err)
	return space.Env(reviewEnv).Queue(reviewQueue)
}

// TestStateHashWithoutCkVtime: the scheduler state is two keys (ckVtime
// and ckVtimeState). When the hash exists and ckVtime does not (an
// operator deleted one to reset fairness, a volatile-* eviction under
// Config.AllowEviction took one), every registered variant had a hash
// field and no tag, and the dequeue died with a Lua error on every call.
// Now the dequeue that finds ckVtime without its sentinel drops the state
// whole and the call is made again at once, on a state started again (as
// if it had expired): both runs are served by the one Dequeue.
func TestStateHashWithoutCkVtime(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = true })
		qk := reviewQK(t, b)
		reviewEnqueue(t, b, "a", "a1")
		reviewEnqueue(t, b, "b", "b1")
		// ckVtime goes, its hash stays.
		require.NoError(t, c.Del(b.ctx, qk.CkVtime()).Err())
		runs, err := b.q.Dequeue(b.ctx, reviewEnv, reviewQueue, 2)
		require.NoError(t, err, "a dequeue over a state hash without its ckVtime")
		require.Len(t, runs, 2)
	})
}

// TestScheduleShowsTheNewcomerLane: a key queued in the lane behind its
// head has no tag and takes no part in the competition. Schedule once
// reported it as competing (Reason "") with Tag 0 and Lag = -V ("owed
// service"); it now says it waits in the lane, and the head competes.
func TestScheduleShowsTheNewcomerLane(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = true })
		for i := 0; i < 5; i++ {
			reviewEnqueue(t, b, "a", "a"+strconv.Itoa(i))
		}
		for i := 0; i < 3; i++ {
			runs, err := b.q.Dequeue(b.ctx, reviewEnv, reviewQueue, 1)
			require.NoError(t, err)
			require.Len(t, runs, 1)
		}
		// V = 2 quanta, a's tag 3: b becomes the lane's head (at 4), c
		// queues behind it without a tag.
		reviewEnqueue(t, b, "b", "b1")
		reviewEnqueue(t, b, "c", "c1")
		snap, _, err := b.q.SchedulerSnapshot(b.ctx, reviewEnv, reviewQueue)
		require.NoError(t, err)
		require.True(t, snap.Reg[keys.VariantMember("c")].Waiting, "c is queued in the lane")
		require.NotEqual(t, keys.VariantMember("c"), "")
		s, err := b.q.Schedule(b.ctx, reviewEnv, reviewQueue, 1)
		require.NoError(t, err)
		byKey := map[string]runqueue.KeySchedule{}
		for _, k := range s.Keys {
			byKey[k.Key] = k
		}
		queued := byKey["c"]
		require.True(t, queued.Registered && queued.Waiting, "%+v", queued)
		require.Equal(t, "waiting in the newcomer lane", queued.Reason)
		require.Zero(t, queued.Tag)
		require.Zero(t, queued.Lag)
		head := byKey["b"]
		require.True(t, head.Waiting, "%+v", head)
		require.Empty(t, head.Reason, "the lane's head competes")
		require.Equal(t, 2.0, head.Lag, "b heads the lane one quantum past a's tag (V 2, tag 4)")
		require.Empty(t, byKey["a"].Reason)
		require.False(t, byKey["a"].Waiting)
	})
}

// startLocaleRedis starts a redis-server whose LC_COLLATE is en_US.UTF-8
// (generated into a temporary LOCPATH with localedef), as a server started
// by systemd on a host with LANG=en_US.UTF-8 has: Redis calls
// setlocale(LC_COLLATE, "") at start, and Lua compares strings with
// strcoll.
func startLocaleRedis(t *testing.T) redis.UniversalClient {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("no redis-server on PATH")
	}
	localedef, err := exec.LookPath("localedef")
	if err != nil {
		t.Skip("no localedef to build the en_US.UTF-8 locale")
	}
	dir := t.TempDir()
	locpath := filepath.Join(dir, "locale")
	require.NoError(t, os.MkdirAll(locpath, 0o755))
	if out, err := exec.Command(localedef, "-i", "en_US", "-f", "UTF-8", filepath.Join(locpath, "en_US.UTF-8")).CombinedOutput(); err != nil {
		if _, statErr := os.Stat(filepath.Join(locpath, "en_US.UTF-8")); statErr != nil {
			t.Skipf("localedef en_US.UTF-8: %v: %s", err, out)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	cmd := exec.Command(bin, "--save", "", "--appendonly", "no", "--port", strconv.Itoa(port),
		"--bind", "127.0.0.1", "--daemonize", "no", "--dir", dir)
	cmd.Env = append(os.Environ(), "LOCPATH="+locpath, "LC_ALL=en_US.UTF-8")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port)})
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(ctx).Err() != nil {
		require.True(t, time.Now().Before(deadline), "redis-server did not answer")
		time.Sleep(20 * time.Millisecond)
	}
	// The server's Lua now orders "0000000a" before "0000000Z" (collation),
	// where a ZSET orders them by bytes.
	v, err := c.Eval(ctx, "if '0000000a' < '0000000Z' then return 1 end return 0", nil).Int()
	require.NoError(t, err)
	if v != 1 {
		t.Skip("the locale did not take: Lua still compares bytes")
	}
	return c
}

// TestTieOrderIgnoresServerLocale: the fair dequeue once broke ties of
// equal tags in memory with Lua's "<" on the members (seq code .. variant
// member). Redis's Lua compares strings with strcoll, and Redis sets
// LC_COLLATE from its environment at start: under en_US.UTF-8 a base-62
// seq code "0000000a" (registration 36) sorted before "0000000Z" (35), so
// ties no longer went to the key that registered first and the Lua and
// the model disagreed. Seq codes are now decimal and compared as numbers.
//
// 37 keys registered at V with 2 runs each, one dequeue of 74: the model
// serves the second round in registration order; the Lua, in collation
// order.
func TestTieOrderIgnoresServerLocale(t *testing.T) {
	if os.Getenv("RUNQUEUE_REQUIRE_REDIS") == "" {
		if _, err := exec.LookPath("redis-server"); err != nil {
			t.Skip("no redis-server")
		}
	}
	c := startLocaleRedis(t)
	clock := newFakeClock()
	ctx := context.Background()
	q, err := runqueue.New(ctx, c, &runqueue.Config{Prefix: redistest.Prefix(t), Clock: clock, VtimeScheduling: true})
	require.NoError(t, err)
	defer q.Close()
	m := vtime.New(vtime.Config{})
	const nkeys = 37
	now := clock.Now().UnixMilli()
	for i := 0; i < nkeys; i++ {
		key := fmt.Sprintf("k%02d", i)
		for j := 0; j < 2; j++ {
			id := fmt.Sprintf("%s-%d", key, j)
			_, err := q.Enqueue(ctx, runqueue.EnqueueParams{Env: reviewEnv, Queue: reviewQueue, Key: key, ID: id})
			require.NoError(t, err)
			require.NoError(t, m.Enqueue(id, key, 0, now, now))
		}
	}
	want := m.Dequeue(2*nkeys, now)
	runs, err := q.Dequeue(ctx, reviewEnv, reviewQueue, 2*nkeys)
	require.NoError(t, err)
	require.Len(t, runs, len(want))
	var got, exp []string
	for i := range runs {
		got = append(got, runs[i].Key)
		exp = append(exp, want[i].Key)
	}
	require.Equal(t, exp, got, "serve order of one dequeue(%d) on a Redis with LC_COLLATE=en_US.UTF-8", 2*nkeys)
}

// TestStateTTLRefreshSurvivesSkewedClocks: the state's lifetime was
// refreshed (PEXPIRE of both keys) only when the stored deadline x, written
// from the caller's clock, was less than StateTTL/2 ahead of the caller's
// now, while Redis expires keys on its own clock. One instance whose clock
// is ahead by more than StateTTL/2 wrote an x the others never reached:
// they kept writing the state and never refreshed it, and it expired under
// them while in use. A writer now also refreshes when x is further off
// than a whole StateTTL.
//
// Sequence: StateTTL 1 minute; instance A (clock one hour ahead) enqueues
// and dequeues once; instance B (right clock) dequeues every 10 s; at 60 s
// the state is gone although B wrote it 10 s before.
func TestStateTTLRefreshSurvivesSkewedClocks(t *testing.T) {
	srv, c := redistest.MiniServer(t)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	clockB := newFakeClock()
	clockA := newFakeClock()
	clockA.Advance(time.Hour)
	cfg := func(cl *fakeClock) *runqueue.Config {
		return &runqueue.Config{Prefix: prefix, Clock: cl, VtimeScheduling: true, StateTTL: time.Minute}
	}
	qa, err := runqueue.New(ctx, c, cfg(clockA))
	require.NoError(t, err)
	defer qa.Close()
	qb, err := runqueue.New(ctx, c, cfg(clockB))
	require.NoError(t, err)
	defer qb.Close()
	space, err := keys.NewSpace(prefix, qa.Shards())
	require.NoError(t, err)
	qk := space.Env(reviewEnv).Queue(reviewQueue)
	for i := 0; i < 20; i++ {
		_, err := qb.Enqueue(ctx, runqueue.EnqueueParams{Env: reviewEnv, Queue: reviewQueue, Key: "a", ID: fmt.Sprint("a", i)})
		require.NoError(t, err)
	}
	_, err = qa.Dequeue(ctx, reviewEnv, reviewQueue, 1)
	require.NoError(t, err)
	for i := 1; i <= 8; i++ {
		srv.FastForward(10 * time.Second)
		clockB.Advance(10 * time.Second)
		n, err := c.Exists(ctx, qk.CkVtimeState(), qk.CkVtime()).Result()
		require.NoError(t, err)
		require.EqualValues(t, 2, n, "the state expired %d s after A's write although B wrote it every 10 s", 10*i)
		runs, err := qb.Dequeue(ctx, reviewEnv, reviewQueue, 1)
		require.NoError(t, err)
		require.Len(t, runs, 1)
	}
}

// TestReleaseAfterLimitFlap: x, y and z are gated at key limit 1; the
// limit goes away, x's run is acked, and the limit is back before the next
// dequeue, so no call sees a rise. The ack looks for the gated variant
// whatever the limit is then (the instance has given a queue a key limit),
// and x is served by the next call. It used to wait for the gated probe
// (y first: that call served nothing), which broke batch invariance. The
// acks of an AckAndDequeue of 0 (acks only) look too: that call returns at
// its capacity check, before any un-gating of its own.
func TestReleaseAfterLimitFlap(t *testing.T) {
	acks := map[string]func(b *testBundle, r *runqueue.Run) error{
		"Ack": func(b *testBundle, r *runqueue.Run) error { return b.q.Ack(b.ctx, r) },
		"AckAndDequeue0": func(b *testBundle, r *runqueue.Run) error {
			_, errs, err := b.q.AckAndDequeue(b.ctx, []*runqueue.Run{r}, reviewEnv, reviewQueue, 0)
			if err != nil {
				return err
			}
			return errs[0]
		},
	}
	for name, ack := range acks {
		t.Run(name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
				b, key := limitFlipSetup(t, c)
				for _, k := range []string{"y", "z", "x"} {
					for i := 0; i < 3; i++ {
						reviewEnqueue(t, b, k, k+strconv.Itoa(i))
					}
				}
				runs, err := b.q.Dequeue(b.ctx, reviewEnv, reviewQueue, 3)
				require.NoError(t, err)
				require.Equal(t, []string{"y", "z", "x"}, []string{runs[0].Key, runs[1].Key, runs[2].Key})
				key.Store(0)
				require.NoError(t, ack(b, runs[2]))
				key.Store(1)
				next, err := b.q.Dequeue(b.ctx, reviewEnv, reviewQueue, 1)
				require.NoError(t, err)
				require.Len(t, next, 1, "x's slot freed: it competes again at once")
				require.Equal(t, "x", next[0].Key)
			})
		})
	}
}

// limitFlipSetup is a flag-on bundle whose per-key limit is key (1 to
// start with), read at every call.
func limitFlipSetup(t *testing.T, c redis.UniversalClient) (*testBundle, *atomic.Int64) {
	key := new(atomic.Int64)
	key.Store(1)
	b := setup(t, c, func(cfg *runqueue.Config) {
		cfg.VtimeScheduling = true
		cfg.LimitsFor = func(string, string) runqueue.Limits { return runqueue.Limits{Key: int(key.Load())} }
	})
	return b, key
}
