package runqueue

import (
	"context"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/keys"
)

// vtimeCandidates reads what a fair dequeue may touch: the first 2*window
// tags (window = maxCount * WindowMultiplier; 2*window more when repairing,
// to replace stale tags), the first scan variants in age
// order, the first scan due delayed variants and, when ckIndex holds
// variants without a tag, scan more at the discovery cursor (scan =
// scanLimit(maxCount)). extra is the scheduler's ARGV tail.
// When need > 0 (no per-key limit) and no repair is due, only the first
// need entries of each window are returned.
func (q *Queue) vtimeCandidates(ctx context.Context, qk keys.Queue, maxCount, need int, now int64) ([]string, []any, error) {
	wc := int64(maxCount * q.cfg.WindowMultiplier)
	scan := int64(q.scanLimit(maxCount))
	var tags, age, due *redis.StringSliceCmd
	_, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		// One entry more than the script uses tells whether a set was read whole.
		tags = p.ZRange(ctx, qk.CkVtime(), 0, 2*wc)
		age = p.ZRange(ctx, qk.CkIndex(), 0, scan)
		due = p.ZRangeByScore(ctx, qk.DelayIndex(), &redis.ZRangeBy{Min: "-inf", Max: strconv.FormatInt(now, 10), Count: scan})
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	t, a := tags.Val(), age.Val()
	nTags, nIndex := int64(len(t)), int64(len(a))
	if nTags > 2*wc {
		t = t[:2*wc]
	}
	if nIndex > scan {
		a = a[:scan]
	}
	// Discovery is needed when ckIndex and ckVtime do not hold the same
	// number of variants: then some ready variant has no tag (written with
	// the flag off, or state expired), or some tag has no ready variant
	// (left by a flag-off drain), which usually comes with the former. The
	// reads above give the counts unless they were cut short.
	if nTags > 2*wc || nIndex > scan {
		var ci, ct *redis.IntCmd
		if _, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			ci = p.ZCard(ctx, qk.CkIndex())
			ct = p.ZCard(ctx, qk.CkVtime())
			return nil
		}); err != nil {
			return nil, nil, err
		}
		nIndex, nTags = ci.Val(), ct.Val()
	}
	repair := nIndex != nTags
	if need > 0 && !repair {
		t, a = t[:min(len(t), need)], a[:min(len(a), need)]
	}
	lists := [][]string{t, a, due.Val()}
	if repair {
		// Spare tags to replace stale ones in pass 1.
		if nTags > 2*wc {
			spare, err := q.rdb.ZRange(ctx, qk.CkVtime(), 2*wc, 4*wc-1).Result()
			if err != nil {
				return nil, nil, err
			}
			lists = append(lists, spare)
		}
		c := int64(0)
		if raw, err := q.rdb.Get(ctx, qk.CkVtimeFloor()).Result(); err == nil {
			if f := strings.Split(raw, "|"); len(f) == 4 {
				c, _ = strconv.ParseInt(f[2], 10, 64)
			}
		} else if err != redis.Nil {
			return nil, nil, err
		}
		if c < nIndex {
			cursor, err := q.rdb.ZRange(ctx, qk.CkIndex(), c, c+scan-1).Result()
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
