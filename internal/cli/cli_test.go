package cli_test

import (
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/cli"
	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// TestHelp: help needs no Redis, goes to stdout and exits 0.
func TestHelp(t *testing.T) {
	t.Parallel()
	overview := runCLI(t, "help").ok(t)
	for _, want := range []string{
		"Usage:\n\n  runqueue [flags] COMMAND [ARGS] [flags]",
		"  stats ENV [QUEUE [KEY]]          count the runs",
		"  weight set ENV QUEUE KEY WEIGHT  give a concurrency key a scheduler weight (writes)",
		"  -redis URL",
		"Exit status: 0 done; 1 the command failed",
	} {
		require.Contains(t, overview, want)
	}
	require.Equal(t, overview, runCLI(t, "-h").ok(t))
	require.Equal(t, overview, runCLI(t, "--help").ok(t))

	for cmd, usage := range map[string]string{
		"stats":        "Usage: runqueue stats [flags] ENV [QUEUE [KEY]]",
		"schedule":     "Usage: runqueue schedule [flags] ENV QUEUE",
		"preview":      "Usage: runqueue preview [flags] ENV QUEUE",
		"dead list":    "Usage: runqueue dead list [flags] ENV QUEUE",
		"dead show":    "Usage: runqueue dead show [flags] ENV QUEUE ID",
		"dead delete":  "Usage: runqueue dead delete [flags] ENV QUEUE ID",
		"dead purge":   "Usage: runqueue dead purge [flags] ENV QUEUE",
		"redrive":      "Usage: runqueue redrive [flags] ENV QUEUE ID",
		"weight list":  "Usage: runqueue weight list [flags] ENV QUEUE",
		"weight set":   "Usage: runqueue weight set [flags] ENV QUEUE KEY WEIGHT",
		"weight clear": "Usage: runqueue weight clear [flags] ENV QUEUE KEY",
	} {
		words := strings.Fields(cmd)
		out := runCLI(t, append([]string{"help"}, words...)...).ok(t)
		require.True(t, strings.HasPrefix(out, usage+"\n"), out)
		require.Contains(t, out, "Flags of every command:")
		// -h after the command, with or without arguments, is the same text.
		require.Equal(t, out, runCLI(t, append(words, "-h")...).ok(t), cmd)
		require.Equal(t, out, runCLI(t, append(words, "e", "q", "-help")...).ok(t), cmd)
	}
	require.Contains(t, runCLI(t, "help", "schedule").ok(t), "-key-limit limit")
	require.Contains(t, runCLI(t, "help", "dead", "show").ok(t), "-payload")
	require.Contains(t, runCLI(t, "help", "dead", "delete").ok(t), "-key key")
	require.Contains(t, runCLI(t, "help", "dead", "purge").ok(t), "-before DURATION|TIME")
}

// TestBadInput: every kind of bad input exits 2 with a message on stderr
// and nothing on stdout. Inputs that only runqueue can judge (names, the
// ranges of its arguments) reach a Redis first.
func TestBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, redistest.Mini(t), false, nil)
	_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: "e", Queue: "q", Key: "k", ID: "1"})
	require.NoError(t, err)
	cases := []struct {
		name   string
		args   []string
		stderr string
	}{
		{"NoCommand", nil, "runqueue: no command\nRun 'runqueue help' for usage."},
		{"UnknownCommand", []string{"frob"}, `runqueue: unknown command "frob"`},
		{"UnknownHelp", []string{"help", "frob"}, `runqueue help: unknown command "frob"`},
		// The hint names plain help ("runqueue help help" would fail the same way).
		{"HelpOfGroup", []string{"help", "dead"}, "runqueue help: dead needs a subcommand: list, show, delete, purge\n" +
			"Run 'runqueue help' for usage."},
		{"GroupAlone", []string{"dead"}, "runqueue: dead needs a subcommand: list, show, delete, purge"},
		{"UnknownSub", []string{"weight", "get"}, `runqueue: unknown subcommand "get" of weight (want list, set, clear)`},
		{"UnknownFlag", []string{"stats", "-bogus", "e"}, "runqueue stats: flag provided but not defined: -bogus\n" +
			"Run 'runqueue help stats' for usage."},
		{"MissingArgs", []string{"stats"}, "runqueue stats: want ENV [QUEUE [KEY]], got 0 argument(s)"},
		{"ExtraArgs", []string{"schedule", "e", "q", "x"}, "runqueue schedule: want ENV QUEUE, got 3 argument(s)"},
		{"MissingID", []string{"dead", "show", "e", "q"}, "runqueue dead show: want ENV QUEUE ID, got 2 argument(s)"},
		{"MissingWeight", []string{"weight", "set", "e", "q", "k"}, "runqueue weight set: want ENV QUEUE KEY WEIGHT"},
		{"NotANumber", []string{"preview", "-n", "ten", "e", "q"}, `runqueue preview: invalid value "ten" for flag -n: parse error`},
		{"NotAWeight", []string{"weight", "set", "e", "q", "k", "heavy"}, `runqueue weight set: invalid weight "heavy": not a number`},
		{"NegativeLimit", []string{"schedule", "-key-limit", "-1", "e", "q"}, "-key-limit must not be negative"},
		{"BadShards", []string{"-shards", "0", "stats", "e"}, "runqueue stats: shards 0 must be in 1..16384"},
		{"BadPrefix", []string{"stats", "-prefix", "a b", "e"}, `runqueue stats: prefix "a b" must be 1-64 bytes`},
		{"BadTimeout", []string{"stats", "-timeout", "0s", "e"}, "-dial-timeout and -timeout must be positive"},
		{"BadScheme", []string{"stats", "-redis", "http://localhost:6379", "e"}, `unsupported scheme "http"`},
		{"EmptyAddress", []string{"stats", "-redis", "127.0.0.1:1,,127.0.0.1:2", "e"}, "-redis: empty address"},
		// Judged by runqueue, with its typed errors (errors.Is ErrInvalid).
		{"EmptyEnv", []string{"stats", ""}, "runqueue stats: invalid env: must not be empty"},
		{"SpacedQueue", []string{"stats", "e", " q"}, "runqueue stats: invalid queue: has leading or trailing whitespace"},
		{"ControlKey", []string{"stats", "e", "q", "k\x01"}, "runqueue stats: invalid key: contains control character U+0001"},
		{"DotKey", []string{"weight", "set", "e", "q", "..", "2"}, `runqueue weight set: invalid key: must not be ".."`},
		{"LongID", []string{"dead", "show", "e", "q", strings.Repeat("x", 257)}, "invalid id: is 257 bytes, at most 256 allowed"},
		{"ZeroCount", []string{"preview", "-n", "0", "e", "q"}, "runqueue preview: invalid maxCount"},
		{"HugeCount", []string{"schedule", "-n", "5000", "e", "q"}, "runqueue schedule: invalid maxCount"},
		{"NegativeOffset", []string{"dead", "list", "-offset", "-1", "e", "q"}, "runqueue dead list: invalid offset: must not be negative"},
		{"ZeroLimit", []string{"dead", "list", "-limit", "0", "e", "q"}, "runqueue dead list: invalid limit: 0 is outside 1..10000"},
		{"WeightRange", []string{"weight", "set", "e", "q", "k", "0"}, "runqueue weight set: invalid weight: 0 is outside 0.001..1000"},
		{"WeightNaN", []string{"weight", "set", "e", "q", "k", "NaN"}, "runqueue weight set: invalid weight: NaN is outside"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := b.run(t, tc.args...)
			if tc.args == nil {
				r = runCLI(t)
			}
			require.Equal(t, cli.ExitUsage, r.code, "stderr: %s", r.stderr)
			require.Contains(t, r.stderr, tc.stderr)
			require.Empty(t, r.stdout)
		})
	}
	ws, err := b.q.Weights(b.ctx, "e", "q")
	require.NoError(t, err)
	require.Empty(t, ws)
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// TestUnreachable: a Redis that refuses or does not answer fails the
// command fast, exit 1, with a message that names where it looked.
func TestUnreachable(t *testing.T) {
	t.Parallel()
	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		addr := closedPort(t)
		for _, redisURL := range []string{addr, "redis://" + addr + "/0", "redis://user:secret@" + addr} {
			start := time.Now()
			r := runCLI(t, "-redis", redisURL, "stats", "e")
			require.Less(t, time.Since(start), 3*time.Second)
			require.Equal(t, cli.ExitFailure, r.code)
			require.Empty(t, r.stdout)
			require.Contains(t, r.stderr, "runqueue stats: cannot reach Redis at "+addr+": ")
			require.Contains(t, r.stderr, "connection refused")
			require.NotContains(t, r.stderr, "secret")
		}
	})
	t.Run("Cluster", func(t *testing.T) {
		t.Parallel()
		a, b := closedPort(t), closedPort(t)
		for _, redisURL := range []string{"redis+cluster://" + a + "," + b, a + "," + b} {
			start := time.Now()
			r := runCLI(t, "-redis", redisURL, "weight", "list", "e", "q")
			require.Less(t, time.Since(start), 4*time.Second)
			require.Equal(t, cli.ExitFailure, r.code)
			require.Contains(t, r.stderr, "runqueue weight list: cannot reach Redis at "+a+","+b+": ")
		}
	})
	t.Run("Silent", func(t *testing.T) {
		t.Parallel()
		// A server that accepts and never answers.
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		done := make(chan struct{})
		t.Cleanup(func() { _ = l.Close(); <-done })
		go func() {
			defer close(done)
			var held []net.Conn
			defer func() {
				for _, c := range held {
					_ = c.Close()
				}
			}()
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				held = append(held, c)
			}
		}()
		start := time.Now()
		r := runCLI(t, "-redis", l.Addr().String(), "-dial-timeout", "200ms", "stats", "e")
		require.Less(t, time.Since(start), 3*time.Second)
		require.Equal(t, cli.ExitFailure, r.code)
		require.Contains(t, r.stderr, "runqueue stats: cannot reach Redis at "+l.Addr().String()+": no answer within 1.")

		// -timeout bounds the whole command, the reachability check included.
		start = time.Now()
		r = runCLI(t, "-redis", l.Addr().String(), "-timeout", "300ms", "stats", "e")
		require.Less(t, time.Since(start), 2*time.Second)
		require.Equal(t, cli.ExitFailure, r.code)
		require.Contains(t, r.stderr, "runqueue stats: cannot reach Redis at "+l.Addr().String()+": no answer within ")
	})
}

