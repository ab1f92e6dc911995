package runqueue

import (
	"strings"
	"testing"
)

func TestInlineConstsWritesValues(t *testing.T) {
	src := `local x = 1
-- K.A in a comment stays
  --@inline
  local K = { A = 10, B = '(7', C = 'a, b }',
              D = 0, }
local function f(v)
  return v + K.A, K.B .. 'x', 'K.A in a string', K.C, K.A..'s', K.D == 0
end
`
	want := `local x = 1
-- K.A in a comment stays
local function f(v)
  return v + 10, '(7' .. 'x', 'K.A in a string', 'a, b }', 10 ..'s', 0 == 0
end
`
	got, err := inlineConsts(src)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
}

func TestInlineConstsRefusesOtherUses(t *testing.T) {
	table := "--@inline\nlocal K = { A = 1, S = 'x' }\n"
	for name, code := range map[string]string{
		"bare name":        "local t = K\n",
		"unknown key":      "local y = K.B\n",
		"assignment":       "K.A = 2\n",
		"method call":      "local y = K.S:upper()\n",
		"call":             "local y = K.S()\n",
		"index":            "local y = K.S[1]\n",
		"field of field":   "local y = K.A.b\n",
		"other definition": "--@inline\nlocal K = { A = 2, S = 'x' }\n",
		"unmarked table":   "local K = { A = 1, S = 'x' }\n",
	} {
		if out, err := inlineConsts(table + code); err == nil {
			t.Errorf("%s: built without error:\n%s", name, out)
		}
	}
	for name, src := range map[string]string{
		"negative value":    "--@inline\nlocal K = { A = -1 }\n",
		"fraction":          "--@inline\nlocal K = { A = 1.5 }\n",
		"expression":        "--@inline\nlocal K = { A = 2^3 }\n",
		"escaped string":    "--@inline\nlocal K = { A = 'a\\'b' }\n",
		"double quotes":     "--@inline\nlocal K = { A = \"a\" }\n",
		"unclosed":          "--@inline\nlocal K = { A = 1,\n",
		"no table":          "--@inline\nlocal function f() end\n",
		"code after table":  "--@inline\nlocal K = { A = 1 } local y = 2\n",
		"duplicate key":     "--@inline\nlocal K = { A = 1, A = 2 }\n",
		"positional value":  "--@inline\nlocal K = { 1, 2 }\n",
		"string past line":  "--@inline\nlocal K = { A = 'a\n' }\n",
		"directive at end":  "local y = 1\n--@inline",
		"directive, no end": "--@inline\n",
	} {
		if out, err := inlineConsts(src); err == nil {
			t.Errorf("%s: built without error:\n%s", name, out)
		}
	}
}

// A table is defined once in a script: a fragment included in two
// functions would define it twice, and the build refuses that (the second
// definition is an assignment to the name), with the same values or not.
func TestInlineConstsTableTwiceRefused(t *testing.T) {
	for _, other := range []string{"A = 1, S = 'x'", "A = 2, S = 'x'"} {
		src := "local function f()\n  --@inline\n  local K = { A = 1, S = 'x' }\n  return K.A\nend\n" +
			"local function g()\n  --@inline\n  local K = { " + other + " }\n  return K.S\nend\n"
		if out, err := inlineConsts(src); err == nil {
			t.Errorf("%s: built without error:\n%s", other, out)
		}
	}
}

// The flag-on scripts carry the scheduler's constants as literals: no
// SCHED table is built at a call, and no script refers to one.
func TestScriptsInlineSchedConstants(t *testing.T) {
	for _, vtime := range []bool{false, true} {
		set, err := buildScripts(vtime)
		if err != nil {
			t.Fatal(err)
		}
		for _, sc := range set.all() {
			code := stripComments(sc.src)
			if mentions(code, "SCHED") {
				t.Errorf("flag %v: script %s still refers to SCHED", vtime, sc.name)
			}
			if strings.Contains(sc.src, inlineDirective) {
				t.Errorf("flag %v: script %s still holds the %s directive", vtime, sc.name, inlineDirective)
			}
		}
	}
	on, _ := buildScripts(true)
	if !strings.Contains(on.dequeue.src, "4503599627370496") {
		t.Error("the flag-on dequeue does not hold the gated region's start as a literal")
	}
}
