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
	dqVtime   []string // the flag-on dequeue's KEYS: dequeue, vtime, the env's waiting line's two keys (left out without an env limit)
	member    string   // qk.Member()
	vbase     string   // qk.VariantBase()
	wake      string   // qk.Wake()
	runPrefix string   // qk.RunPrefix()
}

// The cache is bounded by entries and by the bytes of the names it holds
// (an env and a queue name of 256 bytes that encode to 768 each make an
// entry of some 30 KB): past either bound it starts again empty. An
// instance serving more queues than that pays the concatenations again now
// and then, and never holds more than about nameCacheBytes of names.
const (
	nameCacheMax   = 4096
	nameCacheBytes = 8 << 20
)

// nameCache maps (env, queue) to its queueNames.
type nameCache struct {
	mu    sync.RWMutex
	m     map[[2]string]*queueNames
	bytes int // the names' bytes in m (n.size)
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
	size := n.size()
	c.mu.Lock()
	if c.m == nil || len(c.m) >= nameCacheMax || c.bytes+size > nameCacheBytes {
		c.m, c.bytes = make(map[[2]string]*queueNames), 0
	}
	if old := c.m[ref]; old != nil { // built twice at once
		c.bytes -= old.size()
	}
	c.m[ref] = n
	c.bytes += size
	c.mu.Unlock()
	return n
}

// size is the bytes of n's strings.
func (n *queueNames) size() int {
	total := len(n.member) + len(n.vbase) + len(n.wake) + len(n.runPrefix)
	for _, ks := range [][]string{n.place, n.dequeue, n.held, n.vtime, n.dqVtime} {
		for _, k := range ks {
			total += len(k)
		}
	}
	return total
}

func (q *Queue) buildNames(qk keys.Queue) *queueNames {
	dequeue := slices.Clip([]string{qk.CkIndex(), qk.DelayIndex(), qk.Depth(), qk.Master(), qk.Leases(),
		qk.Env.InflightCount(), qk.Held(), qk.Runs(), qk.KeyInflight(), qk.Tokens(), qk.TTL()})
	vtime := slices.Clip(q.vtimeKeys(qk))
	return &queueNames{
		qk:        qk,
		place:     slices.Clip(placeKeys(qk, qk.TTL())),
		dequeue:   dequeue,
		held:      slices.Clip(q.heldKeys(qk)),
		vtime:     vtime,
		dqVtime:   slices.Clip(slices.Concat(dequeue, vtime, []string{qk.Env.Waiting(), qk.Env.WaitingUntil()})),
		member:    qk.Member(),
		vbase:     qk.VariantBase(),
		wake:      qk.Wake(),
		runPrefix: qk.RunPrefix(),
	}
}
