package runqueue

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/keys"
)

// Queue is a handle on the run queues of one key space. It is safe for
// concurrent use; create one per process and Close it when done.
type Queue struct {
	rdb     redis.UniversalClient
	cfg     *Config
	space   keys.Space
	scripts *scriptSet
	observe bool // cfg.Observer is not a NopObserver

	waker    *waker
	enq      *coalescer[EnqueueParams, EnqueueResult] // concurrent Enqueue calls
	ack      *coalescer[*Run, ackResult]              // concurrent Ack calls
	deq      *coalescer[dequeueReq, dequeueResult]    // concurrent Dequeue calls
	closed   chan struct{}
	closeMu  sync.Mutex
	shardOff map[int]int64 // rotating read offset in each shard's master
	// shardCredit: each shard's credit of envs and their turns, and its
	// queues' turns (see shardCommit), at most shardTurnMax envs and
	// shardQueueTurnMax queues a shard; guarded by rrMu.
	shardCredit map[int]*shardCredit
	// aheadIdle: master members scored after now that a shard look-ahead
	// found holding no ready run, with the score they had and when (see
	// Queue.aheadReady); guarded by rrMu.
	aheadIdle map[string]aheadMark
	// shardFailed: master members whose call in a shard dequeue failed,
	// with when (see shardPlan), and when shardPlan last pruned it;
	// guarded by rrMu.
	shardFailed     map[string]time.Time
	shardFailPruned time.Time
	rrMu            sync.Mutex

	nameCache nameCache // queueNames by (env, queue)

	// lines: flag off, each env's waiting line of the Queue's Workers'
	// queue sources (see envLine); guarded by linesMu.
	lines   map[string]*envLine
	linesMu sync.Mutex

	// keyLimited: the instance has given some queue a per-key limit, so
	// a freed slot looks for a gated variant (see vtimeArgs).
	keyLimited atomic.Bool

	// noEarlyLook (tests only, set before any wait): a blocking wait
	// beside held work looks again at the poll alone, as before the early
	// look (see Queue.block), to compare with it.
	noEarlyLook bool
	// leaveGrace: see defaultLeaveGrace (tests may change it before any
	// call: SetLeaveGrace).
	leaveGrace time.Duration
}

