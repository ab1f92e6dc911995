package runqueue

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Review of 76d1acc (shake). A top-level function is taken to run from
// its "local function NAME(" line to the next line "end" at column 0. A
// one-line function ("local function f(x) return x end", as before,
// sched_fmt and entry_before are) has no such line of its own, so its
// block runs on to the end of whatever comes next at column 0, and goes
// with it when the one-liner is not called.

// TestReviewShakeOneLinerKeepsTheNextFunction: used() is called, but it
// sits in the block of the unused one-liner and is dropped with it: the
// script then calls a nil global at run time (Redis: "Script attempted to
// access nonexistent global variable 'used'").
func TestReviewShakeOneLinerKeepsTheNextFunction(t *testing.T) {
	src := "local function unused(x) return x end\n\nlocal function used()\n  return 1\nend\n\nreturn used()\n"
	out := shake(src)
	require.Contains(t, out, "local function used()", "a called function is kept:\n%s", out)
}

// TestReviewShakeOneLinerKeepsTopLevelStatements: the top-level if after
// an unused one-liner is dropped with it, silently (no call is left
// dangling: the script just stops doing the SET).
func TestReviewShakeOneLinerKeepsTopLevelStatements(t *testing.T) {
	src := "local function unused(x) return x end\nif ARGV[1] == '1' then\n  redis.call('SET', KEYS[1], 'v')\nend\nreturn 1\n"
	out := shake(src)
	require.True(t, strings.Contains(out, "redis.call('SET'"), "top-level code is never dropped:\n%s", out)
}
