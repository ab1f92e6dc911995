package keys_test

import (
	"hash/fnv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/keys"
)

func TestSegment(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name, in, want string
	}{
		{"Empty", "", ""},
		{"Plain", "abc-XYZ_0.9", "abc-XYZ_0.9"},
		{"Dots", "..", ".."},
		{"Colon", "a:b", "a%3Ab"},
		{"Star", "*", "%2A"},
		{"Braces", "{x}", "%7Bx%7D"},
		{"Percent", "%41", "%2541"},
		{"Space", "a b", "a%20b"},
		{"Glob", "?[]", "%3F%5B%5D"},
		{"Equals", "=", "%3D"},
		{"Pipe", "a|b", "a%7Cb"},
		{"UTF8", "é", "%C3%A9"},
		{"ControlBytes", "\x00\n\x7f", "%00%0A%7F"},
		{"InvalidUTF8", "\xff", "%FF"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := keys.Segment(tt.in)
			require.Equal(t, tt.want, got)
			back, err := keys.DecodeSegment(got)
			require.NoError(t, err)
			require.Equal(t, tt.in, back)
		})
	}
}

func TestDecodeSegmentRejectsMalformed(t *testing.T) {
	t.Parallel()

	// Each of these is a string Segment never produces; accepting any of
	// them would give one user string two encodings, so two keys.
	tests := []struct{ name, in string }{
		{"LonePercent", "%"},
		{"OneHexDigit", "%4"},
		{"TrailingOneHexDigit", "ab%4"},
		{"NonHex", "%4G"},
		{"LowerCaseHex", "%3a"},
		{"EscapedPlainLetter", "%41"},
		{"EscapedPlainDigit", "%30"},
		{"EscapedDot", "%2E"},
		{"RawColon", "a:b"},
		{"RawStar", "*"},
		{"RawBrace", "{"},
		{"RawSpace", "a b"},
		{"RawEquals", "="},
		{"RawUTF8", "é"},
		{"RawControl", "a\x00"},
		{"RawHighByteAfterEscape", "%3A\xff"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := keys.DecodeSegment(tt.in)
			require.ErrorIs(t, err, keys.ErrBadSegment)
		})
	}
}

func TestVariantMember(t *testing.T) {
	t.Parallel()

	tests := []struct{ name, ck, want string }{
		{"NoKey", "", "="},
		{"Plain", "user-1", "=user-1"},
		{"Star", "*", "=%2A"},
		{"EqualsSign", "=", "=%3D"},
		{"Colon", "a:b", "=a%3Ab"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := keys.VariantMember(tt.ck)
			require.Equal(t, tt.want, m)
			back, err := keys.DecodeVariantMember(m)
			require.NoError(t, err)
			require.Equal(t, tt.ck, back)
		})
	}

	for _, bad := range []string{"", "x", "*", "==", "=a:b", "=%2a", "%3D"} {
		_, err := keys.DecodeVariantMember(bad)
		require.ErrorIs(t, err, keys.ErrBadSegment, "member %q", bad)
	}
}

func TestQueueMember(t *testing.T) {
	t.Parallel()

	tests := []struct{ name, env, queue, want string }{
		{"Plain", "prod", "emails", "prod:emails"},
		{"ColonsCannotShift", "a:b", "c", "a%3Ab:c"},
		{"ColonsCannotShiftOtherWay", "a", "b:c", "a:b%3Ac"},
		{"Empty", "", "", ":"},
		{"Wildcards", "*", "{q}", "%2A:%7Bq%7D"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := keys.QueueMember(tt.env, tt.queue)
			require.Equal(t, tt.want, m)
			env, queue, err := keys.DecodeQueueMember(m)
			require.NoError(t, err)
			require.Equal(t, tt.env, env)
			require.Equal(t, tt.queue, queue)
		})
	}

	for _, bad := range []string{"", "a", "a:b:c", "a:b%3a", "a%:b", "a b:c", "=a:b"} {
		_, _, err := keys.DecodeQueueMember(bad)
		require.ErrorIs(t, err, keys.ErrBadSegment, "member %q", bad)
	}
}

