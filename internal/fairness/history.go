package fairness

import (
	"fmt"
	"os"
	"strings"
)

// Kind is the kind of an Event.
type Kind uint8

// The events an Oracle records. Fields of Event that a kind does not name
// are zero.
const (
	// EvOp: an operation starts (Text describes it).
	EvOp Kind = iota + 1
	// EvCall: a dequeue call starts. MaxCount; Capacity = min(maxCount,
	// what the env and queue limits leave); Expect = runs servable now,
	// each key's ready runs up to its key limit; N = keys with ready runs;
	// On = flag on; Clean = flag on, nothing awaiting discovery, no tag a
	// flag-off drain may have left, no possible lapse of the state;
	// Certain = the due delayed runs fit in the call's promotion (and in
	// that of a call of 1: Certain1); Expiring = a run the call may take
	// had passed its TTL (ready, or delayed and due).
	EvCall
	// EvServe: a run served. Key, ID, Attempt, W (key's weight), On,
	// Serve (its index in the whole serve sequence, from 0); Expiring =
	// taken past its TTL and deleted, not delivered (an expired serve).
	EvServe
	// EvCallEnd: a dequeue call took N runs (the expired ones included).
	EvCallEnd
	// EvRegister: Key gained its first ready run (Debt, P, Eligible,
	// Visible: see Event).
	EvRegister
	// EvDrain: Key lost its last ready run (On: by a serve).
	EvDrain
	// EvServable / EvUnservable: Key has a ready run and is below its key
	// limit / no longer.
	EvServable
	EvUnservable
	// EvSuspect: Key may have ready runs without a tag (On) — written with
	// the flag off, or present when the state expired — or no longer.
	EvSuspect
	// EvWeight: Key's weight became W.
	EvWeight
	// EvLimits: the limits changed (Text).
	EvLimits
	// EvFlag: the flag became On.
	EvFlag
	// EvReset: the scheduler state expired as a whole (StateExpirer).
	EvReset
	// EvLapse: the state may have run out by its TTL (a driver without a
	// StateProber, StateTTL/2 after the last certain write), or did
	// (a StateProber found none of it): every tag may be gone.
	EvLapse
	// EvV: the virtual clock read W.
	EvV
	// EvProbe: Singles is what MaxCount calls of dequeue(1) serve from the
	// state the next call starts from.
	EvProbe
	// EvEnqueue: run ID of Key was queued.
	EvEnqueue
	// EvAck: run ID acked (Text: the error, if any).
	EvAck
	// EvNack: run ID nacked; On = requeued; Eligible = requeue expected.
	EvNack
	// EvRecover: lease recovery took back N runs; IDs were due and are
	// requeued, Dead were due and are out of attempts.
	EvRecover
	// EvExpire: the TTL sweep expired N runs; IDs were due (inside a
	// dequeue call: the call swept one at its key's head).
	EvExpire
	// EvEnd: the history ends; IDs are the runs that never ended.
	EvEnd
	// EvError: a driver call failed unexpectedly (Text).
	EvError
	// EvHeadMoved: a flag-on write moved the head of Key while it awaited
	// discovery: it registers by the newcomer rule (P, Debt as for
	// EvRegister), behind the newcomers before it.
	EvHeadMoved
)

var kindNames = map[Kind]string{EvOp: "op", EvCall: "call", EvServe: "serve", EvCallEnd: "call-end",
	EvRegister: "register", EvDrain: "drain", EvServable: "servable", EvUnservable: "unservable",
	EvSuspect: "suspect", EvWeight: "weight", EvLimits: "limits", EvFlag: "flag", EvReset: "reset",
	EvLapse: "lapse", EvV: "V", EvHeadMoved: "head-moved", EvProbe: "probe", EvEnqueue: "enqueue", EvAck: "ack", EvNack: "nack",
	EvRecover: "recover", EvExpire: "expire", EvEnd: "end", EvError: "error"}

func (k Kind) String() string { return kindNames[k] }

