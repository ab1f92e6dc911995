package runqueue

import (
	"context"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/keys"
)

// vtimeCandidates reads what a fair dequeue may touch: the first
// 2*window tags, the first window variants in age order, the first window
// due delayed variants and, when ckIndex holds variants without a tag, the
// window at the discovery cursor. window = maxCount * WindowMultiplier.
// extra is the scheduler's ARGV tail.
func (q *Queue) vtimeCandidates(ctx context.Context, qk keys.Queue, maxCount int, now int64) ([]string, []any, error) {
	wc := int64(maxCount * q.cfg.WindowMultiplier)
	var tags, age, due *redis.StringSliceCmd
	var nIndex, nTags *redis.IntCmd
	var floor *redis.StringCmd
	_, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		tags = p.ZRange(ctx, qk.CkVtime(), 0, 2*wc-1)
		age = p.ZRange(ctx, qk.CkIndex(), 0, wc-1)
		due = p.ZRangeByScore(ctx, qk.DelayIndex(), &redis.ZRangeBy{Min: "-inf", Max: strconv.FormatInt(now, 10), Count: wc})
		nIndex = p.ZCard(ctx, qk.CkIndex())
		nTags = p.ZCard(ctx, qk.CkVtime())
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	lists := [][]string{tags.Val(), age.Val(), due.Val()}
	repair := nIndex.Val() > nTags.Val()
	if repair {
		floor = q.rdb.Get(ctx, qk.CkVtimeFloor())
		c := int64(0)
		if raw, err := floor.Result(); err == nil {
			if f := strings.Split(raw, "|"); len(f) == 5 {
				c, _ = strconv.ParseInt(f[2], 10, 64)
			}
		} else if err != redis.Nil {
			return nil, nil, err
		}
		if c < nIndex.Val() {
			cursor, err := q.rdb.ZRange(ctx, qk.CkIndex(), c, c+wc-1).Result()
			if err != nil {
				return nil, nil, err
			}
			lists = append(lists, cursor)
		}
	}
	flag := 0
	if repair {
		flag = 1
	}
	extra := append(q.vtimeArgs(), q.cfg.WindowMultiplier, flag)
	return union(lists...), extra, nil
}
