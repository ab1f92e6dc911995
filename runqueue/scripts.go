package runqueue

import (
	"bufio"
	"context"
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/keys"
)

//go:embed lua/*.lua lua/lib/*.lua
var luaFS embed.FS

// script is one assembled Lua script, run by SHA-1.
type script struct {
	name  string
	src   string
	sha   string
	hooks bool // built with the scheduler's hooks: takes its extra KEYS and ARGV
	// fn is the script's function in the flag-on library (library.go);
	// lib is set when the Queue loaded that library: the script then runs
	// by FCALL (unless the library went off), else by EVALSHA.
	fn  string
	lib *library
	// refused: the script belongs to a Queue opened with Config.ReadOnly;
	// running it is ErrReadOnly.
	refused bool
}

// scriptSet is the scripts of one flag state.
type scriptSet struct {
	enqueue, dequeue, ack, extend, requeue, expire, redrive, setweight, purge, repair *script
	// ackPlain, flag on only: the flag-off ack, for acks whose hooks would
	// do nothing (see Queue.ackScript).
	ackPlain *script
	// lib, flag on only: the scripts built with the scheduler's code as a
	// Functions library (library.go).
	lib *library
}

func (s *scriptSet) all() []*script {
	all := []*script{s.enqueue, s.dequeue, s.ack, s.extend, s.requeue, s.expire, s.redrive, s.setweight, s.purge, s.repair}
	if s.ackPlain != nil {
		all = append(all, s.ackPlain)
	}
	return all
}

// assemble expands "--@include NAME" lines with lua/lib/NAME.lua, in
// fragments too; "hooks" expands to the flag state's hook fragment. Tables
// of constants marked "--@inline" are written into the code (inline.go).
// Fragments are never copied into scripts by hand, so shared code cannot
// drift between them.
//
// The output depends only on the embedded sources and the flag, so each
// is built once a process (assembled): New builds every script of its
// flag state, and the build (fragments, constants, shake) took most of
// the CPU of a New, about 20 ms.
func assemble(file string, vtime bool) (src string, hooks bool, err error) {
	k := assembleKey{file, vtime}
	if r, ok := assembled.Load(k); ok {
		a := r.(assembledScript)
		return a.src, a.hooks, nil
	}
	if src, hooks, err = assembleSource(file, vtime); err != nil {
		return "", false, err
	}
	assembled.Store(k, assembledScript{src, hooks})
	return src, hooks, nil
}

// assembled holds assemble's output by file and flag state.
var assembled sync.Map // assembleKey -> assembledScript

type assembleKey struct {
	file  string
	vtime bool
}

type assembledScript struct {
	src   string
	hooks bool
}

// assembleSource is assemble without the memo.
func assembleSource(file string, vtime bool) (src string, hooks bool, err error) {
	raw, err := luaFS.ReadFile("lua/" + file)
	if err != nil {
		return "", false, err
	}
	var b strings.Builder
	if hooks, err = expand(&b, file, raw, vtime, 0, ""); err != nil {
		return "", false, err
	}
	src, err = inlineConsts(b.String())
	if err != nil {
		return "", false, fmt.Errorf("runqueue: %s: %w", file, err)
	}
	return shake(src), hooks, nil
}

