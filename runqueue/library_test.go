package runqueue_test

import (
	"context"
	"fmt"
	"math/rand"
	randv2 "math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// cmdCounter counts the commands a client sends by name (inside pipelines
// or not), and the replies that were errors containing a given text.
type cmdCounter struct {
	mu    sync.Mutex
	sent  map[string]int
	match string
	hits  map[string]int
}

func countCommands(c redis.UniversalClient, match string) *cmdCounter {
	k := &cmdCounter{sent: map[string]int{}, hits: map[string]int{}, match: match}
	c.AddHook(afterEach(k.count))
	return k
}

func (k *cmdCounter) count(cmd redis.Cmder, err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.sent[cmd.Name()]++
	if a := cmd.Args(); cmd.Name() == "fcall" && len(a) > 1 {
		k.sent["fcall "+fmt.Sprint(a[1])]++
	}
	if err != nil && k.match != "" && strings.Contains(err.Error(), k.match) {
		k.hits[cmd.Name()]++
	}
}

func (k *cmdCounter) snapshot() (sent, hits map[string]int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	s, h := map[string]int{}, map[string]int{}
	for n, v := range k.sent {
		s[n] = v
	}
	for n, v := range k.hits {
		h[n] = v
	}
	return s, h
}

// libraryNames lists the function libraries a server holds.
func libraryNames(t *testing.T, ctx context.Context, c redis.Cmdable) []string {
	t.Helper()
	libs, err := c.FunctionList(ctx, redis.FunctionListQuery{}).Result()
	require.NoError(t, err)
	var out []string
	for _, l := range libs {
		out = append(out, l.Name)
	}
	return out
}

// runView is what a delivered run says, pointers aside.
func runView(rs []*runqueue.Run) string {
	var b strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&b, "%s/%s/%s p%d a%d t%d %q %d %d; ", r.Key, r.ID, r.Queue, r.Priority, r.Attempt, r.Token,
			r.Payload, r.AvailableAt.UnixMilli(), r.LeaseDeadline.UnixMilli())
	}
	return b.String()
}

