package runqueue

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// The flag-on scripts as one Redis Functions library.
//
// Redis runs a script's whole body at every EVALSHA, so every function a
// script defines is made again at every call: a closure costs Redis about
// 900 instructions (Redis 7.0), and a flag-on dequeue defined some 50 of
// the shared fragments' functions per call. A function library (FUNCTION
// LOAD, Redis 7.0 and later) runs its top level once, when it is loaded:
// the fragments' functions are made then, and a call (FCALL) runs only
// the script's own body.
//
// The library is built from the same files as the scripts: every fragment
// the flag-on scripts include, once, at the library's top level, each
// after the fragments it includes (also those it includes inside a
// function, like the scheduler inside hooks_vtime: the names resolve to
// the same definitions); then each script's own file, its include lines
// dropped, as the body of one registered function. A body reads KEYS and
// ARGV as a script does: they are locals of the library that each call
// sets first (a fragment that reads ARGV reads the call's). The fragments
// hold functions and constant tables only; nothing at their top level is
// written by a call, so no call sees another's state.
//
// The library's name carries the SHA-1 of its code, so instances of two
// versions load two libraries side by side and never replace each other's
// functions during a rolling upgrade. Where Redis has no FUNCTION command
// (before 7.0, miniredis) or refuses it (an ACL), the scripts run by
// EVALSHA as before; Config.ScriptsOnly asks for that everywhere. The
// flag-off scripts always run by EVALSHA: they stay the pinned scripts.

// library is the flag-on scripts that differ from flag off, as one
// Functions library.
type library struct {
	name string
	src  string
	mu   sync.Mutex // one load at a time
}

// libraryScripts are the scripts of a flag-on set that the library holds:
// every one built with the scheduler's code. (extend and setweight are the
// flag-off scripts; ackPlain is the flag-off ack.)
func libraryScripts(s *scriptSet) []struct {
	sc   *script
	file string
} {
	return []struct {
		sc   *script
		file string
	}{
		{s.enqueue, "enqueue.lua"}, {s.dequeue, "dequeue_vtime.lua"}, {s.ack, "ack.lua"},
		{s.requeue, "requeue.lua"}, {s.expire, "expire.lua"}, {s.redrive, "redrive.lua"},
	}
}

// buildLibrary assembles the library of a flag-on script set and names
// each of its scripts' functions (script.fn); it does not load anything.
func buildLibrary(s *scriptSet) (*library, error) {
	var frags []string // fragments in definition order
	done := map[string]bool{}
	var bodies strings.Builder
	for _, e := range libraryScripts(s) {
		raw, err := luaFS.ReadFile("lua/" + e.file)
		if err != nil {
			return nil, err
		}
		body, deps := cutIncludes(string(raw))
		for _, d := range deps {
			if err := orderFragment(d, done, &frags, 0); err != nil {
				return nil, fmt.Errorf("runqueue: library: %s: %w", e.file, err)
			}
		}
		fmt.Fprintf(&bodies, "\nredis.register_function('@LIB@_%s', function(keys, args)\nKEYS, ARGV = keys, args\n%send)\n",
			e.sc.name, body)
	}
	var b strings.Builder
	b.WriteString("-- runqueue's flag-on scripts as one library (see runqueue/library.go).\nlocal KEYS, ARGV\n")
	for _, f := range frags {
		b.WriteString(f)
	}
	b.WriteString(bodies.String())
	code, err := inlineConsts(b.String())
	if err != nil {
		return nil, fmt.Errorf("runqueue: library: %w", err)
	}
	sum := sha1.Sum([]byte(code))
	name := "runqueue_" + hex.EncodeToString(sum[:8])
	code = strings.ReplaceAll(code, "'@LIB@_", "'"+name+"_")
	for _, e := range libraryScripts(s) {
		e.sc.fn = name + "_" + e.sc.name
	}
	return &library{name: name, src: "#!lua name=" + name + "\n" + code}, nil
}

// cutIncludes returns src without its "--@include" lines, and the
// fragments they name in order ("hooks" is the flag-on hooks).
func cutIncludes(src string) (string, []string) {
	var b strings.Builder
	var deps []string
	for _, line := range strings.SplitAfter(src, "\n") {
		name, ok := strings.CutPrefix(strings.TrimLeft(line, " "), "--@include ")
		if !ok {
			b.WriteString(line)
			continue
		}
		name = strings.TrimSpace(name)
		if name == "hooks" {
			name = "hooks_vtime"
		}
		deps = append(deps, name)
	}
	return b.String(), deps
}

// orderFragment appends fragment name to frags after the fragments it
// includes, once.
func orderFragment(name string, done map[string]bool, frags *[]string, depth int) error {
	if done[name] {
		return nil
	}
	if depth > 4 {
		return fmt.Errorf("includes nest too deep at %q", name)
	}
	raw, err := luaFS.ReadFile("lua/lib/" + name + ".lua")
	if err != nil {
		return fmt.Errorf("fragment %q: %w", name, err)
	}
	src, deps := cutIncludes(string(raw))
	for _, d := range deps {
		if err := orderFragment(d, done, frags, depth+1); err != nil {
			return err
		}
	}
	if !strings.HasSuffix(src, "\n") {
		src += "\n"
	}
	done[name] = true
	*frags = append(*frags, src)
	return nil
}

// errNoFunctions: the server cannot run the library (no FUNCTION command,
// or not for this user); the scripts run by EVALSHA.
var errNoFunctions = errors.New("runqueue: Redis Functions unavailable")

// load loads the library on every master (every shard of a ring); a
// library of that name already there is the same code. It returns
// errNoFunctions when a server has no FUNCTION command or refuses it, and
// any other error as it is (a library Redis does not compile is a bug).
func (l *library) load(ctx context.Context, c redis.UniversalClient) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return eachServer(ctx, c, func(ctx context.Context, n redis.Cmdable) error {
		err := n.FunctionLoad(ctx, l.src).Err()
		var reply redis.Error
		if err == nil || !errors.As(err, &reply) {
			return err
		}
		msg := reply.Error()
		switch {
		case strings.Contains(msg, "already exists"):
			return nil
		case strings.HasPrefix(msg, "NOPERM"), strings.Contains(strings.ToLower(msg), "unknown command"):
			return errNoFunctions
		}
		return fmt.Errorf("runqueue: loading function library %s: %w", l.name, err)
	})
}

// isNoFunction: FCALL found no such function (a restart without
// persistence, FUNCTION FLUSH, a new master): load the library again.
func isNoFunction(err error) bool {
	return err != nil && strings.Contains(err.Error(), "Function not found")
}

// eachServer runs f on every master of a cluster, every shard of a ring,
// or the one server of any other client.
func eachServer(ctx context.Context, client redis.UniversalClient, f func(ctx context.Context, n redis.Cmdable) error) error {
	switch c := client.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return f(ctx, n) })
	case *redis.Ring:
		return c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error { return f(ctx, n) })
	default:
		return f(ctx, client)
	}
}
