package runqueue

import (
	"context"
	"math"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/keys"
)

// envAhead reads the env's waiting line (lua/lib/envwait.lua) as a flag-on
// dequeue of qk with env limit limit would now, the env holding count runs
// in flight: how many of the env's slots it leaves to the other queues of
// the env that wait ahead of qk (live marks with an earlier place than
// qk's, or every live mark of another queue when qk has none): one to each
// mark whose limit leaves it one, and those that the lowest limit among
// them keeps from qk's call. Marks live by Redis's clock (TIME, read on the
// node that holds the env), as the script reads them.
func (q *Queue) envAhead(ctx context.Context, qk keys.Queue, limit int, count int64) (int, error) {
	line, err := q.rdb.ZRangeWithScores(ctx, qk.Env.Waiting(), 0, -1).Result()
	if err != nil || len(line) == 0 {
		return 0, err
	}
	lives, err := q.rdb.HGetAll(ctx, qk.Env.WaitingUntil()).Result()
	if err != nil {
		return 0, err
	}
	var timer interface {
		Time(context.Context) *redis.TimeCmd
	} = q.rdb
	if cc, ok := q.rdb.(*redis.ClusterClient); ok {
		n, err := cc.MasterForKey(ctx, qk.Env.Waiting())
		if err != nil {
			return 0, err
		}
		timer = n
	}
	now, err := timer.Time(ctx).Result()
	if err != nil {
		return 0, err
	}
	return envAheadOf(line, lives, qk.Member(), now.UnixMilli(), ms(q.leaveGrace), limit, count), nil
}

// envMark parses a mark of the lives hash, "till:limit" (layout 9): the
// time it lives until (ms) and its queue's env limit; ok false for a value
// not so written (dead to the scripts).
func envMark(v string) (till int64, limit int64, ok bool) {
	a, b, found := strings.Cut(v, ":")
	t, err1 := strconv.ParseUint(a, 10, 63)
	l, err2 := strconv.ParseUint(b, 10, 63)
	if !found || err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return int64(t), int64(l), true
}

// envAheadOf is envAhead on the line (member, place) and the lives hash
// (member -> "till:limit"; "#" the last place given, "^" the highest
// limit): the script's rule (ew_capacity, ew_live). A mark with grace (ms)
// or less of its life left is leaving: passed over, but its own queue's
// still. A mark ahead is left a slot while it and those left one before it
// all have a limit above count plus their number, up to the call's free
// slots (limit - count); the call then takes at most what the lowest of
// their limits leaves. As the script, it reads the marks ahead in at most
// ewReads reads of as many more as it has passed (a dead mark is dropped
// where it is met): marks behind more passed ones are not reached.
func envAheadOf(line []redis.Z, lives map[string]string, member string, now, grace int64, limit int, count int64) int {
	left := func(m string) (int64, int64) { // ms of life left (-1 dead), limit
		till, lim, ok := envMark(lives[m])
		if !ok || till < now {
			return -1, 0
		}
		return till - now, lim
	}
	free := int64(limit) - count
	if free <= 0 {
		return 0
	}
	mine, have := 0.0, false
	if l, _ := left(member); l >= 0 {
		for _, z := range line {
			if z.Member == member {
				mine, have = z.Score, true
			}
		}
	}
	var ahead []string // in place order, as ZRANGEBYSCORE reads them
	for _, z := range line {
		if m, _ := z.Member.(string); m != member && (!have || z.Score < mine) {
			ahead = append(ahead, m)
		}
	}
	n, passed, lowest := int64(0), int64(0), int64(math.MaxInt64)
	for read := 0; read < ewReads && n < free; read++ {
		want := free - n + passed
		batch := ahead[:min(int64(len(ahead)), want)]
		ahead = ahead[len(batch):]
		if len(batch) == 0 {
			break
		}
		for _, m := range batch {
			l, lim := left(m)
			switch {
			case l < 0: // (dropped)
			case l > grace && n < free && min(lowest, lim) > count+n:
				n, lowest = n+1, min(lowest, lim)
			default:
				passed++
			}
		}
		if int64(len(batch)) < want {
			break
		}
	}
	return int(n + int64(limit) - min(int64(limit), lowest))
}

// ewReads is how many reads of the line ew_live makes at most.
const ewReads = 4
