// Test-only access to the package's internals: compiled into the tests of
// ./runqueue alone, so none of this is public API.
package runqueue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/vtime"
)

// MaxCorruptCalls is how many script calls a dequeue makes again after
// calls that delivered nothing they took (see serve). Tests only.
const MaxCorruptCalls = maxCorruptCalls

// SchedulerSnapshot returns the scheduler state of a queue as stored in
// Redis (no runs) and whether its state hash exists. Tests only.
func (q *Queue) SchedulerSnapshot(ctx context.Context, env, queue string) (vtime.Snapshot, bool, error) {
	st, err := q.readScheduler(ctx, q.space.Env(env).Queue(queue))
	if err != nil {
		return vtime.Snapshot{}, false, err
	}
	return st.snap, st.exists, nil
}

// RecordOf reads the stored record of a run: its concurrency key, priority
// and attempt. Tests only.
func (q *Queue) RecordOf(ctx context.Context, env, queue, id string) (key string, priority, attempt int, err error) {
	raw, err := q.rdb.HGet(ctx, q.space.Env(env).Queue(queue).Runs(), keys.Segment(id)).Result()
	if err != nil {
		return "", 0, 0, err
	}
	r, ok := parseRecord(raw)
	if !ok {
		return "", 0, 0, fmt.Errorf("malformed record %q", raw)
	}
	key, err = keys.DecodeVariantMember(r.vm)
	return key, r.pr, r.att, err
}

// KeyInflight is the in-flight count of a concurrency key. Tests only.
func (q *Queue) KeyInflight(ctx context.Context, env, queue, key string) (int, error) {
	qk := q.space.Env(env).Queue(queue)
	n, err := q.rdb.HGet(ctx, qk.KeyInflight(), qk.Variant(key).Member()).Int()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return n, err
}

// FlagOffScripts returns the assembled source of every script that can run
// with the scheduler flag off, by name. Used by the golden SHA-1 pin.
func FlagOffScripts() (map[string]string, error) { return scriptSources(false) }

// FlagOnScripts returns the assembled source of every script that runs with
// the scheduler flag on, by name.
func FlagOnScripts() (map[string]string, error) { return scriptSources(true) }

// FlagOnFunctions maps each function of the flag-on Functions library, by
// its script's name, to its function's name.
func FlagOnFunctions() (map[string]string, error) {
	s, err := buildScripts(true)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, e := range libraryScripts(s) {
		out[e.fnSuffix()] = e.sc.fn
	}
	return out, nil
}

// FlagOnLibrary is the flag-on Functions library's code, as "flagon".
func FlagOnLibrary() (map[string]string, error) {
	s, err := buildScripts(true)
	if err != nil {
		return nil, err
	}
	return map[string]string{"flagon": s.lib.src}, nil
}

func scriptSources(vtime bool) (map[string]string, error) {
	s, err := buildScripts(vtime)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, sc := range s.all() {
		out[sc.name] = sc.src
	}
	return out, nil
}

// Heartbeat extends the leases of w's running handlers now, as its
// heartbeat does every WorkerConfig.HeartbeatInterval. Tests only.
func (w *Worker) Heartbeat() { w.heartbeat() }

// DequeueShardFetch is what a Worker's shard fetch gets (dequeueShard):
// the runs, the first failure of a queue's own the call passed over, and
// the call's error.
func (q *Queue) DequeueShardFetch(ctx context.Context, shard, maxCount int) (runs []*Run, fault, err error) {
	return q.dequeueShard(ctx, shard, maxCount, nil)
}

// PendingEnqueues, PendingAcks and PendingDequeues are how many coalesced
// Enqueue, Ack and Dequeue calls wait for a sender.
func (q *Queue) PendingEnqueues() int { return q.enq.waiting() }
func (q *Queue) PendingAcks() int     { return q.ack.waiting() }
func (q *Queue) PendingDequeues() int { return q.deq.waiting() }

// Senders is how many goroutines send coalesced Enqueue, Ack and Dequeue
// calls.
func (q *Queue) Senders() int { return q.enq.running() + q.ack.running() + q.deq.running() }

// DequeueCoalesced sends Dequeue calls of env/queue of maxCounts as one
// coalesced send, as a sender does with calls that waited together, and
// returns what each call got.
func (q *Queue) DequeueCoalesced(ctx context.Context, env, queue string, maxCounts ...int) ([][]*Run, error) {
	n := q.names(env, queue)
	reqs := make([]dequeueReq, len(maxCounts))
	for i, m := range maxCounts {
		reqs[i] = dequeueReq{qn: n, max: m}
	}
	out := make([][]*Run, len(reqs))
	for i, r := range q.dequeueCoalesced(ctx, reqs) {
		if r.err != nil {
			return nil, r.err
		}
		out[i] = r.runs
	}
	return out, nil
}

// HoldFetchWaitUntilDrained makes w's fetch loops, each time they are about
// to wait once they hand out no more runs and have no call in flight (so
// the stop can go on without them), first wait until the stop has closed
// Worker.drained (or until give ends): a stop step taken between the loop's
// last look and its wait. Call before Start. Tests only.
func (w *Worker) HoldFetchWaitUntilDrained(give <-chan struct{}) {
	w.fetchWaitHook = func() {
		select {
		case <-w.drained:
		case <-give:
		}
	}
}

// NextDue is when a blocking dequeue of a queue (shard < 0: queueNext) or
// of a shard (shardNext) looks again, by the Queue's clock (ms), and with
// from (a look's start; 0: not read), the time of work due before the poll
// beside held work, of that due since from (0: none). Tests only.
func (q *Queue) NextDue(ctx context.Context, env, queue string, shard int, from int64) (at, sooner int64, ok bool, err error) {
	if shard < 0 {
		return q.queueNext(ctx, q.space.Env(env).Queue(queue), from, nil)
	}
	return q.shardNext(ctx, shard, from)
}

// NoEarlyLook makes q's blocking waits and Workers beside held work look
// again at the poll alone, as before the early look, to compare. Call
// before any wait. Tests only.
func (q *Queue) NoEarlyLook() { q.noEarlyLook = true }

// SetLeaveGrace sets the env's waiting line's leaving grace of q's calls
// (defaultLeaveGrace), before any call. Tests only.
func (q *Queue) SetLeaveGrace(d time.Duration) { q.leaveGrace = d }
