package runqueue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/keys"
)

// Run is a dequeued run, in flight under a lease until acked, nacked or
// recovered.
type Run struct {
	Env, Queue, Key, ID string
	Payload             []byte
	// Attempt is the delivery attempt, from 1.
	Attempt int
	// Priority is the run's priority (0..9).
	Priority int
	// AvailableAt is when the run became (or was to become) ready: its
	// enqueue time plus delay, or its retry time after a nack. The wait of
	// a delivery is its dequeue time minus AvailableAt (Observer.Dequeued).
	AvailableAt time.Time
	// Token identifies this delivery; a later delivery of the same run (after
	// lease recovery) makes this holder's Ack, Nack and ExtendLease fail with
	// ErrLeaseLost.
	Token int64
	// LeaseDeadline is when lease recovery may take the run back.
	LeaseDeadline time.Time
}

func (r *Run) ref() keys.Ref { return keys.Ref{Env: r.Env, Queue: r.Queue, Key: r.Key, ID: r.ID} }

// Dequeue moves up to maxCount ready runs of one base queue in flight, each
// with a lease of Config.LeaseDuration, atomically and within the env, queue
// and key concurrency limits. With the scheduler flag off the runs come in
// age order; with it on, in fair virtual-time order across keys. Within a
// key, runs go by ready score (available time less the priority's head
// start, in milliseconds), then by the bytes of their ids: runs enqueued
// in one millisecond (an EnqueueMany, coalesced Enqueue calls, which share
// one time) come in id order, not in the order they were enqueued.
//
// A run whose TTL passed (EnqueueParams.TTL) is deleted, not delivered
// (Observer.Expired). Each script call sweeps the runs past their TTL that
// come to the head of their key while it serves, up to 100 (vtime.TTLLook):
// no serve (the key is not charged), not counted for maxCount or the key's
// limit. One past its TTL after those is taken as a run: it counts as a
// serve for its key's
// place in the order and, within the call, for maxCount and the key's
// limit, but takes no slot; a call that delivered fewer than maxCount for
// that calls again for the rest, at most 64 times: so a queue whose head
// runs expired does not read as empty unless more than 65 x (maxCount +
// 100) of them come first (or 65 x 101 of one key at its limit of 1),
// and then a DequeueWait or a Worker waits its poll interval before it
// looks again (a sweep clears them 1,000 a call).
//
// Concurrent Dequeue calls of one base queue on one Queue are coalesced as
// Enqueue calls are (see Enqueue and Config.SerialCalls), each base queue
// apart (calls of one queue never wait for another's): the calls that
// wait while two of the queue's are in flight go together, up to 100
// calls and Config.MaxDequeueCount runs a script call, in script calls
// that stand for them: their maxCounts summed, their ScanLimits summed (at
// most 10,000) and their PromoteLimits summed (at most the maxCounts
// summed, or PromoteLimit when more), so a script call reaches what its
// calls would and has at least the budget of one call of their maxCounts
// summed (see Config.PromoteLimit: the budget is spent over the due
// variants; how many runs the plan's shares, rounded up, give in all may
// differ by a few).
// Its runs are handed out in the order it served them, each call taking
// up to its own maxCount, the earliest calls first. With the flag off
// that order is age order over the runs ready once it promoted: it may
// serve a run that separate calls would have served later than another
// key's due run they promoted one call at a time. With the flag on, where the scheduler's batch
// invariance holds (docs/design.md, guarantee 4) a dequeue of N serves
// what N dequeues of one would; elsewhere it serves within the same
// guarantees, in an order N calls might not have taken. A hundred
// goroutines each taking one run cost Redis what a few calls of many
// cost. When ctx ends before the call is sent, Dequeue returns ctx.Err()
// and nothing is served for it; once sent, it waits for the script call's
// reply (which the latest deadline of the calls it carries bounds when the
// client has ContextTimeoutEnabled: README, "Deadlines") and returns what
// it served for it.
func (q *Queue) Dequeue(ctx context.Context, env, queue string, maxCount int) ([]*Run, error) {
	if err := checkQueue(env, queue); err != nil {
		return nil, err
	}
	if err := q.checkMaxCount(maxCount); err != nil {
		return nil, err
	}
	return q.dequeueOne(ctx, q.names(env, queue), maxCount)
}

// dequeueOne is one Dequeue of up to maxCount runs of n: coalesced with
// the concurrent ones (a call of its own with Config.SerialCalls or after
// Close).
func (q *Queue) dequeueOne(ctx context.Context, n *queueNames, maxCount int) ([]*Run, error) {
	if !q.cfg.SerialCalls {
		// A read-only Queue refuses here, as Enqueue and Ack do, whatever
		// the context.
		if q.scripts.dequeue.refused {
			return nil, ErrReadOnly
		}
		res, err := q.deq.do(ctx, dequeueReq{qn: n, max: maxCount})
		if err == nil {
			return res.runs, res.err
		}
		if !errors.Is(err, errCoalescerClosed) {
			return nil, err
		}
	}
	return q.dequeueQueue(ctx, n, maxCount, q.now())
}

// dequeueReq is one coalesced Dequeue: its base queue and maxCount.
type dequeueReq struct {
	qn  *queueNames
	max int
}

// dequeueResult is what one coalesced Dequeue got: its runs and the time
// of the script call that served them (for the Observer), or the call's
// error.
type dequeueResult struct {
	runs    []*Run
	now     int64
	err     error
	corrupt corrupt // what the call served with records that do not parse (the first call's)
}

// dqSize is how much one dequeue script call may do: serve maxCount runs,
// look at scan variants, promote promote due runs of a variant.
type dqSize struct {
	maxCount, scan, promote int
	leave                   bool // (maxCount 0) a consumer leaving the env's waiting line: see leaveLine
}

// sizeOf is the size of a dequeue call of maxCount.
func (q *Queue) sizeOf(maxCount int) dqSize {
	return dqSize{maxCount: maxCount, scan: q.scanLimit(maxCount), promote: q.cfg.PromoteLimit}
}

// dequeueCoalesced sends the coalesced Dequeue calls reqs, all of one base
// queue (the coalescer groups them by queue member: each queue has
// senders of its own), in one script call that stands for them: their
// maxCounts summed (the coalescer keeps the sum within
// Config.MaxDequeueCount), their scans summed (within the 10,000 a call
// may scan) and their promotions summed (within the sum of their
// maxCounts, or PromoteLimit when more: a variant gives no more runs than
// that), so that it reaches what they would and promotes at least what
// one call of their maxCounts summed would. Its
// runs are handed out in serve order, each call taking up to its own
// maxCount, the earliest calls first. The Observer hears of each call's
// runs in its caller's goroutine.
func (q *Queue) dequeueCoalesced(ctx context.Context, reqs []dequeueReq) []dequeueResult {
	var size dqSize
	for _, r := range reqs {
		size.maxCount += r.max
		size.scan += q.scanLimit(r.max)
	}
	size.scan = min(size.scan, maxScanLimit)
	// A variant gives at most maxCount runs: promoting more of it than
	// that (or than PromoteLimit) serves nothing more.
	size.promote = min(len(reqs)*q.cfg.PromoteLimit, max(q.cfg.PromoteLimit, size.maxCount))
	now := q.now()
	var c corrupt
	runs, _, err := q.serve(ctx, reqs[0].qn, nil, size, now, false, &c, 0)
	out := make([]dequeueResult, len(reqs))
	for i, r := range reqs {
		if err != nil {
			out[i] = dequeueResult{err: err, now: now}
			continue
		}
		k := min(r.max, len(runs))
		out[i] = dequeueResult{runs: runs[:k:k], now: now}
		runs = runs[k:]
	}
	out[0].corrupt = c
	return out
}

func (q *Queue) scanLimit(maxCount int) int {
	if q.cfg.ScanLimit > 0 {
		return q.cfg.ScanLimit
	}
	return max(30, 3*maxCount)
}

// dequeueQueue runs the dequeue script of the flag state: one round trip.
// The script derives the keys of the variants it serves from their
// members (keys.Queue.VariantBase), in the queue's hash slot.
func (q *Queue) dequeueQueue(ctx context.Context, n *queueNames, maxCount int, now int64) ([]*Run, error) {
	runs, _, err := q.settleAndDequeue(ctx, n, nil, q.sizeOf(maxCount), now, true)
	return runs, err
}