func TestRunMember(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		ref  keys.Ref
		want string
	}{
		{"Plain", keys.Ref{Env: "prod", Queue: "q", Key: "k", ID: "1"}, "prod:q:=k:1"},
		{"NoKey", keys.Ref{Env: "prod", Queue: "q", ID: "1"}, "prod:q:=:1"},
		{"StarKey", keys.Ref{Env: "e", Queue: "q", Key: "*", ID: "*"}, "e:q:=%2A:%2A"},
		{"Colons", keys.Ref{Env: "a:b", Queue: ":", Key: "=:", ID: "x:y"}, "a%3Ab:%3A:=%3D%3A:x%3Ay"},
		{"UTF8", keys.Ref{Env: "ü", Queue: "q", Key: "k", ID: "日本"}, "%C3%BC:q:=k:%E6%97%A5%E6%9C%AC"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := keys.RunMember(tt.ref)
			require.Equal(t, tt.want, m)
			back, err := keys.DecodeRunMember(m)
			require.NoError(t, err)
			require.Equal(t, tt.ref, back)
		})
	}

	for _, bad := range []string{
		"", "e:q:=k", "e:q:=k:1:2", "e:q:k:1", "e:q:=k:a b", "e%3a:q:=:1", "e:q%:=:1", "e:q:=%2:1",
	} {
		_, err := keys.DecodeRunMember(bad)
		require.ErrorIs(t, err, keys.ErrBadSegment, "member %q", bad)
	}
}

func TestNewSpace(t *testing.T) {
	t.Parallel()

	good := []struct {
		prefix string
		shards int
	}{{"rq", 1}, {"a.b-c_D9", 16}, {strings.Repeat("p", 64), 16384}}
	for _, g := range good {
		s, err := keys.NewSpace(g.prefix, g.shards)
		require.NoError(t, err)
		require.Equal(t, g.prefix, s.Prefix())
		require.Equal(t, g.shards, s.Shards())
	}

	bad := []struct {
		name   string
		prefix string
		shards int
	}{
		{"EmptyPrefix", "", 16},
		{"LongPrefix", strings.Repeat("p", 65), 16},
		{"BracePrefix", "a{b", 16},
		{"ClosingBracePrefix", "a}b", 16},
		{"ColonPrefix", "a:b", 16},
		{"StarPrefix", "a*", 16},
		{"SpacePrefix", "a b", 16},
		{"ZeroShards", "rq", 0},
		{"NegativeShards", "rq", -1},
		{"TooManyShards", "rq", 16385},
	}
	for _, b := range bad {
		_, err := keys.NewSpace(b.prefix, b.shards)
		require.Error(t, err, b.name)
	}
}

func TestShardOf(t *testing.T) {
	t.Parallel()

	s, err := keys.NewSpace("rq", 16)
	require.NoError(t, err)
	counts := make([]int, 16)
	for i := range 1600 {
		env := "env-" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + strings.Repeat("y", i/26)
		n := s.ShardOf(env)
		require.GreaterOrEqual(t, n, 0)
		require.Less(t, n, 16)
		require.Equal(t, n, s.ShardOf(env), "shard of %q must be stable", env)
		require.Equal(t, n, s.Env(env).Number())
		require.Equal(t, "{rq:"+itoa(n)+"}", s.Env(env).Tag())
		counts[n]++
	}
	// fnv1a spreads envs; an empty shard would mean the hash ignores input.
	for n, c := range counts {
		require.Positive(t, c, "shard %d got no env", n)
	}
}

// TestShardOfIsFNV1a: the shard of an env is hash/fnv's 32-bit FNV-1a of
// its name modulo the shard count, as it has been since the first layout:
// an instance that named another shard would not find the env's runs.
func TestShardOfIsFNV1a(t *testing.T) {
	t.Parallel()
	for _, shards := range []int{1, 7, 16, 16384} {
		s, err := keys.NewSpace("rq", shards)
		require.NoError(t, err)
		for _, env := range []string{"", "a", "env-1", "prod", "ÿ\x00\xff", strings.Repeat("long-env-", 40)} {
			h := fnv.New32a()
			_, _ = h.Write([]byte(env))
			require.Equal(t, int(h.Sum32()%uint32(shards)), s.ShardOf(env), "env %q, %d shards", env, shards)
		}
	}
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}

