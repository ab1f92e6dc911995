package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNoneOf(t *testing.T) {
	t.Parallel()
	re := regexp.MustCompile(noneOf([]string{"Mini", "Real"}))
	for _, name := range []string{"Cluster", "Min", "Minis", "Mi", "M", "R", "Rea", "Reals", "Queue", "OneRunEach", "mini", "Ack.Twice"} {
		require.True(t, re.MatchString(name), name)
	}
	for _, name := range []string{"Mini", "Real"} {
		require.False(t, re.MatchString(name), name)
	}

	// A word that is a prefix of another, and bytes that regexp quotes.
	re = regexp.MustCompile(noneOf([]string{"a", "ab", "a.c"}))
	for _, name := range []string{"b", "abc", "aa", "a.", "a.d", "a.cc", "axc"} {
		require.True(t, re.MatchString(name), name)
	}
	for _, name := range []string{"a", "ab", "a.c"} {
		require.False(t, re.MatchString(name), name)
	}
}

// selects applies a -run pattern the way go test does: split at the
// slashes, element i matched against level i of the name, and a name with
// fewer levels than the pattern matched as far as it goes (its subtests
// are then filtered one by one).
func selects(pattern, name string) bool {
	elems := strings.Split(pattern, "/")
	for i, level := range strings.Split(name, "/") {
		if i < len(elems) && !regexp.MustCompile(elems[i]).MatchString(level) {
			return false
		}
	}
	return true
}

func TestPattern(t *testing.T) {
	t.Parallel()
	p := pattern([]string{"TestConformance", "TestClusterNodes", "TestRolloutFlagOnOverBacklog"})
	require.NotContains(t, strings.Join(strings.Split(p, "/")[1:], ""), "/")
	for _, name := range []string{
		"TestConformance/Cluster", "TestConformance/Cluster/AckTwice", "TestClusterNodes",
		"TestRolloutFlagOnOverBacklog/OneRunEach/Cluster",
		"TestRolloutFlagOnOverBacklog/OneRunEach", // its body only starts the backends
	} {
		require.True(t, selects(p, name), name)
	}
	for _, name := range []string{
		"TestConformance/Mini", "TestConformance/Real/AckTwice", "TestConformanceX/Cluster", "TestPrefix",
		"TestRolloutFlagOnOverBacklog/OneRunEach/Mini", "TestRolloutFlagOnOverBacklog/OneRunEach/Real",
	} {
		require.False(t, selects(p, name), name)
	}
}

// writeTree writes files (path -> source) under a fresh directory.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for path, src := range files {
		full := filepath.Join(root, path)
		require.NoError(t, os.MkdirAll(filepath.Dir(full), 0o755))
		require.NoError(t, os.WriteFile(full, []byte(src), 0o644))
	}
	return root
}

// TestClusterTests: the tests that reach redistest.Cluster through helpers
// and tables are listed, the tests that use only the other backends (by a
// constant index or slice of the table) are not.
func TestClusterTests(t *testing.T) {
	t.Parallel()
	root := writeTree(t, map[string]string{
		"q/q.go": `package q

func Cluster() {} // not redistest's
`,
		"q/main_test.go": `package q_test

import (
	"testing"

	"example.com/m/internal/redistest"
)

type backend struct {
	name   string
	client func(testing.TB) any
}

var backends = []backend{{"Mini", redistest.Mini}, {"Real", redistest.Real}, {"Cluster", redistest.Cluster}}

func forEachBackend(t *testing.T, fn func(*testing.T, any)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { fn(t, b.client(t)) })
	}
}

func helper(t *testing.T) { forEachBackend(t, nil) }
`,
		"q/a_test.go": `package q_test

import (
	"testing"

	rt "example.com/m/internal/redistest"
	"example.com/m/q"
)

func TestThroughHelper(t *testing.T)  { helper(t) }
func TestThroughTable(t *testing.T)   { for _, b := range backends { _ = b } }
func TestDirect(t *testing.T)         { rt.Cluster(t) }
func TestFirstBackend(t *testing.T)   { backends[0].client(t) }
func TestFirstTwo(t *testing.T)       { for _, b := range backends[:2] { _ = b } }
func TestLast(t *testing.T)           { _ = backends[2] }
func TestOtherCluster(t *testing.T)   { q.Cluster(); var x struct{ Cluster int }; _ = x.Cluster }
func TestUnit(t *testing.T)           {}
func Testlower(t *testing.T)          { helper(t) }
func ExampleDirect()                  { rt.Cluster(nil) }
`,
		"internal/redistest/redistest.go": `package redistest

func Cluster(t any) any { return nil }
func Mini(t any) any    { return nil }
func Real(t any) any    { return nil }
`,
		"internal/redistest/redistest_test.go": `package redistest

import "testing"

func TestCluster(t *testing.T) { Cluster(t) }
func TestMini(t *testing.T)    { Mini(t) }
func TestMain(m *testing.M)    { Cluster(nil) }
`,
		"testdata/x_test.go": `package x

import "testing"

func TestIgnored(t *testing.T) { Cluster(t) }
`,
	})
	got, err := clusterTests(root)
	require.NoError(t, err)
	require.Equal(t, []string{"ExampleDirect", "TestCluster", "TestDirect", "TestLast", "TestThroughHelper", "TestThroughTable"}, got)

	_, err = clusterTests(writeTree(t, map[string]string{"a/a_test.go": "package a\n\nimport \"testing\"\n\nfunc TestA(t *testing.T) {}\n"}))
	require.ErrorContains(t, err, "no test", "an empty list would make -run select every test")
}

// TestThisModule: the module's own cluster tests are found, and unit tests
// are not.
func TestThisModule(t *testing.T) {
	t.Parallel()
	got, err := clusterTests("../../..")
	require.NoError(t, err)
	require.Contains(t, got, "TestConformance")
	require.Contains(t, got, "TestClusterNodes")
	require.NotContains(t, got, "TestPrefix")
	require.NotContains(t, got, "TestSlot")
}
