// Package opbudget holds the op-count budget tests of the scheduler: they
// read INFO commandstats, which is server-wide, so they live in their own
// test binary (its own redis-server) and never run in parallel.
package opbudget

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

func TestMain(m *testing.M) { redistest.Main(m) }

type clock struct{ t time.Time }

func (c *clock) Now() time.Time { return c.t }

type bundle struct {
	ctx context.Context
	c   redis.UniversalClient
	q   *runqueue.Queue
}

func newBundle(t *testing.T, c redis.UniversalClient, on bool, mutate func(*runqueue.Config)) *bundle {
	cfg := &runqueue.Config{Prefix: redistest.Prefix(t), VtimeScheduling: on,
		Clock: &clock{t: time.UnixMilli(1_900_000_000_000)}}
	if mutate != nil {
		mutate(cfg)
	}
	q, err := runqueue.New(context.Background(), c, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	return &bundle{ctx: context.Background(), c: c, q: q}
}

// measure runs fn between two commandstats reads and returns the delta.
func measure(t *testing.T, c redis.UniversalClient, fn func()) redistest.Stats {
	ctx := context.Background()
	require.NoError(t, redistest.ResetStats(ctx, c))
	before, err := redistest.CommandStats(ctx, c)
	require.NoError(t, err)
	fn()
	after, err := redistest.CommandStats(ctx, c)
	require.NoError(t, err)
	return after.Sub(before)
}

func enqueue(t *testing.T, b *bundle, key string, n int, at time.Time) {
	for i := 0; i < n; i++ {
		_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: "env", Queue: "q", Key: key,
			ID: fmt.Sprintf("%s-%d", key, i), Payload: []byte("p"), AvailableAt: at})
		require.NoError(t, err)
	}
}

// TestServableBudget: 6 keys x 30 runs, maxCount 5, 50 dequeue calls with
// immediate acks. Flag on may use at most 1.5 more Redis commands per
// dequeued run than flag off (commands include the redis.calls inside Lua
// and the candidate reads Go makes before the script).
func TestServableBudget(t *testing.T) {
	c := redistest.Private(t)
	perRun := map[bool]float64{}
	for _, on := range []bool{false, true} {
		b := newBundle(t, c, on, nil)
		// Runs of the six keys arrive interleaved, so both flags spread each
		// call over several keys and the difference is the scheduler's own.
		past := time.UnixMilli(1_899_999_000_000)
		for i := 0; i < 30; i++ {
			for k := 0; k < 6; k++ {
				_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: "env", Queue: "q", Key: fmt.Sprintf("key%d", k),
					ID: fmt.Sprintf("%d-%d", k, i), Payload: []byte("p"), AvailableAt: past.Add(time.Duration(6*i+k) * time.Millisecond)})
				require.NoError(t, err)
			}
		}
		served := 0
		st := measure(t, c, func() {
			for i := 0; i < 50; i++ {
				runs, err := b.q.Dequeue(b.ctx, "env", "q", 5)
				require.NoError(t, err)
				served += len(runs)
				for _, r := range runs {
					require.NoError(t, b.q.Ack(b.ctx, r))
				}
			}
		})
		require.Equal(t, 180, served)
		cmds := st.Commands()
		perRun[on] = float64(cmds.Calls) / float64(served)
		t.Logf("flag %v: %d commands (%d scripts, %d us in scripts) for %d runs: %.2f commands/run",
			on, cmds.Calls, st.Scripts().Calls, st.Scripts().Usec, served, perRun[on])
	}
	require.LessOrEqual(t, perRun[true]-perRun[false], 1.5,
		"flag on uses %.2f commands per dequeued run, flag off %.2f", perRun[true], perRun[false])
}

// TestUnservableBudget: keys whose heads are an hour ahead cost a dequeue
// nothing: the calls of a dequeue that serves the one ready key are the same
// with 200 and with 2,000 such keys, and bounded by the window.
func TestUnservableBudget(t *testing.T) {
	c := redistest.Private(t)
	count := func(blockers int) int64 {
		b := newBundle(t, c, true, nil)
		now := time.UnixMilli(1_900_000_000_000)
		for i := 0; i < blockers; i++ {
			enqueue(t, b, fmt.Sprintf("later%04d", i), 1, now.Add(time.Hour))
		}
		enqueue(t, b, "zready", 1, now.Add(-time.Second))
		var runs []*runqueue.Run
		st := measure(t, c, func() {
			var err error
			runs, err = b.q.Dequeue(b.ctx, "env", "q", 5)
			require.NoError(t, err)
		})
		require.Len(t, runs, 1)
		require.Equal(t, "zready", runs[0].Key)
		t.Logf("%d future-headed keys: %d commands", blockers, st.Commands().Calls)
		return st.Commands().Calls
	}
	small, large := count(200), count(2000)
	require.Equal(t, small, large, "dequeue cost must not depend on the number of future-headed keys")
	// maxCount 5, multiplier 3: window 15. A generous ceiling of 4 commands
	// per window slot over both passes plus the fixed part.
	require.LessOrEqual(t, small, int64(20+4*(2*15+15)))
}

