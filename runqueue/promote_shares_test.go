package runqueue_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/runqueue"
)

// TestPromoteSharesByName: many keys' delayed runs falling due at the same
// moment are promoted in equal shares, whatever their names. The delay
// index orders them by name then, the same order in every call, and a
// share of what was left, given in turn, gave the rounding up and what a
// short key left to the keys after it: with the scheduler on, 60 keys due
// together were served 60 runs each (the first 40) and 30 each (the other
// 20) in 30 calls of 100; nine keys of 1,000 due runs beside one that
// falls due a run a call, 570 runs to the first of the nine and 300 to
// each other. Calls of 100 acked at once, 1 ms apart.
func TestPromoteSharesByName(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		keys int
		due  func(k, i int) time.Duration // when run i of key k falls due
		runs func(k int) int
	}{
		{name: "Rounding", keys: 60, runs: func(int) int { return 400 },
			due: func(int, int) time.Duration { return time.Second }},
		{name: "Leftover", keys: 10,
			runs: func(k int) int { return map[bool]int{true: 40, false: 1000}[k == 9] },
			due: func(k, i int) time.Duration {
				if k == 9 {
					return time.Second + time.Duration(i)*time.Millisecond
				}
				return time.Second
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
				b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling, cfg.SerialCalls = true, true })
				start := b.clock.Now()
				var ps []runqueue.EnqueueParams
				for k := range tc.keys {
					for i := range tc.runs(k) {
						ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: fmt.Sprintf("k%02d", k),
							ID: fmt.Sprintf("k%02d-%d", k, i), AvailableAt: start.Add(tc.due(k, i))})
					}
				}
				enqueueAll(t, b, ps)
				b.clock.Advance(time.Second)
				const calls = 30
				served := map[string]int{}
				for range calls {
					runs := dequeue(t, b, queueName, 100)
					require.Len(t, runs, 100)
					for _, r := range runs {
						served[r.Key]++
					}
					ackAll(t, b, runs)
					b.clock.Advance(time.Millisecond)
				}
				var full []int // the keys that never ran short
				for k := range tc.keys {
					if tc.runs(k) == 1000 || tc.name == "Rounding" {
						full = append(full, served[fmt.Sprintf("k%02d", k)])
					}
				}
				require.LessOrEqual(t, slices.Max(full)-slices.Min(full), 1,
					"keys due together are served alike, whatever their names: %v", served)
			})
		})
	}
}
