package runqueue

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Sentinel errors. Use errors.Is; typed errors below carry details.
var (
	// ErrInvalid is wrapped by every *InvalidError: bad input, nothing written.
	ErrInvalid = errors.New("runqueue: invalid argument")
	// ErrConflict: a run with this id exists with another body or key.
	ErrConflict = errors.New("runqueue: message id exists with another body")
	// ErrQueueFull: admission control refused the run; nothing was written.
	ErrQueueFull = errors.New("runqueue: queue depth limit reached")
	// ErrNotFound: no run with this id (under this concurrency key).
	ErrNotFound = errors.New("runqueue: no such run")
	// ErrNotInFlight: the run exists but is not in flight.
	ErrNotInFlight = errors.New("runqueue: run is not in flight")
	// ErrLeaseLost: the caller's lease ended; the run was recovered and
	// delivered again, so this holder may no longer ack, nack or extend it.
	ErrLeaseLost = errors.New("runqueue: lease lost to a later delivery")
	// ErrLeaseActive: recovery found the lease still running. RecoverLeases
	// skips such a run (another holder's lease is not an error), so no
	// public call returns it.
	ErrLeaseActive = errors.New("runqueue: lease has not expired")
	// ErrTooManyWeights: a queue already has MaxWeightOverrides weights.
	ErrTooManyWeights = errors.New("runqueue: too many weight overrides for this queue")
	// ErrReadOnly: the Queue was opened with Config.ReadOnly and the call
	// would write; nothing was written.
	ErrReadOnly = errors.New("runqueue: queue opened read-only")
	// ErrClosed: the Queue was closed.
	ErrClosed = errors.New("runqueue: queue closed")
	// ErrEvictionPolicy is wrapped by every *EvictionPolicyError: New found a
	// Redis that may evict keys.
	ErrEvictionPolicy = errors.New("runqueue: redis maxmemory-policy may evict keys")
	// ErrTooLarge: the queue has more variants than an operator call reads.
	ErrTooLarge = errors.New("runqueue: queue has too many variants to inspect")
	// ErrCorruptRecord: a run's stored record does not parse (a hand edit,
	// or a writer's bug). Such a run cannot be retried: a Nack that would
	// retry it is refused with nothing written (it stays held until its
	// lease passes; RecoverLeases then dead-letters it with its record as
	// it is, where PurgeDeadLetters removes it and Redrive serves it once
	// the record is mended; DeadRun.Corrupt), and a Nack with DeadLetter
	// dead-letters it so at once (sent again, it is ErrNotFound: the
	// record keeps no token to answer a retry from). A Dequeue (and every
	// call that serves runs) that serves one delivers the others and
	// dead-letters it so at once (the Observer hears of it as dequeued and
	// nacked, requeued false); should that fail, lease recovery does it. A
	// delayed run with such a record is made ready when it comes due, so
	// it is served and dead-lettered so too.
	ErrCorruptRecord = errors.New("runqueue: run record does not parse")
	// ErrServerVersion is wrapped by every *ServerVersionError: New found a
	// Redis older than the scripts need.
	ErrServerVersion = errors.New("runqueue: redis server too old")
)

// InvalidError reports which argument was rejected and why.
type InvalidError struct {
	Field  string
	Reason string
}

func (e *InvalidError) Error() string {
	return fmt.Sprintf("runqueue: invalid %s: %s", e.Field, e.Reason)
}

// Unwrap makes errors.Is(err, ErrInvalid) true.
func (e *InvalidError) Unwrap() error { return ErrInvalid }

