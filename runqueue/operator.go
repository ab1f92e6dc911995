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

// MaxInspectVariants bounds how many variants Schedule and Preview read.
const MaxInspectVariants = 10000

// ErrTooLarge: the queue has more variants than an operator call reads.
var ErrTooLarge = errors.New("runqueue: queue has too many variants to inspect")

// KeySchedule is one concurrency key as the fair scheduler sees it.
type KeySchedule struct {
	Key string
	// Registered is true when the key has a tag; Tag is its next virtual
	// start and Lag = Tag - V (positive: the key has been served ahead of
	// the clock and waits; zero or negative: it is owed service).
	Registered bool
	Tag        float64
	Lag        float64
	Weight     float64
	// Parked is the tag kept while the key has no ready run (HasParked).
	HasParked bool
	Parked    float64
	Ready     int64
	Delayed   int64
	InFlight  int64
	// Reason says why the key is not being served, "" when it is servable
	// and within the window: "idle" (no runs), "head in the future" (only
	// delayed runs), "at its limit" (KeyConcurrency reached), "queue or env
	// at its limit", "outside the window" (registered but beyond what a
	// dequeue of maxCount reads), "awaiting discovery" (ready runs written
	// without the flag, not yet registered).
	Reason string
}

// Schedule is the fair scheduler's view of a base queue.
type Schedule struct {
	V      float64 // the queue's virtual clock
	Window int     // maxCount * WindowMultiplier used for Reason
	Keys   []KeySchedule
}

// Schedule reports, for every concurrency key of a base queue, its tag, lag,
// weight, parked tag and why it is not being served, as a dequeue of
// maxCount would see it now. It changes nothing.
func (q *Queue) Schedule(ctx context.Context, env, queue string, maxCount int) (*Schedule, error) {
	if err := checkQueue(env, queue); err != nil {
		return nil, err
	}
	if err := q.checkMaxCount(maxCount); err != nil {
		return nil, err
	}
	qk := q.space.Env(env).Queue(queue)
	st, err := q.readScheduler(ctx, qk)
	if err != nil {
		return nil, err
	}
	wc := maxCount * q.cfg.WindowMultiplier
	scan := q.scanLimit(maxCount)
	lim := q.cfg.LimitsFor(env, queue)
	full, err := q.capacityGone(ctx, qk, lim)
	if err != nil {
		return nil, err
	}
	tagRank := rank(st.tags)
	ageRank := rank(st.index)
	out := &Schedule{V: st.v, Window: wc}
	for _, vm := range st.members() {
		key, err := keys.DecodeVariantMember(vm)
		if err != nil {
			continue
		}
		v := qk.Variant(key)
		ks := KeySchedule{Key: key, Weight: 1}
		if w, ok := st.weights[vm]; ok {
			ks.Weight = w
		}
		if s, ok := st.tags.score(vm); ok {
			ks.Registered, ks.Tag, ks.Lag = true, s, s-st.v
		}
		if p, ok := st.idle[vm]; ok {
			ks.HasParked, ks.Parked = true, p
		}
		var ready, delayed, inflight *redis.IntCmd
		if _, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			ready = p.ZCard(ctx, v.Ready())
			delayed = p.ZCard(ctx, v.Delayed())
			inflight = p.SCard(ctx, v.Inflight())
			return nil
		}); err != nil {
			return nil, err
		}
		ks.Ready, ks.Delayed, ks.InFlight = ready.Val(), delayed.Val(), inflight.Val()
		r1, inTags := tagRank[vm]
		r2, inAge := ageRank[vm]
		switch {
		case ks.Ready == 0 && ks.Delayed > 0:
			ks.Reason = "head in the future"
		case ks.Ready == 0:
			ks.Reason = "idle"
		case lim.Key > 0 && ks.InFlight >= int64(lim.Key):
			ks.Reason = "at its limit"
		case full:
			ks.Reason = "queue or env at its limit"
		case !inTags && !(inAge && r2 < scan):
			ks.Reason = "awaiting discovery"
		case r1 >= 2*wc && !(inAge && r2 < scan):
			ks.Reason = "outside the window"
		}
		out.Keys = append(out.Keys, ks)
	}
	return out, nil
}

