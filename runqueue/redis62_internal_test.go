package runqueue

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
)

// rule62 sends every EVALSHA of a known script as EVAL of that script
// behind a prologue that keeps Redis 6.2's rule for scripts run with
// lua-replicate-commands no, which Redis 7 no longer has: a write after a
// non-deterministic command (TIME) is refused unless the script called
// redis.replicate_commands() before its first write (6.2's scripting.c:
// "Write commands not allowed after non deterministic commands").
type rule62 struct{ srcs map[string]string }

func (h rule62) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h rule62) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.rewrite(cmd)
		return next(ctx, cmd)
	}
}

func (h rule62) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.rewrite(c)
		}
		return next(ctx, cmds)
	}
}

func (h rule62) rewrite(cmd redis.Cmder) {
	a := cmd.Args()
	if len(a) > 1 && strings.EqualFold(fmt.Sprint(a[0]), "evalsha") {
		if src, ok := h.srcs[fmt.Sprint(a[1])]; ok {
			a[0], a[1] = "eval", src
		}
	}
}

// rule62Prologue shadows the script's redis with one that keeps the rule;
// writes: the server's write commands (COMMAND's "write" flag).
func rule62Prologue(writes []string) string {
	var w strings.Builder
	for _, c := range writes {
		fmt.Fprintf(&w, "[%q] = true, ", c)
	}
	return `local redis = (function(r)
  local writes = { ` + w.String() + ` }
  local random = { time = true, randomkey = true, srandmember = true, hrandfield = true, zrandmember = true, spop = true }
  local nd, rep, wrote = false, false, false
  local function refused(cmd)
    cmd = string.lower(cmd)
    if writes[cmd] then
      if nd and not rep then return 'RQ62 Write commands not allowed after non deterministic commands: ' .. cmd end
      wrote = true
    end
    if random[cmd] then nd = true end
  end
  local t = setmetatable({}, { __index = r })
  t.call = function(cmd, ...)
    local e = refused(cmd)
    if e then error(r.error_reply(e)) end
    return r.call(cmd, ...)
  end
  t.pcall = function(cmd, ...)
    local e = refused(cmd)
    if e then return r.error_reply(e) end
    return r.pcall(cmd, ...)
  end
  t.replicate_commands = function()
    if wrote then return false end
    rep = true
    return true
  end
  return t
end)(redis)
`
}

// TestScriptsKeepRedis62WriteRule: the flag-on scripts, by EVALSHA as on
// Redis 6.2, never write after TIME without asking for effects
// replication first. The env's waiting line reads TIME and drops the dead
// marks it meets (writes): a dequeue asks first (dq_open), and so must an
// ack or requeue that reads the line after its release (helper-208: they
// did not; on 6.2 with lua-replicate-commands no they would fail after
// their writes). Each release below meets a dead mark.
func TestScriptsKeepRedis62WriteRule(t *testing.T) {
	base, ok := redistest.Real(t).(*redis.Client)
	require.True(t, ok)
	ctx := context.Background()
	info, err := base.Command(ctx).Result()
	require.NoError(t, err)
	var writes []string
	for name, ci := range info {
		for _, f := range ci.Flags {
			if f == "write" {
				writes = append(writes, strings.ToLower(name))
			}
		}
	}
	sort.Strings(writes)
	require.Contains(t, writes, "zrem")
	c := redis.NewClient(&redis.Options{Addr: base.Options().Addr, ReadTimeout: redistest.ReadTimeout})
	t.Cleanup(func() { _ = c.Close() })
	s, err := buildScripts(true)
	require.NoError(t, err)
	h := rule62{srcs: map[string]string{}}
	pro := rule62Prologue(writes)
	for _, sc := range s.all() {
		h.srcs[sc.sha] = pro + sc.src
	}
	c.AddHook(h)
	prefix := redistest.Prefix(t)
	q, err := New(ctx, c, &Config{Prefix: prefix, VtimeScheduling: true, ScriptsOnly: true, SerialCalls: true,
		LeaseDuration: time.Second, BlockPollInterval: 30 * time.Second,
		LimitsFor: func(string, string) Limits { return Limits{Env: 1} }})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	qk := q.space.Env("env").Queue("qa")
	lives := qk.Env.WaitingUntil()
	for _, queue := range []string{"qa", "qb", "qc"} {
		for i := range 5 {
			_, err := q.Enqueue(ctx, EnqueueParams{Env: "env", Queue: queue, Key: "k", ID: fmt.Sprint(queue, i)})
			require.NoError(t, err)
		}
	}
	take := func(queue string) []*Run {
		runs, _, err := q.AckAndDequeue(ctx, nil, "env", queue, 1)
		require.NoError(t, err, "a dequeue of %s", queue)
		return runs
	}
	// Each release meets a dead mark of qb (its life long past) ahead of
	// qc's live one, whose queue then takes the slot.
	dead := func() {
		require.Empty(t, take("qb"))
		require.Empty(t, take("qc"))
		require.NoError(t, c.HSet(ctx, lives, keys.QueueMember("env", "qb"), "1:1").Err())
	}
	held := take("qa")
	require.Len(t, held, 1)
	dead()
	require.NoError(t, q.Ack(ctx, held[0]), "an Ack that meets a dead mark")
	held = take("qc")
	require.Len(t, held, 1)
	dead()
	_, err = q.Nack(ctx, held[0], &NackOptions{RetryAt: time.Now().Add(time.Hour)})
	require.NoError(t, err, "a Nack that meets a dead mark")
	held = take("qc")
	require.Len(t, held, 1)
	dead()
	time.Sleep(1100 * time.Millisecond) // (past the run's lease of a second)
	n, err := q.RecoverLeases(ctx, q.ShardOf("env"), 10)
	require.NoError(t, err, "a lease recovery that meets a dead mark")
	require.Equal(t, 1, n)
	held = take("qc")
	require.Len(t, held, 1)
	dead()
	runs, errs, err := q.AckAndDequeue(ctx, held, "env", "qc", 1)
	require.NoError(t, err, "a dequeue that meets a dead mark")
	require.Equal(t, []error{nil}, errs)
	require.Len(t, runs, 1)
}
