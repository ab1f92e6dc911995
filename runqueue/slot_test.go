package runqueue_test

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
	"github.com/runqueue/runqueue/runqueue"
)

// scriptCall is one EVAL, EVALSHA or FCALL a client sent.
type scriptCall struct {
	cmd  string // "eval", "evalsha" or "fcall"
	sha  string // the script's SHA-1 (computed from the source for EVAL), or the function FCALL names
	keys []string
	err  error
}

// evalRecorder is a go-redis hook that records every script call, direct or
// pipelined, and every error reply of any command but the connection
// handshake.
type evalRecorder struct {
	mu    sync.Mutex
	calls []scriptCall
	errs  []error
}

func recordEvals(c redis.UniversalClient) *evalRecorder {
	r := &evalRecorder{}
	c.AddHook(afterEach(r.record))
	return r
}

func (r *evalRecorder) record(cmd redis.Cmder, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	name := cmd.Name()
	// go-redis probes optional features (CLIENT SETINFO, HELLO) on every new
	// connection and expects older servers to refuse them.
	if err != nil && err != redis.Nil && name != "client" && name != "hello" {
		r.errs = append(r.errs, fmt.Errorf("%s: %w", name, err))
	}
	if name != "eval" && name != "evalsha" && name != "eval_ro" && name != "evalsha_ro" && name != "fcall" && name != "fcall_ro" {
		return
	}
	// Args are: name, script or sha, numkeys, keys..., argv...
	args := cmd.Args()
	n, perr := strconv.Atoi(fmt.Sprint(args[2]))
	if perr != nil || 3+n > len(args) {
		r.errs = append(r.errs, fmt.Errorf("unparsable %s: numkeys %v", name, args[2]))
		return
	}
	c := scriptCall{cmd: name, sha: fmt.Sprint(args[1]), err: err}
	if strings.HasPrefix(name, "eval") && !strings.HasPrefix(name, "evalsha") {
		sum := sha1.Sum([]byte(c.sha))
		c.sha = hex.EncodeToString(sum[:])
	}
	for _, k := range args[3 : 3+n] {
		c.keys = append(c.keys, fmt.Sprint(k))
	}
	r.calls = append(r.calls, c)
}

// take returns and forgets what was recorded so far.
func (r *evalRecorder) take() ([]scriptCall, []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	calls, errs := r.calls, r.errs
	r.calls, r.errs = nil, nil
	return calls, errs
}

// flagOffNames maps the SHA-1 of every flag-off script to its name.
func flagOffNames(t testing.TB) map[string]string {
	t.Helper()
	srcs, err := runqueue.FlagOffScripts()
	require.NoError(t, err)
	out := map[string]string{}
	for name, src := range srcs {
		sum := sha1.Sum([]byte(src))
		out[hex.EncodeToString(sum[:])] = name
	}
	return out
}

// User strings full of the bytes that could forge a separator, a wildcard
// or a hash tag if they reached a key unencoded.
var (
	driveEnvs   = []string{"prod", "env:{a}", "*", "ü ü", "%41"}
	driveQueues = []string{"q", "q:{x}*", "日本 queue"}
	driveKeys   = []string{"", "*", "k:{1}", "a b?[]"}
)

// driveResult counts what the drive did, so a test can check that every
// path really ran.
type driveResult struct {
	enqueued, dequeued, acked, nacked, dead, extended, recovered, expired, redriven int
}

