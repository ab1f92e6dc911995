package runqueue

import (
	"context"
	"errors"
	"sort"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/internal/schedfmt"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/vtime"
)

// MaxInspectVariants bounds how many variants Schedule and Preview read.
const MaxInspectVariants = 10000

// KeySchedule is one concurrency key as the fair scheduler sees it.
type KeySchedule struct {
	Key string
	// Registered is true when the key takes part in the scheduler (it has
	// a tag, or waits in the newcomer lane for one); Tag is its next virtual
	// start and Lag = Tag - V, in quanta (Config.Quantum; positive: the key
	// has been served ahead of the clock and waits; zero or negative: it is
	// owed service). Seq is its registration order, which breaks ties.
	Registered bool
	Tag        float64
	Lag        float64
	Seq        int64
	// Gated: the key is at its per-key limit and out of the competition
	// until a slot frees.
	Gated bool
	// Waiting: the key is a newcomer in the scheduler's lane. The lane's
	// head competes with its tag; the others queue behind it in
	// registration order with no tag (Tag and Lag are 0) until they head
	// it (Reason "waiting in the newcomer lane").
	Waiting bool
	// Weight is the key's weight as set (SetWeight; 1 when none); the
	// scheduler holds it to the nearest 0.001 (0.0014 is scheduled as 0.001).
	Weight float64
	// Parked is the tag kept while the key has no ready run (HasParked).
	HasParked bool
	Parked    float64
	Ready     int64
	Delayed   int64
	InFlight  int64
	// Reason says why the key is not being served, "" when it competes:
	// "idle" (no queued run; runs in flight may remain), "head in the
	// future" (only delayed runs), "at its limit" (KeyConcurrency reached),
	// "queue or env at its limit" (the env's free slots left to other
	// queues of the env waiting ahead of this one count as taken),
	// "awaiting discovery" (ready runs written without the flag, not yet
	// registered: a dequeue's discovery reaches it within
	// ceil(variants / max(1, ScanLimit - maxCount)) + 1 calls, guarantee 5
	// of docs/design.md), "waiting in the newcomer lane".
	Reason string
}

// Schedule is the fair scheduler's view of a base queue.
type Schedule struct {
	V    float64 // the queue's virtual clock, in quanta
	Keys []KeySchedule
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
	lim, err := q.cfg.limitsFor(env, queue)
	if err != nil {
		return nil, err
	}
	full, err := q.capacityGone(ctx, qk, lim)
	if err != nil {
		return nil, err
	}
	sn := st.snap
	out := &Schedule{V: q.clockQuanta(sn.Epoch, sn.V)}
	head, headSeq := "", int64(0)
	for vm, r := range sn.Reg {
		if r.Waiting && (head == "" || r.Seq < headSeq) {
			head, headSeq = vm, r.Seq
		}
	}
	for _, vm := range st.members() {
		key, err := keys.DecodeVariantMember(vm)
		if err != nil {
			continue
		}
		v := qk.Variant(key)
		ks := KeySchedule{Key: key, Weight: 1}
		if w, ok := st.weightsF[vm]; ok {
			ks.Weight = w
		}
		queued := false // in the lane behind its head: no tag yet
		if r, ok := sn.Reg[vm]; ok {
			ks.Registered, ks.Gated, ks.Seq, ks.Waiting = true, r.Gated, r.Seq, r.Waiting
			if queued = r.Waiting && vm != head; !queued {
				ks.Tag = q.clockQuanta(sn.Epoch, r.U)
				ks.Lag = ks.Tag - out.V
			}
		}
		if p, ok := sn.Idle[vm]; ok {
			ks.HasParked, ks.Parked = true, q.clockQuanta(sn.Epoch, p)
		}
		var ready, delayed *redis.IntCmd
		var inflight *redis.StringCmd
		if _, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			ready = p.ZCard(ctx, v.Ready())
			delayed = p.ZCard(ctx, v.Delayed())
			inflight = p.HGet(ctx, qk.KeyInflight(), vm)
			return nil
		}); err != nil && !errors.Is(err, redis.Nil) {
			return nil, err
		}
		ks.Ready, ks.Delayed, ks.InFlight = ready.Val(), delayed.Val(), toInt(inflight.Val())
		switch {
		case ks.Ready == 0 && ks.Delayed > 0:
			ks.Reason = "head in the future"
		case ks.Ready == 0:
			ks.Reason = "idle"
		case ks.Gated || (lim.Key > 0 && ks.InFlight >= int64(lim.Key)):
			ks.Reason = "at its limit"
		case full:
			ks.Reason = "queue or env at its limit"
		case !ks.Registered:
			ks.Reason = "awaiting discovery"
		case queued:
			ks.Reason = "waiting in the newcomer lane"
		}
		out.Keys = append(out.Keys, ks)
	}
	return out, nil
}

