package runqueue

import (
	"time"
	"unicode"
	"unicode/utf8"
)

// MaxNameBytes is the longest env, queue, concurrency key or message id.
const MaxNameBytes = 256

// checkName applies the input rules to a user string: non-empty, at most
// MaxNameBytes bytes, valid UTF-8, no control characters, no leading or
// trailing whitespace, not "." or "..".
func checkName(field, s string) error {
	switch {
	case s == "":
		return invalid(field, "must not be empty")
	case len(s) > MaxNameBytes:
		return invalid(field, "is %d bytes, at most %d allowed", len(s), MaxNameBytes)
	case !utf8.ValidString(s):
		return invalid(field, "is not valid UTF-8")
	case s == "." || s == "..":
		return invalid(field, "must not be %q", s)
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return invalid(field, "contains control character %U", r)
		}
	}
	first, _ := utf8.DecodeRuneInString(s)
	last, _ := utf8.DecodeLastRuneInString(s)
	if unicode.IsSpace(first) || unicode.IsSpace(last) {
		return invalid(field, "has leading or trailing whitespace")
	}
	return nil
}

// checkShard checks a shard number against the key space: 0..Shards()-1.
func (q *Queue) checkShard(shard int) error {
	if shard < 0 || shard >= q.space.Shards() {
		return invalid("shard", "%d is outside 0..%d", shard, q.space.Shards()-1)
	}
	return nil
}

// checkKey is checkName for an optional concurrency key ("" means none).
func checkKey(key string) error {
	if key == "" {
		return nil
	}
	return checkName("key", key)
}

func checkQueue(env, queue string) error {
	if err := checkName("env", env); err != nil {
		return err
	}
	return checkName("queue", queue)
}

// checkVariant checks env, queue and an optional concurrency key.
func checkVariant(env, queue, key string) error {
	if err := checkQueue(env, queue); err != nil {
		return err
	}
	return checkKey(key)
}

// checkRef checks the names that identify one run.
func checkRef(env, queue, key, id string) error {
	if err := checkVariant(env, queue, key); err != nil {
		return err
	}
	return checkName("id", id)
}

// Time and duration bounds. Every time runqueue hands a script is a Unix
// millisecond count in 0..MaxTimeUnixMilli, and every duration at most
// MaxDuration, so the values the scripts compute (now + delay, now + TTL,
// now + lease, available_at - 9*PriorityStep, at least -9*MaxDuration) stay
// below 2^53 in magnitude: exact in a Lua double and in a sorted-set score,
// and far from overflowing int64 nanoseconds or milliseconds.
const (
	// MaxTimeUnixMilli is the latest time accepted, 9999-12-31T23:59:59.999Z,
	// in Unix milliseconds. The earliest is the Unix epoch (0).
	MaxTimeUnixMilli = 253402300799999
	// MaxDuration is the longest duration accepted: 100 years of 365 days.
	MaxDuration = 100 * 365 * 24 * time.Hour
)

// checkTime checks an absolute time against the epoch..MaxTimeUnixMilli range,
// comparing time.Time values so that a time far outside it (whose UnixMilli
// overflows int64) is rejected too. The caller handles the zero value.
func checkTime(field string, t time.Time) error {
	if t.Before(time.UnixMilli(0)) || !t.Before(time.UnixMilli(MaxTimeUnixMilli+1)) {
		return invalid(field, "%s is outside 1970-01-01T00:00:00Z..9999-12-31T23:59:59.999Z",
			t.UTC().Format(time.RFC3339Nano))
	}
	return nil
}

// checkNow checks the time a call read from Config.Clock, which the scripts
// store and compute with: a clock set before 1970 would write records the
// scripts cannot read back.
func checkNow(now int64) error { return checkTime("Config.Clock", time.UnixMilli(now)) }

// checkDuration checks least <= d <= MaxDuration.
func checkDuration(field string, d, least time.Duration) error {
	if d < least || d > MaxDuration {
		return invalid(field, "%v is outside %v..%v", d, least, MaxDuration)
	}
	return nil
}

// checkDeadline checks that now + d, a time a script will store, is at most
// MaxTimeUnixMilli. d was checked with checkDuration, so the sum cannot
// overflow for any clock inside the range.
func checkDeadline(field string, now int64, d time.Duration) error {
	if at := now + ms(d); at < 0 || at > MaxTimeUnixMilli {
		return invalid(field, "now + %v is outside 1970-01-01T00:00:00Z..9999-12-31T23:59:59.999Z", d)
	}
	return nil
}

func checkRun(r *Run) error {
	if r == nil {
		return invalid("run", "must not be nil")
	}
	if err := checkRef(r.Env, r.Queue, r.Key, r.ID); err != nil {
		return err
	}
	if r.Token <= 0 {
		return invalid("token", "must come from a dequeued run")
	}
	return nil
}

func (q *Queue) checkMaxCount(maxCount int) error {
	if maxCount <= 0 || maxCount > q.cfg.MaxDequeueCount {
		return invalid("maxCount", "%d is outside 1..%d", maxCount, q.cfg.MaxDequeueCount)
	}
	return nil
}