// settleAndDequeue acks acks (runs of qk) and dequeues up to size.maxCount
// runs of qk in one script call (more when it served runs whose records do
// not parse: see serve); ackErrs[i] says what became of acks[i].
// observe: tell the Observer (a coalesced send leaves it to each caller).
func (q *Queue) settleAndDequeue(ctx context.Context, n *queueNames, acks []*Run, size dqSize, now int64, observe bool) ([]*Run, []error, error) {
	var c corrupt
	runs, ackErrs, err := q.serve(ctx, n, acks, size, now, observe, &c, 0)
	if observe {
		q.reportCorrupt(n.qk, &c, now)
	}
	return runs, ackErrs, err
}

// corrupt is what the script calls of one dequeue took and did not
// deliver, for the Observer: runs served with records that do not parse,
// and runs expired for their TTL. A coalesced send reports them in its
// first caller's goroutine.
type corrupt struct {
	runs    []*Run // served (no payload; AvailableAt the call's time)
	killed  int    // of them dead-lettered at once (killCorrupt)
	expired int    // runs taken whose TTL had passed, deleted by the call
}

// reportCorrupt tells the Observer of c: each run as dequeued (with no
// wait: its time is not known) and, those dead-lettered at once, as nacked
// to the dead letter; one whose kill failed is reported by the lease
// recovery that dead-letters it (Recovered), so the Observer's dequeued
// runs still equal the acked, nacked and recovered.
func (q *Queue) reportCorrupt(qk keys.Queue, c *corrupt, now int64) {
	if !q.observe {
		return
	}
	if c.expired > 0 {
		q.cfg.Observer.Expired(qk.Env.Name(), qk.Name(), c.expired)
	}
	if len(c.runs) == 0 {
		return
	}
	q.cfg.Observer.Dequeued(c.runs, time.UnixMilli(now))
	for range c.killed {
		q.cfg.Observer.Nacked(qk.Env.Name(), qk.Name(), false)
	}
}

// maxCorruptCalls bounds the script calls a dequeue makes again after
// calls that served runs whose records do not parse. Each such call takes
// at least one of them out of the ready sets, so the calls end anyway when
// they are all out; the bound keeps one dequeue to at most 65 script
// calls and as many kill pipelines (a coalesced call, once sent, waits for
// its reply whatever its callers' cancels say), leaving the rest to the
// next: a call of maxCount behind more than 65 x maxCount such runs may
// return short (a DequeueWait then waits its poll interval). (1,024 made
// a cancelled Dequeue wait 3 s at 1 ms a round trip: helper-140.)
const maxCorruptCalls = 64

// killCorrupt dead-letters runs just served whose records do not parse (a
// hand edit, a writer's bug), by their delivery tokens, in one pipeline:
// there is nothing to deliver, and they cannot be retried. Each keeps its
// record as it is (ErrCorruptRecord); one whose call fails stays held
// until lease recovery dead-letters it. It returns how many of bad it
// dead-lettered. The members of n's ready sets served in raw (added by
// hand) go in the same pipeline by their names as stored: each hold is
// released (the call answers ErrNotFound when there is no record, or the
// record is another variant's run, which is left as it is; a record of its
// own is dead-lettered as it is, which DeadLetters does not list and
// PurgeDeadLetters removes). Not released, such a member's key and env
// slots stayed taken for ever, its lease never recovered (RecoverLeases
// now recovers it too), and the call that served it failed whole, leaving
// the good runs it took held until their leases passed.
func (q *Queue) killCorrupt(ctx context.Context, n *queueNames, bad []*Run, raw []servedRaw, now int64) int {
	calls := make([]call, 0, len(bad)+len(raw))
	for _, r := range bad {
		calls = append(calls, q.requeueCall(r.ref(), r.Token, now, now, true))
	}
	for _, r := range raw {
		calls = append(calls, q.requeueCallRaw(n, r.rawRef, r.token, now, now, true, q.cfg.MaxAttempts))
	}
	cmds, _ := runPipelined(ctx, q.rdb, calls)
	killed := 0
	for _, cmd := range cmds[:min(len(cmds), len(bad))] {
		if cmd.Err() == nil {
			killed++
		}
	}
	return killed
}

// serve is settleAndDequeue's script call, made again (depth: how many
// times) while the runs it serves include some whose records do not parse
// and fewer than size.maxCount good ones: those are dead-lettered
// (killCorrupt) and counted in c, and a call that served only such runs
// must not read as an idle queue (a blocking dequeue or a Worker would
// wait a poll interval before the next call). So is a call that took runs
// past their TTL (the script expired them: counted in c), so that each
// caller of a coalesced send gets its runs while runs are ready.
func (q *Queue) serve(ctx context.Context, n *queueNames, acks []*Run, size dqSize, now int64, observe bool, c *corrupt, depth int) ([]*Run, []error, error) {
	if err := checkNow(now); err != nil {
		return nil, nil, err
	}
	qk := n.qk
	lim, limErr := q.cfg.limitsFor(qk.Env.Name(), qk.Name())
	if limErr != nil {
		if len(acks) == 0 {
			return nil, nil, limErr
		}
		// The acks do not depend on the limits: the call makes them and
		// serves nothing (an ack-only call, as AckAndDequeue's maxCount
		// 0), so that finished runs are not delivered again while the
		// configuration is wrong; their results come with the error.
		lim, size = Limits{}, q.sizeOf(0)
	}
	look := 0
	if q.looksForGated(lim) {
		look = 1
	}
	ks := n.dequeue
	lease := now + ms(q.cfg.LeaseDuration)
	args := make([]any, 0, 19+3*len(acks))
	args = append(args, now, size.maxCount, lim.Env, lim.Queue, lim.Key, lease, n.member,
		n.runPrefix, ms(q.cfg.PriorityStep), size.scan, size.promote,
		n.vbase, len(acks))
	for _, r := range acks {
		args = append(args, keys.VariantMember(r.Key), keys.Segment(r.ID), r.Token)
	}
	if q.cfg.VtimeScheduling {
		args = append(args, ms(q.cfg.StateTTL), q.cfg.IdleMaxEntries, q.cfg.WindowMultiplier, look)
		if lim.Env > 0 {
			// (the env's waiting line: lua/lib/envwait.lua)
			ks = n.dqVtime
			life := q.waitingLife()
			if size.leave {
				life = -1
			}
			args = append(args, n.wake, life, ms(q.leaveGrace))
		} else {
			ks = n.dqVtime[: len(n.dqVtime)-2 : len(n.dqVtime)-2]
		}
	}
	res, err := run(ctx, q.rdb, q.scripts.dequeue, ks, args...).Slice()
	if err != nil {
		return nil, nil, scriptError(err, nil)
	}
	// A flag-on call that found the scheduler state broken (ckVtime lost
	// without its hash: deleted by hand, evicted) dropped it and served
	// nothing; its first value is then -1 - the acks. The state starts
	// again at the next call, made here at once (its acks are done).
	reset := false
	if n, ok := res[0].(int64); ok && n < 0 {
		reset, res[0] = true, -1-n
	}
	runs, gone, bad, raw, expired, swept, ackErrs, err := decodeDequeue(qk, res, lease, len(acks))
	c.expired += expired + swept
	if len(gone) > 0 {
		// Served without a record (evicted): nothing to deliver, so their
		// slots are freed at once; should this fail, lease recovery frees
		// them.
		_, _ = q.ackMany(ctx, gone, false)
	}
	if len(bad) > 0 || len(raw) > 0 {
		for _, r := range bad {
			r.AvailableAt = time.UnixMilli(now)
		}
		c.runs = append(c.runs, bad...)
		c.killed += q.killCorrupt(ctx, n, bad, raw, now)
	}
	if err == nil && q.observe && observe {
		// Every dequeue path (shard, blocking, fused with acks) ends here,
		// once per script call, so each run is reported exactly once (the
		// coalesced ones in their callers: see dequeueCoalesced).
		if n := ackedCount(res, len(acks)); n > 0 {
			q.cfg.Observer.Acked(qk.Env.Name(), qk.Name(), n)
		}
		if len(runs) > 0 {
			q.cfg.Observer.Dequeued(runs, time.UnixMilli(now))
		}
	}
	if reset && err == nil {
		runs, _, err = q.serve(ctx, n, nil, size, now, observe, c, depth)
	} else if err == nil && depth < maxCorruptCalls && len(bad)+len(raw)+expired > 0 && len(runs) < size.maxCount {
		next := dqSize{maxCount: size.maxCount - len(runs), scan: size.scan, promote: size.promote}
		if len(bad)+len(raw) == 0 {
			// (for runs past their TTL, a call of the rest, as the model
			// makes it: vtime's Dequeue of the rest scans for its count)
			next = q.sizeOf(next.maxCount)
		}
		more, _, merr := q.serve(ctx, n, nil, next, now, observe, c, depth+1)
		runs = append(runs, more...)
		if len(runs) == 0 {
			// (runs served by the first call go out with a nil error:
			// a caller that dropped them would leave them held)
			err = merr
		}
	}
	if err == nil {
		err = limErr
	}
	return runs, ackErrs, err
}