// New returns a Queue on client. It assembles and loads every script of the
// configured flag state, so a broken script (or an unreachable Redis) is an
// error here rather than at the first call. cfg may be nil for defaults.
// With Config.ReadOnly it writes nothing and loads no script.
func New(ctx context.Context, client redis.UniversalClient, cfg *Config) (*Queue, error) {
	if client == nil {
		return nil, invalid("client", "must not be nil")
	}
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	space, err := keys.NewSpace(c.Prefix, c.Shards)
	if err != nil {
		return nil, &InvalidError{Field: "Config.Prefix", Reason: err.Error()}
	}
	if err := checkVersion(ctx, client); err != nil {
		return nil, err
	}
	if !c.AllowEviction {
		if err := checkEviction(ctx, client); err != nil {
			return nil, err
		}
	}
	scripts, err := buildScripts(c.VtimeScheduling)
	if err != nil {
		return nil, err
	}
	if err := checkLayout(ctx, client, space, c.ReadOnly, c.AllowEviction); err != nil {
		return nil, err
	}
	if c.ReadOnly {
		// Every write goes through a script, so refusing the scripts refuses
		// every write.
		for _, sc := range scripts.all() {
			sc.refused = true
		}
	} else if err := scripts.load(ctx, client, !c.ScriptsOnly); err != nil {
		return nil, err
	}
	q := &Queue{rdb: client, cfg: c, space: space, scripts: scripts, observe: observing(c.Observer),
		closed: make(chan struct{}), shardOff: map[int]int64{}, shardCredit: map[int]*shardCredit{},
		aheadIdle: map[string]aheadMark{}, shardFailed: map[string]time.Time{}, leaveGrace: defaultLeaveGrace}
	q.enq = newCoalescer(func(ctx context.Context, ps []EnqueueParams) []EnqueueResult {
		res, _ := q.enqueueMany(ctx, ps, false)
		return res
	}, func(p EnqueueParams, res EnqueueResult) {
		if res.Queued && q.observe {
			q.cfg.Observer.Enqueued(p.Env, p.Queue, 1)
		}
	}, func(p EnqueueParams) int { return len(p.Payload) }, batchBytes)
	q.ack = newCoalescer(func(ctx context.Context, runs []*Run) []ackResult {
		errs, _ := q.ackMany(ctx, runs, false)
		out := make([]ackResult, len(runs))
		for i, e := range errs {
			out[i] = ackResult{acked: e == nil}
			if e != errGoneBefore {
				out[i].err = e
			}
		}
		return out
	}, func(r *Run, res ackResult) {
		if res.acked && q.observe {
			q.cfg.Observer.Acked(r.Env, r.Queue, 1)
		}
	}, nil, 0)
	q.deq = newCoalescer(q.dequeueCoalesced, func(r dequeueReq, res dequeueResult) {
		if len(res.runs) > 0 && q.observe {
			q.cfg.Observer.Dequeued(res.runs, time.UnixMilli(res.now))
		}
		q.reportCorrupt(r.qn.qk, &res.corrupt, res.now)
	}, func(r dequeueReq) int { return r.max }, c.MaxDequeueCount)
	// A taken run's caller waits for its send: a caller that returned
	// early could retry, have the run served and acked, and then see its
	// first send land and queue the run again.
	q.enq.keepTaken = true
	q.deq.keepTaken = true
	q.deq.group = func(r dequeueReq) string { return r.qn.member }
	return q, nil
}

// checkEviction refuses a Redis whose maxmemory-policy is not noeviction:
// on a cluster or ring client every master (shard) is checked. A server
// that does not let us read the policy (CONFIG refused with ERR or NOPERM,
// or renamed away: unknown command; miniredis) or answers with no value is
// not checked. Any other error (an unreachable server) is returned.
func checkEviction(ctx context.Context, client redis.UniversalClient) error {
	check := func(ctx context.Context, c redis.Cmdable, addr string) error {
		res, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
		var reply redis.Error
		switch {
		case errors.As(err, &reply):
			msg := reply.Error()
			if strings.HasPrefix(msg, "ERR") || strings.HasPrefix(msg, "NOPERM") ||
				strings.Contains(strings.ToLower(msg), "unknown command") {
				return nil // cannot check
			}
			return err
		case err != nil:
			return err
		}
		if p := strings.ToLower(res["maxmemory-policy"]); p != "" && p != "noeviction" {
			return &EvictionPolicyError{Policy: p, Addr: addr}
		}
		return nil
	}
	return eachServer(ctx, client, check)
}

// MinRedisVersion is the oldest Redis whose commands every script of
// runqueue's can use (see ServerVersionError).
const MinRedisVersion = "6.2.0"

// checkVersion refuses a Redis that reports a redis_version below
// MinRedisVersion: on a cluster or ring client every master (shard) is
// checked. A server that does not let us read INFO's server section (any
// error reply: NOPERM, unknown command, miniredis's unsupported section),
// or reports no version it can read as major.minor, is not checked. Any
// other error (an unreachable server) is returned.
func checkVersion(ctx context.Context, client redis.UniversalClient) error {
	return eachServer(ctx, client, func(ctx context.Context, c redis.Cmdable, addr string) error {
		info, err := c.Info(ctx, "server").Result()
		var reply redis.Error
		switch {
		case errors.As(err, &reply):
			return nil // refused: cannot check
		case err != nil:
			return err
		}
		if v := infoField(info, "redis_version"); versionBelow(v, MinRedisVersion) {
			return &ServerVersionError{Version: v, Addr: addr}
		}
		return nil
	})
}

