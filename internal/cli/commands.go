package cli

import (
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/runqueue/runqueue/runqueue"
	"github.com/runqueue/runqueue/vtime"
)

// runFunc runs a command on an open Queue with its positional arguments.
type runFunc func(ctx context.Context, q *runqueue.Queue, out *output, args []string) error

// command is one subcommand.
type command struct {
	name             string // "stats", "dead list"
	args             string // the positional arguments, for usage lines
	minArgs, maxArgs int
	summary          string
	help             string // what the command does, after the usage line
	write            bool   // changes Redis; every other command opens the Queue read-only
	// setup registers the command's own flags (some set cfg fields, which
	// the Queue is opened with) and returns its run function.
	setup func(fs *flag.FlagSet, cfg *runqueue.Config) runFunc
}

// commands in the order help lists them.
var commands = []*command{
	{
		name: "stats", args: "ENV [QUEUE [KEY]]", minArgs: 1, maxArgs: 3,
		summary: "count the runs of an env, a queue or a concurrency key",
		help: `Ready, delayed, in-flight and dead-lettered runs, and the age of the run
first in line (priority counts as age: Stats.OldestReadyAge). With ENV
alone: ready and delayed are the sums over the env's queues that hold
queued runs, in-flight and dead the env's own counts. With KEY: one concurrency key of QUEUE ("" is the runs without a key);
dead runs are counted per queue, not per key.`,
		setup: func(*flag.FlagSet, *runqueue.Config) runFunc { return runStats },
	},
	{
		name: "schedule", args: "ENV QUEUE", minArgs: 2, maxArgs: 2,
		summary: "the fair scheduler's view: tags, lags, weights, why a key waits",
		help: `Every concurrency key of QUEUE as the fair scheduler sees it now: its tag
(next virtual start) and lag (tag minus the queue's clock V, in quanta;
positive: served ahead and waiting, zero or negative: owed service), its
registration order (SEQ, which breaks ties), weight, parked tag, run counts,
and STATUS: "competing", or why it is not served: "idle" (no queued run), "head
in the future" (only delayed runs), "at its limit" (KeyConcurrency reached),
"queue or env at its limit", "awaiting discovery" (ready runs not yet
registered; a dequeue reaches them within a few calls), "waiting in the
newcomer lane" (registered, behind earlier newcomers).
Pass the deployment's limits with -env-limit, -queue-limit and -key-limit:
the reasons depend on them.`,
		setup: func(fs *flag.FlagSet, cfg *runqueue.Config) runFunc {
			n := fs.Int("n", 1, "the dequeue batch size (maxCount) the view assumes")
			limitFlags(fs, cfg)
			return func(ctx context.Context, q *runqueue.Queue, out *output, args []string) error {
				return runSchedule(ctx, q, out, args, *n)
			}
		},
	},
	{
		name: "preview", args: "ENV QUEUE", minArgs: 2, maxArgs: 2,
		summary: "the runs a fair dequeue would serve next, in order",
		help: `The next runs (at most -n) that a fair dequeue of -n would serve now, in
order, computed on a snapshot of the queue without changing it. With the
fair scheduler off (-vtime=false) it shows the order the scheduler would
serve once turned on. Pass the deployment's limits with -env-limit,
-queue-limit and -key-limit: they decide what can be served.`,
		setup: func(fs *flag.FlagSet, cfg *runqueue.Config) runFunc {
			n := fs.Int("n", 10, "how many runs to predict (maxCount of the dequeue)")
			limitFlags(fs, cfg)
			return func(ctx context.Context, q *runqueue.Queue, out *output, args []string) error {
				return runPreview(ctx, q, out, args, *n)
			}
		},
	},
	{
		name: "dead list", args: "ENV QUEUE", minArgs: 2, maxArgs: 2,
		summary: "list dead-lettered runs, oldest death first",
		help: `Dead-lettered runs of QUEUE, oldest death first: when each died, its key,
id, attempt (attempts made + 1, as DeadRun.Attempt), priority and payload
size. Page with -offset and -limit.`,
		setup: func(fs *flag.FlagSet, _ *runqueue.Config) runFunc {
			offset := fs.Int("offset", 0, "skip this many runs")
			limit := fs.Int("limit", 100, "list at most this many runs (1..10000)")
			return func(ctx context.Context, q *runqueue.Queue, out *output, args []string) error {
				return runDeadList(ctx, q, out, args, *offset, *limit)
			}
		},
	},
	{
		name: "dead show", args: "ENV QUEUE ID", minArgs: 3, maxArgs: 3,
		summary: "show one dead-lettered run and its payload",
		help: `One dead-lettered run with its payload: as text when it is printable
UTF-8, else base64 (JSON: "payload" or "payload_base64"). -payload writes the
payload's bytes alone, for a pipe.`,
		setup: func(fs *flag.FlagSet, _ *runqueue.Config) runFunc {
			key := fs.String("key", "", "the run's concurrency `key` (none by default)")
			raw := fs.Bool("payload", false, "write only the payload's bytes")
			return func(ctx context.Context, q *runqueue.Queue, out *output, args []string) error {
				return runDeadShow(ctx, q, out, args, *key, *raw)
			}
		},
	},
	{
		name: "dead delete", args: "ENV QUEUE ID", minArgs: 3, maxArgs: 3, write: true,
		summary: "delete one dead-lettered run for good (writes)",
		help: `Deletes a dead-lettered run for good: its record and payload go, and its id
is free for a new run. A run that is not dead-lettered (live again, or no
such run) is an error and is left as it is; so is a second delete of the
same run. Dead letters are kept until they are redriven or deleted.`,
		setup: func(fs *flag.FlagSet, _ *runqueue.Config) runFunc {
			key := fs.String("key", "", "the run's concurrency `key` (none by default)")
			return func(ctx context.Context, q *runqueue.Queue, out *output, args []string) error {
				return runDeadDelete(ctx, q, out, args, *key)
			}
		},
	},
	{
		name: "dead purge", args: "ENV QUEUE", minArgs: 2, maxArgs: 2, write: true,
		summary: "delete the dead-lettered runs that died by -before (writes)",
		help: `Deletes for good the dead-lettered runs of QUEUE that died at or before
-before, oldest death first, at most -limit of them (it reads them, then
deletes them in one atomic call); their ids are free for new runs. -before
is a duration back from now (720h: dead for 30 days or more) or an RFC 3339
time (2024-05-01T00:00:00Z). When it deletes -limit runs, more may be left:
run it again (fewer can also mean that another call took some of the runs
it read meanwhile). Dead letters are
kept until they are redriven or deleted: nothing expires them.`,
		setup: func(fs *flag.FlagSet, _ *runqueue.Config) runFunc {
			var before beforeFlag
			fs.Var(&before, "before", "delete the runs that died at or before `DURATION|TIME`: a duration back\n"+
				"from now (720h) or an RFC 3339 time (required)")
			limit := fs.Int("limit", 1000, "delete at most this many runs (1..10000)")
			return func(ctx context.Context, q *runqueue.Queue, out *output, args []string) error {
				return runDeadPurge(ctx, q, out, args, &before, *limit)
			}
		},
	},
	{
		name: "redrive", args: "ENV QUEUE ID", minArgs: 3, maxArgs: 3, write: true,
		summary: "put a dead-lettered run back in its queue (writes)",
		help: `Puts a dead-lettered run back in its queue, ready now, with its attempts
reset. A run that is already live again (queued or in flight) is left as it
is. Pass -vtime as the deployment runs: the fair scheduler's state is
updated only with it.`,
		setup: func(fs *flag.FlagSet, _ *runqueue.Config) runFunc {
			key := fs.String("key", "", "the run's concurrency `key` (none by default)")
			return func(ctx context.Context, q *runqueue.Queue, out *output, args []string) error {
				return runRedrive(ctx, q, out, args, *key)
			}
		},
	},
	{
		name: "repair", args: "ENV QUEUE", minArgs: 2, maxArgs: 2, write: true,
		summary: "rebuild a queue's lost indexes, counts, TTL entries and leases (writes)",
		help: `Rebuilds what the scripts keep beside QUEUE's runs from the runs themselves,
after such a key was lost (deleted by hand, or evicted under a maxmemory
policy that evicts). Runs whose record is there but that are in no set
(their key's ready or delayed set lost) are queued again as their record
says (a run with a lease is left to lease recovery; one never delivered
whose TTL passed is expired; one past -max-attempts is dead-lettered), or
dead-lettered with -dead-letter-orphans (a dead letter whose entry was lost
is among them: queued again, it runs again; so are runs in flight when the
queue's held runs and their leases were both lost: queued again, they may
run twice). Then the age and delay indexes, the ready
and delayed counts, the queue's entry in its shard's index, its count of
dead runs, the TTL entries of queued runs, the leases of runs in flight (a
deadline -lease from now) and the keys' counts of runs in flight. It writes
only what is missing or wrong, so it is safe beside a running deployment
and safe to run again; a queue with nothing to mend is only read. The
index part is one atomic call over every key of the queue, which Redis
serves alone (6-12 µs a key: 0.2 s at 20,000 keys, a second or more above
100,000). Not rebuilt: runs whose record was lost, the env's in-flight
count and the scheduler's state (a fair dequeue starts it again)
(runqueue.Queue.Repair).`,
		setup: func(fs *flag.FlagSet, cfg *runqueue.Config) runFunc {
			// Keys are lost most often to eviction: repairing on a Redis
			// that evicts is what the command is for.
			cfg.AllowEviction = true
			fs.DurationVar(&cfg.LeaseDuration, "lease", cfg.LeaseDuration,
				"the deadline of a lease it adds, from now (default the deployment's LeaseDuration, 5m unset)")
			fs.IntVar(&cfg.MaxAttempts, "max-attempts", cfg.MaxAttempts,
				"the deployment's MaxAttempts: a run found in no set past it died for its attempts and is\n"+
					"dead-lettered again (default $RUNQUEUE_MAX_ATTEMPTS, else 5)")
			dead := fs.Bool("dead-letter-orphans", false, "dead-letter the runs found in no set instead of queueing them again")
			return func(ctx context.Context, q *runqueue.Queue, out *output, args []string) error {
				return runRepair(ctx, q, out, args, &runqueue.RepairOptions{DeadLetterOrphans: *dead})
			}
		},
	},
	{
		name: "weight list", args: "ENV QUEUE", minArgs: 2, maxArgs: 2,
		summary: "list the weight overrides of a queue",
		help:    `The concurrency keys of QUEUE that have a scheduler weight other than the default 1.`,
		setup:   func(*flag.FlagSet, *runqueue.Config) runFunc { return runWeightList },
	},
	{
		name: "weight set", args: "ENV QUEUE KEY WEIGHT", minArgs: 4, maxArgs: 4, write: true,
		summary: "give a concurrency key a scheduler weight (writes)",
		help: fmt.Sprintf(`Gives KEY a scheduler weight (%v..%v): with the fair scheduler on, a key of
weight w gets w times the share of a key of weight 1 while both have work. It
applies at the next serve, on every instance, and does not expire. The
scheduler holds a weight to the nearest 0.001; one held as 1 (1.0004) clears
the key's override, as weight clear does.`, runqueue.MinWeight, runqueue.MaxWeight),
		setup: func(*flag.FlagSet, *runqueue.Config) runFunc { return runWeightSet },
	},
	{
		name: "weight clear", args: "ENV QUEUE KEY", minArgs: 3, maxArgs: 3, write: true,
		summary: "return a concurrency key to weight 1 (writes)",
		help:    `Removes KEY's weight override: it gets the default weight 1 at the next serve.`,
		setup:   func(*flag.FlagSet, *runqueue.Config) runFunc { return runWeightClear },
	},
}