// Event is one observation. Op is the index of the operation it belongs
// to; Serve is the number of serves before it.
type Event struct {
	Kind  Kind
	Op    int
	Serve int
	Key   string
	ID    string
	Text  string
	On    bool
	W     float64

	Attempt  int
	MaxCount int
	Capacity int
	Expect   int
	N        int
	Clean    bool
	Certain  bool
	Certain1 bool
	Expiring bool

	// EvRegister: Visible = the run came through a flag-on write (the key
	// registers now); Eligible = the key has no debt: it never had a ready
	// run, or the state expired since it last had one, or since its last
	// ready run left by a serve at weight 1 or more there were at least 3A
	// flag-on serves, all at weight 1, A the number of distinct keys they
	// served; P = other keys that registered before it (or in the same
	// lease recovery or promotion), still hold ready runs and were not
	// served since (the newcomers it may queue behind);
	// Debt = an upper bound on its tag minus V (see CheckReachability);
	// W = its weight then (0: cleared, i.e. 1); Stale = some key (it
	// too) was drained by a flag-off operation and may still wait in the
	// newcomer lane, where P does not count it (with a LaneProber, only
	// keys the probe finds there: Oracle.staleInLane).
	// Fresh = the key never had a ready run before.
	Visible  bool
	Eligible bool
	Fresh    bool
	Stale    bool
	P        int
	Debt     float64
	// DueOp, when above 0 (EvRegister of a promotion), is the operation at
	// which the key's first due run fell due, at or before a cold mark
	// that may be set: the key counts as registered then, not at Op
	// (docs/design.md section 6, Registration, Cold mark; guarantee 10).
	DueOp int

	IDs     []string
	Dead    []string
	Singles []Served
}

func (e Event) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "#%d s%d %s", e.Op, e.Serve, e.Kind)
	switch e.Kind {
	case EvOp, EvLimits, EvError:
		fmt.Fprintf(&b, " %s", e.Text)
	case EvServe:
		fmt.Fprintf(&b, " %q %s a%d w%g on=%v", e.Key, e.ID, e.Attempt, e.W, e.On)
		if e.Expiring {
			b.WriteString(" expired")
		}
	case EvCall:
		fmt.Fprintf(&b, " max=%d cap=%d servable=%d keys=%d on=%v clean=%v certain=%v",
			e.MaxCount, e.Capacity, e.Expect, e.N, e.On, e.Clean, e.Certain)
		if e.Expiring {
			b.WriteString(" expiring")
		}
	case EvHeadMoved:
		fmt.Fprintf(&b, " %q P=%d debt=%g", e.Key, e.P, e.Debt)
	case EvRegister:
		fmt.Fprintf(&b, " %q visible=%v eligible=%v P=%d debt=%g", e.Key, e.Visible, e.Eligible, e.P, e.Debt)
		if e.DueOp > 0 {
			fmt.Fprintf(&b, " due@#%d", e.DueOp)
		}
	case EvV:
		fmt.Fprintf(&b, " %g", e.W)
	default:
		if e.Key != "" || e.Kind == EvServable || e.Kind == EvUnservable || e.Kind == EvDrain || e.Kind == EvSuspect {
			fmt.Fprintf(&b, " %q", e.Key)
		}
		if e.ID != "" {
			fmt.Fprintf(&b, " %s", e.ID)
		}
		if e.Kind == EvWeight {
			fmt.Fprintf(&b, " %g", e.W)
		}
		if e.Kind == EvFlag || e.Kind == EvSuspect || e.Kind == EvNack || e.Kind == EvDrain {
			fmt.Fprintf(&b, " %v", e.On)
		}
		if e.Kind == EvRecover || e.Kind == EvExpire || e.Kind == EvCallEnd {
			fmt.Fprintf(&b, " n=%d due=%d", e.N, len(e.IDs)+len(e.Dead))
		}
	}
	return b.String()
}