// waitingLife is how long (ms) the mark of a flag-on dequeue that the env's
// limit held stays live without being renewed (lua/lib/envwait.lua): two
// poll intervals and a second, so that a consumer that waits between its
// calls keeps its place while it waits.
func (q *Queue) waitingLife() int64 { return ms(2*q.cfg.BlockPollInterval + time.Second) }

// defaultLeaveGrace is the env's waiting line's leaving grace
// (lua/lib/envwait.lua): a mark with no more of its life left is passed
// over when the env's free slots are left to the queues that wait, and a
// consumer that leaves (leaveLine) cuts its queue's mark to it, time for
// the queue's other consumers, woken, to renew the mark in its place. Half
// of the second a mark lives past two poll intervals, so that a waiter's
// mark, renewed at least once a poll, is never passed over for it.
const defaultLeaveGrace = 500 * time.Millisecond

// leaveLine tells the env's waiting line (lua/lib/envwait.lua) that a
// consumer of env/queue stops or cannot take runs now (a Worker's graceful
// Shutdown, a Worker whose handlers are all busy, a DequeueWait that
// returns empty): the queue's mark, if it has one, is cut to the leaving
// grace, so that the env's free slots go to the queues behind it at once
// and the queue's other consumers, woken, renew it in its place; with none
// left, it lapses after the grace. Before, every free slot of the env was
// left to the mark for the rest of its life (two poll intervals and a
// second) whether or not its consumer could take runs. The call carries
// acks (runs of env/queue, at most 1,000), whose results it returns as
// AckMany would; it serves nothing. Callers ask leavesLine first. Best
// effort: the mark lapses by itself.
func (q *Queue) leaveLine(ctx context.Context, qn *queueNames, acks []*Run) ([]error, error) {
	size := q.sizeOf(0)
	size.leave = true
	_, ackErrs, err := q.settleAndDequeue(ctx, qn, acks, size, q.now(), true)
	return ackErrs, err
}

// leavesLine says whether a consumer of env/queue leaves its env's waiting
// line (leaveLine): with the flag on and an env limit (the line is kept
// then only).
func (q *Queue) leavesLine(env, queue string) bool {
	if !q.cfg.VtimeScheduling {
		return false
	}
	lim, err := q.cfg.limitsFor(env, queue)
	return err == nil && lim.Env > 0
}

// ackedCount is how many of the acks of a dequeue script's reply were
// acked by this call (1), leaving out those gone already (0) and errors.
func ackedCount(res []any, acks int) int {
	n := 0
	for _, v := range res[1 : 1+acks] {
		if v == int64(1) {
			n++
		}
	}
	return n
}

// AckAndDequeue acks acks and then dequeues up to maxCount runs of one base
// queue, in one script call: a worker's loop costs one round trip per
// batch. Every run of acks must belong to env and queue. ackErrs[i] says
// what became of acks[i], as AckMany does; maxCount may be 0 (acks only).
// The runs acked free their slots for the dequeue of the same call. When
// Config.LimitsFor refuses the queue's limits (a negative one), the acks
// are still made, alone, and their results come with that *InvalidError.
// At most 1,000 acks a call (more is an *InvalidError, nothing done).
func (q *Queue) AckAndDequeue(ctx context.Context, acks []*Run, env, queue string, maxCount int) ([]*Run, []error, error) {
	runs, ackErrs, err := q.ackAndDequeue(ctx, acks, env, queue, maxCount)
	return runs, goneIsAcked(ackErrs), err
}

// ackAndDequeue is AckAndDequeue with errGoneBefore for the acks that found
// their run gone.
func (q *Queue) ackAndDequeue(ctx context.Context, acks []*Run, env, queue string, maxCount int) ([]*Run, []error, error) {
	if err := checkQueue(env, queue); err != nil {
		return nil, nil, err
	}
	if maxCount != 0 {
		if err := q.checkMaxCount(maxCount); err != nil {
			return nil, nil, err
		}
	}
	if len(acks) > maxBatch {
		return nil, nil, invalid("acks", "%d runs, at most %d", len(acks), maxBatch)
	}
	for _, r := range acks {
		if err := checkRun(r); err != nil {
			return nil, nil, err
		}
		if r.Env != env || r.Queue != queue {
			return nil, nil, invalid("acks", "run %q belongs to %s/%s, not %s/%s", r.ID, r.Env, r.Queue, env, queue)
		}
	}
	return q.settleAndDequeue(ctx, q.names(env, queue), acks, q.sizeOf(maxCount), q.now(), true)
}

func variantOf(qk keys.Queue, member string) (keys.Variant, error) {
	ck, err := keys.DecodeVariantMember(member)
	if err != nil {
		return keys.Variant{}, fmt.Errorf("runqueue: corrupt variant member %q in %s: %w", member, qk.CkIndex(), err)
	}
	return qk.Variant(ck), nil
}

func union(lists ...[]string) []string {
	seen := map[string]bool{}
	var out []string
	for _, l := range lists {
		for _, m := range l {
			if !seen[m] {
				seen[m] = true
				out = append(out, m)
			}
		}
	}
	return out
}

// servedRaw is a member a dequeue served that is not one of the queue's
// runs as runqueue wrote it (its encoded id or variant member does not
// decode, or its record is another variant's), with its delivery token.
type servedRaw struct {
	rawRef
	token int64
}

// decodeDequeue reads a dequeue script's reply (lua/lib/dequeue.lua,
// dq_finish): the acks' results, then four values per run. A run served
// without a record (its queue's runs hash was evicted, Config.AllowEviction)
// is in gone, one whose record does not parse in bad, one whose id or
// variant member does not decode, or whose record is another variant's (a
// ready-set member runqueue did not write: a hand edit), in raw, none of
// those in runs.
func decodeDequeue(qk keys.Queue, res []any, lease int64, acks int) (runs, gone, bad []*Run, raw []servedRaw, expired, swept int, ackErrs []error, err error) {
	if len(res) < 1+acks || (len(res)-1-acks)%4 != 0 {
		return nil, nil, nil, nil, 0, 0, nil, fmt.Errorf("runqueue: dequeue returned %d values", len(res))
	}
	if acks > 0 {
		ackErrs = make([]error, acks)
		for i := range ackErrs {
			switch v := res[1+i]; v {
			case int64(1):
			case int64(0):
				ackErrs[i] = errGoneBefore
			default:
				ackErrs[i] = heldError(v)
			}
		}
	}
	res = res[1+acks:]
	runs = make([]*Run, 0, len(res)/4)
	for i := 0; i < len(res); i += 4 {
		encID, _ := res[i].(string)
		member, _ := res[i+1].(string)
		rec, hasRec := res[i+2].(string)
		tok, _ := res[i+3].(int64)
		switch tok {
		case 0:
			// Taken past its TTL: the script deleted it (no token is 0).
			expired++
			continue
		case -1:
			// Swept at its key's head, past its TTL: deleted, no serve.
			swept++
			continue
		}
		id, err := keys.DecodeSegment(encID)
		ck, kerr := keys.DecodeVariantMember(member)
		if err != nil || kerr != nil {
			raw = append(raw, servedRaw{rawRef{encID: encID, vm: member}, tok})
			continue
		}
		if !hasRec && res[i+2] == nil {
			gone = append(gone, &Run{Env: qk.Env.Name(), Queue: qk.Name(), Key: ck, ID: id, Token: tok})
			continue
		}
		r, ok := parseRecord(rec)
		if !ok {
			bad = append(bad, &Run{Env: qk.Env.Name(), Queue: qk.Name(), Key: ck, ID: id, Token: tok})
			continue
		}
		if r.vm != member {
			// Another key's run: its id added by hand to this key's ready
			// set. Not delivered (its ack would settle the other key's
			// run); its hold is released by the names served (requeue.lua
			// leaves the other run as it is).
			raw = append(raw, servedRaw{rawRef{encID: encID, vm: member}, tok})
			continue
		}
		runs = append(runs, &Run{Env: qk.Env.Name(), Queue: qk.Name(), Key: ck, ID: id, Payload: []byte(r.payload),
			Attempt: r.att, Priority: r.pr, AvailableAt: time.UnixMilli(r.at), Token: tok,
			LeaseDeadline: time.UnixMilli(lease)})
	}
	return runs, gone, bad, raw, expired, swept, ackErrs, nil
}