// limitFlags registers the deployment's concurrency limits, which decide
// what the scheduler can serve.
func limitFlags(fs *flag.FlagSet, cfg *runqueue.Config) {
	fs.IntVar(&cfg.EnvConcurrency, "env-limit", 0, "the deployment's `limit` of runs in flight per env (Config.EnvConcurrency; 0: none)")
	fs.IntVar(&cfg.QueueConcurrency, "queue-limit", 0, "the deployment's `limit` of runs in flight per queue (Config.QueueConcurrency; 0: none)")
	fs.IntVar(&cfg.KeyConcurrency, "key-limit", 0, "the deployment's `limit` of runs in flight per key (Config.KeyConcurrency; 0: none)")
}

// groups are the words that take a subcommand.
func groups() []string {
	var out []string
	for _, c := range commands {
		if g, _, ok := strings.Cut(c.name, " "); ok && !slices.Contains(out, g) {
			out = append(out, g)
		}
	}
	return out
}

// lookup finds the command args start with and returns the rest.
func lookup(args []string) (*command, []string, error) {
	word := args[0]
	if slices.Contains(groups(), word) {
		var subs []string
		for _, c := range commands {
			if g, sub, _ := strings.Cut(c.name, " "); g == word {
				subs = append(subs, sub)
			}
		}
		if len(args) < 2 {
			return nil, nil, usagef("%s needs a subcommand: %s", word, strings.Join(subs, ", "))
		}
		if !slices.Contains(subs, args[1]) {
			return nil, nil, usagef("unknown subcommand %q of %s (want %s)", args[1], word, strings.Join(subs, ", "))
		}
		word += " " + args[1]
		args = args[1:]
	}
	for _, c := range commands {
		if c.name == word {
			return c, args[1:], nil
		}
	}
	return nil, nil, usagef("unknown command %q", word)
}