// TestGatedBudget: 80 keys each at its per-key limit. A dequeue serves
// nothing; with the flag on it reads no gated key but the one the probe
// looks at (one SCARD), and its only writes are the scheduler's state hash
// (the discovery cursor and the probe's rank move on every call) and the
// probe's one ZADD that moves the variant it found at its limit to the back
// of the gating order (since 2026-12-05: without it, keys gated again at
// every call could keep the probe from ever coming back to one).
func TestGatedBudget(t *testing.T) {
	c := redistest.Private(t)
	for _, on := range []bool{false, true} {
		b := newBundle(t, c, on, func(cfg *runqueue.Config) { cfg.KeyConcurrency = 1 })
		past := time.UnixMilli(1_899_999_000_000)
		for k := 0; k < 80; k++ {
			enqueue(t, b, fmt.Sprintf("g%02d", k), 2, past)
		}
		for {
			runs, err := b.q.Dequeue(b.ctx, "env", "q", 10)
			require.NoError(t, err)
			if len(runs) == 0 {
				break
			}
		}
		var runs []*runqueue.Run
		st := measure(t, c, func() {
			var err error
			runs, err = b.q.Dequeue(b.ctx, "env", "q", 10)
			require.NoError(t, err)
		})
		require.Empty(t, runs)
		window := int64(10 * 3)
		t.Logf("flag %v: fully gated dequeue: %d commands, %d SCARD, %d us in the script",
			on, st.Commands().Calls, st["scard"].Calls, st.Scripts().Usec)
		if on {
			require.LessOrEqual(t, st["scard"].Calls, int64(1))
			require.Equal(t, int64(2), writes(st), "a call that serves nothing writes the state hash and the probe's move: %v", st)
			require.Equal(t, int64(1), st["hset"].Calls, "%v", st)
			require.Equal(t, int64(1), st["zadd"].Calls, "%v", st)
		} else {
			require.LessOrEqual(t, st["scard"].Calls, window)
		}
	}
}

// writes counts the write commands in st.
func writes(st redistest.Stats) int64 {
	var n int64
	for _, name := range []string{"zadd", "zrem", "set", "hset", "sadd", "srem", "expire", "del", "hincrby",
		"zremrangebyrank", "zremrangebyscore", "publish"} {
		n += st[name].Calls
	}
	return n
}

// TestLifecycleCost reports (does not assert) the Redis CPU and commands of
// a run's lifecycle: enqueue, dequeue in batches of 10, ack, flag off and on.
func TestLifecycleCost(t *testing.T) {
	c := redistest.Private(t)
	const n = 2000
	for _, on := range []bool{false, true} {
		b := newBundle(t, c, on, nil)
		past := time.UnixMilli(1_899_999_000_000)
		enq := measure(t, c, func() {
			for i := 0; i < n; i++ {
				_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: "env", Queue: "q", Key: fmt.Sprintf("k%d", i%20),
					ID: fmt.Sprint(i), Payload: []byte("payload"), AvailableAt: past})
				require.NoError(t, err)
			}
		})
		var runs []*runqueue.Run
		deq := measure(t, c, func() {
			for len(runs) < n {
				got, err := b.q.Dequeue(b.ctx, "env", "q", 10)
				require.NoError(t, err)
				require.NotEmpty(t, got)
				runs = append(runs, got...)
			}
		})
		ack := measure(t, c, func() {
			for _, r := range runs {
				require.NoError(t, b.q.Ack(b.ctx, r))
			}
		})
		// Script usec includes the redis.calls the scripts make; the
		// candidate reads Go sends before a dequeue script (a few cheap
		// reads per call, not per run) are in commands/run only.
		us := func(st redistest.Stats) float64 { return float64(st.Scripts().Usec) / n }
		total := 0.0
		for _, p := range []struct {
			name string
			st   redistest.Stats
		}{{"enqueue", enq}, {"dequeue (batch 10)", deq}, {"ack", ack}} {
			total += us(p.st)
			t.Logf("flag %-5v %-19s %6.2f us/run  %5.2f commands/run  %4.2f scripts/run",
				on, p.name, us(p.st), float64(p.st.Commands().Calls)/n, float64(p.st.Scripts().Calls)/n)
		}
		t.Logf("flag %-5v lifecycle           %6.2f us/run", on, total)
		for name, v := range deq {
			t.Logf("flag %-5v dequeue %-16s %6d calls %6d us", on, name, v.Calls, v.Usec)
		}
	}
}

