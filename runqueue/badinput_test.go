package runqueue_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// badNames are values every name rule must reject (docs/design.md section 4).
var badNames = []struct{ name, val string }{
	{"Empty", ""},
	{"Oversize", strings.Repeat("a", runqueue.MaxNameBytes+1)},
	{"OversizeMultibyte", strings.Repeat("é", runqueue.MaxNameBytes/2) + "a"},
	{"InvalidUTF8", "a\xffb"},
	{"TruncatedUTF8", "a\xc3"},
	{"NUL", "a\x00b"},
	{"Newline", "a\nb"},
	{"DEL", "a\x7fb"},
	{"C1Control", "a\u0085b"},
	{"LeadingSpace", " a"},
	{"TrailingSpace", "a "},
	{"TrailingTab", "a\t"},
	{"LeadingNoBreakSpace", "\u00a0a"},
	{"OnlySpace", " "},
	{"Dot", "."},
	{"DotDot", ".."},
}

// badTarget is the (env, queue, key, id) an entry point is called with.
type badTarget struct{ env, queue, key, id string }

// with returns t with one field replaced.
func (tg badTarget) with(field, val string) badTarget {
	switch field {
	case "env":
		tg.env = val
	case "queue":
		tg.queue = val
	case "key":
		tg.key = val
	case "id":
		tg.id = val
	default:
		panic(field)
	}
	return tg
}

// badCase is one call that must fail with a typed error and write nothing.
type badCase struct {
	name  string
	call  func(ctx context.Context) error
	field string // the *InvalidError field, or "" when sentinel is set
	want  error  // sentinel
}

// badInputState is the seeded state bad calls must leave untouched.
type badInputState struct {
	held  *runqueue.Run // in flight, its lease passed: recovery could take it
	ready string        // a ready run of queue q, key "k"
	dead  *runqueue.Run // dead-lettered
}

// seedBadInput writes state that most entry points would change if they
// ran at all: ready, due delayed, TTL-expired, in-flight past its lease,
// and dead-lettered runs.
func seedBadInput(t *testing.T, b *testBundle) badInputState {
	t.Helper()
	ctx := b.ctx
	enq := func(p runqueue.EnqueueParams) {
		t.Helper()
		p.Env, p.Queue = "prod", "q"
		if p.Payload == nil {
			p.Payload = []byte("body-" + p.ID)
		}
		ok, err := b.q.Enqueue(ctx, p)
		require.NoError(t, err)
		require.True(t, ok)
	}
	enq(runqueue.EnqueueParams{Key: "k", ID: "held", Priority: 9})
	enq(runqueue.EnqueueParams{Key: "k", ID: "dead", Priority: 8})
	runs, err := b.q.Dequeue(ctx, "prod", "q", 2)
	require.NoError(t, err)
	require.Len(t, runs, 2)
	require.Equal(t, "held", runs[0].ID)
	_, err = b.q.Nack(ctx, runs[1], &runqueue.NackOptions{DeadLetter: true})
	require.NoError(t, err)

	require.NoError(t, b.q.SetWeight(ctx, "prod", "q", "k", 3))
	enq(runqueue.EnqueueParams{Key: "k", ID: "ready"})
	enq(runqueue.EnqueueParams{ID: "nokey"})
	enq(runqueue.EnqueueParams{Key: "k", ID: "delayed", Delay: time.Second})
	enq(runqueue.EnqueueParams{Key: "k", ID: "expiring", Delay: time.Hour, TTL: time.Second})
	// Everything is due now: a promotion, a recovery or a sweep that slipped
	// through validation would change the dump.
	b.clock.Advance(b.cfg.LeaseDuration + time.Minute)
	return badInputState{held: runs[0], ready: "ready", dead: runs[1]}
}