func runStats(ctx context.Context, q *runqueue.Queue, out *output, args []string) error {
	type statsJSON struct {
		Env              string  `json:"env"`
		Queue            *string `json:"queue,omitempty"`
		Key              *string `json:"key,omitempty"`
		Ready            int64   `json:"ready"`
		Delayed          int64   `json:"delayed"`
		InFlight         int64   `json:"in_flight"`
		Dead             *int64  `json:"dead,omitempty"`
		OldestReadyAgeMS int64   `json:"oldest_ready_age_ms"`
	}
	var s runqueue.Stats
	var err error
	j := statsJSON{Env: args[0]}
	switch len(args) {
	case 1:
		s, err = q.EnvStats(ctx, args[0])
	case 2:
		j.Queue = &args[1]
		s, err = q.QueueStats(ctx, args[0], args[1])
	default:
		j.Queue, j.Key = &args[1], &args[2]
		s, err = q.KeyStats(ctx, args[0], args[1], args[2])
	}
	if err != nil {
		return err
	}
	j.Ready, j.Delayed, j.InFlight, j.OldestReadyAgeMS = s.Ready, s.Delayed, s.InFlight, s.OldestReadyAge.Milliseconds()
	if j.Key == nil {
		j.Dead = &s.Dead
	}
	if out.json {
		return out.writeJSON(j)
	}
	f := []string{"env", name(j.Env)}
	if j.Queue != nil {
		f = append(f, "queue", name(*j.Queue))
	}
	if j.Key != nil {
		f = append(f, "key", name(*j.Key))
	}
	f = append(f, "ready", count(s.Ready), "delayed", count(s.Delayed), "in flight", count(s.InFlight))
	if j.Dead != nil {
		f = append(f, "dead", count(s.Dead))
	}
	f = append(f, "oldest ready", age(s.OldestReadyAge))
	return out.fields(f...)
}

