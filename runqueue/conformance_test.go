package runqueue_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// conformanceCase is one behaviour of the flag-off run queue, checked on a
// fresh prefix of every backend.
type conformanceCase struct {
	name   string
	mutate func(*runqueue.Config)
	fn     func(t *testing.T, b *testBundle)
}

// TestConformance runs the whole life of a run, flag off, on miniredis, a
// real redis-server and a three-node Redis Cluster. The cases assert what a
// caller can observe: returned runs, Stats, dead letters and, where a call
// must not write, the full key dump of the prefix.
func TestConformance(t *testing.T) {
	t.Parallel()
	cases := [][]conformanceCase{
		enqueueCases(), orderCases(), limitCases(), ackNackCases(), leaseCases(), ttlCases(), statsCases(), errorCases(),
	}
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		for _, group := range cases {
			for _, tc := range group {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					tc.fn(t, setup(t, c, tc.mutate))
				})
			}
		}
	})
}

// Helpers shared by the test files of this package.

const env, queueName = "env", "q"

// enqueue queues p, which must be new; an empty Env or Queue means env or
// queueName.
func enqueue(t testing.TB, b *testBundle, p runqueue.EnqueueParams) {
	t.Helper()
	if p.Env == "" {
		p.Env = env
	}
	if p.Queue == "" {
		p.Queue = queueName
	}
	ok, err := b.q.Enqueue(b.ctx, p)
	require.NoError(t, err)
	require.True(t, ok, "enqueue of %s must queue a new run", p.ID)
}

func dequeue(t testing.TB, b *testBundle, queue string, n int) []*runqueue.Run {
	t.Helper()
	runs, err := b.q.Dequeue(b.ctx, env, queue, n)
	require.NoError(t, err)
	return runs
}

func runIDs(runs []*runqueue.Run) []string {
	out := make([]string, len(runs))
	for i, r := range runs {
		out[i] = r.ID
	}
	return out
}

func queueStats(t testing.TB, b *testBundle, queue string) runqueue.Stats {
	t.Helper()
	s, err := b.q.QueueStats(b.ctx, env, queue)
	require.NoError(t, err)
	return s
}

func ackAll(t testing.TB, b *testBundle, runs []*runqueue.Run) {
	t.Helper()
	for _, r := range runs {
		require.NoError(t, b.q.Ack(b.ctx, r))
	}
}

func enqueueCases() []conformanceCase {
	return []conformanceCase{
		{name: "EnqueueDequeueRoundTrip", fn: func(t *testing.T, b *testBundle) {
			// Payloads are opaque bytes: zero bytes, invalid UTF-8 and an
			// empty payload come back unchanged; names with separator and
			// wildcard characters come back as given.
			payloads := map[string][]byte{
				"bin":   {0, 0xff, 0xfe, 'a', 0, 0x80, 0xc3, 0x28, 0},
				"empty": {},
				"big":   []byte(strings.Repeat("\x00\x01\xfe", 40000)),
			}
			key := "tenant:*{1}"
			for id, p := range payloads {
				enqueue(t, b, runqueue.EnqueueParams{Key: key, ID: "id:" + id + "*", Payload: p})
				b.clock.Advance(time.Millisecond)
			}
			runs := dequeue(t, b, queueName, 10)
			require.Len(t, runs, 3)
			for _, r := range runs {
				id := strings.TrimSuffix(strings.TrimPrefix(r.ID, "id:"), "*")
				require.Contains(t, payloads, id)
				require.Equal(t, payloads[id], r.Payload, "payload of %s", r.ID)
				require.Equal(t, env, r.Env)
				require.Equal(t, queueName, r.Queue)
				require.Equal(t, key, r.Key)
				require.Equal(t, 1, r.Attempt)
				require.Positive(t, r.Token)
				require.Equal(t, b.clock.Now().Add(b.q.Config().LeaseDuration).UnixMilli(), r.LeaseDeadline.UnixMilli())
			}
			require.Empty(t, dequeue(t, b, queueName, 10), "a run in flight is not served again")
			ackAll(t, b, runs)
		}},
		{name: "IdempotentEnqueue", fn: func(t *testing.T, b *testBundle) {
			p := runqueue.EnqueueParams{Env: env, Queue: queueName, Key: "k", ID: "a", Payload: []byte("body\x00")}
			enqueue(t, b, p)
			check := func(name string, p runqueue.EnqueueParams, wantErr error) {
				before := b.dump(t)
				ok, err := b.q.Enqueue(b.ctx, p)
				if wantErr == nil {
					require.NoError(t, err, name)
				} else {
					require.ErrorIs(t, err, wantErr, name)
				}
				require.False(t, ok, name)
				require.Equal(t, before, b.dump(t), "%s must not write", name)
			}
			other := p
			other.Payload = []byte("body\x01")
			otherKey := p
			otherKey.Key = "k2"
			noKey := p
			noKey.Key = ""
			// Priority, delay and TTL are not part of the body: a retry with
			// other scheduling is still the same run.
			resched := p
			resched.Priority, resched.Delay, resched.TTL = 5, time.Hour, time.Minute
			check("SameBody", p, nil)
			check("OtherScheduling", resched, nil)
			check("OtherPayload", other, runqueue.ErrConflict)
			check("OtherKey", otherKey, runqueue.ErrConflict)
			check("NoKey", noKey, runqueue.ErrConflict)

			// Still idempotent while the run is in flight.
			runs := dequeue(t, b, queueName, 10)
			require.Len(t, runs, 1)
			check("SameBodyInFlight", p, nil)
			check("OtherPayloadInFlight", other, runqueue.ErrConflict)

			// The id is unique per (env, queue) only.
			elsewhere := p
			elsewhere.Queue = "q2"
			enqueue(t, b, elsewhere)

			// Once acked, the id is free again.
			ackAll(t, b, runs)
			enqueue(t, b, other)
		}},
		{name: "AdmissionQueueDepth", mutate: func(c *runqueue.Config) { c.MaxQueueDepth = 2 }, fn: func(t *testing.T, b *testBundle) {
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "1"})
			// Delayed runs count towards the depth.
			enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: "2", Delay: time.Minute})
			before := b.dump(t)
			ok, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: "c", ID: "3"})
			require.ErrorIs(t, err, runqueue.ErrQueueFull)
			var full *runqueue.QueueFullError
			require.ErrorAs(t, err, &full)
			require.Equal(t, runqueue.QueueFullError{Scope: "queue", Limit: 2}, *full)
			require.False(t, ok)
			require.Equal(t, before, b.dump(t), "a refused run writes nothing")

			// A retry of an accepted run is a no-op, not a refusal.
			ok, err = b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: "a", ID: "1"})
			require.NoError(t, err)
			require.False(t, ok)

			// Another queue of the env has its own depth.
			enqueue(t, b, runqueue.EnqueueParams{Queue: "other", ID: "3"})

			// Runs in flight are not queued: a dequeue makes room.
			require.Len(t, dequeue(t, b, queueName, 1), 1)
			enqueue(t, b, runqueue.EnqueueParams{Key: "c", ID: "3"})
		}},
		{name: "AdmissionKeyDepth", mutate: func(c *runqueue.Config) { c.MaxKeyDepth = 1 }, fn: func(t *testing.T, b *testBundle) {
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "1", Delay: time.Second})
			before := b.dump(t)
			_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: "a", ID: "2"})
			require.ErrorIs(t, err, runqueue.ErrQueueFull)
			var full *runqueue.QueueFullError
			require.ErrorAs(t, err, &full)
			require.Equal(t, runqueue.QueueFullError{Scope: "key", Limit: 1}, *full)
			require.Equal(t, before, b.dump(t), "a refused run writes nothing")
			// Other keys, and runs without a key, have their own depth.
			enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: "2"})
			enqueue(t, b, runqueue.EnqueueParams{ID: "3"})
		}},
	}
}

