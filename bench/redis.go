package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// connect opens a client on url and checks that the server answers.
func connect(ctx context.Context, url string) (*redis.Client, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("-redis %q: %w", url, err)
	}
	// The throughput section runs a dozen goroutines and the sweep fills
	// with 16; keep a connection for each.
	opt.PoolSize = max(opt.PoolSize, 64)
	c := redis.NewClient(opt)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := c.Ping(pctx).Err(); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("connecting to %s: %w", opt.Addr, err)
	}
	return c, nil
}

// checkEmpty refuses a database that holds keys unless force: the bench
// writes and deletes many keys and reads server-wide statistics, which is
// no business of a database in use.
func checkEmpty(ctx context.Context, c *redis.Client, force bool) error {
	n, err := c.DBSize(ctx).Result()
	if err != nil {
		return fmt.Errorf("DBSIZE: %w", err)
	}
	if n > 0 && !force {
		o := c.Options()
		return fmt.Errorf("database %d at %s holds %d keys; the bench writes only under its own prefix and removes "+
			"its keys afterwards, but it refuses a non-empty database unless -force is given", o.DB, o.Addr, n)
	}
	return nil
}

func redisVersion(ctx context.Context, c *redis.Client) (string, error) {
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return "", fmt.Errorf("INFO server: %w", err)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v, nil
		}
	}
	return "", nil
}

// keyspace hands out the key prefixes of one bench run: base + "." + n,
// where base is "bench" and 12 random hex digits. Every key runqueue writes
// under prefix p starts with the hash tag "{p:", so the run's keys are
// exactly those matching "{base.*" and no other client's key can match.
type keyspace struct {
	c    *redis.Client
	base string

	mu   sync.Mutex
	next int
}

func newKeyspace(c *redis.Client) *keyspace {
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
// the server never blocks on a KEYS.
func deleteMatching(ctx context.Context, c *redis.Client, pattern string) error {
	var cursor uint64
	for {
		batch, next, err := c.Scan(ctx, cursor, pattern, 1000).Result()
		if err != nil {
			return err
		}
		if len(batch) > 0 {
			if err := c.Unlink(ctx, batch...).Err(); err != nil {
				return err
			}
		}
		if cursor = next; cursor == 0 {
			return nil
		}
	}
}
