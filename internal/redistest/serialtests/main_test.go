package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// write puts files (name -> source) under root.
func write(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, src := range files {
		p := filepath.Join(root, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(src), 0o644))
	}
}

const goMod = "module example.com/x\n\ngo 1.26\n"

const pkgTests = `package p_test

import "testing"

func TestDirect(t *testing.T) { t.Parallel() }

func TestSerial(t *testing.T) {}

func TestOnlySubtests(t *testing.T) {
	t.Run("a", func(t *testing.T) { t.Parallel() })
}

func TestViaHelper(t *testing.T) { check(t, "x") }

func TestViaTwoHelpers(t *testing.T) { outer(1, t) }

func TestHelperOtherArg(t *testing.T) { other := t; check(other, "x"); _ = t }

func TestInIf(t *testing.T) {
	if true {
		t.Parallel()
	}
}

func TestNotAT(t *testing.T) { var x struct{ Parallel func() }; x.Parallel() }

func Testlower(t *testing.T) {}

func TestMain(m *testing.M) {}

func ExampleSerial() {}

func FuzzSerial(f *testing.F) {}

func check(t *testing.T, _ string) { t.Parallel() }

func outer(_ int, tt *testing.T) { check(tt, "y") }
`

func TestSerialTests(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	write(t, root, map[string]string{
		"go.mod":      goMod,
		"p/p.go":      "package p\n\nfunc TestNotInATestFile() {}\n",
		"p/p_test.go": pkgTests,
		// go test builds neither of these: their names are not tests.
		"p/x_ignored_test.go": "//go:build ignore\n\npackage p_test\n\nimport \"testing\"\n\nfunc TestIgnored(t *testing.T) {}\n",
		"p/_scratch_test.go":  "package p_test\n\nimport \"testing\"\n\nfunc TestScratch(t *testing.T) {}\n",
	})
	pkgs, err := listPackages(root)
	require.NoError(t, err)
	got, err := serialTests(pkgs[filepath.Join(root, "p")])
	require.NoError(t, err)
	// TestHelperOtherArg passes a copy of t: taken as serial (a miss runs it
	// in the serial process, which is safe).
	require.Equal(t, []string{"TestHelperOtherArg", "TestNotAT", "TestOnlySubtests", "TestSerial"}, got)

	p, err := run(filepath.Join(root, "p"), root)
	require.NoError(t, err)
	require.Equal(t, "^(TestHelperOtherArg|TestNotAT|TestOnlySubtests|TestSerial)$", p)
}

func TestRunRefusesClashesAndNoSerialTest(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	other := "package x\n\nimport \"testing\"\n\nfunc TestNotAT(t *testing.T) {}\n"
	write(t, root, map[string]string{
		"go.mod":      goMod,
		"p/p_test.go": pkgTests,
		"q/q_test.go": "package q\n\nimport \"testing\"\n\nfunc TestSerial(t *testing.T) { t.Parallel() }\n",
		// Not packages of ./...: testdata, a nested module, a file go
		// test does not build.
		"q/testdata/x_test.go": other,
		"m/go.mod":             "module example.com/m\n",
		"m/x_test.go":          other,
		"q/y_test.go":          "//go:build ignore\n\n" + other,
		"r/r_test.go":          "package r\n\nimport \"testing\"\n\nfunc TestOnly(t *testing.T) { t.Parallel() }\n",
	})
	_, err := run(filepath.Join(root, "p"), root)
	require.ErrorContains(t, err, filepath.Join(root, "q", "TestSerial"))
	require.NotContains(t, err.Error(), "TestNotAT")

	_, err = run(filepath.Join(root, "r"), root)
	require.ErrorContains(t, err, "no serial test")

	_, err = run(filepath.Join(root, "m"), root)
	require.ErrorContains(t, err, "not a package of ./...")
}

// TestModule runs the command's check on the module itself: make test
// depends on it.
func TestModule(t *testing.T) {
	t.Parallel()
	p, err := run("../../../runqueue", "../../..")
	require.NoError(t, err)
	require.Contains(t, p, "|TestS35TroubleRestart|")
	require.NotContains(t, p, "TestFairnessOracleLag|") // checkLua calls t.Parallel
}