func orderCases() []conformanceCase {
	type step struct {
		key, id  string
		priority int
		advance  time.Duration // clock advance before the enqueue
	}
	type tc struct {
		name  string
		steps []step
		batch []int      // maxCount of successive dequeues
		want  [][]string // ids each dequeue returns
	}
	table := []tc{
		{
			name: "AgeOrderAcrossVariants",
			steps: []step{
				{key: "a", id: "a1"}, {key: "b", id: "b1", advance: time.Second}, {key: "a", id: "a2", advance: time.Second},
				{key: "a", id: "a3", advance: time.Second}, {key: "", id: "n1", advance: time.Second}, {key: "b", id: "b2", advance: time.Second},
			},
			batch: []int{10},
			want:  [][]string{{"a1", "b1", "a2", "a3", "n1", "b2"}},
		},
		{
			// One variant gives several runs in one call when it holds the
			// oldest ones; a smaller batch takes the same prefix.
			name: "OneVariantSeveralRuns",
			steps: []step{
				{key: "a", id: "a1"}, {key: "a", id: "a2", advance: time.Second}, {key: "a", id: "a3", advance: time.Second},
				{key: "b", id: "b1", advance: time.Second}, {key: "a", id: "a4", advance: time.Second},
			},
			batch: []int{3, 1, 5},
			want:  [][]string{{"a1", "a2", "a3"}, {"b1"}, {"a4"}},
		},
		{
			// Priority p orders a run as if it were p*PriorityStep (30s)
			// older: p2 at +40s scores -20s, ahead of p0 at 0; p1 at +100s
			// scores +70s, behind b0 at +50s.
			name: "PriorityBoundedAdvantage",
			steps: []step{
				{key: "a", id: "p0"}, {key: "b", id: "p2", priority: 2, advance: 40 * time.Second},
				{key: "b", id: "b0", advance: 10 * time.Second}, {key: "a", id: "p1", priority: 1, advance: 50 * time.Second},
				{key: "c", id: "p9", priority: 9, advance: 0},
			},
			batch: []int{2, 10},
			want:  [][]string{{"p9", "p2"}, {"p0", "b0", "p1"}},
		},
		{
			name: "PriorityInsideOneVariant",
			steps: []step{
				{key: "a", id: "old"}, {key: "a", id: "new-p1", priority: 1, advance: 29 * time.Second},
				{key: "a", id: "newer-p1", priority: 1, advance: 2 * time.Second},
			},
			batch: []int{10},
			want:  [][]string{{"new-p1", "old", "newer-p1"}},
		},
	}
	var out []conformanceCase
	for _, tt := range table {
		out = append(out, conformanceCase{name: tt.name, fn: func(t *testing.T, b *testBundle) {
			for _, s := range tt.steps {
				b.clock.Advance(s.advance)
				enqueue(t, b, runqueue.EnqueueParams{Key: s.key, ID: s.id, Priority: s.priority})
			}
			for i, n := range tt.batch {
				require.Equal(t, tt.want[i], runIDs(dequeue(t, b, queueName, n)), "dequeue %d (maxCount %d)", i, n)
			}
			require.Empty(t, dequeue(t, b, queueName, 10))
		}})
	}
	out = append(out,
		conformanceCase{name: "PriorityNeverEarly", fn: func(t *testing.T, b *testBundle) {
			start := b.clock.Now()
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "late-p9", Priority: 9, AvailableAt: start.Add(10 * time.Second)})
			enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: "now-p0"})
			require.Equal(t, []string{"now-p0"}, runIDs(dequeue(t, b, queueName, 10)))
			b.clock.Advance(10*time.Second - time.Millisecond)
			require.Empty(t, dequeue(t, b, queueName, 10), "priority does not make a run available early")
			enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: "b-p0"})
			b.clock.Advance(time.Millisecond)
			// Once available, its priority puts it ahead of older work.
			require.Equal(t, []string{"late-p9", "b-p0"}, runIDs(dequeue(t, b, queueName, 10)))
		}},
		conformanceCase{name: "DelayedRuns", fn: func(t *testing.T, b *testBundle) {
			start := b.clock.Now()
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "delay5s", Delay: 5 * time.Second})
			enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: "at10s", AvailableAt: start.Add(10 * time.Second)})
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "past", AvailableAt: start.Add(-time.Hour)})
			s := queueStats(t, b, queueName)
			require.Equal(t, int64(1), s.Ready)
			require.Equal(t, int64(2), s.Delayed)

			require.Equal(t, []string{"past"}, runIDs(dequeue(t, b, queueName, 10)))
			require.Empty(t, dequeue(t, b, queueName, 10))
			b.clock.Advance(5*time.Second - time.Millisecond)
			require.Empty(t, dequeue(t, b, queueName, 10), "invisible until its time")
			b.clock.Advance(time.Millisecond)
			require.Equal(t, []string{"delay5s"}, runIDs(dequeue(t, b, queueName, 10)))
			b.clock.Advance(4 * time.Second)
			require.Empty(t, dequeue(t, b, queueName, 10))
			// A due run waits in the delayed set until a dequeue promotes it,
			// so Stats may count it delayed until then.
			b.clock.Advance(time.Second)
			s = queueStats(t, b, queueName)
			require.Equal(t, int64(1), s.Ready+s.Delayed)
			require.Equal(t, int64(2), s.InFlight)
			require.Equal(t, []string{"at10s"}, runIDs(dequeue(t, b, queueName, 10)))
			s = queueStats(t, b, queueName)
			require.Equal(t, runqueue.Stats{InFlight: 3}, s)
		}},
		conformanceCase{name: "DelayedAndReadyInOneVariant", fn: func(t *testing.T, b *testBundle) {
			// A delayed run that comes due orders by its available_at among
			// the variant's ready runs, not behind them.
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "d", Delay: time.Second})
			b.clock.Advance(500 * time.Millisecond)
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "r1"})
			b.clock.Advance(time.Second)
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "r2"})
			require.Equal(t, []string{"r1", "d", "r2"}, runIDs(dequeue(t, b, queueName, 10)))
		}},
	)
	return out
}