// DequeueShard serves up to maxCount ready runs from the queues of one shard
// (see ShardOf), whatever an env's backlog. A call plans one queue per env
// with due work on the shard, then the envs' other queues, and gives each
// env of its plan an even share of maxCount, shared evenly among the env's
// queues (so an env with backlogs in several queues takes no more than one
// with a backlog in one), an env's queues taking turns at its share when
// it is smaller than their number (the least recently served first, those
// never served by when a call first read them, then the oldest work
// first), so that neither a queue's old backlog nor its runs written in
// the same millisecond as another queue's hold the env's other queues (a
// priority orders runs within a queue, not a queue among its env's);
// the runs that do not divide go
// to the envs this Queue has served least on the shard (a credit of runs
// served, ties the least recently served first). What a queue leaves of its
// share (its queue or keys at their limits, few runs ready) goes to its
// env's queues after it, and what an env leaves to the queues that filled
// theirs and those not reached, the least served envs first, so an env at
// its limit does not hand its share to the env after it, and envs with
// room and backlogs that take their share are served equal runs over a
// window of calls, give or take one or two, whatever their number of
// queues (see serveShard). An env that is at its limits, short of ready
// runs or away from the shard is owed nothing for it when it comes back;
// one that was ahead when it went away comes back ahead by what the envs
// served meanwhile have not caught up (at most maxCount runs), so envs
// that come and go do not take more than their share. So a call of
// maxCount at least the number of envs serves every env that has a run it
// may serve, and, while the envs with work on the shard stay the same and
// their queues are among the max(64, 4 x maxCount) a call reads first (see
// below), an env with a ready run within its limits is served within
// ceil(envs / maxCount) calls; an env reached only by the moving read waits
// longer (helper-184: 50 envs in about 106 due queues, calls of 1: 68
// calls at most; 423 queues, 163 of them held or refusing, calls of 10: 46
// where ceil(envs / maxCount) is 16-20). Envs that come and go take
// about their share of the calls they are in (a backlogged env beside
// three plus three envs taking turns to have a run, calls of 3: 25 runs in
// 60 calls, an equal share of the seven envs being 25.7). Envs level in credit go
// least recently served first; an env never served ranks behind those
// served before it was first read. (Each call reads the max(64, 4 x
// maxCount) queues of the shard whose work is oldest, and as many more at
// an offset that moves on by as many each call: an env whose queues are
// all behind those of other envs is first seen within queues / max(64, 4
// x maxCount) calls, and such envs take turns, a call's read keeping
// their places between the calls that read them; envs whose queues are
// read in every call are served more often than those reached only by
// the moving read. A call that the queues it read leave short reads the
// next due queues in master order, up to 3 x max(64, 4 x maxCount) more:
// queues whose work is all held by their limits keep their old scores, and
// 64 of them in front made every other call empty while other queues had
// runs to serve, helper-177; behind more than 4 x that many, a queue is
// reached by the moving read only; the failures of queues these further
// reads reach are passed over, never the call's error, and three of them
// with nothing served end them.) This credit is the Queue's own, in memory, per shard:
// instances sharing a shard each keep their own.
//
// A queue's score in the shard's master is the earliest time it has work
// by the clocks of the instances that wrote it, so ready runs written by an
// instance whose clock is ahead of this Queue's (or before this Queue's
// clock stepped back) are scored in its future. A call therefore also
// reads the first max(64, 4 x maxCount) queues scored in (now, now +
// Config.ShardLookAhead], looks (one more round trip, with a read of each
// of them not found without ready runs at the same score within the last
// second; a queue whose read fails for a reason of its own holds none)
// which of them hold ready runs, and plans those with the due queues,
// after them (envs in turn, even shares); queues whose only work is
// delayed are not served before their time. So an env whose ready runs a
// writer ahead scored in this Queue's future takes its share of every
// call, beside envs whose due work would fill the calls, when its queue
// is among the first max(64, 4 x maxCount) of that window. (Before, such
// queues were served only by calls that the due queues left short, and
// a queue found without ready runs was not looked at again until its
// score: helper-161, an env whose one run was written 30 s ahead, beside
// an env with a backlog, first served 30 s later, at call 300.) A writer
// whose clock is ahead of this Queue's by more than
// Config.ShardLookAhead (1m by default) hides its ready runs from
// DequeueShard for the excess.
//
// The queues are served one script call each. When a call fails after
// others served runs (ctx ended between them, or a queue's call failed for
// a reason not the queue's own: see below), DequeueShard stops there and returns the runs served with a nil error:
// they are in flight for the caller, and a caller that dropped them on an
// error would leave them held for a whole lease. A failure that is the
// queue's own (queueFault: a LimitsFor the Queue refuses for it, a key of
// the wrong type, a script error on its data) does not stop the call: the
// call goes on with the other queues, and for a second the queue is looked
// at after every other queue of a call's read, with what they leave; so a
// queue whose calls keep failing cannot stop or slow the others of its env
// or shard. A call that has passed over three such failures with nothing
// served stops there (a refusal of every queue that does not read as the
// server's: an ACL without scripting, say), but the failures of queues
// that failed within the last five seconds do not stop a call before the
// other queues are tried (of those, while nothing is served, it tries
// three): so queues that keep failing stop only the first calls that meet
// them, or one whose other queues serve nothing, while the shard's calls
// come less than five seconds apart (before, failing queues of
// three envs came back first once a second, the envs that served nothing
// ranking first, and stopped a call: helper-164, 4 calls of 63). A call's error (the first such failure, or what stopped it) is
// returned when nothing else is served; a Worker logs a queue's failure
// (at most once a second for each of its sources) and serves on.
func (q *Queue) DequeueShard(ctx context.Context, shard, maxCount int) ([]*Run, error) {
	runs, fault, err := q.dequeueShard(ctx, shard, maxCount, nil)
	switch {
	case len(runs) > 0:
		return runs, nil
	case err != nil:
		return nil, err
	}
	return nil, fault
}

