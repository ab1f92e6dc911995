package runqueue

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"
)

// Clock tells the time. Every script receives now from Go, never from Redis,
// so tests and the bench can drive time step by step. The one exception is
// the floor of a shard's delivery-token counter, the later of now and the
// server's clock (docs/lifecycle.md): a token is never a time a script
// stores or compares.
type Clock interface {
	Now() time.Time
}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

// Limits are concurrency limits for one base queue; 0 means no limit.
type Limits struct {
	// Env: runs in flight across every queue of the env. Give every queue
	// of an env the same: each dequeue caps the env's count by the value
	// its own queue has, so a queue with a higher one may take the env past
	// a lower one's, which then gets nothing until the count falls below
	// it. The env's waiting line (flag on) keeps each waiting queue's value
	// and leaves a queue slots only while its own value leaves it some; a
	// waiting queue with a lower value at the front of the line holds the
	// env at that value until its next call (docs/design.md, section 6).
	Env   int
	Queue int // runs in flight in the base queue, all keys together
	Key   int // runs in flight per concurrency key of the queue
}

// limitsFor is Config.LimitsFor(env, queue), refused when a limit is
// negative (the scripts would read it as none) or when it panics
// (helper-219: a Worker calls it in goroutines of its own, where a panic
// ended the process; a handler's panic is an error of its run).
func (c *Config) limitsFor(env, queue string) (l Limits, err error) {
	returned := false
	defer func() {
		// (not recover() != nil, which a panic(nil) under GODEBUG
		// panicnil=1 passes as no panic, with no limits: helper-220)
		if !returned {
			p := recover()
			l, err = Limits{}, invalid("Config.LimitsFor", "panicked for env %q, queue %q: %v", env, queue, p)
		}
	}()
	l = c.LimitsFor(env, queue)
	returned = true
	if l.Env < 0 || l.Queue < 0 || l.Key < 0 {
		return l, invalid("Config.LimitsFor", "returned %+v for env %q, queue %q: a limit is 0 (none) or more", l, env, queue)
	}
	return l, nil
}

