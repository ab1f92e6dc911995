package fairness

import (
	"fmt"
	"sort"
	"time"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/vtime"
)

// ModelConfig configures a ModelDriver.
type ModelConfig struct {
	WindowMultiplier int           // 0: the model's default
	IdleMaxEntries   int           // 0: the model's default
	MaxAttempts      int           // deliveries before dead letter; 0: no limit
	Lease            time.Duration // lease of a dequeued run; 0: one minute
}

// ModelDriver drives the vtime model: one base queue, a millisecond clock,
// leases and TTL deadlines kept beside the model (the model leaves both to
// its caller, as runqueue's sweepers do for the Lua).
type ModelDriver struct {
	cfg   vtime.Config
	m     *vtime.Model
	now   int64 // ms
	lease int64 // ms
	runs  map[string]*modelRun
	// log replays every state change on a fresh model: how ProbeSingles
	// clones the model without reaching into it.
	log []func(*vtime.Model) error
}

type modelRun struct {
	key   string
	ttl   int64 // TTL deadline while never dequeued, 0 for none
	held  bool
	lease int64 // lease deadline while held
}

// NewModelDriver returns a driver on an empty model.
func NewModelDriver(c ModelConfig) *ModelDriver {
	lease := c.Lease
	if lease == 0 {
		lease = time.Minute
	}
	cfg := vtime.Config{WindowMultiplier: c.WindowMultiplier, IdleMaxEntries: c.IdleMaxEntries,
		MaxAttempts: c.MaxAttempts}
	return &ModelDriver{cfg: cfg, m: vtime.New(cfg), now: 1_000_000_000_000, lease: lease.Milliseconds(),
		runs: map[string]*modelRun{}}
}

// Model returns the model under test.
func (d *ModelDriver) Model() *vtime.Model { return d.m }

// do applies f to the model and logs it for replay.
func (d *ModelDriver) do(f func(*vtime.Model) error) error {
	d.log = append(d.log, f)
	return f(d.m)
}

// Enqueue implements Driver.
func (d *ModelDriver) Enqueue(key, id string, priority int, delay, ttl time.Duration) error {
	now, at := d.now, d.now+delay.Milliseconds()
	r := &modelRun{key: key}
	if ttl > 0 {
		r.ttl = now + max(ttl.Milliseconds(), 1)
	}
	deadline := r.ttl
	err := d.do(func(m *vtime.Model) error {
		if err := m.Enqueue(id, key, priority, at, now); err != nil {
			return err
		}
		if deadline > 0 {
			m.SetTTL(id, deadline)
		}
		return nil
	})
	if err != nil {
		return err
	}
	d.runs[id] = r
	return nil
}

// Dequeue implements Driver: as runqueue's Dequeue, a call that took runs
// past their TTL and delivered fewer than maxCount is made again for the
// rest (vtime's DequeueCalls, at most 64 times).
func (d *ModelDriver) Dequeue(maxCount int) ([]Served, error) {
	now := d.now
	var got []vtime.Served
	_ = d.do(func(m *vtime.Model) error { got, _ = m.DequeueCalls(maxCount, now, 64, true); return nil })
	out, err := decodeServed(got)
	if err != nil {
		return nil, err
	}
	for _, s := range out {
		r, ok := d.runs[s.ID]
		if !ok {
			return nil, fmt.Errorf("model served unknown run %q", s.ID)
		}
		if s.Expired {
			delete(d.runs, s.ID)
			continue
		}
		r.held, r.lease, r.ttl = true, now+d.lease, 0
	}
	return out, nil
}

func decodeServed(in []vtime.Served) ([]Served, error) {
	out := make([]Served, 0, len(in))
	for _, s := range in {
		id, err := keys.DecodeSegment(s.ID)
		if err != nil {
			return nil, err
		}
		out = append(out, Served{Key: s.Key, ID: id, Attempt: s.Attempt, Expired: s.Expired, Swept: s.Swept})
	}
	return out, nil
}