// dequeueShard is DequeueShard, but a call that fails after others served
// runs returns both (the Worker hands the runs out and logs the error),
// and fault is the first failure of a queue's own that the call passed
// over (the Worker logs it, and does not count it as its fetch's). visit,
// when not nil, is told of each queue's call that went through, and
// whether it got fewer runs than it asked for (it may have marked the
// queue in its env's waiting line: a Worker leaves the line for those
// queues when it stops or cannot take runs).
func (q *Queue) dequeueShard(ctx context.Context, shard, maxCount int, visit func(qn *queueNames, short bool)) (runs []*Run, fault, err error) {
	if err := q.checkShard(shard); err != nil {
		return nil, nil, err
	}
	if err := q.checkMaxCount(maxCount); err != nil {
		return nil, nil, err
	}
	if q.cfg.ReadOnly {
		// Refused whether or not the shard holds work to serve.
		return nil, nil, ErrReadOnly
	}
	now := q.now()
	sh := q.space.Shard(shard)
	// The oldest due queues, and as many more at a rotating offset, so that
	// an env whose queues all sort behind another env's many queues is
	// still reached within a bounded number of calls.
	n := int64(max(64, 4*maxCount))
	q.rrMu.Lock()
	off := q.shardOff[shard]
	q.rrMu.Unlock()
	nowS := strconv.FormatInt(now, 10)
	due := &redis.ZRangeBy{Min: "-inf", Max: nowS, Count: n}
	rot := &redis.ZRangeBy{Min: "-inf", Max: nowS, Offset: off, Count: n}
	var oldest, rotating *redis.StringSliceCmd
	var ahead *redis.ZSliceCmd
	if _, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		oldest = p.ZRangeByScore(ctx, sh.Master(), due)
		if off > 0 {
			rotating = p.ZRangeByScore(ctx, sh.Master(), rot)
		}
		if look := q.shardLookAhead(); look > 0 {
			// Queues scored after now: those with ready runs are served
			// if the due ones leave room (see DequeueShard).
			ahead = p.ZRangeByScoreWithScores(ctx, sh.Master(),
				&redis.ZRangeBy{Min: "(" + nowS, Max: strconv.FormatInt(now+look, 10), Count: n})
		}
		return nil
	}); err != nil {
		return nil, nil, err
	}
	members := oldest.Val()
	next := off + n
	if rotating != nil {
		members = union(members, rotating.Val())
		if int64(len(rotating.Val())) < n {
			next = 0
		}
	} else if int64(len(members)) < n {
		next = 0
	}
	q.rrMu.Lock()
	q.shardOff[shard] = next
	q.rrMu.Unlock()
	if ahead != nil && len(ahead.Val()) > 0 {
		// The queues scored after now that hold ready runs are planned with
		// the due ones, after them (see DequeueShard).
		ready, err := q.readyMembers(ctx, ahead.Val(), members, now)
		if err != nil {
			return nil, nil, err
		}
		members = append(members, ready...)
	}
	f := shardFaults{visit: visit}
	t := shardTally{served: map[string]int{}, short: map[string]bool{}, queues: map[string]bool{}, failed: map[string]bool{}}
	defer q.shardCommit(shard, &t, maxCount)
	out, err := q.serveShard(ctx, shard, members, maxCount, now, &f, &t, nil)
	if err != nil {
		return out, f.first, err
	}
	// The call's error is decided by what its first read met (nothing
	// served and shardFaultsMax failures: a stop), unless the further
	// reads serve.
	stop := shardStop(out, &f)
	if len(out) >= maxCount || int64(len(oldest.Val())) < n {
		return out, f.first, stop
	}
	// Short, and more due queues than the oldest read: the next ones in
	// master order, up to shardLookMore reads of n more (queues the call
	// read already left out), while the call stays short. Queues whose
	// work is all held by their limits keep their old scores, so without
	// this a call whose read held only such queues came back empty while
	// other queues of the shard had runs it could serve (helper-177: 64
	// held queues in front of an env's ready runs, every other
	// DequeueShard(0, 10) empty, each DequeueShardWait sleeping its poll
	// interval).
	seen := make(map[string]bool, len(members))
	for _, m := range members {
		seen[m] = true
	}
	f.further = true
	for k := int64(1); k <= shardLookMore && len(out) < maxCount && !f.furtherDone(len(out)); k++ {
		more, err := q.rdb.ZRangeByScore(ctx, sh.Master(),
			&redis.ZRangeBy{Min: "-inf", Max: nowS, Offset: k * n, Count: n}).Result()
		if err != nil {
			return out, f.first, err
		}
		var fresh []string
		for _, m := range more {
			if !seen[m] {
				seen[m] = true
				fresh = append(fresh, m)
			}
		}
		if len(fresh) > 0 {
			// (out: what the call served counts for its faults, as in one
			// pass; helper-179: from an empty start, a further pass that
			// served nothing after three failures stopped the call with an
			// error beside its runs.)
			out, err = q.serveShard(ctx, shard, fresh, maxCount, now, &f, &t, out)
			if err != nil {
				return out, f.first, err
			}
		}
		if int64(len(more)) < n {
			break
		}
	}
	if len(out) > 0 {
		stop = nil
	}
	return out, f.first, stop
}

// shardStop is a shard call's error when its first read has served
// nothing and passed over as many failures as stop a call (the queues'
// calls that were known to fail do not stop a call before the others are
// tried; see shardQueue): the first of them. The further reads' failures
// never make the call's error: they are passed over (helper-181: three
// failing queues spread over the further reads behind held queues made
// every call a Worker's failed fetch, where each read of 64 before met
// one), and shardFaultsMax of them with nothing served end the further
// reads (f.furtherDone; a refusal of every queue, an ACL without
// scripting, tries that many more).
func shardStop(out []*Run, f *shardFaults) error {
	if len(out) == 0 && f.n >= shardFaultsMax {
		return f.first
	}
	return nil
}

// shardLookMore is how many further reads of max(64, 4 x maxCount) due
// queues a shard call that its first read left short makes at most (see
// dequeueShard).
const shardLookMore = 3

// readyMembers returns the members of z (master entries of a shard scored
// after now, in order) that hold ready runs, leaving out those of seen (see
// aheadReady).
func (q *Queue) readyMembers(ctx context.Context, z []redis.Z, seen []string, now int64) ([]string, error) {
	done := make(map[string]bool, len(seen))
	for _, m := range seen {
		done[m] = true
	}
	cand := make([]redis.Z, 0, len(z))
	for _, e := range z {
		if m, _ := e.Member.(string); !done[m] {
			cand = append(cand, e)
		}
	}
	ready, _, err := q.aheadReady(ctx, cand, now)
	if err != nil {
		return nil, err
	}
	var out []string
	for i, e := range cand {
		if ready[i] {
			out = append(out, e.Member.(string))
		}
	}
	return out, nil
}

// aheadReady says which of the master entries z (scored after now, read by
// a shard look-ahead) hold ready runs, reading (one pipeline, see readyOf)
// only those not known to hold none. An entry found without a ready run
// is remembered with its score and not read again while it keeps that
// score (a ready run scored before it would lower it: the master's ZADD
// LT), for aheadRecheck, and until now reaches the score, when the queue
// is due anyway; so a shard whose look-ahead window holds delayed work only
// (a retry backing off) pays the read about once a second per queue, not
// at every call (when one entry's trust runs out the others of z are read
// with it, so that their marks are set at one time). A ready run scored after such an entry's score (by a
// writer whose clock is further ahead than the entry's work is away)
// waits at most aheadRecheck: remembered until the score, it waited until
// then, up to ShardLookAhead (helper-161: a run written 45 s ahead beside
// a retry due in 30 s, served 30 s late). recheck is when the first of
// the entries of z trusted so is looked at again (math.MaxInt64 for none).
// Entries that do not decode are not ready (not ours to serve: shardPlan
// skips them too).
func (q *Queue) aheadReady(ctx context.Context, z []redis.Z, now int64) (out []bool, recheck int64, err error) {
	out = make([]bool, len(z))
	recheck = math.MaxInt64
	var look, trusted []int
	// A mark is trusted until its score, for aheadRecheck; one from after
	// now by that much or more: this Queue's clock stepped back (one a
	// little after now, a concurrent call's, is kept).
	aged := func(s aheadMark) bool { return now-s.at >= aheadRecheck }
	fresh := func(s aheadMark) bool { return s.score > now && !aged(s) && s.at-now < aheadRecheck }
	merge := false
	q.rrMu.Lock()
	for i, e := range z {
		m, _ := e.Member.(string)
		s, ok := q.aheadIdle[m]
		if ok && s.score == int64(e.Score) && fresh(s) {
			trusted = append(trusted, i)
			continue
		}
		look = append(look, i)
		merge = merge || (ok && s.score > now && aged(s))
	}
	for m, s := range q.aheadIdle {
		if !fresh(s) {
			delete(q.aheadIdle, m)
		}
	}
	if merge {
		// A mark ran out: the others are read with it, so that their marks
		// are set at one time and a wait (shardNext) wakes once a second
		// for them all, not once for each time a mark was set (helper-164:
		// an idle Worker beside 60 queues marked at different times made
		// 60 shard calls a second).
		look, trusted = append(look, trusted...), nil
	}
	for _, i := range trusted {
		m, _ := z[i].Member.(string)
		recheck = min(recheck, q.aheadIdle[m].at+aheadRecheck)
	}
	q.rrMu.Unlock()
	var idx []int
	var qks []keys.Queue
	for _, i := range look {
		m, _ := z[i].Member.(string)
		env, queue, err := keys.DecodeQueueMember(m)
		if err != nil {
			continue
		}
		idx = append(idx, i)
		qks = append(qks, q.names(env, queue).qk)
	}
	ready, err := q.readyOf(ctx, qks)
	if err != nil {
		return nil, 0, err
	}
	q.rrMu.Lock()
	defer q.rrMu.Unlock()
	for j, i := range idx {
		m, _ := z[i].Member.(string)
		if ready[j] {
			out[i] = true
			delete(q.aheadIdle, m)
		} else {
			q.aheadIdle[m] = aheadMark{score: int64(z[i].Score), at: now}
			recheck = min(recheck, now+aheadRecheck)
		}
	}
	return out, recheck, nil
}

