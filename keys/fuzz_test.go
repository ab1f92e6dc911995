package keys_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/runqueue/runqueue/keys"
)

// name is one string the package builds: a key, a member or a field, with
// what it was built from.
type name struct {
	kind string // key, or the set/hash the member or field lives in
	text string
	of   string // identity: the builder and exactly the inputs it depends on
}

// names lists everything sp builds for one run (env, queue, key, id).
func names(sp keys.Space, env, queue, ck, id string) []name {
	idOf := func(builder string, parts ...string) string {
		// %q of a slice quotes every element, so the identity is itself
		// injective whatever bytes the parts hold.
		return fmt.Sprintf("%s%q", builder, parts)
	}
	e := sp.Env(env)
	sh := sp.Shard(e.Number())
	q := e.Queue(queue)
	v := q.Variant(ck)
	shard := fmt.Sprint(e.Number())
	key := func(builder, text string, parts ...string) name {
		return name{"key", text, idOf(builder, parts...)}
	}
	ref := keys.Ref{Env: env, Queue: queue, Key: ck, ID: id}
	return []name{
		key("Master", sh.Master(), shard),
		key("Leases", sh.Leases(), shard),
		key("TTL", sh.TTL(), shard),
		key("Tokens", sh.Tokens(), shard),
		key("Wake", sh.Wake(), shard),
		key("Fence", sh.Fence(), shard),
		key("EnvInflightCount", e.InflightCount(), env),
		key("EnvDead", e.Dead(), env),
		key("CkIndex", q.CkIndex(), env, queue),
		key("DelayIndex", q.DelayIndex(), env, queue),
		key("Depth", q.Depth(), env, queue),
		key("Held", q.Held(), env, queue),
		key("KeyInflight", q.KeyInflight(), env, queue),
		key("Dead", q.Dead(), env, queue),
		key("CkVtime", q.CkVtime(), env, queue),
		key("CkVtimeState", q.CkVtimeState(), env, queue),
		key("Weights", q.Weights(), env, queue),
		key("Runs", q.Runs(), env, queue),
		key("Ready", v.Ready(), env, queue, ck),
		key("Delayed", v.Delayed(), env, queue, ck),
		// Members and fields: each kind lives in its own sets, so each kind
		// must be injective on its own.
		{"variant member", v.Member(), idOf("VariantMember", ck)},
		{"queue member", q.Member(), idOf("QueueMember", env, queue)},
		{"run member", keys.RunMember(ref), idOf("RunMember", env, queue, ck, id)},
		{"id field", keys.Segment(id), idOf("Segment", id)},
	}
}

// forbidden are the bytes an encoded segment must never hold: the key
// separator, glob wildcards, hash-tag braces and whitespace.
const forbidden = ":*?[]{} \t\n\r\v\f"

