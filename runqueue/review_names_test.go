package runqueue

import (
	"bytes"
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
	"github.com/runqueue/runqueue/keys"
)

// reviewNamesQueue is a Queue on a real Redis under a fresh prefix.
func reviewNamesQueue(t *testing.T, c redis.UniversalClient, on bool) *Queue {
	t.Helper()
	q, err := New(context.Background(), c, &Config{Prefix: redistest.Prefix(t), Shards: 4, VtimeScheduling: on,
		Clock: fixedClock{time.UnixMilli(2_000_000_000_000)}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	return q
}

// reviewFillNames leaves the name cache one entry short of full, so the
// second queue a call looks up starts it again.
func reviewFillNames(q *Queue) {
	q.nameCache.mu.Lock()
	q.nameCache.m = nil
	q.nameCache.mu.Unlock()
	for i := range nameCacheMax - 1 {
		q.names("filler", fmt.Sprint("q", i))
	}
}

// TestReviewNamesResetSplitsBatches: the name cache starting again in the
// middle of one EnqueueMany / AckMany gives a queue two entries (two
// batches, two script calls). Every run must still get the answer it gets
// in one batch: an idempotent repeat is a no-op, another body a conflict,
// an ack sent twice finds the run gone, a stale token loses.
func TestReviewNamesResetSplitsBatches(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprint("flag=", on), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			q := reviewNamesQueue(t, redistest.Real(t), on)

			reviewFillNames(q)
			ps := []EnqueueParams{
				{Env: "env", Queue: "a", Key: "k", ID: "r1", Payload: []byte("x")}, // fills the cache
				{Env: "env", Queue: "b", Key: "k", ID: "b1", Payload: []byte("y")}, // starts it again
				{Env: "env", Queue: "a", Key: "k", ID: "r1", Payload: []byte("x")}, // a second batch of a
				{Env: "env", Queue: "a", Key: "k", ID: "r1", Payload: []byte("other")},
				{Env: "env", Queue: "a", Key: "j", ID: "r2", Payload: []byte("z")},
			}
			res, err := q.EnqueueMany(ctx, ps)
			require.NoError(t, err, "per-run errors are in the results")
			require.Len(t, q.nameCache.m, 2, "the cache did not start again inside the call")
			require.Equal(t, EnqueueResult{Queued: true}, res[0])
			require.Equal(t, EnqueueResult{Queued: true}, res[1])
			require.Equal(t, EnqueueResult{}, res[2], "an idempotent repeat in the second batch")
			require.False(t, res[3].Queued)
			require.ErrorIs(t, res[3].Err, ErrConflict)
			require.Equal(t, EnqueueResult{Queued: true}, res[4])
			s, err := q.QueueStats(ctx, "env", "a")
			require.NoError(t, err)
			require.Equal(t, int64(2), s.Ready)

			ra, err := q.Dequeue(ctx, "env", "a", 10)
			require.NoError(t, err)
			require.Len(t, ra, 2)
			slices.SortFunc(ra, func(x, y *Run) int { return bytes.Compare([]byte(x.ID), []byte(y.ID)) })
			require.Equal(t, "x", string(ra[0].Payload))
			rb, err := q.Dequeue(ctx, "env", "b", 10)
			require.NoError(t, err)
			require.Len(t, rb, 1)

			reviewFillNames(q)
			stale := *ra[1]
			stale.Token++
			errs, err := q.AckMany(ctx, []*Run{ra[0], rb[0], ra[0], &stale, ra[1]})
			require.NoError(t, err)
			require.Len(t, q.nameCache.m, 2, "the cache did not start again inside the call")
			require.NoError(t, errs[0])
			require.NoError(t, errs[1])
			require.NoError(t, errs[2], "an ack sent twice finds the run gone")
			require.ErrorIs(t, errs[3], ErrLeaseLost)
			require.NoError(t, errs[4])
			for _, queue := range []string{"a", "b"} {
				s, err := q.QueueStats(ctx, "env", queue)
				require.NoError(t, err)
				require.Equal(t, Stats{}, s, queue)
			}
		})
	}
}

