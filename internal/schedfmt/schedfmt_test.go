package schedfmt

import "testing"

func TestRegRoundTrip(t *testing.T) {
	for _, v := range []string{
		"000000000000001",
		"000000000000002w",
		"000000000000003g123456",
		"000000000000004|999",
		"000000000000005g42|7",
		"000000000000006w|3",
	} {
		r, ok := ParseReg(v)
		if !ok {
			t.Fatalf("ParseReg(%q) failed", v)
		}
		if got := r.String(); got != v {
			t.Fatalf("ParseReg(%q).String() = %q", v, got)
		}
	}
	for _, v := range []string{"", "12", "000000000000001x", "000000000000001gx", "000000000000001|x"} {
		if _, ok := ParseReg(v); ok {
			t.Fatalf("ParseReg(%q) accepted", v)
		}
	}
}

func TestSeqCode(t *testing.T) {
	if n, ok := ParseSeqCode("000000000000042"); !ok || n != 42 {
		t.Fatalf("got %d %v", n, ok)
	}
	for _, c := range []string{"42", "00000000000004x", "0000000000000042"} {
		if _, ok := ParseSeqCode(c); ok {
			t.Fatalf("ParseSeqCode(%q) accepted", c)
		}
	}
	if code, vm, ok := SplitMember("000000000000042=k"); !ok || code != "000000000000042" || vm != "=k" {
		t.Fatalf("SplitMember: %q %q %v", code, vm, ok)
	}
	if _, _, ok := SplitMember("000000000000042"); ok {
		t.Fatal("SplitMember accepted a bare code")
	}
}
