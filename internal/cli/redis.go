package cli

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// defaultRedis is the server used when neither -redis nor REDIS_URL is set.
const defaultRedis = "redis://localhost:6379"

// endpoint is a parsed -redis value: a client and the node addresses to
// name in messages (never the credentials).
type endpoint struct {
	client redis.UniversalClient
	addrs  []string
}

func (e endpoint) String() string { return strings.Join(e.addrs, ",") }

// dial parses a -redis value and returns a client for it (not yet
// connected). Accepted forms:
//
//	redis://[user:password@]host:port[/db][?options]   one server
//	rediss://...                                       one server over TLS
//	unix:///path/to/redis.sock                         one server on a socket
//	redis+cluster://host:port,host:port[?options]      Redis Cluster (rediss+cluster:// for TLS)
//	redis://host:port,host:port                        Redis Cluster: more than one node
//	host:port                                          one server
//	host:port,host:port                                Redis Cluster
//
// Options are go-redis's URL options (dial_timeout, read_timeout, ...).
// dialTimeout applies unless the URL sets dial_timeout.
func dial(raw string, dialTimeout time.Duration) (endpoint, error) {
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return endpoint{}, usagef("-redis is empty")
	}
	scheme, rest, hasScheme := strings.Cut(raw, "://")
	if !hasScheme {
		addrs, err := splitHosts(raw)
		if err != nil {
			return endpoint{}, err
		}
		if len(addrs) == 1 {
			return single(&redis.Options{Addr: addrs[0]}, dialTimeout), nil
		}
		return cluster(&redis.ClusterOptions{Addrs: addrs}, dialTimeout), nil
	}
	base, isCluster := strings.CutSuffix(strings.ToLower(scheme), "+cluster")
	switch {
	case base == "unix" && !isCluster:
		opt, err := redis.ParseURL(raw)
		if err != nil {
			return endpoint{}, usagef("-redis %s: %v", redact(raw), err)
		}
		return single(opt, dialTimeout), nil
	case base != "redis" && base != "rediss":
		return endpoint{}, usagef("-redis %s: unsupported scheme %q (want redis, rediss, redis+cluster, rediss+cluster or unix)",
			redact(raw), scheme)
	}
	// The authority (userinfo@hosts) ends at the path or the query.
	authority, tail := rest, ""
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		authority, tail = rest[:i], rest[i:]
	}
	userinfo, hosts := "", authority
	if i := strings.LastIndex(authority, "@"); i >= 0 {
		userinfo, hosts = authority[:i+1], authority[i+1:]
	}
	addrs, err := splitHosts(hosts)
	if err != nil {
		return endpoint{}, err
	}
	if !isCluster && len(addrs) == 1 {
		opt, err := redis.ParseURL(base + "://" + rest)
		if err != nil {
			return endpoint{}, usagef("-redis %s: %v", redact(raw), err)
		}
		return single(opt, dialTimeout), nil
	}
	// go-redis spells a cluster as one host plus addr= query parameters.
	u, err := url.Parse(base + "://" + userinfo + addrs[0] + tail)
	if err != nil {
		return endpoint{}, usagef("-redis %s: %v", redact(raw), err)
	}
	q := u.Query()
	for _, a := range addrs[1:] {
		q.Add("addr", a)
	}
	u.RawQuery = q.Encode()
	opt, err := redis.ParseClusterURL(u.String())
	if err != nil {
		return endpoint{}, usagef("-redis %s: %v", redact(raw), err)
	}
	return cluster(opt, dialTimeout), nil
}

// splitHosts splits a comma-separated host list; every entry must be there.
func splitHosts(s string) ([]string, error) {
	var out []string
	for h := range strings.SplitSeq(s, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			return nil, usagef("-redis: empty address in %q", s)
		}
		out = append(out, h)
	}
	return out, nil
}

// A command line tool fails fast: dials give up after dialTimeout, and a
// refused dial is tried once more, not five times.
func single(opt *redis.Options, dialTimeout time.Duration) endpoint {
	if opt.DialTimeout == 0 {
		opt.DialTimeout = dialTimeout
	}
	opt.DialerRetries = 1
	opt.ContextTimeoutEnabled = true // -timeout bounds every read
	addr := opt.Addr
	if opt.Network == "unix" {
		addr = "unix:" + addr
	}
	return endpoint{client: redis.NewClient(opt), addrs: []string{addr}}
}

func cluster(opt *redis.ClusterOptions, dialTimeout time.Duration) endpoint {
	if opt.DialTimeout == 0 {
		opt.DialTimeout = dialTimeout
	}
	opt.DialerRetries = 1
	opt.ContextTimeoutEnabled = true
	return endpoint{client: redis.NewClusterClient(opt), addrs: append([]string(nil), opt.Addrs...)}
}

// redact hides the password of a URL for messages.
func redact(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		return u.Redacted()
	}
	if i := strings.LastIndex(raw, "@"); i >= 0 {
		if j := strings.Index(raw, "://"); j >= 0 && j < i {
			return raw[:j+3] + "xxxxx" + raw[i:]
		}
	}
	return raw
}

// ping checks that the endpoint answers within dialTimeout, so that an
// unreachable Redis is one clear message naming it rather than a timeout
// deep inside a command.
func ping(ctx context.Context, e endpoint, dialTimeout time.Duration) error {
	// Room for the dial and one round trip.
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, dialTimeout+time.Second)
	defer cancel()
	err := e.client.Ping(ctx).Err()
	if err == nil {
		return nil
	}
	if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
		waited := time.Since(start).Round(100 * time.Millisecond)
		return &unreachableError{addr: e.String(), err: fmt.Errorf("no answer within %v (%v)", waited, err)}
	}
	return &unreachableError{addr: e.String(), err: err}
}

// unreachableError: the Redis named by -redis did not answer.
type unreachableError struct {
	addr string
	err  error
}

func (e *unreachableError) Error() string {
	return fmt.Sprintf("cannot reach Redis at %s: %v", e.addr, e.err)
}

func (e *unreachableError) Unwrap() error { return e.err }