// TestReviewNamesChurn: calls on a few queues from many goroutines while
// another goroutine keeps the name cache starting again (-race): every run
// is delivered and acked once, and the queues end empty.
func TestReviewNamesChurn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := reviewNamesQueue(t, redistest.Real(t), true)
	stop := make(chan struct{})
	var churn sync.WaitGroup
	churn.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			q.names("churn", fmt.Sprint(i))
		}
	})
	const perQueue = 60
	queues := []string{"a", "b", "c"}
	var acked atomic.Int64
	var wg sync.WaitGroup
	for g, queue := range queues {
		wg.Go(func() {
			for i := range perQueue {
				_, err := q.Enqueue(ctx, EnqueueParams{Env: fmt.Sprint("e", g%2), Queue: queue, Key: fmt.Sprint("k", i%4), ID: fmt.Sprint(i)})
				if err != nil {
					t.Error(err)
					return
				}
			}
			for done := 0; done < perQueue; {
				runs, err := q.Dequeue(ctx, fmt.Sprint("e", g%2), queue, 7)
				if err != nil {
					t.Error(err)
					return
				}
				errs, err := q.AckMany(ctx, runs)
				if err != nil {
					t.Error(err)
					return
				}
				for _, err := range errs {
					if err != nil {
						t.Error(err)
					}
				}
				done += len(runs)
				acked.Add(int64(len(runs)))
			}
		})
	}
	wg.Wait()
	close(stop)
	churn.Wait()
	require.Equal(t, int64(perQueue*len(queues)), acked.Load())
	for g, queue := range queues {
		s, err := q.QueueStats(ctx, fmt.Sprint("e", g%2), queue)
		require.NoError(t, err)
		require.Equal(t, Stats{}, s)
	}
}

// TestReviewNamesSplitPairs: (env, queue) pairs whose names joined would
// read alike ("a:b"+"c" and "a"+"b:c") have names and runs of their own.
func TestReviewNamesSplitPairs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := reviewNamesQueue(t, redistest.Real(t), false)
	pairs := [][2]string{{"a:b", "c"}, {"a", "b:c"}, {"a|b", "c"}, {"a", "b|c"}, {"{a}", "%c"}, {"a b", "c"}}
	for i, p := range pairs {
		_, err := q.Enqueue(ctx, EnqueueParams{Env: p[0], Queue: p[1], ID: fmt.Sprint(i)})
		require.NoError(t, err)
	}
	for i, p := range pairs {
		require.Equal(t, q.space.Env(p[0]).Queue(p[1]), q.names(p[0], p[1]).qk)
		runs, err := q.Dequeue(ctx, p[0], p[1], 10)
		require.NoError(t, err)
		require.Len(t, runs, 1, "%q", p)
		require.Equal(t, fmt.Sprint(i), runs[0].ID)
	}
}

// reviewEnqueueCalls records the ARGV of every enqueue script call.
type reviewEnqueueCalls struct {
	sha  string
	fn   string // the script's library function (flag on, Redis 7)
	mu   sync.Mutex
	args [][]any
}

func (e *reviewEnqueueCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (e *reviewEnqueueCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { e.note(cmd); return next(ctx, cmd) }
}
func (e *reviewEnqueueCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			e.note(cmd)
		}
		return next(ctx, cmds)
	}
}
func (e *reviewEnqueueCalls) note(cmd redis.Cmder) {
	a := cmd.Args()
	if len(a) < 3 || !(cmd.Name() == "evalsha" && a[1] == e.sha || cmd.Name() == "fcall" && a[1] == e.fn) {
		return
	}
	nk := a[2].(int)
	e.mu.Lock()
	e.args = append(e.args, slices.Clone(a[3+nk:]))
	e.mu.Unlock()
}

