// Command runqueue inspects and operates the run queues of a runqueue
// deployment on Redis: run counts, the fair scheduler's view, dead letters,
// weights and repairs.
//
// Install it with
//
//	go install github.com/runqueue/runqueue/cmd/runqueue@latest
//
// or run it from a checkout with go run ./cmd/runqueue.
//
// # Usage
//
//	runqueue [flags] COMMAND [ARGS] [flags]
//
//	runqueue stats ENV [QUEUE [KEY]]          count the runs of an env, a queue or a concurrency key
//	runqueue schedule ENV QUEUE               the fair scheduler's view: tags, lags, weights, why a key waits
//	runqueue preview ENV QUEUE                the runs a fair dequeue would serve next, in order
//	runqueue dead list ENV QUEUE              list dead-lettered runs, oldest death first
//	runqueue dead show ENV QUEUE ID           show one dead-lettered run and its payload
//	runqueue dead delete ENV QUEUE ID         delete one dead-lettered run for good (writes)
//	runqueue dead purge ENV QUEUE             delete the dead-lettered runs that died by -before (writes)
//	runqueue redrive ENV QUEUE ID             put a dead-lettered run back in its queue (writes)
//	runqueue repair ENV QUEUE                 rebuild a queue's lost indexes, counts, TTL entries and leases (writes)
//	runqueue weight list ENV QUEUE            list the weight overrides of a queue
//	runqueue weight set ENV QUEUE KEY WEIGHT  give a concurrency key a scheduler weight (writes)
//	runqueue weight clear ENV QUEUE KEY       return a concurrency key to weight 1 (writes)
//	runqueue help [COMMAND]                   the overview, or a command's arguments and flags
//
// runqueue help COMMAND (or runqueue COMMAND -h) describes each command and
// its own flags: -n for schedule and preview; -env-limit, -queue-limit and
// -key-limit, the deployment's concurrency limits, which decide what the
// scheduler can serve; -offset and -limit for dead list; -key (the run's
// concurrency key) for dead show, dead delete and redrive; -payload for dead
// show; -before (required) and -limit for dead purge; -lease (the deadline
// of a lease it adds) and -dead-letter-orphans (dead-letter the runs found
// in no set instead of queueing them again) for repair.
//
// # Finding the deployment
//
// Every command takes these flags, before or after the command and its
// arguments (after "--" everything is an argument):
//
//	-redis URL          redis://[user:password@]host:port[/db], rediss:// (TLS),
//	                    unix:///path, redis+cluster://host:port,host:port (or
//	                    rediss+cluster://) or host:port[,host:port...]; more than
//	                    one address means Redis Cluster. Default $REDIS_URL, else
//	                    redis://localhost:6379.
//	-prefix PREFIX      Config.Prefix (default $RUNQUEUE_PREFIX, else rq)
//	-shards N           Config.Shards (default $RUNQUEUE_SHARDS, else 16)
//	-vtime              Config.VtimeScheduling (default $CK_VTIME_SCHEDULING_ENABLED)
//	-json               JSON instead of a table
//	-dial-timeout D     give up on an unreachable Redis after D (default 2s)
//	-timeout D          give up on the whole command after D (default 30s)
//
// The defaults come from the environment that runqueue.ConfigFromEnv reads,
// so the command run beside a deployment sees its Config. A wrong -shards
// looks for an env in the wrong shard and finds nothing; a prefix that holds
// no deployment gets a note on stderr.
//
// # Reading writes nothing
//
// Only dead delete, dead purge, redrive, repair, weight set and weight clear
// write, and only under a prefix that holds a deployment (a layout
// version), so a mistyped -prefix cannot create one. Every other command opens the queues with Config.ReadOnly:
// it writes no key, records no layout version and loads no script.
//
// # Exit status
//
// 0 when the command did its work; 1 when it failed (Redis unreachable, no
// such dead-lettered run, another layout version under the prefix, ...); 2
// on bad input (an unknown command, missing or extra arguments, an invalid
// number, name or flag). Errors go to stderr, results to stdout.
//
// # Examples
//
//	runqueue -redis redis://cache:6379 -prefix jobs stats prod builds
//	runqueue schedule -vtime -key-limit 2 prod builds
//	runqueue dead list -json prod builds | jq '.runs[].id'
//	runqueue dead show -key acme -payload prod builds b-101 > payload.json
//	runqueue redrive -vtime -key acme prod builds b-101
//	runqueue weight set -redis redis+cluster://n1:7000,n2:7000 prod builds acme 4
package main
