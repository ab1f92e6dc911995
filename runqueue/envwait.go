package runqueue

import (
	"context"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/keys"
)

// envAhead reads the env's waiting line (lua/lib/envwait.lua) as a flag-on
// dequeue of qk would now: how many other queues of the env wait ahead of
// qk for a slot (live marks with an earlier place than qk's, or every live
// mark of another queue when qk has none). A dequeue leaves a free slot of
// the env to each (the script stops counting at the env's free slots,
// which comes to the same capacity). Marks live by Redis's clock (TIME,
// read on the node that holds the env), as the script reads them.
func (q *Queue) envAhead(ctx context.Context, qk keys.Queue) (int, error) {
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
	return envAheadOf(line, lives, qk.Member(), now.UnixMilli(), ms(q.leaveGrace)), nil
}

// envAheadOf is envAhead on the line (member, place) and the lives hash
// (member -> live until, ms; "#" the last place given): the script's rule.
// A mark with grace (ms) or less of its life left is leaving: passed over,
// but its own queue's still.
func envAheadOf(line []redis.Z, lives map[string]string, member string, now, grace int64) int {
	left := func(m string) int64 { // ms of life left; -1 dead
		v, ok := lives[m]
		n, err := strconv.ParseUint(v, 10, 63)
		if !ok || err != nil || int64(n) < now {
			return -1
		}
		return int64(n) - now
	}
	mine, have := 0.0, false
	for _, z := range line {
		if z.Member == member && left(member) >= 0 {
			mine, have = z.Score, true
		}
	}
	n := 0
	for _, z := range line {
		m, _ := z.Member.(string)
		if m != member && left(m) > grace && (!have || z.Score < mine) {
			n++
		}
	}
	return n
}
