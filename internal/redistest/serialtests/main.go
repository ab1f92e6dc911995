// Command serialtests prints the go test pattern that names the top-level
// tests of one package that do not call t.Parallel (its serial tests):
//
//	go test ./runqueue -run "$(go run ./internal/redistest/serialtests ./runqueue)"
//
// make test runs them in a go test process of their own, beside another
// that runs the rest of the module with the same pattern as -skip (see the
// Makefile): go test runs a package's serial tests one after another before
// any of its parallel tests starts, and runqueue's mostly wait (servers
// paused, killed or restarted, leases and TTLs passing), which left the
// machine's cores idle for minutes.
//
// A test is serial unless its own body (not a function literal in it, such
// as a subtest's) calls Parallel on its *testing.T, or passes it to a
// function of its package that does (checkLua(t, "lag")). The split is
// complete by construction (every test matches the pattern or not), so a
// test taken for the wrong kind still runs, only in the other process: a
// parallel one the search misses runs among the serial tests (parallel to
// the others of its kind there), a serial one it misses alone in the other
// process before that process's parallel tests, as before. The command fails when the package has no serial test (an empty
// pattern would run every test twice) and when another package under the
// module root has a top-level test of the same name, which the -skip would
// leave out of both processes.
package main

import (
	"errors"
	"fmt"
	"go/ast"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/runqueue/runqueue/internal/redistest/testsrc"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: serialtests <package dir>")
		os.Exit(2)
	}
	p, err := run(os.Args[1], ".")
	if err != nil {
		fmt.Fprintln(os.Stderr, "serialtests:", err)
		os.Exit(1)
	}
	fmt.Println(p)
}

// run returns the pattern of the serial tests of the package in dir,
// checked against the test names of every other package of ./... in the
// module at root (go list's packages and files: build constraints, nested
// modules and testdata as go test sees them).
func run(dir, root string) (string, error) {
	pkgs, err := listPackages(root)
	if err != nil {
		return "", err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	target, ok := pkgs[abs]
	if !ok {
		return "", errors.New(dir + " is not a package of ./... under " + root)
	}
	serial, err := serialTests(target)
	if err != nil {
		return "", err
	}
	if len(serial) == 0 {
		return "", errors.New("no serial test in " + dir)
	}
	delete(pkgs, abs)
	clash, err := sameNames(pkgs, serial)
	if err != nil {
		return "", err
	}
	if len(clash) > 0 {
		return "", fmt.Errorf("tests named like serial tests of %s elsewhere (make test would skip them): %s; rename one",
			dir, strings.Join(clash, ", "))
	}
	return pattern(serial), nil
}

// pkgFiles is one package of go list: its directory's Go files that go
// test builds, the test files among them.
type pkgFiles struct {
	dir         string
	files, test []string
}

// listPackages runs go list ./... in root and returns its packages by
// absolute directory.
func listPackages(root string) (map[string]pkgFiles, error) {
	cmd := exec.Command("go", "list", "-f",
		"{{.Dir}}\t{{join .GoFiles \",\"}}\t{{join .TestGoFiles \",\"}}\t{{join .XTestGoFiles \",\"}}", "./...")
	cmd.Dir = root
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list ./... in %s: %w", root, err)
	}
	pkgs := map[string]pkgFiles{}
	for _, line := range strings.Split(string(out), "\n") {
		if line == "" {
			continue
		}
		f := strings.Split(line, "\t")
		if len(f) != 4 {
			return nil, fmt.Errorf("go list: unexpected line %q", line)
		}
		p := pkgFiles{dir: f[0]}
		for i, list := range f[1:] {
			for _, name := range strings.Split(list, ",") {
				if name == "" {
					continue
				}
				p.files = append(p.files, filepath.Join(f[0], name))
				if i > 0 {
					p.test = append(p.test, filepath.Join(f[0], name))
				}
			}
		}
		pkgs[f[0]] = p
	}
	return pkgs, nil
}

