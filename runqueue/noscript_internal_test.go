package runqueue

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
)

// evalCounter counts, per script SHA-1, the EVALSHA calls sent (inside
// pipelines or not), those answered NOSCRIPT, and the EVAL calls sent; an
// FCALL of a flag-on library function counts as an EVALSHA of its script.
type evalCounter struct {
	mu                      sync.Mutex
	evalsha, noscript, eval map[string]int
}

func newEvalCounter(c redis.UniversalClient) *evalCounter {
	e := &evalCounter{}
	e.reset()
	c.AddHook(e)
	return e
}

func (e *evalCounter) reset() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.evalsha, e.noscript, e.eval = map[string]int{}, map[string]int{}, map[string]int{}
}

func (e *evalCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (e *evalCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		e.count(cmd, err) // cmd.Err() is set from err after the hooks return
		return err
	}
}

func (e *evalCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			e.count(cmd, cmd.Err())
		}
		return err
	}
}

func (e *evalCounter) count(cmd redis.Cmder, err error) {
	args := cmd.Args()
	if len(args) < 2 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	switch cmd.Name() {
	case "evalsha":
		sha, _ := args[1].(string)
		e.evalsha[sha]++
		if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			e.noscript[sha]++
		}
	case "fcall":
		// A run of a library's function counts as a run of its script
		// (evalsha is the runs of each script, by SHA-1), and a function
		// not found as NOSCRIPT.
		fn, _ := args[1].(string)
		sha := "unknown function " + fn
		if s, err := buildScripts(true); err == nil {
			for _, sc := range s.all() {
				if sc.fn != "" && sc.fn == fn {
					sha = sc.sha
				}
			}
		}
		e.evalsha[sha]++
		if isNoFunction(err) {
			e.noscript[sha]++
		}
	case "eval":
		src, _ := args[1].(string)
		if s, err := buildScripts(false); err == nil {
			for _, sc := range s.all() {
				if sc != nil && sc.src == src {
					e.eval[sc.sha]++
					return
				}
			}
		}
		e.eval["unknown"]++
	}
}

func (e *evalCounter) snapshot() (evalsha, noscript, eval map[string]int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.evalsha, e.noscript, e.eval
}