// TestLibraryMatchesScripts: with the flag on, the scripts run as a Redis
// Functions library (FCALL) and as scripts (EVALSHA, Config.ScriptsOnly)
// give the same answers and leave the same stored data, call after call,
// through every script the library holds: enqueue (single and bulk),
// dequeue (acks carried too), ack with a key limit (it looks for gated
// keys), nack (requeue and dead-letter), lease recovery, TTL expiry and
// redrive, with weights, delays, priorities and TTLs. A call that saw
// state another call left in the library's top level would part the two.
func TestLibraryMatchesScripts(t *testing.T) {
	ctx := context.Background()
	fns, err := runqueue.FlagOnFunctions()
	require.NoError(t, err)
	ran := map[string]int{} // library function -> calls, over all subtests
	t.Cleanup(func() {
		for name, fn := range fns {
			t.Logf("%s: %d calls", name, ran[fn])
			require.Positive(t, ran[fn], "no step ran %s as a function", name)
		}
	})
	for _, kl := range []int{0, 2} {
		for seed := int64(1); seed <= 6; seed++ {
			t.Run(fmt.Sprintf("keylimit=%d/seed=%d", kl, seed), func(t *testing.T) {
				c := redistest.Real(t)
				cf, cs := otherClient(t, c), otherClient(t, c)
				kf, ks := countCommands(cf, ""), countCommands(cs, "")
				mk := func(c redis.UniversalClient, scriptsOnly bool) *testBundle {
					b := &testBundle{ctx: ctx, client: c, clock: newFakeClock(), prefix: redistest.Prefix(t)}
					b.cfg = &runqueue.Config{Prefix: b.prefix, Clock: b.clock, VtimeScheduling: true,
						KeyConcurrency: kl, ScriptsOnly: scriptsOnly, LeaseDuration: 10 * time.Minute,
						Rand: randv2.New(randv2.NewPCG(uint64(seed), 7))} // the same backoff jitter
					q, err := runqueue.New(ctx, c, b.cfg)
					require.NoError(t, err)
					t.Cleanup(func() { _ = q.Close() })
					b.q = q
					return b
				}
				bf, bs := mk(cf, false), mk(cs, true)
				r := rand.New(rand.NewSource(seed))
				var heldF, heldS []*runqueue.Run
				same := func(step string, a, b any) {
					t.Helper()
					require.Equal(t, fmt.Sprint(b), fmt.Sprint(a), step)
				}
				for step := 0; step < 120; step++ {
					now := bf.clock.Now()
					name := fmt.Sprintf("step %d", step)
					switch op := r.Intn(10); {
					case op < 3: // enqueue: one run (coalesced path) or a batch (bulk from 32)
						n := 1 + r.Intn(3)
						if r.Intn(3) == 0 {
							n = 32 + r.Intn(20)
						}
						var ps []runqueue.EnqueueParams
						for i := 0; i < n; i++ {
							p := runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprintf("k%d", r.Intn(9)),
								ID: fmt.Sprintf("r%d", r.Intn(400)), Payload: []byte{byte('a' + r.Intn(3))}, Priority: r.Intn(4)}
							switch r.Intn(4) {
							case 0:
								p.AvailableAt = now.Add(time.Duration(1+r.Intn(20)) * time.Minute)
							case 1:
								p.TTL = time.Duration(1+r.Intn(30)) * time.Minute
							}
							ps = append(ps, p)
						}
						resF, errF := bf.q.EnqueueMany(ctx, ps)
						resS, errS := bs.q.EnqueueMany(ctx, ps)
						same(name+" enqueue", fmt.Sprint(resF, errF), fmt.Sprint(resS, errS))
					case op < 6: // dequeue, sometimes carrying acks
						n := 1 + r.Intn(6)
						if len(heldF) > 0 && r.Intn(3) == 0 {
							k := r.Intn(len(heldF)) + 1
							gotF, errsF, errF := bf.q.AckAndDequeue(ctx, heldF[:k], env, queueName, n)
							gotS, errsS, errS := bs.q.AckAndDequeue(ctx, heldS[:k], env, queueName, n)
							same(name+" ack-and-dequeue", fmt.Sprint(runView(gotF), errsF, errF), fmt.Sprint(runView(gotS), errsS, errS))
							heldF, heldS = append(heldF[k:], gotF...), append(heldS[k:], gotS...)
							break
						}
						gotF, errF := bf.q.Dequeue(ctx, env, queueName, n)
						gotS, errS := bs.q.Dequeue(ctx, env, queueName, n)
						same(name+" dequeue", fmt.Sprint(runView(gotF), errF), fmt.Sprint(runView(gotS), errS))
						heldF, heldS = append(heldF, gotF...), append(heldS, gotS...)
					case op < 8 && len(heldF) > 0: // ack or nack one held run
						i := r.Intn(len(heldF))
						if r.Intn(2) == 0 {
							same(name+" ack", bf.q.Ack(ctx, heldF[i]), bs.q.Ack(ctx, heldS[i]))
						} else {
							opts := &runqueue.NackOptions{DeadLetter: r.Intn(4) == 0}
							if r.Intn(2) == 0 {
								opts.RetryAt = now.Add(time.Duration(r.Intn(5)) * time.Minute)
							}
							resF, errF := bf.q.Nack(ctx, heldF[i], opts)
							resS, errS := bs.q.Nack(ctx, heldS[i], opts)
							same(name+" nack", fmt.Sprint(resF, errF), fmt.Sprint(resS, errS))
						}
						heldF, heldS = append(heldF[:i], heldF[i+1:]...), append(heldS[:i], heldS[i+1:]...)
					case op == 8: // time passes: leases and TTLs run out, dead runs come back
						d := time.Duration(r.Intn(15)) * time.Minute
						bf.clock.Advance(d)
						bs.clock.Advance(d)
						for sh := 0; sh < bf.q.Shards(); sh++ {
							nF, errF := bf.q.RecoverLeases(ctx, sh, 100)
							nS, errS := bs.q.RecoverLeases(ctx, sh, 100)
							same(name+" recover", fmt.Sprint(nF, errF), fmt.Sprint(nS, errS))
							nF, errF = bf.q.ExpireTTL(ctx, sh, 100)
							nS, errS = bs.q.ExpireTTL(ctx, sh, 100)
							same(name+" expire", fmt.Sprint(nF, errF), fmt.Sprint(nS, errS))
						}
						dF, errF := bf.q.DeadLetters(ctx, env, queueName, 0, 5)
						dS, errS := bs.q.DeadLetters(ctx, env, queueName, 0, 5)
						require.NoError(t, errF)
						require.NoError(t, errS)
						require.Equal(t, len(dS), len(dF), name)
						if len(dF) > 0 {
							d := dF[r.Intn(len(dF))]
							same(name+" redrive", bf.q.Redrive(ctx, env, queueName, d.Key, d.ID),
								bs.q.Redrive(ctx, env, queueName, d.Key, d.ID))
						}
					default: // a weight
						k, w := fmt.Sprintf("k%d", r.Intn(9)), float64(1+r.Intn(4))/2
						same(name+" weight", bf.q.SetWeight(ctx, env, queueName, k, w), bs.q.SetWeight(ctx, env, queueName, k, w))
					}
					require.Equal(t, normDump(t, bs), normDump(t, bf), name)
				}
				sF, err := bf.q.Schedule(ctx, env, queueName, 20)
				require.NoError(t, err)
				sS, err := bs.q.Schedule(ctx, env, queueName, 20)
				require.NoError(t, err)
				require.Equal(t, sS, sF)

				// Each ran as it was asked to: the library by FCALL only,
				// the scripts by EVALSHA only.
				sentF, _ := kf.snapshot()
				sentS, _ := ks.snapshot()
				require.Positive(t, sentF["fcall"], "the library was not used")
				for _, fn := range fns {
					ran[fn] += sentF["fcall "+fn]
				}
				require.Zero(t, sentS["fcall"], "ScriptsOnly ran a function")
				require.Positive(t, sentS["evalsha"])
			})
		}
	}
}

