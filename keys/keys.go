// Package keys is the only place where runqueue builds Redis key names.
//
// Every key of one env lives in one Redis Cluster hash slot: keys start with the
// hash tag "{<prefix>:<shard>}" where shard = fnv1a32(env) mod shards. User
// strings (env, queue, concurrency key, message id) are encoded injectively
// with Segment, which escapes every byte outside [A-Za-z0-9._-] as %XX. An
// encoded segment therefore never contains ':', '*', '?', '[', ']', '{', '}' or
// whitespace, so no user string can forge a separator, a wildcard or a hash
// tag, and distinct tuples always give distinct keys.
package keys

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Segment encodes s injectively: bytes in [A-Za-z0-9._-] stay, every other
// byte (including '%') becomes %XX with upper-case hex digits.
func Segment(s string) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if !plain(s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 2*n)
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if plain(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

// ErrBadSegment reports a string that Segment cannot have produced.
var ErrBadSegment = errors.New("keys: malformed encoded segment")

// DecodeSegment inverts Segment. It rejects anything Segment never produces
// (lower-case hex, an escaped plain byte, a raw special byte), so decoding
// is exact and Segment(DecodeSegment(x)) == x for every accepted x.
func DecodeSegment(enc string) (string, error) {
	if !strings.Contains(enc, "%") {
		for i := 0; i < len(enc); i++ {
			if !plain(enc[i]) {
				return "", ErrBadSegment
			}
		}
		return enc, nil
	}
	b := make([]byte, 0, len(enc))
	for i := 0; i < len(enc); i++ {
		c := enc[i]
		if c != '%' {
			if !plain(c) {
				return "", ErrBadSegment
			}
			b = append(b, c)
			continue
		}
		if i+2 >= len(enc) {
			return "", ErrBadSegment
		}
		hi, ok1 := unhex(enc[i+1])
		lo, ok2 := unhex(enc[i+2])
		if !ok1 || !ok2 {
			return "", ErrBadSegment
		}
		v := hi<<4 | lo
		if plain(v) {
			return "", ErrBadSegment
		}
		b = append(b, v)
		i += 2
	}
	return string(b), nil
}

func plain(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// Space builds the keys of one deployment: a prefix and a shard count.
type Space struct {
	prefix string
	shards int
}

// NewSpace validates the prefix (non-empty, [a-zA-Z0-9_.-] only, at most 64
// bytes) and the shard count (1..16384).
func NewSpace(prefix string, shards int) (Space, error) {
	if prefix == "" || len(prefix) > 64 || Segment(prefix) != prefix {
		return Space{}, fmt.Errorf("keys: prefix %q must be 1-64 bytes of [A-Za-z0-9._-]", prefix)
	}
	if shards < 1 || shards > 16384 {
		return Space{}, fmt.Errorf("keys: shards %d must be in 1..16384", shards)
	}
	return Space{prefix: prefix, shards: shards}, nil
}

// Prefix returns the key prefix.
func (s Space) Prefix() string { return s.prefix }

// Shards returns the shard count.
func (s Space) Shards() int { return s.shards }

// ShardOf returns the shard of env.
func (s Space) ShardOf(env string) int {
	return int(fnv32a(env) % uint32(s.shards))
}

// fnv32a is the 32-bit FNV-1a hash of s (hash/fnv's New32a, without its
// allocations: every call names an env's shard).
func fnv32a(s string) uint32 {
	const offset, prime = 2166136261, 16777619
	h := uint32(offset)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= prime
	}
	return h
}

// Layout is the STRING holding the layout version of everything under the
// prefix (in shard 0's slot).
func (s Space) Layout() string { return s.Shard(0).Tag() + ":layout" }

// Shard is the key space of one shard: one hash slot.
type Shard struct {
	tag string // "{prefix:N}"
	n   int
}

// Shard returns the keys of shard n.
func (s Space) Shard(n int) Shard {
	return Shard{tag: "{" + s.prefix + ":" + strconv.Itoa(n) + "}", n: n}
}

// Number is the shard number.
func (sh Shard) Number() int { return sh.n }

// Tag is the hash tag all keys of the shard start with.
func (sh Shard) Tag() string { return sh.tag }

// Master is the shard's ZSET of base queues with work, member QueueMember,
// score the earliest time (ms) the queue has work to serve.
func (sh Shard) Master() string { return sh.tag + ":master" }

// Leases is the shard's ZSET of in-flight runs, member RunMember, score the
// lease deadline in ms.
func (sh Shard) Leases() string { return sh.tag + ":leases" }

// TTL is the shard's ZSET of queued runs with a TTL, member RunMember, score
// the expiry deadline in ms.
func (sh Shard) TTL() string { return sh.tag + ":ttl" }

// Tokens is the shard's STRING counter of delivery tokens: every delivery
// takes the next value, so a lease token never repeats in the shard.
func (sh Shard) Tokens() string { return sh.tag + ":tokens" }

// Fence is a key of the shard's slot that no one ever writes. Every script
// call declares it beside its own keys: while the slot moves between the
// masters of a Redis Cluster (MIGRATING on one, IMPORTING on the other),
// a call that declares a key the node does not hold is refused whole, with
// TRYAGAIN or an ASK redirection that ends in TRYAGAIN, before the script
// runs. Without it a script could run on the source, all of its declared
// keys there, and fail halfway on a key it builds itself that has already
// moved or does not exist yet ("Script attempted to access a non local
// key"), after its first writes.
func (sh Shard) Fence() string { return sh.tag + ":fence" }

// FenceOf is the [Shard.Fence] of the shard key belongs to, or "" when key
// does not start with a hash tag (every name this package builds does).
func FenceOf(key string) string {
	if strings.HasPrefix(key, "{") {
		if i := strings.IndexByte(key, '}'); i > 1 {
			return key[:i+1] + ":fence"
		}
	}
	return ""
}

// Wake is the pub/sub channel an enqueue publishes to (a channel, not a key).
func (sh Shard) Wake() string { return sh.tag + ":wake" }

// Env returns the keys of env (which must belong to this shard).
func (s Space) Env(env string) Env {
	sh := s.Shard(s.ShardOf(env))
	return Env{Shard: sh, env: env, base: sh.tag + ":e:" + Segment(env)}
}

// Env is the key space of one env.
type Env struct {
	Shard
	env  string
	base string
}

// Name is the env's name.
func (e Env) Name() string { return e.env }

// InflightCount is the env's STRING counter of runs in flight across its
// queues (its concurrency); deleted at 0.
func (e Env) InflightCount() string { return e.base + ":inflightN" }

// Dead is the env's HASH queue member -> number of dead-lettered runs.
func (e Env) Dead() string { return e.base + ":dead" }

// Waiting is the env's ZSET of the queues waiting for a slot of its
// concurrency (layout 8): queue member, score its place in the line;
// written by flag-on dequeues only (lua/lib/envwait.lua).
func (e Env) Waiting() string { return e.base + ":waiting" }

// WaitingUntil is the HASH beside Waiting: queue member -> its mark,
// "till:limit" (layout 9): the time it lives until (ms, Redis's clock) and
// the env limit of the call that wrote it; "#", the last place given; and
// "^", the highest limit a mark was written with.
func (e Env) WaitingUntil() string { return e.base + ":waitingU" }

// Queue returns the keys of a base queue of the env.
func (e Env) Queue(queue string) Queue {
	return Queue{Env: e, queue: queue, base: e.base + ":q:" + Segment(queue)}
}

// Queue is the key space of one base queue.
type Queue struct {
	Env
	queue string
	base  string
}

// Name is the queue's name.
func (q Queue) Name() string { return q.queue }

// Member is the queue's member in the shard master ZSET.
func (q Queue) Member() string { return QueueMember(q.env, q.queue) }

// RunPrefix is what every run member of the queue starts with (RunPrefix).
func (q Queue) RunPrefix() string { return RunPrefix(q.env, q.queue) }

// CkIndex is the ZSET variant -> head ready score (ms, timestamp domain) of
// the variants that have ready runs.
func (q Queue) CkIndex() string { return q.base + ":ckIndex" }

// DelayIndex is the ZSET variant -> earliest available_at (ms) of the
// variants that have delayed runs.
func (q Queue) DelayIndex() string { return q.base + ":delayIndex" }

// Depth is the HASH of queued-run counters: "r" ready, "d" delayed. It is
// deleted when both reach zero, so an empty queue leaves no key.
func (q Queue) Depth() string { return q.base + ":depth" }

// Held is the queue's HASH of runs in flight: field "<variant member>:<encoded
// id>" (HeldField), value the delivery token of the holder. Its length is
// the queue's in-flight count.
func (q Queue) Held() string { return q.base + ":held" }

// KeyInflight is the queue's HASH variant member -> runs in flight; a field
// goes at 0.
func (q Queue) KeyInflight() string { return q.base + ":kin" }

// Dead is the queue's dead-letter ZSET, member RunMember, score the time of
// death in ms.
func (q Queue) Dead() string { return q.base + ":dead" }

// CkVtime is the scheduler's ZSET (flag on only): registered variants by
// tag, gated ones after them, parked tags before them.
func (q Queue) CkVtime() string { return q.base + ":ckVtime" }

// CkVtimeState is the HASH of the scheduler's state (flag on only): its
// clock, anchor, cursor and registration counter, and one field per
// registered variant. It lives and expires with CkVtime.
func (q Queue) CkVtimeState() string { return q.base + ":ckVtimeState" }

// Weights is the HASH variant -> weight override (flag on only).
func (q Queue) Weights() string { return q.base + ":weights" }

// Runs is the HASH of the queue's runs: field encoded id -> record
// (attempt, priority, available_at, expiry, last settled token, variant
// member, then the payload's bytes; see runqueue's record.go).
func (q Queue) Runs() string { return q.base + ":runs" }

// Variant returns the keys of the variant of concurrency key ck ("" for runs
// without a key).
func (q Queue) Variant(ck string) Variant {
	return Variant{base: q.VariantBase() + Segment(ck), member: VariantMember(ck)}
}

// VariantBase is what every variant key of the queue starts with. The
// dequeue scripts derive a variant's keys from its member: VariantBase +
// the member without its "=" + ":ready" (":delayed", ":inflight"), which
// is what Variant builds.
func (q Queue) VariantBase() string { return q.base + ":v:" }

// Variant is the key space of one (env, queue, concurrency key).
type Variant struct {
	base   string
	member string
}

// Member is the variant's member in ckIndex, ckVtime, ckVtimeIdle, DelayIndex.
func (v Variant) Member() string { return v.member }

// Ready is the ZSET of ready message ids, score the ready score (ms).
func (v Variant) Ready() string { return v.base + ":ready" }

// Delayed is the ZSET of delayed message ids, score available_at (ms).
func (v Variant) Delayed() string { return v.base + ":delayed" }

// VariantMember is the member naming concurrency key ck in the per-queue
// sorted sets: "=" followed by the encoded key, so "" (no key) is "=".
func VariantMember(ck string) string { return "=" + Segment(ck) }

// DecodeVariantMember inverts VariantMember.
func DecodeVariantMember(m string) (string, error) {
	if !strings.HasPrefix(m, "=") {
		return "", ErrBadSegment
	}
	return DecodeSegment(m[1:])
}

// QueueMember names (env, queue) in the shard master ZSET.
func QueueMember(env, queue string) string { return Segment(env) + ":" + Segment(queue) }

// DecodeQueueMember inverts QueueMember.
func DecodeQueueMember(m string) (env, queue string, err error) {
	parts := strings.Split(m, ":")
	if len(parts) != 2 {
		return "", "", ErrBadSegment
	}
	if env, err = DecodeSegment(parts[0]); err != nil {
		return "", "", err
	}
	if queue, err = DecodeSegment(parts[1]); err != nil {
		return "", "", err
	}
	return env, queue, nil
}

// Ref identifies one run.
type Ref struct {
	Env, Queue, Key, ID string
}

// RunMember names a run in shard-level sets (leases, ttl) and the queue's
// dead set: env:queue:=key:id, each segment encoded.
func RunMember(r Ref) string { return RunPrefix(r.Env, r.Queue) + HeldField(r.Key, r.ID) }

// HeldField names a run in its queue's held hash: =key:id, each segment
// encoded (RunMember without the env and queue).
func HeldField(key, id string) string { return VariantMember(key) + ":" + Segment(id) }

// RunPrefix is what every run member of a queue starts with: env:queue:.
func RunPrefix(env, queue string) string { return Segment(env) + ":" + Segment(queue) + ":" }

// DecodeRunMember inverts RunMember.
func DecodeRunMember(m string) (Ref, error) {
	parts := strings.Split(m, ":")
	if len(parts) != 4 {
		return Ref{}, ErrBadSegment
	}
	var r Ref
	var err error
	if r.Env, err = DecodeSegment(parts[0]); err != nil {
		return Ref{}, err
	}
	if r.Queue, err = DecodeSegment(parts[1]); err != nil {
		return Ref{}, err
	}
	if r.Key, err = DecodeVariantMember(parts[2]); err != nil {
		return Ref{}, err
	}
	if r.ID, err = DecodeSegment(parts[3]); err != nil {
		return Ref{}, err
	}
	return r, nil
}
