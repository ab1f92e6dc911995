package runqueue

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestShake: top-level functions nothing calls go, with their comments;
// a function only a kept one calls stays; a mention in a comment or a
// longer name that contains it keeps nothing.
func TestShake(t *testing.T) {
	src := `-- lib
-- helper: see unused
local function helper(x)
  return x + 1
end

-- unused: mentioned only here and in comments (helper_two is another name)
local function unused()
  return '-- not a comment'
end

local function helper_two(x)
  return helper(x) -- calls helper
end

local T = { a = 1 }
-- unused would be nice here
return helper_two(T.a)
`
	want := `-- lib
-- helper: see unused
local function helper(x)
  return x + 1
end


local function helper_two(x)
  return helper(x) -- calls helper
end

local T = { a = 1 }
-- unused would be nice here
return helper_two(T.a)
`
	require.Equal(t, want, shake(src))
	require.Equal(t, "x = 'a -- b' ", stripComments("x = 'a -- b' -- c"))
	// A shape shake does not know (no column-0 end) is left whole.
	odd := "local function f()\n  return 1 end\nreturn f()\n"
	require.Equal(t, odd, shake(odd))
}
