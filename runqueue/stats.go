package runqueue

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/keys"
)

// Stats describe the runs of an env, a base queue or a concurrency key.
type Stats struct {
	Ready    int64 // queued and available now (or since promoted)
	Delayed  int64 // queued with a future available_at (or a due one not yet promoted)
	InFlight int64 // dequeued and not yet acked, nacked or recovered
	Dead     int64 // dead-lettered (queue and env only)
	// OldestReadyAge is now minus the available_at of the ready run first
	// in line (zero when none is ready): the head of a key's ready order, in
	// which priority p counts as p x Config.PriorityStep of age. Without
	// priorities that is the oldest ready run; with them a run that became
	// ready earlier may wait behind it, so the longest wait can exceed this
	// by up to MaxPriority x PriorityStep (finding the oldest would mean
	// reading every run's record, payload included). For a queue it is
	// measured on the variant first in age order, and on the earliest
	// delayed run when that is due: a due run no dequeue has promoted yet
	// (no consumer ran since its delay or retry backoff passed) counts in
	// Delayed but is waiting.
	OldestReadyAge time.Duration
}

// QueueStats reports one base queue.
func (q *Queue) QueueStats(ctx context.Context, env, queue string) (Stats, error) {
	if err := checkQueue(env, queue); err != nil {
		return Stats{}, err
	}
	qk := q.space.Env(env).Queue(queue)
	var depth *redis.SliceCmd
	var dead *redis.IntCmd
	var inflight heldLen
	var head *redis.StringSliceCmd
	var delayHead *redis.ZSliceCmd
	// (one MULTI/EXEC for readHeld; the queue's keys share its hash slot)
	err := q.readTx(ctx, func(p redis.Pipeliner) error {
		depth = p.HMGet(ctx, qk.Depth(), "r", "d")
		inflight = readHeld(ctx, p, qk)
		dead = p.ZCard(ctx, qk.Dead())
		head = p.ZRange(ctx, qk.CkIndex(), 0, 0)
		delayHead = p.ZRangeWithScores(ctx, qk.DelayIndex(), 0, 0)
		return nil
	})
	if err != nil {
		return Stats{}, err
	}
	s := Stats{Ready: toInt(depth.Val()[0]), Delayed: toInt(depth.Val()[1]), InFlight: inflight.val(), Dead: dead.Val()}
	// delayIndex scores each variant by its earliest delayed run's
	// available_at.
	s.OldestReadyAge = q.dueAge(delayHead.Val())
	if h := headVariant(qk, head.Val()); h != nil {
		ages, err := q.readyAges(ctx, []headRun{*h})
		if err != nil {
			return Stats{}, err
		}
		s.OldestReadyAge = max(s.OldestReadyAge, ages[0])
	}
	return s, nil
}

// KeyStats reports one concurrency key of a base queue.
func (q *Queue) KeyStats(ctx context.Context, env, queue, key string) (Stats, error) {
	if err := checkVariant(env, queue, key); err != nil {
		return Stats{}, err
	}
	qk := q.space.Env(env).Queue(queue)
	v := qk.Variant(key)
	var ready, delayed *redis.IntCmd
	var inflight *redis.StringCmd
	var delayHead *redis.ZSliceCmd
	_, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		ready = p.ZCard(ctx, v.Ready())
		delayed = p.ZCard(ctx, v.Delayed())
		inflight = p.HGet(ctx, qk.KeyInflight(), v.Member())
		delayHead = p.ZRangeWithScores(ctx, v.Delayed(), 0, 0) // scored by available_at
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return Stats{}, err
	}
	s := Stats{Ready: ready.Val(), Delayed: delayed.Val(), InFlight: toInt(inflight.Val())}
	s.OldestReadyAge = q.dueAge(delayHead.Val())
	if s.Ready > 0 {
		ages, err := q.readyAges(ctx, []headRun{{qk: qk, v: v}})
		if err != nil {
			return Stats{}, err
		}
		s.OldestReadyAge = max(s.OldestReadyAge, ages[0])
	}
	return s, nil
}

// dueAge is how long the delayed run (or variant) head, scored by its
// available_at, has been due: a due run that no dequeue has promoted yet
// (no consumer ran since) waits as a ready one does. 0 when not due.
func (q *Queue) dueAge(head []redis.Z) time.Duration {
	if len(head) == 1 {
		if wait := q.now() - int64(head[0].Score); wait > 0 {
			return time.Duration(wait) * time.Millisecond
		}
	}
	return 0
}

// headRun names a variant whose ready set's head is asked for its age.
type headRun struct {
	qk keys.Queue
	v  keys.Variant
}

// headVariant is the variant of a queue's age-order head (a ZRANGE of
// its ckIndex, 0 0), nil when the queue has none.
func headVariant(qk keys.Queue, head []string) *headRun {
	if len(head) != 1 {
		return nil
	}
	ck, err := keys.DecodeVariantMember(head[0])
	if err != nil {
		return nil
	}
	return &headRun{qk: qk, v: qk.Variant(ck)}
}