// pattern is the -run (or -skip) pattern that matches exactly the top-level
// names (Go test names are identifiers: nothing to quote).
func pattern(names []string) string {
	return "^(" + strings.Join(names, "|") + ")$"
}

// serialTests returns the sorted names of the Test functions of pkg's test
// files that do not call Parallel on their *testing.T, directly or through
// functions of their package that do (checkLua(t, ...) calling t.Parallel).
func serialTests(pkg pkgFiles) ([]string, error) {
	byPkg, err := testsrc.ParseFiles(pkg.files)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, files := range byPkg {
		funcs := map[string]*ast.FuncDecl{}
		for _, f := range files {
			for _, d := range f.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && fd.Body != nil {
					funcs[fd.Name.Name] = fd
				}
			}
		}
		par := parallelizers(funcs)
		for _, f := range files {
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || !f.Test || fd.Recv != nil || fd.Body == nil || !strings.HasPrefix(fd.Name.Name, "Test") || !testsrc.IsTestName(fd.Name.Name) {
					continue
				}
				if t := tParams(fd); len(t) == 1 && !callsParallel(fd.Body, t[0], par) {
					out = append(out, fd.Name.Name)
				}
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// parallelizers returns, for each function of funcs that calls Parallel on
// one of its *testing.T parameters (directly or through another such
// function), the positions of those parameters.
func parallelizers(funcs map[string]*ast.FuncDecl) map[string][]int {
	par := map[string][]int{}
	for changed := true; changed; {
		changed = false
		for name, fd := range funcs {
			if _, ok := par[name]; ok {
				continue
			}
			var at []int
			for i, t := range tParams(fd) {
				if t != "" && callsParallel(fd.Body, t, par) {
					at = append(at, i)
				}
			}
			if len(at) > 0 {
				par[name], changed = at, true
			}
		}
	}
	return par
}

// tParams is the name of each parameter of fd, "" for one that is not a
// named *testing.T (a *T of some package: the files are not type checked).
func tParams(fd *ast.FuncDecl) []string {
	var out []string
	for _, p := range fd.Type.Params.List {
		name := ""
		if star, ok := p.Type.(*ast.StarExpr); ok {
			if sel, ok := star.X.(*ast.SelectorExpr); ok && sel.Sel.Name == "T" {
				name = "T"
			}
		}
		if len(p.Names) == 0 {
			out = append(out, "")
		}
		for _, n := range p.Names {
			if name == "" || n.Name == "_" {
				out = append(out, "")
			} else {
				out = append(out, n.Name)
			}
		}
	}
	return out
}

// callsParallel reports whether body, outside function literals, calls
// t.Parallel() or passes t to a parallelizer at one of its positions.
func callsParallel(body *ast.BlockStmt, t string, par map[string][]int) bool {
	isT := func(e ast.Expr) bool {
		x, ok := e.(*ast.Ident)
		return ok && x.Name == t
	}
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.CallExpr:
			switch fn := n.Fun.(type) {
			case *ast.SelectorExpr:
				found = found || fn.Sel.Name == "Parallel" && isT(fn.X)
			case *ast.Ident:
				for _, i := range par[fn.Name] {
					found = found || i < len(n.Args) && isT(n.Args[i])
				}
			}
		}
		return !found
	})
	return found
}

// sameNames returns the names among names that a test file of one of pkgs
// also declares as a top-level function, as dir/name.
func sameNames(pkgs map[string]pkgFiles, names []string) ([]string, error) {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	var clash []string
	for _, p := range pkgs {
		byPkg, err := testsrc.ParseFiles(p.test)
		if err != nil {
			return nil, err
		}
		for _, files := range byPkg {
			for _, f := range files {
				for _, d := range f.Decls {
					if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && want[fd.Name.Name] {
						clash = append(clash, filepath.Join(p.dir, fd.Name.Name))
					}
				}
			}
		}
	}
	slices.Sort(clash)
	return clash, nil
}