func runSchedule(ctx context.Context, q *runqueue.Queue, out *output, args []string, n int) error {
	s, err := q.Schedule(ctx, args[0], args[1], n)
	if err != nil {
		return err
	}
	type keyJSON struct {
		Key        string   `json:"key"`
		Competing  bool     `json:"competing"`
		Reason     string   `json:"reason"`
		Registered bool     `json:"registered"`
		Tag        *float64 `json:"tag,omitempty"`
		Lag        *float64 `json:"lag,omitempty"`
		Seq        *int64   `json:"seq,omitempty"`
		Gated      bool     `json:"gated"`
		Weight     float64  `json:"weight"`
		Parked     *float64 `json:"parked,omitempty"`
		Ready      int64    `json:"ready"`
		Delayed    int64    `json:"delayed"`
		InFlight   int64    `json:"in_flight"`
	}
	type scheduleJSON struct {
		Env   string    `json:"env"`
		Queue string    `json:"queue"`
		V     float64   `json:"v"`
		Keys  []keyJSON `json:"keys"`
	}
	j := scheduleJSON{Env: args[0], Queue: args[1], V: s.V, Keys: []keyJSON{}}
	for _, k := range s.Keys {
		kj := keyJSON{Key: k.Key, Competing: k.Reason == "", Reason: k.Reason, Registered: k.Registered, Gated: k.Gated,
			Weight: k.Weight, Ready: k.Ready, Delayed: k.Delayed, InFlight: k.InFlight}
		if k.Registered {
			kj.Tag, kj.Lag, kj.Seq = &k.Tag, &k.Lag, &k.Seq
		}
		if k.HasParked {
			kj.Parked = &k.Parked
		}
		j.Keys = append(j.Keys, kj)
	}
	if out.json {
		return out.writeJSON(j)
	}
	if err := out.fields("env", name(j.Env), "queue", name(j.Queue), "V", num(s.V), "keys", strconv.Itoa(len(s.Keys))); err != nil {
		return err
	}
	if !out.vtime {
		fmt.Fprintln(out.w, "note: -vtime is off: such a deployment serves keys in age order and keeps no tags")
	}
	if len(s.Keys) == 0 {
		return nil
	}
	fmt.Fprintln(out.w)
	t := out.table()
	t.row("KEY", "STATUS", "TAG", "LAG", "SEQ", "WEIGHT", "READY", "DELAYED", "IN FLIGHT", "PARKED")
	for _, k := range j.Keys {
		status := k.Reason
		if k.Competing {
			status = "competing"
		}
		tag, lag, seq, parked := "-", "-", "-", "-"
		if k.Registered {
			tag, lag, seq = num(*k.Tag), num(*k.Lag), count(*k.Seq)
		}
		if k.Parked != nil {
			parked = num(*k.Parked)
		}
		t.row(name(k.Key), status, tag, lag, seq, weight(k.Weight), count(k.Ready), count(k.Delayed), count(k.InFlight), parked)
	}
	return t.flush()
}