// driveEverything calls every public entry point that runs a script, over
// several envs, queues and keys, and fails on any error.
func driveEverything(t *testing.T, b *testBundle) driveResult {
	t.Helper()
	ctx := b.ctx
	var res driveResult
	shards := map[int]bool{}
	for ei, env := range driveEnvs {
		shards[b.q.ShardOf(env)] = true
		for qi, queue := range driveQueues {
			for ki, key := range driveKeys {
				id := func(kind string) string { return fmt.Sprintf("%s:{%d.%d.%d}*", kind, ei, qi, ki) }
				params := []runqueue.EnqueueParams{
					{ID: id("ready"), Priority: ki},
					{ID: id("ttl"), TTL: time.Hour},
					{ID: id("delayed"), Delay: 10 * time.Second},
					{ID: id("at"), AvailableAt: b.clock.Now().Add(20 * time.Second), Priority: 9},
					// Expires before it is due: only ExpireTTL can take it.
					{ID: id("expiring"), Delay: time.Hour, TTL: 5 * time.Second},
				}
				for _, p := range params {
					p.Env, p.Queue, p.Key, p.Payload = env, queue, key, []byte("body "+p.ID)
					ok, err := b.q.Enqueue(ctx, p)
					require.NoError(t, err)
					require.True(t, ok)
					res.enqueued++
				}
				require.NoError(t, b.q.SetWeight(ctx, env, queue, key, float64(ki+1)))
				if ki%2 == 1 {
					require.NoError(t, b.q.ClearWeight(ctx, env, queue, key))
				}
				// An idempotent retry runs the script too.
				ok, err := b.q.Enqueue(ctx, runqueue.EnqueueParams{Env: env, Queue: queue, Key: key,
					ID: id("ready"), Priority: ki, Payload: []byte("body " + id("ready"))})
				require.NoError(t, err)
				require.False(t, ok)
			}
		}
	}

	var runs []*runqueue.Run
	for shard := range shards {
		got, err := b.q.DequeueShard(ctx, shard, 3)
		require.NoError(t, err)
		require.NotEmpty(t, got)
		runs = append(runs, got...)
		got, err = b.q.DequeueShardWait(ctx, shard, 1, 0)
		require.NoError(t, err)
		runs = append(runs, got...)
	}
	for _, env := range driveEnvs {
		for i, queue := range driveQueues {
			var got []*runqueue.Run
			var err error
			if i == 0 {
				got, err = b.q.DequeueWait(ctx, env, queue, 100, 0)
			} else {
				got, err = b.q.Dequeue(ctx, env, queue, 100)
			}
			require.NoError(t, err)
			runs = append(runs, got...)
		}
	}
	res.dequeued = len(runs)

	var dead []*runqueue.Run
	for i, r := range runs {
		switch i % 5 {
		case 0:
			require.NoError(t, b.q.Ack(ctx, r))
			res.acked++
		case 1:
			_, err := b.q.Nack(ctx, r, nil)
			require.NoError(t, err)
			res.nacked++
		case 2:
			nr, err := b.q.Nack(ctx, r, &runqueue.NackOptions{DeadLetter: true})
			require.NoError(t, err)
			require.False(t, nr.Requeued)
			dead = append(dead, r)
			res.dead++
		case 3:
			require.NoError(t, b.q.ExtendLease(ctx, r, time.Minute))
			res.extended++
		case 4:
			_, err := b.q.Nack(ctx, r, &runqueue.NackOptions{RetryAt: b.clock.Now()})
			require.NoError(t, err)
			res.nacked++
		}
	}
	require.NotEmpty(t, dead)
	for _, r := range dead[:len(dead)-1] {
		require.NoError(t, b.q.Redrive(ctx, r.Env, r.Queue, r.Key, r.ID))
		res.redriven++
	}
	// The last dead run stays dead, so that its queue's purge runs the
	// script (PurgeDeadLetters sends none when it reads no dead run).
	purged := 0
	for _, r := range dead {
		n, err := b.q.PurgeDeadLetters(ctx, r.Env, r.Queue, b.clock.Now(), 10)
		require.NoError(t, err)
		purged += n
	}
	require.Equal(t, 1, purged)
	// Nothing is lost: each Repair reads, and sends its script calls.
	for _, env := range driveEnvs {
		for _, queue := range driveQueues {
			rr, err := b.q.Repair(ctx, env, queue, nil)
			require.NoError(t, err)
			require.False(t, rr.Changed(), "%+v", rr)
		}
	}

	// Past every lease (extended ones too), past the 5s TTLs and the delays.
	b.clock.Advance(b.cfg.LeaseDuration + 2*time.Minute)
	for shard := range shards {
		n, err := b.q.RecoverLeases(ctx, shard, 1000)
		require.NoError(t, err)
		res.recovered += n
		n, err = b.q.ExpireTTL(ctx, shard, 1000)
		require.NoError(t, err)
		res.expired += n
	}
	// Serve what became ready (promoting the delayed runs) and ack it.
	for _, env := range driveEnvs {
		for _, queue := range driveQueues {
			got, err := b.q.Dequeue(ctx, env, queue, 1000)
			require.NoError(t, err)
			for _, r := range got {
				require.NoError(t, b.q.Ack(ctx, r))
			}
		}
	}
	return res
}