// aheadMark is a master entry a shard look-ahead found without ready runs
// (Queue.aheadIdle): its score then, and when (ms, this Queue's clock).
type aheadMark struct{ score, at int64 }

// aheadRecheck is how long (ms) a shard look-ahead trusts that a queue it
// found without ready runs still has none (see aheadReady).
const aheadRecheck = 1000

// serveShard serves the queues of members (master members of shard: the
// due ones in master order, then those of the look-ahead that hold ready
// runs) for one DequeueShard call; t holds what the call served of each
// env and queue.
//
//   - First, the envs in turn, the least credit first (shardPlan), each
//     an even share of what is left of maxCount fixed when the round
//     starts, the first envs one run more when they do not divide it
//     (envShares), and each env's share to its queues in plan order (its
//     least recently served queue first: shardPlan), even among them: what a queue
//     leaves (its queue or keys at their limits, few runs ready) goes to
//     the env's queues after it, so an env whose oldest queue is capped
//     still takes its share (helper-155: given to that queue alone, an
//     env's share of 1 went unserved in every call). What an env leaves
//     goes to the rounds after, not to the env after it: otherwise the
//     envs after a capped env take its share in every call (5 envs, two
//     at their limits, calls of 10: 78 / 102 / 118 runs to the other
//     three in 30 calls).
//   - Then what is left goes to the queues that filled their share and
//     those the first round did not reach, the latter first in each env
//     (shareLeft): to the envs with
//     the least credit and runs served in the call, only as many as it
//     takes to even them out. A queue that serves less than it was given
//     drops out, and what it left is shared again among the others, until
//     nothing is left or no queue can take more.
//
// Then what is left goes to the queues whose call failed within
// shardFailBack, in turn. out holds the runs the call served before (an
// earlier read's; see dequeueShard): maxCount is the call's, and they
// count as served for its faults; it returns them with the new ones.
func (q *Queue) serveShard(ctx context.Context, shard int, members []string, maxCount int, now int64,
	f *shardFaults, t *shardTally, out []*Run) ([]*Run, error) {
	plan, env, credit, nfirst, late, back := q.shardPlan(shard, members)
	for _, e := range env[:nfirst] {
		t.served[e] += 0 // read by the call
	}
	for _, qn := range plan {
		if _, ok := t.queues[qn.member]; !ok {
			t.queues[qn.member] = false // planned by the call
		}
	}
	// visit serves plan[i] up to share runs, and returns how many it served.
	visit := func(i, share int) (int, error) {
		failed := f.n
		runs, err := q.shardQueue(ctx, plan[i], share, now, back[plan[i].member], f, len(out))
		out = append(out, runs...)
		t.served[env[i]] += len(runs)
		t.visited(plan[i].member, len(runs), f.n > failed)
		return len(runs), err
	}
	var filled, unreached []int // plan indexes
	if left := maxCount - len(out); left > 0 && len(plan) > 0 {
		for _, g := range envShares(env, left) {
			rest := g.share
			for k, i := range g.queues {
				// What the env's queues before it left, even among the rest.
				share := (rest + len(g.queues) - k - 1) / (len(g.queues) - k)
				if share == 0 {
					unreached = append(unreached, i)
					continue
				}
				n, err := visit(i, share)
				if err != nil {
					return out, err
				}
				rest -= n
				if n == share {
					filled = append(filled, i)
				}
			}
			if rest > 0 {
				t.short[g.env] = true
			}
		}
	}
	// The envs in plan order (the least credit first); in each, the queues
	// not visited yet before those that filled their share (which may have
	// served their last ready run).
	rank := make(map[string]int, nfirst)
	for i, e := range env[:nfirst] {
		rank[e] = i
	}
	cand := slices.Concat(unreached, filled)
	slices.SortStableFunc(cand, func(a, b int) int { return rank[env[a]] - rank[env[b]] })
	for len(cand) > 0 && len(out) < maxCount {
		given := shareLeft(cand, env, func(e string) int { return credit[e] + t.served[e] }, maxCount-len(out))
		var more []int
		for j, i := range cand {
			if given[j] == 0 {
				more = append(more, i)
				continue
			}
			n, err := visit(i, given[j])
			if err != nil {
				return out, err
			}
			if n == given[j] {
				more = append(more, i)
			} else {
				t.short[env[i]] = true
			}
		}
		cand = more
	}
	for _, qn := range late {
		if len(out) >= maxCount {
			break
		}
		failed := f.n
		runs, err := q.shardQueue(ctx, qn, maxCount-len(out), now, true, f, len(out))
		t.visited(qn.member, len(runs), f.n > failed)
		if err != nil {
			return out, err
		}
		out = append(out, runs...)
	}
	return out, nil
}

// envShare is one env's part of a shard call's first round (envShares):
// share runs for its queues (plan indexes, in plan order).
type envShare struct {
	env    string
	share  int
	queues []int
}

// envShares is the first round's shares of left runs (see serveShard) for
// a plan whose queues' envs are env: each env an even share, the envs met
// first in the plan (the least credit first) one run more when the envs do
// not divide left. serveShard gives an env's share to its queues in plan
// order, even among them, what one leaves going to those after it. So an
// env with backlogs in several queues takes no more of a call than an env
// with one, and one whose first queue is at its limits still takes its
// share from its other queues.
func envShares(env []string, left int) []envShare {
	envs, queues := groupFirstMet(len(env), func(i int) string { return env[i] })
	out := make([]envShare, len(envs))
	base, extra := left/len(out), left%len(out)
	for k := range out {
		out[k] = envShare{env: envs[k], share: base, queues: queues[k]}
		if k < extra {
			out[k].share++
		}
	}
	return out
}