func runPreview(ctx context.Context, q *runqueue.Queue, out *output, args []string, n int) error {
	runs, err := q.Preview(ctx, args[0], args[1], n)
	if err != nil {
		return err
	}
	type runJSON struct {
		Key     string `json:"key"`
		ID      string `json:"id"`
		Attempt int    `json:"attempt"`
	}
	type previewJSON struct {
		Env   string    `json:"env"`
		Queue string    `json:"queue"`
		Runs  []runJSON `json:"runs"`
	}
	j := previewJSON{Env: args[0], Queue: args[1], Runs: []runJSON{}}
	for _, r := range runs {
		j.Runs = append(j.Runs, runJSON{Key: r.Key, ID: r.ID, Attempt: r.Attempt})
	}
	if out.json {
		return out.writeJSON(j)
	}
	if len(runs) == 0 {
		_, err := fmt.Fprintln(out.w, "no run would be served now")
		return err
	}
	t := out.table()
	t.row("#", "KEY", "ID", "ATTEMPT")
	for i, r := range j.Runs {
		t.row(strconv.Itoa(i+1), name(r.Key), name(r.ID), strconv.Itoa(r.Attempt))
	}
	return t.flush()
}

// deadJSON is a dead-lettered run; the payload only in dead show.
type deadJSON struct {
	Key           string    `json:"key"`
	ID            string    `json:"id"`
	Attempt       int       `json:"attempt"`
	Priority      int       `json:"priority"`
	DiedAt        time.Time `json:"died_at"`
	PayloadBytes  int       `json:"payload_bytes"`
	Payload       *string   `json:"payload,omitempty"`
	PayloadBase64 *string   `json:"payload_base64,omitempty"`
	// Corrupt: the run's stored record does not parse (attempt, priority
	// and payload unknown); absent otherwise.
	Corrupt bool `json:"corrupt,omitempty"`
}

func toDeadJSON(d runqueue.DeadRun) deadJSON {
	return deadJSON{Key: d.Key, ID: d.ID, Attempt: d.Attempt, Priority: d.Priority, DiedAt: d.DiedAt.UTC(),
		PayloadBytes: len(d.Payload), Corrupt: d.Corrupt}
}

// payloadCell is a dead run's PAYLOAD column.
func payloadCell(d deadJSON) string {
	if d.Corrupt {
		return "record does not parse"
	}
	return fmt.Sprintf("%d bytes", d.PayloadBytes)
}

