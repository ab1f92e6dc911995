// Command clustertests prints the go test -run pattern that selects the
// Redis Cluster tests of the module:
//
//	go test ./... -run "$(go run ./internal/redistest/clustertests)"
//
// A cluster test is a subtest named Cluster (the Cluster backend of a test
// that runs on every backend: TestConformance/Cluster, or
// TestRolloutFlagOnOverBacklog/OneRunEach/Cluster one level down), with its
// own subtests, or a top-level test that uses the cluster alone
// (TestClusterNodes).
//
// go test cannot select them with a pattern alone: with -run '/Cluster'
// every top-level test matches the empty first element, and one without
// subtests (a unit test) runs whole. So the first element of the pattern
// names the top-level tests that reach redistest.Cluster, directly or
// through package-level functions and variables of their package
// (forEachBackend, backends); the next elements match any subtest name but
// the other backends', Mini and Real, so that below a listed test only the
// Cluster backend runs, at whatever level the backends are. A listed test
// without subtests runs whole.
//
// The reach is found by names in the syntax trees, without type checking,
// so it may list a test too many (a local variable named like a function
// that reaches the cluster), never one too few.
package main

import (
	"errors"
	"fmt"
	"go/ast"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/runqueue/runqueue/internal/redistest/testsrc"
)

func main() {
	root := "."
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	tests, err := clusterTests(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "clustertests:", err)
		os.Exit(1)
	}
	fmt.Println(pattern(tests))
}

// otherBackends are the subtest names of the backends that are not the
// cluster (runqueue's forEachBackend and its look-alikes).
var otherBackends = []string{"Mini", "Real"}

// backendLevels is how many subtest levels below a listed test exclude the
// other backends: the backends are the first or second level today.
const backendLevels = 3

// pattern is the -run pattern of tests: each without its subtests named
// like another backend, down to backendLevels levels.
func pattern(tests []string) string {
	elems := []string{"^(" + strings.Join(tests, "|") + ")$"}
	for range backendLevels {
		elems = append(elems, noneOf(otherBackends))
	}
	return strings.Join(elems, "/")
}

// noneOf returns a regexp that matches every string but the words. Go's
// regexp has no negative look-ahead, so it spells out the ways to differ
// from every word, along the trie of the words: stop before one ends, go on
// after one ends, or take a byte no word takes at that point.
func noneOf(words []string) string {
	return "^(?:" + differ(words, "") + ")$"
}

// differ matches the rest of a string that starts with prefix and is none
// of words (all of them starting with prefix).
func differ(words []string, prefix string) string {
	var alts []string
	next := map[byte][]string{}
	ended := false
	for _, w := range words {
		if len(w) == len(prefix) {
			ended = true
			continue
		}
		next[w[len(prefix)]] = append(next[w[len(prefix)]], w)
	}
	switch {
	case ended && len(next) == 0:
		alts = append(alts, ".+") // go on past the word
	case !ended && prefix != "":
		alts = append(alts, "") // stop here, short of every word
	}
	bytes := slices.Sorted(func(yield func(byte) bool) {
		for b := range next {
			if !yield(b) {
				return
			}
		}
	})
	if len(bytes) > 0 {
		var class strings.Builder
		for _, b := range bytes {
			class.WriteString(regexp.QuoteMeta(string(b)))
		}
		alts = append(alts, "[^"+class.String()+"].*")
	}
	for _, b := range bytes {
		c := string(b)
		alts = append(alts, regexp.QuoteMeta(c)+"(?:"+differ(next[b], prefix+c)+")")
	}
	return strings.Join(alts, "|")
}

// redistestPath ends the import path of package redistest.
const redistestPath = "/internal/redistest"

// clusterTests returns the sorted names of the top-level tests under root
// that reach redistest.Cluster. It fails when there are none, so that a
// broken search cannot turn into an empty -run pattern, which would run
// every test.
func clusterTests(root string) ([]string, error) {
	var found []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata") {
			return filepath.SkipDir
		}
		tests, err := dirTests(path)
		found = append(found, tests...)
		return err
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(found)
	found = slices.Compact(found)
	if len(found) == 0 {
		return nil, errors.New("no test under " + root + " reaches redistest.Cluster")
	}
	return found, nil
}

// dirTests returns the tests of the packages in dir that reach the cluster.
// A directory holds up to two packages (p and the external p_test), each
// its own scope.
func dirTests(dir string) ([]string, error) {
	byPkg, err := testsrc.ParseDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for pkg, files := range byPkg {
		s := newScope(pkg == "redistest")
		for _, f := range files {
			s.declare(f.File, f.Test)
		}
		out = append(out, s.reachingTests()...)
	}
	return out, nil
}

// scope is the package-level declarations of one package.
type scope struct {
	inRedistest bool             // the package is redistest: Cluster is called unqualified
	decls       map[string][]use // declaration name -> the code it stands for
	elems       map[string][]use // slice or array variable -> its elements' code
	tests       []string         // top-level Test, Fuzz and Example functions
}

// use is code of one file: a function body or a variable's value.
type use struct {
	node  ast.Node
	local string // the name the file imports redistest under; "" if it does not
}

// refs is what code refers to.
type refs struct {
	cluster bool     // redistest.Cluster itself
	names   []string // identifiers, some of them package-level names
}