// readyAges is, for each variant of hs, now minus the available_at of the
// head of its ready set (0 when it has none; see Stats.OldestReadyAge for
// what priorities do to it). It reads them all in two pipelines, two
// round trips whatever their number: a ZRANGE of each ready set's head,
// then an HGET of each head's record.
func (q *Queue) readyAges(ctx context.Context, hs []headRun) ([]time.Duration, error) {
	out := make([]time.Duration, len(hs))
	ids := make([]*redis.StringSliceCmd, len(hs))
	if _, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, h := range hs {
			ids[i] = p.ZRange(ctx, h.v.Ready(), 0, 0)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	recs := make([]*redis.StringCmd, len(hs))
	if _, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, h := range hs {
			if id := ids[i].Val(); len(id) == 1 {
				recs[i] = p.HGet(ctx, h.qk.Runs(), id[0])
			}
		}
		return nil
	}); err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	now := q.now()
	for i, c := range recs {
		if c == nil {
			continue
		}
		raw, err := c.Result()
		if errors.Is(err, redis.Nil) {
			continue // acked or expired since the ZRANGE
		}
		if err != nil {
			return nil, err
		}
		if r, ok := parseRecord(raw); ok {
			out[i] = max(0, time.Duration(now-r.at)*time.Millisecond)
		}
	}
	return out, nil
}

// EnvStats sums the queued runs of every base queue of env, and reports the
// env's in-flight and dead-lettered runs. It reads the queues in
// pipelines of up to 1,000 queues (three round trips each), not one queue
// after another; the figures are not of one instant.
func (q *Queue) EnvStats(ctx context.Context, env string) (Stats, error) {
	if err := checkName("env", env); err != nil {
		return Stats{}, err
	}
	e := q.space.Env(env)
	queues, err := q.envQueues(ctx, e)
	if err != nil {
		return Stats{}, err
	}
	var total Stats
	for len(queues) > 0 {
		n := min(len(queues), envStatsChunk)
		s, err := q.queuedStats(ctx, e, queues[:n])
		if err != nil {
			return Stats{}, err
		}
		total.Ready += s.Ready
		total.Delayed += s.Delayed
		total.OldestReadyAge = max(total.OldestReadyAge, s.OldestReadyAge)
		queues = queues[n:]
	}
	// Dead runs are counted per queue in the env's dead hash, which also
	// covers queues that hold nothing but dead runs.
	dead, err := q.rdb.HVals(ctx, e.Dead()).Result()
	if err != nil {
		return Stats{}, err
	}
	for _, d := range dead {
		total.Dead += toInt(d)
	}
	total.InFlight, err = q.envInflight(ctx, e)
	return total, err
}

// envStatsChunk bounds the base queues whose queued runs EnvStats reads
// in one pipeline (three reads a queue; see queuedStats).
const envStatsChunk = 1000

// queuedStats sums the queued runs (Ready, Delayed) of the base queues
// names of env e, with the largest of their OldestReadyAge, in three
// pipelines (three round trips) whatever their number: each queue's depth
// counts and its age-order and delayed heads, then readyAges. Each
// figure is the one QueueStats reports; the queues are not read at one
// instant, as they never were (one queue after another).
func (q *Queue) queuedStats(ctx context.Context, e keys.Env, names []string) (Stats, error) {
	depth := make([]*redis.SliceCmd, len(names))
	heads := make([]*redis.StringSliceCmd, len(names))
	delayHeads := make([]*redis.ZSliceCmd, len(names))
	if _, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, name := range names {
			qk := e.Queue(name)
			depth[i] = p.HMGet(ctx, qk.Depth(), "r", "d")
			heads[i] = p.ZRange(ctx, qk.CkIndex(), 0, 0)
			delayHeads[i] = p.ZRangeWithScores(ctx, qk.DelayIndex(), 0, 0)
		}
		return nil
	}); err != nil {
		return Stats{}, err
	}
	var s Stats
	var hs []headRun
	for i, name := range names {
		d := depth[i].Val()
		s.Ready += toInt(d[0])
		s.Delayed += toInt(d[1])
		s.OldestReadyAge = max(s.OldestReadyAge, q.dueAge(delayHeads[i].Val()))
		if h := headVariant(e.Queue(name), heads[i].Val()); h != nil {
			hs = append(hs, *h)
		}
	}
	ages, err := q.readyAges(ctx, hs)
	if err != nil {
		return Stats{}, err
	}
	for _, a := range ages {
		s.OldestReadyAge = max(s.OldestReadyAge, a)
	}
	return s, nil
}

// heldWideField is the held hash's wide mark (lua/lib/held.lua): a field
// that is no run, written once the hash held 64 fields so that Redis keeps
// it a hash table.
const heldWideField = "~"