// infoField is the value of field in an INFO reply ("" when absent).
func infoField(info, field string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// versionBelow reports whether version v is below min by major and minor
// number (both major.minor[.patch...]); a v that does not start with two
// numbers is not.
func versionBelow(v, min string) bool {
	ma, mi, ok := majorMinor(v)
	if !ok {
		return false
	}
	minMa, minMi, _ := majorMinor(min)
	return ma < minMa || ma == minMa && mi < minMi
}

// majorMinor reads the first two numbers of a version major.minor[...].
func majorMinor(v string) (major, minor int, ok bool) {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	return major, minor, err1 == nil && err2 == nil
}

// eachServer runs f on every master of a cluster, every shard of a ring,
// or the one server of any other client; addr is the server's address
// ("" when the client does not say).
func eachServer(ctx context.Context, client redis.UniversalClient, f func(ctx context.Context, n redis.Cmdable, addr string) error) error {
	switch c := client.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			return f(ctx, n, n.Options().Addr)
		})
	case *redis.Ring:
		return c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error {
			return f(ctx, n, n.Options().Addr)
		})
	case *redis.Client:
		return f(ctx, c, c.Options().Addr)
	default:
		return f(ctx, client, "")
	}
}

// Config returns the effective configuration (defaults filled in).
func (q *Queue) Config() Config { return *q.cfg }

// Shards returns the number of shards.
func (q *Queue) Shards() int { return q.space.Shards() }

// ShardOf returns the shard that holds env's queues.
func (q *Queue) ShardOf(env string) int { return q.space.ShardOf(env) }

// Close stops the wake-up listener of blocking dequeues, then waits for the
// coalesced Enqueue, Ack and Dequeue calls in flight (already handed to a
// sender) to be sent, so that nothing this Queue was asked to write before
// Close reaches Redis after Close returns (so an Observer callback must
// not call Close: one may run in a sender). A send is bounded by its
// callers' latest deadline, or by the client's timeouts and retries when a
// caller has none: against a Redis that stopped answering, Close can take
// that long. Enqueue, Ack and Dequeue still work after Close, each as a
// call of its own. A Worker still running goes on, but no enqueue wakes
// it any more: it looks for work every Config.BlockPollInterval (shut
// Workers down before closing their Queue). It does not close the Redis client, which the caller
// owns.
func (q *Queue) Close() error {
	q.closeMu.Lock()
	defer q.closeMu.Unlock()
	select {
	case <-q.closed:
		return nil
	default:
	}
	close(q.closed)
	var err error
	if q.waker != nil {
		err = q.waker.close()
	}
	q.enq.wait()
	q.ack.wait()
	q.deq.wait()
	return err
}

func (q *Queue) isClosed() bool { return isDone(q.closed) }

// isDone says whether ch, a channel that is only ever closed, is closed.
func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func (q *Queue) now() int64 { return q.cfg.Clock.Now().UnixMilli() }

// clockNow is now for a call that writes: refused (checkNow) outside the
// range of the times the scripts store.
func (q *Queue) clockNow() (int64, error) {
	now := q.now()
	return now, checkNow(now)
}

func ms(d time.Duration) int64 { return d.Milliseconds() }

// vtimeKeys and vtimeArgs are what the flag-on scripts with hooks take
// after their own KEYS and ARGV.
func (q *Queue) vtimeKeys(qk keys.Queue) []string {
	return []string{qk.CkVtime(), qk.CkVtimeState(), qk.Weights()}
}

// vtimeArgs, for a queue whose limits are lim: the state TTL, the idle
// cap, and whether a freed slot looks for a gated variant (looksForGated).
func (q *Queue) vtimeArgs(lim Limits) []any {
	look := 0
	if q.looksForGated(lim) {
		look = 1
	}
	return []any{ms(q.cfg.StateTTL), q.cfg.IdleMaxEntries, look}
}