// TestReviewEnqueueManyLayout: EnqueueMany's calls keep the enqueue
// script's ARGV layout (8 values, then 7 per run, the scheduler's 3 last
// with the flag on) past the 64 runs a call preallocates, at the 1,000-run
// bound, and when the 4 MiB payload bound splits a queue's runs; runs of
// interleaved queues keep their order; every run arrives intact.
func TestReviewEnqueueManyLayout(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprint("flag=", on), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c := redistest.Real(t)
			q := reviewNamesQueue(t, c, on)
			rec := &reviewEnqueueCalls{sha: q.scripts.enqueue.sha, fn: q.scripts.enqueue.fn}
			c.AddHook(rec)

			rng := rand.New(rand.NewPCG(1, 2))
			var ps []EnqueueParams
			// Queue a: 1,150 small runs (1,000 + 150); queue b: 70 runs
			// interleaved (past 64); queue c: 6 runs of 1 MiB - 1 (4 + 2).
			for i := range 1150 {
				ps = append(ps, EnqueueParams{Env: "env", Queue: "a", Key: fmt.Sprint("k", i%7), ID: fmt.Sprint("a", i),
					Payload: fmt.Appendf(nil, "pa%d", i), Priority: i % 5, Delay: time.Duration(i%3) * time.Second})
				if i%16 == 0 && len(ps) < 1300 {
					ps = append(ps, EnqueueParams{Env: "env2", Queue: "b", Key: fmt.Sprint("k", i%3), ID: fmt.Sprint("b", i),
						Payload: fmt.Appendf(nil, "pb%d", i), TTL: time.Hour})
				}
			}
			for i := range 6 {
				p := make([]byte, 1<<20-1)
				for j := range p {
					p[j] = byte(rng.IntN(256))
				}
				ps = append(ps, EnqueueParams{Env: "env", Queue: "c", ID: fmt.Sprint("c", i), Payload: p})
			}
			res, err := q.EnqueueMany(ctx, ps)
			require.NoError(t, err)
			for i, r := range res {
				require.Equal(t, EnqueueResult{Queued: true}, r, "run %d", i)
			}

			extra := 0
			if on {
				extra = 3
			}
			var ids []string
			var sizes []int
			for _, a := range rec.args {
				n := a[enqueueFixedArgs-1].(int)
				require.Len(t, a, enqueueFixedArgs+enqueueRunArgs*n+extra)
				sizes = append(sizes, n)
				for i := range n {
					ids = append(ids, a[enqueueFixedArgs+enqueueRunArgs*i].(string))
				}
			}
			nb := 0
			for _, p := range ps {
				if p.Queue == "b" {
					nb++
				}
			}
			require.Equal(t, []int{1000, nb, 150, 4, 2}, sizes)
			// In each queue, the ids in the order they were given.
			var want []string
			for _, queue := range []string{"a", "b", "c"} {
				var qs []string
				for _, p := range ps {
					if p.Queue == queue {
						qs = append(qs, keys.Segment(p.ID))
					}
				}
				want = append(want, qs...)
			}
			var got []string
			got = append(got, ids[:1000]...)
			got = append(got, ids[1000+nb:1000+nb+150]...)
			got = append(got, ids[1000:1000+nb]...)
			got = append(got, ids[1000+nb+150:]...)
			require.Equal(t, want, got)

			// Every run reads back as given.
			byID := map[string]EnqueueParams{}
			for _, p := range ps {
				byID[p.ID] = p
			}
			for _, ref := range [][2]string{{"env", "a"}, {"env2", "b"}, {"env", "c"}} {
				s, err := q.QueueStats(ctx, ref[0], ref[1])
				require.NoError(t, err)
				total := s.Ready + s.Delayed
				require.Positive(t, total)
				got := 0
				for range 100 {
					runs, err := q.Dequeue(ctx, ref[0], ref[1], 100)
					require.NoError(t, err)
					if len(runs) == 0 {
						break
					}
					for _, r := range runs {
						p := byID[r.ID]
						require.Equal(t, p.Payload, r.Payload, r.ID)
						require.Equal(t, p.Key, r.Key, r.ID)
						require.Equal(t, p.Priority, r.Priority, r.ID)
					}
					got += len(runs)
				}
				require.Equal(t, int(s.Ready), got, "%v: every ready run served", ref)
			}
		})
	}
}

// TestReviewShardOfMatchesFNV: ShardOf (an inline FNV-1a now) names the
// shard hash/fnv named, for random byte strings of every length up to 300
// and shard counts that are not powers of two.
func TestReviewShardOfMatchesFNV(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	for _, shards := range []int{1, 3, 16, 1000, 16384} {
		s, err := keys.NewSpace("rq", shards)
		require.NoError(t, err)
		for n := range 300 {
			b := make([]byte, n)
			for i := range b {
				b[i] = byte(rng.IntN(256))
			}
			h := fnv.New32a()
			_, _ = h.Write(b)
			require.Equal(t, int(h.Sum32()%uint32(shards)), s.ShardOf(string(b)))
		}
	}
}

// TestReviewNamesCacheBytesBounded: names.go says an instance serving more
// queues than nameCacheMax keeps "never more memory than the cap", but the
// cap counts entries, not bytes. One entry holds some 25 key names, each
// with the encoded env and queue; valid names of MaxNameBytes bytes that
// all need encoding ("%" is valid and becomes "%25") make an entry about
// 31 KB of strings, so a full cache holds about 127 MB (162 MB of heap
// measured) for as long as the Queue lives: any caller that picks env and
// queue names (a tenant's) can make every process hold that. Before the
// cache, nothing was kept. This test asks for at most 64 MiB of names.
func TestReviewNamesCacheBytesBounded(t *testing.T) {
	q := namesQueue(t, true)
	pad := func(s string) string { return s + strings.Repeat("%", MaxNameBytes-len(s)) }
	for i := range nameCacheMax {
		env, queue := pad(fmt.Sprint(i)), pad("q")
		require.NoError(t, checkQueue(env, queue), "the names are valid")
		q.names(env, queue)
	}
	require.NotEmpty(t, q.nameCache.m)
	total := 0
	for _, n := range q.nameCache.m {
		for _, s := range slices.Concat(n.place, n.dequeue, n.held, n.vtime, []string{n.member, n.vbase, n.wake, n.runPrefix}) {
			total += len(s)
		}
	}
	t.Logf("%d entries hold %.1f MB of key names", len(q.nameCache.m), float64(total)/1e6)
	require.LessOrEqual(t, total, 64<<20, "the name cache holds %d bytes of key names", total)
}
