// Package redistest gives tests a Redis to run against: an embedded miniredis
// ([Mini]), a real Redis ([Real]) or a three-node Redis Cluster ([Cluster]),
// and reads a server's command statistics ([CommandStats]).
//
// # Where the real Redis comes from
//
// Real takes the first of: the server at REDIS_URL; a redis-server on PATH,
// started by the test binary; a Redis container started with
// testcontainers-go's Redis module (image redis:7.0) when a Docker engine
// answers. Cluster takes the nodes in REDIS_CLUSTER_ADDRS, or else starts
// three redis-servers from PATH; it has no container fallback. Without any
// of them, the test skips (or fails, see RUNQUEUE_REQUIRE_REDIS). The choice
// is made once per test binary, at the first use.
//
// # Sharing
//
// Real and Cluster start at most one Redis each per test binary, on first
// use, and every test of the binary shares it. Tests therefore never FLUSHDB:
// each one puts its keys under its own [Prefix], whose keys are removed from
// the shared servers when the test passes.
//
// A package that uses Real or Cluster stops the servers from TestMain:
//
//	func TestMain(m *testing.M) { redistest.Main(m) }
//
// or, when goleak owns TestMain:
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Wrap(m)) }
//
// Main and Wrap also print, once the tests have run, where the real Redis
// came from ([Source], [ClusterSource]); go test shows it with -v:
//
//	redistest: Real: spawned redis-server 7.0.15 (/usr/bin/redis-server); Cluster: spawned 3-node cluster of redis-server 7.0.15 (/usr/bin/redis-server)
//	redistest: Real: REDIS_URL: redis 7.2.4 at 10.0.0.7:6379
//	redistest: Real: testcontainers: redis:7.0, redis 7.0.15 at localhost:32771
//
// [Private] is a real Redis of the binary's own even when REDIS_URL is set
// (a redis-server from PATH, or a container), for the tests that flush the
// script cache or count the server's commands: a server shared with other
// test binaries would make them, or the others, fail.
//
// # Environment
//
//   - REDIS_URL: Real connects to this server (redis.ParseURL syntax) instead
//     of starting one.
//   - REDIS_CLUSTER_ADDRS: comma-separated node addresses; Cluster connects to
//     them instead of starting a cluster.
//   - RUNQUEUE_REQUIRE_REDIS=1: a test that needs a real Redis fails, rather
//     than skips, when none is available. CI sets it so that a missing Redis
//     cannot pass silently.
package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Mini returns a client for a fresh miniredis owned by t.
func Mini(t testing.TB) redis.UniversalClient {
	t.Helper()
	_, c := MiniServer(t)
	return c
}

// MiniServer is [Mini] that also returns the server, so that tests can call
// FastForward, FlushScripts and the like on it.
func MiniServer(t testing.TB) (*miniredis.Miniredis, redis.UniversalClient) {
	t.Helper()
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr(), ReadTimeout: ReadTimeout})
	// Cleanups run last-in first-out: the client closes before the server.
	t.Cleanup(func() { _ = c.Close() })
	return m, c
}

// Real returns a client for a real Redis, the one shared by this test
// binary: the server at REDIS_URL if set, otherwise one started on first
// use, a redis-server from PATH or, without one, a testcontainers container.
// Without any, it skips t, or fails it under RUNQUEUE_REQUIRE_REDIS=1.
func Real(t testing.TB) redis.UniversalClient {
	t.Helper()
	return standaloneClient(t, standalone)
}

// standaloneClient is a client of the one-server deployment s.
func standaloneClient(t testing.TB, s *shared) redis.UniversalClient {
	t.Helper()
	d := need(t, s)
	opt := &redis.Options{Addr: d.addrs[0]}
	if d.opt != nil {
		opt = new(*d.opt) // each client its own copy: go-redis keeps state in it
	}
	opt.ReadTimeout = ReadTimeout
	return connect(t, redis.NewClient(opt))
}