// looksForGated says whether a slot freed in a queue whose limits are lim
// looks for a gated variant, noting a per-key limit: when the queue has a
// per-key limit now, or the instance gave a queue one before (its limit
// may have gone and come back since a variant was gated; the release must
// not wait for the gated probe). An instance that never meets a key limit
// spares every ack that read.
func (q *Queue) looksForGated(lim Limits) bool {
	if lim.Key > 0 {
		q.keyLimited.Store(true)
	}
	return q.keyLimited.Load()
}

// ackScript is the script that acks runs of a queue whose limits are lim
// (lenientLimits). With the flag on, an ack's scheduler work is the look
// for a gated variant when a slot frees (looksForGated) and the env's
// waiting line; without them the flag-on ack's hooks do nothing, and the
// flag-off ack runs instead: the same commands and the same data, without
// the scheduler's keys and arguments to parse or its hooks to set up (18,000
// fewer instructions of Redis per ack of one run, counted under callgrind
// on Redis 7.0: 126,000 -> 108,000).
// A queue with an env limit acks with the flag-on ack: it wakes the queues
// waiting for the env's slots it frees (withRelease).
func (q *Queue) ackScript(lim Limits) *script {
	if q.scripts.ackPlain != nil && !q.looksForGated(lim) && lim.Env <= 0 {
		return q.scripts.ackPlain
	}
	return q.scripts.ack
}

// withHooks appends the scheduler's keys and arguments when sc was built
// with the scheduler's hooks (Config.LimitsFor read only then, as
// lenientLimits reads it).
func (q *Queue) withHooks(sc *script, n *queueNames, ks []string, args []any) ([]string, []any) {
	if !sc.hooks {
		return ks, args
	}
	return append(ks, n.vtime...), append(args, q.vtimeArgs(q.lenientLimits(n.qk))...)
}

// lenientLimits reads qk's limits, once, for a call that goes on whatever
// Config.LimitsFor says (an ack, a requeue, the scheduler's hooks of an
// enqueue, a sweep or a redrive): its limits as it returned them, but no
// env limit when the dequeues would refuse them (a negative one), and none
// at all when it panicked (a key-held run is still looked for once the
// instance met a key limit: looksForGated).
func (q *Queue) lenientLimits(qk keys.Queue) Limits {
	lim, err := q.cfg.limitsFor(qk.Env.Name(), qk.Name())
	if err != nil {
		lim.Env = 0
	}
	return lim
}

// withRelease is withHooks for a call of sc that releases runs of n (an
// ack, a requeue) given n's limits, with the env's waiting line appended
// when the env has a limit: the script wakes the queues of the env that
// wait for the slots it frees, as a dequeue of the env does
// (lib/hooks_vtime, lib/envline).
func (q *Queue) withRelease(sc *script, n *queueNames, ks []string, args []any, lim Limits) ([]string, []any) {
	if !sc.hooks {
		return ks, args
	}
	ks, args = append(ks, n.vtime...), append(args, q.vtimeArgs(lim)...)
	if lim.Env > 0 {
		ks = append(ks, n.qk.Env.InflightCount(), n.qk.Env.Waiting(), n.qk.Env.WaitingUntil())
		args = append(args, lim.Env, n.wake, ms(q.leaveGrace))
	}
	return ks, args
}

// placeKeys are the keys of a run's place in its queue (its record, the
// variant indexes, the depth counters, the shard master): the first five
// KEYS of every script that puts a run into its queue or takes it out
// (enqueue, requeue, expire, redrive), more following them.
func placeKeys(qk keys.Queue, more ...string) []string {
	return append([]string{qk.Runs(), qk.CkIndex(), qk.DelayIndex(), qk.Depth(), qk.Master()}, more...)
}

// heldKeys are the keys of a queue's in-flight bookkeeping, in the order the
// ack script and the dequeue's acks take them.
func (q *Queue) heldKeys(qk keys.Queue) []string {
	return []string{qk.Runs(), qk.Held(), qk.KeyInflight(), qk.Env.InflightCount(), qk.Leases()}
}