func (q *Queue) capacityGone(ctx context.Context, qk keys.Queue, lim Limits) (bool, error) {
	if lim.Env > 0 {
		n, err := q.rdb.SCard(ctx, qk.Env.Inflight()).Result()
		if err != nil || n >= int64(lim.Env) {
			return err == nil, err
		}
	}
	if lim.Queue > 0 {
		n, err := q.rdb.SCard(ctx, qk.Inflight()).Result()
		return err == nil && n >= int64(lim.Queue), err
	}
	return false, nil
}

// PreviewRun is one run Preview predicts.
type PreviewRun struct {
	Key, ID string
	Attempt int
}

// Preview returns the next n runs (at most) that a fair dequeue of n would
// serve now, in order, without changing anything: it replays the scheduler
// model (vtime) on a snapshot of the queue. With the flag off it shows what
// the fair order would be once the flag is on.
func (q *Queue) Preview(ctx context.Context, env, queue string, n int) ([]PreviewRun, error) {
	if err := checkQueue(env, queue); err != nil {
		return nil, err
	}
	if err := q.checkMaxCount(n); err != nil {
		return nil, err
	}
	now := q.now()
	qk := q.space.Env(env).Queue(queue)
	st, err := q.readScheduler(ctx, qk)
	if err != nil {
		return nil, err
	}
	snap := vtime.Snapshot{V: st.v, L: st.l, HasL: st.hasL, Cursor: st.cursor,
		Tags: st.tags.asMap(), Idle: st.idle, Weights: st.weights, InFlight: map[string]int{}}
	var sumInflight int64
	inflight := func(vm string, v keys.Variant) error {
		if _, ok := snap.InFlight[vm]; ok {
			return nil
		}
		c, err := q.rdb.SCard(ctx, v.Inflight()).Result()
		snap.InFlight[vm] = int(c)
		sumInflight += c
		return err
	}
	for _, e := range st.index {
		v, err := variantOf(qk, e.member)
		if err != nil {
			return nil, err
		}
		ids, err := q.rdb.ZRange(ctx, v.Ready(), 0, int64(n)).Result()
		if err != nil {
			return nil, err
		}
		if err := q.addSnapshotRuns(ctx, qk, &snap, ids, false); err != nil {
			return nil, err
		}
		if err := inflight(e.member, v); err != nil {
			return nil, err
		}
	}
	due, err := q.rdb.ZRangeByScore(ctx, qk.DelayIndex(), &redis.ZRangeBy{Min: "-inf", Max: strconv.FormatInt(now, 10),
		Count: int64(q.scanLimit(n))}).Result()
	if err != nil {
		return nil, err
	}
	for _, vm := range due {
		v, err := variantOf(qk, vm)
		if err != nil {
			return nil, err
		}
		ids, err := q.rdb.ZRangeByScore(ctx, v.Delayed(), &redis.ZRangeBy{Min: "-inf", Max: strconv.FormatInt(now, 10),
			Count: int64(q.cfg.PromoteLimit)}).Result()
		if err != nil {
			return nil, err
		}
		if err := q.addSnapshotRuns(ctx, qk, &snap, ids, true); err != nil {
			return nil, err
		}
		if err := inflight(vm, v); err != nil {
			return nil, err
		}
	}
	qn, err := q.rdb.SCard(ctx, qk.Inflight()).Result()
	if err != nil {
		return nil, err
	}
	// In-flight runs of variants with no ready run count for the queue
	// limit; "" is no variant's member.
	snap.InFlight[""] = int(qn - sumInflight)
	en, err := q.rdb.SCard(ctx, qk.Env.Inflight()).Result()
	if err != nil {
		return nil, err
	}
	snap.EnvOther = int(en - qn)
	lim := q.cfg.LimitsFor(env, queue)
	m := vtime.Restore(vtime.Config{
		Quantum: q.cfg.Quantum, WindowMultiplier: q.cfg.WindowMultiplier, IdleMaxEntries: q.cfg.IdleMaxEntries,
		PriorityStep: ms(q.cfg.PriorityStep), PromoteLimit: q.cfg.PromoteLimit, ScanLimit: q.cfg.ScanLimit,
		Limits: vtime.Limits{Env: lim.Env, Queue: lim.Queue, Key: lim.Key},
	}, snap)
	var out []PreviewRun
	for _, s := range m.Dequeue(n, now) {
		id, err := keys.DecodeSegment(s.ID)
		if err != nil {
			return nil, err
		}
		out = append(out, PreviewRun{Key: s.Key, ID: id, Attempt: s.Attempt})
	}
	return out, nil
}

