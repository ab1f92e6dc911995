package runqueue

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/vtime"
)

// The scheduler's state as the flag-on scripts store it (lua/lib/sched.lua):
// ckVtime holds parked tags (score = tag - 2^52), the newcomer lane (score =
// registration number - 2^51), a sentinel ("" at 0), competing
// registrations (member = seq code + variant member, score = tag) and gated
// ones (score = 2^52 + gating number; the tag is in the hash); the state
// hash holds the scalars and one field per registered variant. This file
// is its one Go reader.
const (
	gatedOffset   = 1 << 52
	waitingOffset = 1 << 51
	seqCodeLen    = 15
)

// parseSeqCode reads a seq code: a registration number (below 10^15) in
// decimal, zero-padded to seqCodeLen, so that its byte order is its order.
func parseSeqCode(code string) (int64, bool) {
	if len(code) != seqCodeLen {
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

// regValue parses a registered variant's state-hash value: code, then "g"
// and its tag when gated or "w" when in the newcomer lane, then "|r" when
// the remainder is not 0.
func regValue(v string) (code string, gated, waiting bool, tag, r int64, ok bool) {
	if len(v) < seqCodeLen {
		return "", false, false, 0, 0, false
	}
	code, rest := v[:seqCodeLen], v[seqCodeLen:]
	rest, rs, hasR := strings.Cut(rest, "|")
	switch {
	case strings.HasPrefix(rest, "g"):
		n, err := strconv.ParseInt(rest[1:], 10, 64)
		if err != nil {
			return "", false, false, 0, 0, false
		}
		gated, tag = true, n
	case rest == "w":
		waiting = true
	case rest != "":
		return "", false, false, 0, 0, false
	}
	if hasR {
		n, err := strconv.ParseInt(rs, 10, 64)
		if err != nil {
			return "", false, false, 0, 0, false
		}
		r = n
	}
	return code, gated, waiting, tag, r, true
}

// schedState is a queue's scheduler state and indexes read from Redis.
type schedState struct {
	snap      vtime.Snapshot // scheduler state (no runs, no in-flight counts)
	exists    bool           // the state hash exists
	index     []zentry       // ckIndex in order
	delayIdx  []string
	weightsF  map[string]float64 // variant member -> weight as set
	activeIdx map[string]int     // rank of a registered, non-gated variant
}

type zentry struct {
	member string
	score  float64
}

func rank(z []zentry) map[string]int {
	out := make(map[string]int, len(z))
	for i, e := range z {
		out[e.member] = i
	}
	return out
}

// members returns every variant member the state or the indexes mention.
func (s *schedState) members() []string {
	seen := map[string]bool{}
	add := func(m string) { seen[m] = true }
	for m := range s.snap.Reg {
		add(m)
	}
	for m := range s.snap.Idle {
		add(m)
	}
	for m := range s.weightsF {
		add(m)
	}
	for _, e := range s.index {
		add(e.member)
	}
	for _, m := range s.delayIdx {
		add(m)
	}
	out := make([]string, 0, len(seen))
	for m := range seen {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// readScheduler reads the scheduler state of qk, at most MaxInspectVariants
// variants of each structure (ErrTooLarge beyond).
func (q *Queue) readScheduler(ctx context.Context, qk keys.Queue) (*schedState, error) {
	var tags, index *redis.ZSliceCmd
	var delay *redis.StringSliceCmd
	var state, weights *redis.MapStringStringCmd
	limit := int64(MaxInspectVariants)
	_, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		// Sentinel, parked, active and gated entries: up to limit of each.
		tags = p.ZRangeWithScores(ctx, qk.CkVtime(), 0, 3*limit+1)
		index = p.ZRangeWithScores(ctx, qk.CkIndex(), 0, limit)
		delay = p.ZRange(ctx, qk.DelayIndex(), 0, limit)
		state = p.HGetAll(ctx, qk.CkVtimeState())
		weights = p.HGetAll(ctx, qk.Weights())
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	if int64(len(tags.Val())) > 3*limit+1 || int64(len(index.Val())) > limit || int64(len(delay.Val())) > limit {
		return nil, ErrTooLarge
	}
	st := &schedState{
		snap: vtime.Snapshot{Reg: map[string]vtime.Reg{}, Idle: map[string]int64{}, Weights: map[string]int64{},
			InFlight: map[string]int{}},
		delayIdx: delay.Val(), weightsF: map[string]float64{}, activeIdx: map[string]int{},
	}
	for _, e := range index.Val() {
		st.index = append(st.index, zentry{e.Member.(string), e.Score})
	}
	for m, w := range weights.Val() {
		if f, err := strconv.ParseFloat(w, 64); err == nil {
			st.weightsF[m] = f
			st.snap.Weights[m] = vtime.MilliWeightOf(f)
		}
	}
	h := state.Val()
	// The state is both keys: a hash without ckVtime's sentinel, or a
	// ckVtime without the hash, is no state (the next dequeue starts it
	// again: lua/lib/sched.lua, sched_state).
	z := tags.Val()
	sentinel := false
	for _, e := range z {
		if e.Member == "" && e.Score == 0 {
			sentinel = true
			break
		}
	}
	if st.exists = h["v"] != "" && sentinel; !st.exists {
		st.snap.NextSeq = 1
		return st, nil
	}
	num := func(field string) int64 {
		n, _ := strconv.ParseFloat(h[field], 64)
		return int64(n)
	}
	st.snap.V, st.snap.Epoch, st.snap.Cursor = num("v"), num("e"), int(num("c"))
	st.snap.NextSeq, st.snap.GK, st.snap.GN, st.snap.GP = max(1, num("s")), int(num("gk")), max(1, num("gn")), num("gp")
	for field, v := range h {
		if !strings.HasPrefix(field, "=") {
			continue
		}
		code, gated, waiting, tag, r, ok := regValue(v)
		seq, ok2 := parseSeqCode(code)
		if !ok || !ok2 {
			return nil, fmt.Errorf("runqueue: malformed %s field %q: %q", qk.CkVtimeState(), field, v)
		}
		st.snap.Reg[field] = vtime.Reg{U: tag, R: r, Seq: seq, Gated: gated, Waiting: waiting}
	}
	active := 0
	for _, z := range tags.Val() {
		member := z.Member.(string)
		switch s := z.Score; {
		case s < -waitingOffset:
			st.snap.Idle[member] = int64(s) + gatedOffset
		case s < 0:
			// the newcomer lane: its members carry the "w" flag
		case len(member) > seqCodeLen:
			vm := member[seqCodeLen:]
			rg, ok := st.snap.Reg[vm]
			if !ok {
				continue // a tag without its registration: not ours to show
			}
			if s >= gatedOffset {
				rg.Gate = int64(s) - gatedOffset // its tag is in the hash
			} else {
				rg.U = int64(s)
				st.activeIdx[vm] = active
				active++
			}
			st.snap.Reg[vm] = rg
		}
	}
	return st, nil
}

// clockQuanta converts a stored time (units) of a state at epoch e to
// quanta of Config.Quantum.
func (q *Queue) clockQuanta(epoch, units int64) float64 {
	return (float64(epoch)*vtime.RebaseBy + float64(units)) / vtime.Unit * q.cfg.Quantum
}

// Score bounds of the competing region of ckVtime (see the constants above
// and lib/sched.lua): tags are below 2^50.
const (
	activeMin  = "0"
	activeMax  = "(1125899906842624" // 2^50
	maxTopLags = MaxInspectVariants
)

// KeyLag is one concurrency key's lag as the fair scheduler sees it.
type KeyLag struct {
	Key string
	// Lag is the key's tag minus the queue's clock V, in quanta, as
	// Schedule reports it: positive when the key was served ahead of the
	// others and waits.
	Lag float64
}

// TopLags returns the k competing concurrency keys of a base queue with
// the largest lag, largest first, for metrics that must not grow with the
// number of keys. It reads the clock and the k highest tags of the
// competing keys: one round trip of two commands, O(log n + k) on Redis
// whatever the queue's size. Gated keys (at their per-key limit, out of
// the competition) and keys queued in the newcomer lane (no tag yet) are
// not among them. Empty with the flag off or when the queue has no
// scheduler state.
func (q *Queue) TopLags(ctx context.Context, env, queue string, k int) ([]KeyLag, error) {
	if err := checkQueue(env, queue); err != nil {
		return nil, err
	}
	if k < 1 || k > maxTopLags {
		return nil, invalid("k", "%d is outside 1..%d", k, maxTopLags)
	}
	qk := q.space.Env(env).Queue(queue)
	var clock *redis.SliceCmd
	var active *redis.ZSliceCmd
	_, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		clock = p.HMGet(ctx, qk.CkVtimeState(), "v", "e")
		active = p.ZRevRangeByScoreWithScores(ctx, qk.CkVtime(), &redis.ZRangeBy{Min: activeMin, Max: activeMax, Count: int64(k)})
		return nil
	})
	if err != nil {
		return nil, err
	}
	num := func(v any) int64 {
		s, _ := v.(string)
		n, _ := strconv.ParseFloat(s, 64)
		return int64(n)
	}
	cv := clock.Val()
	if cv[0] == nil {
		return nil, nil // no state: nothing registered
	}
	epoch := num(cv[1])
	v := q.clockQuanta(epoch, num(cv[0]))
	out := make([]KeyLag, 0, k)
	for _, z := range active.Val() {
		m, _ := z.Member.(string)
		if len(m) <= seqCodeLen {
			continue
		}
		key, err := keys.DecodeVariantMember(m[seqCodeLen:])
		if err != nil {
			continue // not a member the scripts wrote: not ours to show
		}
		tag := q.clockQuanta(epoch, int64(z.Score))
		out = append(out, KeyLag{Key: key, Lag: tag - v})
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Lag != out[j].Lag {
			return out[i].Lag > out[j].Lag
		}
		return out[i].Key < out[j].Key
	})
	return out[:min(len(out), k)], nil
}