// Private returns a client for a real Redis that this test binary keeps to
// itself: a redis-server from PATH, or else a testcontainers Redis, never
// the server at REDIS_URL. Tests that change or read server-wide state
// (SCRIPT FLUSH, CONFIG RESETSTAT, INFO commandstats) use it, so that they
// pass while other test binaries share REDIS_URL's server, and those
// binaries pass beside them. Like [Real], it is started once per binary
// and shared by the binary's tests; it skips or fails like [Real].
func Private(t testing.TB) redis.UniversalClient {
	t.Helper()
	return standaloneClient(t, private)
}

// PrivateCluster is [Cluster] for the tests that flush the script cache or
// count the servers' commands: it skips when the cluster is the shared one
// of REDIS_CLUSTER_ADDRS (those tests would break other users of it, and
// be broken by them); a cluster spawned for this binary is its own.
func PrivateCluster(t testing.TB) redis.UniversalClient {
	t.Helper()
	if os.Getenv("REDIS_CLUSTER_ADDRS") != "" {
		t.Skip("redistest: this test flushes scripts or counts commands; the cluster of REDIS_CLUSTER_ADDRS is shared (unset it to spawn one)")
	}
	return Cluster(t)
}

// Backend is one kind of Redis a test runs on. Each test package lists its
// backends in a literal of its own (Mini, Real or Private, Cluster or
// PrivateCluster), so that the cluster test target (clustertests) sees
// which tests reach a cluster.
type Backend struct {
	Name   string
	Client func(testing.TB) redis.UniversalClient
}

// ForEachBackend runs fn as a parallel subtest on each of bs.
func ForEachBackend(t *testing.T, bs []Backend, fn func(t *testing.T, c redis.UniversalClient)) {
	t.Helper()
	for _, b := range bs {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			fn(t, b.Client(t))
		})
	}
}

// ReadTimeout is the read timeout of the clients this package returns.
// go-redis sends a command again when its reply times out (3s by
// default), and a dequeue is not idempotent: when the first call went
// through, its runs stay in flight until lease recovery and the test sees
// fewer. A dequeue of 1,000 runs on a loaded CI machine can take seconds,
// so test clients wait longer than a production client would.
const ReadTimeout = time.Minute

// Cluster returns a client for a real Redis Cluster, a *redis.ClusterClient:
// the nodes in REDIS_CLUSTER_ADDRS if set, otherwise a cluster of three
// redis-servers shared by this test binary, each the master of a third of the
// slots (see [NodeOf] for which one serves a key). Skips or fails like [Real].
func Cluster(t testing.TB) redis.UniversalClient {
	t.Helper()
	d := need(t, clustered)
	return connect(t, redis.NewClusterClient(&redis.ClusterOptions{Addrs: d.addrs, ReadTimeout: ReadTimeout}))
}

// Source says where this test binary's [Real] Redis came from. It starts
// with one of three words: "spawned" (a redis-server from PATH: "spawned
// redis-server 7.0.15 (/usr/bin/redis-server)"), "REDIS_URL" ("REDIS_URL:
// redis 7.2.4 at host:port") or "testcontainers" ("testcontainers:
// redis:7.0, redis 7.0.15 at host:port"). It is "" when no test has asked
// for one, or none could be had.
func Source() string { return standalone.source() }

// ClusterSource is [Source] for [Cluster]: "spawned 3-node cluster of
// redis-server 7.0.15 (/usr/bin/redis-server)", "REDIS_CLUSTER_ADDRS:
// host:port,..." or "".
func ClusterSource() string { return clustered.source() }

// Prefix returns a short key prefix unique to the caller, "t" followed by 8
// lowercase hex digits. It holds only [a-z0-9], so it fits in any key and
// inside a {hash tag}.
//
// When t ends without failing, the keys that hold the prefix in a hash tag
// or its start ("{<prefix>...") are removed (UNLINK) from the shared [Real]
// and [Cluster] servers, if this binary has used them; a failed test's keys
// stay for a look (unless it failed in a cleanup registered before Prefix,
// which runs after this one). So the shared keyspace
// holds the keys of the tests still running: a test that lists its own keys
// (SCAN MATCH) walks every key of the server, and with the keys of every
// finished test left in place such SCANs were 40% of the shared server's
// time in ./runqueue's tests (73.6 of 187 s of Redis CPU, 2026-12-07).
// [Private] servers are left alone: tests count their commands.
func Prefix(t testing.TB) string {
	t.Helper()
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	p := "t" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		if !t.Failed() {
			forget(p)
		}
	})
	return p
}

