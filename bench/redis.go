package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/keys"
)

// target is where -redis points: one server, or the nodes of a Redis
// Cluster (any of them: the client discovers the rest).
type target struct {
	single  *redis.Options
	cluster *redis.ClusterOptions
}

// Schemes of a Redis Cluster URL. go-redis has no scheme for a cluster (its
// ParseClusterURL takes redis://first?addr=second&addr=third); these spell
// the nodes as the host list of one URL.
const (
	clusterScheme    = "redis+cluster://"
	clusterTLSScheme = "rediss+cluster://"
)

// parseTarget reads the -redis value: a redis:// or rediss:// URL is one
// server; redis+cluster://[user:password@]host:port,host:port[?options] or
// a bare host:port,host:port list is a Redis Cluster.
func parseTarget(s string) (target, error) {
	if scheme, ok := clusterURLScheme(s); ok {
		opt, err := parseClusterURL(scheme, strings.TrimPrefix(s, scheme+"+cluster://"))
		if err != nil {
			return target{}, fmt.Errorf("-redis %q: %w", s, err)
		}
		return target{cluster: opt}, nil
	}
	if !strings.Contains(s, "://") && strings.Contains(s, ",") {
		addrs := splitList(s)
		for _, a := range addrs {
			if _, _, err := net.SplitHostPort(a); err != nil {
				return target{}, fmt.Errorf("-redis %q: cluster node %q is not host:port", s, a)
			}
		}
		return target{cluster: &redis.ClusterOptions{Addrs: addrs}}, nil
	}
	opt, err := redis.ParseURL(s)
	if err != nil {
		if !strings.Contains(s, "://") {
			err = fmt.Errorf("%w (one server: redis://%s; a cluster: %s%s or several host:port separated by commas)", err, s, clusterScheme, s)
		}
		return target{}, fmt.Errorf("-redis %q: %w", s, err)
	}
	return target{single: opt}, nil
}

func clusterURLScheme(s string) (string, bool) {
	switch {
	case strings.HasPrefix(s, clusterScheme):
		return "redis", true
	case strings.HasPrefix(s, clusterTLSScheme):
		return "rediss", true
	}
	return "", false
}

// parseClusterURL parses rest, "[user:password@]host:port,host:port[/0][?options]",
// by handing go-redis the URL it reads: scheme://[user:password@]first?options&addr=second&...
func parseClusterURL(scheme, rest string) (*redis.ClusterOptions, error) {
	rest, query, _ := strings.Cut(rest, "?")
	rest, db, _ := strings.Cut(rest, "/")
	if db != "" && db != "0" {
		return nil, fmt.Errorf("a Redis Cluster has only database 0, not %q", db)
	}
	userinfo := ""
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		userinfo, rest = rest[:at+1], rest[at+1:]
	}
	addrs := splitList(rest)
	if len(addrs) == 0 {
		return nil, errors.New("no node address")
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return nil, err
	}
	for _, a := range addrs[1:] {
		q.Add("addr", a)
	}
	u := scheme + "://" + userinfo + addrs[0]
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	return redis.ParseClusterURL(u)
}

// connect opens a client on t, a *redis.Client or a *redis.ClusterClient,
// and checks that the server (every node it knows of a cluster) answers.
func connect(ctx context.Context, t target) (redis.UniversalClient, error) {
	var c redis.UniversalClient
	var where string
	// The throughput section runs a dozen goroutines and the sweep fills
	// with 16; keep a connection for each (on a cluster, for each node).
	if t.cluster != nil {
		opt := *t.cluster
		opt.PoolSize = max(opt.PoolSize, 64)
		c, where = redis.NewClusterClient(&opt), "the cluster at "+strings.Join(opt.Addrs, ",")
	} else {
		opt := *t.single
		opt.PoolSize = max(opt.PoolSize, 64)
		c, where = redis.NewClient(&opt), opt.Addr
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := c.Ping(pctx).Err()
	if cc, ok := c.(*redis.ClusterClient); ok && err == nil {
		err = cc.ForEachShard(pctx, func(ctx context.Context, n *redis.Client) error { return n.Ping(ctx).Err() })
	}
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("connecting to %s: %w", where, err)
	}
	return c, nil
}

// forEachNode calls fn on every master of a cluster client, in turn, or on
// c itself.
func forEachNode(ctx context.Context, c redis.UniversalClient, fn func(ctx context.Context, n *redis.Client) error) error {
	switch c := c.(type) {
	case *redis.Client:
		return fn(ctx, c)
	case *redis.ClusterClient:
		var mu sync.Mutex
		return c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			return fn(ctx, n)
		})
	}
	return fmt.Errorf("unsupported Redis client %T", c)
}

// checkEmpty refuses a database (every master of a cluster) that holds
// keys unless force: the bench writes and deletes many keys and reads
// server-wide statistics, which is no business of a database in use.
func checkEmpty(ctx context.Context, c redis.UniversalClient, force bool) error {
	var n int64
	var where []string
	err := forEachNode(ctx, c, func(ctx context.Context, node *redis.Client) error {
		k, err := node.DBSize(ctx).Result()
		if err != nil {
			return fmt.Errorf("DBSIZE on %s: %w", node.Options().Addr, err)
		}
		n += k
		where = append(where, node.Options().Addr)
		return nil
	})
	if err != nil {
		return err
	}
	if n > 0 && !force {
		slices.Sort(where)
		what := "the cluster at " + strings.Join(where, ",")
		if one, ok := c.(*redis.Client); ok {
			what = fmt.Sprintf("database %d at %s", one.Options().DB, one.Options().Addr)
		}
		return fmt.Errorf("%s holds %d keys; the bench writes only under its own prefix and removes "+
			"its keys afterwards, but it refuses a non-empty database unless -force is given", what, n)
	}
	return nil
}

