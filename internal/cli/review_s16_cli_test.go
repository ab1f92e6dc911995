package cli_test

// Review s16: an adversarial user's probes of the command line: odd input
// gives a clear error, a non-zero exit and nothing on stdout; commands
// that write are safe to run again.

import (
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/cli"
	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/runqueue"
)

func TestS16CLIOddInput(t *testing.T) {
	t.Parallel()
	b := setup(t, redistest.Mini(t), false, nil)
	_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: "e", Queue: "q", Key: "k", ID: "1"})
	require.NoError(t, err)
	before := s16Keys(t, b)
	cases := []struct {
		name   string
		code   int
		args   []string
		stderr string
	}{
		{"InfWeight", cli.ExitUsage, []string{"weight", "set", "e", "q", "k", "Inf"}, "invalid weight"},
		{"OverflowWeight", cli.ExitUsage, []string{"weight", "set", "e", "q", "k", "1e400"}, "invalid weight"},
		{"NegativeWeight", cli.ExitUsage, []string{"weight", "set", "e", "q", "k", "-2"}, "-2"},
		{"NegativeWeightAfterDashes", cli.ExitUsage, []string{"weight", "set", "--", "e", "q", "k", "-2"}, "invalid weight"},
		{"TinyTimeout", cli.ExitFailure, []string{"stats", "-timeout", "1ns", "e"}, "runqueue stats:"},
		{"TinyTimeoutWrite", cli.ExitFailure, []string{"weight", "set", "-timeout", "1ns", "e", "q", "k", "2"}, "runqueue weight set:"},
		{"NegativeShards", cli.ExitUsage, []string{"-shards", "-3", "stats", "e"}, "shards"},
		{"HugeShards", cli.ExitUsage, []string{"-shards", "99999999", "stats", "e"}, "shards"},
		{"BadDuration", cli.ExitUsage, []string{"stats", "-timeout", "soon", "e"}, "invalid value"},
		{"FlagNeedsValue", cli.ExitUsage, []string{"dead", "list", "e", "q", "-limit"}, "flag needs an argument"},
		{"BoolFlagValue", cli.ExitUsage, []string{"stats", "-json=maybe", "e"}, "invalid boolean value"},
		{"HugeLimit", cli.ExitUsage, []string{"dead", "list", "-limit", "10001", "e", "q"}, "invalid limit"},
		{"IntOverflow", cli.ExitUsage, []string{"dead", "list", "-offset", "99999999999999999999", "e", "q"}, "value out of range"},
		{"NULEnv", cli.ExitUsage, []string{"redrive", "e\x00", "q", "1"}, "invalid env"},
		{"EmptyQueueRedrive", cli.ExitUsage, []string{"redrive", "e", "", "1"}, "invalid queue"},
		{"EmptyIDRedrive", cli.ExitUsage, []string{"redrive", "e", "q", ""}, "invalid id"},
		{"RedriveNotDead", cli.ExitFailure, []string{"redrive", "-key", "k", "e", "q", "nope"}, "no dead-lettered run"},
		{"RedisURLGarbage", cli.ExitUsage, []string{"stats", "-redis", "redis://[::1", "e"}, "-redis"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := b.run(t, tc.args...)
			require.Equal(t, tc.code, r.code, "stderr: %s", r.stderr)
			require.Contains(t, r.stderr, tc.stderr)
			require.Empty(t, r.stdout)
		})
	}
	t.Cleanup(func() {
		require.Equal(t, before, s16Keys(t, b), "no bad command wrote anything")
	})
}

// s16Keys lists the keys under the bundle's prefix.
func s16Keys(t testing.TB, b *bundle) []string {
	t.Helper()
	ks, err := b.client.Keys(b.ctx, b.prefix+"*").Result()
	require.NoError(t, err)
	sort.Strings(ks)
	return ks
}

// Every command that writes, run twice, ends where one run does and
// succeeds both times.
func TestS16CLIWritesRetrySafe(t *testing.T) {
	t.Parallel()
	b := demo(t, redistest.Mini(t))
	for range 2 {
		b.run(t, "weight", "set", "prod", "builds", "acme", "3").ok(t)
	}
	ws, err := b.q.Weights(b.ctx, "prod", "builds")
	require.NoError(t, err)
	require.Equal(t, map[string]float64{"acme": 3, "globex": 2}, ws)
	for range 2 {
		b.run(t, "weight", "clear", "prod", "builds", "acme").ok(t)
	}
	b.run(t, "weight", "clear", "prod", "builds", "never-set").ok(t)
	ws, err = b.q.Weights(b.ctx, "prod", "builds")
	require.NoError(t, err)
	require.Equal(t, map[string]float64{"globex": 2}, ws)

	st0, err := b.q.QueueStats(b.ctx, "prod", "builds")
	require.NoError(t, err)
	b.run(t, "redrive", "-key", "umbrella", "prod", "builds", "b-401").ok(t)
	st1, err := b.q.QueueStats(b.ctx, "prod", "builds")
	require.NoError(t, err)
	b.run(t, "redrive", "-key", "umbrella", "prod", "builds", "b-401").ok(t)
	st2, err := b.q.QueueStats(b.ctx, "prod", "builds")
	require.NoError(t, err)
	require.Equal(t, st0.Dead-1, st1.Dead)
	require.Equal(t, st0.Ready+1, st1.Ready)
	require.Equal(t, st1, st2, "a second redrive changes nothing")

	// The wrong key: not found, exit 1, nothing changed.
	r := b.run(t, "redrive", "-key", "acme", "prod", "builds", "b-202")
	require.Equal(t, cli.ExitFailure, r.code, r.stderr)
	require.Contains(t, r.stderr, `no dead-lettered run "b-202" (key "acme")`)
	st3, err := b.q.QueueStats(b.ctx, "prod", "builds")
	require.NoError(t, err)
	require.Equal(t, st2, st3)
}