// forget removes, best effort, the keys holding prefix in a hash tag or
// its start ("{t1a2b3c4d:0}...", "{t1a2b3c4d}...": every key a runqueue
// Config.Prefix makes) from the shared servers this binary started or
// found (errors are ignored: the keys only cost the SCANs of later tests).
// The pattern is anchored there: on a server other work shares, a key that
// merely contains the prefix's 9 characters is not the test's. It talks to
// each node with a client of its own that it closes (a client kept between
// tests would leave goroutines running where tests check for leaks): the
// nodes of a spawned cluster are its masters; REDIS_CLUSTER_ADDRS may list
// only some, so a cluster client finds the masters there.
func forget(prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pattern := "{" + prefix + "*"
	for _, s := range []*shared{standalone, clustered} {
		d := s.ready.Load()
		if d == nil {
			continue // not started: nothing of this binary's there
		}
		if s == clustered && !strings.HasPrefix(d.source, "spawned") {
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: d.addrs, ReadTimeout: 5 * time.Second})
			_ = c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
				return unlinkMatching(ctx, n, pattern, true)
			})
			_ = c.Close()
			continue
		}
		for _, addr := range d.addrs {
			opt := &redis.Options{Addr: addr}
			if d.opt != nil {
				opt = new(*d.opt)
			}
			opt.ReadTimeout = 5 * time.Second
			c := redis.NewClient(opt)
			_ = unlinkMatching(ctx, c, pattern, s == clustered)
			_ = c.Close()
		}
	}
}

// unlinkMatching unlinks the keys of one server that match pattern; a
// cluster node's one by one (keys of different slots cannot share a
// command), in one pipeline (a key whose slot moved away is left).
func unlinkMatching(ctx context.Context, c *redis.Client, pattern string, cluster bool) error {
	var ks []string
	iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		ks = append(ks, iter.Val())
	}
	if err := iter.Err(); err != nil || len(ks) == 0 {
		return err
	}
	if !cluster {
		for len(ks) > 0 {
			n := min(len(ks), 500)
			if err := c.Unlink(ctx, ks[:n]...).Err(); err != nil {
				return err
			}
			ks = ks[n:]
		}
		return nil
	}
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range ks {
			p.Unlink(ctx, k)
		}
		return nil
	})
	return err
}

// Main runs the tests, stops the Redis servers they started and exits with
// the tests' status. Call it from TestMain.
func Main(m *testing.M) {
	os.Exit(Wrap(m).Run())
}

// Wrap returns m with a Run that also stops the Redis servers the tests
// started, for a TestMain that hands m to something else that exits, such as
// goleak.VerifyTestMain. The servers stop before goleak looks for goroutines.
func Wrap(m *testing.M) interface{ Run() int } {
	return stopping{m}
}

type stopping struct{ m *testing.M }

func (s stopping) Run() int {
	defer standalone.stop()
	defer clustered.stop()
	defer private.stop()
	code := s.m.Run()
	if line := sourcesLine(); line != "" {
		fmt.Fprintln(os.Stderr, line)
	}
	return code
}

// sourcesLine is the line Main prints about the real Redis the tests used,
// or "" when they used none.
func sourcesLine() string {
	var used []string
	if src := Source(); src != "" {
		used = append(used, "Real: "+src)
	}
	if src := ClusterSource(); src != "" {
		used = append(used, "Cluster: "+src)
	}
	if src := private.source(); src != "" {
		used = append(used, "Private: "+src)
	}
	if len(used) == 0 {
		return ""
	}
	return "redistest: " + strings.Join(used, "; ")
}

