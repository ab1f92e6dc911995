package vtime

// SnapshotRun is one queued run of a Snapshot.
type SnapshotRun struct {
	ID       string // encoded id (the member in Redis)
	Key      string
	Priority int
	At       int64 // available_at ms
	Attempt  int
	Delayed  bool  // in the delayed set (not yet promoted)
	TTL      int64 // TTL deadline (ms) of a run never delivered, 0 for none
}

// Snapshot is the state of one base queue as read from Redis, to replay
// the scheduler on it without touching Redis (runqueue's Preview).
type Snapshot struct {
	V, Epoch int64 // stored clock (units) and rebases done
	Cursor   int
	NextSeq  int64 // 0 means 1
	GK       int
	GN       int64 // 0 means 1
	GP       int64
	// Began: the state's first discovery read is done, at Born (ms).
	Began bool
	Born  int64
	// Marked: the cold mark is set, at Mark (ms) (see Model.ColdMark).
	Marked  bool
	Mark    int64
	Reg     map[string]Reg   // variant member -> registration
	Idle    map[string]int64 // variant member -> parked tag
	Weights map[string]int64 // variant member -> milli-weight
	Runs    []SnapshotRun
	// InFlight is the number of runs in flight per variant member.
	InFlight map[string]int
	EnvOther int
	EnvAhead int
}

// Restore builds a model holding s.
func Restore(cfg Config, s Snapshot) *Model {
	m := New(cfg)
	m.v, m.epoch, m.cursor, m.gk, m.gp = s.V, s.Epoch, s.Cursor, s.GK, s.GP
	m.nextSeq, m.gn = max(1, s.NextSeq), max(1, s.GN)
	m.began, m.born = s.Began, s.Born
	m.marked, m.mark = s.Marked, s.Mark
	m.EnvOther, m.EnvAhead = s.EnvOther, s.EnvAhead
	for k, r := range s.Reg {
		cp := r
		m.reg[k] = &cp
	}
	for k, v := range s.Idle {
		m.idle[k] = v
	}
	for k, v := range s.Weights {
		m.weights[k] = v
	}
	for k, v := range s.InFlight {
		m.inflight[k] = v
	}
	for _, sr := range s.Runs {
		r := &run{id: sr.ID, key: sr.Key, priority: sr.Priority, at: sr.At, attempt: sr.Attempt, ttl: sr.TTL}
		m.runs[r.id] = r
		vm := m.member(r)
		// Registrations come with the snapshot: runs are added without registering.
		if sr.Delayed {
			r.state = Delayed
			addTo(m.delayed, vm, r.id, float64(r.at))
			continue
		}
		r.state = Ready
		addTo(m.ready, vm, r.id, m.readyScore(r))
	}
	return m
}

// Snapshot returns the model's state as a Snapshot (the runs' ids encoded).
func (m *Model) Snapshot() Snapshot {
	s := Snapshot{V: m.v, Epoch: m.epoch, Cursor: m.cursor, NextSeq: m.nextSeq,
		GK: m.gk, GN: m.gn, GP: m.gp, Began: m.began, Born: m.born, Marked: m.marked, Mark: m.mark, Reg: map[string]Reg{}, Idle: map[string]int64{}, Weights: map[string]int64{},
		InFlight: map[string]int{}, EnvOther: m.EnvOther, EnvAhead: m.EnvAhead}
	for k, r := range m.reg {
		s.Reg[k] = *r
	}
	for k, v := range m.idle {
		s.Idle[k] = v
	}
	for k, v := range m.weights {
		s.Weights[k] = v
	}
	for k, v := range m.inflight {
		s.InFlight[k] = v
	}
	for _, r := range m.runs {
		if r.state != Ready && r.state != Delayed {
			continue
		}
		s.Runs = append(s.Runs, SnapshotRun{ID: r.id, Key: r.key, Priority: r.priority, At: r.at,
			Attempt: r.attempt, Delayed: r.state == Delayed, TTL: r.ttl})
	}
	return s
}

// Clone returns a deep copy of m (runs in flight and dead included).
func (m *Model) Clone() *Model {
	c := *m
	c.reg = make(map[string]*Reg, len(m.reg))
	for k, r := range m.reg {
		cp := *r
		c.reg[k] = &cp
	}
	c.idle = cloneMap(m.idle)
	c.weights = cloneMap(m.weights)
	c.inflight = cloneMap(m.inflight)
	c.keyOf = cloneMap(m.keyOf)
	c.runs = make(map[string]*run, len(m.runs))
	for id, r := range m.runs {
		cp := *r
		c.runs[id] = &cp
	}
	cloneSets := func(in map[string]map[string]float64) map[string]map[string]float64 {
		out := make(map[string]map[string]float64, len(in))
		for k, v := range in {
			out[k] = cloneMap(v)
		}
		return out
	}
	c.ready, c.delayed = cloneSets(m.ready), cloneSets(m.delayed)
	return &c
}

func cloneMap[K comparable, V any](in map[K]V) map[K]V {
	out := make(map[K]V, len(in))
	for k, v := range in {
		out[k] = v
	}
	return out
}
