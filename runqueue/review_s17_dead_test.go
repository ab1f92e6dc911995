package runqueue_test

// Review s17: adversarial probes of dead letters (DeadLetters and its
// paging, DeadLetter, Redrive, NackOptions.DeadLetter, MaxAttempts). Every
// test is named TestS17Dead*. A test that shows a defect says DEFECT and
// fails until it is fixed. The helpers s17* are shared with
// review_s17_lease_test.go and review_s17_config_test.go.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// s17Setup is setup with the flag set and mutate applied.
func s17Setup(t *testing.T, c redis.UniversalClient, on bool, mutate func(*runqueue.Config)) *testBundle {
	t.Helper()
	return setup(t, c, func(cfg *runqueue.Config) {
		cfg.VtimeScheduling = on
		cfg.SerialCalls = true
		if mutate != nil {
			mutate(cfg)
		}
	})
}

// s17AllKeys is every key under prefix (layout and token counters
// included), with its type, value and whether it has a TTL, on a single
// node or on every master of a cluster: "nothing written" is checked on
// everything.
func s17AllKeys(t testing.TB, client redis.UniversalClient, prefix string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, k := range prefixKeys(t, client, prefix) {
		ttl, err := client.PTTL(context.Background(), k).Result()
		require.NoError(t, err)
		out[k] = fmt.Sprintf("%s ttl=%v", keyValue(t, client, k), ttl > 0)
	}
	return out
}

// s17RunKeys is keysUnder less the scheduler's state (which expires).
func s17RunKeys(t testing.TB, b *testBundle) []string {
	t.Helper()
	var out []string
	for _, k := range b.keysUnder(t) {
		if !expiresOnItsOwn(k) {
			out = append(out, k)
		}
	}
	return out
}

// s17Invalid asserts err is an *InvalidError naming field.
func s17Invalid(t *testing.T, err error, field string) {
	t.Helper()
	require.Error(t, err)
	require.ErrorIs(t, err, runqueue.ErrInvalid)
	var inv *runqueue.InvalidError
	require.ErrorAs(t, err, &inv)
	if field != "" {
		require.Equal(t, field, inv.Field, "err: %v", err)
	}
}

// s17Kill enqueues run id (key), dequeues it and dead-letters it by Nack.
func s17Kill(t *testing.T, b *testBundle, key, id string, payload string) {
	t.Helper()
	enqueue(t, b, runqueue.EnqueueParams{Key: key, ID: id, Payload: []byte(payload)})
	var got *runqueue.Run
	for range 50 {
		runs := dequeue(t, b, queueName, 1)
		require.Len(t, runs, 1)
		if runs[0].ID == id {
			got = runs[0]
			break
		}
		t.Fatalf("dequeued %s, want %s", runs[0].ID, id)
	}
	res, err := b.q.Nack(b.ctx, got, &runqueue.NackOptions{DeadLetter: true})
	require.NoError(t, err)
	require.False(t, res.Requeued)
}

// TestS17DeadLettersPaging: DeadLetters lists the dead runs oldest death
// first, pages without gaps or repeats, and reports each run's payload,
// attempt, priority, key and time of death.
func TestS17DeadLettersPaging(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		b := s17Setup(t, c, on, nil)
		var want []string
		died := map[string]time.Time{}
		for i := range 7 {
			id := fmt.Sprintf("d%d", i)
			key := fmt.Sprintf("k%d", i%3)
			s17Kill(t, b, key, id, "p-"+id)
			died[id] = b.clock.Now()
			want = append(want, id)
			b.clock.Advance(time.Second)
		}
		var got []string
		for off := 0; off < 10; off += 3 {
			page, err := b.q.DeadLetters(b.ctx, env, queueName, off, 3)
			require.NoError(t, err)
			require.LessOrEqual(t, len(page), 3)
			for _, d := range page {
				got = append(got, d.ID)
				require.Equal(t, "p-"+d.ID, string(d.Payload))
				require.Equal(t, 2, d.Attempt, "attempts made + 1")
				require.Equal(t, env, d.Env)
				require.Equal(t, queueName, d.Queue)
				require.True(t, died[d.ID].Equal(d.DiedAt), "%s died at %v, listed %v", d.ID, died[d.ID], d.DiedAt)
				one, err := b.q.DeadLetter(b.ctx, env, queueName, d.Key, d.ID)
				require.NoError(t, err)
				require.Equal(t, d, one)
			}
		}
		require.Equal(t, want, got)
		// Past the end: empty, no error; huge offsets do not overflow into a
		// negative (from-the-end) range.
		for _, off := range []int{7, 1 << 40, int(^uint(0)>>1) - 5} {
			page, err := b.q.DeadLetters(b.ctx, env, queueName, off, 10000)
			require.NoError(t, err, "offset %d", off)
			require.Empty(t, page, "offset %d", off)
		}
		s, err := b.q.QueueStats(b.ctx, env, queueName)
		require.NoError(t, err)
		require.Equal(t, int64(7), s.Dead)
	})
}

