package runqueue_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/runqueue/runqueue/internal/fairness"
)

// helper-190 review of eb447e4 (offNew).

// h190HeadMoved: keys c1..c3 register with the flag off BEFORE any state
// (offNew false). A flag-on call makes the state and its first discovery
// read (b) covers only the 30 keys ahead of them in ckIndex. With the flag
// off, each c gets a second run (available after b) and a flag-off call
// serves its old (priority-9) run: the old oracle rule ends their wait
// (offNew false, not in the lane). The head of each c is now the new run,
// so discovery finds them as newcomers and puts them in the lane
// (design.md, Discovery: "a key with old work whose first ready run became
// available after b ... is new"); u registers behind them with P = 0.
//
// expiry: the same keys registered with the flag on, then the state
// expires (no key pending after it); the new state's first read (b) covers
// the 30 keys ahead; with the flag off each c gets a priority-9 run
// (available after b: its new head) and no flag-off call serves any c.
//
// onWrite: as expiry, but the c's runs are priority 9 and each c's second
// run (priority 0, after b) is written with the flag ON, not moving its
// head (no registration); a flag-off call then serves the old runs.
func h190HeadMoved(o *fairness.Oracle, nc int, mode string, beforeU func()) error {
	expiry := mode != "serve"
	var err error
	do := func(e error) {
		if err == nil {
			err = e
		}
	}
	enq := func(k string, prio int) {
		if err == nil {
			_, err = o.Enqueue(k, prio, 0, 0)
		}
	}
	deq := func(n int) {
		if err != nil {
			return
		}
		var s []fairness.Served
		s, err = o.Dequeue(n)
		for _, x := range s {
			if err == nil {
				err = o.Ack(x.ID)
			}
		}
	}
	tick := func() { do(o.Advance(time.Millisecond)) }
	if !expiry {
		do(o.SetFlag(false))
	}
	// b: one priority-9 run (its head, first in ckIndex), then a backlog.
	enq("b", 9)
	for i := 0; i < 12; i++ {
		enq("b", 0)
	}
	for i := 1; i <= 30; i++ {
		tick()
		enq(fmt.Sprintf("x%02d", i), 9)
	}
	switch {
	case mode == "onWrite":
		for i := 1; i <= nc; i++ {
			tick()
			enq(fmt.Sprintf("c%d", i), 9)
		}
		do(o.ExpireState())
		tick()
		deq(1) // the new state, b: reads b, x01..x29; serves b
		tick()
		for i := 1; i <= nc; i++ {
			enq(fmt.Sprintf("c%d", i), 0) // flag on, after b, behind the old head
		}
		do(o.SetFlag(false))
		deq(30 + nc) // flag off: the priority-9 runs (x's drain, c's keep the new run)
	case expiry:
		for i := 1; i <= nc; i++ {
			tick()
			enq(fmt.Sprintf("c%d", i), 0)
		}
		do(o.ExpireState())
		tick()
		deq(1) // the new state, b: reads b, x01..x29; serves b
		do(o.SetFlag(false))
		tick()
		for i := 1; i <= nc; i++ {
			enq(fmt.Sprintf("c%d", i), 9) // the new head, available after b
		}
		deq(30) // flag off: the x's (priority 9, older) drain; no c served
	default:
		for i := 1; i <= nc; i++ {
			tick()
			enq(fmt.Sprintf("c%d", i), 9)
		}
		tick()
		do(o.SetFlag(true))
		deq(1) // the state, b: reads b, x01..x29; serves b
		do(o.SetFlag(false))
		tick()
		for i := 1; i <= nc; i++ {
			enq(fmt.Sprintf("c%d", i), 0) // available after b
		}
		deq(30 + nc) // flag off: the priority-9 runs (x's drain, c's keep the new run)
	}
	do(o.SetFlag(true))
	deq(1) // serves b (tagged); discovery's cursor past the index's end
	deq(1) // discovery finds c's: newcomers, in the lane
	if err == nil && beforeU != nil {
		beforeU()
	}
	enq("u", 0)
	for i := 0; i < 6 && err == nil; i++ {
		enq("b", 0)
		deq(1)
	}
	return err
}

func TestReviewH190HeadMovedByFlagOff(t *testing.T) {
	for _, b := range foBackends {
		for _, mode := range []string{"serve", "expiry", "onWrite"} {
			t.Run(b.name+"/"+mode, func(t *testing.T) {
				p, mini := foPool(t, b, 0)
				d, err := p.NewDriver(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				cfg := fairness.Config{Lease: time.Minute, MaxAttempts: 3, VEvery: 1}
				if mini {
					cfg.StateTTL = foMiniStateTTL
				}
				o := fairness.New(d, cfg)
				err = h190HeadMoved(o, 3, mode, func() {
					for _, k := range []string{"c1", "c2", "c3"} {
						in, err := d.InLane(k)
						if err != nil || !in {
							t.Fatalf("%s not in the lane before u registers (err %v)", k, err)
						}
					}
				})
				if err == nil {
					err = o.Finish()
				}
				if err != nil {
					t.Fatal(err)
				}
				var sb strings.Builder
				for _, e := range o.H.Events {
					switch e.Kind {
					case fairness.EvRegister, fairness.EvServe, fairness.EvFlag, fairness.EvOp, fairness.EvSuspect:
						if e.Key == "u" || strings.HasPrefix(e.Key, "c") || e.Key == "b" || e.Kind == fairness.EvFlag || e.Kind == fairness.EvOp && strings.HasPrefix(e.Text, "deq") {
							fmt.Fprintf(&sb, "%s\n", e)
						}
					}
				}
				t.Logf("events:\n%s", sb.String())
				if vs := fairness.Run(&o.H, fairness.Checks...); len(vs) > 0 {
					t.Fatalf("%s", fairness.Report(&o.H, vs))
				}
			})
		}
	}
}