func runDeadList(ctx context.Context, q *runqueue.Queue, out *output, args []string, offset, limit int) error {
	runs, err := q.DeadLetters(ctx, args[0], args[1], offset, limit)
	if err != nil {
		return err
	}
	st, err := q.QueueStats(ctx, args[0], args[1])
	if err != nil {
		return err
	}
	type listJSON struct {
		Env    string     `json:"env"`
		Queue  string     `json:"queue"`
		Total  int64      `json:"total"`
		Offset int        `json:"offset"`
		Runs   []deadJSON `json:"runs"`
	}
	j := listJSON{Env: args[0], Queue: args[1], Total: st.Dead, Offset: offset, Runs: []deadJSON{}}
	for _, d := range runs {
		j.Runs = append(j.Runs, toDeadJSON(d))
	}
	if out.json {
		return out.writeJSON(j)
	}
	if len(runs) == 0 {
		_, err := fmt.Fprintf(out.w, "no dead-lettered runs at offset %d (%d in all)\n", offset, st.Dead)
		return err
	}
	t := out.table()
	t.row("DIED AT", "KEY", "ID", "ATTEMPT", "PRIORITY", "PAYLOAD")
	for _, d := range j.Runs {
		t.row(stamp(d.DiedAt), name(d.Key), name(d.ID), strconv.Itoa(d.Attempt), strconv.Itoa(d.Priority),
			payloadCell(d))
	}
	if err := t.flush(); err != nil {
		return err
	}
	_, err = fmt.Fprintf(out.w, "\nruns %d-%d of %d\n", offset+1, offset+len(runs), st.Dead)
	return err
}

func runDeadShow(ctx context.Context, q *runqueue.Queue, out *output, args []string, key string, raw bool) error {
	d, err := q.DeadLetter(ctx, args[0], args[1], key, args[2])
	if errors.Is(err, runqueue.ErrNotFound) {
		return notFound(args, key)
	}
	if err != nil {
		return err
	}
	if raw {
		_, err := out.w.Write(d.Payload)
		return err
	}
	j := toDeadJSON(d)
	text := printable(d.Payload)
	if text {
		s := string(d.Payload)
		j.Payload = &s
	} else {
		s := base64.StdEncoding.EncodeToString(d.Payload)
		j.PayloadBase64 = &s
	}
	if out.json {
		type showJSON struct {
			Env   string `json:"env"`
			Queue string `json:"queue"`
			deadJSON
		}
		return out.writeJSON(showJSON{Env: args[0], Queue: args[1], deadJSON: j})
	}
	size := fmt.Sprintf("%d bytes", len(d.Payload))
	if !text {
		size += ", base64 below"
	}
	if d.Corrupt {
		size = payloadCell(j)
	}
	if err := out.fields("env", name(args[0]), "queue", name(args[1]), "key", name(d.Key), "id", name(d.ID),
		"attempt", strconv.Itoa(d.Attempt), "priority", strconv.Itoa(d.Priority), "died at", stamp(d.DiedAt),
		"payload", size); err != nil {
		return err
	}
	if len(d.Payload) == 0 {
		return nil
	}
	body := *cmpOr(j.Payload, j.PayloadBase64)
	if !strings.HasSuffix(body, "\n") {
		body += "\n"
	}
	_, err = fmt.Fprintf(out.w, "\n%s", body)
	return err
}

func cmpOr(a, b *string) *string {
	if a != nil {
		return a
	}
	return b
}

// notFound names the run that is not dead-lettered; errors.Is
// runqueue.ErrNotFound.
func notFound(args []string, key string) error {
	k := "no concurrency key; pass -key KEY for a run that has one"
	if key != "" {
		k = fmt.Sprintf("key %q", key)
	}
	return &notFoundError{fmt.Sprintf("no dead-lettered run %q (%s) in queue %q of env %q", args[2], k, args[1], args[0])}
}

type notFoundError struct{ msg string }

func (e *notFoundError) Error() string { return e.msg }
func (e *notFoundError) Unwrap() error { return runqueue.ErrNotFound }

func runRedrive(ctx context.Context, q *runqueue.Queue, out *output, args []string, key string) error {
	// Redrive also succeeds on a run that is live again (a retried call);
	// reading first tells the two apart for the report.
	_, err := q.DeadLetter(ctx, args[0], args[1], key, args[2])
	wasDead := err == nil
	if err != nil && !errors.Is(err, runqueue.ErrNotFound) {
		return err
	}
	err = q.Redrive(ctx, args[0], args[1], key, args[2])
	if errors.Is(err, runqueue.ErrNotFound) {
		return notFound(args, key)
	}
	if err != nil {
		return err
	}
	if out.json {
		return out.writeJSON(struct {
			runRefJSON
			Redriven bool `json:"redriven"` // false: the run was already live
		}{runRef(args, key), wasDead})
	}
	run := runText(args, key)
	if wasDead {
		_, err = fmt.Fprintf(out.w, "redriven %s: back in its queue, ready now\n", run)
	} else {
		_, err = fmt.Fprintf(out.w, "%s is already live (queued or in flight): nothing to redrive\n", run)
	}
	return err
}

