package runqueue_test

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/fairness"
)

// TestS18OracleUndiscoveredRegistersAhead replays the sequence a deeper
// fairness soak found (RUNQUEUE_FAIRNESS_SEQUENCES=300, rapid seed
// 11429136201785132763, TestFairnessOracleNewcomer on a real Redis), which
// every check must pass. Keys "!", "*" and "b" get ready runs from a
// flag-off instance (undiscovered); flag on again, one dequeue promotes
// due delayed runs of u1 (its first ready run: a newcomer) and of "!",
// whose promoted run is ready earlier than its queued ones and so moves
// its head: the scheduler registers "!" then, by the newcomer rule, in the
// same promotion and ahead of u1, which waits in the lane behind it. The
// oracle counted only a key's first ready run as a registration, so it
// gave u1 P = 0 and read f's fourth serve before u1 as a violation of the
// newcomer bound (3 + P serves); with "!" counted (P = 1) the schedule is
// within it. Fixed in the oracle (internal/fairness, gainReady and
// beginBatch): a flag-on write that makes a run of an undiscovered key
// ready counts the key as a newcomer ahead of later ones.
func TestS18OracleUndiscoveredRegistersAhead(t *testing.T) {
	for _, b := range foBackends {
		t.Run(b.name, func(t *testing.T) {
			p, mini := foPool(t, b, 1)
			o := foOracleOn(t, p, mini, 1)
			var err error
			do := func(e error) {
				if err == nil {
					err = e
				}
			}
			enq := func(key string, prio int, delay, ttl string) {
				dl, e := time.ParseDuration(delay)
				do(e)
				tt, e := time.ParseDuration(ttl)
				do(e)
				if err == nil {
					_, e = o.Enqueue(key, prio, dl, tt)
					do(e)
				}
			}
			deq := func(n int) {
				if err == nil {
					_, e := o.Dequeue(n)
					do(e)
				}
			}
			advance := func(d string) {
				dt, e := time.ParseDuration(d)
				do(e)
				do(o.Advance(dt))
			}
			do(o.SetLimits(fairness.Limits{Env: 0, Queue: 0, Key: 1}))
			enq("!!a", 9, "0s", "0s") // r1
			enq("!!a", 1, "0s", "0s") // r2
			deq(1)
			enq("u1", 0, "5s", "0s")   // r3
			enq("f", 9, "40s", "0s")   // r4
			enq("f", 0, "0s", "0s")    // r5
			enq("f", 0, "0s", "1m30s") // r6
			enq("f", 0, "0s", "1m30s") // r7
			do(o.SetFlag(false))
			enq("!", 0, "0s", "0s")     // r8
			enq("!", 0, "0s", "1m30s")  // r9
			enq("!", 9, "40s", "0s")    // r10
			enq("!", 0, "0s", "0s")     // r11
			enq("!", 1, "40s", "20s")   // r12
			enq("!", 1, "5s", "1m30s")  // r13
			enq("!", 0, "0s", "20s")    // r14
			enq("!", 0, "0s", "1m30s")  // r15
			enq("*", 0, "5s", "20s")    // r16
			enq("*", 1, "0s", "20s")    // r17
			enq("*", 0, "0s", "0s")     // r18
			enq("!!a", 0, "5s", "0s")   // r19
			enq("!!a", 9, "0s", "0s")   // r20
			enq("!!a", 0, "0s", "20s")  // r21
			enq("!!a", 1, "40s", "20s") // r22
			enq("b", 9, "0s", "0s")     // r23
			enq("b", 0, "0s", "0s")     // r24
			enq("b", 9, "0s", "20s")    // r25
			enq("b", 0, "0s", "0s")     // r26
			enq("b", 0, "0s", "0s")     // r27
			enq("!!a", 0, "0s", "0s")   // r28
			enq("!!a", 0, "0s", "0s")   // r29
			enq("!!a", 0, "0s", "0s")   // r30
			enq("!!a", 0, "0s", "0s")   // r31
			enq("!!a", 0, "0s", "0s")   // r32
			enq("!!a", 0, "0s", "0s")   // r33
			enq("!!a", 0, "0s", "0s")   // r34
			enq("!!a", 0, "0s", "0s")   // r35
			deq(10)
			enq("!", 0, "0s", "0s")  // r36
			enq("!", 0, "5s", "0s")  // r37
			enq("!", 9, "5s", "20s") // r38
			enq("!", 0, "0s", "0s")  // r39
			enq("!", 0, "0s", "0s")  // r40
			enq("!", 0, "5s", "0s")  // r41
			enq("*", 0, "5s", "0s")  // r42
			advance("5s")
			enq("!!a", 9, "5s", "0s")   // r43
			enq("!!a", 9, "0s", "20s")  // r44
			enq("!!a", 0, "40s", "0s")  // r45
			enq("!!a", 0, "0s", "20s")  // r46
			enq("!!a", 0, "40s", "20s") // r47
			do(o.SetFlag(true))
			do(o.SetLimits(fairness.Limits{Env: 0, Queue: 0, Key: 0}))
			advance("1m1s")
			do(o.RecoverLeases())
			deq(10)
			// (those of this list the dequeue took past their TTL were
			// expired, not held)
			for _, id := range []string{"r4", "r25", "r18", "r20", "r6", "r23", "r16", "r44", "r7", "r38"} {
				if slices.Contains(o.Held(), id) {
					do(o.Ack(id))
				}
			}
			deq(10)
			require.NoError(t, err)
			require.NoError(t, o.Finish())
			if vs := fairness.Run(&o.H, fairness.Checks...); len(vs) > 0 {
				t.Fatalf("%s", fairness.Report(&o.H, vs))
			}
		})
	}
}
