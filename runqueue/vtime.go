package runqueue

import (
	"context"
	"errors"

	"github.com/runqueue/runqueue/keys"
)

func (q *Queue) vtimeCandidates(ctx context.Context, qk keys.Queue, maxCount int, now int64) ([]string, []any, error) {
	return nil, nil, errors.New("runqueue: vtime scheduling not built yet")
}
