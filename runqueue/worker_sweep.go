package runqueue

import (
	"context"
	"math/rand/v2"
	"time"
)

// sweepLoop sweeps the worker's shards (WorkerConfig.SweepInterval) until
// Shutdown starts or the Start context ends. The first sweep comes at a
// random time within one interval, so that workers started together do
// not sweep in step.
func (w *Worker) sweepLoop() {
	defer w.bg.Done()
	t := time.NewTimer(rand.N(w.cfg.SweepInterval) + 1)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-w.stopFetch:
			return
		case <-w.base.Done():
			return
		}
		for _, sh := range w.shards {
			if !w.sweep(sh) {
				return
			}
		}
		t.Reset(w.cfg.SweepInterval/2 + rand.N(w.cfg.SweepInterval))
	}
}

// sweep recovers the expired leases and expires the passed TTLs of one
// shard, calling again while a call returns its limit. Both are atomic per
// run in their scripts, so any number of workers may sweep one shard at
// once. It returns false when the worker is stopping.
func (w *Worker) sweep(shard int) bool {
	ops := [...]struct {
		name string
		fn   func(context.Context, int, int) (int, error)
	}{
		{"recovered expired leases", w.q.RecoverLeases},
		{"expired runs past their TTL", w.q.ExpireTTL},
	}
	for _, op := range ops {
		for {
			select {
			case <-w.stopFetch:
				return false
			case <-w.base.Done():
				return false
			default:
			}
			n, err := op.fn(w.ctx(), shard, w.cfg.SweepLimit)
			if err != nil {
				if w.base.Err() != nil {
					return false
				}
				w.log.Warn("runqueue: worker sweep failed", "shard", shard, "sweep", op.name, "err", err)
				break
			}
			if n > 0 {
				w.log.Info("runqueue: worker "+op.name, "shard", shard, "runs", n)
			}
			if n < w.cfg.SweepLimit {
				break
			}
		}
	}
	return true
}