func limitCases() []conformanceCase {
	return []conformanceCase{
		{name: "EnvConcurrencyAcrossQueues", mutate: func(c *runqueue.Config) { c.EnvConcurrency = 3 }, fn: func(t *testing.T, b *testBundle) {
			for i := range 4 {
				enqueue(t, b, runqueue.EnqueueParams{Queue: "q1", ID: fmt.Sprint("a", i)})
				enqueue(t, b, runqueue.EnqueueParams{Queue: "q2", Key: "k", ID: fmt.Sprint("b", i)})
			}
			// Another env is not affected.
			enqueue(t, b, runqueue.EnqueueParams{Env: "other", ID: "x"})
			got1 := dequeue(t, b, "q1", 2)
			require.Len(t, got1, 2)
			got2 := dequeue(t, b, "q2", 10)
			require.Len(t, got2, 1, "the env limit counts both queues")
			require.Empty(t, dequeue(t, b, "q1", 10))
			require.Empty(t, dequeue(t, b, "q2", 10))
			runs, err := b.q.Dequeue(b.ctx, "other", queueName, 10)
			require.NoError(t, err)
			require.Len(t, runs, 1)

			es, err := b.q.EnvStats(b.ctx, env)
			require.NoError(t, err)
			require.Equal(t, int64(3), es.InFlight)

			// An ack frees one slot, a nack another.
			require.NoError(t, b.q.Ack(b.ctx, got1[0]))
			require.Len(t, dequeue(t, b, "q2", 10), 1)
			_, err = b.q.Nack(b.ctx, got1[1], &runqueue.NackOptions{RetryAt: b.clock.Now().Add(time.Hour)})
			require.NoError(t, err)
			require.Len(t, dequeue(t, b, "q1", 10), 1)
			require.Empty(t, dequeue(t, b, "q2", 10))
		}},
		{name: "QueueConcurrencyAcrossKeys", mutate: func(c *runqueue.Config) { c.QueueConcurrency = 2 }, fn: func(t *testing.T, b *testBundle) {
			for _, k := range []string{"a", "b", "c"} {
				for i := range 2 {
					enqueue(t, b, runqueue.EnqueueParams{Key: k, ID: fmt.Sprint(k, i)})
				}
			}
			enqueue(t, b, runqueue.EnqueueParams{Queue: "q2", ID: "other"})
			got := dequeue(t, b, queueName, 10)
			require.Equal(t, []string{"a0", "a1"}, runIDs(got))
			require.Empty(t, dequeue(t, b, queueName, 10))
			require.Len(t, dequeue(t, b, "q2", 10), 1, "the limit is per queue")
			require.NoError(t, b.q.Ack(b.ctx, got[0]))
			require.Equal(t, []string{"b0"}, runIDs(dequeue(t, b, queueName, 10)))
		}},
		{name: "KeyConcurrencyPerKey", mutate: func(c *runqueue.Config) { c.KeyConcurrency = 1 }, fn: func(t *testing.T, b *testBundle) {
			for i := range 3 {
				for _, k := range []string{"a", "b", ""} {
					enqueue(t, b, runqueue.EnqueueParams{Key: k, ID: fmt.Sprint(k, "-", i)})
					b.clock.Advance(time.Millisecond)
				}
			}
			got := dequeue(t, b, queueName, 10)
			require.Equal(t, []string{"a-0", "b-0", "-0"}, runIDs(got), "one per key, in age order")
			require.Empty(t, dequeue(t, b, queueName, 10))
			ks, err := b.q.KeyStats(b.ctx, env, queueName, "a")
			require.NoError(t, err)
			require.Equal(t, int64(1), ks.InFlight)
			require.Equal(t, int64(2), ks.Ready)
			require.NoError(t, b.q.Ack(b.ctx, got[1]))
			require.Equal(t, []string{"b-1"}, runIDs(dequeue(t, b, queueName, 10)))
		}},
		{name: "LimitsFor", mutate: func(c *runqueue.Config) {
			c.EnvConcurrency = 100
			c.LimitsFor = func(env, queue string) runqueue.Limits {
				if queue == "narrow" {
					return runqueue.Limits{Queue: 1}
				}
				return runqueue.Limits{}
			}
		}, fn: func(t *testing.T, b *testBundle) {
			for i := range 3 {
				enqueue(t, b, runqueue.EnqueueParams{Queue: "narrow", ID: string(rune('a' + i))})
				enqueue(t, b, runqueue.EnqueueParams{Queue: "wide", ID: string(rune('a' + i))})
			}
			require.Len(t, dequeue(t, b, "narrow", 10), 1)
			require.Len(t, dequeue(t, b, "wide", 10), 3)
		}},
	}
}

