package runqueue_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// TestPromoteStarvingFirstBurst: flooders keys each hold a burst of
// delayed runs that fall due together (at one instant, or a millisecond
// apart), more keys than a call reaches (ScanLimit 30 for a Dequeue(10)),
// and one more key has a single run due in the middle of the bursts. With
// the flag on, a call reaches the due keys without a ready run first (all
// but 30/4 places, kept for keys with ready runs), so the late key's run
// is promoted within ceil(due keys / (30 - 7 - 10)) calls.
// Before, a call reached the first 30 due keys, and the late key waited
// until the bursts due before it had been promoted: with 30 keys of 200
// runs due at once it was promoted in call 51 (served in call 58), with 60
// keys of 200 runs a millisecond apart in call 62. Every run is served
// once.
func TestPromoteStarvingFirstBurst(t *testing.T) {
	t.Parallel() // only its own prefixes on the shared servers, and no wall-clock bound
	for _, tc := range []struct {
		flooders, runs int
		spread         time.Duration
	}{{30, 200, 0}, {90, 60, 0}, {60, 200, time.Millisecond}} {
		t.Run(fmt.Sprintf("flooders=%d,spread=%v", tc.flooders, tc.spread), func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
				b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling = true })
				due := b.clock.Now().Add(time.Minute)
				var ps []runqueue.EnqueueParams
				for k := range tc.flooders {
					for i := range tc.runs {
						ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprintf("f%02d", k),
							ID: fmt.Sprintf("f%02d-%d", k, i), AvailableAt: due.Add(time.Duration(i) * tc.spread)})
					}
				}
				ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: "late", ID: "late",
					AvailableAt: due.Add(time.Duration(tc.runs/2)*tc.spread + time.Millisecond)})
				enqueueAll(t, b, ps)
				b.clock.Advance(time.Hour)

				total := tc.flooders*tc.runs + 1
				seen := map[string]bool{}
				lateCall, lateServe, promotedCall := -1, -1, -1
				const batch = 10
				for call := 1; len(seen) < total; call++ {
					require.LessOrEqual(t, call, total, "served %d of %d runs", len(seen), total)
					runs := dequeue(t, b, queueName, batch)
					require.NotEmpty(t, runs, "call %d served nothing with %d runs left", call, total-len(seen))
					for _, r := range runs {
						require.False(t, seen[r.ID], "%s served twice", r.ID)
						seen[r.ID] = true
						if r.ID == "late" {
							lateCall, lateServe = call, len(seen)
						}
					}
					if promotedCall < 0 {
						if st, err := b.q.KeyStats(b.ctx, env, queueName, "late"); err == nil && st.Delayed == 0 {
							promotedCall = call
						}
					}
					errs, err := b.q.AckMany(b.ctx, runs)
					require.NoError(t, err)
					for _, e := range errs {
						require.NoError(t, e)
					}
				}
				// The late key, with no ready run, is reached within
				// ceil(keys due / (scan - scan/4 - maxCount)) calls: a call
				// reaches scan - scan/4 keys without a ready run, and serves
				// out at most maxCount keys, which then have none again.
				// The bursts fell due on a cold state (an idle queue), so
				// the cold mark registers the late key at V with them: it is
				// served in the first round, one serve per key due (before
				// the mark it waited in the newcomer lane behind the keys
				// promoted before it: serve 91, 3,690 and 1,486 here).
				scan := 3 * batch
				per := scan - scan/4 - batch
				reach := (tc.flooders + 1 + per - 1) / per
				t.Logf("%d flooders of %d runs %v apart: the late run promoted in call %d (bound %d), served in call %d, serve %d",
					tc.flooders, tc.runs, tc.spread, promotedCall, reach, lateCall, lateServe)
				require.Positive(t, promotedCall)
				require.LessOrEqual(t, promotedCall, reach)
				require.Positive(t, lateCall)
				require.LessOrEqual(t, lateServe, tc.flooders+1, "the late key is served in the first round")
				require.Equal(t, runqueue.Stats{}, queueStats(t, b, queueName))
			})
		})
	}
}

// TestPromoteStarvingFirstPreview: Preview replays the promotion too. Four
// keys of 3 runs due at once, ScanLimit 2 and PromoteLimit 1: a call of 1
// promotes one run of a and b and serves a; the next call reaches the keys
// without a ready run (a, then c) before b. At every call, Preview(n)
// predicts what Dequeue(n) serves. (Found by a review of the first attempt, a rank
// cursor, whose Preview read only the first ScanLimit due keys.)
func TestPromoteStarvingFirstPreview(t *testing.T) {
	t.Parallel() // only its own prefixes on the shared servers
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, func(cfg *runqueue.Config) {
			cfg.VtimeScheduling, cfg.ScanLimit, cfg.PromoteLimit = true, 2, 1
		})
		due := b.clock.Now().Add(time.Minute)
		for _, k := range []string{"a", "b", "c", "d"} {
			for i := range 3 {
				enqueue(t, b, runqueue.EnqueueParams{Key: k, ID: fmt.Sprintf("%s-%d", k, i), AvailableAt: due})
			}
		}
		b.clock.Advance(time.Hour)
		for call := range 4 {
			n := 1 + 2*(call%2) // calls of 1 and of 3 in turn
			got := previewedDequeue(t, b, n, "call %d of %d", call, n)
			require.NotEmpty(t, got)
			ackAll(t, b, got)
		}
	})
}

// previewedDequeue dequeues up to n runs of queueName and requires that
// Preview, asked just before, predicted them.
func previewedDequeue(t testing.TB, b *testBundle, n int, msgAndArgs ...any) []*runqueue.Run {
	t.Helper()
	preview, err := b.q.Preview(b.ctx, env, queueName, n)
	require.NoError(t, err)
	want := make([]string, len(preview))
	for i, p := range preview {
		want[i] = p.ID
	}
	got := dequeue(t, b, queueName, n)
	require.Equal(t, want, runIDs(got), msgAndArgs...)
	return got
}
