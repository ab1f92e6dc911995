package runqueue_test

import (
	"fmt"
	"sort"
)

func sortedCopy(s []string) []string {
	out := append([]string(nil), s...)
	sort.Strings(out)
	return out
}

func typeAndValue(typ string, v any) string { return fmt.Sprintf("%s:%v", typ, v) }