func ackNackCases() []conformanceCase {
	return []conformanceCase{
		{name: "AckRemovesEverything", fn: func(t *testing.T, b *testBundle) {
			// Every kind of queued run: keys, none, priority, delayed, TTL,
			// and one that went through a nack.
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "1", Payload: []byte("x")})
			enqueue(t, b, runqueue.EnqueueParams{ID: "2", Priority: 3, TTL: time.Hour})
			enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: "3", Delay: time.Second})
			enqueue(t, b, runqueue.EnqueueParams{Queue: "q2", Key: "b", ID: "4"})
			runs := dequeue(t, b, queueName, 10)
			require.Len(t, runs, 2)
			_, err := b.q.Nack(b.ctx, runs[0], &runqueue.NackOptions{RetryAt: b.clock.Now()})
			require.NoError(t, err)
			ackAll(t, b, runs[1:])
			b.clock.Advance(time.Second)
			runs = dequeue(t, b, queueName, 10)
			require.Len(t, runs, 2)
			ackAll(t, b, runs)
			runs = dequeue(t, b, "q2", 10)
			require.Len(t, runs, 1)
			ackAll(t, b, runs)

			require.Equal(t, runqueue.Stats{}, queueStats(t, b, queueName))
			require.Equal(t, runqueue.Stats{}, queueStats(t, b, "q2"))
			require.Empty(t, b.keysUnder(t), "after the last ack no key of the queue is left")
		}},
		{name: "NackRetryAt", fn: func(t *testing.T, b *testBundle) {
			enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "r", Payload: []byte{1, 0, 2}, Priority: 2})
			r := dequeue(t, b, queueName, 1)[0]
			at := b.clock.Now().Add(time.Minute)
			res, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{RetryAt: at})
			require.NoError(t, err)
			require.Equal(t, runqueue.NackResult{Requeued: true, Attempt: 2, RetryAt: time.UnixMilli(at.UnixMilli())}, res)
			require.Equal(t, runqueue.Stats{Delayed: 1}, queueStats(t, b, queueName))

			b.clock.Advance(time.Minute - time.Millisecond)
			require.Empty(t, dequeue(t, b, queueName, 10), "invisible until its retry time")
			b.clock.Advance(time.Millisecond)
			again := dequeue(t, b, queueName, 10)
			require.Len(t, again, 1)
			require.Equal(t, 2, again[0].Attempt)
			require.Equal(t, []byte{1, 0, 2}, again[0].Payload)
			require.Equal(t, "k", again[0].Key)
			require.Greater(t, again[0].Token, r.Token)

			// A retry time in the past is ready at once, and as old as it says.
			res, err = b.q.Nack(b.ctx, again[0], &runqueue.NackOptions{RetryAt: b.clock.Now().Add(-time.Hour)})
			require.NoError(t, err)
			require.True(t, res.Requeued)
			require.Equal(t, 3, res.Attempt)
			require.Equal(t, runqueue.Stats{Ready: 1, OldestReadyAge: time.Hour}, queueStats(t, b, queueName))
			third := dequeue(t, b, queueName, 10)
			require.Len(t, third, 1)
			require.Equal(t, 3, third[0].Attempt)
		}},
		{name: "NackDefaultBackoff", mutate: func(c *runqueue.Config) {
			c.BackoffBase, c.BackoffMax, c.BackoffJitter = time.Second, 3*time.Second, 0.1
		}, fn: func(t *testing.T, b *testBundle) {
			enqueue(t, b, runqueue.EnqueueParams{ID: "r", Payload: []byte("p")})
			// Attempt n waits Base*2^(n-1), at most Max, within the jitter.
			want := []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second}
			for i, base := range want {
				runs := dequeue(t, b, queueName, 1)
				require.Len(t, runs, 1, "delivery %d", i+1)
				require.Equal(t, i+1, runs[0].Attempt)
				require.Equal(t, []byte("p"), runs[0].Payload)
				now := b.clock.Now()
				res, err := b.q.Nack(b.ctx, runs[0], nil)
				require.NoError(t, err)
				require.True(t, res.Requeued)
				require.Equal(t, i+2, res.Attempt)
				wait := res.RetryAt.Sub(now)
				require.GreaterOrEqual(t, wait, time.Duration(float64(base)*0.9)-time.Millisecond, "attempt %d", i+1)
				require.LessOrEqual(t, wait, time.Duration(float64(base)*1.1)+time.Millisecond, "attempt %d", i+1)
				b.clock.Advance(wait - time.Millisecond)
				require.Empty(t, dequeue(t, b, queueName, 1), "not before its retry time")
				b.clock.Advance(time.Millisecond)
			}
			require.Equal(t, 5, dequeue(t, b, queueName, 1)[0].Attempt)
		}},
		{name: "MaxAttemptsDeadLetterAndRedrive", mutate: func(c *runqueue.Config) { c.MaxAttempts = 2 }, fn: func(t *testing.T, b *testBundle) {
			payload := []byte{0, 'd', 0xff}
			enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "r", Payload: payload, Priority: 4, TTL: time.Hour})
			r := dequeue(t, b, queueName, 1)[0]
			res, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{RetryAt: b.clock.Now()})
			require.NoError(t, err)
			require.Equal(t, runqueue.NackResult{Requeued: true, Attempt: 2, RetryAt: time.UnixMilli(b.clock.Now().UnixMilli())}, res)
			r = dequeue(t, b, queueName, 1)[0]
			require.Equal(t, 2, r.Attempt)
			b.clock.Advance(time.Second)
			res, err = b.q.Nack(b.ctx, r, &runqueue.NackOptions{RetryAt: b.clock.Now()})
			require.NoError(t, err)
			require.Equal(t, runqueue.NackResult{Requeued: false, Attempt: 3}, res, "no attempts left: dead-lettered")

			died := time.UnixMilli(b.clock.Now().UnixMilli())
			want := runqueue.DeadRun{Env: env, Queue: queueName, Key: "k", ID: "r", Payload: payload, Attempt: 3, Priority: 4, DiedAt: died}
			dead, err := b.q.DeadLetters(b.ctx, env, queueName, 0, 10)
			require.NoError(t, err)
			require.Equal(t, []runqueue.DeadRun{want}, dead)
			one, err := b.q.DeadLetter(b.ctx, env, queueName, "k", "r")
			require.NoError(t, err)
			require.Equal(t, want, one)
			require.Equal(t, runqueue.Stats{Dead: 1}, queueStats(t, b, queueName))
			require.Empty(t, dequeue(t, b, queueName, 10))
			require.ErrorIs(t, b.q.Ack(b.ctx, r), runqueue.ErrNotInFlight, "a dead run cannot be acked")
			// The dead run still holds its id.
			_, err = b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: "k", ID: "r", Payload: []byte("new")})
			require.ErrorIs(t, err, runqueue.ErrConflict)

			require.ErrorIs(t, b.q.Redrive(b.ctx, env, queueName, "other", "r"), runqueue.ErrNotFound)
			require.ErrorIs(t, b.q.Redrive(b.ctx, env, queueName, "k", "nope"), runqueue.ErrNotFound)
			b.clock.Advance(time.Second)
			require.NoError(t, b.q.Redrive(b.ctx, env, queueName, "k", "r"))
			// A retried redrive (the first reply lost) finds the run live: it
			// succeeds and changes nothing.
			before := b.dump(t)
			require.NoError(t, b.q.Redrive(b.ctx, env, queueName, "k", "r"))
			require.Equal(t, before, b.dump(t))
			require.Equal(t, runqueue.Stats{Ready: 1}, queueStats(t, b, queueName))
			_, err = b.q.DeadLetter(b.ctx, env, queueName, "k", "r")
			require.ErrorIs(t, err, runqueue.ErrNotFound)
			dead, err = b.q.DeadLetters(b.ctx, env, queueName, 0, 10)
			require.NoError(t, err)
			require.Empty(t, dead)

			r2 := dequeue(t, b, queueName, 1)
			require.Len(t, r2, 1)
			require.Equal(t, 1, r2[0].Attempt, "redrive resets the attempts")
			require.Equal(t, payload, r2[0].Payload)
			require.Greater(t, r2[0].Token, r.Token)
			require.ErrorIs(t, b.q.Ack(b.ctx, r), runqueue.ErrLeaseLost, "the pre-death holder stays lost")
			require.NoError(t, b.q.Ack(b.ctx, r2[0]))
			require.Empty(t, b.keysUnder(t))
		}},
		{name: "DeadLettersPaging", mutate: func(c *runqueue.Config) { c.MaxAttempts = 1 }, fn: func(t *testing.T, b *testBundle) {
			for _, id := range []string{"a", "b", "c"} {
				enqueue(t, b, runqueue.EnqueueParams{ID: id})
			}
			for range 3 {
				r := dequeue(t, b, queueName, 1)[0]
				b.clock.Advance(time.Second)
				res, err := b.q.Nack(b.ctx, r, nil)
				require.NoError(t, err)
				require.False(t, res.Requeued)
			}
			page := func(off, n int) []string {
				d, err := b.q.DeadLetters(b.ctx, env, queueName, off, n)
				require.NoError(t, err)
				var ids []string
				for _, x := range d {
					ids = append(ids, x.ID)
				}
				return ids
			}
			require.Equal(t, []string{"a", "b", "c"}, page(0, 10), "oldest death first")
			require.Equal(t, []string{"b"}, page(1, 1))
			require.Empty(t, page(3, 10))
		}},
		{name: "NackDeadLetterOption", fn: func(t *testing.T, b *testBundle) {
			enqueue(t, b, runqueue.EnqueueParams{ID: "r", Payload: []byte("p")})
			r := dequeue(t, b, queueName, 1)[0]
			res, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{DeadLetter: true, RetryAt: b.clock.Now()})
			require.NoError(t, err)
			require.Equal(t, runqueue.NackResult{Requeued: false, Attempt: 2}, res)
			require.Equal(t, runqueue.Stats{Dead: 1}, queueStats(t, b, queueName))
			d, err := b.q.DeadLetter(b.ctx, env, queueName, "", "r")
			require.NoError(t, err)
			require.Equal(t, []byte("p"), d.Payload)
			require.Equal(t, 2, d.Attempt)
			require.Empty(t, dequeue(t, b, queueName, 10))
		}},
		{name: "UnlimitedAttempts", mutate: func(c *runqueue.Config) { c.MaxAttempts = -1 }, fn: func(t *testing.T, b *testBundle) {
			enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
			for i := 1; i <= 12; i++ {
				r := dequeue(t, b, queueName, 1)
				require.Len(t, r, 1)
				require.Equal(t, i, r[0].Attempt)
				res, err := b.q.Nack(b.ctx, r[0], &runqueue.NackOptions{RetryAt: b.clock.Now()})
				require.NoError(t, err)
				require.True(t, res.Requeued)
			}
		}},
	}
}

