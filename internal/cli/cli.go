// Package cli is the runqueue command line (cmd/runqueue): [Run] parses the
// arguments, connects to Redis and runs one operator command, writing a
// table or JSON.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// Exit codes.
const (
	ExitOK      = 0
	ExitFailure = 1 // the command could not be carried out: Redis unreachable, no such run, ...
	ExitUsage   = 2 // bad input: unknown command, missing or extra arguments, an invalid number or name
)

// usageError is bad input caught before or by runqueue's checks.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// globals are the flags every command takes: where Redis is and how the
// deployment is configured.
type globals struct {
	redis       string
	prefix      string
	shards      int
	vtime       bool
	json        bool
	dialTimeout time.Duration
	timeout     time.Duration
	// env is the Config the environment gives (ConfigFromEnv): each
	// command starts from a copy, so that what no flag sets (Quantum, the
	// unit of schedule's tags and lags; StateTTL; LeaseDuration; the depth
	// limits) is the deployment's too.
	env runqueue.Config
}

// defaults starts from the environment runqueue.ConfigFromEnv reads, so
// that the command run beside a deployment sees its Config.
func defaults() (globals, error) {
	cfg, err := runqueue.ConfigFromEnv()
	if err != nil {
		return globals{}, err
	}
	d := cfg.WithDefaults()
	g := globals{redis: defaultRedis, prefix: d.Prefix, shards: d.Shards, vtime: d.VtimeScheduling,
		dialTimeout: 2 * time.Second, timeout: 30 * time.Second, env: *cfg}
	if u := os.Getenv("REDIS_URL"); u != "" {
		g.redis = u
	}
	return g, nil
}

func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.redis, "redis", g.redis, "Redis `URL`: redis://, rediss://, unix://, redis+cluster://host:port,...\n"+
		"or host:port[,host:port...] (several addresses: Redis Cluster); env REDIS_URL")
	fs.StringVar(&g.prefix, "prefix", g.prefix, "the deployment's key `prefix` (Config.Prefix); env RUNQUEUE_PREFIX")
	fs.IntVar(&g.shards, "shards", g.shards, "the deployment's shard `count` (Config.Shards); env RUNQUEUE_SHARDS")
	fs.BoolVar(&g.vtime, "vtime", g.vtime, "the deployment runs the fair scheduler (Config.VtimeScheduling);\n"+
		"env CK_VTIME_SCHEDULING_ENABLED")
	fs.BoolVar(&g.json, "json", g.json, "write JSON instead of a table")
	fs.DurationVar(&g.dialTimeout, "dial-timeout", g.dialTimeout, "give up on an unreachable Redis after this long")
	fs.DurationVar(&g.timeout, "timeout", g.timeout, "give up on the whole command after this long")
}

// Run runs one command line (args without the program name), writing
// results to stdout and errors to stderr, and returns the exit code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	name, err := run(ctx, args, stdout, stderr)
	return report(stderr, name, err)
}

// report prints err (if any) and maps it to an exit code.
func report(stderr io.Writer, name string, err error) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return ExitOK
	}
	prog := "runqueue"
	if name != "" {
		prog += " " + name
	}
	msg := strings.TrimPrefix(err.Error(), "runqueue: ")
	var ue *usageError
	switch {
	case errors.As(err, &ue):
		hint := "runqueue help"
		if name != "" && name != "help" {
			hint += " " + name
		}
		fmt.Fprintf(stderr, "%s: %s\nRun '%s' for usage.\n", prog, msg, hint)
		return ExitUsage
	case errors.Is(err, runqueue.ErrInvalid):
		fmt.Fprintf(stderr, "%s: %s\n", prog, msg)
		return ExitUsage
	}
	fmt.Fprintf(stderr, "%s: %s\n", prog, msg)
	return ExitFailure
}

// run parses args and runs the command; it returns the command's name for
// messages.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) (string, error) {
	g, err := defaults()
	if err != nil {
		return "", usagef("environment: %v", strings.TrimPrefix(err.Error(), "runqueue: "))
	}
	top := newFlagSet("runqueue")
	g.register(top)
	if err := top.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			writeOverview(stdout)
			return "", err
		}
		return "", usagef("%v", err)
	}
	args = top.Args()
	if len(args) == 0 {
		return "", usagef("no command")
	}
	if args[0] == "help" {
		return "help", help(stdout, args[1:])
	}
	cmd, rest, err := lookup(args)
	if err != nil {
		return "", err
	}
	fs := newFlagSet("runqueue " + cmd.name)
	g.register(fs)
	cfg := &runqueue.Config{}
	*cfg = g.env
	exec := cmd.setup(fs, cfg)
	pos, err := parseInterleaved(fs, rest)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			writeHelp(stdout, cmd)
			return cmd.name, err
		}
		return cmd.name, usagef("%v", err)
	}
	if len(pos) < cmd.minArgs || len(pos) > cmd.maxArgs {
		return cmd.name, usagef("want %s, got %d argument(s)", cmd.args, len(pos))
	}
	return cmd.name, connectAndRun(ctx, &g, cfg, cmd, exec, pos, stdout, stderr)
}

// connectAndRun checks the configuration, connects, opens the Queue
// (read-only unless the command writes) and runs the command.
func connectAndRun(ctx context.Context, g *globals, cfg *runqueue.Config, cmd *command, exec runFunc, pos []string, stdout, stderr io.Writer) error {
	space, err := keys.NewSpace(g.prefix, g.shards)
	if err != nil {
		return usagef("%s", strings.TrimPrefix(err.Error(), "keys: "))
	}
	if g.dialTimeout <= 0 || g.timeout <= 0 {
		return usagef("-dial-timeout and -timeout must be positive")
	}
	if cfg.EnvConcurrency < 0 || cfg.QueueConcurrency < 0 || cfg.KeyConcurrency < 0 {
		return usagef("-env-limit, -queue-limit and -key-limit must not be negative")
	}
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	ep, err := dial(g.redis, g.dialTimeout)
	if err != nil {
		return err
	}
	defer ep.client.Close()
	if err := ping(ctx, ep, g.dialTimeout); err != nil {
		return err
	}
	// The layout version is what New records; without one nothing of a
	// deployment is under this prefix, which is most often a wrong -prefix.
	layout, err := ep.client.Get(ctx, space.Layout()).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	if layout == "" {
		if cmd.write {
			return fmt.Errorf("no runqueue deployment under prefix %q (no layout version at %s): check -prefix; "+
				"nothing was written", g.prefix, space.Layout())
		}
		fmt.Fprintf(stderr, "runqueue %s: note: nothing under prefix %q (no layout version at %s): check -prefix\n",
			cmd.name, g.prefix, space.Layout())
	}
	cfg.Prefix, cfg.Shards, cfg.VtimeScheduling = g.prefix, g.shards, g.vtime
	if !cmd.write {
		// Reading changes nothing, so an evicting Redis is no reason to
		// refuse; the deployment's own New guards its writes.
		cfg.ReadOnly, cfg.AllowEviction = true, true
	}
	q, err := runqueue.New(ctx, ep.client, cfg)
	if err != nil {
		return err
	}
	defer q.Close()
	err = exec(ctx, q, &output{w: stdout, json: g.json, vtime: g.vtime}, pos)
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("gave up after -timeout %v: %w", g.timeout, err)
	}
	return err
}

func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // usage is ours; errors are returned
	return fs
}

// parseInterleaved parses flags before, between and after positional
// arguments; after "--" everything is positional.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}