// TestGatedCostFlat: the Redis commands of a dequeue call do not grow with
// the number of keys at their per-key limit. 10, 1,000 and 10,000 keys each
// hold their one allowed run in flight with one more queued; then a call
// of maxCount 1 serves a light key, and a second call finds nothing
// servable. Both cost the same number of commands at every size with the
// flag on (flag off reads its age window, which the gated keys fill).
func TestGatedCostFlat(t *testing.T) {
	c := redistest.Private(t)
	type cost struct{ serve, empty int64 }
	run := func(on bool, gated int) cost {
		b := newBundle(t, c, on, func(cfg *runqueue.Config) { cfg.KeyConcurrency = 1 })
		past := time.UnixMilli(1_899_999_000_000)
		for k := 0; k < gated; k++ {
			key := fmt.Sprintf("g%05d", k)
			for i := 0; i < 2; i++ {
				_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: "env", Queue: "q", Key: key,
					ID: fmt.Sprintf("%s-%d", key, i), Payload: []byte("p"), AvailableAt: past.Add(time.Duration(i) * time.Millisecond)})
				require.NoError(t, err)
			}
		}
		held := 0
		for held < gated {
			runs, err := b.q.Dequeue(b.ctx, "env", "q", 1000)
			require.NoError(t, err)
			require.NotEmpty(t, runs)
			held += len(runs)
		}
		enqueue(t, b, "light", 1, past)
		var out cost
		st := measure(t, c, func() {
			runs, err := b.q.Dequeue(b.ctx, "env", "q", 1)
			require.NoError(t, err)
			require.Len(t, runs, 1)
			require.Equal(t, "light", runs[0].Key)
		})
		out.serve = st.Commands().Calls
		st = measure(t, c, func() {
			runs, err := b.q.Dequeue(b.ctx, "env", "q", 1)
			require.NoError(t, err)
			require.Empty(t, runs)
		})
		out.empty = st.Commands().Calls
		t.Logf("flag %-5v %6d gated keys: serving call %3d commands, empty call %3d commands", on, gated, out.serve, out.empty)
		return out
	}
	for _, on := range []bool{false, true} {
		small, mid, large := run(on, 10), run(on, 1000), run(on, 10000)
		if on {
			require.Equal(t, small, mid, "flag on: 10 vs 1,000 gated keys")
			require.Equal(t, mid, large, "flag on: 1,000 vs 10,000 gated keys")
		}
	}
}