func leaseCases() []conformanceCase {
	lease := func(c *runqueue.Config) { c.LeaseDuration = 10 * time.Second }
	return []conformanceCase{
		{name: "ExtendLease", mutate: lease, fn: func(t *testing.T, b *testBundle) {
			enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "r"})
			shard := b.q.ShardOf(env)
			r := dequeue(t, b, queueName, 1)[0]
			b.clock.Advance(8 * time.Second)
			require.NoError(t, b.q.ExtendLease(b.ctx, r, 10*time.Second))
			require.Equal(t, b.clock.Now().Add(10*time.Second).UnixMilli(), r.LeaseDeadline.UnixMilli())
			b.clock.Advance(9 * time.Second) // 17s after the dequeue, past the first lease
			n, err := b.q.RecoverLeases(b.ctx, shard, 100)
			require.NoError(t, err)
			require.Zero(t, n, "an extended lease is not recovered")
			require.Equal(t, runqueue.Stats{InFlight: 1}, queueStats(t, b, queueName))
			b.clock.Advance(time.Second)
			n, err = b.q.RecoverLeases(b.ctx, shard, 100)
			require.NoError(t, err)
			require.Equal(t, 1, n, "the extended lease passes in turn")
		}},
		{name: "RecoverLeases", mutate: lease, fn: func(t *testing.T, b *testBundle) {
			enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "r", Payload: []byte{0, 1}})
			b.clock.Advance(time.Millisecond)
			enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "kept"})
			shard := b.q.ShardOf(env)
			runs := dequeue(t, b, queueName, 2)
			require.Len(t, runs, 2)
			old := runs[0]
			b.clock.Advance(5 * time.Second)
			require.NoError(t, b.q.ExtendLease(b.ctx, runs[1], time.Minute))
			b.clock.Advance(5*time.Second - time.Millisecond)
			n, err := b.q.RecoverLeases(b.ctx, shard, 100)
			require.NoError(t, err)
			require.Zero(t, n, "the lease has not passed")
			b.clock.Advance(time.Millisecond)
			n, err = b.q.RecoverLeases(b.ctx, shard, 100)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			require.Equal(t, runqueue.Stats{Ready: 1, InFlight: 1}, queueStats(t, b, queueName))
			n, err = b.q.RecoverLeases(b.ctx, shard, 100)
			require.NoError(t, err)
			require.Zero(t, n, "recovered once")

			// Until it is delivered again, the old holder's calls find it
			// queued.
			require.ErrorIs(t, b.q.Ack(b.ctx, old), runqueue.ErrNotInFlight)
			again := dequeue(t, b, queueName, 10)
			require.Len(t, again, 1)
			require.Equal(t, "r", again[0].ID)
			require.Equal(t, 2, again[0].Attempt)
			require.Equal(t, []byte{0, 1}, again[0].Payload)
			require.Greater(t, again[0].Token, old.Token)

			require.ErrorIs(t, b.q.Ack(b.ctx, old), runqueue.ErrLeaseLost)
			_, err = b.q.Nack(b.ctx, old, nil)
			require.ErrorIs(t, err, runqueue.ErrLeaseLost)
			require.ErrorIs(t, b.q.ExtendLease(b.ctx, old, time.Minute), runqueue.ErrLeaseLost)
			require.Equal(t, runqueue.Stats{InFlight: 2}, queueStats(t, b, queueName), "the lost holder changed nothing")
			require.NoError(t, b.q.Ack(b.ctx, again[0]))
			require.NoError(t, b.q.Ack(b.ctx, runs[1]))
		}},
		{name: "RecoverLeasesLimit", mutate: lease, fn: func(t *testing.T, b *testBundle) {
			for i := range 5 {
				enqueue(t, b, runqueue.EnqueueParams{ID: string(rune('a' + i))})
			}
			require.Len(t, dequeue(t, b, queueName, 10), 5)
			b.clock.Advance(10 * time.Second)
			n, err := b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 2)
			require.NoError(t, err)
			require.Equal(t, 2, n)
			n, err = b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 100)
			require.NoError(t, err)
			require.Equal(t, 3, n)
			require.Equal(t, runqueue.Stats{Ready: 5}, queueStats(t, b, queueName))
		}},
		{name: "RecoverLeasesDeadLetters", mutate: func(c *runqueue.Config) { lease(c); c.MaxAttempts = 1 }, fn: func(t *testing.T, b *testBundle) {
			enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "r", Payload: []byte("p")})
			r := dequeue(t, b, queueName, 1)[0]
			b.clock.Advance(10 * time.Second)
			n, err := b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 100)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			require.Equal(t, runqueue.Stats{Dead: 1}, queueStats(t, b, queueName))
			d, err := b.q.DeadLetter(b.ctx, env, queueName, "k", "r")
			require.NoError(t, err)
			require.Equal(t, 2, d.Attempt)
			require.Equal(t, []byte("p"), d.Payload)
			require.ErrorIs(t, b.q.Ack(b.ctx, r), runqueue.ErrNotInFlight)
		}},
	}
}

