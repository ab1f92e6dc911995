package fairness

import (
	"errors"
	"sync"
	"time"
)

// Limits are the concurrency limits of the queue under test; 0 means none.
type Limits struct {
	Env   int // runs in flight in the env (the queue under test is its only queue)
	Queue int // runs in flight in the queue
	Key   int // runs in flight per concurrency key
}

// Served is one run a dequeue call took, in serve order. Expired: it had
// passed its TTL, and the call deleted it instead of delivering it.
// Swept (Expired too): the call swept it at its key's head, as the TTL
// sweep would, before choosing: no serve (vtime's Served.Swept).
type Served struct {
	Key     string
	ID      string // the id given to Enqueue
	Attempt int    // delivery attempt, from 1
	Expired bool
	Swept   bool
}

// Driver runs the operations of one base queue on a backend: the vtime
// model or the Lua scripts on a Redis. Every operation happens at the
// driver's clock, which only Advance moves.
type Driver interface {
	// Enqueue queues a run of key, available after delay, expiring (TTL
	// sweep) if not dequeued within ttl (0: never).
	Enqueue(key, id string, priority int, delay, ttl time.Duration) error
	// Dequeue serves up to maxCount runs in one call (runqueue's
	// Dequeue: the runs it took past their TTL, expired, come with them;
	// when it delivered fewer than maxCount for that, it takes again).
	Dequeue(maxCount int) ([]Served, error)
	// Ack completes a held run.
	Ack(id string) error
	// Nack gives a held run back, ready again after retryAfter, or
	// dead-lettered (deadLetter, or no attempts left). It reports whether
	// the run was requeued.
	Nack(id string, retryAfter time.Duration, deadLetter bool) (bool, error)
	// RecoverLeases requeues (or dead-letters) every held run whose lease
	// deadline has passed and returns how many it took back.
	RecoverLeases() (int, error)
	// SweepTTL expires every queued run whose TTL deadline has passed and
	// returns how many it expired.
	SweepTTL() (int, error)
	// SetWeight sets the weight of key (0.001..1000; 1 is the default).
	SetWeight(key string, w float64) error
	// SetLimits changes the concurrency limits from the next dequeue on.
	SetLimits(Limits) error
	// Advance moves the clock.
	Advance(d time.Duration) error
}

// FlagFlipper is a driver that can turn the scheduler flag off and on:
// subsequent operations go through a flag-off or a flag-on instance on the
// same data (a rolling deploy, or a rollback).
type FlagFlipper interface {
	SetFlag(on bool) error
}

// StateExpirer is a driver whose scheduler state can expire: after
// ExpireState the state is gone as a whole, as if no scheduler write had
// happened for the state TTL (the clock does not move).
type StateExpirer interface {
	ExpireState() error
}

// StateProber tells whether any of the scheduler's state exists: on a
// Redis whose clock moves (miniredis), the state's own TTL may remove it.
type StateProber interface {
	StateExists() (bool, error)
}

// LaneProber tells whether the scheduler holds key in its newcomer lane,
// waiting for its first tag. The oracle asks when a flag-off call serves a
// key it counts as a newcomer: flag-off scripts write nothing of the
// scheduler, so a key in the lane stays there, ahead of later newcomers.
type LaneProber interface {
	InLane(key string) (bool, error)
}

// ClockReader reads the scheduler's virtual clock V, in serves at weight 1.
type ClockReader interface {
	V() (float64, error)
}

// ErrVUnavailable is returned by a ClockReader that cannot read V now.
var ErrVUnavailable = errors.New("fairness: V cannot be read")

// BatchProber computes, without changing the driver's state, what
// maxCount calls of dequeue(1) would serve from the current state (the
// model clones itself). It is how batch invariance is checked.
type BatchProber interface {
	ProbeSingles(maxCount int) ([]Served, error)
}

// Clock is a settable clock, safe for concurrent use; runqueue.Config
// takes it as its Clock.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a clock at a fixed instant.
func NewClock() *Clock { return &Clock{t: time.UnixMilli(2_000_000_000_000)} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}
