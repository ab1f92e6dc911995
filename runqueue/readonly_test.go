package runqueue_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// TestReadOnlyEmptyPrefix: a read-only New on a prefix that holds nothing
// records no layout version and writes no key.
func TestReadOnlyEmptyPrefix(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := &testBundle{ctx: t.Context(), client: c, clock: newFakeClock(), prefix: redistest.Prefix(t)}
		ro, err := runqueue.New(b.ctx, c, &runqueue.Config{Prefix: b.prefix, Clock: b.clock, ReadOnly: true})
		require.NoError(t, err)
		t.Cleanup(func() { _ = ro.Close() })
		s, err := ro.QueueStats(b.ctx, "e", "q")
		require.NoError(t, err)
		require.Equal(t, runqueue.Stats{}, s)

		space, err := keys.NewSpace(b.prefix, ro.Shards())
		require.NoError(t, err)
		n, err := c.Exists(b.ctx, space.Layout()).Result()
		require.NoError(t, err)
		require.Zero(t, n, "a read-only New records no layout version")
		require.Empty(t, b.keysUnder(t))
	})
}

// TestReadOnlyRefusesWrites: a read-only Queue reads what a writer stored
// and refuses every write with ErrReadOnly, nothing written.
func TestReadOnlyRefusesWrites(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = true; cfg.MaxAttempts = 1 })
		for _, id := range []string{"a", "b", "c"} {
			_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: "e", Queue: "q", Key: "k", ID: id})
			require.NoError(t, err)
		}
		_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: "e", Queue: "ttl", ID: "t", TTL: time.Minute})
		require.NoError(t, err)
		runs, err := b.q.Dequeue(b.ctx, "e", "q", 2)
		require.NoError(t, err)
		require.Len(t, runs, 2)
		res, err := b.q.Nack(b.ctx, runs[1], nil)
		require.NoError(t, err)
		require.False(t, res.Requeued)
		held := runs[0]

		ro, err := runqueue.New(b.ctx, c, &runqueue.Config{Prefix: b.prefix, Clock: b.clock, VtimeScheduling: true,
			ReadOnly: true})
		require.NoError(t, err)
		t.Cleanup(func() { _ = ro.Close() })
		before := b.dump(t)

		s, err := ro.QueueStats(b.ctx, "e", "q")
		require.NoError(t, err)
		require.Equal(t, runqueue.Stats{Ready: 1, InFlight: 1, Dead: 1}, s)
		dead, err := ro.DeadLetters(b.ctx, "e", "q", 0, 10)
		require.NoError(t, err)
		require.Len(t, dead, 1)
		_, err = ro.Schedule(b.ctx, "e", "q", 1)
		require.NoError(t, err)
		_, err = ro.Preview(b.ctx, "e", "q", 1)
		require.NoError(t, err)

		enq := runqueue.EnqueueParams{Env: "e", Queue: "q", Key: "k", ID: "new"}
		writes := map[string]func() error{
			"Enqueue": func() error { _, err := ro.Enqueue(b.ctx, enq); return err },
			"EnqueueMany": func() error {
				res, err := ro.EnqueueMany(b.ctx, []runqueue.EnqueueParams{enq})
				if err != nil {
					return err
				}
				return res[0].Err
			},
			"Dequeue":      func() error { _, err := ro.Dequeue(b.ctx, "e", "q", 1); return err },
			"DequeueShard": func() error { _, err := ro.DequeueShard(b.ctx, ro.ShardOf("e"), 1); return err },
			"DequeueWait": func() error {
				_, err := ro.DequeueWait(b.ctx, "e", "q", 1, 10*time.Millisecond)
				return err
			},
			"Ack":         func() error { return ro.Ack(b.ctx, held) },
			"Nack":        func() error { _, err := ro.Nack(b.ctx, held, nil); return err },
			"ExtendLease": func() error { return ro.ExtendLease(b.ctx, held, time.Minute) },
			"Redrive":     func() error { return ro.Redrive(b.ctx, "e", "q", "k", dead[0].ID) },
			"SetWeight":   func() error { return ro.SetWeight(b.ctx, "e", "q", "k", 2) },
			"ClearWeight": func() error { return ro.ClearWeight(b.ctx, "e", "q", "k") },
			"RecoverLeases": func() error {
				b.clock.Advance(time.Hour) // the lease has run out: recovery would write
				defer b.clock.Advance(-time.Hour)
				_, err := ro.RecoverLeases(b.ctx, ro.ShardOf("e"), 10)
				return err
			},
		}
		writes["ExpireTTL"] = func() error {
			b.clock.Advance(time.Hour) // the TTL has passed: expiry would write
			defer b.clock.Advance(-time.Hour)
			_, err := ro.ExpireTTL(b.ctx, ro.ShardOf("e"), 10)
			return err
		}
		for name, write := range writes {
			require.ErrorIs(t, write(), runqueue.ErrReadOnly, name)
		}
		require.Equal(t, before, b.dump(t))
	})
}

