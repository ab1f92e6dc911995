// Package schedfmt is the Go side of the stored format of the fair
// scheduler's state, as the flag-on scripts write it (runqueue's
// lua/lib/sched_reg.lua, whose header describes the layout): the score regions
// of ckVtime, the seq codes of its members and the values of the state
// hash. runqueue reads the state through it, and test harnesses that
// rewrite a state (internal/scenario) write it through it, so the format is
// parsed and formatted in one Go place.
package schedfmt

import (
	"strconv"
	"strings"
)

// Score regions of ckVtime (tags are below 2^50): parked tags sit at
// tag - GatedOffset, the newcomer lane at registration number -
// WaitingOffset, competing tags at the tag, gated entries at GatedOffset +
// gating number.
const (
	GatedOffset   = 1 << 52
	WaitingOffset = 1 << 51
)

// ZRANGEBYSCORE bounds of the regions, as the scripts spell them.
const (
	ActiveMin = "0"
	ActiveEnd = "(1125899906842624"  // 2^50
	LaneMin   = "-2251799813685248"  // -2^51
	LaneEnd   = "(-1125899906842624" // -2^51 + 2^50
)

// SentinelMember is ckVtime's sentinel, at score 0 (rank 0 of the competing
// region); the key lives exactly as long as the state hash.
const SentinelMember = ""

// The wide marks: at every WideAt-th registration (registration numbers
// WideAt, 2 WideAt, ...) of a state whose ckVtime holds at least WideAt
// entries, the scripts add WideMember to ckVtime at score WideScore
// (between the competing and the gated regions: no region holds it) and
// WideField = WideValue to the state hash. Both are over 64 bytes, so that
// Redis keeps the keys as a skiplist and a hash table from then on instead
// of a listpack that every lookup walks (lua/lib/sched_reg.lua says why).
// Nothing reads them.
const (
	WideAt     = 64
	WideScore  = 1 << 51
	WideMember = "runqueue scheduler: this member is longer than 64 bytes, see lib/sched"
	WideField  = "~"
	WideValue  = "runqueue scheduler: this value is longer than 64 bytes, see lib/sched.lua"
)

// State-hash fields.
const (
	FieldClock    = "v"  // the clock V, in units
	FieldEpoch    = "e"  // the epoch of V
	FieldCursor   = "c"  // the discovery cursor
	FieldNextSeq  = "s"  // the next registration number
	FieldGateKey  = "gk" // the gating limit
	FieldGateNext = "gn" // the next gating number
	FieldGateProb = "gp" // the gating number the probe looked at last
	FieldLaneHead = "lh" // the lane's head, "" when the lane is empty
	// FieldBorn is the time (ms) of the state's first discovery read; -1 or
	// missing until then.
	FieldBorn = "b"
	// FieldColdMark is the cold mark (ms): a dequeue's promotion cut short
	// on a cold state (see vtime's call.promote); -1 or missing when unset.
	FieldColdMark = "cm"
	// RegPrefix starts every field of a registered variant (its variant
	// member).
	RegPrefix = "="
)

// SeqCodeLen is the length of a seq code: a registration number (below
// 10^15) in decimal, zero-padded, so that its byte order is its order.
const SeqCodeLen = 15

// ParseSeqCode reads a seq code.
func ParseSeqCode(code string) (int64, bool) {
	if len(code) != SeqCodeLen {
		return 0, false
	}
	for i := 0; i < len(code); i++ {
		if code[i] < '0' || code[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(code, 10, 64)
	return n, err == nil
}

// SplitMember splits a competing or gated ckVtime member into its seq code
// and variant member; ok is false for a member too short to be one.
func SplitMember(m string) (code, vm string, ok bool) {
	if len(m) <= SeqCodeLen {
		return "", "", false
	}
	return m[:SeqCodeLen], m[SeqCodeLen:], true
}

// Reg is a registered variant's state-hash value: its seq code, then "g"
// and its tag when gated or "w" when in the newcomer lane, then "|r" when
// its stride remainder r is not 0.
type Reg struct {
	Code    string
	Gated   bool
	Tag     int64 // when gated; a competing tag is its ckVtime score
	Waiting bool
	R       int64
}

// ParseReg parses a registration value; ok is false for anything else.
func ParseReg(v string) (reg Reg, ok bool) {
	if len(v) < SeqCodeLen {
		return Reg{}, false
	}
	reg.Code = v[:SeqCodeLen]
	rest, rs, hasR := strings.Cut(v[SeqCodeLen:], "|")
	switch {
	case strings.HasPrefix(rest, "g"):
		n, err := strconv.ParseInt(rest[1:], 10, 64)
		if err != nil {
			return Reg{}, false
		}
		reg.Gated, reg.Tag = true, n
	case rest == "w":
		reg.Waiting = true
	case rest != "":
		return Reg{}, false
	}
	if hasR {
		n, err := strconv.ParseInt(rs, 10, 64)
		if err != nil {
			return Reg{}, false
		}
		reg.R = n
	}
	return reg, true
}

// String formats the value as the scripts write it (sched_value).
func (r Reg) String() string {
	v := r.Code
	if r.Gated {
		v += "g" + strconv.FormatInt(r.Tag, 10)
	}
	if r.Waiting {
		v += "w"
	}
	if r.R > 0 {
		v += "|" + strconv.FormatInt(r.R, 10)
	}
	return v
}

// Num reads a numeric state-hash field as the scripts write it (an integer
// printed with %.17g); "" and anything unparsable are 0.
func Num(s string) int64 {
	n, _ := strconv.ParseFloat(s, 64)
	return int64(n)
}

// Weight reads a weight override as SetWeight stores it.
func Weight(s string) (float64, error) {
	return strconv.ParseFloat(s, 64)
}

// FormatWeight formats a weight override for storage.
func FormatWeight(w float64) string {
	return strconv.FormatFloat(w, 'g', -1, 64)
}
