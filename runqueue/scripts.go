package runqueue

import (
	"bufio"
	"context"
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/redis/go-redis/v9"
)

//go:embed lua/*.lua lua/lib/*.lua
var luaFS embed.FS

// script is one assembled Lua script, run by SHA-1.
type script struct {
	name  string
	src   string
	sha   string
	hooks bool // takes the scheduler's extra KEYS and ARGV when the flag is on
	// refused: the script belongs to a Queue opened with Config.ReadOnly;
	// running it is ErrReadOnly.
	refused bool
}

// scriptSet is the scripts of one flag state.
type scriptSet struct {
	enqueue, dequeue, ack, extend, requeue, expire, redrive, setweight *script
}

func (s *scriptSet) all() []*script {
	return []*script{s.enqueue, s.dequeue, s.ack, s.extend, s.requeue, s.expire, s.redrive, s.setweight}
}

// assemble expands "--@include NAME" lines with lua/lib/NAME.lua, in
// fragments too; "hooks" expands to the flag state's hook fragment.
// Fragments are never copied into scripts by hand, so shared code cannot
// drift between them.
func assemble(file string, vtime bool) (src string, hooks bool, err error) {
	raw, err := luaFS.ReadFile("lua/" + file)
	if err != nil {
		return "", false, err
	}
	var b strings.Builder
	hooks, err = expand(&b, file, raw, vtime, 0)
	return b.String(), hooks, err
}

func expand(b *strings.Builder, file string, raw []byte, vtime bool, depth int) (hooks bool, err error) {
	if depth > 4 {
		return false, fmt.Errorf("runqueue: %s: includes nest too deep", file)
	}
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name, ok := strings.CutPrefix(line, "--@include ")
		if !ok {
			b.WriteString(line)
			b.WriteByte('\n')
			continue
		}
		name = strings.TrimSpace(name)
		if name == "hooks" {
			hooks = true
			name = "hooks_off"
			if vtime {
				name = "hooks_vtime"
			}
		}
		frag, err := luaFS.ReadFile("lua/lib/" + name + ".lua")
		if err != nil {
			return false, fmt.Errorf("runqueue: %s includes %q: %w", file, name, err)
		}
		if len(frag) > 0 && frag[len(frag)-1] != '\n' {
			frag = append(frag, '\n')
		}
		if _, err := expand(b, name, frag, vtime, depth+1); err != nil {
			return false, err
		}
	}
	return hooks, sc.Err()
}

func newScript(name, file string, vtime bool) (*script, error) {
	src, hooks, err := assemble(file, vtime)
	if err != nil {
		return nil, err
	}
	sum := sha1.Sum([]byte(src))
	return &script{name: name, src: src, sha: hex.EncodeToString(sum[:]), hooks: hooks}, nil
}

// buildScripts assembles the script set of one flag state. With the flag on,
// scripts with hooks get the scheduler's fragment and dequeue is replaced by
// the fair dequeue; extend and setweight are the same in both states.
func buildScripts(vtime bool) (*scriptSet, error) {
	var s scriptSet
	var err error
	mk := func(dst **script, name, file string) {
		if err != nil {
			return
		}
		*dst, err = newScript(name, file, vtime)
	}
	suffix := ""
	if vtime {
		suffix = "_vtime"
	}
	mk(&s.enqueue, "enqueue"+suffix, "enqueue.lua")
	dq := "dequeue.lua"
	if vtime {
		dq = "dequeue_vtime.lua"
	}
	mk(&s.dequeue, "dequeue"+suffix, dq)
	mk(&s.ack, "ack"+suffix, "ack.lua")
	mk(&s.extend, "extend", "extend.lua")
	mk(&s.requeue, "requeue"+suffix, "requeue.lua")
	mk(&s.expire, "expire"+suffix, "expire.lua")
	mk(&s.redrive, "redrive"+suffix, "redrive.lua")
	mk(&s.setweight, "setweight", "setweight.lua")
	return &s, err
}

// FlagOffScripts returns the assembled source of every script that can run
// with the scheduler flag off, by name. Used by the golden SHA-1 pin.
func FlagOffScripts() (map[string]string, error) { return scriptSources(false) }

// FlagOnScripts returns the assembled source of every script that runs with
// the scheduler flag on, by name.
func FlagOnScripts() (map[string]string, error) { return scriptSources(true) }

func scriptSources(vtime bool) (map[string]string, error) {
	s, err := buildScripts(vtime)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, sc := range s.all() {
		out[sc.name] = sc.src
	}
	return out, nil
}

// load registers every script with Redis (on every master of a cluster), so
// a script that does not compile is a start-up error.
func (s *scriptSet) load(ctx context.Context, c redis.UniversalClient) error {
	names := make([]string, 0)
	byName := map[string]*script{}
	for _, sc := range s.all() {
		names = append(names, sc.name)
		byName[sc.name] = sc
	}
	sort.Strings(names)
	for _, n := range names {
		sc := byName[n]
		sha, err := c.ScriptLoad(ctx, sc.src).Result()
		if err != nil {
			return fmt.Errorf("runqueue: loading script %s: %w", sc.name, err)
		}
		if sha != sc.sha {
			return fmt.Errorf("runqueue: script %s: Redis reports SHA %s, want %s", sc.name, sha, sc.sha)
		}
	}
	return nil
}

func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// run executes sc by SHA, sending the source when Redis lost its script
// cache (restart, failover, SCRIPT FLUSH).
func run(ctx context.Context, c redis.Scripter, sc *script, keys []string, args ...any) *redis.Cmd {
	if sc.refused {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(ErrReadOnly)
		return cmd
	}
	cmd := c.EvalSha(ctx, sc.sha, keys, args...)
	if isNoScript(cmd.Err()) {
		cmd = c.Eval(ctx, sc.src, keys, args...)
	}
	return cmd
}

// call is one script call of a pipelined batch.
type call struct {
	sc   *script
	keys []string
	args []any
}

// runPipelined sends calls in one pipeline. go-redis does not fall back to
// EVAL inside a pipeline, so calls that failed with NOSCRIPT are reloaded
// and resent once.
func runPipelined(ctx context.Context, c redis.UniversalClient, calls []call) ([]*redis.Cmd, error) {
	for _, cl := range calls {
		if cl.sc.refused {
			return nil, ErrReadOnly
		}
	}
	cmds := make([]*redis.Cmd, len(calls))
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, cl := range calls {
			cmds[i] = p.EvalSha(ctx, cl.sc.sha, cl.keys, cl.args...)
		}
		return nil
	})
	if err != nil && !isNoScript(err) && !errors.As(err, new(redis.Error)) {
		return nil, err
	}
	for i, cmd := range cmds {
		if isNoScript(cmd.Err()) {
			// The cache is known to be missing it: send the source at once
			// (EVAL also caches it for the calls after).
			cmds[i] = c.Eval(ctx, calls[i].sc.src, calls[i].keys, calls[i].args...)
		}
	}
	return cmds, nil
}