// capacityGone: a dequeue of qk now would take nothing for its queue's
// or env's limit; with the flag on, the env's free slots left to the other
// queues of the env that wait ahead of qk (envAhead) count as taken.
func (q *Queue) capacityGone(ctx context.Context, qk keys.Queue, lim Limits) (bool, error) {
	if lim.Env > 0 {
		n, err := q.envInflight(ctx, qk.Env)
		if err != nil {
			return false, err
		}
		ahead := 0
		if q.cfg.VtimeScheduling { // (flag-off dequeues do not read the line)
			if ahead, err = q.envAhead(ctx, qk, lim.Env, n); err != nil {
				return false, err
			}
		}
		if n+int64(ahead) >= int64(lim.Env) {
			return true, nil
		}
	}
	if lim.Queue > 0 {
		n, err := q.queueInflight(ctx, qk)
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
// the fair order would be once the flag is on. Runs whose TTL passed are
// left out as Dequeue leaves them (it sweeps them at their key's head, or
// takes and deletes them and calls again for the rest: Preview then reads
// as much again of the queue for each such call).
func (q *Queue) Preview(ctx context.Context, env, queue string, n int) ([]PreviewRun, error) {
	if err := checkQueue(env, queue); err != nil {
		return nil, err
	}
	if err := q.checkMaxCount(n); err != nil {
		return nil, err
	}
	now := q.now()
	for reads := 1; ; {
		out, calls, err := q.preview(ctx, env, queue, n, now, reads)
		if err != nil || calls <= reads || reads > maxCorruptCalls {
			return out, err
		}
		reads = calls
	}
}

// preview is Preview on a snapshot that holds what reads script calls of
// a dequeue of n may take (each call at most n runs of a key, the due
// variants it scans, PromoteLimit due runs of each); it returns the runs
// the calls of one Dequeue deliver on it and how many calls that took.
func (q *Queue) preview(ctx context.Context, env, queue string, n int, now int64, reads int) ([]PreviewRun, int, error) {
	qk := q.space.Env(env).Queue(queue)
	st, err := q.readScheduler(ctx, qk)
	if err != nil {
		return nil, 0, err
	}
	snap := st.snap
	var sumInflight int64
	inflight := func(vm string, v keys.Variant) error {
		if _, ok := snap.InFlight[vm]; ok {
			return nil
		}
		c, err := q.rdb.HGet(ctx, qk.KeyInflight(), vm).Int64()
		if errors.Is(err, redis.Nil) {
			err = nil
		}
		snap.InFlight[vm] = int(c)
		sumInflight += c
		return err
	}
	// Every variant the dequeue may touch: the indexes and the
	// registrations (stale ones included: a dequeue collects them).
	var variants []string
	seen := map[string]bool{}
	for _, list := range [][]string{zmembers(st.index), registered(st)} {
		for _, vm := range list {
			if !seen[vm] {
				seen[vm] = true
				variants = append(variants, vm)
			}
		}
	}
	// Each variant's first reads x (n+1) ready runs, and as many more as
	// were past their TTL among those read (the calls sweep them at the
	// head: at most vtime.TTLLook a call, so reads x TTLLook a variant).
	for _, vm := range variants {
		v, err := variantOf(qk, vm)
		if err != nil {
			return nil, 0, err
		}
		sweepLeft := reads * vtime.TTLLook
		for from, want := 0, reads*(n+1); want > 0; {
			ids, err := q.rdb.ZRange(ctx, v.Ready(), int64(from), int64(from+want-1)).Result()
			if err != nil {
				return nil, 0, err
			}
			dead, err := q.addSnapshotRuns(ctx, qk, &snap, ids, false, now)
			if err != nil {
				return nil, 0, err
			}
			from += len(ids)
			if len(ids) < want {
				break
			}
			// (at least as many as the first read: fewer round trips)
			want = min(max(dead, reads*(n+1)), sweepLeft)
			if dead == 0 {
				want = 0
			}
			sweepLeft -= want
		}
		if err := inflight(vm, v); err != nil {
			return nil, 0, err
		}
	}
	// The due variants a call of n looks at: scan of them, or, when more
	// are due, vtime.PromoteLook times as many (it reaches those without a
	// ready run first), and further past those at their key limit, up to
	// vtime.PromoteLookMax (helper-174: with the first look only, Preview
	// showed nothing where Dequeue served a free key due behind 130 held
	// keys).
	due, err := q.rdb.ZRangeByScore(ctx, qk.DelayIndex(), &redis.ZRangeBy{Min: "-inf", Max: strconv.FormatInt(now, 10),
		Count: int64(reads * vtime.PromoteLookMax(q.scanLimit(n)))}).Result()
	if err != nil {
		return nil, 0, err
	}
	for _, vm := range due {
		v, err := variantOf(qk, vm)
		if err != nil {
			return nil, 0, err
		}
		ids, err := q.rdb.ZRangeByScore(ctx, v.Delayed(), &redis.ZRangeBy{Min: "-inf", Max: strconv.FormatInt(now, 10),
			Count: int64(reads * q.cfg.PromoteLimit)}).Result()
		if err != nil {
			return nil, 0, err
		}
		if _, err := q.addSnapshotRuns(ctx, qk, &snap, ids, true, now); err != nil {
			return nil, 0, err
		}
		if err := inflight(vm, v); err != nil {
			return nil, 0, err
		}
	}
	qn, err := q.queueInflight(ctx, qk)
	if err != nil {
		return nil, 0, err
	}
	// In-flight runs of variants with no ready run count for the queue
	// limit; "" is no variant's member.
	snap.InFlight[""] = int(qn - sumInflight)
	en, err := q.envInflight(ctx, qk.Env)
	if err != nil {
		return nil, 0, err
	}
	snap.EnvOther = int(en - qn)
	lim, err := q.cfg.limitsFor(env, queue)
	if err != nil {
		return nil, 0, err
	}
	if lim.Env > 0 {
		if snap.EnvAhead, err = q.envAhead(ctx, qk, lim.Env, en); err != nil {
			return nil, 0, err
		}
	}
	m := vtime.Restore(vtime.Config{
		WindowMultiplier: q.cfg.WindowMultiplier, IdleMaxEntries: q.cfg.IdleMaxEntries,
		PriorityStep: ms(q.cfg.PriorityStep), PromoteLimit: q.cfg.PromoteLimit, ScanLimit: q.cfg.ScanLimit,
		Limits: vtime.Limits{Env: lim.Env, Queue: lim.Queue, Key: lim.Key},
	}, snap)
	// As Dequeue: the runs a call took whose TTL had passed are expired,
	// not delivered, and a call that delivered fewer than n for that is
	// made again for the rest (see serve).
	served, calls := m.DequeueCalls(n, now, maxCorruptCalls, true)
	var out []PreviewRun
	for _, s := range served {
		if s.Expired {
			continue
		}
		id, err := keys.DecodeSegment(s.ID)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, PreviewRun{Key: s.Key, ID: id, Attempt: s.Attempt})
	}
	return out, calls, nil
}

func zmembers(z []zentry) []string {
	out := make([]string, len(z))
	for i, e := range z {
		out[i] = e.member
	}
	return out
}

func registered(st *schedState) []string {
	var out []string
	for vm := range st.snap.Reg {
		out = append(out, vm)
	}
	return out
}

// addSnapshotRuns adds the runs ids (ready, or delayed) to snap and
// returns how many of them passed their TTL by now.
func (q *Queue) addSnapshotRuns(ctx context.Context, qk keys.Queue, snap *vtime.Snapshot, ids []string, delayed bool, now int64) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	recs, err := q.rdb.HMGet(ctx, qk.Runs(), ids...).Result()
	if err != nil {
		return 0, err
	}
	dead := 0
	for i, raw := range recs {
		s, _ := raw.(string)
		r, ok := parseRecord(s)
		if !ok {
			continue
		}
		key, err := keys.DecodeVariantMember(r.vm)
		if err != nil {
			return 0, err
		}
		snap.Runs = append(snap.Runs, vtime.SnapshotRun{ID: ids[i], Key: key, Priority: r.pr, At: r.at,
			Attempt: r.att, Delayed: delayed, TTL: r.ttl})
		if r.ttl > 0 && r.ttl <= now {
			dead++
		}
	}
	return dead, nil
}

// maxTopLags bounds the k of TopLags.
const maxTopLags = MaxInspectVariants

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
	if !q.cfg.VtimeScheduling {
		// A state left by a flag-on instance (a rollback, or one beside
		// this one) is not this instance's scheduler: its tags are no lags.
		return nil, nil
	}
	qk := q.space.Env(env).Queue(queue)
	var clock *redis.SliceCmd
	var active *redis.ZSliceCmd
	_, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		clock = p.HMGet(ctx, qk.CkVtimeState(), schedfmt.FieldClock, schedfmt.FieldEpoch)
		active = p.ZRevRangeByScoreWithScores(ctx, qk.CkVtime(), &redis.ZRangeBy{Min: schedfmt.ActiveMin,
			Max: schedfmt.ActiveEnd, Count: int64(k)})
		return nil
	})
	if err != nil {
		return nil, err
	}
	num := func(v any) int64 {
		s, _ := v.(string)
		return schedfmt.Num(s)
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
		_, vm, ok := schedfmt.SplitMember(m)
		if !ok {
			continue
		}
		key, err := keys.DecodeVariantMember(vm)
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