// redisVersion returns the server's redis_version; on a cluster, the
// masters' (all of them, if they differ).
func redisVersion(ctx context.Context, c redis.UniversalClient) (string, error) {
	var versions []string
	err := forEachNode(ctx, c, func(ctx context.Context, n *redis.Client) error {
		info, err := n.Info(ctx, "server").Result()
		if err != nil {
			return fmt.Errorf("INFO server: %w", err)
		}
		for line := range strings.Lines(info) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok && !slices.Contains(versions, v) {
				versions = append(versions, v)
			}
		}
		return nil
	})
	slices.Sort(versions)
	return strings.Join(versions, ", "), err
}

// keyspace hands out the key prefixes of one bench run: base + "." + n,
// where base is "bench" and 12 random hex digits. Every key runqueue writes
// under prefix p starts with the hash tag "{p:", so the run's keys are
// exactly those matching "{base.*" and no other client's key can match.
type keyspace struct {
	c    redis.UniversalClient
	base string

	mu   sync.Mutex
	next int
}

func newKeyspace(c redis.UniversalClient) *keyspace {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return &keyspace{c: c, base: "bench" + hex.EncodeToString(b[:])}
}

// prefix returns a fresh prefix for one measurement.
func (k *keyspace) prefix() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.next++
	return fmt.Sprintf("%s.%d", k.base, k.next)
}

// cleanup deletes every key of prefix p (made by k.prefix).
func (k *keyspace) cleanup(ctx context.Context, p string) error {
	return deleteMatching(ctx, k.c, "{"+p+":*")
}

// cleanupAll deletes every key of the run.
func (k *keyspace) cleanupAll(ctx context.Context) error {
	return deleteMatching(ctx, k.c, "{"+k.base+".*")
}

// deleteMatching UNLINKs the keys matching pattern, found with SCAN so that
// the server never blocks on a KEYS; on a cluster, on every master, one
// UNLINK per hash slot (a command's keys must share one).
func deleteMatching(ctx context.Context, c redis.UniversalClient, pattern string) error {
	_, cluster := c.(*redis.ClusterClient)
	return forEachNode(ctx, c, func(ctx context.Context, n *redis.Client) error {
		var cursor uint64
		for {
			batch, next, err := n.Scan(ctx, cursor, pattern, 1000).Result()
			if err != nil {
				return err
			}
			groups := [][]string{batch}
			if cluster {
				groups = bySlot(batch)
			}
			for _, g := range groups {
				if len(g) == 0 {
					continue
				}
				if err := n.Unlink(ctx, g...).Err(); err != nil {
					return err
				}
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	})
}

// bySlot groups ks by their Redis Cluster hash slot.
func bySlot(ks []string) [][]string {
	m := map[int][]string{}
	for _, k := range ks {
		s := keys.Slot(k)
		m[s] = append(m[s], k)
	}
	out := make([][]string, 0, len(m))
	for _, g := range m {
		out = append(out, g)
	}
	return out
}

// runqueueLibrary is the name of a runqueue Functions library (runqueue_
// and 16 hex digits of its code's SHA-1). A flag-on Queue loads its own,
// server-wide, and deletes the others when it opens.
var runqueueLibrary = regexp.MustCompile(`^runqueue_[0-9a-f]{16}$`)

// runqueueLibraries lists the runqueue Functions libraries of each node
// (every master of a cluster), by address. A node that refuses FUNCTION
// LIST (Redis before 7.0, an ACL) lists none: runqueue cannot prune there.
func runqueueLibraries(ctx context.Context, c redis.UniversalClient) (map[string][]string, error) {
	out := map[string][]string{}
	err := forEachNode(ctx, c, func(ctx context.Context, n *redis.Client) error {
		libs, err := n.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: "runqueue_*"}).Result()
		var reply redis.Error
		if errors.As(err, &reply) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("FUNCTION LIST on %s: %w", n.Options().Addr, err)
		}
		for _, l := range libs {
			if runqueueLibrary.MatchString(l.Name) {
				out[n.Options().Addr] = append(out[n.Options().Addr], l.Name)
			}
		}
		return nil
	})
	return out, err
}

// checkLibraries refuses a server that holds runqueue Functions libraries
// unless force: the bench's flag-on queues would delete those of other
// runqueue versions, from under the programs that use them.
func checkLibraries(libs map[string][]string, force bool) error {
	var names []string
	for _, ls := range libs {
		for _, l := range ls {
			if !slices.Contains(names, l) {
				names = append(names, l)
			}
		}
	}
	if len(names) == 0 || force {
		return nil
	}
	slices.Sort(names)
	return fmt.Errorf("the server holds the runqueue Functions libraries %s: a flag-on Queue deletes the libraries of other "+
		"runqueue versions when it opens, so the bench would delete them from under the programs that use them; "+
		"it refuses such a server unless -force is given", strings.Join(names, ", "))
}

// dropLibraries deletes the runqueue Functions libraries that a node holds
// now and did not hold before (before: runqueueLibraries at the start):
// those the bench's queues loaded.
func dropLibraries(ctx context.Context, c redis.UniversalClient, before map[string][]string) error {
	now, err := runqueueLibraries(ctx, c)
	if err != nil {
		return err
	}
	return forEachNode(ctx, c, func(ctx context.Context, n *redis.Client) error {
		addr := n.Options().Addr
		for _, l := range now[addr] {
			if slices.Contains(before[addr], l) {
				continue
			}
			if err := n.FunctionDelete(ctx, l).Err(); err != nil {
				return fmt.Errorf("FUNCTION DELETE %s on %s: %w", l, addr, err)
			}
		}
		return nil
	})
}
