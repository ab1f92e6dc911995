package runqueue

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync/atomic"

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
	sem  chan struct{} // one load at a time (a channel: waiting honours the caller's ctx)
	// off: a server refused the library after New loaded it (an ACL
	// changed, a function name taken): the scripts run by EVALSHA.
	off atomic.Bool
}

// libEntry is one function of the library: the script it runs and the
// file its body comes from, and whether Redis may run it when full.
type libEntry struct {
	sc   *script
	file string
	// settles: the call starts by removing (acks, nacks, sweeps), so
	// EVALSHA runs it when Redis is out of memory (maxmemory reached,
	// noeviction): a script without flags is refused only at its first
	// write that may add, and these delete first. A function without
	// flags is refused before it runs, so these are registered with
	// 'allow-oom', and a full Redis can still settle runs and free memory.
	// So is the dequeue, with acks or without: run by EVALSHA, a serve's
	// first write removes runs from their ready sets (lib/dequeue's
	// dq_finish, which the flag-on dequeue runs before the scheduler's
	// writes), and a worker on a full Redis must get runs to ack them. The
	// enqueue is refused either way.
	settles bool
}

// libraryScripts are the scripts of a flag-on set that the library holds:
// every one built with the scheduler's code (extend, setweight and purge
// are the flag-off scripts; ackPlain is the flag-off ack).
func libraryScripts(s *scriptSet) []libEntry {
	return []libEntry{
		{s.enqueue, "enqueue.lua", false}, {s.dequeue, "dequeue_vtime.lua", true}, {s.ack, "ack.lua", true},
		{s.requeue, "requeue.lua", true}, {s.expire, "expire.lua", true}, {s.redrive, "redrive.lua", true},
	}
}

// fnSuffix is the part of an entry's function name after the library's.
func (e libEntry) fnSuffix() string { return e.sc.name }

// buildLibrary assembles the library of a flag-on script set and names
// each of its scripts' functions (script.fn); it does not load anything.
func buildLibrary(s *scriptSet) (*library, error) {
	var frags []string // fragments in definition order
	done := map[string]bool{}
	var bodies, regs strings.Builder
	for _, e := range libraryScripts(s) {
		raw, err := luaFS.ReadFile("lua/" + e.file)
		if err != nil {
			return nil, err
		}
		src, deps := cutIncludes(string(raw))
		for _, d := range deps {
			if err := orderFragment(d, done, &frags, 0); err != nil {
				return nil, fmt.Errorf("runqueue: library: %s: %w", e.file, err)
			}
		}
		if !strings.HasSuffix(src, "\n") {
			src += "\n"
		}
		fn := "script_" + e.sc.name // the local function that runs its body
		fmt.Fprintf(&bodies, "\nlocal function %s(keys, args)\nKEYS, ARGV = keys, args\n%send\n", fn, src)
		flags := ""
		if e.settles {
			flags = ", flags = { 'allow-oom' }"
		}
		fmt.Fprintf(&regs, "redis.register_function{ function_name = '@LIB@_%s', callback = %s%s }\n", e.fnSuffix(), fn, flags)
	}
	var b strings.Builder
	b.WriteString("-- runqueue's flag-on scripts as one library (see runqueue/library.go).\nlocal KEYS, ARGV\n")
	for _, f := range frags {
		b.WriteString(f)
	}
	b.WriteString(bodies.String())
	b.WriteString("\n")
	b.WriteString(regs.String())
	code, err := inlineConsts(b.String())
	if err != nil {
		return nil, fmt.Errorf("runqueue: library: %w", err)
	}
	sum := sha1.Sum([]byte(code))
	name := "runqueue_" + hex.EncodeToString(sum[:8])
	code = strings.ReplaceAll(code, "'@LIB@_", "'"+name+"_")
	for _, e := range libraryScripts(s) {
		e.sc.fn = name + "_" + e.fnSuffix()
	}
	return &library{name: name, src: "#!lua name=" + name + "\n" + code, sem: make(chan struct{}, 1)}, nil
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

// errNoFunctions: the server will not run the library (no FUNCTION
// command, not for this user, or a function name taken by another
// library); the scripts run by EVALSHA.
var errNoFunctions = errors.New("runqueue: Redis Functions unavailable")

// load loads the library on every master (every shard of a ring). Our
// library already there is the same code (its name is its code's hash).
// It returns errNoFunctions, and runs the scripts by EVALSHA from then on
// (off), when a server refuses the library for good: any error reply but
// a compile or registration error of the code itself (a bug, returned as
// it is, like a script Redis does not compile) or an OOM refusal (this
// call falls back; the next tries again). Other errors (an unreachable
// server) are returned as they are.
func (l *library) load(ctx context.Context, c redis.UniversalClient) error {
	select {
	case l.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-l.sem }()
	err := eachServer(ctx, c, func(ctx context.Context, n redis.Cmdable, _ string) error {
		err := n.FunctionLoad(ctx, l.src).Err()
		var reply redis.Error
		if err == nil || !errors.As(err, &reply) {
			return err
		}
		msg := reply.Error()
		switch {
		case strings.Contains(msg, "Library '"+l.name+"' already exists"):
			return nil
		case strings.Contains(msg, "Error compiling") || strings.Contains(msg, "Error registering"):
			return fmt.Errorf("runqueue: loading function library %s: %w", l.name, err)
		case isOOM(err):
			return err
		}
		return fmt.Errorf("%w (%s)", errNoFunctions, msg)
	})
	if errors.Is(err, errNoFunctions) {
		l.off.Store(true)
	}
	return err
}

// isOOM: Redis refused a command because it is full (maxmemory reached).
func isOOM(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "OOM")
}

// libraryName is the name of every runqueue library.
var libraryName = regexp.MustCompile(`^runqueue_[0-9a-f]{16}$`)

// prune deletes, on every master, the libraries of other runqueue
// versions (their names follow libraryName). Every library loaded makes
// each FCALL cost Redis more: Lua's garbage collector walks the functions'
// one Lua heap, which holds every library (a flag-on enqueue: 150,189
// instructions with one library loaded, 161,560 with four). An instance of
// another version still running loads its library again at its next call
// (see run), once per prune. Best effort: a server that refuses FUNCTION
// LIST or DELETE keeps them.
func (l *library) prune(ctx context.Context, c redis.UniversalClient) {
	_ = eachServer(ctx, c, func(ctx context.Context, n redis.Cmdable, _ string) error {
		libs, err := n.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: "runqueue_*"}).Result()
		if err != nil {
			return nil
		}
		for _, lib := range libs {
			if lib.Name != l.name && libraryName.MatchString(lib.Name) {
				_ = n.FunctionDelete(ctx, lib.Name).Err()
			}
		}
		return nil
	})
}

// isNoFunction: FCALL found no such function (a restart without
// persistence, FUNCTION FLUSH, a new master): load the library again.
func isNoFunction(err error) bool {
	return err != nil && strings.Contains(err.Error(), "Function not found")
}
