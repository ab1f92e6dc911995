package runqueue

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func namesQueue(t *testing.T, on bool) *Queue {
	t.Helper()
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	q, err := New(context.Background(), c, &Config{Prefix: "nm", Shards: 4, VtimeScheduling: on})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	return q
}

// TestNamesMatchKeys: the cached names of a queue are the names keys builds
// for it, and a second lookup returns the same entry.
func TestNamesMatchKeys(t *testing.T) {
	q := namesQueue(t, true)
	for _, ref := range [][2]string{{"env", "q"}, {"e v/%", "q:1{x}"}, {"", "q"}, {"env", ""}} {
		n := q.names(ref[0], ref[1])
		qk := q.space.Env(ref[0]).Queue(ref[1])
		require.Equal(t, qk, n.qk)
		require.Equal(t, placeKeys(qk, qk.TTL()), n.place)
		require.Equal(t, []string{qk.CkIndex(), qk.DelayIndex(), qk.Depth(), qk.Master(), qk.Leases(),
			qk.Env.InflightCount(), qk.Held(), qk.Runs(), qk.KeyInflight(), qk.Tokens(), qk.TTL()}, n.dequeue)
		require.Equal(t, q.heldKeys(qk), n.held)
		require.Equal(t, q.vtimeKeys(qk), n.vtime)
		require.Equal(t, []string{qk.Member(), qk.VariantBase(), qk.Wake(), qk.RunPrefix()},
			[]string{n.member, n.vbase, n.wake, n.runPrefix})
		require.Same(t, n, q.names(ref[0], ref[1]))
	}
}

// TestNamesCacheBounded: the cache never holds more than nameCacheMax
// queues, and a queue looked up after it started again gets right names.
func TestNamesCacheBounded(t *testing.T) {
	q := namesQueue(t, false)
	for i := range nameCacheMax + 100 {
		q.names("env", fmt.Sprint("q", i))
		require.LessOrEqual(t, len(q.nameCache.m), nameCacheMax)
	}
	require.Equal(t, q.space.Env("env").Queue("q0").Runs(), q.names("env", "q0").qk.Runs())

	// Long names fill the byte bound first; the count of bytes is exact.
	long := strings.Repeat("%", MaxNameBytes-4)
	for i := range 2000 {
		q.names(fmt.Sprintf("%04d", i)+long, long)
		c := &q.nameCache
		require.LessOrEqual(t, c.bytes, nameCacheBytes)
		if i%250 == 0 {
			sum := 0
			for _, n := range c.m {
				sum += n.size()
			}
			require.Equal(t, sum, c.bytes)
		}
	}
	require.Less(t, len(q.nameCache.m), 2000, "the byte bound started the cache again")
}

// TestNamesSharedSlicesStayPut: every call appends its own keys and
// arguments to copies; the shared slices are clipped and unchanged after
// enqueues, dequeues, acks and nacks with the flag on (which append the
// scheduler's keys), from many goroutines at once.
func TestNamesSharedSlicesStayPut(t *testing.T) {
	q := namesQueue(t, true)
	ctx := context.Background()
	n := q.names("env", "q")
	want := [][]string{slices.Clone(n.place), slices.Clone(n.dequeue), slices.Clone(n.held), slices.Clone(n.vtime)}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 20 {
				_, err := q.Enqueue(ctx, EnqueueParams{Env: "env", Queue: "q", Key: fmt.Sprint("k", i%3), ID: fmt.Sprint(g, "-", i)})
				if err != nil {
					t.Error(err)
					return
				}
				runs, err := q.Dequeue(ctx, "env", "q", 2)
				if err != nil {
					t.Error(err)
					return
				}
				for j, r := range runs {
					if j%2 == 0 {
						err = q.Ack(ctx, r)
					} else {
						_, err = q.Nack(ctx, r, nil)
					}
					if err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	for i, s := range [][]string{n.place, n.dequeue, n.held, n.vtime} {
		require.Equal(t, want[i], s)
		require.Equal(t, len(s), cap(s), "slice %d must be clipped", i)
	}
}
