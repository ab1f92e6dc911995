// Package testsrc reads a directory's Go files the way the module's test
// listers (clustertests, serialtests) need them: parsed without type
// checking, grouped by package, with go test's rule for the names it runs.
package testsrc

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"unicode"
	"unicode/utf8"
)

// File is one parsed Go file of a directory.
type File struct {
	*ast.File
	Test bool // a _test.go file
}

// ParseDir parses the .go files of dir (not its subdirectories) and groups
// them by package name: a directory holds up to two packages, p and the
// external p_test. It returns nil for a directory without Go files.
func ParseDir(dir string) (map[string][]File, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(paths) == 0 {
		return nil, err
	}
	return ParseFiles(paths)
}

// ParseFiles parses the Go files at paths and groups them by package name.
func ParseFiles(paths []string) (map[string][]File, error) {
	fset := token.NewFileSet()
	byPkg := map[string][]File{}
	for _, p := range paths {
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		byPkg[f.Name.Name] = append(byPkg[f.Name.Name], File{f, strings.HasSuffix(p, "_test.go")})
	}
	return byPkg, nil
}

// IsTestName reports whether name is one go test runs: Test, Fuzz or
// Example followed by nothing or by a character that is not a lower-case
// letter (TestMain aside).
func IsTestName(name string) bool {
	for _, prefix := range []string{"Test", "Fuzz", "Example"} {
		rest, ok := strings.CutPrefix(name, prefix)
		if r, _ := utf8.DecodeRuneInString(rest); ok && (rest == "" || !unicode.IsLower(r)) {
			return name != "TestMain"
		}
	}
	return false
}
