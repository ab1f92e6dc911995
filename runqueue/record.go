package runqueue

import (
	"strconv"
	"strings"
)

// record is a run as stored in its queue's runs hash (lua/lib/record.lua):
// "ttl|att|pr|at|lt|vm|" then the payload's bytes. Go builds it at enqueue;
// the scripts rewrite it only when a nack, a lease recovery or a redrive
// changes the attempt, the time or the last settled token. A run's state
// is where it is (a variant's ready or delayed set, the queue's held hash,
// its dead set), not in the record. This file is its one Go reader and
// writer.
type record struct {
	att, pr     int
	at, ttl, lt int64
	vm          string
	payload     string
}

// appendRecord appends the record of a new run to b and returns it with
// the payload's offset (1-based, as Lua's string.sub counts).
func appendRecord(b []byte, pr int, at, ttl int64, vm string, payload []byte) ([]byte, int) {
	b = strconv.AppendInt(b, ttl, 10)
	b = append(b, "|1|"...)
	b = strconv.AppendInt(b, int64(pr), 10)
	b = append(b, '|')
	b = strconv.AppendInt(b, at, 10)
	b = append(b, "|0|"...)
	b = append(b, vm...)
	b = append(b, '|')
	off := len(b) + 1
	return append(b, payload...), off
}

// parseRecord reads a stored record; ok is false for anything else. It
// takes what the scripts' rec_parse takes (lua/lib/record.lua): each
// number ASCII digits only (no sign), the priority one digit; and refuses
// a number past int64, which Lua would read as a float.
func parseRecord(s string) (r record, ok bool) {
	var f [6]string
	for i := range f {
		j := strings.IndexByte(s, '|')
		if j < 0 {
			return record{}, false
		}
		f[i], s = s[:j], s[j+1:]
	}
	if len(f[2]) != 1 {
		return record{}, false
	}
	ok = true
	num := func(x string) int64 {
		// (ParseInt takes digits alone but for a sign, which Lua's %d+
		// does not)
		n, e := strconv.ParseInt(x, 10, 64)
		if e != nil || x[0] == '+' || x[0] == '-' {
			ok = false
		}
		return n
	}
	r = record{ttl: num(f[0]), att: int(num(f[1])), pr: int(num(f[2])), at: num(f[3]), lt: num(f[4]),
		vm: f[5], payload: s}
	return r, ok
}