// heldLen is a read of a queue's in-flight count: the held hash's length
// less its wide mark. Its two commands go in one MULTI/EXEC (TxPipelined):
// in a plain pipeline a script could run between them (an ack that removes
// the last run and the mark, a dequeue that adds runs and the mark) and
// the count would be one the queue never had.
type heldLen struct {
	n    *redis.IntCmd
	mark *redis.BoolCmd
}

func readHeld(ctx context.Context, p redis.Pipeliner, qk keys.Queue) heldLen {
	return heldLen{n: p.HLen(ctx, qk.Held()), mark: p.HExists(ctx, qk.Held(), heldWideField)}
}

// err is the reads' first error.
func (h heldLen) err() error {
	if err := h.n.Err(); err != nil {
		return err
	}
	return h.mark.Err()
}

func (h heldLen) val() int64 {
	if h.mark.Val() {
		return max(0, h.n.Val()-1) // (read apart: see readTx)
	}
	return h.n.Val()
}

// readTx sends the reads of fn in one MULTI/EXEC (their keys share one
// slot), so that no script runs between them. Redis refuses every command
// queued in a MULTI while its memory is over maxmemory, reads too (the
// EXEC fails with EXECABORT): then the reads go again in a plain pipeline,
// where a script may run between two of them, so that the stats stay
// readable on a full Redis, when they matter most.
func (q *Queue) readTx(ctx context.Context, fn func(redis.Pipeliner) error) error {
	_, err := q.rdb.TxPipelined(ctx, fn)
	var re redis.Error
	if errors.As(err, &re) && (strings.HasPrefix(re.Error(), "EXECABORT") || strings.HasPrefix(re.Error(), "OOM")) {
		_, err = q.rdb.Pipelined(ctx, fn)
	}
	return err
}

// queueInflight is the number of runs of queue qk in flight.
func (q *Queue) queueInflight(ctx context.Context, qk keys.Queue) (int64, error) {
	var h heldLen
	if err := q.readTx(ctx, func(p redis.Pipeliner) error {
		h = readHeld(ctx, p, qk)
		return nil
	}); err != nil {
		return 0, err
	}
	return h.val(), nil
}

// envInflight is the env's in-flight count.
func (q *Queue) envInflight(ctx context.Context, e keys.Env) (int64, error) {
	return envCount(q.rdb.Get(ctx, e.InflightCount()))
}

// envCount is the env's in-flight count a GET read: 0 when the key is not
// there (nothing in flight).
func envCount(cmd *redis.StringCmd) (int64, error) {
	n, err := cmd.Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return n, err
}

// envQueues lists the base queues of env that hold queued runs (the shard
// master holds exactly those).
func (q *Queue) envQueues(ctx context.Context, e keys.Env) ([]string, error) {
	all, err := q.rdb.ZRange(ctx, e.Master(), 0, -1).Result()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range all {
		env, queue, err := keys.DecodeQueueMember(m)
		if err == nil && env == e.Name() {
			out = append(out, queue)
		}
	}
	return out, nil
}

func toInt(v any) int64 {
	s, _ := v.(string)
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

// QueueRef names a base queue.
type QueueRef struct {
	Env, Queue string
}

// Validate says whether r names a base queue every call accepts: nil, or
// the *InvalidError (errors.Is ErrInvalid) a call given r would return.
func (r QueueRef) Validate() error { return checkQueue(r.Env, r.Queue) }

// ActiveQueues lists up to limit base queues that hold queued runs (ready
// or delayed), and how many such queues there are in all. It reads each
// shard's master (a ZCARD and a ZRANGE of at most limit members per shard,
// in one pipeline) and takes the shards' queues in turn, each shard's
// oldest work first, so that no shard's queues crowd out another's. A queue
// whose runs are all in flight or dead holds no queued run and is not
// listed.
func (q *Queue) ActiveQueues(ctx context.Context, limit int) ([]QueueRef, int64, error) {
	if limit <= 0 || limit > MaxInspectVariants {
		return nil, 0, invalid("limit", "%d is outside 1..%d", limit, MaxInspectVariants)
	}
	n := q.space.Shards()
	cards := make([]*redis.IntCmd, n)
	heads := make([]*redis.StringSliceCmd, n)
	_, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range n {
			m := q.space.Shard(i).Master()
			cards[i] = p.ZCard(ctx, m)
			heads[i] = p.ZRange(ctx, m, 0, int64(limit-1))
		}
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	var total int64
	for _, c := range cards {
		total += c.Val()
	}
	var out []QueueRef
	for rank := 0; len(out) < limit; rank++ {
		more := false
		for _, h := range heads {
			ms := h.Val()
			if rank >= len(ms) || len(out) == limit {
				continue
			}
			more = true
			if env, queue, err := keys.DecodeQueueMember(ms[rank]); err == nil {
				out = append(out, QueueRef{Env: env, Queue: queue})
			}
		}
		if !more {
			break
		}
	}
	return out, total, nil
}
