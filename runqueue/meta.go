package runqueue

import (
	"strconv"
	"strings"
)

// meta mirrors the run metadata the scripts keep (lua/lib/meta.lua):
// "st|att|dl|ld|vm|pr|at|ttl".
type meta struct {
	st          string
	att, dl, pr int
	ld, at, ttl int64
	vm          string
}

func parseMeta(s string) (meta, bool) {
	f := strings.Split(s, "|")
	if len(f) != 8 {
		return meta{}, false
	}
	var m meta
	var err error
	num := func(s string) int64 {
		n, e := strconv.ParseInt(s, 10, 64)
		if e != nil && err == nil {
			err = e
		}
		return n
	}
	m.st = f[0]
	m.att = int(num(f[1]))
	m.dl = int(num(f[2]))
	m.ld = num(f[3])
	m.vm = f[4]
	m.pr = int(num(f[5]))
	m.at = num(f[6])
	m.ttl = num(f[7])
	return m, err == nil
}