// TestLibraryReloads: a server that lost the library (FUNCTION FLUSH, as a
// restart without persistence does) gets it again at the first call that
// finds no function, single or pipelined, and the call runs once.
func TestLibraryReloads(t *testing.T) {
	c := redistest.Private(t)
	k := countCommands(c, "Function not found")
	b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = true })
	enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "1"})
	require.NotEmpty(t, libraryNames(t, b.ctx, c))

	require.NoError(t, c.FunctionFlush(b.ctx).Err())
	require.Empty(t, libraryNames(t, b.ctx, c))
	enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "2"}) // coalesced: pipelined
	require.Len(t, libraryNames(t, b.ctx, c), 1)
	_, hits := k.snapshot()
	require.Equal(t, 1, hits["fcall"], "the call that found no function")

	require.NoError(t, c.FunctionFlush(b.ctx).Err())
	runs := dequeue(t, b, queueName, 5) // a single call
	require.Equal(t, []string{"1", "2"}, runIDs(runs))
	_, hits = k.snapshot()
	require.Equal(t, 2, hits["fcall"])
	ackAll(t, b, runs)
	st := queueStats(t, b, queueName)
	require.Zero(t, st.Ready+st.InFlight, "each run ran once")
}

// TestLibraryFallsBack: where FUNCTION is refused (an ACL without it) or
// unwanted (ScriptsOnly), New loads no library and the flag-on scripts
// run by EVALSHA; where the flag is off, nothing is loaded either.
func TestLibraryFallsBack(t *testing.T) {
	ctx := context.Background()
	c := redistest.Private(t).(*redis.Client)
	require.NoError(t, c.FunctionFlush(ctx).Err())

	for _, tc := range []struct {
		name string
		mut  func(*runqueue.Config)
	}{
		{"flag off", func(cfg *runqueue.Config) {}},
		{"scripts only", func(cfg *runqueue.Config) { cfg.VtimeScheduling, cfg.ScriptsOnly = true, true }},
	} {
		o := otherClient(t, c)
		k := countCommands(o, "")
		b := setup(t, o, tc.mut)
		enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "1"})
		ackAll(t, b, dequeue(t, b, queueName, 1))
		require.Empty(t, libraryNames(t, ctx, c), tc.name)
		sent, _ := k.snapshot()
		require.Zero(t, sent["fcall"]+sent["function"], tc.name)
	}

	// A user that may not run FUNCTION: New falls back without an error.
	user := "nofn" + fmt.Sprint(time.Now().UnixNano())
	require.NoError(t, c.Do(ctx, "ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", "-function").Err())
	t.Cleanup(func() { c.Do(context.Background(), "ACL", "DELUSER", user) })
	opts := *c.Options()
	opts.Username, opts.Password = user, "pw"
	u := redis.NewClient(&opts)
	t.Cleanup(func() { _ = u.Close() })
	k := countCommands(u, "NOPERM")
	b := setup(t, u, func(cfg *runqueue.Config) { cfg.VtimeScheduling = true })
	enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "1"})
	require.Equal(t, []string{"1"}, runIDs(dequeue(t, b, queueName, 1)))
	require.Empty(t, libraryNames(t, ctx, c))
	sent, hits := k.snapshot()
	require.Equal(t, 1, hits["function"], "New tried the library once")
	require.Zero(t, sent["fcall"])
	require.Positive(t, sent["evalsha"])

	// A user that may load the library but not call it: the first FCALL
	// is refused before it runs, and that call and every later one run
	// by EVALSHA.
	user = "nofcall" + fmt.Sprint(time.Now().UnixNano())
	require.NoError(t, c.Do(ctx, "ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", "-fcall").Err())
	t.Cleanup(func() { c.Do(context.Background(), "ACL", "DELUSER", user) })
	opts.Username = user
	u2 := redis.NewClient(&opts)
	t.Cleanup(func() { _ = u2.Close() })
	k = countCommands(u2, "NOPERM")
	b = setup(t, u2, func(cfg *runqueue.Config) { cfg.VtimeScheduling = true })
	require.NotEmpty(t, libraryNames(t, ctx, c), "FUNCTION LOAD is allowed")
	enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "1"})
	enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "2"})
	require.Equal(t, []string{"1", "2"}, runIDs(dequeue(t, b, queueName, 5)))
	sent, hits = k.snapshot()
	require.Equal(t, 1, sent["fcall"], "one FCALL, refused; the library is off after it")
	require.Equal(t, 1, hits["fcall"])
	require.GreaterOrEqual(t, sent["evalsha"], 3)
}

