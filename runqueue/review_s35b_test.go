package runqueue_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// TestReviewS35bFedRetryHeld: key f has ready runs of priority 0 and one
// priority-9 run that fell due first of all (a retry). Every call,
// ScanLimit (11) new one-run keys fall due after it, and f's producer adds
// one ready run; Dequeue(10) + ack. Old rule: f's due run is first in
// delayIndex order and promoted in call 1. Starving-first: every call's
// room goes to the new keys, and f's earliest-due, highest-priority run
// stays delayed as long as f keeps a ready run.
func TestReviewS35bFedRetryHeld(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, func(cfg *runqueue.Config) {
			cfg.VtimeScheduling, cfg.ScanLimit, cfg.PromoteLimit = true, 11, 5
		})
		for i := range 20 {
			enqueue(t, b, runqueue.EnqueueParams{Key: "f", ID: fmt.Sprintf("f-%d", i)})
		}
		enqueue(t, b, runqueue.EnqueueParams{Key: "f", ID: "f-retry", Priority: 9,
			AvailableAt: b.clock.Now().Add(time.Millisecond)})
		n := 0
		for range 12 {
			n++
			enqueue(t, b, runqueue.EnqueueParams{Key: fmt.Sprintf("n%d", n), ID: fmt.Sprintf("n%d", n),
				AvailableAt: b.clock.Now().Add(2 * time.Millisecond)})
		}
		b.clock.Advance(2 * time.Millisecond)
		for call := 1; call <= 300; call++ {
			for range 11 {
				n++
				enqueue(t, b, runqueue.EnqueueParams{Key: fmt.Sprintf("n%d", n), ID: fmt.Sprintf("n%d", n),
					AvailableAt: b.clock.Now().Add(time.Millisecond)})
			}
			enqueue(t, b, runqueue.EnqueueParams{Key: "f", ID: fmt.Sprintf("f-more-%d", call)})
			b.clock.Advance(time.Millisecond)
			runs := dequeue(t, b, queueName, 10)
			for _, r := range runs {
				if r.ID == "f-retry" {
					t.Logf("f-retry served in call %d", call)
					return
				}
			}
			_, err := b.q.AckMany(b.ctx, runs)
			require.NoError(t, err)
		}
		st, err := b.q.KeyStats(b.ctx, env, queueName, "f")
		require.NoError(t, err)
		t.Fatalf("f's priority-9 run, due before every other delayed run, not served in 300 calls (f: %+v)", st)
	})
}

// TestReviewS35bPreviewLookChunked: ScanLimit 260, so a call looks at
// 1,040 due keys (two ZMSCOREs); some have a ready run. Preview(n) must
// predict Dequeue(n) at every call.
func TestReviewS35bPreviewLookChunked(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, func(cfg *runqueue.Config) {
			cfg.VtimeScheduling, cfg.ScanLimit, cfg.PromoteLimit = true, 260, 1
		})
		due := b.clock.Now().Add(time.Minute)
		var ps []runqueue.EnqueueParams
		for k := range 1100 {
			for i := range 2 {
				ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprintf("k%04d", k),
					ID: fmt.Sprintf("k%04d-%d", k, i), AvailableAt: due.Add(time.Duration(k%7) * time.Millisecond)})
			}
		}
		enqueueAll(t, b, ps)
		b.clock.Advance(time.Hour)
		for call := range 8 {
			n := []int{1, 5, 300, 2}[call%4]
			got := previewedDequeue(t, b, n, "call %d of %d", call, n)
			if call%2 == 0 {
				ackAll(t, b, got)
			}
		}
	})
}

// TestReviewS35bFedRetryFiniteBurst: no overload, no producer, default
// ScanLimit. f has 20 ready runs and a priority-9 run due at t; 1,000
// one-run keys fall due at t+1ms. Dequeue(10) + ack. Old rule: f's
// retry is served in call 1 (serve 1). Starving-first: held until f's
// 20 ready runs are served out (f has no ready run), then behind the
// newcomers promoted meanwhile.
func TestReviewS35bFedRetryFiniteBurst(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = true })
		for i := range 20 {
			enqueue(t, b, runqueue.EnqueueParams{Key: "f", ID: fmt.Sprintf("f-%d", i)})
		}
		at := b.clock.Now().Add(time.Minute)
		var ps []runqueue.EnqueueParams
		ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: "f", ID: "f-retry", Priority: 9, AvailableAt: at})
		for k := range 1000 {
			ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprintf("b%04d", k),
				ID: fmt.Sprintf("b%04d", k), AvailableAt: at.Add(time.Millisecond)})
		}
		enqueueAll(t, b, ps)
		b.clock.Advance(time.Hour)
		serves := 0
		for call := 1; call <= 200; call++ {
			runs := dequeue(t, b, queueName, 10)
			for _, r := range runs {
				serves++
				if r.ID == "f-retry" {
					t.Logf("f-retry served in call %d, serve %d", call, serves)
					require.LessOrEqual(t, call, 2, "f's priority-9 run, the first due, served only at serve %d", serves)
					return
				}
			}
			ackAll(t, b, runs)
		}
		t.Fatal("f-retry not served in 200 calls")
	})
}