// TestRunPipelinedRecoversNoScript checks the pipelined script runner after
// the script cache was lost: every call that met NOSCRIPT is resent with its
// source and does its work once; calls that did not (the script was still
// cached) are not sent again, since a write script must not run twice for
// one request; script errors stay attached to their own call.
//
// Not parallel: SCRIPT FLUSH empties the cache of the redis-server every
// test of this binary shares, and sequential top-level tests run alone, so
// no other test reloads a script between the flush and the pipeline. The
// real server is the binary's own (redistest.Private), never a shared
// REDIS_URL.
func TestRunPipelinedRecoversNoScript(t *testing.T) {
	backends := []redistest.Backend{
		{Name: "Mini", Client: redistest.Mini},
		{Name: "Real", Client: redistest.Private},
		{Name: "Cluster", Client: redistest.PrivateCluster},
	}
	for _, bk := range backends {
		t.Run(bk.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c := bk.Client(t)
			counter := newEvalCounter(c)
			scripts, err := buildScripts(false)
			require.NoError(t, err)
			space, err := keys.NewSpace(redistest.Prefix(t), 16)
			require.NoError(t, err)
			qk := space.Env("prod").Queue("q")
			v := qk.Variant("k")
			const now = int64(2_000_000_000_000)

			enqueue := func(id, body string) call {
				rec, off := appendRecord(nil, 0, now, 0, v.Member(), []byte(body))
				return call{sc: scripts.enqueue,
					keys: []string{qk.Runs(), qk.CkIndex(), qk.DelayIndex(), qk.Depth(), qk.Master(), qk.TTL()},
					args: []any{now, qk.VariantBase(), qk.Member(), "", 0, 0, keys.RunPrefix("prod", "q"), 1,
						keys.Segment(id), v.Member(), rec, off, now, now, 0}}
			}
			ack := func(id string) call {
				return call{sc: scripts.ack,
					keys: []string{qk.Runs(), qk.Held(), qk.KeyInflight(), qk.Env.InflightCount(), qk.Leases()},
					args: []any{now, keys.RunPrefix("prod", "q"), 1, v.Member(), keys.Segment(id), 1}}
			}
			// one is the single value of a call's reply (one run a call).
			one := func(cmd *redis.Cmd) any {
				vals, err := cmd.Slice()
				require.NoError(t, err)
				require.Len(t, vals, 1)
				return vals[0]
			}

			t.Run("AllFlushed", func(t *testing.T) {
				require.NoError(t, c.ScriptFlush(ctx).Err())
				counter.reset()
				cmds, err := runPipelined(ctx, c, []call{
					enqueue("1", "a"), enqueue("2", "b"), ack("2"), enqueue("1", "other"), enqueue("3", "c"),
				})
				require.NoError(t, err)
				require.Len(t, cmds, 5)
				for _, i := range []int{0, 1, 4} {
					require.Equal(t, int64(1), one(cmds[i]), "call %d", i)
				}
				require.Equal(t, "not_in_flight", one(cmds[2]))
				// Resent in order: the first enqueue of id 1 ran before this one.
				require.Equal(t, "conflict", one(cmds[3]))

				evalsha, noscript, eval := counter.snapshot()
				require.Positive(t, noscript[scripts.enqueue.sha], "the flush did not empty the cache")
				require.Positive(t, noscript[scripts.ack.sha], "the flush did not empty the cache")
				require.Positive(t, eval[scripts.enqueue.sha]+eval[scripts.ack.sha], "nothing was resent with its source")
				require.Zero(t, eval["unknown"])
				t.Logf("EVALSHA %v, NOSCRIPT %v, EVAL %v", evalsha, noscript, eval)

				fields, err := c.HKeys(ctx, qk.Runs()).Result()
				require.NoError(t, err)
				require.ElementsMatch(t, []string{"1", "2", "3"}, fields)
				raw, err := c.HGet(ctx, qk.Runs(), "1").Result()
				require.NoError(t, err)
				rec, ok := parseRecord(raw)
				require.True(t, ok)
				require.Equal(t, "a", rec.payload)
				require.Equal(t, "3", c.HGet(ctx, qk.Depth(), "r").Val())
			})

			t.Run("PartlyFlushed", func(t *testing.T) {
				// Only enqueue is cached: its calls succeed inside the
				// pipeline and must not run again; ack's are resent.
				require.NoError(t, c.ScriptFlush(ctx).Err())
				sha, err := c.ScriptLoad(ctx, scripts.enqueue.src).Result()
				require.NoError(t, err)
				require.Equal(t, scripts.enqueue.sha, sha)
				counter.reset()

				cmds, err := runPipelined(ctx, c, []call{enqueue("4", "d"), ack("4"), enqueue("5", "e")})
				require.NoError(t, err)
				require.Equal(t, int64(1), one(cmds[0]))
				require.Equal(t, "not_in_flight", one(cmds[1]))
				require.Equal(t, int64(1), one(cmds[2]))

				evalsha, noscript, eval := counter.snapshot()
				require.Equal(t, 2, evalsha[scripts.enqueue.sha], "a call that ran in the pipeline was sent again")
				require.Zero(t, noscript[scripts.enqueue.sha])
				require.Zero(t, eval[scripts.enqueue.sha])
				// ack: NOSCRIPT in the pipeline, then resent with its
				// source at once, once.
				require.Equal(t, 1, evalsha[scripts.ack.sha])
				require.Equal(t, 1, noscript[scripts.ack.sha])
				require.Equal(t, 1, eval[scripts.ack.sha], "ack was not resent with its source")
				require.Equal(t, "5", c.HGet(ctx, qk.Depth(), "r").Val())
			})

			t.Run("Cached", func(t *testing.T) {
				require.NoError(t, scripts.load(ctx, c, false))
				counter.reset()
				cmds, err := runPipelined(ctx, c, []call{enqueue("6", "f"), enqueue("6", "f")})
				require.NoError(t, err)
				require.Equal(t, int64(1), one(cmds[0]))
				require.Equal(t, int64(0), one(cmds[1]), "same id and body: a no-op")
				evalsha, noscript, eval := counter.snapshot()
				require.Equal(t, 2, evalsha[scripts.enqueue.sha])
				require.Empty(t, noscript)
				require.Empty(t, eval)
			})
		})
	}
}