// TestBadInput calls every entry point with bad input and checks the typed
// error and that Redis is unchanged.
func TestBadInput(t *testing.T) {
	t.Parallel()
	for _, bk := range []backend{{Name: "Mini", Client: redistest.Mini}, {Name: "Real", Client: redistest.Real}} {
		t.Run(bk.Name, func(t *testing.T) {
			t.Parallel()
			c := bk.Client(t)
			// The cases are dealt to badInputParts parts that run in
			// parallel, each on a bundle of its own seeded alike (about
			// 1,800 cases, each of which reads the whole key space twice).
			for part := range badInputParts {
				t.Run(fmt.Sprintf("part%d", part), func(t *testing.T) {
					t.Parallel()
					b := setup(t, c, func(cfg *runqueue.Config) {
						cfg.MaxPayloadBytes = 16
						cfg.MaxDequeueCount = 50
					})
					st := seedBadInput(t, b)
					before := b.dump(t)
					require.NotEmpty(t, before)

					// Cases of a part run one after the other (not in
					// parallel): each compares the whole key space of the
					// bundle before and after its call.
					for i, tc := range badInputCases(t, b, st) {
						if i%badInputParts != part {
							continue
						}
						t.Run(tc.name, func(t *testing.T) {
							err := tc.call(b.ctx)
							// Later cases compare with the state after this
							// one, so one write that slipped through fails one
							// case only.
							want := before
							before = b.dump(t)
							if tc.field != "" {
								requireInvalid(t, err, tc.field)
							} else {
								require.ErrorIs(t, err, tc.want)
								require.NotErrorIs(t, err, runqueue.ErrInvalid)
							}
							require.Equal(t, want, before, "a rejected call changed Redis")
						})
					}
				})
			}
		})
	}
}

// badInputParts is how many parts TestBadInput deals its cases to.
const badInputParts = 4

func requireInvalid(t *testing.T, err error, field string) {
	t.Helper()
	require.ErrorIs(t, err, runqueue.ErrInvalid)
	var ie *runqueue.InvalidError
	require.ErrorAs(t, err, &ie)
	require.Equal(t, field, ie.Field, "error %q names the wrong field", err)
}