func runDeadDelete(ctx context.Context, q *runqueue.Queue, out *output, args []string, key string) error {
	err := q.DeleteDeadLetter(ctx, args[0], args[1], key, args[2])
	if errors.Is(err, runqueue.ErrNotFound) {
		return notFound(args, key)
	}
	if err != nil {
		return err
	}
	if out.json {
		return out.writeJSON(struct {
			runRefJSON
			Deleted bool `json:"deleted"`
		}{runRef(args, key), true})
	}
	_, err = fmt.Fprintf(out.w, "deleted dead-lettered %s\n", runText(args, key))
	return err
}

// runRefJSON names the run of a command's ENV QUEUE ID arguments and -key,
// in the JSON of redrive and dead delete.
type runRefJSON struct {
	Env   string `json:"env"`
	Queue string `json:"queue"`
	Key   string `json:"key"`
	ID    string `json:"id"`
}

func runRef(args []string, key string) runRefJSON {
	return runRefJSON{Env: args[0], Queue: args[1], Key: key, ID: args[2]}
}

// runText names the same run in a sentence.
func runText(args []string, key string) string {
	return fmt.Sprintf("run %s (key %s) of queue %s in env %s", name(args[2]), name(key), name(args[1]), name(args[0]))
}

// beforeFlag is dead purge's -before: a duration back from now or a time.
type beforeFlag struct {
	text   string
	d      time.Duration
	at     time.Time
	isTime bool // at counts, else d
}

func (f *beforeFlag) String() string { return f.text }

func (f *beforeFlag) Set(s string) error {
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return errors.New("a negative duration is in the future")
		}
		*f = beforeFlag{text: s, d: d}
		return nil
	}
	at, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return errors.New("want a duration back from now (720h) or an RFC 3339 time (2024-05-01T00:00:00Z)")
	}
	*f = beforeFlag{text: s, at: at, isTime: true}
	return nil
}

// resolve is the time -before names: now minus its duration, or its time.
func (f *beforeFlag) resolve(now time.Time) time.Time {
	if f.isTime {
		return f.at
	}
	return now.Add(-f.d)
}

func runDeadPurge(ctx context.Context, q *runqueue.Queue, out *output, args []string, before *beforeFlag, limit int) error {
	if before.text == "" {
		return usagef("-before is required: a duration back from now (720h) or an RFC 3339 time")
	}
	at := before.resolve(time.Now())
	n, err := q.PurgeDeadLetters(ctx, args[0], args[1], at, limit)
	if err != nil {
		return err
	}
	st, err := q.QueueStats(ctx, args[0], args[1])
	if err != nil {
		return err
	}
	if out.json {
		return out.writeJSON(struct {
			Env        string    `json:"env"`
			Queue      string    `json:"queue"`
			DiedBefore time.Time `json:"died_before"`
			Limit      int       `json:"limit"`
			Deleted    int       `json:"deleted"`
			Left       int64     `json:"left"` // dead-lettered runs of the queue left, of any age
		}{args[0], args[1], at.UTC(), limit, n, st.Dead})
	}
	_, err = fmt.Fprintf(out.w, "deleted %d dead-lettered run(s) of queue %s in env %s that died at or before %s; %d left\n",
		n, name(args[1]), name(args[0]), stamp(at), st.Dead)
	if err == nil && n == limit {
		_, err = fmt.Fprintln(out.w, "-limit reached: more runs that died by then may be left; run it again")
	}
	return err
}

