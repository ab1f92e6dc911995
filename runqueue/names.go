package runqueue

import (
	"slices"
	"sync"

	"github.com/runqueue/runqueue/keys"
)

// queueNames are a base queue's key names and the script arguments that
// never change for it, built once and shared by every call on the queue:
// building them costs a dozen string concatenations, which the hot calls
// (Enqueue, Dequeue, Ack) would otherwise pay each time. Read-only: every
// slice is clipped, so a call that appends keys or arguments appends to a
// copy.
type queueNames struct {
	qk        keys.Queue
	place     []string // the enqueue's KEYS: placeKeys and the shard's TTL set
	dequeue   []string // the dequeue scripts' own KEYS (lib/dequeue)
	held      []string // heldKeys
	vtime     []string // vtimeKeys
	member    string   // qk.Member()
	vbase     string   // qk.VariantBase()
	wake      string   // qk.Wake()
	runPrefix string   // qk.RunPrefix()
}

// nameCacheMax bounds the queues whose names are kept: past it the cache
// starts again empty (an instance serving more queues than this pays the
// concatenations again now and then, and never more memory than the cap).
const nameCacheMax = 4096

// nameCache maps (env, queue) to its queueNames.
type nameCache struct {
	mu sync.RWMutex
	m  map[[2]string]*queueNames
}

// names returns the names of base queue (env, queue).
func (q *Queue) names(env, queue string) *queueNames {
	ref := [2]string{env, queue}
	c := &q.nameCache
	c.mu.RLock()
	n := c.m[ref]
	c.mu.RUnlock()
	if n != nil {
		return n
	}
	n = q.buildNames(q.space.Env(env).Queue(queue))
	c.mu.Lock()
	if c.m == nil || len(c.m) >= nameCacheMax {
		c.m = make(map[[2]string]*queueNames)
	}
	c.m[ref] = n
	c.mu.Unlock()
	return n
}

func (q *Queue) buildNames(qk keys.Queue) *queueNames {
	return &queueNames{
		qk:    qk,
		place: slices.Clip(placeKeys(qk, qk.TTL())),
		dequeue: slices.Clip([]string{qk.CkIndex(), qk.DelayIndex(), qk.Depth(), qk.Master(), qk.Leases(),
			qk.Env.InflightCount(), qk.Held(), qk.Runs(), qk.KeyInflight(), qk.Tokens(), qk.TTL()}),
		held:      slices.Clip(q.heldKeys(qk)),
		vtime:     slices.Clip(q.vtimeKeys(qk)),
		member:    qk.Member(),
		vbase:     qk.VariantBase(),
		wake:      qk.Wake(),
		runPrefix: qk.RunPrefix(),
	}
}