// TestScriptKeysShareOneSlot drives every entry point and checks, on the
// script calls the client actually sent, that each declares keys and that
// all the keys of one call are in one slot: the slot of the env's shard.
func TestScriptKeysShareOneSlot(t *testing.T) {
	t.Parallel()
	for _, bk := range []backend{{Name: "Real", Client: redistest.Real}, {Name: "Cluster", Client: redistest.Cluster}} {
		t.Run(bk.Name, func(t *testing.T) {
			t.Parallel()
			c := bk.Client(t)
			rec := recordEvals(c)
			b := setup(t, c, func(cfg *runqueue.Config) { cfg.LeaseDuration = time.Minute })
			_, _ = rec.take() // New only loads scripts

			res := driveEverything(t, b)
			require.Positive(t, res.recovered, "lease recovery ran no script")
			require.Positive(t, res.expired, "the TTL sweep ran no script")

			calls, errs := rec.take()
			for _, err := range errs {
				require.NotContains(t, err.Error(), "CROSSSLOT")
			}
			if bk.Name == "Cluster" {
				require.Empty(t, errs, "a cluster must answer every command")
			}
			names := flagOffNames(t)
			used := map[string]int{}
			keySeen := map[string]bool{}
			for _, call := range calls {
				name, ok := names[call.sha]
				require.True(t, ok, "%s of an unknown script %s", call.cmd, call.sha)
				used[name]++
				checkCallSlot(t, b, name, call.keys)
				for _, k := range call.keys {
					keySeen[k] = true
				}
			}
			for _, name := range names {
				require.Positive(t, used[name], "script %s never ran", name)
			}
			t.Logf("%+v: %d script calls, %d distinct keys, by script %v", res, len(calls), len(keySeen), used)

			if cc, ok := c.(*redis.ClusterClient); ok {
				// keys.Slot must be the server's own slot function.
				for k := range keySeen {
					slot, err := cc.ClusterKeySlot(b.ctx, k).Result()
					require.NoError(t, err)
					require.Equal(t, int(slot), keys.Slot(k), "slot of %q", k)
				}
				// Which node served each env's shard.
				nodes := map[string][]string{}
				for _, env := range driveEnvs {
					addr, err := redistest.NodeOf(b.ctx, cc, fmt.Sprintf("{%s:%d}", b.prefix, b.q.ShardOf(env)))
					require.NoError(t, err)
					nodes[addr] = append(nodes[addr], env)
				}
				t.Logf("envs by node: %q", nodes)
			}
		})
	}
}

// checkCallSlot checks the keys of one script call: at least one, all in
// one slot, the hash tag of the env every env-level key names, and that env
// is one the drive used.
func checkCallSlot(t *testing.T, b *testBundle, script string, ks []string) {
	t.Helper()
	require.NotEmpty(t, ks, "script %s called without keys", script)
	slot := keys.Slot(ks[0])
	env := ""
	for _, k := range ks {
		require.Equal(t, slot, keys.Slot(k), "script %s: keys %q and %q are in different slots", script, ks[0], k)
		_, rest, ok := strings.Cut(k, "}")
		require.True(t, ok, "key %q has no hash tag", k)
		if seg, ok := strings.CutPrefix(rest, ":e:"); ok {
			enc, _, _ := strings.Cut(seg, ":")
			e, err := keys.DecodeSegment(enc)
			require.NoError(t, err, "key %q", k)
			if env == "" {
				env = e
			}
			require.Equal(t, env, e, "script %s: keys of two envs in one call", script)
		}
	}
	require.NotEmpty(t, env, "script %s: no env-level key among %q", script, ks)
	require.Contains(t, driveEnvs, env)
	want := fmt.Sprintf("{%s:%d}", b.prefix, b.q.ShardOf(env))
	for _, k := range ks {
		require.True(t, strings.HasPrefix(k, want+":"), "script %s: key %q is not under env %q's shard tag %s", script, k, env, want)
	}
}