// Config configures a Queue. The zero value of every field means its default.
type Config struct {
	// Prefix starts every key (inside the hash tag). [A-Za-z0-9._-], 1-64
	// bytes. Defaults to "rq".
	Prefix string
	// Shards is the number of hash slots envs are spread over (shard =
	// fnv1a(env) mod Shards). Changing it moves envs: drain first. Defaults to 16.
	Shards int

	// VtimeScheduling turns the fair virtual-time scheduler on
	// (CK_VTIME_SCHEDULING_ENABLED). Defaults to false: variants are served in
	// age order by the pinned flag-off scripts.
	VtimeScheduling bool

	// PriorityStep is how much earlier one priority level makes a run ready
	// to order: ready score = available_at - priority*PriorityStep. 1ms to
	// MaxDuration. Defaults to 30s.
	PriorityStep time.Duration
	// MaxPayloadBytes bounds a run's payload. Defaults to 1 MiB; at most
	// MaxPayloadLimit.
	MaxPayloadBytes int
	// MaxQueueDepth refuses enqueues (ErrQueueFull) when a base queue holds
	// this many queued runs (ready + delayed). Defaults to 0: no limit.
	MaxQueueDepth int
	// MaxKeyDepth is MaxQueueDepth for one concurrency key. Defaults to 0: no limit.
	MaxKeyDepth int

	// EnvConcurrency, QueueConcurrency and KeyConcurrency are the default
	// concurrency limits when LimitsFor is nil. Default to 0: no limit.
	// An env limit is shared by the env's queues. With VtimeScheduling, the
	// queues take its slots in turn: a dequeue that the env's limit held
	// back with ready runs left puts its queue in the env's waiting line,
	// and the dequeues of the env's other queues leave each slot they could
	// take to a queue that has waited longer, and wake it, as the acks and
	// nacks that free the env's slots do (a mark lapses 2
	// x BlockPollInterval + 1 s after its queue's last call; a Worker that
	// stops gracefully or whose handlers are all busy with other queues'
	// runs, and a DequeueWait that ends empty, cut it to half a second,
	// passed over, which another consumer of the queue still waiting renews
	// in its place). With the flag
	// off a consumer that acks and takes in one call (AckAndDequeue, a
	// Worker given queues) takes back the slots its acks free, so another
	// queue of the env waiting at the limit may wait until that queue's
	// backlog drains, and a queue the env's limit held waits for its next
	// look (BlockPollInterval) unless a Worker of the same Queue frees the
	// env's slots (the Queue's Workers keep a waiting line of their own, in
	// this process: slots freed elsewhere wake nothing); DequeueShard (a
	// Worker given Shards) serves an env's queues in turn with either flag
	// (docs/design.md, section 6, "The env's queues", and guarantee 6).
	EnvConcurrency   int
	QueueConcurrency int
	KeyConcurrency   int
	// LimitsFor returns the limits of a base queue at each dequeue (and,
	// for the env's waiting line and key limits, at its acks and nacks, and
	// with VtimeScheduling at its enqueues, sweeps and redrives). Defaults
	// to the three fields above for every queue. A negative limit, or a
	// panic, is an error (*InvalidError, Field "Config.LimitsFor") of the
	// dequeue that asked for it; nothing is written (a Worker logs it and
	// calls again after a pause). Elsewhere such limits count as none
	// (an ack wakes no queue for the env's limit; the scheduler's hooks
	// look for key-held runs). It is called concurrently and must not
	// block, nor end its goroutine (runtime.Goexit, a test's FailNow).
	LimitsFor func(env, queue string) Limits

	// LeaseDuration is how long a dequeued run is held before lease recovery
	// may requeue it. 1ms to MaxDuration. Defaults to 5m.
	LeaseDuration time.Duration
	// MaxAttempts is the number of deliveries before a run is dead-lettered
	// by Nack or lease recovery. Defaults to 5; negative means no limit.
	MaxAttempts int
	// BackoffBase, BackoffMax and BackoffJitter shape Nack's default retry
	// time: BackoffBase*2^(attempt-1), at most BackoffMax, then multiplied by
	// a random factor in [1-BackoffJitter, 1+BackoffJitter]. Default to 1s,
	// 10m and 0.2; BackoffJitter is below 1, and a negative one means no
	// jitter. BackoffBase is
	// at most MaxDuration (0 means the default), BackoffMax BackoffBase to
	// MaxDuration.
	BackoffBase   time.Duration
	BackoffMax    time.Duration
	BackoffJitter float64

	// MaxDequeueCount bounds maxCount of one dequeue call (at most 2000).
	// Defaults to 1000.
	MaxDequeueCount int
	// ScanLimit is how many variants of a queue a flag-off dequeue call looks
	// at (in age order) and how many due delayed variants it promotes; with
	// the flag on it also bounds the scheduler's discovery step and its
	// age-head read.
	// At most 10,000. Defaults to 3*maxCount, at least 30. (A coalesced
	// Dequeue stands for the calls it carries: it scans the sum of theirs,
	// at most 10,000.)
	ScanLimit int
	// PromoteLimit is how many due delayed runs of one variant one dequeue
	// call moves to ready at most. 1..500. Defaults to 100. A call spends
	// a budget of max(PromoteLimit, maxCount) runs on the due variants it
	// reaches (ScanLimit at most: the first, earliest due first; with the
	// fair scheduler and more due, those without a ready run first, see
	// docs/design.md "Dequeue"): each takes up to the same share of it,
	// rounded up (with the fair scheduler, a share by its key's weight),
	// then those that filled their share share what the others
	// left (with the fair scheduler by weight, what one cannot take going
	// to the others by weight again; without it, what they leave in turn
	// in the delay index's order); then what
	// the variants at their key limit took, which the call cannot serve,
	// goes again to the others. So one call promotes fewer than
	// 2 x (that budget + ScanLimit) runs,
	// however many are due at once. (A coalesced Dequeue of k calls has a
	// per-variant limit of k*PromoteLimit, at most its maxCount or
	// PromoteLimit, the larger.)
	PromoteLimit int

	// WindowMultiplier sizes the scheduler's read budget per call: pass 1
	// reads tags lazily, at most 1000 + 4*maxCount*WindowMultiplier of
	// them, before falling back to the age head. Defaults to 3.
	WindowMultiplier int
	// Quantum is the unit in which Schedule and TopLags report virtual time
	// (one serve of a key of weight 1 is Quantum); the scheduling itself
	// does not depend on it. Above 0, at most 1,000,000; defaults to 1.
	Quantum float64
	// StateTTL is the lifetime of the scheduler's state: the first flag-on
	// write makes it (a dequeue of a queue with no state and no ready run
	// makes none), and flag-on dequeues renew it (when half of it is
	// gone; an AckAndDequeue too, at maxCount 0 as well); enqueues, plain
	// acks, nacks and sweeps do not, so a queue that no
	// flag-on instance dequeues for StateTTL loses its scheduler state,
	// and its ready work is discovered again at V.
	// 1s to MaxDuration. Defaults to 24h.
	StateTTL time.Duration
	// IdleMaxEntries caps the parked tags kept per queue. Defaults to 10,000.
	IdleMaxEntries int
	// MaxWeightOverrides caps the weight overrides per queue. Defaults to 1,000.
	MaxWeightOverrides int

	// SerialCalls sends every Enqueue, Ack and Dequeue in a script call of
	// its own, from the calling goroutine. Defaults to false: concurrent
	// Enqueue calls are coalesced into EnqueueMany calls and concurrent Ack
	// calls into AckMany calls, at most two in flight per Queue for each,
	// and concurrent Dequeue calls of a base queue into dequeues that stand
	// for them, at most two in flight per base queue, which costs Redis far
	// less per run under concurrency (see Enqueue, Ack and Dequeue).
	SerialCalls bool

	// Observer receives what the Queue and its Workers do (metrics).
	// Defaults to NopObserver.
	Observer Observer

	// BlockPollInterval is the longest a blocking dequeue sleeps without a
	// wake-up when work exists but limits hold it (an ack elsewhere frees it
	// silently). 1ms to MaxDuration. Defaults to 1s.
	BlockPollInterval time.Duration

	// ShardLookAhead is how far past its own clock a shard consumer
	// (DequeueShard, DequeueShardWait, a Worker given Shards) looks for
	// queues that hold ready runs. A queue's score in its shard's master is
	// the earliest time it has work by the clocks that wrote it (for ready
	// runs their ready score: the writer's now, less priority), so a writer
	// whose clock is ahead of the consumer's scores ready runs in the
	// consumer's future (as does the consumer's own clock stepping back).
	// A shard call also reads the queues scored in (now, now +
	// ShardLookAhead], at most max(64, 4 x maxCount) of them, earliest
	// first, looks (one more round trip, only when there are any not known
	// to hold none) which of them hold ready runs, and serves those with
	// the due queues (each env its share), as Dequeue of the queue would; a
	// queue whose only work is delayed is neither served nor waited on
	// before its time. A writer whose clock is ahead
	// of a shard consumer's by more than ShardLookAhead hides its ready
	// runs from shard consumers for the excess (Dequeue of their queue
	// serves them at once). At most MaxDuration (0 means the default);
	// negative means no look ahead
	// (a shard consumer reads the master only up to its now). Defaults to
	// 1m: well above the skew of hosts whose clocks are kept in step. A
	// queue in that window found without ready runs (delayed work only) is
	// not looked at again for a second while its master score stays and is
	// in the future, so its read is paid about once a second per such queue,
	// not at every call (a ready run written meanwhile by a writer ahead
	// waits up to that second, also in DequeueShardWait and a Worker).
	ShardLookAhead time.Duration

	// AllowEviction lets New accept a Redis whose maxmemory-policy is not
	// noeviction. Such a server may evict keys under memory pressure, and
	// with them runs, leases and scheduler state (a run whose record was
	// evicted is dropped when a script meets it), and the layout version:
	// New then records it again, as it cannot tell that loss from data of
	// the first release, which recorded none (see LayoutVersion). Defaults to false: New
	// reads CONFIG GET maxmemory-policy (on every master of a cluster) and
	// refuses anything but noeviction with an *EvictionPolicyError
	// (errors.Is ErrEvictionPolicy). Where CONFIG is not allowed (an ERR,
	// NOPERM or unknown-command reply, as on some managed services) or the
	// reply is empty, the check is skipped silently.
	AllowEviction bool

	// ReadOnly opens the Queue for inspection only: New neither records the
	// layout version (it still refuses a prefix that holds another one) nor
	// loads the scripts, and every method that would write returns
	// ErrReadOnly. For operator tools that must leave Redis as they found it.
	// Defaults to false.
	ReadOnly bool

	// ScriptsOnly runs every script by EVALSHA. Defaults to false: with
	// VtimeScheduling on, New loads the scripts that carry the scheduler's
	// code as one Redis Functions library (FUNCTION LOAD, on every master
	// of a cluster; its name is "runqueue_" and 16 hex digits of its code's
	// SHA-1) and runs them by FCALL, which costs Redis less per call (a
	// library defines its functions once, a script at every call). Where
	// FUNCTION is missing (Redis before 7.0, miniredis) or refused (NOPERM,
	// any refusal but a compile error of the library's code), New falls
	// back to EVALSHA silently, and so does a call whose library a server
	// will not take again. The flag-off scripts always run by EVALSHA. New
	// deletes the libraries of other runqueue versions (each one loaded
	// makes every call cost Redis more); an instance of another version
	// still running loads its own again at its next call.
	ScriptsOnly bool

	// Clock tells the time. Defaults to the wall clock.
	Clock Clock
	// Rand draws backoff jitter. Defaults to a randomly seeded source.
	Rand *rand.Rand
}