func badInputCases(t *testing.T, b *testBundle, st badInputState) []badCase {
	q := b.q
	held := st.held
	good := badTarget{env: held.Env, queue: held.Queue, key: held.Key, id: held.ID}
	runOf := func(tg badTarget) *runqueue.Run {
		return &runqueue.Run{Env: tg.env, Queue: tg.queue, Key: tg.key, ID: tg.id,
			Attempt: held.Attempt, Token: held.Token}
	}

	// Entry points that take names, and which names they take.
	type nameEntry struct {
		name   string
		fields []string
		call   func(ctx context.Context, tg badTarget) error
	}
	entries := []nameEntry{
		{"Enqueue", []string{"env", "queue", "key", "id"}, func(ctx context.Context, tg badTarget) error {
			_, err := q.Enqueue(ctx, runqueue.EnqueueParams{Env: tg.env, Queue: tg.queue, Key: tg.key, ID: tg.id, Payload: []byte("x")})
			return err
		}},
		{"Dequeue", []string{"env", "queue"}, func(ctx context.Context, tg badTarget) error {
			_, err := q.Dequeue(ctx, tg.env, tg.queue, 10)
			return err
		}},
		{"DequeueWait", []string{"env", "queue"}, func(ctx context.Context, tg badTarget) error {
			_, err := q.DequeueWait(ctx, tg.env, tg.queue, 10, 0)
			return err
		}},
		{"Ack", []string{"env", "queue", "key", "id"}, func(ctx context.Context, tg badTarget) error {
			return q.Ack(ctx, runOf(tg))
		}},
		{"Nack", []string{"env", "queue", "key", "id"}, func(ctx context.Context, tg badTarget) error {
			_, err := q.Nack(ctx, runOf(tg), nil)
			return err
		}},
		{"NackDeadLetter", []string{"env", "queue", "key", "id"}, func(ctx context.Context, tg badTarget) error {
			_, err := q.Nack(ctx, runOf(tg), &runqueue.NackOptions{DeadLetter: true})
			return err
		}},
		{"ExtendLease", []string{"env", "queue", "key", "id"}, func(ctx context.Context, tg badTarget) error {
			return q.ExtendLease(ctx, runOf(tg), time.Minute)
		}},
		{"Redrive", []string{"env", "queue", "key", "id"}, func(ctx context.Context, tg badTarget) error {
			return q.Redrive(ctx, tg.env, tg.queue, tg.key, tg.id)
		}},
		{"DeadLetter", []string{"env", "queue", "key", "id"}, func(ctx context.Context, tg badTarget) error {
			_, err := q.DeadLetter(ctx, tg.env, tg.queue, tg.key, tg.id)
			return err
		}},
		{"DeadLetters", []string{"env", "queue"}, func(ctx context.Context, tg badTarget) error {
			_, err := q.DeadLetters(ctx, tg.env, tg.queue, 0, 10)
			return err
		}},
		{"QueueStats", []string{"env", "queue"}, func(ctx context.Context, tg badTarget) error {
			_, err := q.QueueStats(ctx, tg.env, tg.queue)
			return err
		}},
		{"KeyStats", []string{"env", "queue", "key"}, func(ctx context.Context, tg badTarget) error {
			_, err := q.KeyStats(ctx, tg.env, tg.queue, tg.key)
			return err
		}},
		{"SetWeight", []string{"env", "queue", "key"}, func(ctx context.Context, tg badTarget) error {
			return q.SetWeight(ctx, tg.env, tg.queue, tg.key, 2)
		}},
		{"ClearWeight", []string{"env", "queue", "key"}, func(ctx context.Context, tg badTarget) error {
			return q.ClearWeight(ctx, tg.env, tg.queue, tg.key)
		}},
		{"Weights", []string{"env", "queue"}, func(ctx context.Context, tg badTarget) error {
			_, err := q.Weights(ctx, tg.env, tg.queue)
			return err
		}},
		{"EnvStats", []string{"env"}, func(ctx context.Context, tg badTarget) error {
			_, err := q.EnvStats(ctx, tg.env)
			return err
		}},
	}

	var cases []badCase
	add := func(name, field string, call func(ctx context.Context) error) {
		cases = append(cases, badCase{name: name, field: field, call: call})
	}
	sentinel := func(name string, want error, call func(ctx context.Context) error) {
		cases = append(cases, badCase{name: name, want: want, call: call})
	}

	for _, e := range entries {
		for _, f := range e.fields {
			for _, bad := range badNames {
				if f == "key" && bad.val == "" {
					continue // "" is no key, which is valid
				}
				tg := good.with(f, bad.val)
				call := e.call
				add(e.name+"/"+strings.ToUpper(f[:1])+f[1:]+"/"+bad.name, f, func(ctx context.Context) error { return call(ctx, tg) })
			}
		}
	}

	// Enqueue's other arguments.
	enq := func(mut func(*runqueue.EnqueueParams)) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			p := runqueue.EnqueueParams{Env: "prod", Queue: "q", Key: "k", ID: "new", Payload: []byte("x")}
			mut(&p)
			_, err := q.Enqueue(ctx, p)
			return err
		}
	}
	add("Enqueue/Priority/Negative", "priority", enq(func(p *runqueue.EnqueueParams) { p.Priority = -1 }))
	add("Enqueue/Priority/Ten", "priority", enq(func(p *runqueue.EnqueueParams) { p.Priority = runqueue.MaxPriority + 1 }))
	add("Enqueue/Delay/Negative", "delay", enq(func(p *runqueue.EnqueueParams) { p.Delay = -time.Nanosecond }))
	add("Enqueue/TTL/Negative", "ttl", enq(func(p *runqueue.EnqueueParams) { p.TTL = -time.Second }))
	add("Enqueue/Delay/WithAvailableAt", "delay", enq(func(p *runqueue.EnqueueParams) {
		p.AvailableAt, p.Delay = b.clock.Now().Add(time.Minute), time.Second
	}))
	add("Enqueue/Payload/Oversize", "payload", enq(func(p *runqueue.EnqueueParams) {
		p.Payload = make([]byte, b.cfg.MaxPayloadBytes+1)
	}))
	sentinel("Enqueue/Conflict/OtherBody", runqueue.ErrConflict, enq(func(p *runqueue.EnqueueParams) {
		p.ID, p.Payload = st.ready, []byte("another body")
	}))
	sentinel("Enqueue/Conflict/OtherKey", runqueue.ErrConflict, enq(func(p *runqueue.EnqueueParams) {
		p.ID, p.Key, p.Payload = st.ready, "other", []byte("body-"+st.ready)
	}))
	sentinel("Enqueue/Conflict/InFlight", runqueue.ErrConflict, enq(func(p *runqueue.EnqueueParams) {
		p.ID = held.ID
	}))

	// Admission control: a second handle on the same keys with depth limits
	// the seeded queue already meets.
	full := func(mut func(*runqueue.Config)) *runqueue.Queue {
		cfg := &runqueue.Config{Prefix: b.prefix, Clock: b.clock}
		mut(cfg)
		fq, err := runqueue.New(b.ctx, b.client, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = fq.Close() })
		return fq
	}
	queueFull := full(func(c *runqueue.Config) { c.MaxQueueDepth = 2 })
	keyFull := full(func(c *runqueue.Config) { c.MaxKeyDepth = 1 })
	sentinel("Enqueue/QueueFull", runqueue.ErrQueueFull, func(ctx context.Context) error {
		_, err := queueFull.Enqueue(ctx, runqueue.EnqueueParams{Env: "prod", Queue: "q", Key: "fresh", ID: "new"})
		var qf *runqueue.QueueFullError
		if errors.As(err, &qf) && (qf.Scope != "queue" || qf.Limit != 2) {
			return errors.New("wrong QueueFullError " + qf.Error())
		}
		return err
	})
	sentinel("Enqueue/KeyFull", runqueue.ErrQueueFull, func(ctx context.Context) error {
		_, err := keyFull.Enqueue(ctx, runqueue.EnqueueParams{Env: "prod", Queue: "q", Key: "k", ID: "new"})
		var qf *runqueue.QueueFullError
		if errors.As(err, &qf) && (qf.Scope != "key" || qf.Limit != 1) {
			return errors.New("wrong QueueFullError " + qf.Error())
		}
		return err
	})

	// Weights.
	for _, w := range []struct {
		name string
		w    float64
	}{{"Zero", 0}, {"Negative", -1}, {"BelowMin", runqueue.MinWeight / 2}, {"AboveMax", runqueue.MaxWeight + 1},
		{"NaN", math.NaN()}, {"Inf", math.Inf(1)}} {
		weight := w.w
		add("SetWeight/Weight/"+w.name, "weight", func(ctx context.Context) error {
			return q.SetWeight(ctx, "prod", "q", "k", weight)
		})
	}
	oneWeight := full(func(c *runqueue.Config) { c.MaxWeightOverrides = 1 })
	sentinel("SetWeight/TooMany", runqueue.ErrTooManyWeights, func(ctx context.Context) error {
		return oneWeight.SetWeight(ctx, "prod", "q", "other", 2)
	})

	// maxCount, shard, sweep limit, timeout.
	maxCounts := []struct {
		name string
		n    int
	}{{"Zero", 0}, {"Negative", -1}, {"AboveMax", b.cfg.MaxDequeueCount + 1}}
	shards := []struct {
		name string
		n    int
	}{{"Negative", -1}, {"Shards", q.Shards()}}
	shard := q.ShardOf("prod")
	for _, m := range maxCounts {
		n := m.n
		add("Dequeue/MaxCount/"+m.name, "maxCount", func(ctx context.Context) error {
			_, err := q.Dequeue(ctx, "prod", "q", n)
			return err
		})
		add("DequeueWait/MaxCount/"+m.name, "maxCount", func(ctx context.Context) error {
			_, err := q.DequeueWait(ctx, "prod", "q", n, 0)
			return err
		})
		add("DequeueShard/MaxCount/"+m.name, "maxCount", func(ctx context.Context) error {
			_, err := q.DequeueShard(ctx, shard, n)
			return err
		})
		add("DequeueShardWait/MaxCount/"+m.name, "maxCount", func(ctx context.Context) error {
			_, err := q.DequeueShardWait(ctx, shard, n, 0)
			return err
		})
	}
	for _, s := range shards {
		n := s.n
		add("DequeueShard/Shard/"+s.name, "shard", func(ctx context.Context) error {
			_, err := q.DequeueShard(ctx, n, 10)
			return err
		})
		add("DequeueShardWait/Shard/"+s.name, "shard", func(ctx context.Context) error {
			_, err := q.DequeueShardWait(ctx, n, 10, 0)
			return err
		})
		add("RecoverLeases/Shard/"+s.name, "shard", func(ctx context.Context) error {
			_, err := q.RecoverLeases(ctx, n, 10)
			return err
		})
		add("ExpireTTL/Shard/"+s.name, "shard", func(ctx context.Context) error {
			_, err := q.ExpireTTL(ctx, n, 10)
			return err
		})
	}
	for _, l := range []struct {
		name string
		n    int
	}{{"Zero", 0}, {"Negative", -1}, {"Absurd", 100001}} {
		n := l.n
		add("RecoverLeases/Limit/"+l.name, "limit", func(ctx context.Context) error {
			_, err := q.RecoverLeases(ctx, shard, n)
			return err
		})
		add("ExpireTTL/Limit/"+l.name, "limit", func(ctx context.Context) error {
			_, err := q.ExpireTTL(ctx, shard, n)
			return err
		})
	}
	add("DequeueWait/Timeout/Negative", "timeout", func(ctx context.Context) error {
		_, err := q.DequeueWait(ctx, "prod", "q", 10, -time.Millisecond)
		return err
	})
	add("DequeueShardWait/Timeout/Negative", "timeout", func(ctx context.Context) error {
		_, err := q.DequeueShardWait(ctx, shard, 10, -time.Millisecond)
		return err
	})
	add("DeadLetters/Offset/Negative", "offset", func(ctx context.Context) error {
		_, err := q.DeadLetters(ctx, "prod", "q", -1, 10)
		return err
	})
	add("DeadLetters/Limit/Zero", "limit", func(ctx context.Context) error {
		_, err := q.DeadLetters(ctx, "prod", "q", 0, 0)
		return err
	})
	add("DeadLetters/Limit/Absurd", "limit", func(ctx context.Context) error {
		_, err := q.DeadLetters(ctx, "prod", "q", 0, 10001)
		return err
	})

	// Runs: nil, no token, unknown, not held by the caller.
	runOps := []struct {
		name string
		call func(ctx context.Context, r *runqueue.Run) error
	}{
		{"Ack", func(ctx context.Context, r *runqueue.Run) error { return q.Ack(ctx, r) }},
		{"Nack", func(ctx context.Context, r *runqueue.Run) error { _, err := q.Nack(ctx, r, nil); return err }},
		{"NackDeadLetter", func(ctx context.Context, r *runqueue.Run) error {
			_, err := q.Nack(ctx, r, &runqueue.NackOptions{DeadLetter: true})
			return err
		}},
		{"ExtendLease", func(ctx context.Context, r *runqueue.Run) error { return q.ExtendLease(ctx, r, time.Minute) }},
	}
	for _, op := range runOps {
		call := op.call
		withRun := func(mut func(*runqueue.Run)) func(ctx context.Context) error {
			return func(ctx context.Context) error {
				r := runOf(good)
				mut(r)
				return call(ctx, r)
			}
		}
		add(op.name+"/Run/Nil", "run", func(ctx context.Context) error { return call(ctx, nil) })
		add(op.name+"/Token/Zero", "token", withRun(func(r *runqueue.Run) { r.Token = 0 }))
		add(op.name+"/Token/Negative", "token", withRun(func(r *runqueue.Run) { r.Token = -1 }))
		// Ack is idempotent: a run that is not there is done (nil), and
		// nothing is written either way.
		gone := runqueue.ErrNotFound
		if op.name == "Ack" {
			gone = nil
		}
		sentinel(op.name+"/UnknownID", gone, withRun(func(r *runqueue.Run) { r.ID = "no-such-run" }))
		sentinel(op.name+"/UnknownQueue", gone, withRun(func(r *runqueue.Run) { r.Queue = "other" }))
		sentinel(op.name+"/WrongKey", runqueue.ErrNotFound, withRun(func(r *runqueue.Run) { r.Key = "other" }))
		sentinel(op.name+"/NoKeyForKeyedRun", runqueue.ErrNotFound, withRun(func(r *runqueue.Run) { r.Key = "" }))
		sentinel(op.name+"/OtherDelivery", runqueue.ErrLeaseLost, withRun(func(r *runqueue.Run) { r.Token++ }))
		sentinel(op.name+"/ReadyRun", runqueue.ErrNotInFlight, withRun(func(r *runqueue.Run) { r.ID = st.ready }))
		sentinel(op.name+"/DeadRun", runqueue.ErrNotInFlight, withRun(func(r *runqueue.Run) { r.ID = st.dead.ID }))
	}
	for _, d := range []time.Duration{0, -time.Second} {
		name := "Zero"
		if d < 0 {
			name = "Negative"
		}
		add("ExtendLease/Duration/"+name, "duration", func(ctx context.Context) error {
			return q.ExtendLease(ctx, runOf(good), d)
		})
	}

	// Dead letters.
	sentinel("Redrive/UnknownID", runqueue.ErrNotFound, func(ctx context.Context) error {
		return q.Redrive(ctx, "prod", "q", "k", "no-such-run")
	})
	sentinel("Redrive/WrongKey", runqueue.ErrNotFound, func(ctx context.Context) error {
		return q.Redrive(ctx, "prod", "q", "other", st.dead.ID)
	})
	sentinel("DeadLetter/UnknownID", runqueue.ErrNotFound, func(ctx context.Context) error {
		_, err := q.DeadLetter(ctx, "prod", "q", "k", "no-such-run")
		return err
	})
	sentinel("DeadLetter/NotDead", runqueue.ErrNotFound, func(ctx context.Context) error {
		_, err := q.DeadLetter(ctx, "prod", "q", "k", st.ready)
		return err
	})

	// New: nil client and every Config rule.
	newWith := func(client redis.UniversalClient, mut func(*runqueue.Config)) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			cfg := &runqueue.Config{Prefix: b.prefix, Clock: b.clock}
			mut(cfg)
			nq, err := runqueue.New(ctx, client, cfg)
			if nq != nil {
				_ = nq.Close()
				return errors.New("New returned a Queue with its error")
			}
			return err
		}
	}
	add("New/Client/Nil", "client", newWith(nil, func(*runqueue.Config) {}))
	nan := math.NaN()
	configCases := []struct {
		name, field string
		mut         func(*runqueue.Config)
	}{
		{"ShardsNegative", "Shards", func(c *runqueue.Config) { c.Shards = -1 }},
		{"ShardsTooMany", "Shards", func(c *runqueue.Config) { c.Shards = 16385 }},
		{"PriorityStepSubMillisecond", "PriorityStep", func(c *runqueue.Config) { c.PriorityStep = time.Microsecond }},
		{"PriorityStepNegative", "PriorityStep", func(c *runqueue.Config) { c.PriorityStep = -time.Second }},
		{"MaxPayloadBytesNegative", "MaxPayloadBytes", func(c *runqueue.Config) { c.MaxPayloadBytes = -1 }},
		{"MaxPayloadBytesAbsurd", "MaxPayloadBytes", func(c *runqueue.Config) { c.MaxPayloadBytes = 512<<20 + 1 }},
		{"MaxQueueDepthNegative", "MaxQueueDepth", func(c *runqueue.Config) { c.MaxQueueDepth = -1 }},
		{"MaxKeyDepthNegative", "MaxKeyDepth", func(c *runqueue.Config) { c.MaxKeyDepth = -1 }},
		{"LeaseDurationSubMillisecond", "LeaseDuration", func(c *runqueue.Config) { c.LeaseDuration = time.Microsecond }},
		{"LeaseDurationNegative", "LeaseDuration", func(c *runqueue.Config) { c.LeaseDuration = -time.Minute }},
		{"BackoffBaseNegative", "BackoffBase", func(c *runqueue.Config) { c.BackoffBase = -time.Second }},
		{"BackoffMaxBelowBase", "BackoffMax", func(c *runqueue.Config) { c.BackoffBase, c.BackoffMax = time.Minute, time.Second }},
		{"BackoffMaxNegative", "BackoffMax", func(c *runqueue.Config) { c.BackoffMax = -time.Second }},
		{"BackoffJitterOne", "BackoffJitter", func(c *runqueue.Config) { c.BackoffJitter = 1 }},
		{"BackoffJitterNaN", "BackoffJitter", func(c *runqueue.Config) { c.BackoffJitter = nan }},
		{"MaxDequeueCountNegative", "MaxDequeueCount", func(c *runqueue.Config) { c.MaxDequeueCount = -1 }},
		{"MaxDequeueCountAbsurd", "MaxDequeueCount", func(c *runqueue.Config) { c.MaxDequeueCount = 10001 }},
		{"ScanLimitNegative", "ScanLimit", func(c *runqueue.Config) { c.ScanLimit = -1 }},
		{"ScanLimitAbsurd", "ScanLimit", func(c *runqueue.Config) { c.ScanLimit = 10001 }},
		{"PromoteLimitNegative", "PromoteLimit", func(c *runqueue.Config) { c.PromoteLimit = -1 }},
		{"PromoteLimitAbsurd", "PromoteLimit", func(c *runqueue.Config) { c.PromoteLimit = 501 }},
		{"WindowMultiplierNegative", "WindowMultiplier", func(c *runqueue.Config) { c.WindowMultiplier = -1 }},
		{"WindowMultiplierAbsurd", "WindowMultiplier", func(c *runqueue.Config) { c.WindowMultiplier = 101 }},
		{"QuantumNegative", "Quantum", func(c *runqueue.Config) { c.Quantum = -1 }},
		{"QuantumAbsurd", "Quantum", func(c *runqueue.Config) { c.Quantum = 1e6 + 1 }},
		{"QuantumNaN", "Quantum", func(c *runqueue.Config) { c.Quantum = nan }},
		{"QuantumInf", "Quantum", func(c *runqueue.Config) { c.Quantum = math.Inf(1) }},
		{"StateTTLSubSecond", "StateTTL", func(c *runqueue.Config) { c.StateTTL = time.Millisecond }},
		{"StateTTLNegative", "StateTTL", func(c *runqueue.Config) { c.StateTTL = -time.Hour }},
		{"IdleMaxEntriesNegative", "IdleMaxEntries", func(c *runqueue.Config) { c.IdleMaxEntries = -1 }},
		{"MaxWeightOverridesNegative", "MaxWeightOverrides", func(c *runqueue.Config) { c.MaxWeightOverrides = -1 }},
		{"PrefixBrace", "Prefix", func(c *runqueue.Config) { c.Prefix = "a{b" }},
		{"PrefixClosingBrace", "Prefix", func(c *runqueue.Config) { c.Prefix = "a}b" }},
		{"PrefixColon", "Prefix", func(c *runqueue.Config) { c.Prefix = "a:b" }},
		{"PrefixStar", "Prefix", func(c *runqueue.Config) { c.Prefix = "a*" }},
		{"PrefixSpace", "Prefix", func(c *runqueue.Config) { c.Prefix = "a b" }},
		{"PrefixTooLong", "Prefix", func(c *runqueue.Config) { c.Prefix = strings.Repeat("p", 65) }},
	}
	for _, cc := range configCases {
		add("New/Config/"+cc.name, "Config."+cc.field, newWith(b.client, cc.mut))
	}
	return cases
}

