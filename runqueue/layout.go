package runqueue

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/keys"
)

// LayoutVersion is the version of what runqueue stores in Redis (key names,
// value formats, the scheduler's state). New records it under the prefix
// the first time and refuses a Redis that holds another, so a rolling
// upgrade can never mix layouts silently. A prefix that holds queued runs
// or runs in flight but no version is taken for the first release's and
// refused too (unless Config.AllowEviction: see there).
//
//   - 1: the first release (no version recorded).
//   - 2: the scheduler keeps its state in ckVtime (registrations in
//     registration order, gated and parked regions) and ckVtimeState;
//     ckVtimeFloor and ckVtimeIdle are gone; lease tokens come from a
//     per-shard counter.
//   - 3: a run is one record (attempt, priority, times, last settled token,
//     variant member, then the payload) built by Go; runs in flight are the
//     queue's held hash (token by run) with per-key and per-env counters, in
//     place of three sets.
//   - 4: a scheduler state whose ckVtime holds 64 entries gets the wide
//     marks (a ckVtime member at 2^51, a state-hash field "~", both over 64
//     bytes), so that Redis keeps both keys as a skiplist and a hash table
//     (lua/lib/sched_reg.lua).
//   - 5: a queue's held hash that holds 64 runs in flight or more gets the
//     wide mark (the field "~", its value over 64 bytes), and its
//     key-inflight hash too when it holds 64 variants or more, so that
//     Redis keeps them as hash tables (lua/lib/held.lua); the queue's
//     in-flight count is the held hash's length less the mark.
//   - 6: the scheduler's state hash holds b, the time of the state's
//     first discovery read, by which a flag-on dequeue tells work that was
//     ready before the state began (found at V) from a flag-off producer's
//     new keys (newcomers). A build of layout 5 ignores it: its dequeues
//     register every key they find untagged at V, and a flag-off
//     producer's new keys starve the other keys.
//   - 7: the scheduler's state hash holds cm, the cold mark: the time of
//     a flag-on dequeue whose promotion reached fewer variants than were
//     due on a cold state, by which later promotions register the work due
//     by then at V, not through the newcomer lane. A build of layout 6
//     ignores it: a burst of delayed work of many keys falling due
//     together into an idle queue registers the ScanLimit first at V and
//     the rest one key's share together.
//   - 8: an env's waiting line (keys.Env.Waiting, a ZSET by place, and
//     keys.Env.WaitingUntil, each mark's life) holds the queues of the
//     env that a flag-on dequeue found held by the env's limit with work
//     left; flag-on dequeues of the env's other queues leave freed slots
//     to them (lua/lib/envwait.lua). A build of layout 7 would ignore it:
//     its fused ack-and-take calls take back every slot their acks free,
//     and a queue of the env at its limit waits until another queue's
//     backlog drains.
//   - 9: each mark of an env's waiting line (keys.Env.WaitingUntil) holds
//     its queue's env limit beside its life, "till:limit", and the hash
//     "^", the highest such limit, so that a mark is left slots only while
//     its own limit leaves it some (helper-219: a queue held by a lower
//     limit than its neighbours' kept the slots from them). A build of
//     layout 8 would read every such mark as dead.
const LayoutVersion = 9

// ErrLayout is wrapped by every *LayoutError.
var ErrLayout = errors.New("runqueue: redis holds another layout version")

// LayoutError reports a Redis prefix written by another layout version.
type LayoutError struct {
	Key   string // where the version is recorded
	Found string // the version recorded there; "" when none is but data is
	Want  int    // LayoutVersion
}

func (e *LayoutError) Error() string {
	if e.Found == "" {
		return fmt.Sprintf("runqueue: the prefix holds runqueue data but %s holds no layout version (the first "+
			"release, layout 1, recorded none; or the key was deleted): drain the queues under this prefix with "+
			"the version that wrote them (or use a new Config.Prefix) before starting this one; if this build "+
			"wrote them, SET %s %d", e.Key, e.Key, e.Want)
	}
	return fmt.Sprintf("runqueue: %s holds layout version %s, this build writes %d: drain the queues under this "+
		"prefix with the old version (or use a new Config.Prefix) before starting this one, and never run both "+
		"on one prefix", e.Key, e.Found, e.Want)
}

func (e *LayoutError) Unwrap() error { return ErrLayout }

// checkLayout records LayoutVersion under the prefix, or checks the one
// recorded there. A prefix with no version is new only when it holds no
// data: the first release (layout 1) recorded none, so a prefix with
// queued runs or runs in flight and no version is refused. But with
// evicting (Config.AllowEviction) the version key, read only here, is
// among the first an allkeys-* policy evicts, and its loss cannot be told
// from layout 1's data: the version is recorded again, as before layout
// 1's data was looked for. With readOnly it records nothing: a prefix with
// no version passes when it holds no data (or evicting is allowed).
func checkLayout(ctx context.Context, c redis.UniversalClient, space keys.Space, readOnly, evicting bool) error {
	key := space.Layout()
	want := fmt.Sprint(LayoutVersion)
	got, err := c.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		if !evicting {
			old, derr := unversionedData(ctx, c, space)
			if derr != nil {
				return derr
			}
			if old {
				return &LayoutError{Key: key, Want: LayoutVersion}
			}
		}
		if readOnly {
			return nil
		}
		// Another New may record it at the same time: read what won.
		if err := c.SetNX(ctx, key, want, 0).Err(); err != nil {
			return err
		}
		got, err = c.Get(ctx, key).Result()
	}
	if err != nil {
		return err
	}
	if got != want {
		return &LayoutError{Key: key, Found: got, Want: LayoutVersion}
	}
	return nil
}

// unversionedData says whether any shard of space holds queued runs, runs
// in flight or runs with a TTL (its master, leases or ttl key, which every
// layout wrote): a TYPE of each (one shard's keys share one slot), in one
// pipeline. Dead-lettered runs alone are not looked for (they live in per
// env keys that only a SCAN would find).
func unversionedData(ctx context.Context, c redis.UniversalClient, space keys.Space) (bool, error) {
	// TYPE of each key, not EXISTS: Redis 7 marks EXISTS multi-shard, and
	// go-redis's dynamic routing resolver refuses a pipeline holding it.
	cmds := make([]*redis.StatusCmd, 0, 3*space.Shards())
	if _, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range space.Shards() {
			sh := space.Shard(i)
			for _, k := range []string{sh.Master(), sh.Leases(), sh.TTL()} {
				cmds = append(cmds, p.Type(ctx, k))
			}
		}
		return nil
	}); err != nil {
		return false, err
	}
	for _, cmd := range cmds {
		if cmd.Val() != "none" {
			return true, nil
		}
	}
	return false, nil
}