// shake drops the top-level functions a script never refers to, with the
// comment lines right above them. The fragments are shared, so a script
// includes many functions it does not call, and Redis runs a script's
// whole body at every call: each definition makes a closure (about 70
// cost some 4 µs of Redis CPU a call, measured on Redis 7.0). A top-level
// function is a line "local function NAME(" at column 0 through the next
// line "end" at column 0 (the fragments indent everything inside). A
// function is kept when its name appears as a word in the code of the
// rest of the script or of a kept function (comments aside; the scripts
// never build code from strings). A one-line function is its own line; a
// source of any other shape (a top-level statement, or another function,
// before a function's end) is left whole. A call to a dropped function
// would fail only when it runs (Redis refuses the undeclared global then),
// so the shape rules err on keeping code, and TestShake and the review
// tests pin them.
func shake(src string) string {
	lines := strings.SplitAfter(src, "\n")
	type block struct {
		name       string
		start, end int // lines[start:end], leading comments included
	}
	var blocks []block
	for i := 0; i < len(lines); i++ {
		rest, ok := strings.CutPrefix(lines[i], "local function ")
		if !ok {
			continue
		}
		name, _, ok := strings.Cut(rest, "(")
		if !ok {
			continue
		}
		j := i // a one-line function ends on its own line
		if !oneLine(lines[i]) {
			for j = i + 1; j < len(lines) && strings.TrimRight(lines[j], "\n") != "end"; j++ {
				if strings.HasPrefix(lines[j], "local function ") || (lines[j] != "" && !startsIndented(lines[j])) {
					return src // another top-level statement before the end: not the shape this expects
				}
			}
			if j == len(lines) {
				return src
			}
		}
		start := i
		for start > 0 && strings.HasPrefix(lines[start-1], "--") && !strings.HasPrefix(lines[start-1], "--@") {
			start--
		}
		if n := len(blocks); n > 0 && start < blocks[n-1].end {
			start = blocks[n-1].end
		}
		blocks = append(blocks, block{name, start, j + 1})
		i = j
	}
	inBlock := make([]int, len(lines)) // block index + 1 of each line, 0 outside
	for k, bl := range blocks {
		for i := bl.start; i < bl.end; i++ {
			inBlock[i] = k + 1
		}
	}
	var outside strings.Builder
	for i, l := range lines {
		if inBlock[i] == 0 {
			outside.WriteString(l)
		}
	}
	text := func(bl block) string { return stripComments(strings.Join(lines[bl.start:bl.end], "")) }
	kept := make([]bool, len(blocks))
	seen := stripComments(outside.String())
	for changed := true; changed; {
		changed = false
		for k, bl := range blocks {
			if !kept[k] && mentions(seen, bl.name) {
				kept[k], changed = true, true
				seen += text(bl)
			}
		}
	}
	var b strings.Builder
	for i, l := range lines {
		if k := inBlock[i]; k == 0 || kept[k-1] {
			b.WriteString(l)
		}
	}
	return b.String()
}

// oneLine reports whether a "local function" line is the whole function:
// its code (comments aside) ends with the keyword end.
func oneLine(line string) bool {
	code := strings.TrimSpace(stripComments(line))
	return strings.HasSuffix(code, " end") || strings.HasSuffix(code, ")end")
}

// startsIndented reports whether a line inside a top-level function is
// indented, blank or a comment, as every line of the fragments' functions
// is; anything else at column 0 is a top-level statement.
func startsIndented(line string) bool {
	return line[0] == ' ' || line[0] == '\t' || line[0] == '\n' || strings.HasPrefix(line, "--")
}

// mentions reports whether name occurs in s as a whole word outside its
// own definition line.
func mentions(s, name string) bool {
	for off := 0; ; {
		i := strings.Index(s[off:], name)
		if i < 0 {
			return false
		}
		i += off
		j := i + len(name)
		off = j
		if (i > 0 && isIdent(s[i-1])) || (j < len(s) && isIdent(s[j])) {
			continue
		}
		if strings.HasSuffix(s[:i], "local function ") {
			continue
		}
		return true
	}
}