// TestEnqueueManyCommands: an EnqueueMany of many runs with no admission
// limit writes each kind of data in one command (the records, each
// variant's set, the indexes, the depth counts), after one read of the ids
// and its index writes only where an earlier run of the variant does not
// make them no-ops; below 32 runs, or with MaxQueueDepth (whose admission
// reads the depth before each run), it goes run by run, with the same
// index writes.
func TestEnqueueManyCommands(t *testing.T) {
	c := redistest.Private(t)
	now := time.UnixMilli(1_900_000_000_000)
	for _, on := range []bool{false, true} {
		for _, tc := range []struct {
			name             string
			keys, runs       int
			delayed, limited bool
			indexZadds       int64 // ckIndex or delayIndex ZADDs
			// The wide sets (lua/lib/place.lua): the call that takes the
			// queue's count past 64 (in bulk, the call; run by run under
			// MaxQueueDepth, the 64th run) looks at the sets it placed 4
			// runs or more in and at the index (a ZCARD each), and a set
			// of 64 to 128 members gets the mark (a ZADD and a ZREM): the
			// one key's set, not ten keys' sets of 10. It looks at the
			// runs hash too (an HLEN), which gets its mark (an HSETNX and
			// an HDEL): 64 to 512 runs of small records.
			zcards, widened int64
		}{
			// one key: its first run, then every tenth run (older than
			// all before it); ten keys: one each, and key 9's ten runs.
			{name: "one key", keys: 1, runs: 100, indexZadds: 11, zcards: 2, widened: 1},
			{name: "ten keys", keys: 10, runs: 100, indexZadds: 19, zcards: 11},
			{name: "one key delayed", keys: 1, runs: 100, delayed: true, indexZadds: 11, zcards: 2, widened: 1},
			{name: "one key, MaxQueueDepth", keys: 1, runs: 100, limited: true, indexZadds: 11, zcards: 2, widened: 1},
			{name: "one key, 20 runs", keys: 1, runs: 20, indexZadds: 3},
		} {
			t.Run(fmt.Sprintf("on=%v/%s", on, tc.name), func(t *testing.T) {
				b := newBundle(t, c, on, func(cfg *runqueue.Config) {
					if tc.limited {
						cfg.MaxQueueDepth = 1000
					}
				})
				at := now.Add(-time.Second)
				if tc.delayed {
					at = now.Add(time.Hour)
				}
				// Run i is i ms after at, but every tenth run (i%10 == 9)
				// i ms before it, older than every run before it: its
				// variant's index entry moves down then, and only then.
				var ps []runqueue.EnqueueParams
				for i := range tc.runs {
					d := time.Duration(i) * time.Millisecond
					if i%10 == 9 {
						d = -d
					}
					ps = append(ps, runqueue.EnqueueParams{Env: "env", Queue: "q", Key: fmt.Sprintf("k%d", i%tc.keys),
						ID: fmt.Sprint(i), Payload: []byte("p"), AvailableAt: at.Add(d)})
				}
				st := measure(t, c, func() {
					res, err := b.q.EnqueueMany(b.ctx, ps)
					require.NoError(t, err)
					for _, r := range res {
						require.True(t, r.Queued)
					}
				})
				runs := int64(tc.runs)
				var zadds, wideRuns int64
				if tc.runs >= 64 {
					wideRuns = 1
				}
				require.Equal(t, wideRuns, st["hlen"].Calls)
				if !on {
					require.Equal(t, wideRuns, st["hdel"].Calls)
				}
				if tc.limited || tc.runs < 32 {
					// Run by run: a HSETNX each, and a depth count each
					// when admission reads it (else one); ZADD: each run
					// into its set, the index entries that moved, and the
					// master's score each time one did (LT).
					hincrby := int64(1)
					if tc.limited {
						hincrby = runs
					}
					require.Equal(t, runs+wideRuns, st["hsetnx"].Calls)
					require.Equal(t, hincrby, st["hincrby"].Calls)
					zadds = runs + 2*tc.indexZadds
				} else {
					// In bulk: the records in one HSET, each variant's set
					// in one ZADD, the same index entries, and the
					// master's score once.
					require.Equal(t, wideRuns, st["hsetnx"].Calls)
					require.Equal(t, int64(1), st["hincrby"].Calls)
					zadds = int64(tc.keys) + tc.indexZadds + 1
					if !on {
						// (Flag on, the registrations read and write the
						// scheduler's hash too.)
						require.Equal(t, int64(1), st["hmget"].Calls)
						require.Equal(t, int64(1), st["hset"].Calls)
					}
				}
				if on && !tc.delayed {
					// The scheduler's state is created (its sentinel), and
					// the keys register together, in one ZADD, however
					// many there are (sched_register_many).
					zadds += 2
				}
				require.Equal(t, tc.zcards, st["zcard"].Calls)
				zadds += tc.widened
				if !on {
					require.Equal(t, tc.widened, st["zrem"].Calls)
				}
				require.Equal(t, zadds, st["zadd"].Calls)
				stats, err := b.q.QueueStats(b.ctx, "env", "q")
				require.NoError(t, err)
				want := [2]int64{runs, 0}
				if tc.delayed {
					want = [2]int64{0, runs}
				}
				require.Equal(t, want, [2]int64{stats.Ready, stats.Delayed})
			})
		}
	}
}

