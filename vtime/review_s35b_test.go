package vtime

import (
	"fmt"
	"testing"

	"pgregory.net/rapid"

	"github.com/runqueue/runqueue/keys"
)

// TestReviewS35bFedVariantHeldForever: key f has ready runs of priority 0
// and one high-priority retry due at 1000, the earliest due run of the
// queue. Every call, scan new one-run keys fall due (after f's retry). With
// the rule before starving-first, f's retry (first in delayIndex order) was
// promoted in call 1; with starving-first alone every call's room went to
// the new keys and f's retry stayed delayed as long as f kept a ready run
// (found by review s35b). The scan/4 places kept for keys with ready runs
// reach it in the first call again.
func TestReviewS35bFedVariantHeldForever(t *testing.T) {
	scan := 11
	m := New(Config{ScanLimit: scan, PromoteLimit: 5, PriorityStep: 1_000_000})
	for i := range 20 {
		if err := m.Enqueue(fmt.Sprintf("f-ready-%d", i), "f", 0, 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Enqueue("f-retry", "f", 9, 1000, 0); err != nil {
		t.Fatal(err)
	}
	now := int64(2000)
	fm := keys.VariantMember("f")
	// enough due keys to start with
	for i := range scan + 1 {
		_ = m.Enqueue(fmt.Sprintf("b%d", i), fmt.Sprintf("b%d", i), 0, now, 0)
	}
	n := 0
	for call := 1; call <= 500; call++ {
		now++
		for range scan {
			n++
			_ = m.Enqueue(fmt.Sprintf("n%d", n), fmt.Sprintf("n%d", n), 0, now, now-1)
		}
		// f's producer keeps one ready run coming per call
		_ = m.Enqueue(fmt.Sprintf("f-more-%d", call), "f", 0, 0, now)
		for _, s := range m.Dequeue(10, now) {
			_ = m.Ack(s.ID)
		}
		if len(m.delayed[fm]) == 0 {
			t.Logf("f's retry promoted in call %d", call)
			if call > 1 {
				t.Fatalf("f's retry, the first due of the keys with ready runs, promoted only in call %d", call)
			}
			return
		}
	}
	t.Fatalf("f's high-priority retry, the earliest due run, still delayed after 500 calls (f has %d ready)", len(m.ready[fm]))
}

// TestReviewS35bFedRetryFiniteBurstModel: no overload, no producer. 1,000
// one-run keys fall due 1 ms after f's priority-9 retry; f has 20 ready
// runs. Default scan (30), Dequeue(10). The rule before starving-first:
// f's retry promoted in call 1. Starving-first alone: it waited until fewer
// than 30 keys without a ready run were left among the first 120 due (call
// 8). With scan/4 places kept for keys with ready runs: call 1.
func TestReviewS35bFedRetryFiniteBurstModel(t *testing.T) {
	m := New(Config{PromoteLimit: 100, PriorityStep: 1_000_000})
	for i := range 20 {
		_ = m.Enqueue(fmt.Sprintf("f-%d", i), "f", 0, 0, 0)
	}
	_ = m.Enqueue("f-retry", "f", 9, 1000, 0)
	for i := range 1000 {
		_ = m.Enqueue(fmt.Sprintf("b%04d", i), fmt.Sprintf("b%04d", i), 0, 1001, 0)
	}
	fm := keys.VariantMember("f")
	promoted, served := 0, 0
	for call := 1; call <= 2000 && served == 0; call++ {
		for i, s := range m.Dequeue(10, 5000) {
			if s.ID == keys.Segment("f-retry") {
				served = (call-1)*10 + i + 1
			}
			_ = m.Ack(s.ID)
		}
		if promoted == 0 && len(m.delayed[fm]) == 0 {
			promoted = call
		}
	}
	t.Logf("f-retry promoted in call %d, served at serve %d", promoted, served)
	if promoted > 2 {
		t.Fatalf("f's priority-9 run, the first due, promoted only in call %d (served at serve %d)", promoted, served)
	}
}

// TestReviewS35bPropBound: guarantee 5's delayed clause on random states:
// bursts (due at once or 1 ms apart, random offsets), keys that already
// have ready runs, a key limit, runs left in flight or nacked back to
// ready, new delayed keys arriving behind, maxCount < scan drawn per call.
// The late key (one due run, no ready run, among the first
// PromoteLook*scan due) gains a ready run within ceil(D / (scan - scan/4 -
// maxMaxCount)) calls, D the due variants when it fell due.
func TestReviewS35bPropBound(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		scan := rapid.IntRange(2, 8).Draw(rt, "scan")
		keyLimit := rapid.SampledFrom([]int{0, 0, 1, 2}).Draw(rt, "keyLimit")
		m := New(Config{ScanLimit: scan, PromoteLimit: rapid.IntRange(1, 4).Draw(rt, "promoteLimit"),
			Limits: Limits{Key: keyLimit}})
		maxMax := rapid.IntRange(1, scan-scan/4-1).Draw(rt, "maxCount max")
		nb := rapid.IntRange(scan+1, PromoteLook*scan-1).Draw(rt, "bursts")
		spread := rapid.SampledFrom([]int64{0, 1}).Draw(rt, "spread")
		for k := range nb {
			key := fmt.Sprintf("k%02d", k)
			off := int64(rapid.IntRange(0, 5).Draw(rt, "offset"))
			runs := rapid.IntRange(1, 40).Draw(rt, "runs")
			for i := range runs {
				_ = m.Enqueue(fmt.Sprintf("%s-%d", key, i), key, rapid.IntRange(0, 9).Draw(rt, "prio"), 1000+off+int64(i)*spread, 0)
			}
			if rapid.Bool().Draw(rt, "has ready") {
				_ = m.Enqueue(key+"-r", key, 0, 0, 0)
			}
		}
		lateAt := int64(1000 + rapid.IntRange(0, 30).Draw(rt, "late at"))
		_ = m.Enqueue("late", "late", 0, lateAt, 0)
		now := int64(100_000)
		vms, _ := m.dueVariants(now, 1<<30)
		pos := -1
		for i, vm := range vms {
			if vm == keys.VariantMember("late") {
				pos = i
			}
		}
		if pos >= PromoteLook*scan {
			rt.Skip("late key beyond the look window")
		}
		D := len(vms)
		per := scan - scan/4 - maxMax // starving reached per call: scan/4 places are kept for the others
		bound := (D + per - 1) / per
		var held []string
		extra := 0
		for call := 1; call <= bound; call++ {
			for range rapid.IntRange(0, 3).Draw(rt, "arrivals") {
				extra++
				key := fmt.Sprintf("z%03d", extra)
				_ = m.Enqueue(key, key, 0, now, now-1)
			}
			now++
			out := m.Dequeue(rapid.IntRange(1, maxMax).Draw(rt, "maxCount"), now)
			for _, s := range out {
				switch rapid.IntRange(0, 3).Draw(rt, "settle") {
				case 0:
					held = append(held, s.ID)
				case 1:
					_, _ = m.Nack(s.ID, now, now, false)
				default:
					_ = m.Ack(s.ID)
				}
			}
			if len(held) > 0 && rapid.Bool().Draw(rt, "ack held") {
				_ = m.Ack(held[0])
				held = held[1:]
			}
			if len(m.delayed[keys.VariantMember("late")]) == 0 {
				return
			}
		}
		rt.Fatalf("late key (position %d of %d due) not promoted within %d calls (scan %d, maxCount <= %d)", pos, D, bound, scan, maxMax)
	})
}