// stripComments drops Lua "--" comments (outside quoted strings) to the
// end of their line.
func stripComments(s string) string {
	var b strings.Builder
	var quote byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			if c == '\\' && i+1 < len(s) {
				b.WriteByte(c)
				i++
				c = s[i]
			} else if c == quote || c == '\n' {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '-' && i+1 < len(s) && s[i+1] == '-':
			for i < len(s) && s[i] != '\n' {
				i++
			}
			if i < len(s) {
				b.WriteByte('\n')
			}
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

func isIdent(c byte) bool {
	return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// An indented include line indents the fragment by the same prefix (a
// fragment included inside a function stays inside it for the reader, and
// for shake).
func expand(b *strings.Builder, file string, raw []byte, vtime bool, depth int, indent string) (hooks bool, err error) {
	if depth > 4 {
		return false, fmt.Errorf("runqueue: %s: includes nest too deep", file)
	}
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		body := strings.TrimLeft(line, " ")
		name, ok := strings.CutPrefix(body, "--@include ")
		if !ok {
			if line != "" {
				b.WriteString(indent)
			}
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
		if _, err := expand(b, name, frag, vtime, depth+1, indent+line[:len(line)-len(body)]); err != nil {
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
	// A flag-off build includes hooks_off, which takes no scheduler KEYS
	// or ARGV.
	return &script{name: name, src: src, sha: hex.EncodeToString(sum[:]), hooks: hooks && vtime}, nil
}

// buildScripts assembles the script set of one flag state. With the flag on,
// scripts with hooks get the scheduler's fragment and dequeue is replaced by
// the fair dequeue; extend, setweight, purge and repair are the same in both
// states.
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
	if vtime && err == nil {
		s.ackPlain, err = newScript("ack", "ack.lua", false)
	}
	mk(&s.extend, "extend", "extend.lua")
	mk(&s.requeue, "requeue"+suffix, "requeue.lua")
	mk(&s.expire, "expire"+suffix, "expire.lua")
	mk(&s.redrive, "redrive"+suffix, "redrive.lua")
	mk(&s.setweight, "setweight", "setweight.lua")
	mk(&s.purge, "purge", "purge.lua")
	mk(&s.repair, "repair", "repair.lua")
	if vtime && err == nil {
		s.lib, err = buildLibrary(&s)
	}
	return &s, err
}

// load registers every script with Redis (on every master of a cluster), so
// a script that does not compile is a start-up error; with functions, the
// flag-on set's library too, and its scripts run by FCALL from then on
// (where the server has Redis Functions: else by EVALSHA).
func (s *scriptSet) load(ctx context.Context, c redis.UniversalClient, functions bool) error {
	names := make([]string, 0)
	byName := map[string]*script{}
	for _, sc := range s.all() {
		if byName[sc.name] == nil { // (the settling dequeue is the dequeue)
			names = append(names, sc.name)
		}
		byName[sc.name] = sc
	}
	sort.Strings(names)
	// The scripts Redis has already (every master's, on a cluster: their
	// SHAs name these very sources, so they compiled) are not sent again:
	// one round trip instead of one a script. A server that refuses
	// SCRIPT EXISTS gets every script sent, as before.
	shas := make([]string, len(names))
	for i, n := range names {
		shas[i] = byName[n].sha
	}
	have, err := c.ScriptExists(ctx, shas...).Result()
	if err != nil || len(have) != len(names) {
		have = make([]bool, len(names))
	}
	for i, n := range names {
		if have[i] {
			continue
		}
		sc := byName[n]
		sha, err := c.ScriptLoad(ctx, sc.src).Result()
		if err != nil {
			return fmt.Errorf("runqueue: loading script %s: %w", sc.name, err)
		}
		if sha != sc.sha {
			return fmt.Errorf("runqueue: script %s: Redis reports SHA %s, want %s", sc.name, sha, sc.sha)
		}
	}
	if s.lib == nil || !functions {
		return nil
	}
	switch err := s.lib.load(ctx, c); {
	case errors.Is(err, errNoFunctions):
		return nil
	case isOOM(err):
		// A Redis at maxmemory refuses FUNCTION LOAD: this instance runs
		// the scripts by EVALSHA (loaded above), so that it starts and can
		// settle runs and free memory.
		return nil
	case err != nil:
		return err
	}
	s.lib.prune(ctx, c)
	for _, e := range libraryScripts(s) {
		e.sc.lib = s.lib
	}
	return nil
}

func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// run executes sc: by FCALL when its library is loaded, else by SHA;
// recover mends the calls that found no script or function.
func run(ctx context.Context, c redis.UniversalClient, sc *script, keys []string, args ...any) *redis.Cmd {
	if sc.refused {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(ErrReadOnly)
		return cmd
	}
	cl := call{sc, fenced(keys), args}
	return recoverCall(ctx, c, cl, send(ctx, c, cl), func(l *library) error { return l.load(ctx, c) })
}

// send sends cl by FCALL when its library is loaded, else by EVALSHA, on
// c or in a pipeline.
func send(ctx context.Context, c redis.Cmdable, cl call) *redis.Cmd {
	if cl.sc.byFunction() {
		return c.FCall(ctx, cl.sc.fn, cl.keys, cl.args...)
	}
	return c.EvalSha(ctx, cl.sc.sha, cl.keys, cl.args...)
}

// recoverCall sends cl again when its first answer, cmd, says the server
// lacks what it ran, and returns the answer that counts:
//   - NOSCRIPT (a restart, failover, SCRIPT FLUSH): the source, by EVAL,
//     which also caches it for the calls after;
//   - no such function (a restart without persistence, FUNCTION FLUSH, a
//     new master): the library is loaded again (load) and the call sent by
//     FCALL; a library that cannot be loaded, or a function still missing
//     (a master the client's cluster map did not show yet), leaves the call
//     to EVALSHA;
//   - FCALL refused itself (an ACL that allows FUNCTION LOAD but not
//     FCALL; it was refused before the function ran): the library goes
//     off, and the call runs by EVALSHA.
func recoverCall(ctx context.Context, c redis.UniversalClient, cl call, cmd *redis.Cmd, load func(*library) error) *redis.Cmd {
	err := cmd.Err()
	switch {
	case err == nil:
		return cmd
	case isNoScript(err):
		return c.Eval(ctx, cl.sc.src, cl.keys, cl.args...)
	case isNoFunction(err):
		if load(cl.sc.lib) == nil {
			if cmd = c.FCall(ctx, cl.sc.fn, cl.keys, cl.args...); !isNoFunction(cmd.Err()) {
				return cmd
			}
		}
		return runScript(ctx, c, cl.sc, cl.keys, cl.args...)
	case cl.sc.lib != nil && refusedFCall(err):
		cl.sc.lib.off.Store(true)
		return runScript(ctx, c, cl.sc, cl.keys, cl.args...)
	}
	return cmd
}

// pipelineCluster sends calls in one pipeline of a cluster client, the
// answers in cmds, and sends again, up to MaxRedirects times with go-redis's
// backoff, the calls that Redis refused before they ran (refusedUnrun: a
// slot moving, a node loading, the cluster down, a long script running).
//
// go-redis's cluster pipeline, when the first command of a node's batch
// fails with an error it retries (TRYAGAIN, CLUSTERDOWN, LOADING), sends
// the node's whole batch again, the calls that ran included: an enqueue
// would then say its run was a duplicate, an ack that it was not in flight,
// and a run served and acked in between would be queued again. So each
// node's batch starts with one TYPE of the fence of each slot it holds
// calls of: a command of one key never gets TRYAGAIN (a moving slot
// redirects it with ASK or MOVED, which go-redis follows for that command
// alone), so no batch is sent again whole. TYPE, not EXISTS: Redis 7 marks
// EXISTS multi-shard, and go-redis's dynamic routing resolver refuses a
// pipeline holding it. One command per slot per pipeline, on a cluster only.
func pipelineCluster(ctx context.Context, c *redis.ClusterClient, calls []call, cmds []*redis.Cmd) error {
	opt := c.Options()
	todo := make([]int, len(calls))
	for i := range todo {
		todo[i] = i
	}
	for attempt := 0; ; attempt++ {
		_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			seen := make(map[string]bool)
			for _, i := range todo {
				if f := calls[i].keys[len(calls[i].keys)-1]; !seen[f] {
					seen[f] = true
					p.Type(ctx, f)
				}
			}
			for _, i := range todo {
				cmds[i] = send(ctx, p, calls[i])
			}
			return nil
		})
		var again []int
		for _, i := range todo {
			if refusedUnrun(cmds[i].Err()) {
				again = append(again, i)
			}
		}
		if len(again) == 0 || attempt >= opt.MaxRedirects || !sleepCtx(ctx, clusterBackoff(opt, attempt)) {
			return err
		}
		todo = again
	}
}

// refusedUnrun: Redis refused the call before running it, so it may be
// sent again: a cluster node's slot is moving (TRYAGAIN, or a redirection
// go-redis gave up following), the node is loading its data, the cluster
// is down, a replica lost its master (MASTERDOWN), or a script or function
// runs past busy-reply-threshold (BUSY: Redis answers every command but
// SCRIPT KILL, FUNCTION KILL and SHUTDOWN NOSAVE with it, unrun, until that
// script ends). It speaks of the last send: when go-redis had sent the call
// again after a read timeout, the first send may have run (and be the
// script Redis is busy with); sending it once more is then go-redis's own
// resend again (README, "Timeouts and go-redis's retries").
func refusedUnrun(err error) bool {
	if err == nil {
		return false
	}
	if _, ok := redis.IsMovedError(err); ok {
		return true
	}
	if _, ok := redis.IsAskError(err); ok {
		return true
	}
	return redis.IsTryAgainError(err) || redis.IsClusterDownError(err) || redis.IsLoadingError(err) ||
		redis.IsMasterDownError(err) || isBusyError(err)
}

// isBusyError: Redis refused the command because a script or function is
// running past busy-reply-threshold ("BUSY ..."; not BUSYKEY, RESTORE's
// answer for a key that exists, nor BUSYGROUP, XGROUP CREATE's).
func isBusyError(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply) && strings.HasPrefix(reply.Error(), "BUSY ")
}

// unanswered: the call failed without a reply from Redis (the connection
// refused, reset, closed or timed out: a restart, a failover, a network
// cut), so it may or may not have run. A call that is safe to send twice
// may be sent again.
func unanswered(err error) bool {
	var reply redis.Error
	if err == nil || errors.As(err, &reply) {
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, redis.ErrPoolTimeout) // never sent: every connection busy or being dialed
}

// clusterBackoff is go-redis's wait before a command's attempt+1-th retry,
// without its jitter: MinRetryBackoff doubled per attempt, at most
// MaxRetryBackoff (opt as the client holds it, its defaults filled in by
// go-redis: 10 ms and 1 s; 0 when turned off with -1).
func clusterBackoff(opt *redis.ClusterOptions, attempt int) time.Duration {
	lo, hi := opt.MinRetryBackoff, opt.MaxRetryBackoff
	if lo <= 0 {
		return 0
	}
	d := lo << min(attempt, 16)
	if d > hi || d <= 0 {
		d = hi
	}
	return d
}

// sleepCtx waits d, or less when ctx ends first; it reports whether it
// waited the whole d.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// refusedFCall: the error is an ACL's refusal of FCALL itself.
func refusedFCall(err error) bool {
	return strings.HasPrefix(err.Error(), "NOPERM") && strings.Contains(strings.ToLower(err.Error()), "fcall")
}

// byFunction: sc runs by FCALL.
func (sc *script) byFunction() bool { return sc.lib != nil && !sc.lib.off.Load() }

// runScript executes sc by SHA, sending the source on NOSCRIPT.
func runScript(ctx context.Context, c redis.UniversalClient, sc *script, keys []string, args ...any) *redis.Cmd {
	cmd := c.EvalSha(ctx, sc.sha, keys, args...)
	if isNoScript(cmd.Err()) {
		cmd = c.Eval(ctx, sc.src, keys, args...)
	}
	return cmd
}

// fenced returns ks with the fence of their slot after them (see
// keys.FenceOf): on a Redis Cluster a call is then refused whole while its
// slot moves, instead of failing halfway. The scripts never read it. ks
// itself is left alone: callers keep key lists for many calls.
func fenced(ks []string) []string {
	if len(ks) == 0 {
		return ks
	}
	f := keys.FenceOf(ks[0])
	if f == "" {
		return ks
	}
	out := make([]string, len(ks)+1)
	copy(out, ks)
	out[len(ks)] = f
	return out
}

// call is one script call of a pipelined batch.
type call struct {
	sc   *script
	keys []string
	args []any
}

// runPipelined sends calls in one pipeline. go-redis does not fall back to
// EVAL inside a pipeline, so the calls that found no script or function
// are mended after it (recoverCall), each library loaded again once. An
// error that is not Redis's (a connection lost or refused, a timeout) is
// returned with the cmds, each holding its own answer: on a cluster one
// node may fail while the calls of the others ran, so a caller that reports
// per call reads each cmd (a cmd without an error ran).
func runPipelined(ctx context.Context, c redis.UniversalClient, calls []call) ([]*redis.Cmd, error) {
	for _, cl := range calls {
		if cl.sc.refused {
			return nil, ErrReadOnly
		}
	}
	cmds := make([]*redis.Cmd, len(calls))
	calls = slices.Clone(calls) // the caller's calls keep their keys
	for i := range calls {
		calls[i].keys = fenced(calls[i].keys)
	}
	var err error
	if cc, ok := c.(*redis.ClusterClient); ok {
		err = pipelineCluster(ctx, cc, calls, cmds)
	} else {
		_, err = c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, cl := range calls {
				cmds[i] = send(ctx, p, cl)
			}
			return nil
		})
	}
	var lost error // not Redis's: returned with the cmds
	if err != nil && !isNoScript(err) && !isNoFunction(err) && !errors.As(err, new(redis.Error)) {
		lost = err
	}
	var loaded map[*library]error // each library loaded again once per batch
	load := func(l *library) error {
		err, ok := loaded[l]
		if !ok {
			err = l.load(ctx, c)
			if loaded == nil {
				loaded = map[*library]error{}
			}
			loaded[l] = err
		}
		return err
	}
	for i, cmd := range cmds {
		cmds[i] = recoverCall(ctx, c, calls[i], cmd, load)
	}
	return cmds, lost
}
