package cli_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/cli"
	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

// deadCounts is the dead count of prod/builds and of prod.
func deadCounts(t testing.TB, b *bundle) [2]int64 {
	t.Helper()
	qs, err := b.q.QueueStats(b.ctx, "prod", "builds")
	require.NoError(t, err)
	es, err := b.q.EnvStats(b.ctx, "prod")
	require.NoError(t, err)
	return [2]int64{qs.Dead, es.Dead}
}

// TestDeadDelete: a dead run is deleted for good and its id is free; a
// second delete, a live run or the wrong key is "no dead-lettered run"
// (exit 1) and changes nothing.
func TestDeadDelete(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := demo(t, c)
		require.Equal(t, "deleted dead-lettered run b-202 (key globex) of queue builds in env prod\n",
			b.run(t, "dead", "delete", "prod", "builds", "b-202", "-key", "globex").ok(t))
		require.Equal(t, [2]int64{1, 1}, deadCounts(t, b))
		_, err := b.q.DeadLetter(b.ctx, "prod", "builds", "globex", "b-202")
		require.ErrorIs(t, err, runqueue.ErrNotFound)

		for _, tc := range []struct {
			args   []string
			stderr string
		}{
			{[]string{"-key", "globex", "prod", "builds", "b-202"}, `runqueue dead delete: no dead-lettered run "b-202" (key "globex") ` +
				`in queue "builds" of env "prod"` + "\n"},
			{[]string{"prod", "builds", "b-401"}, `runqueue dead delete: no dead-lettered run "b-401" (no concurrency key; ` +
				`pass -key KEY for a run that has one) in queue "builds" of env "prod"` + "\n"},
			{[]string{"-key", "acme", "prod", "builds", "b-102"}, `runqueue dead delete: no dead-lettered run "b-102" (key "acme")`},
		} {
			r := b.run(t, append([]string{"dead", "delete"}, tc.args...)...)
			require.Equal(t, cli.ExitFailure, r.code, tc.args)
			require.Empty(t, r.stdout)
			require.Contains(t, r.stderr, tc.stderr)
		}
		require.Equal(t, [2]int64{1, 1}, deadCounts(t, b))
		st, err := b.q.KeyStats(b.ctx, "prod", "builds", "acme")
		require.NoError(t, err)
		require.EqualValues(t, 1, st.Ready, "the live run is left as it was")

		type deleteJSON struct {
			Env     string `json:"env"`
			Queue   string `json:"queue"`
			Key     string `json:"key"`
			ID      string `json:"id"`
			Deleted bool   `json:"deleted"`
		}
		require.Equal(t, deleteJSON{"prod", "builds", "umbrella", "b-401", true},
			decode[deleteJSON](t, b.run(t, "dead", "delete", "-json", "-key", "umbrella", "prod", "builds", "b-401").ok(t)))
		require.Equal(t, [2]int64{0, 0}, deadCounts(t, b))

		// The ids are free again.
		ok, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: "prod", Queue: "builds", Key: "other", ID: "b-202"})
		require.NoError(t, err)
		require.True(t, ok)
	})
}