func ttlCases() []conformanceCase {
	return []conformanceCase{
		{name: "ExpireTTL", fn: func(t *testing.T, b *testBundle) {
			shard := b.q.ShardOf(env)
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "taken", TTL: 10 * time.Second})
			b.clock.Advance(time.Millisecond)
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "ready", TTL: 10 * time.Second})
			enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: "delayed", TTL: 10 * time.Second, Delay: time.Minute})
			enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: "later", TTL: 30 * time.Second})
			enqueue(t, b, runqueue.EnqueueParams{Key: "c", ID: "forever"})
			enqueue(t, b, runqueue.EnqueueParams{Queue: "q2", ID: "other-queue", TTL: 10 * time.Second})
			taken := dequeue(t, b, queueName, 1)
			require.Equal(t, []string{"taken"}, runIDs(taken))

			b.clock.Advance(10*time.Second - time.Millisecond)
			n, err := b.q.ExpireTTL(b.ctx, shard, 100)
			require.NoError(t, err)
			require.Zero(t, n, "not yet due")
			b.clock.Advance(time.Millisecond)
			n, err = b.q.ExpireTTL(b.ctx, shard, 100)
			require.NoError(t, err)
			require.Equal(t, 3, n, "ready, delayed and the other queue's run")
			n, err = b.q.ExpireTTL(b.ctx, shard, 100)
			require.NoError(t, err)
			require.Zero(t, n)
			require.Equal(t, runqueue.Stats{Ready: 2, InFlight: 1, OldestReadyAge: 10 * time.Second}, queueStats(t, b, queueName))
			require.Equal(t, runqueue.Stats{}, queueStats(t, b, "q2"))

			// The dequeued run is never expired, even when nacked back.
			_, err = b.q.Nack(b.ctx, taken[0], &runqueue.NackOptions{RetryAt: b.clock.Now()})
			require.NoError(t, err)
			b.clock.Advance(time.Hour)
			n, err = b.q.ExpireTTL(b.ctx, shard, 100)
			require.NoError(t, err)
			require.Equal(t, 1, n, "only later")
			require.Equal(t, []string{"forever", "taken"}, runIDs(dequeue(t, b, queueName, 10)))

			// An expired id is free again.
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "ready"})
		}},
		{name: "ExpireTTLEndsAtDelivery", fn: func(t *testing.T, b *testBundle) {
			// Back in the queue before its TTL entry is due (a nack, a lease
			// recovery), a delivered run must outlive its old deadline.
			shard := b.q.ShardOf(env)
			enqueue(t, b, runqueue.EnqueueParams{Key: "a", ID: "nacked", TTL: 10 * time.Second})
			enqueue(t, b, runqueue.EnqueueParams{Key: "b", ID: "recovered", TTL: 10 * time.Second})
			runs := dequeue(t, b, queueName, 2)
			require.Len(t, runs, 2)
			for _, r := range runs {
				if r.ID == "nacked" {
					_, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{RetryAt: b.clock.Now()})
					require.NoError(t, err)
				}
			}
			b.clock.Advance(b.q.Config().LeaseDuration)
			n, err := b.q.RecoverLeases(b.ctx, shard, 100)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			b.clock.Advance(time.Hour)
			n, err = b.q.ExpireTTL(b.ctx, shard, 100)
			require.NoError(t, err)
			require.Zero(t, n, "delivered runs have no TTL")
			require.ElementsMatch(t, []string{"nacked", "recovered"}, runIDs(dequeue(t, b, queueName, 10)))
		}},
		{name: "ExpireTTLLimit", fn: func(t *testing.T, b *testBundle) {
			for i := range 5 {
				enqueue(t, b, runqueue.EnqueueParams{ID: string(rune('a' + i)), TTL: time.Second})
			}
			b.clock.Advance(time.Second)
			n, err := b.q.ExpireTTL(b.ctx, b.q.ShardOf(env), 3)
			require.NoError(t, err)
			require.Equal(t, 3, n)
			n, err = b.q.ExpireTTL(b.ctx, b.q.ShardOf(env), 3)
			require.NoError(t, err)
			require.Equal(t, 2, n)
			require.Empty(t, b.keysUnder(t), "expired runs leave nothing behind")
		}},
	}
}

