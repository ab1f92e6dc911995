package runqueue

import "time"

// Observer receives what a Queue and its Workers do, for metrics (the
// runqueue/metrics package implements one for Prometheus). Calls come
// after the Redis call that did the work succeeded, most on the caller's
// goroutine; a Worker's, and those of a coalesced run whose caller stopped
// waiting, on a goroutine of the Queue's or Worker's own. An Observer must
// be safe for concurrent use and fast (no I/O).
// Set it in Config.Observer; nil observes nothing.
type Observer interface {
	// Enqueued: n new runs were queued in env/queue (a retried enqueue of
	// the same run is not counted again).
	Enqueued(env, queue string, n int)
	// Dequeued: runs moved in flight at now; each run's wait is now minus
	// its AvailableAt.
	Dequeued(runs []*Run, now time.Time)
	// Acked: n runs of env/queue finished.
	Acked(env, queue string, n int)
	// Nacked: a run went back to its queue (requeued) or to the dead
	// letter (requeued false).
	Nacked(env, queue string, requeued bool)
	// Expired: n queued runs of env/queue passed their TTL and were
	// deleted (by ExpireTTL, a dequeue that took them, or Repair).
	Expired(env, queue string, n int)
	// Recovered: n runs of env/queue whose lease passed were taken back:
	// dead of them dead-lettered (no attempts left), the others requeued.
	Recovered(env, queue string, n, dead int)
	// Handled: a Worker's handler returned (or panicked) after d, with
	// outcome one of OutcomeAck, OutcomeRetry, OutcomeDead, OutcomePanic,
	// OutcomeLeaseLost.
	Handled(env, queue string, d time.Duration, outcome Outcome)
}

// Outcome is what became of a run a Worker's handler ran.
type Outcome string

// Handler outcomes (Observer.Handled).
const (
	OutcomeAck       Outcome = "ack"        // handler returned nil; the run was acked
	OutcomeRetry     Outcome = "retry"      // handler failed; the run was nacked for a retry
	OutcomeDead      Outcome = "dead"       // handler failed for good; the run was dead-lettered
	OutcomePanic     Outcome = "panic"      // handler panicked; the run was nacked
	OutcomeLeaseLost Outcome = "lease_lost" // the lease was lost while the handler ran, or its result could not be sent (it runs again once its lease passes)
)

// NopObserver observes nothing; embed it to implement only some methods.
type NopObserver struct{}

func (NopObserver) Enqueued(string, string, int)                   {}
func (NopObserver) Dequeued([]*Run, time.Time)                     {}
func (NopObserver) Acked(string, string, int)                      {}
func (NopObserver) Nacked(string, string, bool)                    {}
func (NopObserver) Expired(string, string, int)                    {}
func (NopObserver) Recovered(string, string, int, int)             {}
func (NopObserver) Handled(string, string, time.Duration, Outcome) {}

// observing reports whether o can see anything. The operations skip their
// per-queue bookkeeping for an Observer that would throw it away, so the
// default costs no allocation on the hot path.
func observing(o Observer) bool {
	switch o.(type) {
	case nil, NopObserver, *NopObserver:
		return false
	}
	return true
}

// queueCount is one base queue's line of a queueTally.
type queueCount struct {
	env, queue string
	n, dead    int
}

// queueTally adds up what a sweep did per base queue, in the order the
// queues were first met, so that it reports once per queue rather than once
// per run.
type queueTally struct {
	rows []queueCount
	idx  map[[2]string]int
}

func (t *queueTally) add(env, queue string, n, dead int) {
	if t.idx == nil {
		t.idx = map[[2]string]int{}
	}
	k := [2]string{env, queue}
	i, ok := t.idx[k]
	if !ok {
		i = len(t.rows)
		t.idx[k] = i
		t.rows = append(t.rows, queueCount{env: env, queue: queue})
	}
	t.rows[i].n += n
	t.rows[i].dead += dead
}