// TestS17DeadBadInput: bad arguments of DeadLetters, DeadLetter and
// Redrive are typed errors and write nothing; a lookup under the wrong key
// or of a live run is ErrNotFound and writes nothing.
func TestS17DeadBadInput(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		b := s17Setup(t, c, on, nil)
		s17Kill(t, b, "k", "dead", "x")
		enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "live"})
		before := s17AllKeys(t, c, b.prefix)
		_, err := b.q.DeadLetters(b.ctx, env, queueName, -1, 10)
		s17Invalid(t, err, "offset")
		for _, lim := range []int{0, -1, 10001} {
			_, err = b.q.DeadLetters(b.ctx, env, queueName, 0, lim)
			s17Invalid(t, err, "limit")
		}
		_, err = b.q.DeadLetters(b.ctx, "", queueName, 0, 1)
		s17Invalid(t, err, "env")
		_, err = b.q.DeadLetter(b.ctx, env, queueName, "k", "a\x00")
		s17Invalid(t, err, "id")
		s17Invalid(t, b.q.Redrive(b.ctx, env, queueName, " k", "dead"), "key")
		s17Invalid(t, b.q.Redrive(b.ctx, env, "..", "k", "dead"), "queue")

		_, err = b.q.DeadLetter(b.ctx, env, queueName, "other", "dead")
		require.ErrorIs(t, err, runqueue.ErrNotFound)
		_, err = b.q.DeadLetter(b.ctx, env, queueName, "", "dead")
		require.ErrorIs(t, err, runqueue.ErrNotFound)
		_, err = b.q.DeadLetter(b.ctx, env, queueName, "k", "live")
		require.ErrorIs(t, err, runqueue.ErrNotFound, "a live run is not dead")
		_, err = b.q.DeadLetter(b.ctx, env, queueName, "k", "nope")
		require.ErrorIs(t, err, runqueue.ErrNotFound)
		require.ErrorIs(t, b.q.Redrive(b.ctx, env, queueName, "other", "dead"), runqueue.ErrNotFound)
		require.ErrorIs(t, b.q.Redrive(b.ctx, env, queueName, "k", "nope"), runqueue.ErrNotFound)
		// A redrive of a live run succeeds and leaves it as it is.
		require.NoError(t, b.q.Redrive(b.ctx, env, queueName, "k", "live"))
		require.Equal(t, before, s17AllKeys(t, c, b.prefix))
	})
}