// TestDelayedWriteWakeCommands: what a delayed run's enqueue reads and
// publishes (lua/lib/place.lua, place_soonest): into a queue whose master
// score it moves (an idle queue), a PUBLISH and no read; into a queue that
// holds due work, one ZCOUNT of the delay index, and a PUBLISH when the
// run is the queue's first delayed work due after now (none other due at
// or before it: helper-193, runs due together); none of either
// when its key has earlier delayed work (the index entry does not move).
// A Nack with a retry time places the run the same way.
func TestDelayedWriteWakeCommands(t *testing.T) {
	c := redistest.Private(t)
	now := time.UnixMilli(1_900_000_000_000)
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("on=%v", on), func(t *testing.T) {
			b := newBundle(t, c, on, nil)
			one := func(key, id string, at time.Time) redistest.Stats {
				return measure(t, c, func() {
					ok, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: "env", Queue: "q", Key: key,
						ID: id, Payload: []byte("p"), AvailableAt: at})
					require.NoError(t, err)
					require.True(t, ok)
				})
			}
			check := func(st redistest.Stats, reads, publishes int64, what string) {
				t.Helper()
				require.Equal(t, reads, st["zcount"].Calls, what+": reads of the delay index")
				require.Equal(t, publishes, st["publish"].Calls, what+": wake-ups")
			}
			check(one("a", "d0", now.Add(time.Minute)), 0, 1, "idle queue: the master score moves")
			check(one("r", "r0", now.Add(-time.Second)), 0, 1, "a ready run: the queue's earliest work")
			check(one("b", "d1", now.Add(30*time.Second)), 1, 1, "first delayed work beside due work")
			check(one("c", "d2", now.Add(45*time.Second)), 1, 0, "after other delayed work")
			check(one("e", "d4", now.Add(30*time.Second)), 1, 0, "with other delayed work")
			check(one("b", "d3", now.Add(40*time.Second)), 0, 0, "its key's entry does not move")
			one("s", "r1", now.Add(-time.Second)) // (due work left when one is taken)
			runs, err := b.q.Dequeue(b.ctx, "env", "q", 1)
			require.NoError(t, err)
			require.Len(t, runs, 1)
			st := measure(t, c, func() {
				res, err := b.q.Nack(b.ctx, runs[0], &runqueue.NackOptions{RetryAt: now.Add(10 * time.Second)})
				require.NoError(t, err)
				require.True(t, res.Requeued)
			})
			check(st, 1, 1, "a nack's retry before the queue's delayed work")
		})
	}
}

// TestEnvWaitingCommands: what the env's waiting line (lua/lib/envwait.lua)
// adds to a flag-on dequeue. With an env limit that does not bind and no
// queue waiting, one ZCARD of the line, nothing else; without an env
// limit, nothing.
func TestEnvWaitingCommands(t *testing.T) {
	c := redistest.Private(t)
	calls := map[int]redistest.Stats{}
	for _, envLimit := range []int{0, 100} {
		b := newBundle(t, c, true, func(cfg *runqueue.Config) { cfg.EnvConcurrency = envLimit })
		past := time.UnixMilli(1_899_999_000_000)
		for k := 0; k < 5; k++ {
			enqueue(t, b, fmt.Sprintf("k%d", k), 4, past)
		}
		_, err := b.q.Dequeue(b.ctx, "env", "q", 2) // (the state's first calls)
		require.NoError(t, err)
		calls[envLimit] = measure(t, c, func() {
			runs, err := b.q.Dequeue(b.ctx, "env", "q", 2)
			require.NoError(t, err)
			require.Len(t, runs, 2)
		})
	}
	without, with := calls[0], calls[100]
	t.Logf("dequeue of 2: %d commands without an env limit, %d with one", without.Commands().Calls, with.Commands().Calls)
	require.Equal(t, without["zcard"].Calls+1, with["zcard"].Calls, "without %v\nwith %v", without, with)
	// (and the env's count, GET, which the capacity always read)
	require.Equal(t, without["get"].Calls+1, with["get"].Calls, "without %v\nwith %v", without, with)
	require.Equal(t, without.Commands().Calls+2, with.Commands().Calls, "without %v\nwith %v", without, with)
}

// TestEnvWaitingReleaseCommands: a flag-on Ack of a queue with an env
// limit and no queue of the env waiting runs one command more than without
// a limit: the EXISTS of the env's waiting line (the flag-on ack, not the
// plain one, with the same commands otherwise); a queue waiting adds the
// reads of the line and a PUBLISH (see docs/design.md, "Releases wake the
// line too").
func TestEnvWaitingReleaseCommands(t *testing.T) {
	c := redistest.Private(t)
	calls := map[int]redistest.Stats{}
	for _, envLimit := range []int{0, 100} {
		b := newBundle(t, c, true, func(cfg *runqueue.Config) { cfg.EnvConcurrency = envLimit })
		enqueue(t, b, "k0", 2, time.UnixMilli(1_899_999_000_000))
		runs, err := b.q.Dequeue(b.ctx, "env", "q", 2)
		require.NoError(t, err)
		require.Len(t, runs, 2)
		require.NoError(t, b.q.Ack(b.ctx, runs[0])) // (a first ack: scripts loaded, state made)
		calls[envLimit] = measure(t, c, func() {
			require.NoError(t, b.q.Ack(b.ctx, runs[1]))
		})
	}
	without, with := calls[0], calls[100]
	t.Logf("ack of 1: %d commands without an env limit, %d with one", without.Commands().Calls, with.Commands().Calls)
	require.Equal(t, without["exists"].Calls+1, with["exists"].Calls, "without %v\nwith %v", without, with)
	require.Equal(t, without.Commands().Calls+1, with.Commands().Calls, "without %v\nwith %v", without, with)
}
