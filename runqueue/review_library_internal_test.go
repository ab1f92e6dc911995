package runqueue

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
)

// TestReviewLibraryMixedPipeline: one pipeline holding FCALLs (the flag-on
// requeue, from the library) and EVALSHAs (extend, a flag-off script),
// after the server lost its functions and its script cache (as a restart
// without persistence does): each FCALL is resent once after a reload,
// each EVALSHA once as EVAL, in the calls' order, and each does its work
// once. After a loss of the functions alone, the EVALSHAs that ran in the
// pipeline are not sent again.
//
// Not parallel: FUNCTION FLUSH and SCRIPT FLUSH on the binary's own server
// (see TestRunPipelinedRecoversNoScript).
func TestReviewLibraryMixedPipeline(t *testing.T) {
	c := redistest.Private(t)
	ctx := context.Background()
	counter := newEvalCounter(c)
	clock := fixedClock{time.UnixMilli(2_000_000_000_000)}
	q, err := New(ctx, c, &Config{Prefix: redistest.Prefix(t), Shards: 1, VtimeScheduling: true, Clock: clock,
		LeaseDuration: time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	require.NotNil(t, q.scripts.requeue.lib, "the library was not loaded")
	require.Nil(t, q.scripts.extend.lib)
	for i := range 8 {
		_, err := q.Enqueue(ctx, EnqueueParams{Env: "env", Queue: "q", Key: fmt.Sprint("k", i%4), ID: fmt.Sprint("r", i),
			Payload: []byte("p")})
		require.NoError(t, err)
	}
	var runs []*Run
	for len(runs) < 8 {
		got, err := q.Dequeue(ctx, "env", "q", 8-len(runs))
		require.NoError(t, err)
		require.NotEmpty(t, got)
		runs = append(runs, got...)
	}
	now := clock.Now().UnixMilli()
	mixed := func(rs []*Run) []call {
		var calls []call
		for i, r := range rs {
			if i%2 == 0 {
				calls = append(calls, q.requeueCall(r.ref(), r.Token, now, now, false))
			} else {
				calls = append(calls, q.extendCall(r, now+int64(time.Hour/time.Millisecond)))
			}
		}
		return calls
	}
	check := func(t *testing.T, rs []*Run, cmds []*redis.Cmd) {
		for i, cmd := range cmds {
			if i%2 == 0 {
				v, err := cmd.Int64Slice()
				require.NoError(t, err, "requeue %d", i)
				require.Equal(t, []int64{1, 2}, v, "requeue %d ran once", i)
			} else {
				require.NoError(t, cmd.Err(), "extend %d", i)
				score, err := c.ZScore(ctx, q.space.Env("env").Queue("q").Leases(), keys.RunMember(rs[i].ref())).Result()
				require.NoError(t, err)
				require.Equal(t, float64(now+int64(time.Hour/time.Millisecond)), score, "extend %d", i)
			}
		}
	}
	rq, ex := q.scripts.requeue.sha, q.scripts.extend.sha

	t.Run("BothLost", func(t *testing.T) {
		require.NoError(t, c.FunctionFlush(ctx).Err())
		require.NoError(t, c.ScriptFlush(ctx).Err())
		counter.reset()
		cmds, err := runPipelined(ctx, c, mixed(runs[:4]))
		require.NoError(t, err)
		check(t, runs[:4], cmds)
		evalsha, noscript, eval := counter.snapshot()
		require.Equal(t, 4, evalsha[rq], "FCALLs of requeue: 2 in the pipeline, 2 resent")
		require.Equal(t, 2, noscript[rq])
		require.Equal(t, 2, evalsha[ex])
		require.Equal(t, 2, noscript[ex])
		require.Equal(t, 2, eval[ex], "extend resent with its source, once each")
	})
	t.Run("FunctionsLost", func(t *testing.T) {
		require.NoError(t, c.FunctionFlush(ctx).Err())
		counter.reset()
		cmds, err := runPipelined(ctx, c, mixed(runs[4:]))
		require.NoError(t, err)
		check(t, runs[4:], cmds)
		evalsha, noscript, eval := counter.snapshot()
		require.Equal(t, 4, evalsha[rq])
		require.Equal(t, 2, noscript[rq])
		require.Equal(t, 2, evalsha[ex], "an EVALSHA that ran in the pipeline was sent again")
		require.Zero(t, noscript[ex])
		require.Empty(t, eval)
	})
}

// TestReviewLibraryNameResolution: every name a function of the library
// reads resolves as it does in the script it came from. With luac 5.1: the
// library reads no global but Redis's and Lua's own (a fragment's name
// that resolved to a local in a script, because the fragment defining it
// came earlier there, would be a global read in the library if that
// fragment came later in it, and fail at run time), nor does any flag-on
// script; no name is a local of the library's top level twice (the later
// would shadow the earlier for every function after it, unlike the
// scripts, where the scheduler's fragment sits inside hooks_vtime's
// closure); and the library's functions stay well within Lua 5.1's limits
// (60 upvalues a function, 200 locals a function), which only the library
// approaches: a body's every fragment name is an upvalue there.
func TestReviewLibraryNameResolution(t *testing.T) {
	luac := reviewLua(t, "luac")
	s, err := buildScripts(true)
	require.NoError(t, err)
	builtin := map[string]bool{"redis": true, "string": true, "math": true, "table": true, "tonumber": true,
		"tostring": true, "type": true, "ipairs": true, "pairs": true, "unpack": true, "select": true,
		"next": true, "error": true, "assert": true}
	dir := t.TempDir()
	listing := func(name, src string) string {
		p := filepath.Join(dir, name+".lua")
		require.NoError(t, os.WriteFile(p, []byte(src), 0o600))
		out, err := exec.Command(luac, "-p", "-l", "-l", p).CombinedOutput()
		require.NoError(t, err, "%s: %s", name, out)
		return string(out)
	}
	globals := func(l string) []string {
		seen := map[string]bool{}
		for _, m := range regexp.MustCompile(`GETGLOBAL\s+\S+\s+\S+\s+; (\S+)`).FindAllStringSubmatch(l, -1) {
			seen[m[1]] = true
		}
		var out []string
		for g := range seen {
			out = append(out, g)
		}
		sort.Strings(out)
		return out
	}

	lib := listing("library", strings.SplitN(s.lib.src, "\n", 2)[1]) // without the shebang
	for _, g := range globals(lib) {
		require.True(t, builtin[g], "the library reads global %s", g)
	}
	for _, e := range libraryScripts(s) {
		for _, g := range globals(listing(e.sc.name, e.sc.src)) {
			require.True(t, builtin[g] || g == "KEYS" || g == "ARGV", "script %s reads global %s", e.sc.name, g)
		}
	}

	// The main chunk's locals, each once.
	sections := strings.Split(lib, "\nlocals (")
	require.Greater(t, len(sections), 1)
	seen := map[string]int{}
	for _, line := range strings.Split(sections[1], "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 2 || strings.HasPrefix(line, "upvalues") {
			break
		}
		seen[f[1]]++
	}
	for name, n := range seen {
		require.Equal(t, 1, n, "top-level local %s defined %d times in the library", name, n)
	}

	maxUp, maxLocals := 0, 0
	for _, m := range regexp.MustCompile(`(?m)^\d+\+? params, \d+ slots, (\d+) upvalues?, (\d+) locals?`).FindAllStringSubmatch(lib, -1) {
		up, _ := strconv.Atoi(m[1])
		loc, _ := strconv.Atoi(m[2])
		maxUp, maxLocals = max(maxUp, up), max(maxLocals, loc)
	}
	t.Logf("library: %d top-level locals, at most %d upvalues and %d locals (declared) in a function", len(seen), maxUp, maxLocals)
	require.Less(t, maxUp, 50, "close to Lua 5.1's 60 upvalues: the library would not load")
	require.Less(t, len(seen), 180, "close to Lua 5.1's 200 locals in the library's top level")
}