func invalid(field, format string, args ...any) error {
	return &InvalidError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// QueueFullError is returned when admission control refuses a run. Scope is
// "queue" (the base queue's depth) or "key" (the concurrency key's depth).
type QueueFullError struct {
	Scope string
	Limit int
}

func (e *QueueFullError) Error() string {
	return fmt.Sprintf("runqueue: %s depth limit %d reached", e.Scope, e.Limit)
}

// Unwrap makes errors.Is(err, ErrQueueFull) true.
func (e *QueueFullError) Unwrap() error { return ErrQueueFull }

// EvictionPolicyError is returned by New when a Redis server (Addr; on a
// cluster, one master) has a maxmemory-policy (Policy) other than
// noeviction: under memory pressure it would evict runs, leases and
// scheduler state.
type EvictionPolicyError struct {
	Policy string
	Addr   string
}

func (e *EvictionPolicyError) Error() string {
	return fmt.Sprintf("runqueue: redis %s has maxmemory-policy %s, which can evict runs: "+
		"set maxmemory-policy noeviction, or set Config.AllowEviction to accept losing runs", e.Addr, e.Policy)
}

// Unwrap makes errors.Is(err, ErrEvictionPolicy) true.
func (e *EvictionPolicyError) Unwrap() error { return ErrEvictionPolicy }

// ServerVersionError is returned by New when a Redis server (Addr; on a
// cluster, one master) reports a redis_version (Version) older than
// MinRedisVersion: the scripts use commands and options added in Redis 6.2
// (ZADD LT, ZMSCORE), which an older server refuses in
// the middle of a script, the script's writes before it left in place.
type ServerVersionError struct {
	Version string
	Addr    string
}

func (e *ServerVersionError) Error() string {
	where := e.Addr
	if where == "" {
		where = "server"
	}
	return fmt.Sprintf("runqueue: redis %s is version %s; runqueue needs Redis %s or later", where, e.Version, MinRedisVersion)
}

// Unwrap makes errors.Is(err, ErrServerVersion) true.
func (e *ServerVersionError) Unwrap() error { return ErrServerVersion }

// scriptError maps the RQ_* codes that scripts return through
// redis.error_reply to typed errors. It is the only place that knows them.
func scriptError(err error, limits map[string]int) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	code, _, _ := strings.Cut(msg, " ")
	switch code {
	case "RQ_CONFLICT":
		return ErrConflict
	case "RQ_QUEUE_FULL":
		return &QueueFullError{Scope: "queue", Limit: limits["queue"]}
	case "RQ_KEY_FULL":
		return &QueueFullError{Scope: "key", Limit: limits["key"]}
	case "RQ_NOT_FOUND":
		return ErrNotFound
	case "RQ_NOT_IN_FLIGHT":
		return ErrNotInFlight
	case "RQ_LEASE_LOST":
		return ErrLeaseLost
	case "RQ_LEASE_ACTIVE":
		return ErrLeaseActive
	case "RQ_TOO_MANY_WEIGHTS":
		return ErrTooManyWeights
	case "RQ_CORRUPT":
		return ErrCorruptRecord
	}
	return err
}

// ErrNoRetry marks a handler's error as final: a Worker dead-letters the
// run at once instead of retrying it. Return NoRetry(err), or wrap it
// yourself: fmt.Errorf("bad payload: %w", runqueue.ErrNoRetry).
var ErrNoRetry = errors.New("runqueue: do not retry")

// NoRetry returns err marked final (errors.Is(e, ErrNoRetry) holds and
// errors.Is/As still reach err), with err's message. NoRetry(nil) is
// ErrNoRetry.
func NoRetry(err error) error {
	if err == nil {
		return ErrNoRetry
	}
	return &noRetryError{err: err}
}

type noRetryError struct{ err error }

func (e *noRetryError) Error() string   { return e.err.Error() }
func (e *noRetryError) Unwrap() []error { return []error{e.err, ErrNoRetry} }

// RetryError is a handler's error that says when to retry: a Worker nacks
// the run with this time instead of the backoff (Queue.Backoff). The retry
// still counts as an attempt: a run past Config.MaxAttempts is
// dead-lettered as with any failure. Build one with RetryAt or RetryAfter.
type RetryError struct {
	Err error
	// At is when to retry; when zero, After from the time the Worker nacks
	// the run (by Config.Clock).
	At    time.Time
	After time.Duration
}

func (e *RetryError) Error() string {
	when := "after " + e.After.String()
	if !e.At.IsZero() {
		when = "at " + e.At.Format(time.RFC3339Nano)
	}
	if e.Err == nil {
		return "runqueue: retry " + when
	}
	return e.Err.Error() + " (retry " + when + ")"
}

// Unwrap returns the error that failed the run.
func (e *RetryError) Unwrap() error { return e.Err }

// RetryAt returns err asking the Worker to retry the run at t.
func RetryAt(err error, t time.Time) error { return &RetryError{Err: err, At: t} }

// RetryAfter returns err asking the Worker to retry the run d after it
// nacks it (a negative d means now).
func RetryAfter(err error, d time.Duration) error { return &RetryError{Err: err, After: max(d, 0)} }