// TestReviewS35bPreviewScan1: ScanLimit 1 (look 4), PromoteLimit 1, key
// limit 1, maxCount up to 3 > ScanLimit, runs held across calls and acked
// through AckAndDequeue: Preview(n) predicts the Dequeue at every call.
func TestReviewS35bPreviewScan1(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, func(cfg *runqueue.Config) {
			cfg.VtimeScheduling, cfg.ScanLimit, cfg.PromoteLimit = true, 1, 1
			cfg.LimitsFor = func(string, string) runqueue.Limits { return runqueue.Limits{Key: 1} }
		})
		at := b.clock.Now().Add(time.Minute)
		for k, key := range []string{"a", "b", "c", "d", "e", "f"} {
			for i := range 3 {
				enqueue(t, b, runqueue.EnqueueParams{Key: key, ID: fmt.Sprintf("%s-%d", key, i), Priority: i % 2,
					AvailableAt: at.Add(time.Duration((k*7+i)%4) * time.Millisecond)})
			}
			if k%2 == 1 {
				enqueue(t, b, runqueue.EnqueueParams{Key: key, ID: key + "-r"})
			}
		}
		b.clock.Advance(time.Hour)
		var held []*runqueue.Run
		for call := range 20 {
			n := []int{3, 1, 2}[call%3]
			got := previewedDequeue(t, b, n, "call %d of %d", call, n)
			held = append(held, got...)
			if len(held) > 2 {
				_, _, err := b.q.AckAndDequeue(b.ctx, held[:2], env, queueName, 0)
				require.NoError(t, err)
				held = held[2:]
			}
		}
	})
}

// TestReviewS35bCost: the promotion looks at ckIndex only when more
// variants are due than a call reaches: one Dequeue(10) with exactly
// ScanLimit (30) due variants, some with a ready run, sends the ZMSCOREs
// the call makes anyway (registrations), and one with 31 due variants
// exactly one more (INFO commandstats on a server of its own).
func TestReviewS35bCost(t *testing.T) {
	t.Parallel() // its own redis-server
	c := redis.NewClient(&redis.Options{Addr: ownRedis(t)})
	t.Cleanup(func() { _ = c.Close() })
	calls := map[int]int{}
	for _, nd := range []int{30, 31} {
		func() {
			b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = true })
			at := b.clock.Now().Add(time.Minute)
			for k := range nd {
				enqueue(t, b, runqueue.EnqueueParams{Key: fmt.Sprintf("k%02d", k), ID: fmt.Sprintf("k%02d-d", k), AvailableAt: at})
				if k%3 == 0 {
					enqueue(t, b, runqueue.EnqueueParams{Key: fmt.Sprintf("k%02d", k), ID: fmt.Sprintf("k%02d-r", k)})
				}
			}
			b.clock.Advance(time.Hour)
			enqueue(t, b, runqueue.EnqueueParams{Queue: "warm", Key: "w", ID: "w"})
			dequeue(t, b, "warm", 1)
			require.NoError(t, c.ConfigResetStat(b.ctx).Err())
			dequeue(t, b, queueName, 10)
			info, err := c.Info(b.ctx, "commandstats").Result()
			require.NoError(t, err)
			zmscore := 0
			for _, l := range strings.Split(info, "\n") {
				if strings.HasPrefix(l, "cmdstat_zmscore:calls=") {
					_, err := fmt.Sscanf(l, "cmdstat_zmscore:calls=%d", &zmscore)
					require.NoError(t, err)
				}
			}
			t.Logf("%d due: %d ZMSCORE", nd, zmscore)
			calls[nd] = zmscore
		}()
	}
	require.Equal(t, calls[30]+1, calls[31], "the look at ckIndex: one ZMSCORE, only with more due than a call reaches")
}
