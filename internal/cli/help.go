package cli

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/runqueue/runqueue/runqueue"
)

const overview = `runqueue inspects and operates the run queues of a runqueue deployment on
Redis: run counts, the fair scheduler's view, dead letters, weights and
repairs.

Usage:

  runqueue [flags] COMMAND [ARGS] [flags]

Commands:

`

const footer = `
Only dead delete, dead purge, redrive, repair, weight set and weight clear
write to Redis, and only under a prefix that holds a deployment. Every other
command opens the queues read-only: it writes no key, records no layout
version and loads no script.

Flags may come before or after the command and its arguments; after "--"
everything is an argument (for a name that starts with "-"). Flags default
to the environment the deployment reads (runqueue.ConfigFromEnv), so that a
command run beside it sees the same Config. -shards must be the deployment's
Shards: nothing records it, so another count reads empty queues and writes
where the deployment does not look, without an error.

Exit status: 0 done; 1 the command failed (Redis unreachable, no such run,
another layout version, ...); 2 bad input (unknown command, missing or extra
arguments, an invalid number or name).

Run 'runqueue help COMMAND' for a command's arguments and flags.
`

// help writes the overview, or the help of the command args name.
func help(w io.Writer, args []string) error {
	if len(args) == 0 {
		writeOverview(w)
		return nil
	}
	cmd, rest, err := lookup(args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return usagef("help takes one command, got %q", strings.Join(args, " "))
	}
	writeHelp(w, cmd)
	return nil
}

func writeOverview(w io.Writer) {
	fmt.Fprint(w, overview)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s %s\t%s\n", c.name, c.args, c.summary)
	}
	fmt.Fprintf(tw, "  help [COMMAND]\tshow this help, or a command's\n")
	_ = tw.Flush()
	fmt.Fprint(w, "\nFlags of every command:\n\n")
	printFlags(w, globalFlags())
	fmt.Fprint(w, footer)
}

func writeHelp(w io.Writer, c *command) {
	fmt.Fprintf(w, "Usage: runqueue %s [flags] %s\n\n%s\n", c.name, c.args, c.help)
	own := newFlagSet(c.name)
	c.setup(own, &runqueue.Config{})
	if hasFlags(own) {
		fmt.Fprint(w, "\nFlags:\n\n")
		printFlags(w, own)
	}
	fmt.Fprint(w, "\nFlags of every command:\n\n")
	printFlags(w, globalFlags())
}

// globalFlags is the flag set of globals for help: defaults as the
// environment sets them, with any password in REDIS_URL hidden.
func globalFlags() *flag.FlagSet {
	g, err := defaults()
	if err != nil {
		g = globals{}
	}
	g.redis = redact(g.redis)
	fs := newFlagSet("runqueue")
	g.register(fs)
	return fs
}

func hasFlags(fs *flag.FlagSet) bool {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n > 0
}

func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}