// connect registers c's Close with t and checks that the server answers, so
// that a wrong REDIS_URL fails with one clear message.
func connect(t testing.TB, c redis.UniversalClient) redis.UniversalClient {
	t.Helper()
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("redistest: PING: %v", err)
	}
	return c
}

// need returns the deployment of s, starting it if this is its first use.
func need(t testing.TB, s *shared) *deployment {
	t.Helper()
	d, err := s.get()
	switch {
	case errors.Is(err, errMissing):
		t.Logf("redistest: %v", err)
		unavailable(t)
	case err != nil:
		t.Fatalf("redistest: %v", err)
	}
	return d
}

// unavailable skips t, or fails it when the environment demands a real Redis.
func unavailable(t testing.TB) {
	t.Helper()
	const msg = "redistest: test needs a real Redis: set REDIS_URL / REDIS_CLUSTER_ADDRS, install redis-server (on PATH) or, for Real only, run a Docker engine (testcontainers)"
	if os.Getenv("RUNQUEUE_REQUIRE_REDIS") == "1" {
		t.Fatalf("%s (RUNQUEUE_REQUIRE_REDIS=1)", msg)
		return // only reached with a stand-in testing.TB
	}
	t.Skip(msg)
}

var errMissing = errors.New("redis-server is not on PATH")

// The Redis deployments shared by the tests of one binary.
var (
	standalone = &shared{start: startReal}
	clustered  = &shared{start: startClustered}
	private    = &shared{start: startPrivate}
)

// shared is a Redis deployment started, or found, at most once per test
// binary.
type shared struct {
	start func() (*deployment, error)

	once  sync.Once
	dep   *deployment
	err   error
	ready atomic.Pointer[deployment] // dep once started: read by forget while tests run

	mu  sync.Mutex // guards src, which source reads while tests run
	src string
}

// deployment is a Redis the tests use: its node addresses, the options of a
// client of a REDIS_URL or container server (nil: only Addr), where it came
// from and how to stop it.
type deployment struct {
	addrs  []string
	opt    *redis.Options
	source string
	stop   func()
}

func (s *shared) get() (*deployment, error) {
	s.once.Do(func() {
		s.dep, s.err = s.start()
		if s.err == nil {
			s.mu.Lock()
			s.src = s.dep.source
			s.mu.Unlock()
			s.ready.Store(s.dep)
		}
	})
	return s.dep, s.err
}

func (s *shared) source() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.src
}

// stop stops the deployment, if it was started. It runs after all tests, so
// nothing races with get.
func (s *shared) stop() {
	s.ready.Store(nil)
	if s.dep != nil {
		s.dep.stop()
		s.dep = nil
	}
}

// CmdStat is one command's line of INFO commandstats.
type CmdStat struct {
	Calls int64
	Usec  int64 // total microseconds spent in the command
}

func (a CmdStat) add(b CmdStat) CmdStat { return CmdStat{a.Calls + b.Calls, a.Usec + b.Usec} }

// Stats maps a command name as Redis 7 spells it in INFO commandstats
// ("zadd", "evalsha", "script|load") to its statistics.
//
// The statistics are server-wide: measure only where no other client is busy
// on the same server. Tests of one binary share their server, and parallel
// tests only start once every sequential top-level test has finished, so a
// sequential test measures alone on a spawned server; on a REDIS_URL server
// used by other processes it does not.
type Stats map[string]CmdStat

// CommandStats reads INFO commandstats; on a cluster client it sums every
// master's.
func CommandStats(ctx context.Context, c redis.UniversalClient) (Stats, error) {
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		return nodeStats(ctx, c)
	}
	var mu sync.Mutex
	sum := Stats{}
	err := cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		s, err := nodeStats(ctx, n)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for name, st := range s {
			sum[name] = sum[name].add(st)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return sum, nil
}

// ResetStats runs CONFIG RESETSTAT; on a cluster client, on every master.
func ResetStats(ctx context.Context, c redis.UniversalClient) error {
	if cc, ok := c.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			return n.ConfigResetStat(ctx).Err()
		})
	}
	return c.ConfigResetStat(ctx).Err()
}

