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

// A registration reads SCHED_REG_FIELDS and leaves the state partial; the
// next sched_state(S) reads SCHED_REST_FIELDS. Together they must be
// SCHED_FIELDS, each field once: a field in neither would never be read
// after a registration (a later step would see its default and write it
// back), a field in both read twice.
func TestSchedPartialFieldsCoverState(t *testing.T) {
	raw, err := luaFS.ReadFile("lua/lib/sched_reg.lua")
	if err != nil {
		t.Fatal(err)
	}
	list := func(name string) []string {
		m := regexp.MustCompile(`local ` + name + ` = \{([^}]*)\}`).FindStringSubmatch(string(raw))
		if m == nil {
			t.Fatalf("no %s in lib/sched_reg.lua", name)
		}
		var out []string
		for _, f := range strings.Split(m[1], ",") {
			out = append(out, strings.Trim(strings.TrimSpace(f), "'"))
		}
		return out
	}
	all, reg, rest := list("SCHED_FIELDS"), list("SCHED_REG_FIELDS"), list("SCHED_REST_FIELDS")
	if reg[0] != all[0] {
		t.Errorf("a registration's first field %q must be SCHED_FIELDS' first %q: sched_state tells a missing state by it", reg[0], all[0])
	}
	both := append(slices.Clone(reg), rest...)
	slices.Sort(both)
	slices.Sort(all)
	if !slices.Equal(both, all) {
		t.Errorf("SCHED_REG_FIELDS %v + SCHED_REST_FIELDS %v != SCHED_FIELDS %v", reg, rest, all)
	}
}