// TestDeadPurge: the dead runs that died by -before go, oldest first, at
// most -limit a call; run again it deletes what is left, and 0 is not an
// error.
func TestDeadPurge(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := demo(t, c) // two runs died at epoch, 2023-11-14T22:13:20Z
		require.Equal(t, "deleted 0 dead-lettered run(s) of queue builds in env prod that died at or before "+
			"2023-11-14T22:13:19.999Z; 2 left\n",
			b.run(t, "dead", "purge", "-before", "2023-11-14T22:13:19.999Z", "prod", "builds").ok(t))
		require.Equal(t, lines(
			"deleted 1 dead-lettered run(s) of queue builds in env prod that died at or before 2023-11-14T22:13:20.000Z; 1 left",
			"-limit reached: more runs that died by then may be left; run it again",
		), b.run(t, "dead", "purge", "-limit", "1", "-before", "2023-11-14T23:13:20+01:00", "prod", "builds").ok(t))
		dead, err := b.q.DeadLetters(b.ctx, "prod", "builds", 0, 10)
		require.NoError(t, err)
		require.Len(t, dead, 1)
		require.Equal(t, "b-401", dead[0].ID, "the first in DeadLetters' order went")

		type purgeJSON struct {
			Env        string    `json:"env"`
			Queue      string    `json:"queue"`
			DiedBefore time.Time `json:"died_before"`
			Limit      int       `json:"limit"`
			Deleted    int       `json:"deleted"`
			Left       int64     `json:"left"`
		}
		start := time.Now()
		got := decode[purgeJSON](t, b.run(t, "dead", "purge", "-json", "-before", "720h", "prod", "builds").ok(t))
		require.WithinRange(t, got.DiedBefore, start.Add(-720*time.Hour-time.Second), time.Now().Add(-720*time.Hour))
		got.DiedBefore = time.Time{}
		require.Equal(t, purgeJSON{Env: "prod", Queue: "builds", Limit: 1000, Deleted: 1}, got)
		require.Equal(t, [2]int64{0, 0}, deadCounts(t, b))

		// Again, and on a queue with none: nothing to delete, not an error.
		require.Contains(t, b.run(t, "dead", "purge", "-before", "0s", "prod", "builds").ok(t), "deleted 0 ")
		require.Contains(t, b.run(t, "dead", "purge", "-before", "0s", "prod", "none").ok(t), "deleted 0 ")
		st, err := b.q.QueueStats(b.ctx, "prod", "builds")
		require.NoError(t, err)
		require.Equal(t, []int64{1, 1, 1}, []int64{st.Ready, st.Delayed, st.InFlight}, "live runs are left")
	})
}

// TestDeadPurgeBadInput: a missing or bad -before or -limit exits 2 with
// nothing on stdout and nothing deleted.
func TestDeadPurgeBadInput(t *testing.T) {
	t.Parallel()
	b := demo(t, redistest.Mini(t))
	for _, tc := range []struct {
		args   []string
		stderr string
	}{
		{[]string{"prod", "builds"}, "runqueue dead purge: -before is required"},
		{[]string{"-before", "soon", "prod", "builds"}, `invalid value "soon" for flag -before: want a duration back from now`},
		{[]string{"-before", "-1h", "prod", "builds"}, `invalid value "-1h" for flag -before: a negative duration`},
		{[]string{"-before", "2024-05-01", "prod", "builds"}, `invalid value "2024-05-01" for flag -before`},
		{[]string{"-before", "0001-01-01T00:00:00Z", "prod", "builds"}, "runqueue dead purge: invalid diedBefore"},
		{[]string{"-before", "1h", "-limit", "0", "prod", "builds"}, "runqueue dead purge: invalid limit: 0 is outside 1..10000"},
		{[]string{"-before", "1h", "-limit", "10001", "prod", "builds"}, "invalid limit"},
		{[]string{"-before", "1h", "prod", ""}, "runqueue dead purge: invalid queue"},
		{[]string{"-before", "1h", "prod"}, "runqueue dead purge: want ENV QUEUE, got 1 argument(s)"},
	} {
		r := b.run(t, append([]string{"dead", "purge"}, tc.args...)...)
		require.Equal(t, cli.ExitUsage, r.code, "%q: %s", tc.args, r.stderr)
		require.Contains(t, r.stderr, tc.stderr)
		require.Empty(t, r.stdout)
	}
	for _, args := range [][]string{
		{"prod", "builds"},
		{"-key", " g", "prod", "builds", "b-202"},
		{"prod", "builds", ""},
	} {
		r := b.run(t, append([]string{"dead", "delete"}, args...)...)
		require.Equal(t, cli.ExitUsage, r.code, "%q: %s", args, r.stderr)
		require.Empty(t, r.stdout)
	}
	require.Equal(t, [2]int64{2, 2}, deadCounts(t, b))
}