// WithDefaults returns a copy of c with every zero field set to its default,
// but ScanLimit: its default depends on each call's maxCount (see there), so
// a zero ScanLimit stays zero.
func (c *Config) WithDefaults() *Config {
	out := Config{}
	if c != nil {
		out = *c
	}
	setDefault(&out.Prefix, "rq")
	setDefault(&out.Shards, 16)
	setDefault(&out.PriorityStep, 30*time.Second)
	setDefault(&out.MaxPayloadBytes, 1<<20)
	setDefault(&out.LeaseDuration, 5*time.Minute)
	setDefault(&out.MaxAttempts, 5)
	setDefault(&out.BackoffBase, time.Second)
	setDefault(&out.BackoffMax, 10*time.Minute)
	setDefault(&out.BackoffJitter, 0.2)
	setDefault(&out.MaxDequeueCount, 1000)
	setDefault(&out.PromoteLimit, 100)
	setDefault(&out.WindowMultiplier, 3)
	setDefault(&out.Quantum, 1)
	setDefault(&out.StateTTL, 24*time.Hour)
	setDefault(&out.IdleMaxEntries, 10000)
	setDefault(&out.MaxWeightOverrides, 1000)
	setDefault(&out.BlockPollInterval, time.Second)
	setDefault(&out.ShardLookAhead, time.Minute)
	if out.Clock == nil {
		out.Clock = wallClock{}
	}
	if out.Observer == nil {
		out.Observer = NopObserver{}
	}
	if out.Rand == nil {
		out.Rand = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	if out.LimitsFor == nil {
		l := Limits{Env: out.EnvConcurrency, Queue: out.QueueConcurrency, Key: out.KeyConcurrency}
		out.LimitsFor = func(string, string) Limits { return l }
	}
	return &out
}

func setDefault[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}

// MaxPayloadLimit is the largest Config.MaxPayloadBytes: 512 MiB less
// 4 KiB. A run's record, its payload behind a header of at most about
// 1 KiB, goes to Redis as one argument, and Redis refuses an argument
// longer than its proto-max-bulk-len, 512 MiB by default (a server
// configured lower refuses larger records: keep MaxPayloadBytes within
// it).
const MaxPayloadLimit = 512<<20 - 4<<10

// maxScanLimit and maxPromoteLimit bound ScanLimit and PromoteLimit; a
// coalesced dequeue scans at most maxScanLimit and promotes at most
// PromoteLimit or its maxCount (at most 2,000): every script's reads and
// unpacks stay bounded (docs/design.md, "Bounded scripts").
const (
	maxScanLimit    = 10000
	maxPromoteLimit = 500
)

func (c *Config) validate() error {
	bad := func(field string, v any) error {
		return &InvalidError{Field: "Config." + field, Reason: fmt.Sprintf("value %v out of range", v)}
	}
	// Durations that reach the scripts: at most MaxDuration, so that every
	// millisecond value the scripts derive from them stays exact.
	for _, d := range []struct {
		field    string
		d, least time.Duration
	}{
		{"PriorityStep", c.PriorityStep, time.Millisecond},
		{"LeaseDuration", c.LeaseDuration, time.Millisecond},
		{"BackoffBase", c.BackoffBase, 0},
		{"BackoffMax", c.BackoffMax, max(c.BackoffBase, 0)},
		{"StateTTL", c.StateTTL, time.Second},
		{"BlockPollInterval", c.BlockPollInterval, time.Millisecond},
	} {
		if err := checkDuration("Config."+d.field, d.d, d.least); err != nil {
			return err
		}
	}
	if c.ShardLookAhead >= 0 { // negative: no look ahead
		if err := checkDuration("Config.ShardLookAhead", c.ShardLookAhead, 0); err != nil {
			return err
		}
	}
	switch {
	case c.Shards < 1 || c.Shards > 16384:
		return bad("Shards", c.Shards)
	case c.MaxPayloadBytes < 1 || c.MaxPayloadBytes > MaxPayloadLimit:
		return bad("MaxPayloadBytes", c.MaxPayloadBytes)
	case c.MaxQueueDepth < 0:
		return bad("MaxQueueDepth", c.MaxQueueDepth)
	case c.MaxKeyDepth < 0:
		return bad("MaxKeyDepth", c.MaxKeyDepth)
	// A negative limit would read as none in the scripts: a slip such as
	// n - 1 must not remove a limit silently.
	case c.EnvConcurrency < 0:
		return bad("EnvConcurrency", c.EnvConcurrency)
	case c.QueueConcurrency < 0:
		return bad("QueueConcurrency", c.QueueConcurrency)
	case c.KeyConcurrency < 0:
		return bad("KeyConcurrency", c.KeyConcurrency)
	// Written as !(in range) so that NaN, which fails every comparison, is
	// rejected too.
	case !(c.BackoffJitter < 1): // negative: no jitter
		return bad("BackoffJitter", c.BackoffJitter)
	case c.MaxDequeueCount < 1 || c.MaxDequeueCount > 2000:
		return bad("MaxDequeueCount", c.MaxDequeueCount)
	case c.ScanLimit < 0 || c.ScanLimit > maxScanLimit:
		return bad("ScanLimit", c.ScanLimit)
	case c.PromoteLimit < 1 || c.PromoteLimit > maxPromoteLimit:
		return bad("PromoteLimit", c.PromoteLimit)
	case c.WindowMultiplier < 1 || c.WindowMultiplier > 100:
		return bad("WindowMultiplier", c.WindowMultiplier)
	case !(c.Quantum > 0 && c.Quantum <= 1e6):
		return bad("Quantum", c.Quantum)
	case c.IdleMaxEntries < 1:
		return bad("IdleMaxEntries", c.IdleMaxEntries)
	case c.MaxWeightOverrides < 1:
		return bad("MaxWeightOverrides", c.MaxWeightOverrides)
	}
	return nil
}

// ConfigFromEnv reads a Config from the environment:
//
//	CK_VTIME_SCHEDULING_ENABLED  VtimeScheduling (true/false/1/0; default off)
//	RUNQUEUE_PREFIX              Prefix
//	RUNQUEUE_SHARDS              Shards
//	RUNQUEUE_LEASE_DURATION      LeaseDuration (Go duration, e.g. 30s)
//	RUNQUEUE_MAX_ATTEMPTS        MaxAttempts
//	RUNQUEUE_MAX_QUEUE_DEPTH     MaxQueueDepth
//	RUNQUEUE_MAX_KEY_DEPTH       MaxKeyDepth
//	RUNQUEUE_VTIME_QUANTUM       Quantum
//	RUNQUEUE_VTIME_WINDOW_MULTIPLIER  WindowMultiplier
//	RUNQUEUE_VTIME_STATE_TTL     StateTTL
//
// Unset variables leave the field zero (its default). A malformed value is
// an *InvalidError naming the variable.
func ConfigFromEnv() (*Config, error) {
	c := &Config{}
	var err error
	get := func(name string, parse func(string) error) {
		v, ok := os.LookupEnv(name)
		if !ok || err != nil || strings.TrimSpace(v) == "" {
			return
		}
		if e := parse(strings.TrimSpace(v)); e != nil {
			err = &InvalidError{Field: name, Reason: e.Error()}
		}
	}
	intVar := func(p *int) func(string) error {
		return func(s string) (e error) { *p, e = strconv.Atoi(s); return e }
	}
	durVar := func(p *time.Duration) func(string) error {
		return func(s string) (e error) { *p, e = time.ParseDuration(s); return e }
	}
	get("CK_VTIME_SCHEDULING_ENABLED", func(s string) (e error) { c.VtimeScheduling, e = strconv.ParseBool(s); return e })
	get("RUNQUEUE_PREFIX", func(s string) error { c.Prefix = s; return nil })
	get("RUNQUEUE_SHARDS", intVar(&c.Shards))
	get("RUNQUEUE_LEASE_DURATION", durVar(&c.LeaseDuration))
	get("RUNQUEUE_MAX_ATTEMPTS", intVar(&c.MaxAttempts))
	get("RUNQUEUE_MAX_QUEUE_DEPTH", intVar(&c.MaxQueueDepth))
	get("RUNQUEUE_MAX_KEY_DEPTH", intVar(&c.MaxKeyDepth))
	get("RUNQUEUE_VTIME_QUANTUM", func(s string) (e error) { c.Quantum, e = strconv.ParseFloat(s, 64); return e })
	get("RUNQUEUE_VTIME_WINDOW_MULTIPLIER", intVar(&c.WindowMultiplier))
	get("RUNQUEUE_VTIME_STATE_TTL", durVar(&c.StateTTL))
	return c, err
}