func nodeStats(ctx context.Context, c redis.Cmdable) (Stats, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, fmt.Errorf("INFO commandstats: %w", err)
	}
	return parseCommandStats(info)
}

// parseCommandStats parses lines such as
// "cmdstat_zadd:calls=12,usec=34,usec_per_call=2.83,rejected_calls=0,failed_calls=0".
func parseCommandStats(info string) (Stats, error) {
	s := Stats{}
	for line := range strings.Lines(info) {
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue // blank line or "# Commandstats" header
		}
		name, ok = strings.CutPrefix(name, "cmdstat_")
		if !ok {
			continue
		}
		var st CmdStat
		for field := range strings.SplitSeq(fields, ",") {
			key, val, _ := strings.Cut(field, "=")
			var dst *int64
			switch key {
			case "calls":
				dst = &st.Calls
			case "usec":
				dst = &st.Usec
			default:
				continue
			}
			n, err := strconv.ParseInt(val, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("commandstats line %q: %w", line, err)
			}
			*dst = n
		}
		s[name] = st
	}
	return s, nil
}

// Sub returns s minus before, keeping only the commands whose calls changed.
func (s Stats) Sub(before Stats) Stats {
	d := Stats{}
	for name, st := range s {
		b := before[name]
		if st.Calls != b.Calls {
			d[name] = CmdStat{st.Calls - b.Calls, st.Usec - b.Usec}
		}
	}
	return d
}

// Total sums every command except the measuring and connection overhead
// (INFO, PING, CONFIG, CLIENT, HELLO, CLUSTER, COMMAND, ...). A command run by
// a script is counted both on its own line and inside the script's usec, so
// Total().Usec counts script time twice; compare Calls, or Commands and
// Scripts separately.
func (s Stats) Total() CmdStat {
	return s.sum(func(name string) bool { return !overhead(name) })
}

// Commands sums the data commands: Total without the script invocations and
// the SCRIPT/FUNCTION admin commands. When the work is done in Lua, these are
// the redis.call()s the scripts made.
func (s Stats) Commands() CmdStat {
	return s.sum(func(name string) bool { return !overhead(name) && !scripting(name) })
}

// Scripts sums the script invocations: EVAL, EVALSHA, FCALL and their _RO
// forms, each counted once however many commands the script ran.
func (s Stats) Scripts() CmdStat {
	return s.sum(scriptCall)
}

func (s Stats) sum(include func(name string) bool) CmdStat {
	var t CmdStat
	for name, st := range s {
		if include(name) {
			t = t.add(st)
		}
	}
	return t
}

// overhead reports whether the command is one the test harness or go-redis
// sends on its own: measuring, connection setup, cluster topology discovery.
func overhead(name string) bool {
	switch name {
	case "info", "ping", "hello", "auth", "select", "readonly", "readwrite", "quit", "echo":
		return true
	}
	for _, p := range []string{"config|", "client|", "cluster|", "command|"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

func scriptCall(name string) bool {
	switch name {
	case "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro":
		return true
	}
	return false
}

// scripting reports whether the command invokes or manages scripts.
func scripting(name string) bool {
	return scriptCall(name) || strings.HasPrefix(name, "script|") || strings.HasPrefix(name, "function|")
}

// OwnCluster returns a client for a Redis Cluster of three redis-servers
// started for t alone and stopped when t ends: for the tests that move hash
// slots between nodes (a resharding), which would break any other test whose
// keys hash to a moving slot. It needs redis-server on PATH, whatever
// REDIS_CLUSTER_ADDRS says; without it, it skips or fails like [Real].
func OwnCluster(t testing.TB) *redis.ClusterClient {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Logf("redistest: %v (%v)", errMissing, err)
		unavailable(t)
		return nil
	}
	d, err := startCluster(bin)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(d.stop)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: d.addrs, ReadTimeout: ReadTimeout})
	connect(t, c)
	return c
}