// TestS17DeadRedriveTwice: a redrive sent twice (a lost reply resent)
// leaves the state the first left; the run is ready now with attempt 1,
// its priority kept, and the dead counters are decremented once.
func TestS17DeadRedriveTwice(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		b := s17Setup(t, c, on, func(cfg *runqueue.Config) { cfg.MaxAttempts = 2 })
		enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "r", Priority: 7, Payload: []byte("pl"), TTL: time.Minute})
		r := dequeue(t, b, queueName, 1)[0]
		res, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{RetryAt: b.clock.Now()})
		require.NoError(t, err)
		require.True(t, res.Requeued)
		r = dequeue(t, b, queueName, 1)[0]
		res, err = b.q.Nack(b.ctx, r, nil) // attempt 2 of 2: dead
		require.NoError(t, err)
		require.False(t, res.Requeued)
		require.Equal(t, 3, res.Attempt)
		// The nack resent: the same answer, nothing changes.
		st := s17AllKeys(t, c, b.prefix)
		res2, err := b.q.Nack(b.ctx, r, nil)
		require.NoError(t, err)
		require.Equal(t, res, res2)
		require.Equal(t, st, s17AllKeys(t, c, b.prefix))
		es, err := b.q.EnvStats(b.ctx, env)
		require.NoError(t, err)
		require.Equal(t, int64(1), es.Dead)

		b.clock.Advance(2 * time.Minute) // past the original TTL
		require.NoError(t, b.q.Redrive(b.ctx, env, queueName, "k", "r"))
		st = s17AllKeys(t, c, b.prefix)
		require.NoError(t, b.q.Redrive(b.ctx, env, queueName, "k", "r"))
		require.Equal(t, st, s17AllKeys(t, c, b.prefix), "a resent redrive changes nothing")
		es, err = b.q.EnvStats(b.ctx, env)
		require.NoError(t, err)
		require.Equal(t, int64(0), es.Dead)
		require.Equal(t, int64(1), es.Ready)
		_, err = b.q.DeadLetter(b.ctx, env, queueName, "k", "r")
		require.ErrorIs(t, err, runqueue.ErrNotFound)
		// The TTL bound the first stay only: the redriven run does not expire.
		n, err := b.q.ExpireTTL(b.ctx, b.q.ShardOf(env), 100)
		require.NoError(t, err)
		require.Equal(t, 0, n)
		got := dequeue(t, b, queueName, 5)
		require.Len(t, got, 1)
		require.Equal(t, 1, got[0].Attempt)
		require.Equal(t, 7, got[0].Priority)
		require.Equal(t, "pl", string(got[0].Payload))
		require.True(t, got[0].AvailableAt.Equal(b.clock.Now()), "ready now: %v", got[0].AvailableAt)
		require.NoError(t, b.q.Ack(b.ctx, got[0]))
		// A redrive resent after the run finished: nothing comes back.
		err = b.q.Redrive(b.ctx, env, queueName, "k", "r")
		require.ErrorIs(t, err, runqueue.ErrNotFound)
		require.Empty(t, s17RunKeys(t, b), "nothing left once the run is done")
	})
}

// TestS17DeadIDReuse: the id of a dead run is taken while it is dead: an
// enqueue with the same body is an idempotent no-op (the run stays dead),
// with another body or key ErrConflict, nothing written either way; once
// the redriven run is acked the id is free again, and a resent redrive
// of the old run then leaves the new run alone.
func TestS17DeadIDReuse(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		b := s17Setup(t, c, on, nil)
		s17Kill(t, b, "k", "x", "body")
		before := s17AllKeys(t, c, b.prefix)
		ok, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: "k", ID: "x", Payload: []byte("body")})
		require.NoError(t, err)
		require.False(t, ok)
		_, err = b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: "k2", ID: "x", Payload: []byte("body")})
		require.ErrorIs(t, err, runqueue.ErrConflict)
		_, err = b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: "k", ID: "x", Payload: []byte("other")})
		require.ErrorIs(t, err, runqueue.ErrConflict)
		require.Equal(t, before, s17AllKeys(t, c, b.prefix))

		require.NoError(t, b.q.Redrive(b.ctx, env, queueName, "k", "x"))
		r := dequeue(t, b, queueName, 1)[0]
		require.NoError(t, b.q.Ack(b.ctx, r))
		// A new run under the same id, another key.
		enqueue(t, b, runqueue.EnqueueParams{Key: "k2", ID: "x", Payload: []byte("new")})
		st := s17AllKeys(t, c, b.prefix)
		require.ErrorIs(t, b.q.Redrive(b.ctx, env, queueName, "k", "x"), runqueue.ErrNotFound)
		require.NoError(t, b.q.Redrive(b.ctx, env, queueName, "k2", "x"), "live: left as it is")
		require.Equal(t, st, s17AllKeys(t, c, b.prefix))
		got := dequeue(t, b, queueName, 5)
		require.Len(t, got, 1)
		require.Equal(t, "new", string(got[0].Payload))
		require.Equal(t, 1, got[0].Attempt)
	})
}

