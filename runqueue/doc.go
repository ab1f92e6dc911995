// Package runqueue queues the runs of many tenants on Redis, for run
// engines: CI systems, job platforms, agent runners, anything where one
// tenant's backlog must not hold another tenant's work. Every state change
// of a run (enqueue, dequeue, ack, nack, lease recovery, TTL expiry,
// redrive, a weight change) is one atomic Lua script, so any number of
// producers and consumers on any number of machines can share one Redis or
// Redis Cluster.
//
// A run belongs to an env (a tenant), a base queue inside the env and,
// optionally, a concurrency key (a user, a customer, a repository). The runs
// of one key form a variant of the queue. With [Config.VtimeScheduling] off
// (the default) a dequeue serves the variants in age order; with it on, a
// fair virtual-time scheduler serves them in turn, by weight.
//
// docs/design.md in the repository explains the design and its
// guarantees; docs/lifecycle.md draws the states of a run and the keys each
// lives in.
//
// # Keys and shards
//
// Open a [Queue] with [New] on a go-redis client (a single server, a
// cluster or a ring). New checks the configuration, the server's
// maxmemory-policy and the layout version under the prefix (see Errors),
// and loads the scripts of the configured flag state, so a broken script or
// an unreachable Redis fails there rather than at the first call. One Queue
// per process is enough; it is safe for concurrent use. Close stops its
// pub/sub listener and waits for the coalesced Enqueue, Ack and Dequeue
// calls in flight, but leaves the client open.
//
// Every key of one env lives in one Redis Cluster hash slot: keys start with
// the hash tag "{prefix:shard}", where shard is fnv1a(env) mod
// [Config.Shards] (16 by default; [Queue.ShardOf] tells it). The scripts
// declare every key they touch, all in that slot, so the same calls work
// on a single server and on a cluster, where the shards spread over the
// masters. Changing Shards moves envs to other shards: drain first.
//
// Env, queue, concurrency key and run id are user strings: non-empty, at
// most [MaxNameBytes] bytes of valid UTF-8, no control characters, no
// leading or trailing whitespace, not "." or "..". Package keys encodes
// them injectively (every byte outside [A-Za-z0-9._-] becomes %XX), so no
// name can forge a separator, a wildcard or a hash tag, and distinct names
// never share a key.
//
// # Enqueue
//
// [Queue.Enqueue] stores one run described by [EnqueueParams]: its names,
// an opaque payload (at most [Config.MaxPayloadBytes], 1 MiB by default), a
// priority 0..[MaxPriority], a delay or an available-at time, and a TTL.
// The id makes it idempotent: the same id with the same key and payload is
// a no-op that returns false, another body is [ErrConflict]. A priority p
// orders the run as if it had become available p x [Config.PriorityStep]
// (30s by default) earlier; it never makes a run available before its
// time, so old work is not starved. [Config.MaxQueueDepth] and
// [Config.MaxKeyDepth] refuse runs past a depth with a [*QueueFullError],
// writing nothing. [Queue.EnqueueMany] sends many runs, one script call per
// base queue (up to 1000 runs or 4 MiB of payload each), the calls in one
// pipeline; each run is all or nothing. Concurrent Enqueue calls on one
// Queue are coalesced into such calls (and concurrent [Queue.Ack] calls into
// [Queue.AckMany] calls), each run keeping its own result: under load a run
// costs Redis far less than a script call of its own.
// [Config.SerialCalls] sends every call on its own.
//
// # Dequeue and leases
//
// [Queue.Dequeue] moves up to maxCount ready runs of one base queue in
// flight, atomically and within the env, queue and key concurrency limits
// ([Config.EnvConcurrency], [Config.QueueConcurrency],
// [Config.KeyConcurrency], or [Config.LimitsFor] per queue). Each [Run]
// carries a lease until [Run.LeaseDeadline] ([Config.LeaseDuration], 5m
// by default) and a delivery token. Two consumers never receive the same
// run. [Queue.DequeueShard] serves the queues of a whole shard, envs in
// turn, so one env's backlog cannot take a whole call. Concurrent Dequeue
// calls of one base queue on one Queue are coalesced into one dequeue that
// stands for them (their maxCounts, scans and promotions summed), its runs
// handed out in the order it served them (see [Queue.Dequeue]).
// [Queue.DequeueWait] and [Queue.DequeueShardWait] wait for work without
// polling: an enqueue anywhere wakes them through Redis pub/sub, a delayed
// run at its time, and work held by limits is looked at every
// [Config.BlockPollInterval] (and at the time of other delayed work due
// sooner, once a poll while such looks serve nothing).
//
// A holder then calls [Queue.Ack] (done: the run is removed and its slot
// freed), [Queue.Nack] (retry at [NackOptions.RetryAt] or after
// [Queue.Backoff], with attempt + 1; dead letter when no attempt is left
// under [Config.MaxAttempts] or when [NackOptions.DeadLetter] asks), or
// [Queue.ExtendLease] (a heartbeat). [Queue.AckAndDequeue] acks finished
// runs and dequeues more in one script call; the slots it frees serve the
// same call. A holder whose lease passed and whose run was recovered gets
// [ErrNotInFlight] until the run is delivered again, [ErrLeaseLost] after.
// A write sent twice, as go-redis does when a reply times out or the
// connection drops, does no harm but in one case: a repeated ack of a run
// that is gone succeeds, a repeated nack returns what the first returned,
// a repeated redrive leaves the run as the first left it, and a repeated
// Enqueue of a run still queued or in flight finds it there. But an
// Enqueue whose run was served and acked between the two sends queues it
// again, and it runs twice (see README, "Timeouts and go-redis's
// retries").
//
// Dead-lettered runs stay for inspection: [Queue.DeadLetters] lists them,
// [Queue.DeadLetter] reads one, and [Queue.Redrive] puts one back, ready
// now, with its attempts reset. [Queue.QueueStats], [Queue.KeyStats] and
// [Queue.EnvStats] count ready, delayed and in-flight runs, and
// QueueStats and EnvStats dead ones too.
//
// # The worker and sweeps
//
// The [Worker] runs a [Handler] over the runs of some base queues or whole
// shards, which is what most users want in place of their own loop.
// [NewWorker] builds one from a [WorkerConfig], [Worker.Start] starts it,
// and [Worker.Shutdown] stops fetching, waits for the running handlers
// until its context ends, sends their acks and releases what is still
// running for immediate redelivery. The handler returns nil to ack a run,
// an error to nack it for a retry after [Queue.Backoff], [NoRetry](err) to
// dead-letter it, or [RetryAt](err, t) to retry it at t; a panic is
// recovered, logged with its stack and nacked, and the handler's context
// is cancelled when the run's lease is lost. The worker fetches with
// [Queue.AckAndDequeue] for its queues and [Queue.DequeueShard] (its acks
// sent by [Queue.AckMany]) for its shards, never more runs than its free
// slots, waits for
// work through pub/sub, extends the leases of its running handlers
// (WorkerConfig.HeartbeatInterval), and sweeps the shards it serves in the
// background (WorkerConfig.SweepInterval, 30s by default, jittered).
//
// Without the Worker, somebody must sweep: call [Queue.RecoverLeases] and
// [Queue.ExpireTTL] for every shard now and then, from any instance. Both
// are atomic per run, so any number of instances may sweep one shard at
// once. RecoverLeases requeues a run whose lease passed with attempt + 1,
// ready at once (or dead-letters it when it has no attempt left), so a
// crashed consumer loses nothing; ExpireTTL removes queued runs whose TTL
// passed before they were dequeued (a dequeue that comes to such a run
// first deletes it too, never delivering it).
//
// # The scheduler and its rollout
//
// With [Config.VtimeScheduling] on (CK_VTIME_SCHEDULING_ENABLED=true
// through [ConfigFromEnv]) the keys of a base queue share it fairly: each
// key has a virtual start tag, every serve picks the key with the smallest
// effective start max(tag, clock), ties go to the key that registered
// first, and a serve costs a key 1/weight. Idle, gated and delayed time
// earn no credit; new keys join through a lane, one newcomer at a time, a
// little behind the keys already competing (at the clock on a cold start),
// so minting keys buys the share of one key; a key at its per-key limit leaves the competition
// until a slot frees. A dequeue of N serves what N dequeues of 1 would
// (but for calls that meet more runs past their TTL than the 100 a call
// sweeps, at a key limit: see EnqueueParams.TTL).
// [Queue.SetWeight] gives a key a weight from [MinWeight] to [MaxWeight]
// (at most [Config.MaxWeightOverrides] per queue), applied at the next
// serve on every instance; [Queue.ClearWeight] and [Queue.Weights] undo and
// list them. [Queue.Schedule] shows each key's tag, lag, weight and why it
// is not served; [Queue.Preview] the runs a fair dequeue would serve next;
// [Queue.TopLags] the keys furthest behind. Package vtime is the same
// scheduler as a pure Go model, and docs/design.md section 6 its rules.
//
// The flag is safe to roll out one instance at a time. With it off, the
// scripts are byte-identical to the pinned flag-off scripts
// (testdata/flagoff-scripts.sha1) and write no scheduler key (but for
// Queue.SetWeight, which keeps an existing scheduler state's count of
// weights, the key's stride remainder and the cap on its tag in step with
// the weights hash, so
// that a weight set on a flag-off instance applies on the flag-on ones).
// Flag-off and flag-on instances may share a Redis: the per-queue index of
// variants stays in the timestamp domain in both states, and a flag-on
// dequeue discovers work a flag-off instance wrote: what was ready before
// the scheduler's state began competes at once, a key a flag-off producer
// writes later goes through the newcomer lane, as a flag-on producer's
// does. To roll back, turn the flag
// off: the scheduler's two keys per queue are no longer read and expire
// after [Config.StateTTL] (24h by default); weights stay. Only a flag-on
// dequeue renews the state, so flag-on producers feeding flag-off consumers
// do not keep their registrations for good: the state expires StateTTL
// after it was made or last renewed.
//
// # Errors
//
// Bad input is an [*InvalidError] naming the field (errors.Is [ErrInvalid]),
// and nothing is written: names as above, a priority out of range, a
// negative delay, an oversize payload, a maxCount outside
// 1..[Config.MaxDequeueCount], times outside the Unix epoch..
// [MaxTimeUnixMilli], durations over [MaxDuration]. The other sentinels:
// [ErrConflict], [ErrQueueFull] (wrapped by [*QueueFullError], which names
// the queue or key limit), [ErrNotFound], [ErrNotInFlight], [ErrLeaseLost],
// [ErrLeaseActive], [ErrTooManyWeights], [ErrReadOnly] (a Queue opened with
// [Config.ReadOnly] refuses every write), [ErrClosed] (a blocking dequeue
// on a closed Queue), [ErrTooLarge] (Schedule or Preview of a queue with
// more than [MaxInspectVariants] keys) and [ErrCorruptRecord] (a run's
// stored record does not parse: a Nack that would retry it is refused
// with nothing written, RecoverLeases dead-letters it once its lease
// passes, a Dequeue that serves it dead-letters it at once and delivers
// the others).
//
// New refuses three kinds of Redis. One older than [MinRedisVersion] (its
// INFO reports an older redis_version) is a [*ServerVersionError]
// (errors.Is [ErrServerVersion]): the scripts use commands it lacks. One
// whose maxmemory-policy is not
// noeviction (it could evict runs, leases and scheduler state) is an
// [*EvictionPolicyError] (errors.Is [ErrEvictionPolicy]); set
// [Config.AllowEviction] to accept the risk. A server that does not let
// the policy be read (CONFIG refused, as on some managed services) is not
// checked. And a prefix that holds another [LayoutVersion] is a
// [*LayoutError] (errors.Is [ErrLayout]): drain the old deployment's queues,
// or use a new prefix, before starting a build of another layout.
package runqueue