// TestInputBoundariesAccepted is the other side of TestBadInput: values at
// the edge of every rule are accepted, so the rules are not stricter than
// documented.
func TestInputBoundariesAccepted(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, func(cfg *runqueue.Config) {
			cfg.MaxPayloadBytes = 16
			cfg.MaxDequeueCount = 50
		})
		ctx := b.ctx
		long := strings.Repeat("é", runqueue.MaxNameBytes/2) // 256 bytes
		names := []badTarget{
			{env: long, queue: long, key: long, id: long},
			{env: "a b", queue: "x\u00a0y", key: "", id: "..."},
			{env: "*", queue: "{q}", key: ".k", id: "%"},
		}
		for i, tg := range names {
			ok, err := b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: tg.env, Queue: tg.queue, Key: tg.key, ID: tg.id,
				Payload: make([]byte, b.cfg.MaxPayloadBytes), Priority: runqueue.MaxPriority * (i % 2)})
			require.NoError(t, err)
			require.True(t, ok)
			runs, err := b.q.Dequeue(ctx, tg.env, tg.queue, b.cfg.MaxDequeueCount)
			require.NoError(t, err)
			require.Len(t, runs, 1)
			require.Equal(t, tg.id, runs[0].ID)
			require.Equal(t, tg.key, runs[0].Key)
			require.NoError(t, b.q.ExtendLease(ctx, runs[0], time.Millisecond))
			require.NoError(t, b.q.Ack(ctx, runs[0]))
		}
		_, err := b.q.DequeueShard(ctx, b.q.Shards()-1, b.cfg.MaxDequeueCount)
		require.NoError(t, err)
		_, err = b.q.RecoverLeases(ctx, b.q.Shards()-1, 100000)
		require.NoError(t, err)
		_, err = b.q.ExpireTTL(ctx, 0, 100000)
		require.NoError(t, err)
		_, err = b.q.DeadLetters(ctx, "a b", "x\u00a0y", 0, 10000)
		require.NoError(t, err)
		require.Empty(t, b.keysUnder(t), "every run was acked: nothing may be left behind")
	})
}
