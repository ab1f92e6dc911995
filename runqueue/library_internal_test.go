package runqueue

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLibraryShape: the library registers one function per flag-on script
// it holds, named after the library, and each body is that script's own
// file without its include lines; every fragment the scripts include is
// defined once, before any code that names it.
func TestLibraryShape(t *testing.T) {
	s, err := buildScripts(true)
	require.NoError(t, err)
	lib := s.lib
	require.Regexp(t, `^runqueue_[0-9a-f]{16}$`, lib.name)
	require.True(t, strings.HasPrefix(lib.src, "#!lua name="+lib.name+"\n"))

	reg := regexp.MustCompile(`(?m)^redis\.register_function\{ function_name = '([a-z0-9_]+)', callback = (script_[a-z_]+)(, flags = \{ 'allow-oom' \})? \}$`)
	var got []string
	for _, m := range reg.FindAllStringSubmatch(lib.src, -1) {
		got = append(got, m[1]+" "+m[2]+m[3])
	}
	var want []string
	for _, e := range libraryScripts(s) {
		require.Equal(t, lib.name+"_"+e.fnSuffix(), e.sc.fn)
		flags := ""
		if e.settles {
			flags = ", flags = { 'allow-oom' }"
		}
		body := "script_" + e.sc.name
		want = append(want, e.sc.fn+" "+body+flags)
		raw, err := luaFS.ReadFile("lua/" + e.file)
		require.NoError(t, err)
		src, _ := cutIncludes(string(raw))
		// The body as written, but for the constants the build writes in.
		pat := regexp.QuoteMeta("\nlocal function " + body + "(keys, args)\nKEYS, ARGV = keys, args\n" + src + "end\n")
		// (any --@inline table's NAME.KEY: SCHED, HELD, WIDE; in a
		// comment it stays as written)
		pat = regexp.MustCompile(`[A-Z][A-Z_]*\\\.[A-Z][A-Z_]*`).ReplaceAllStringFunc(pat, func(m string) string {
			return `(?:[0-9]+|'[^']*'|` + m + `)`
		})
		require.Regexp(t, "(?s)"+pat, lib.src, e.file)
	}
	require.Equal(t, want, got)
	// Every call but the enqueue may run when Redis is full: they start by
	// removing, and a dequeue hands out the runs whose acks free memory.
	for _, e := range libraryScripts(s) {
		require.Equal(t, e.sc != s.enqueue, e.settles, e.sc.fn)
	}

	// Each fragment's functions once.
	top, _, ok := strings.Cut(lib.src, "\nlocal function script_")
	require.True(t, ok)
	defs := regexp.MustCompile(`(?m)^\s*local function ([A-Za-z_][A-Za-z0-9_]*)\(`).FindAllStringSubmatch(top, -1)
	seen := map[string]bool{}
	for _, d := range defs {
		require.False(t, seen[d[1]], "%s defined twice", d[1])
		seen[d[1]] = true
	}
	for _, name := range []string{"sched_open", "sched_hooks", "hooks_open", "dq_open", "held_ack", "rec_parse"} {
		require.True(t, seen[name], name)
	}
}

