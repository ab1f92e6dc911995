package runqueue_test

import (
	"bytes"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// Golden files live in testdata/ at the repository root; tests run in
// runqueue/.
const (
	goldenSHAFile = "../testdata/flagoff-scripts.sha1"
	snapshotDir   = "../testdata/scripts"
)

// updateGolden rewrites the golden files instead of comparing
// (make generate/lua-sha).
func updateGolden() bool { return os.Getenv("RUNQUEUE_UPDATE_GOLDEN") == "1" }

const regenerate = "If the change is intended, run `make generate/lua-sha` and commit testdata/ with it."

// TestFlagOffScriptsPinned pins the bytes of every script that can run with
// the scheduler flag off: with the flag off, a deployment must run exactly
// the reviewed scripts (docs/design.md section 1, rollout safety), so any change to
// them, or to a fragment they include, must be deliberate.
func TestFlagOffScriptsPinned(t *testing.T) {
	t.Parallel()
	srcs, err := runqueue.FlagOffScripts()
	require.NoError(t, err)
	require.NotEmpty(t, srcs)

	var b strings.Builder
	for _, name := range sortedKeys(srcs) {
		sum := sha1.Sum([]byte(srcs[name]))
		fmt.Fprintf(&b, "%s %s\n", name, hex.EncodeToString(sum[:]))
	}
	got := b.String()

	if updateGolden() {
		require.NoError(t, os.MkdirAll(filepath.Dir(goldenSHAFile), 0o755))
		require.NoError(t, os.WriteFile(goldenSHAFile, []byte(got), 0o644))
		t.Logf("wrote %s", goldenSHAFile)
		return
	}
	raw, err := os.ReadFile(goldenSHAFile)
	if errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("%s is missing. %s", goldenSHAFile, regenerate)
	}
	require.NoError(t, err)
	want := parseSHAFile(t, string(raw))
	have := parseSHAFile(t, got)
	var diffs []string
	for _, name := range sortedKeys(mergeSHAs(want, have)) {
		switch w, h := want[name], have[name]; {
		case w == "":
			diffs = append(diffs, fmt.Sprintf("  %s: new script (sha1 %s)", name, h))
		case h == "":
			diffs = append(diffs, fmt.Sprintf("  %s: pinned (sha1 %s) but no longer built", name, w))
		case w != h:
			diffs = append(diffs, fmt.Sprintf("  %s: sha1 %s, pinned %s", name, h, w))
		}
	}
	if len(diffs) > 0 {
		t.Fatalf("the flag-off Lua scripts differ from %s:\n%s\n"+
			"Flag-off scripts are pinned so that turning the scheduler flag off runs exactly the reviewed bytes; "+
			"testdata/scripts/flagoff/ shows the assembled source. %s",
			goldenSHAFile, strings.Join(diffs, "\n"), regenerate)
	}
	require.Equal(t, string(raw), got, "%s is not in canonical form (sorted \"name sha1\" lines). %s", goldenSHAFile, regenerate)
}

func parseSHAFile(t *testing.T, s string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for i, line := range strings.Split(strings.TrimSuffix(s, "\n"), "\n") {
		name, sum, ok := strings.Cut(line, " ")
		if !ok || len(sum) != 40 {
			t.Fatalf("%s line %d: %q is not \"name sha1\". %s", goldenSHAFile, i+1, line, regenerate)
		}
		out[name] = sum
	}
	return out
}

// TestScriptSnapshots keeps the assembled source of every script in
// testdata/scripts/ (and of the flag-on Functions library, in library/),
// so that a review shows the bytes Redis will run, with every fragment
// expanded, next to the change that produced them.
func TestScriptSnapshots(t *testing.T) {
	t.Parallel()
	sets := []struct {
		name, dir string
		build     func() (map[string]string, error)
	}{
		{"FlagOff", "flagoff", runqueue.FlagOffScripts},
		{"FlagOn", "flagon", runqueue.FlagOnScripts},
		{"Library", "library", runqueue.FlagOnLibrary},
	}
	for _, set := range sets {
		t.Run(set.name, func(t *testing.T) {
			t.Parallel()
			srcs, err := set.build()
			if err != nil {
				if set.dir == "flagon" {
					// The flag-on set is still being built; it gets its
					// snapshots once it assembles.
					t.Logf("flag-on scripts do not assemble yet, no snapshot: %v", err)
					return
				}
				require.NoError(t, err)
			}
			dir := filepath.Join(snapshotDir, set.dir)
			if updateGolden() {
				writeSnapshots(t, dir, srcs)
				return
			}
			onDisk, err := filepath.Glob(filepath.Join(dir, "*.lua"))
			require.NoError(t, err)
			for _, path := range onDisk {
				name := strings.TrimSuffix(filepath.Base(path), ".lua")
				if _, ok := srcs[name]; !ok {
					t.Errorf("%s is a snapshot of no script. %s", path, regenerate)
				}
			}
			for _, name := range sortedKeys(srcs) {
				path := filepath.Join(dir, name+".lua")
				raw, err := os.ReadFile(path)
				if errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s is missing. %s", path, regenerate)
					continue
				}
				require.NoError(t, err)
				if line, ok := firstDiff(string(raw), srcs[name]); ok {
					t.Errorf("script %s differs from %s from line %d on. %s", name, path, line, regenerate)
				}
			}
		})
	}
}