func statsCases() []conformanceCase {
	return []conformanceCase{
		{name: "Stats", mutate: func(c *runqueue.Config) { c.MaxAttempts = 1 }, fn: func(t *testing.T, b *testBundle) {
			enqueue(t, b, runqueue.EnqueueParams{Queue: "q1", Key: "a", ID: "1"})
			b.clock.Advance(2 * time.Second)
			enqueue(t, b, runqueue.EnqueueParams{Queue: "q1", Key: "a", ID: "2"})
			enqueue(t, b, runqueue.EnqueueParams{Queue: "q1", Key: "b", ID: "3"})
			enqueue(t, b, runqueue.EnqueueParams{Queue: "q1", Key: "b", ID: "4", Delay: time.Hour})
			enqueue(t, b, runqueue.EnqueueParams{Queue: "q1", ID: "5"})
			enqueue(t, b, runqueue.EnqueueParams{Queue: "q1", ID: "6"})
			enqueue(t, b, runqueue.EnqueueParams{Queue: "q2", ID: "7"})
			enqueue(t, b, runqueue.EnqueueParams{Queue: "q2", ID: "8"})
			b.clock.Advance(5 * time.Second)

			// q1: "1" in flight, "2".."6" queued (all 2s after t0); q2: "7" dead.
			runs := dequeue(t, b, "q1", 1)
			require.Equal(t, []string{"1"}, runIDs(runs))
			q2 := dequeue(t, b, "q2", 1)
			require.Equal(t, []string{"7"}, runIDs(q2))
			res, err := b.q.Nack(b.ctx, q2[0], nil)
			require.NoError(t, err)
			require.False(t, res.Requeued)
			b.clock.Advance(time.Second)

			s := queueStats(t, b, "q1")
			require.Equal(t, runqueue.Stats{Ready: 4, Delayed: 1, InFlight: 1, OldestReadyAge: 6 * time.Second}, s)
			s = queueStats(t, b, "q2")
			require.Equal(t, runqueue.Stats{Ready: 1, Dead: 1, OldestReadyAge: 6 * time.Second}, s)

			for _, tc := range []struct {
				key  string
				want runqueue.Stats
			}{
				{"a", runqueue.Stats{Ready: 1, InFlight: 1, OldestReadyAge: 6 * time.Second}},
				{"b", runqueue.Stats{Ready: 1, Delayed: 1, OldestReadyAge: 6 * time.Second}},
				{"", runqueue.Stats{Ready: 2, OldestReadyAge: 6 * time.Second}},
				{"none", runqueue.Stats{}},
			} {
				ks, err := b.q.KeyStats(b.ctx, env, "q1", tc.key)
				require.NoError(t, err)
				require.Equal(t, tc.want, ks, "key %q", tc.key)
			}
			es, err := b.q.EnvStats(b.ctx, env)
			require.NoError(t, err)
			require.Equal(t, runqueue.Stats{Ready: 5, Delayed: 1, InFlight: 1, Dead: 1, OldestReadyAge: 6 * time.Second}, es)

			// The oldest ready age grows with the clock and is measured on
			// the first run in age order.
			b.clock.Advance(4 * time.Second)
			s = queueStats(t, b, "q1")
			require.Equal(t, 10*time.Second, s.OldestReadyAge)
			ackAll(t, b, runs)
			s = queueStats(t, b, "q1")
			require.Equal(t, int64(0), s.InFlight)

			es, err = b.q.EnvStats(b.ctx, "nobody")
			require.NoError(t, err)
			require.Equal(t, runqueue.Stats{}, es)
		}},
	}
}

