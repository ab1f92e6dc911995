package runqueue

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

// sched_save writes the scalars that differ from S.was, the values as
// sched_state read them; S.was is built field by field in one constructor
// (growing a table key by key cost Redis CPU). A scalar missing from it
// would be written at every call, one missing from SCHED_FIELDS never read:
// both lists must name the same fields, each was.f being st.f.
func TestSchedWasListsEveryScalar(t *testing.T) {
	raw, err := luaFS.ReadFile("lua/lib/sched_reg.lua")
	if err != nil {
		t.Fatal(err)
	}
	src := string(raw)
	m := regexp.MustCompile(`local SCHED_FIELDS = \{([^}]*)\}`).FindStringSubmatch(src)
	if m == nil {
		t.Fatal("no SCHED_FIELDS in lib/sched_reg.lua")
	}
	var fields []string
	for _, f := range strings.Split(m[1], ",") {
		fields = append(fields, strings.Trim(strings.TrimSpace(f), "'"))
	}
	w := regexp.MustCompile(`(?s)S\.was = \{(.*?)\}`).FindStringSubmatch(src)
	if w == nil {
		t.Fatal("no S.was constructor in lib/sched_reg.lua")
	}
	var was []string
	for _, kv := range regexp.MustCompile(`(\w+) = st\.(\w+)`).FindAllStringSubmatch(w[1], -1) {
		if kv[1] != kv[2] {
			t.Errorf("was.%s = st.%s", kv[1], kv[2])
		}
		was = append(was, kv[1])
	}
	if len(was) != strings.Count(w[1], "=") {
		t.Errorf("S.was holds a field that is not st.<field>: %q", w[1])
	}
	slices.Sort(fields)
	slices.Sort(was)
	if !slices.Equal(fields, was) {
		t.Errorf("SCHED_FIELDS %v, S.was %v", fields, was)
	}
}