// TestS17DeadAtKeyLimit: dead-lettering a run of a key at its concurrency
// limit frees the key's slot at once: the key's next run is served by the
// next dequeue, and redriving the dead run makes it wait for the slot.
func TestS17DeadAtKeyLimit(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		b := s17Setup(t, c, on, func(cfg *runqueue.Config) { cfg.KeyConcurrency = 1 })
		enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "a"})
		b.clock.Advance(time.Millisecond)
		enqueue(t, b, runqueue.EnqueueParams{Key: "k", ID: "b"})
		b.clock.Advance(time.Millisecond)
		enqueue(t, b, runqueue.EnqueueParams{Key: "o", ID: "o1"})
		first := dequeue(t, b, queueName, 1)
		require.Equal(t, []string{"a"}, runIDs(first))
		got := dequeue(t, b, queueName, 5)
		require.Equal(t, []string{"o1"}, runIDs(got), "b waits for k's slot")
		ackAll(t, b, got)
		require.Empty(t, dequeue(t, b, queueName, 5))
		_, err := b.q.Nack(b.ctx, first[0], &runqueue.NackOptions{DeadLetter: true})
		require.NoError(t, err)
		n, err := b.q.KeyInflight(b.ctx, env, queueName, "k")
		require.NoError(t, err)
		require.Equal(t, 0, n)
		got = dequeue(t, b, queueName, 5)
		require.Equal(t, []string{"b"}, runIDs(got), "the dead letter freed k's slot")
		require.NoError(t, b.q.Redrive(b.ctx, env, queueName, "k", "a"))
		require.Empty(t, dequeue(t, b, queueName, 5), "the redriven run waits for k's slot")
		ackAll(t, b, got)
		got = dequeue(t, b, queueName, 5)
		require.Equal(t, []string{"a"}, runIDs(got))
		ackAll(t, b, got)
		s, err := b.q.QueueStats(b.ctx, env, queueName)
		require.NoError(t, err)
		require.Equal(t, runqueue.Stats{}, s)
	})
}

// TestS17DeadMaxAttempts: MaxAttempts 1 dead-letters at the first nack
// and at the first lease recovery; a negative MaxAttempts never does.
func TestS17DeadMaxAttempts(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		b := s17Setup(t, c, on, func(cfg *runqueue.Config) {
			cfg.MaxAttempts = 1
			cfg.LeaseDuration = time.Second
		})
		enqueue(t, b, runqueue.EnqueueParams{ID: "n"})
		enqueue(t, b, runqueue.EnqueueParams{ID: "l"})
		runs := dequeue(t, b, queueName, 2)
		require.Len(t, runs, 2)
		for _, r := range runs {
			if r.ID == "n" {
				res, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{RetryAt: b.clock.Now()})
				require.NoError(t, err)
				require.Equal(t, runqueue.NackResult{Requeued: false, Attempt: 2}, res)
			}
		}
		b.clock.Advance(2 * time.Second)
		n, err := b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 10)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		dead, err := b.q.DeadLetters(b.ctx, env, queueName, 0, 10)
		require.NoError(t, err)
		require.Len(t, dead, 2)
		require.Equal(t, []string{"n", "l"}, []string{dead[0].ID, dead[1].ID})

		u := setup(t, c, func(cfg *runqueue.Config) {
			cfg.VtimeScheduling = on
			cfg.MaxAttempts = -1
			cfg.SerialCalls = true
		})
		enqueue(t, u, runqueue.EnqueueParams{ID: "u"})
		for i := 1; i <= 12; i++ {
			r := dequeue(t, u, queueName, 1)
			require.Len(t, r, 1)
			require.Equal(t, i, r[0].Attempt)
			res, err := u.q.Nack(u.ctx, r[0], &runqueue.NackOptions{RetryAt: u.clock.Now()})
			require.NoError(t, err)
			require.True(t, res.Requeued)
		}
	})
}

