package runqueue

import (
	"context"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/keys"
)

// envAhead reads the env's waiting hash (lua/lib/envwait.lua) as a flag-on
// dequeue of qk would now: how many other queues of the env wait ahead of
// qk for a slot (live marks with an earlier place than qk's, or every live
// mark of another queue when qk has none). A dequeue leaves a free slot of
// the env to each. Marks live by Redis's clock (TIME), as the script reads
// them.
func (q *Queue) envAhead(ctx context.Context, qk keys.Queue) (int, error) {
	marks, err := q.rdb.HGetAll(ctx, qk.Env.Waiting()).Result()
	if err != nil && err != redis.Nil {
		return 0, err
	}
	if len(marks) == 0 {
		return 0, nil
	}
	now, err := q.rdb.Time(ctx).Result()
	if err != nil {
		return 0, err
	}
	return envAheadOf(marks, qk.Member(), now.UnixMilli()), nil
}

// envAheadOf is envAhead on the hash's fields (member -> "<turn>:<until>";
// "#" the last place given): the script's rule, field by field.
func envAheadOf(marks map[string]string, member string, now int64) int {
	type mark struct{ turn, until int64 }
	parse := func(v string) (mark, bool) {
		t, u, ok := strings.Cut(v, ":")
		if !ok {
			return mark{}, false
		}
		turn, err1 := strconv.ParseInt(t, 10, 64)
		until, err2 := strconv.ParseInt(u, 10, 64)
		return mark{turn, until}, err1 == nil && err2 == nil
	}
	mine, have := mark{}, false
	if v, ok := marks[member]; ok {
		if m, ok := parse(v); ok && m.until >= now {
			mine, have = m, true
		}
	}
	n := 0
	for f, v := range marks {
		if f == "#" || f == member {
			continue
		}
		if m, ok := parse(v); ok && m.until >= now && (!have || m.turn < mine.turn) {
			n++
		}
	}
	return n
}