// History is what an Oracle observed.
type History struct {
	Events []Event
	// Ops, Calls and Serves count operations, dequeue calls and serves.
	Ops, Calls, Serves int
	// MaxAttempts as configured (EvRecover already says what became of a
	// run); ScanMin is the smallest discovery scan of a call (30).
	ScanMin int
}

// Violation is a check that failed.
type Violation struct {
	Check string
	Op    int // operation index
	Serve int // serves before it
	Msg   string
}

func (v Violation) String() string {
	return fmt.Sprintf("%s: op #%d, after %d serves: %s", v.Check, v.Op, v.Serve, v.Msg)
}

// Trace renders the operations of h up to op (inclusive), one a line,
// with the serves of each, for a failure report.
func (h *History) Trace(upTo int) string {
	var b strings.Builder
	for _, e := range h.Events {
		if e.Op > upTo {
			break
		}
		switch e.Kind {
		case EvOp:
			fmt.Fprintf(&b, "\n#%d %s", e.Op, e.Text)
		case EvServe:
			fmt.Fprintf(&b, " [%q %s%s]", e.Key, e.ID, map[bool]string{true: " expired"}[e.Expiring])
		case EvRegister:
			if e.Visible {
				fmt.Fprintf(&b, " (+%q P=%d%s%s)", e.Key, e.P, map[bool]string{true: " fresh"}[e.Eligible],
					map[bool]string{true: fmt.Sprintf(" due@#%d", e.DueOp)}[e.DueOp > 0])
			}
		case EvV:
			fmt.Fprintf(&b, " V=%g", e.W)
		}
	}
	return b.String()
}

// Coverage counts what the checks had to judge in h: eligible newcomer
// registrations, flag-on calls checked for work conservation, batch
// probes, V reads, serves.
type Coverage struct {
	Sequences, Ops, Calls, Serves, Newcomers, WorkCalls, Probes, VReads int
	// HeavyNewcomers: of the newcomer registrations, those at a weight
	// above 1 (a quantum below a weight-1 serve).
	HeavyNewcomers int
}

func (c Coverage) String() string {
	return fmt.Sprintf("%d sequences, %d operations, %d dequeue calls, %d serves checked (%d newcomer registrations, %d at a weight above 1, %d calls held to work conservation, %d batch probes, %d V reads)",
		c.Sequences, c.Ops, c.Calls, c.Serves, c.Newcomers, c.HeavyNewcomers, c.WorkCalls, c.Probes, c.VReads)
}

// Add adds h's counts to c.
func (c *Coverage) Add(h *History) {
	c.Sequences++
	c.Ops += h.Ops
	c.Calls += h.Calls
	c.Serves += h.Serves
	for _, e := range h.Events {
		switch e.Kind {
		case EvRegister:
			if e.Visible && e.Eligible {
				c.Newcomers++
				if milliWeight(e.W) > 1000 { // as the scheduler holds it: 1.0004 is 1
					c.HeavyNewcomers++
				}
			}
		case EvCall:
			if e.On && e.Clean && e.Certain {
				c.WorkCalls++
			}
		case EvProbe:
			c.Probes++
		case EvV:
			c.VReads++
		}
	}
}

// Report renders the first violation of each check in vs, then the
// operations up to the first violation (the last 80, or all of them when
// RUNQUEUE_FAIRNESS_FULL_TRACE is set).
func Report(h *History, vs []Violation) string {
	v := vs[0]
	var b strings.Builder
	seen := map[string]int{}
	for _, x := range vs {
		seen[x.Check]++
	}
	for _, x := range vs {
		if n := seen[x.Check]; n > 0 {
			fmt.Fprintf(&b, "%s (%d violations)\n", x, n)
			seen[x.Check] = 0
		}
	}
	lines := strings.Split(h.Trace(v.Op), "\n")
	if len(lines) > 80 && os.Getenv("RUNQUEUE_FAIRNESS_FULL_TRACE") == "" {
		lines = append([]string{"..."}, lines[len(lines)-80:]...)
	}
	return b.String() + "operations:" + strings.Join(lines, "\n")
}