// FuzzKeysInjective checks, for two arbitrary runs, that every name the
// package builds is injective (equal names only from equal inputs, and never
// across builders), that encoded segments cannot forge a separator, a
// wildcard or a hash tag, and that every key of an env shares the slot of its
// shard's master key. The seeds run with plain `go test`.
func FuzzKeysInjective(f *testing.F) {
	seeds := [][8]string{
		{"e", "q", "*", "1", "e", "q", "", "1"},             // the peer's wildcard-key bug
		{"a:b", "c", "", "1", "a", "b:c", "", "1"},          // a colon cannot move a boundary
		{"e", "q", "k:1", "x", "e", "q", "k", "1:x"},        // nor between key and id
		{"e", "q:v:x", "", "1", "e", "q", "x", "1"},         // nor forge a variant path
		{"e:q:x", "y", "", "1", "e", "q", "", "1"},          // nor a queue path
		{"{rq:1}", "q", "", "1", "e", "{x}", "}{", "{}"},    // nor a hash tag
		{"%41", "q", "", "1", "A", "q", "", "1"},            // an escape is not its byte
		{"%", "%%", "%2", "%3A", ":", "%", "%25", "%"},      // percent signs
		{"a b", " ", "\t", "\n", "a%20b", "q", "", "1"},     // whitespace
		{"ü", "日本", "émoji🙂", "ß", "u", "q", "", "1"},       // UTF-8
		{"\xff", "\xfe", "\x00", "\x7f", "", "", "", ""},    // invalid UTF-8, controls, empty
		{"e", "q", "", "", "e", "q", "", ""},                // identical runs
		{"e", "q", "=", "1", "e", "q", "%3D", "1"},          // the variant member marker
		{"e", "q", "", "=", "e", "q", "=", ""},              // marker moved between key and id
		{"e", "q", "?", "[", "e", "q", "]", "*"},            // glob characters
		{".", "..", ".", "..", "..", ".", "..", "."},        // dots
		{"e", "q", "", "1", "e", "q", "", "2"},              // ids only differ
		{"x", "q", "k", "1", "y", "q", "k", "1"},            // envs only differ
		{"e", "q", "k|1", "1", "e", "q", "k", "1"},          // the meta field separator
		{"e", "ckIndex", "", "1", "e", "q", "ckIndex", "1"}, // suffix names as user strings
	}
	for _, s := range seeds {
		f.Add(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7])
	}
	// One shard puts every env under the same tag, so only the encoding
	// keeps names apart; 16 shards checks the slot of each env.
	one, err := keys.NewSpace("rq", 1)
	if err != nil {
		f.Fatal(err)
	}
	many, err := keys.NewSpace("rq", 16)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, e1, q1, k1, i1, e2, q2, k2, i2 string) {
		runs := [2][4]string{{e1, q1, k1, i1}, {e2, q2, k2, i2}}
		for _, r := range runs {
			for _, s := range r {
				checkSegment(t, s)
			}
		}
		for _, sp := range []keys.Space{one, many} {
			seen := map[string]string{} // kind + text -> identity
			for _, r := range runs {
				ns := names(sp, r[0], r[1], r[2], r[3])
				checkRun(t, sp, r, ns)
				for _, n := range ns {
					k := n.kind + "\x00" + n.text
					if prev, ok := seen[k]; ok && prev != n.of {
						t.Fatalf("%s %q is built both as %s and as %s", n.kind, n.text, prev, n.of)
					}
					seen[k] = n.of
				}
			}
			checkNoPrefixForgery(t, sp, runs)
		}
	})
}

func checkSegment(t *testing.T, s string) {
	t.Helper()
	enc := keys.Segment(s)
	if strings.ContainsAny(enc, forbidden) {
		t.Fatalf("Segment(%q) = %q holds one of %q", s, enc, forbidden)
	}
	for i := 0; i < len(enc); i++ {
		c := enc[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("._-%", c) >= 0) {
			t.Fatalf("Segment(%q) = %q holds byte %#x outside [A-Za-z0-9._%%-]", s, enc, c)
		}
	}
	back, err := keys.DecodeSegment(enc)
	if err != nil || back != s {
		t.Fatalf("DecodeSegment(Segment(%q)) = %q, %v", s, back, err)
	}
}