func writeSnapshots(t *testing.T, dir string, srcs map[string]string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(dir, 0o755))
	old, err := filepath.Glob(filepath.Join(dir, "*.lua"))
	require.NoError(t, err)
	for _, path := range old {
		require.NoError(t, os.Remove(path))
	}
	for name, src := range srcs {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name+".lua"), []byte(src), 0o644))
	}
	t.Logf("wrote %d snapshots to %s", len(srcs), dir)
}

// firstDiff returns the first line (from 1) where a and b differ.
func firstDiff(a, b string) (int, bool) {
	if a == b {
		return 0, false
	}
	la, lb := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(la), len(lb)) {
		if la[i] != lb[i] {
			return i + 1, true
		}
	}
	return min(len(la), len(lb)) + 1, true
}

// TestLuaFilesLF checks that every Lua file of the repository (scripts,
// fragments and snapshots) has LF line endings: a CRLF checkout would change
// the bytes, hence the SHA-1s, of the pinned scripts.
func TestLuaFilesLF(t *testing.T) {
	t.Parallel()
	n := 0
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".lua") {
			return nil
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		n++
		if i := bytes.IndexByte(raw, '\r'); i >= 0 {
			t.Errorf("%s has a CR at line %d: Lua files must be LF-only", path, bytes.Count(raw[:i], []byte("\n"))+1)
		}
		if len(raw) > 0 && raw[len(raw)-1] != '\n' {
			t.Errorf("%s does not end with a newline", path)
		}
		return nil
	})
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, 10, "found too few .lua files: is the walk rooted at the repository?")

	attrs, err := os.ReadFile("../.gitattributes")
	require.NoError(t, err)
	require.Regexp(t, `(?m)^\*\.lua\s+text\s+eol=lf\s*$`, string(attrs), ".gitattributes must keep *.lua LF on every checkout")
}

var (
	// "KEYS[3]", "ARGV[1..12]", "ARGV[1..12+n]" (1..12 then), but not
	// "KEYS[11+3i..13+3i]" (computed positions, documented as a pattern).
	headerIndex = regexp.MustCompile(`\b(KEYS|ARGV)\[(\d+)(?:\.\.(\d+)[^\]]*)?\]`)
	codeIndex   = regexp.MustCompile(`\b(KEYS|ARGV)\[(\d+)\]`)
	includeLine = regexp.MustCompile(`(?m)^--@include (\S+)\s*$`)
)

// TestLuaScriptHeaders checks the contract comment of every top-level
// script (STYLE.md): it opens the file, names KEYS and ARGV and has a
// "Returns:" line, and every KEYS[i] / ARGV[i] the script reads at a fixed
// position, in its own code or in a fragment it includes, is documented.
func TestLuaScriptHeaders(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("lua/*.lua")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, path := range files {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".lua"), func(t *testing.T) {
			t.Parallel()
			raw, err := os.ReadFile(path)
			require.NoError(t, err)
			src := string(raw)
			var header []string
			for line := range strings.Lines(src) {
				if !strings.HasPrefix(line, "--") || strings.HasPrefix(line, "--@") {
					break
				}
				header = append(header, line)
			}
			require.NotEmpty(t, header, "%s must start with a header comment", path)
			h := strings.Join(header, "")
			require.Contains(t, h, "KEYS[", "%s: the header must list KEYS", path)
			require.Contains(t, h, "ARGV[", "%s: the header must list ARGV", path)
			require.Regexp(t, `(?m)^-- Returns:`, h, "%s: the header must have a Returns: line", path)

			documented := map[string]bool{}
			for _, m := range headerIndex.FindAllStringSubmatch(h, -1) {
				lo, _ := strconv.Atoi(m[2])
				hi := lo
				if m[3] != "" {
					hi, _ = strconv.Atoi(m[3])
				}
				for i := lo; i <= hi; i++ {
					documented[fmt.Sprintf("%s[%d]", m[1], i)] = true
				}
			}
			for _, use := range codeIndex.FindAllString(withoutComments(expandIncludes(t, src)), -1) {
				require.True(t, documented[use], "%s reads %s, which its header does not document", path, use)
			}
		})
	}
}

// expandIncludes inlines the fragments src includes, both hook fragments
// for "hooks", so that the positions they read count as the script's.
func expandIncludes(t *testing.T, src string) string {
	t.Helper()
	return includeLine.ReplaceAllStringFunc(src, func(line string) string {
		name := includeLine.FindStringSubmatch(line)[1]
		names := []string{name}
		if name == "hooks" {
			names = []string{"hooks_off", "hooks_vtime"}
		}
		var b strings.Builder
		for _, n := range names {
			frag, err := os.ReadFile(filepath.Join("lua", "lib", n+".lua"))
			if errors.Is(err, fs.ErrNotExist) && name == "hooks" {
				continue // a hook fragment still to be written
			}
			require.NoError(t, err, "include %q", n)
			b.Write(frag)
		}
		return b.String()
	})
}

// withoutComments drops Lua line comments (the scripts hold no "--" inside
// string literals).
func withoutComments(src string) string {
	var b strings.Builder
	for line := range strings.Lines(src) {
		if i := strings.Index(line, "--"); i >= 0 {
			line = line[:i] + "\n"
		}
		b.WriteString(line)
	}
	return b.String()
}

func mergeSHAs(a, b map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}
