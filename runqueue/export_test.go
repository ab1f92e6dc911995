package runqueue

import (
	"context"

	"github.com/runqueue/runqueue/vtime"
)

// SchedulerSnapshot returns the scheduler state of a queue as stored in
// Redis (no runs) and whether its state hash exists. Tests only.
func (q *Queue) SchedulerSnapshot(ctx context.Context, env, queue string) (vtime.Snapshot, bool, error) {
	st, err := q.readScheduler(ctx, q.space.Env(env).Queue(queue))
	if err != nil {
		return vtime.Snapshot{}, false, err
	}
	return st.snap, st.exists, nil
}