// TestLibraryKeepsNoCallState: the library's top level is made once and
// shared by every call, so no call may leave state there. With luac 5.1:
// the top level's locals are its functions, KEYS and ARGV (which each call
// sets first) and two constant tables; no function assigns any of them
// but KEYS and ARGV, nor any global; the two tables are only read.
func TestLibraryKeepsNoCallState(t *testing.T) {
	luac := reviewLua(t, "luac")
	s, err := buildScripts(true)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "lib.lua")
	require.NoError(t, os.WriteFile(path, []byte(s.lib.src), 0o644))
	out, err := exec.Command(luac, "-l", "-l", "-p", path).CombinedOutput()
	require.NoError(t, err, string(out))
	listing := string(out)

	// The main chunk's locals: the first "locals" section.
	sections := strings.Split(listing, "\nlocals (")
	require.Greater(t, len(sections), 1)
	mainLocals := map[string]bool{}
	for _, line := range strings.Split(sections[1], "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 2 || strings.HasPrefix(line, "upvalues") {
			break
		}
		mainLocals[f[1]] = true
	}
	fns := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^local function ([A-Za-z_][A-Za-z0-9_]*)\(`).FindAllStringSubmatch(s.lib.src, -1) {
		fns[m[1]] = true
	}
	var data []string
	for name := range mainLocals {
		if !fns[name] {
			data = append(data, name)
		}
	}
	sort.Strings(data)
	require.Equal(t, []string{"ARGV", "DQ_TTL_LOOK", "EW_WAKE_MAX", "HELD_ERRORS", "KEYS", "SCHED_FIELDS", "SCHED_REG_FIELDS", "SCHED_REST_FIELDS"}, data,
		"a new top-level value is shared by every call: check that no call writes it, then list it here")

	require.False(t, strings.Contains(listing, "SETGLOBAL"), "the library assigns a global")
	setup := regexp.MustCompile(`SETUPVAL\s+\S+\s+\S+\s+; (\S+)`)
	for _, m := range setup.FindAllStringSubmatch(listing, -1) {
		if mainLocals[m[1]] && m[1] != "KEYS" && m[1] != "ARGV" {
			t.Errorf("a function assigns the library's top-level %s", m[1])
		}
	}
	// The tables are read in these forms only.
	for name, reads := range map[string]*regexp.Regexp{
		"HELD_ERRORS":       regexp.MustCompile(`redis\.error_reply\(HELD_ERRORS(\[err\]|\.gone)\)`),
		"SCHED_FIELDS":      regexp.MustCompile(`(unpack|ipairs)\(SCHED_FIELDS\)|fields or SCHED_FIELDS|fields ~= SCHED_FIELDS`),
		"SCHED_REG_FIELDS":  regexp.MustCompile(`(unpack|ipairs)\(SCHED_REG_FIELDS\)|sched_state\(S, (r, 1, z\[1\]|regs, k, parked\[1\]), SCHED_REG_FIELDS\)`),
		"SCHED_REST_FIELDS": regexp.MustCompile(`(unpack|ipairs)\(SCHED_REST_FIELDS\)`),
	} {
		code := stripComments(s.lib.src)
		all := strings.Count(code, name)
		ok := len(reads.FindAllString(code, -1))
		require.Equal(t, all-1, ok, "%s: a use that is not a plain read (the other is its definition)", name)
	}
}

// TestScriptsNameOnlyDefinedNames: no script, and not the library, reads a
// global other than Redis's Lua API: a name a fragment calls that is
// defined after it, or not at all, compiles to a global read (nil, an
// error when called). The library orders each fragment after the ones it
// includes, so a fragment that calls another's function without including
// it may find it undefined there while every script that includes both
// works (an env-limited dequeue by FCALL called held_count, a global there,
// once lib/hooks_vtime included the env's line before lib/held).
func TestScriptsNameOnlyDefinedNames(t *testing.T) {
	luac := reviewLua(t, "luac")
	api := map[string]bool{}
	for _, n := range strings.Fields("redis string math table tonumber tostring type unpack ipairs pairs " +
		"select error pcall next cjson cmsgpack bit struct assert rawget rawset setmetatable getmetatable KEYS ARGV") {
		api[n] = true
	}
	get := regexp.MustCompile(`GETGLOBAL\s+\S+\s+\S+\s+; (\S+)`)
	check := func(name, src string) {
		path := filepath.Join(t.TempDir(), "s.lua")
		require.NoError(t, os.WriteFile(path, []byte(src), 0o644))
		out, err := exec.Command(luac, "-l", "-p", path).CombinedOutput()
		require.NoError(t, err, string(out))
		seen := map[string]bool{}
		for _, m := range get.FindAllStringSubmatch(string(out), -1) {
			if !api[m[1]] && !seen[m[1]] {
				seen[m[1]] = true
				t.Errorf("%s reads the global %s (defined after its use, or nowhere)", name, m[1])
			}
		}
	}
	for _, vtime := range []bool{false, true} {
		s, err := buildScripts(vtime)
		require.NoError(t, err)
		for _, sc := range s.all() {
			check(sc.name, sc.src)
		}
		if vtime {
			check("library", s.lib.src) // (luac skips its "#!" line)
		}
	}
}