func errorCases() []conformanceCase {
	return []conformanceCase{
		{name: "UnknownRun", fn: func(t *testing.T, b *testBundle) {
			enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "r"})
			before := b.dump(t)
			ghost := &runqueue.Run{Env: env, Queue: queueName, Key: "k", ID: "ghost", Token: 1}
			// Ack is idempotent: a run that is gone is done.
			require.NoError(t, b.q.Ack(b.ctx, ghost))
			_, err := b.q.Nack(b.ctx, ghost, nil)
			require.ErrorIs(t, err, runqueue.ErrNotFound)
			require.ErrorIs(t, b.q.ExtendLease(b.ctx, ghost, time.Minute), runqueue.ErrNotFound)
			_, err = b.q.DeadLetter(b.ctx, env, queueName, "k", "ghost")
			require.ErrorIs(t, err, runqueue.ErrNotFound)
			// A queued run is not in flight.
			queued := &runqueue.Run{Env: env, Queue: queueName, Key: "k", ID: "r", Token: 1}
			require.ErrorIs(t, b.q.Ack(b.ctx, queued), runqueue.ErrNotInFlight)
			require.Equal(t, before, b.dump(t), "failed calls write nothing")
		}},
		{name: "AckTwice", fn: func(t *testing.T, b *testBundle) {
			// The first ack removes the run; the second (go-redis retrying a
			// call whose reply was lost looks the same) succeeds and writes
			// nothing, while a nack of the gone run is ErrNotFound.
			enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
			r := dequeue(t, b, queueName, 1)[0]
			require.NoError(t, b.q.Ack(b.ctx, r))
			before := b.dump(t)
			require.NoError(t, b.q.Ack(b.ctx, r))
			require.Equal(t, before, b.dump(t))
			_, err := b.q.Nack(b.ctx, r, nil)
			require.ErrorIs(t, err, runqueue.ErrNotFound)
		}},
		{name: "NackRetried", fn: func(t *testing.T, b *testBundle) {
			// A nack whose reply was lost and that is sent again returns what
			// the first returned, and changes nothing more.
			enqueue(t, b, runqueue.EnqueueParams{ID: "r"})
			r := dequeue(t, b, queueName, 1)[0]
			first, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{RetryAt: b.clock.Now().Add(time.Minute)})
			require.NoError(t, err)
			before := b.dump(t)
			again, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{RetryAt: b.clock.Now().Add(time.Minute)})
			require.NoError(t, err)
			require.Equal(t, first, again)
			require.Equal(t, before, b.dump(t))
			// Once delivered again, the old holder's nack is ErrLeaseLost.
			b.clock.Advance(2 * time.Minute)
			r2 := dequeue(t, b, queueName, 1)[0]
			_, err = b.q.Nack(b.ctx, r, nil)
			require.ErrorIs(t, err, runqueue.ErrLeaseLost)
			require.NoError(t, b.q.Ack(b.ctx, r2))
		}},
		{name: "WrongKey", fn: func(t *testing.T, b *testBundle) {
			enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "r"})
			r := dequeue(t, b, queueName, 1)[0]
			before := b.dump(t)
			for _, key := range []string{"other", ""} {
				wrong := *r
				wrong.Key = key
				require.ErrorIs(t, b.q.Ack(b.ctx, &wrong), runqueue.ErrNotFound, "ack under key %q", key)
				_, err := b.q.Nack(b.ctx, &wrong, nil)
				require.ErrorIs(t, err, runqueue.ErrNotFound, "nack under key %q", key)
				require.ErrorIs(t, b.q.ExtendLease(b.ctx, &wrong, time.Minute), runqueue.ErrNotFound, "extend under key %q", key)
			}
			wrongQueue := *r
			wrongQueue.Queue = "q2"
			require.NoError(t, b.q.Ack(b.ctx, &wrongQueue), "no such run in q2: nothing to do")
			require.Equal(t, before, b.dump(t), "failed calls write nothing")
			require.NoError(t, b.q.Ack(b.ctx, r))
		}},
	}
}