// TestReadOnlyOtherLayout: a read-only New still refuses a prefix that
// holds another layout version.
func TestReadOnlyOtherLayout(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, nil)
		space, err := keys.NewSpace(b.prefix, b.q.Shards())
		require.NoError(t, err)
		require.NoError(t, c.Set(b.ctx, space.Layout(), "2", 0).Err())
		_, err = runqueue.New(b.ctx, c, &runqueue.Config{Prefix: b.prefix, ReadOnly: true})
		var le *runqueue.LayoutError
		require.ErrorAs(t, err, &le)
		require.Equal(t, "2", le.Found)
	})
}

// TestReadOnlyRefusesWritesWithNothingToDo: a read-only Queue refuses
// every write with ErrReadOnly even where the call would find nothing to
// write (an empty shard to serve or sweep, a run that is not there), as
// Dequeue does on an empty queue; a blocking shard dequeue refuses at once
// rather than waiting out its timeout. Both flags.
func TestReadOnlyRefusesWritesWithNothingToDo(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		for _, flag := range []bool{false, true} {
			b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = flag })
			ro, err := runqueue.New(b.ctx, c, &runqueue.Config{Prefix: b.prefix, Clock: b.clock,
				VtimeScheduling: flag, ReadOnly: true})
			require.NoError(t, err)
			t.Cleanup(func() { _ = ro.Close() })
			before := b.dump(t)
			sh := ro.ShardOf("e")
			writes := map[string]func() error{
				"Enqueue": func() error {
					_, err := ro.Enqueue(b.ctx, runqueue.EnqueueParams{Env: "e", Queue: "q", ID: "1"})
					return err
				},
				"Dequeue":      func() error { _, err := ro.Dequeue(b.ctx, "e", "q", 1); return err },
				"DequeueShard": func() error { _, err := ro.DequeueShard(b.ctx, sh, 1); return err },
				"DequeueWait":  func() error { _, err := ro.DequeueWait(b.ctx, "e", "q", 1, time.Minute); return err },
				"DequeueShardWait": func() error {
					_, err := ro.DequeueShardWait(b.ctx, sh, 1, time.Minute)
					return err
				},
				"AckAndDequeue": func() error { _, _, err := ro.AckAndDequeue(b.ctx, nil, "e", "q", 1); return err },
				"RecoverLeases": func() error { _, err := ro.RecoverLeases(b.ctx, sh, 10); return err },
				"ExpireTTL":     func() error { _, err := ro.ExpireTTL(b.ctx, sh, 10); return err },
				"Redrive":       func() error { return ro.Redrive(b.ctx, "e", "q", "", "none") },
				"DeleteDeadLetter": func() error {
					return ro.DeleteDeadLetter(b.ctx, "e", "q", "", "none")
				},
				"PurgeDeadLetters": func() error {
					_, err := ro.PurgeDeadLetters(b.ctx, "e", "q", b.clock.Now(), 10)
					return err
				},
				"SetWeight":   func() error { return ro.SetWeight(b.ctx, "e", "q", "k", 2) },
				"ClearWeight": func() error { return ro.ClearWeight(b.ctx, "e", "q", "k") },
			}
			for name, write := range writes {
				require.ErrorIs(t, write(), runqueue.ErrReadOnly, "flag %v: %s", flag, name)
			}
			require.Equal(t, before, b.dump(t))
		}
	})
}