// TestFlagsAnywhere: flags go before the command, between or after its
// arguments, and "--" ends them.
func TestFlagsAnywhere(t *testing.T) {
	t.Parallel()
	b := setup(t, redistest.Mini(t), false, nil)
	_, err := b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: "e", Queue: "-q", ID: "1"})
	require.NoError(t, err)
	want := maskAges(b.run(t, "-json=false", "stats", "e", "--", "-q").ok(t))
	require.Contains(t, want, "ready         1")
	for _, args := range [][]string{
		{"stats", "-json=false", "e", "--", "-q"},
		{"stats", "e", "-json=false", "--", "-q"},
		{"stats", "--json=false", "e", "--", "-q"},
	} {
		require.Equal(t, want, maskAges(b.run(t, args...).ok(t)), args)
	}
	require.Contains(t, b.run(t, "stats", "e", "-json", "--", "-q").ok(t), `"ready": 1`)
	r := b.run(t, "stats", "e", "-q")
	require.Equal(t, cli.ExitUsage, r.code, "without --, -q is a flag")
}

// TestEnvironment: REDIS_URL and the deployment's RUNQUEUE_* variables
// are the defaults; flags win over them. (t.Setenv: not parallel.)
func TestEnvironment(t *testing.T) {
	c := redistest.Mini(t)
	b := setup(t, c, false, func(cfg *runqueue.Config) { cfg.Shards = 4 })
	// An env whose shard differs between 4 and 16 shards.
	s4, err := keys.NewSpace(b.prefix, 4)
	require.NoError(t, err)
	s16, err := keys.NewSpace(b.prefix, 16)
	require.NoError(t, err)
	env := "e"
	for s4.ShardOf(env) == s16.ShardOf(env) {
		env += "e"
	}
	_, err = b.q.Enqueue(b.ctx, runqueue.EnqueueParams{Env: env, Queue: "q", ID: "1"})
	require.NoError(t, err)
	t.Setenv("REDIS_URL", b.url)
	t.Setenv("RUNQUEUE_PREFIX", b.prefix)
	t.Setenv("RUNQUEUE_SHARDS", "4")
	require.Contains(t, runCLI(t, "stats", env, "q").ok(t), "ready         1")
	// With the deployment's shard count wrong, its env is looked for in
	// another shard.
	require.Contains(t, runCLI(t, "-shards", "16", "stats", env, "q").ok(t), "ready         0")

	t.Setenv("RUNQUEUE_SHARDS", "many")
	r := runCLI(t, "stats", "e", "q")
	require.Equal(t, cli.ExitUsage, r.code)
	require.Contains(t, r.stderr, "runqueue: environment: invalid RUNQUEUE_SHARDS")

	// Help shows the environment's defaults, with the password hidden.
	t.Setenv("RUNQUEUE_SHARDS", "4")
	t.Setenv("REDIS_URL", "redis://user:secret@127.0.0.1:1/0")
	out := runCLI(t, "help").ok(t)
	require.Contains(t, out, `(default "redis://user:xxxxx@127.0.0.1:1/0")`)
	require.NotContains(t, out, "secret")
	require.Contains(t, out, "(default "+strconv.Quote(b.prefix)+")")
}