// Ack implements Driver.
func (d *ModelDriver) Ack(id string) error {
	if err := d.do(func(m *vtime.Model) error { return m.Ack(id) }); err != nil {
		return err
	}
	delete(d.runs, id)
	return nil
}

// Nack implements Driver.
func (d *ModelDriver) Nack(id string, retryAfter time.Duration, deadLetter bool) (bool, error) {
	now, at := d.now, d.now+retryAfter.Milliseconds()
	var requeued bool
	err := d.do(func(m *vtime.Model) (err error) { requeued, err = m.Nack(id, at, now, deadLetter); return err })
	if err != nil {
		return false, err
	}
	d.settle(id, requeued)
	return requeued, nil
}

func (d *ModelDriver) settle(id string, requeued bool) {
	if !requeued {
		delete(d.runs, id)
		return
	}
	d.runs[id].held = false
}

// RecoverLeases implements Driver: in (lease deadline, id) order.
func (d *ModelDriver) RecoverLeases() (int, error) {
	var due []string
	for id, r := range d.runs {
		if r.held && r.lease <= d.now {
			due = append(due, id)
		}
	}
	sort.Slice(due, func(i, j int) bool {
		a, b := d.runs[due[i]], d.runs[due[j]]
		return a.lease < b.lease || (a.lease == b.lease && due[i] < due[j])
	})
	now := d.now
	for _, id := range due {
		var requeued bool
		err := d.do(func(m *vtime.Model) (err error) { requeued, err = m.Recover(id, now); return err })
		if err != nil {
			return 0, err
		}
		d.settle(id, requeued)
	}
	return len(due), nil
}

// SweepTTL implements Driver: in (deadline, id) order.
func (d *ModelDriver) SweepTTL() (int, error) {
	var due []string
	for id, r := range d.runs {
		if !r.held && r.ttl > 0 && r.ttl <= d.now {
			due = append(due, id)
		}
	}
	sort.Slice(due, func(i, j int) bool {
		a, b := d.runs[due[i]], d.runs[due[j]]
		return a.ttl < b.ttl || (a.ttl == b.ttl && due[i] < due[j])
	})
	for _, id := range due {
		var ok bool
		_ = d.do(func(m *vtime.Model) error { ok = m.Expire(id); return nil })
		if !ok {
			return 0, fmt.Errorf("model: run %q due for expiry is not queued", id)
		}
		delete(d.runs, id)
	}
	return len(due), nil
}

// SetWeight implements Driver.
func (d *ModelDriver) SetWeight(key string, w float64) error {
	return d.do(func(m *vtime.Model) error { m.SetWeight(key, w); return nil })
}

// SetLimits implements Driver.
func (d *ModelDriver) SetLimits(l Limits) error {
	vl := vtime.Limits{Env: l.Env, Queue: l.Queue, Key: l.Key}
	return d.do(func(m *vtime.Model) error { return setModelLimits(m, vl) })
}

// Advance implements Driver.
func (d *ModelDriver) Advance(dt time.Duration) error {
	d.now += dt.Milliseconds()
	return nil
}

// ExpireState implements StateExpirer.
func (d *ModelDriver) ExpireState() error {
	return d.do(expireModelState)
}

// V implements ClockReader.
func (d *ModelDriver) V() (float64, error) { return modelV(d.m), nil }

// ProbeSingles implements BatchProber: it replays the model's history on a
// fresh model and runs maxCount calls of dequeue(1) on it.
func (d *ModelDriver) ProbeSingles(maxCount int) ([]Served, error) {
	c := vtime.New(d.cfg)
	for _, f := range d.log {
		_ = f(c) // errors were reported when the step first ran
	}
	var got []vtime.Served
	for i := 0; i < maxCount; i++ {
		for _, s := range c.Dequeue(1, d.now) {
			if !s.Swept { // (a sweep at a key's head is no serve)
				got = append(got, s)
			}
		}
	}
	return decodeServed(got)
}