func newScope(inRedistest bool) *scope {
	return &scope{inRedistest: inRedistest, decls: map[string][]use{}, elems: map[string][]use{}}
}

// declare records the functions (not methods) and variables of f.
func (s *scope) declare(f *ast.File, test bool) {
	local := ""
	for _, imp := range f.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		if strings.HasSuffix(path, redistestPath) {
			local = "redistest"
			if imp.Name != nil {
				local = imp.Name.Name
			}
		}
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv != nil || d.Body == nil {
				continue
			}
			s.decls[d.Name.Name] = append(s.decls[d.Name.Name], use{d.Body, local})
			if test && testsrc.IsTestName(d.Name.Name) {
				s.tests = append(s.tests, d.Name.Name)
			}
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				vs, ok := spec.(*ast.ValueSpec)
				if !ok {
					continue
				}
				for i, n := range vs.Names {
					if len(vs.Values) == len(vs.Names) {
						s.decls[n.Name] = append(s.decls[n.Name], use{vs.Values[i], local})
						s.declareElems(n.Name, vs.Values[i], local)
					} else {
						for _, v := range vs.Values { // a, b = f()
							s.decls[n.Name] = append(s.decls[n.Name], use{v, local})
						}
					}
				}
			}
		}
	}
}

// declareElems records the elements of a variable initialised with a slice
// or array literal, such as the backends table, so that backends[0] and
// backends[:2] refer to those elements only.
func (s *scope) declareElems(name string, value ast.Expr, local string) {
	lit, ok := value.(*ast.CompositeLit)
	if !ok {
		return
	}
	if _, ok := lit.Type.(*ast.ArrayType); !ok {
		return
	}
	var elems []use
	for _, e := range lit.Elts {
		if _, keyed := e.(*ast.KeyValueExpr); keyed {
			return // [...]T{5: x}: positions are not the order
		}
		elems = append(elems, use{e, local})
	}
	s.elems[name] = elems
}

// scan collects what u refers to.
func (s *scope) scan(u use) refs {
	var r refs
	var visit func(ast.Node) bool
	visit = func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.SelectorExpr:
			if x, ok := n.X.(*ast.Ident); ok && u.local != "" && x.Name == u.local && isCluster(n.Sel.Name) {
				r.cluster = true
			}
			// Sel names a field, a method or another package's object,
			// never a declaration of this package: only X is looked into.
			ast.Inspect(n.X, visit)
			return false
		case *ast.IndexExpr:
			if elems, ok := s.constElems(n.X, n.Index, n.Index); ok {
				r = join(r, s.scanAll(elems))
				return false
			}
		case *ast.SliceExpr:
			if elems, ok := s.constElems(n.X, n.Low, n.High); ok && n.Max == nil {
				r = join(r, s.scanAll(elems))
				return false
			}
		case *ast.Ident:
			if s.inRedistest && isCluster(n.Name) {
				r.cluster = true
			}
			r.names = append(r.names, n.Name)
		}
		return true
	}
	ast.Inspect(u.node, visit)
	return r
}

func (s *scope) scanAll(us []use) refs {
	var r refs
	for _, u := range us {
		r = join(r, s.scan(u))
	}
	return r
}

// constElems returns the elements x[lo] (lo == hi) or x[lo:hi] selects
// when x is a variable with known elements and the bounds are integer
// literals or absent.
func (s *scope) constElems(x, lo, hi ast.Expr) ([]use, bool) {
	id, ok := x.(*ast.Ident)
	if !ok {
		return nil, false
	}
	elems, ok := s.elems[id.Name]
	if !ok {
		return nil, false
	}
	bound := func(e ast.Expr, def int) (int, bool) {
		if e == nil {
			return def, true
		}
		lit, ok := e.(*ast.BasicLit)
		if !ok || lit.Kind != token.INT {
			return 0, false
		}
		v, err := strconv.Atoi(lit.Value)
		return v, err == nil
	}
	l, okL := bound(lo, 0)
	h, okH := bound(hi, len(elems))
	if lo == hi && lo != nil { // an index
		h = l + 1
	}
	if !okL || !okH || l < 0 || l > h || h > len(elems) {
		return nil, false
	}
	return elems[l:h], true
}

func join(a, b refs) refs {
	return refs{cluster: a.cluster || b.cluster, names: append(a.names, b.names...)}
}

// reachingTests returns the tests of s that reach the cluster through any
// chain of package-level names.
func (s *scope) reachingTests() []string {
	direct := map[string]refs{}
	for name, us := range s.decls {
		direct[name] = s.scanAll(us)
	}
	reach := map[string]bool{}
	for changed := true; changed; {
		changed = false
		for name, r := range direct {
			if reach[name] {
				continue
			}
			if r.cluster || slices.ContainsFunc(r.names, func(n string) bool { return reach[n] }) {
				reach[name] = true
				changed = true
			}
		}
	}
	var out []string
	for _, t := range s.tests {
		if reach[t] {
			out = append(out, t)
		}
	}
	return out
}

// isCluster reports whether name is one of redistest's cluster clients.
func isCluster(name string) bool { return name == "Cluster" || name == "PrivateCluster" }