// groupFirstMet groups 0..n-1 by key(i): the keys in the order first met,
// and each one's indexes in ascending order.
func groupFirstMet(n int, key func(int) string) (keys []string, groups [][]int) {
	at := map[string]int{}
	for i := range n {
		k := key(i)
		g, ok := at[k]
		if !ok {
			g = len(keys)
			at[k] = g
			keys = append(keys, k)
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return keys, groups
}

// shareLeft shares left runs among the queues cand (plan indexes; env
// gives each one's env), by env: it raises the envs of least key to a
// common level, as many as left takes (the others get nothing), those at
// the level taking what does not divide, the first in cand first. An
// env's runs are shared evenly among its queues in cand, the first first.
// given[j] is cand[j]'s.
func shareLeft(cand []int, env []string, key func(string) int, left int) (given []int) {
	type envLeft struct {
		env      string
		key, get int
		queues   []int // indexes in cand
	}
	names, queues := groupFirstMet(len(cand), func(j int) string { return env[cand[j]] })
	envs := make([]*envLeft, len(names))
	for k, e := range names {
		envs[k] = &envLeft{env: e, key: key(e), queues: queues[k]}
	}
	sorted := slices.Clone(envs)
	slices.SortStableFunc(sorted, func(a, b *envLeft) int { return a.key - b.key })
	// The level: the first n envs raised to level take all of left.
	n, cost := 1, 0 // cost: what raising the first n to sorted[n-1].key takes
	for n < len(sorted) {
		next := cost + n*(sorted[n].key-sorted[n-1].key)
		if next >= left {
			break
		}
		cost = next
		n++
	}
	level, rem := sorted[n-1].key+(left-cost)/n, (left-cost)%n
	for _, e := range envs { // in cand order: the first at the level take rem
		if e.key > sorted[n-1].key {
			continue
		}
		e.get = level - e.key
		if rem > 0 {
			e.get++
			rem--
		}
	}
	given = make([]int, len(cand))
	for _, e := range envs {
		base, extra := e.get/len(e.queues), e.get%len(e.queues)
		for k, j := range e.queues {
			given[j] = base
			if k < extra {
				given[j]++
			}
		}
	}
	return given
}

// shardTally is what one DequeueShard call served: the runs of each env
// the call read (served; envs with none at 0), the envs one of whose
// queues served less than it was given (short), the queues the call
// planned or visited (queues: master member -> served a run), and those
// whose call failed for a reason of their own (failed).
type shardTally struct {
	served map[string]int
	short  map[string]bool
	queues map[string]bool
	failed map[string]bool
}

// visited records a queue's visit (master member m): it served n runs, or
// its call failed for a reason of its own.
func (t *shardTally) visited(m string, n int, failed bool) {
	switch {
	case failed:
		t.failed[m] = true
	case n > 0:
		t.queues[m] = true
	}
}

// shardCredit is a shard's credit of envs (see shardCommit).
type shardCredit struct {
	calls uint64 // the shard's calls committed
	// base: the credit taken off the envs read, over the shard's calls
	// (each call's least).
	base int64
	env  map[string]envCredit
	// queue: the turn of each queue the shard's calls planned (master
	// member; as envCredit.turn), which orders an env's queues in a call's
	// plan (shardPlan).
	queue map[string]uint64
}

// envCredit is an env's credit and turn in a shard. runs is its credit as
// of base when written (credit + base): an env the calls since did not
// read comes back with what is left of it once the least credits taken
// off meanwhile are taken off it too (credit), so one back after a call
// or two is about as far ahead as it left, one back much later level.
// turn ranks envs level in credit, the least first: 2c for an env the
// shard's call c last served, 2c - 1 for one first read by call c and not
// served since; kept for envs a call does not read, so that an env reached
// only now and then (through the rotating read, or when it has runs)
// keeps its place: least recently served first, and one never served
// behind those served before it was first read.
type envCredit struct {
	runs int64
	turn uint64
}

// credit is env e's credit now (0 for an env never read, or one the
// others have caught up with since).
func (sc *shardCredit) credit(e string) int {
	return int(max(0, sc.env[e].runs-sc.base))
}

// turnAt is env e's turn (envCredit.turn) as of the shard's call c: 2c
// when c serves it, 2c - 1 when c is the first call to read it, else the
// turn it kept.
func (sc *shardCredit) turnAt(e string, c uint64, served bool) uint64 {
	ec, known := sc.env[e]
	return turnAt(ec.turn, known, c, served)
}

// queueTurnAt is queue m's turn (a master member; see shardCredit.queue)
// as of the shard's call c, as turnAt is an env's.
func (sc *shardCredit) queueTurnAt(m string, c uint64, served bool) uint64 {
	turn, known := sc.queue[m]
	return turnAt(turn, known, c, served)
}

// turnAt is a turn as of a shard's call c: 2c when c serves it, 2c - 1
// when c is the first call to read it (not known), else the turn it had.
func turnAt(turn uint64, known bool, c uint64, served bool) uint64 {
	switch {
	case served:
		return 2 * c
	case !known:
		return 2*c - 1
	}
	return turn
}

// shardTurnMax bounds a shard's envs (shardCredit.env), and
// shardQueueTurnMax its queues (shardCredit.queue, about 85 bytes each): a
// call that finds more drops those it did not read. A queue whose turn was
// dropped comes back as first read, behind those waiting (so past about
// that many queues a shard, one that only the rotating read reaches may
// lose its place between its reads).
const (
	shardTurnMax      = 1 << 16
	shardQueueTurnMax = 1 << 14
)

// keptFor is m, or, when m is nil or holds more than most entries, those
// of its entries whose keys read (what a call read) holds.
func keptFor[V, R any](m map[string]V, read map[string]R, most int) map[string]V {
	if m != nil && len(m) <= most {
		return m
	}
	kept := make(map[string]V, len(read))
	for k := range read {
		if v, ok := m[k]; ok {
			kept[k] = v
		}
	}
	return kept
}

// shardCommit adds what a call served to its shard's credit. An env that
// served less than it was given (at its limits, short of ready runs) is
// owed nothing: it goes one run behind the most served env that took all
// it was given. Then the least credit is taken off all the envs the call
// read (base), and no credit exceeds maxCount. An env the call did not
// read keeps its credit, less what is taken off the others meanwhile. So
// an env that was at its limits, short of runs or away comes back no
// better than level with the least served env, one that was ahead stays
// ahead only until the others have caught up, and no env is owed more
// than maxCount runs.
func (q *Queue) shardCommit(shard int, t *shardTally, maxCount int) {
	if len(t.served) == 0 {
		return
	}
	q.rrMu.Lock()
	defer q.rrMu.Unlock()
	sc := q.shardCredit[shard]
	if sc == nil {
		sc = &shardCredit{}
		q.shardCredit[shard] = sc
	}
	sc.calls++
	sc.env = keptFor(sc.env, t.served, shardTurnMax)
	sc.queue = keptFor(sc.queue, t.queues, shardQueueTurnMax)
	for m, served := range t.queues {
		sc.queue[m] = sc.queueTurnAt(m, sc.calls, served)
	}
	for m := range t.failed {
		// Back from going late (shardPlan), it is first read again: behind
		// the queues waiting since earlier calls. With the turn it had, a
		// queue whose calls keep failing would come first in its env at
		// every return, and three such stop a call that serves nothing
		// before them (helper-162: 3 calls of 276 failed where none had).
		delete(sc.queue, m)
	}
	credit := make(map[string]int, len(t.served))
	top := -1
	for e, n := range t.served {
		c := sc.credit(e) + n
		credit[e] = c
		if !t.short[e] {
			top = max(top, c)
		}
	}
	for e := range t.short {
		if top >= 0 && credit[e] <= top {
			credit[e] = top + 1
		}
	}
	low := math.MaxInt
	for _, c := range credit {
		low = min(low, c)
	}
	sc.base += int64(low)
	for e, c := range credit {
		sc.env[e] = envCredit{runs: int64(min(c-low, maxCount)) + sc.base, turn: sc.turnAt(e, sc.calls, t.served[e] > 0)}
	}
}

// shardFailBack is how long a queue whose call in a shard dequeue failed
// goes last in its shard's calls (see shardPlan).
const shardFailBack = time.Second

// shardFailForget is how long the mark of a queue whose call in a shard
// dequeue failed is kept, from the failure that set it: past
// shardFailBack the queue is back in its place, and its calls' failures
// are known ones (shardQueue) until it succeeds or this has passed.
const shardFailForget = 5 * time.Second

// shardFaults counts the failures of queues' own that a shard call passed
// over (shardQueue); first is the first of them, known those of queues
// marked when the call planned (failed within shardFailForget).
type shardFaults struct {
	first error
	n     int
	known int
	// further: the call is in its further reads (dequeueShard), whose
	// failures are counted in nFurther too.
	further  bool
	nFurther int
	// visit: see dequeueShard (nil: nobody asks).
	visit func(qn *queueNames, short bool)
}

// furtherDone says whether a shard call's further reads stop: nothing
// served (served runs) and shardFaultsMax failures among them.
func (f *shardFaults) furtherDone(served int) bool {
	return served == 0 && f.nFurther >= shardFaultsMax
}

// shardFaultsMax: a shard call that has passed over this many failures of
// queues' own with nothing served stops at the last, as at any other
// failure. A refusal of every queue that queueFault cannot tell from a
// queue's own (an ACL without scripting, an error reply it does not know)
// then costs a few script calls a call, not one per queue read, and a
// Worker counts it as a failed fetch and backs off.
const shardFaultsMax = 3

// shardQueue is one queue's call of a shard dequeue, after served runs. A
// failure of the queue's own (queueFault) is counted in f and the call
// goes on (no runs, no error), unless it is the shardFaultsMax-th or a
// later one with nothing served and the queue was not marked when the
// call planned (marked: it failed within shardFailForget); the queue is
// marked to go last in
// the shard's calls for shardFailBack (shardPlan, serveShard), unless it
// is late (marked within shardFailBack: the mark keeps its first failure's
// time, so a queue whose calls keep failing comes back in its place, and
// its failure to a Worker's log, once a shardFailBack). A marked queue's
// failure is a known one: it does not stop the call, which tries the
// others (helper-164: failing queues of three envs, back in their place,
// came first, envs that served nothing ranking first, and stopped a call
// about once a second); while nothing is served, a call makes at most
// shardFaultsMax calls of marked queues, and passes over the others; in
// the further reads (dequeueShard) a failure never stops the call, and
// shardFaultsMax of them with nothing served end the reads (furtherDone).
// So a refusal of every queue costs a call 2 x shardFaultsMax + 1 script
// calls at most (helper-182: 7, 3 once every queue read is marked; 4
// before the further reads), and the call's error is decided by its first
// read (shardStop). Any other failure is returned, to stop the call. A
// success clears the mark of a marked queue.
func (q *Queue) shardQueue(ctx context.Context, qn *queueNames, maxCount int, now int64, marked bool,
	f *shardFaults, served int) ([]*Run, error) {
	if (marked && served == 0 && f.known >= shardFaultsMax) || f.furtherDone(served) {
		return nil, nil
	}
	runs, err := q.dequeueQueue(ctx, qn, maxCount, now)
	if err != nil && (ctxEnded(ctx) || !queueFault(err)) {
		return runs, err
	}
	if err == nil {
		if f.visit != nil {
			f.visit(qn, len(runs) < maxCount)
		}
		// Only a queue marked when the call planned can have a mark (no
		// lock on the common path).
		if marked {
			q.rrMu.Lock()
			delete(q.shardFailed, qn.member)
			q.rrMu.Unlock()
		}
		return runs, nil
	}
	q.rrMu.Lock()
	if at, ok := q.shardFailed[qn.member]; !ok || time.Since(at) >= shardFailBack {
		q.shardFailed[qn.member] = time.Now()
	}
	q.rrMu.Unlock()
	f.n++
	if marked {
		f.known++
	}
	if f.further {
		f.nFurther++
	}
	if f.first == nil {
		f.first = err
	}
	if served == 0 && !marked && !f.further && f.n >= shardFaultsMax {
		return nil, err
	}
	return nil, nil
}

// queueFault says whether err, a queue's failure in a shard dequeue, is the
// queue's own: its limits refused (ErrInvalid: Config.LimitsFor), or a
// Redis error reply other than those of a server's state (refusedUnrun's:
// a slot moving or unserved, loading, busy; full, read-only, no replicas,
// unable to persist, a script not loaded): a key of the wrong type, a
// script error on the queue's data, an ACL that refuses its keys. A
// connection's failure, a timeout, or such a state is the shard's, and
// stops the call.
func queueFault(err error) bool {
	if errors.Is(err, ErrInvalid) {
		return true
	}
	var re redis.Error
	if !errors.As(err, &re) || refusedUnrun(err) || isOOM(err) || isNoScript(err) ||
		redis.IsReadOnlyError(err) || redis.IsNoReplicasError(err) {
		return false
	}
	return !strings.HasPrefix(re.Error(), "MISCONF ")
}

// shardPlan orders the queues of a shard for one call: one queue per env
// (each env's first; nfirst of them), envs by credit (the shard's: the
// least first, ties the least recently served first, then in the order
// of their names), then the remaining
// queues. An env's queues go by turn (shardCredit.queue: the least
// recently served first, those never served by the call that first read
// them, a queue first read now behind those), then in master order (the
// oldest work first). In master order alone, queues whose runs were
// written in the same millisecond were served in the order of their names,
// each until its runs of that millisecond were gone, and a queue with an
// old backlog took a place in every call (helper-155: 3 envs x 30 queues,
// calls of 10, 7 of an env's queues served in 60 calls); a queue new in
// every call would pass the others for ever if first reads ranked first,
// as envs did (helper-125). env[i] is plan[i]'s env, credit the shard's
// credit of each env when the call planned. The queues whose call failed
// (a failure of their own) within shardFailBack are not in plan but in
// late, the earliest failure first, served after every other queue
// (serveShard): while a queue keeps failing it takes no share, and no
// place in its env's first round, from the others. back holds the
// queues of plan whose call failed within shardFailForget, before
// shardFailBack: their failures are known ones (shardQueue).
func (q *Queue) shardPlan(shard int, members []string) (plan []*queueNames, env []string,
	credit map[string]int, nfirst int, late []*queueNames, back map[string]bool) {
	type entry struct {
		env, queue string
		rank       int
		turn       uint64 // the queue's (shardCredit.queue)
		failed     time.Time
	}
	q.rrMu.Lock()
	if len(q.shardFailed) > 0 && time.Since(q.shardFailPruned) >= shardFailBack {
		// Pruned here, not only when met (a queue may fail once and never
		// be read again), at most once a shardFailBack (the marks of
		// many failing queues are kept shardFailForget).
		q.shardFailPruned = time.Now()
		for m, at := range q.shardFailed {
			if time.Since(at) >= shardFailForget {
				delete(q.shardFailed, m)
			}
		}
	}
	back = map[string]bool{}
	var failed []entry
	var envs []string
	byEnv := map[string][]entry{}
	credit = map[string]int{}
	turn := map[string]uint64{}
	sc := q.shardCredit[shard]
	if sc == nil {
		sc = &shardCredit{}
	}
	for i, m := range members {
		e, queue, err := keys.DecodeQueueMember(m)
		if err != nil {
			continue // not ours to serve; never crash a consumer on a foreign member
		}
		if at, ok := q.shardFailed[m]; ok {
			if time.Since(at) < shardFailBack {
				failed = append(failed, entry{e, queue, i, 0, at})
				continue
			}
			if time.Since(at) < shardFailForget { // (not pruned yet)
				back[m] = true
			}
		}
		if _, ok := byEnv[e]; !ok {
			envs = append(envs, e)
			credit[e] = sc.credit(e)
			// First read now (2c - 1): behind the envs already waiting
			// level with it, which envs new every call would otherwise pass
			// for ever (helper-125: a backlogged env served 0 runs in 100
			// calls of 1 beside two envs that took turns to have a run,
			// when an env new to the credit ranked first).
			turn[e] = sc.turnAt(e, sc.calls+1, false)
		}
		byEnv[e] = append(byEnv[e], entry{e, queue, i, sc.queueTurnAt(m, sc.calls+1, false), time.Time{}})
	}
	q.rrMu.Unlock()
	sort.SliceStable(failed, func(i, j int) bool { return failed[i].failed.Before(failed[j].failed) })
	for _, e := range failed {
		late = append(late, q.names(e.env, e.queue))
	}
	slices.SortFunc(envs, func(a, b string) int {
		if c := credit[a] - credit[b]; c != 0 {
			return c
		}
		if c := cmp.Compare(turn[a], turn[b]); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	// An env's queues by turn (the least recently served first; those
	// never served by when the calls first read them), then in master
	// order (the oldest work first).
	byTurn := func(a, b entry) int {
		if c := cmp.Compare(a.turn, b.turn); c != 0 {
			return c
		}
		return a.rank - b.rank
	}
	var first, rest []entry
	for _, e := range envs {
		slices.SortFunc(byEnv[e], byTurn)
		first = append(first, byEnv[e][0])
		rest = append(rest, byEnv[e][1:]...)
	}
	slices.SortFunc(rest, byTurn)
	for _, e := range slices.Concat(first, rest) {
		plan = append(plan, q.names(e.env, e.queue))
		env = append(env, e.env)
	}
	return plan, env, credit, len(first), late, back
}
