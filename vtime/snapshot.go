package vtime

// SnapshotRun is one queued run of a Snapshot.
type SnapshotRun struct {
	ID       string // encoded id (the member in Redis)
	Key      string
	Priority int
	At       int64 // available_at ms
	Attempt  int
	Delayed  bool // in the delayed set (not yet promoted)
}

// Snapshot is the state of one base queue as read from Redis, to replay
// the scheduler on it without touching Redis (runqueue's Preview).
type Snapshot struct {
	V       float64
	L       float64
	HasL    bool
	Cursor  int
	Tags    map[string]float64 // variant member -> tag
	Idle    map[string]float64 // variant member -> parked tag
	Weights map[string]float64 // variant member -> weight
	Runs    []SnapshotRun
	// InFlight is the number of runs in flight per variant member.
	InFlight map[string]int
	EnvOther int
}

// Restore builds a model holding s.
func Restore(cfg Config, s Snapshot) *Model {
	m := New(cfg)
	m.V, m.L, m.HasL, m.Cursor, m.EnvOther = s.V, s.L, s.HasL, s.Cursor, s.EnvOther
	for k, v := range s.Tags {
		m.tags[k] = v
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
		r := &run{id: sr.ID, key: sr.Key, priority: sr.Priority, at: sr.At, attempt: sr.Attempt}
		m.runs[r.id] = r
		vm := m.member(r)
		// Tags come with the snapshot: runs are added without registering.
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