func runRepair(ctx context.Context, q *runqueue.Queue, out *output, args []string, opts *runqueue.RepairOptions) error {
	res, err := q.Repair(ctx, args[0], args[1], opts)
	if err != nil {
		return err
	}
	if out.json {
		return out.writeJSON(struct {
			Env          string `json:"env"`
			Queue        string `json:"queue"`
			Runs         int    `json:"runs"`
			Orphans      int    `json:"orphans"`
			OrphansDead  int    `json:"orphans_dead"`
			OrphansGone  int    `json:"orphans_expired"`
			Keys         int    `json:"keys"`
			IndexEntries int    `json:"index_entries"`
			Depth        bool   `json:"depth"`
			Master       bool   `json:"master"`
			Dead         bool   `json:"dead"`
			TTLEntries   int    `json:"ttl_entries"`
			Leases       int    `json:"leases"`
			KeyCounts    int    `json:"key_counts"`
			Changed      bool   `json:"changed"`
		}{args[0], args[1], res.Runs, res.Orphans, res.OrphansDead, res.OrphansExpired, res.Keys, res.IndexEntries,
			res.Depth, res.Master, res.Dead, res.TTLEntries, res.Leases, res.KeyCounts, res.Changed()})
	}
	_, err = fmt.Fprintf(out.w, "queue %s of env %s: %d run(s) over %d key(s) read\n", name(args[1]), name(args[0]),
		res.Runs, res.Keys)
	if err != nil || !res.Changed() {
		if err == nil {
			_, err = fmt.Fprintln(out.w, "nothing to repair")
		}
		return err
	}
	_, err = fmt.Fprintf(out.w, "repaired: %d run(s) found in no set (%d queued again, %d dead-lettered, %d expired); "+
		"%d index entries added, moved or removed; ready and delayed counts %s; shard index entry %s; dead count %s; "+
		"%d TTL entries added; %d leases added; %d keys' in-flight counts set\n", res.Orphans,
		res.Orphans-res.OrphansDead-res.OrphansExpired, res.OrphansDead, res.OrphansExpired, res.IndexEntries,
		rewritten(res.Depth), rewritten(res.Master), rewritten(res.Dead), res.TTLEntries, res.Leases, res.KeyCounts)
	return err
}

func rewritten(b bool) string {
	if b {
		return "rewritten"
	}
	return "right"
}

type weightJSON struct {
	Key    string  `json:"key"`
	Weight float64 `json:"weight"`
}

func runWeightList(ctx context.Context, q *runqueue.Queue, out *output, args []string) error {
	ws, err := q.Weights(ctx, args[0], args[1])
	if err != nil {
		return err
	}
	j := struct {
		Env     string       `json:"env"`
		Queue   string       `json:"queue"`
		Weights []weightJSON `json:"weights"`
	}{args[0], args[1], []weightJSON{}}
	for k, w := range ws {
		j.Weights = append(j.Weights, weightJSON{k, w})
	}
	slices.SortFunc(j.Weights, func(a, b weightJSON) int { return strings.Compare(a.Key, b.Key) })
	if out.json {
		return out.writeJSON(j)
	}
	if len(j.Weights) == 0 {
		_, err := fmt.Fprintln(out.w, "no weight overrides: every key has weight 1")
		return err
	}
	t := out.table()
	t.row("KEY", "WEIGHT")
	for _, w := range j.Weights {
		t.row(name(w.Key), weight(w.Weight))
	}
	return t.flush()
}

func runWeightSet(ctx context.Context, q *runqueue.Queue, out *output, args []string) error {
	w, err := strconv.ParseFloat(args[3], 64)
	if err != nil {
		return usagef("invalid weight %q: not a number", args[3])
	}
	if err := q.SetWeight(ctx, args[0], args[1], args[2], w); err != nil {
		return err
	}
	if vtime.HeldAsDefault(w) && w != 1 {
		// SetWeight cleared the override: the scheduler holds w as 1.
		return weightResult(out, args, 1, "cleared: "+weight(w)+" is held as 1, the default")
	}
	return weightResult(out, args, w, "set to "+weight(w))
}

func runWeightClear(ctx context.Context, q *runqueue.Queue, out *output, args []string) error {
	if err := q.ClearWeight(ctx, args[0], args[1], args[2]); err != nil {
		return err
	}
	return weightResult(out, args, 1, "cleared: back to 1")
}

func weightResult(out *output, args []string, w float64, what string) error {
	if out.json {
		return out.writeJSON(struct {
			Env   string `json:"env"`
			Queue string `json:"queue"`
			weightJSON
		}{args[0], args[1], weightJSON{args[2], w}})
	}
	_, err := fmt.Fprintf(out.w, "weight of key %s in queue %s of env %s %s\n", name(args[2]), name(args[1]),
		name(args[0]), what)
	return err
}