func (q *Queue) addSnapshotRuns(ctx context.Context, qk keys.Queue, snap *vtime.Snapshot, ids []string, delayed bool) error {
	if len(ids) == 0 {
		return nil
	}
	metas, err := q.rdb.HMGet(ctx, qk.Meta(), ids...).Result()
	if err != nil {
		return err
	}
	for i, raw := range metas {
		s, _ := raw.(string)
		m, ok := parseMeta(s)
		if !ok {
			continue
		}
		key, err := keys.DecodeVariantMember(m.vm)
		if err != nil {
			return err
		}
		snap.Runs = append(snap.Runs, vtime.SnapshotRun{ID: ids[i], Key: key, Priority: m.pr, At: m.at,
			Attempt: m.att, Delayed: delayed})
	}
	return nil
}

// schedState is the scheduler state of a queue read from Redis.
type schedState struct {
	v, l     float64
	hasL     bool
	cursor   int
	tags     zlist
	index    zlist
	idle     map[string]float64
	weights  map[string]float64
	delayIdx []string
}

type zentry struct {
	member string
	score  float64
}

type zlist []zentry

func (z zlist) score(m string) (float64, bool) {
	for _, e := range z {
		if e.member == m {
			return e.score, true
		}
	}
	return 0, false
}

func (z zlist) asMap() map[string]float64 {
	out := make(map[string]float64, len(z))
	for _, e := range z {
		out[e.member] = e.score
	}
	return out
}

func rank(z zlist) map[string]int {
	out := make(map[string]int, len(z))
	for i, e := range z {
		out[e.member] = i
	}
	return out
}

func (s *schedState) members() []string {
	seen := map[string]bool{}
	for _, z := range []zlist{s.tags, s.index} {
		for _, e := range z {
			seen[e.member] = true
		}
	}
	for m := range s.idle {
		seen[m] = true
	}
	for m := range s.weights {
		seen[m] = true
	}
	for _, m := range s.delayIdx {
		seen[m] = true
	}
	out := make([]string, 0, len(seen))
	for m := range seen {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

func (q *Queue) readScheduler(ctx context.Context, qk keys.Queue) (*schedState, error) {
	var tags, index, idle *redis.ZSliceCmd
	var delay *redis.StringSliceCmd
	var floor *redis.StringCmd
	var weights *redis.MapStringStringCmd
	_, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		tags = p.ZRangeWithScores(ctx, qk.CkVtime(), 0, MaxInspectVariants)
		index = p.ZRangeWithScores(ctx, qk.CkIndex(), 0, MaxInspectVariants)
		idle = p.ZRangeWithScores(ctx, qk.CkVtimeIdle(), 0, -1)
		delay = p.ZRange(ctx, qk.DelayIndex(), 0, MaxInspectVariants)
		floor = p.Get(ctx, qk.CkVtimeFloor())
		weights = p.HGetAll(ctx, qk.Weights())
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	st := &schedState{idle: map[string]float64{}, weights: map[string]float64{}, delayIdx: delay.Val()}
	toList := func(z []redis.Z) zlist {
		out := make(zlist, 0, len(z))
		for _, e := range z {
			out = append(out, zentry{e.Member.(string), e.Score})
		}
		return out
	}
	st.tags, st.index = toList(tags.Val()), toList(index.Val())
	if len(st.tags) > MaxInspectVariants || len(st.index) > MaxInspectVariants || len(st.delayIdx) > MaxInspectVariants {
		return nil, ErrTooLarge
	}
	for _, e := range idle.Val() {
		st.idle[e.Member.(string)] = e.Score
	}
	for m, w := range weights.Val() {
		if f, err := strconv.ParseFloat(w, 64); err == nil {
			st.weights[m] = f
		}
	}
	if raw, err := floor.Result(); err == nil {
		f := strings.Split(raw, "|")
		if len(f) != 4 {
			return nil, fmt.Errorf("runqueue: malformed %s: %q", qk.CkVtimeFloor(), raw)
		}
		st.v, _ = strconv.ParseFloat(f[0], 64)
		if f[1] != "" {
			st.l, _ = strconv.ParseFloat(f[1], 64)
			st.hasL = true
		}
		st.cursor, _ = strconv.Atoi(f[2])
	}
	return st, nil
}