// checkRun checks the names of one run: one hash tag each, the env's shard,
// one slot, and members that decode back to their inputs.
func checkRun(t *testing.T, sp keys.Space, r [4]string, ns []name) {
	t.Helper()
	env, queue, ck, id := r[0], r[1], r[2], r[3]
	e := sp.Env(env)
	master := sp.Shard(sp.ShardOf(env)).Master()
	tag := fmt.Sprintf("{%s:%d}", sp.Prefix(), sp.ShardOf(env))
	for _, n := range ns {
		if n.kind != "key" {
			continue
		}
		if !strings.HasPrefix(n.text, tag+":") {
			t.Fatalf("key %q does not start with the env's tag %s", n.text, tag)
		}
		if strings.Count(n.text, "{") != 1 || strings.Count(n.text, "}") != 1 {
			t.Fatalf("key %q holds a brace outside its hash tag", n.text)
		}
		if strings.ContainsAny(n.text, "*?[] \t\n\r\v\f") {
			t.Fatalf("key %q holds a wildcard or whitespace", n.text)
		}
		// The grammar after the tag is fixed per builder: e:ENV:q:QUEUE:v:KEY:
		// suffix. A segment that leaked a ':' would change the count.
		if got, want := strings.Count(n.text[len(tag):], ":"), separators(n.of); got != want {
			t.Fatalf("key %q (%s) has %d separators after its tag, want %d", n.text, n.of, got, want)
		}
		if keys.Slot(n.text) != keys.Slot(master) {
			t.Fatalf("key %q is in slot %d, the shard master %q in %d", n.text, keys.Slot(n.text), master, keys.Slot(master))
		}
		// Every script call declares its slot's fence beside its keys.
		if f := keys.FenceOf(n.text); f != tag+":fence" {
			t.Fatalf("FenceOf(%q) = %q, want %q", n.text, f, tag+":fence")
		}
	}
	if e.Tag() != tag {
		t.Fatalf("Env(%q).Tag() = %q, want %q", env, e.Tag(), tag)
	}

	ref := keys.Ref{Env: env, Queue: queue, Key: ck, ID: id}
	rm := keys.RunMember(ref)
	// dequeue.lua builds run members as ARGV prefix .. variant member .. ':' .. id.
	if want := keys.QueueMember(env, queue) + ":" + keys.VariantMember(ck) + ":" + keys.Segment(id); rm != want {
		t.Fatalf("RunMember(%+v) = %q, want %q", ref, rm, want)
	}
	if back, err := keys.DecodeRunMember(rm); err != nil || back != ref {
		t.Fatalf("DecodeRunMember(%q) = %+v, %v; want %+v", rm, back, err, ref)
	}
	if e2, q2, err := keys.DecodeQueueMember(keys.QueueMember(env, queue)); err != nil || e2 != env || q2 != queue {
		t.Fatalf("DecodeQueueMember(QueueMember(%q, %q)) = %q, %q, %v", env, queue, e2, q2, err)
	}
	if k2, err := keys.DecodeVariantMember(keys.VariantMember(ck)); err != nil || k2 != ck {
		t.Fatalf("DecodeVariantMember(VariantMember(%q)) = %q, %v", ck, k2, err)
	}
}

// separators is how many ':' follow the hash tag in a key of the builder
// named in identity: 1 for shard keys, +2 per env, queue and variant level.
func separators(identity string) int {
	b, _, _ := strings.Cut(identity, "[")
	switch b {
	case "Master", "Leases", "TTL", "Wake", "Tokens", "Fence":
		return 1
	case "EnvInflightCount", "EnvDead":
		return 3
	case "Ready", "Delayed":
		return 7
	}
	return 5
}

// checkNoPrefixForgery checks that a SCAN pattern or prefix for one env
// (or queue) never covers a key of another: the encoded name is always
// followed by a separator no encoded name can hold.
func checkNoPrefixForgery(t *testing.T, sp keys.Space, runs [2][4]string) {
	t.Helper()
	for a := range runs {
		b := 1 - a
		envA, queueA := runs[a][0], runs[a][1]
		envB, queueB := runs[b][0], runs[b][1]
		qa := sp.Env(envA).Queue(queueA)
		envPrefix := strings.TrimSuffix(sp.Env(envA).InflightCount(), "inflightN")
		queuePrefix := strings.TrimSuffix(qa.Runs(), "runs")
		for _, n := range names(sp, envB, queueB, runs[b][2], runs[b][3]) {
			if n.kind != "key" {
				continue
			}
			if envA != envB && strings.HasPrefix(n.text, envPrefix) {
				t.Fatalf("key %q of env %q falls under env %q's prefix %q", n.text, envB, envA, envPrefix)
			}
			if (envA != envB || queueA != queueB) && strings.HasPrefix(n.text, queuePrefix) {
				t.Fatalf("key %q of %q/%q falls under %q/%q's prefix %q", n.text, envB, queueB, envA, queueA, queuePrefix)
			}
		}
	}
}