func TestSlot(t *testing.T) {
	t.Parallel()

	// Reference values from the Redis Cluster specification and
	// CLUSTER KEYSLOT on Redis 7.
	tests := []struct {
		name string
		key  string
		want int
	}{
		{"Plain", "foo", 12182},
		{"SomeKey", "somekey", 11058},
		{"HashTag", "foo{hash_tag}", 2515},
		{"HashTagSameSlot", "{hash_tag}bar", 2515},
		{"EmptyTagHashesWholeKey", "foo{}{bar}", refSlot("foo{}{bar}")},
		{"FirstTagOnly", "foo{bar}{zap}", refSlot("bar")},
		{"NestedOpen", "foo{{bar}}zap", refSlot("{bar")},
		{"UnclosedTag", "foo{bar", refSlot("foo{bar")},
		{"ClosingBeforeOpening", "}foo{bar}", refSlot("bar")},
		{"CheckValue", "123456789", 0x31C3 % 16384},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, keys.Slot(tt.key))
		})
	}
	require.Equal(t, 0x31C3%16384, refSlot("123456789"), "the reference CRC itself")
	require.Equal(t, 12182, refSlot("foo"))
	// "{}" is not a tag, so the whole key is hashed: its slot differs from
	// that of the part after the braces.
	require.NotEqual(t, keys.Slot("bar"), keys.Slot("foo{}{bar}"))
	require.Equal(t, keys.Slot("bar"), keys.Slot("{bar}"))
}

// refSlot is an independent, table-driven CRC16-CCITT (XMODEM) of the whole
// key, so the hash-tag rules above are checked against something other than
// the code under test.
func refSlot(key string) int {
	var table [256]uint16
	for i := range table {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		table[i] = crc
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc = crc<<8 ^ table[byte(crc>>8)^key[i]]
	}
	return int(crc % 16384)
}

func TestKeyNames(t *testing.T) {
	t.Parallel()

	s, err := keys.NewSpace("rq", 16)
	require.NoError(t, err)
	e := s.Env("prod")
	tag := e.Tag()
	q := e.Queue("emails")
	v := q.Variant("user:1")
	// Spelled out once so that a change of layout is a visible diff: keys
	// already written by a deployed version must keep their names.
	want := map[string]string{
		s.Shard(e.Number()).Master(): tag + ":master",
		e.Leases():                   tag + ":leases",
		e.TTL():                      tag + ":ttl",
		e.Wake():                     tag + ":wake",
		e.Fence():                    tag + ":fence",
		e.InflightCount():            tag + ":e:prod:inflightN",
		e.Dead():                     tag + ":e:prod:dead",
		e.Waiting():                  tag + ":e:prod:waiting",
		e.WaitingUntil():             tag + ":e:prod:waitingU",
		q.CkIndex():                  tag + ":e:prod:q:emails:ckIndex",
		q.DelayIndex():               tag + ":e:prod:q:emails:delayIndex",
		q.Depth():                    tag + ":e:prod:q:emails:depth",
		q.Held():                     tag + ":e:prod:q:emails:held",
		q.KeyInflight():              tag + ":e:prod:q:emails:kin",
		q.Dead():                     tag + ":e:prod:q:emails:dead",
		q.Runs():                     tag + ":e:prod:q:emails:runs",
		q.CkVtime():                  tag + ":e:prod:q:emails:ckVtime",
		q.CkVtimeState():             tag + ":e:prod:q:emails:ckVtimeState",
		e.Tokens():                   tag + ":tokens",
		s.Layout():                   "{rq:0}:layout",
		q.Weights():                  tag + ":e:prod:q:emails:weights",
		v.Ready():                    tag + ":e:prod:q:emails:v:user%3A1:ready",
		v.Delayed():                  tag + ":e:prod:q:emails:v:user%3A1:delayed",
		q.VariantBase() + "user%3A1": tag + ":e:prod:q:emails:v:user%3A1",
	}
	for got, w := range want {
		require.Equal(t, w, got)
	}
	require.Len(t, want, 24, "two accessors returned the same key")
	require.Equal(t, "=user%3A1", v.Member())
	require.Equal(t, "prod:emails", q.Member())
	require.Equal(t, "prod:emails:", q.RunPrefix())
	require.Equal(t, e.Fence(), keys.FenceOf(q.Runs()))
	require.Empty(t, keys.FenceOf("no-tag"), "a name without a hash tag has no fence")
	require.Empty(t, keys.FenceOf("{}:x"), "nor one with an empty tag")
	require.Equal(t, "prod", e.Name())
	require.Equal(t, "emails", q.Name())
}
