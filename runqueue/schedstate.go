package runqueue

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/internal/schedfmt"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/vtime"
)

// The scheduler's state as the flag-on scripts store it (lua/lib/sched_reg.lua):
// ckVtime holds parked tags (score = tag - 2^52), the newcomer lane (score =
// registration number - 2^51), a sentinel ("" at 0), competing
// registrations (member = seq code + variant member, score = tag), the wide
// mark (at 2^51, once ckVtime held 64 entries) and gated ones (score = 2^52 +
// gating number; the tag is in the hash); the state hash holds the scalars,
// one field per registered variant and the wide mark's field. This file
// is its one Go reader; internal/schedfmt parses its values.

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
		// Sentinel, wide mark, parked, active and gated entries: up to
		// limit of each of the last three.
		tags = p.ZRangeWithScores(ctx, qk.CkVtime(), 0, 3*limit+2)
		index = p.ZRangeWithScores(ctx, qk.CkIndex(), 0, limit)
		delay = p.ZRange(ctx, qk.DelayIndex(), 0, limit)
		state = p.HGetAll(ctx, qk.CkVtimeState())
		weights = p.HGetAll(ctx, qk.Weights())
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	if int64(len(tags.Val())) > 3*limit+2 || int64(len(index.Val())) > limit || int64(len(delay.Val())) > limit {
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
		if f, err := schedfmt.Weight(w); err == nil {
			st.weightsF[m] = f
			st.snap.Weights[m] = vtime.MilliWeightOf(f)
		}
	}
	h := state.Val()
	// The state is both keys: a hash without ckVtime's sentinel, or a
	// ckVtime without the hash, is no state (the next dequeue starts it
	// again: lua/lib/sched_reg.lua, sched_state).
	z := tags.Val()
	sentinel := false
	for _, e := range z {
		if e.Member == schedfmt.SentinelMember && e.Score == 0 {
			sentinel = true
			break
		}
	}
	if st.exists = h["v"] != "" && sentinel; !st.exists {
		st.snap.NextSeq = 1
		return st, nil
	}
	num := func(field string) int64 { return schedfmt.Num(h[field]) }
	st.snap.V, st.snap.Epoch, st.snap.Cursor = num(schedfmt.FieldClock), num(schedfmt.FieldEpoch), int(num(schedfmt.FieldCursor))
	st.snap.NextSeq, st.snap.GK = max(1, num(schedfmt.FieldNextSeq)), int(num(schedfmt.FieldGateKey))
	st.snap.GN, st.snap.GP = max(1, num(schedfmt.FieldGateNext)), num(schedfmt.FieldGateProb)
	if b, ok := h[schedfmt.FieldBorn]; ok && schedfmt.Num(b) >= 0 {
		st.snap.Began, st.snap.Born = true, schedfmt.Num(b)
	}
	if cm, ok := h[schedfmt.FieldColdMark]; ok && schedfmt.Num(cm) >= 0 {
		st.snap.Marked, st.snap.Mark = true, schedfmt.Num(cm)
	}
	for field, v := range h {
		if !strings.HasPrefix(field, schedfmt.RegPrefix) {
			continue
		}
		reg, ok := schedfmt.ParseReg(v)
		seq, ok2 := schedfmt.ParseSeqCode(reg.Code)
		if !ok || !ok2 {
			return nil, fmt.Errorf("runqueue: malformed %s field %q: %q", qk.CkVtimeState(), field, v)
		}
		st.snap.Reg[field] = vtime.Reg{U: reg.Tag, R: reg.R, Seq: seq, Gated: reg.Gated, Waiting: reg.Waiting}
	}
	active := 0
	for _, z := range tags.Val() {
		member := z.Member.(string)
		switch s := z.Score; {
		case s < -schedfmt.WaitingOffset:
			st.snap.Idle[member] = int64(s) + schedfmt.GatedOffset
		case s < 0:
			// the newcomer lane: its members carry the "w" flag
		case member == schedfmt.SentinelMember, member == schedfmt.WideMember:
		case len(member) > schedfmt.SeqCodeLen:
			_, vm, _ := schedfmt.SplitMember(member)
			rg, ok := st.snap.Reg[vm]
			if !ok {
				continue // a tag without its registration: not ours to show
			}
			if s >= schedfmt.GatedOffset {
				rg.Gate = int64(s) - schedfmt.GatedOffset // its tag is in the hash
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