// TestS17DeadFlagFlip: a flag-on and a flag-off Queue on one prefix take
// turns dead-lettering, redriving, serving and acking runs of many keys;
// every run is served to completion exactly once and nothing of the runs
// is left behind.
func TestS17DeadFlagFlip(t *testing.T) {
	s16EachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		on := s17Setup(t, c, true, func(cfg *runqueue.Config) { cfg.KeyConcurrency = 2 })
		offQ, err := runqueue.New(on.ctx, c, &runqueue.Config{Prefix: on.prefix, Clock: on.clock, SerialCalls: true,
			KeyConcurrency: 2})
		require.NoError(t, err)
		t.Cleanup(func() { _ = offQ.Close() })
		qs := []*runqueue.Queue{on.q, offQ}
		const n = 60
		for i := range n {
			enqueue(t, on, runqueue.EnqueueParams{Key: fmt.Sprintf("k%d", i%7), ID: fmt.Sprintf("r%02d", i)})
		}
		done := map[string]int{}
		killed := map[string]bool{}
		for step := 0; len(done) < n && step < 500; step++ {
			q := qs[step%2]
			on.clock.Advance(time.Millisecond)
			runs, err := q.Dequeue(on.ctx, env, queueName, 4)
			require.NoError(t, err)
			for i, r := range runs {
				switch {
				case !killed[r.ID] && i%2 == 0:
					killed[r.ID] = true
					_, err := qs[(step+1)%2].Nack(on.ctx, r, &runqueue.NackOptions{DeadLetter: true})
					require.NoError(t, err)
					require.NoError(t, q.Redrive(on.ctx, env, queueName, r.Key, r.ID))
				default:
					require.NoError(t, qs[(step+i)%2].Ack(on.ctx, r))
					done[r.ID]++
				}
			}
		}
		require.Len(t, done, n)
		for id, k := range done {
			require.Equal(t, 1, k, id)
		}
		require.Empty(t, s17RunKeys(t, on), "left behind")
	})
}

// TestS17DeadStaleHolder: a dead-lettered run's stale holder
// cannot ack, nack or extend it (ErrNotInFlight), and sweeps leave it
// alone: it stays listed until redriven.
func TestS17DeadStaleHolder(t *testing.T) {
	s16EachFlag(t, func(t *testing.T, c redis.UniversalClient, on bool) {
		b := s17Setup(t, c, on, func(cfg *runqueue.Config) { cfg.LeaseDuration = time.Second })
		enqueue(t, b, runqueue.EnqueueParams{ID: "r", TTL: time.Second})
		r := dequeue(t, b, queueName, 1)[0]
		_, err := b.q.Nack(b.ctx, r, &runqueue.NackOptions{DeadLetter: true})
		require.NoError(t, err)
		b.clock.Advance(time.Hour)
		st := s17AllKeys(t, c, b.prefix)
		require.ErrorIs(t, b.q.ExtendLease(b.ctx, r, time.Minute), runqueue.ErrNotInFlight)
		require.ErrorIs(t, b.q.Ack(b.ctx, r), runqueue.ErrNotInFlight)
		n, err := b.q.RecoverLeases(b.ctx, b.q.ShardOf(env), 10)
		require.NoError(t, err)
		require.Zero(t, n)
		n, err = b.q.ExpireTTL(b.ctx, b.q.ShardOf(env), 10)
		require.NoError(t, err)
		require.Zero(t, n)
		require.Equal(t, st, s17AllKeys(t, c, b.prefix))
		d, err := b.q.DeadLetters(b.ctx, env, queueName, 0, 10)
		require.NoError(t, err)
		require.Len(t, d, 1)
		require.Equal(t, "r", d[0].ID)
	})
}