// TestLibraryPrunesOtherVersions: New deletes the libraries of other
// runqueue versions (each loaded library makes every FCALL cost more) and
// leaves any other library alone; an instance whose library went loads it
// again at its next call and runs it once.
func TestLibraryPrunesOtherVersions(t *testing.T) {
	c := redistest.Private(t)
	ctx := context.Background()
	require.NoError(t, c.FunctionFlush(ctx).Err())
	load := func(name string) {
		require.NoError(t, c.FunctionLoad(ctx, "#!lua name="+name+"\nredis.register_function('"+name+
			"_f', function() return 1 end)\n").Err())
	}
	load("runqueue_0123456789abcdef")
	load("runqueue_fedcba9876543210")
	load("runqueue_mine") // not a runqueue version's name
	load("app")

	first := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = true })
	enqueue(t, first, runqueue.EnqueueParams{Key: "a", ID: "1"})
	mine := libraryNames(t, ctx, c)
	require.Len(t, mine, 3)
	require.Subset(t, mine, []string{"runqueue_mine", "app"})

	// Another version's New deletes this one's library; its next calls
	// load it again.
	load("runqueue_aaaaaaaaaaaaaaaa")
	for _, n := range mine {
		if n != "runqueue_mine" && n != "app" {
			require.NoError(t, c.FunctionDelete(ctx, n).Err())
		}
	}
	enqueue(t, first, runqueue.EnqueueParams{Key: "a", ID: "2"})
	require.Equal(t, []string{"1", "2"}, runIDs(dequeue(t, first, queueName, 5)))
	require.ElementsMatch(t, append(mine, "runqueue_aaaaaaaaaaaaaaaa"), libraryNames(t, ctx, c))
}
