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

// TestPromoteBurstIntoIdleQueue: delayed work of many tenants falling due
// together into an idle queue is shared among them as the same runs
// enqueued ready are. The first call's promotion reaches ScanLimit
// variants; those registered at V and the rest came through the newcomer
// lane, one key's share together (helper-165: 100 tenants of 40 runs,
// calls of 10: the 30 first by name took 997 of the first 1,000 serves,
// the last was first served at call 321). The cold mark makes the later
// ones register at V too. Flag on; calls of 10, acked, 1 ms apart.
func TestPromoteBurstIntoIdleQueue(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling, cfg.SerialCalls = true, true })
		const tenants, runs = 100, 40
		due := b.clock.Now().Add(time.Second)
		enqueueAll(t, b, dueTogether(tenants, runs, func(k int) string { return fmt.Sprintf("t%03d", k) }, "", due))
		b.clock.Advance(time.Second)
		served, first := map[string]int{}, map[string]int{}
		for call := range 100 {
			got := dequeue(t, b, queueName, 10)
			require.Len(t, got, 10, "call %d", call)
			for _, r := range got {
				if _, ok := first[r.Key]; !ok {
					first[r.Key] = call
				}
				served[r.Key]++
			}
			ackAll(t, b, got)
			b.clock.Advance(time.Millisecond)
		}
		require.Len(t, served, tenants, "tenants served in the first 1,000 serves")
		counts, firsts := []int{}, []int{}
		for k, n := range served {
			counts, firsts = append(counts, n), append(firsts, first[k])
		}
		t.Logf("serves per tenant in the first 1,000: %d..%d; the last tenant first served at call %d",
			slices.Min(counts), slices.Max(counts), slices.Max(firsts))
		require.LessOrEqual(t, slices.Max(counts)-slices.Min(counts), 1, "serves per tenant: %v", served)
		require.Less(t, slices.Max(firsts), 11, "the last tenant's first serve (call)")
	})
}

// TestPromoteBurstsKeepWeights: delayed bursts of many weighted keys, the
// first into an idle queue, keep the weights (helper-183: 600 keys of
// weights 0.25, 1 and 4, 30 runs each due together every 40 calls, 5
// bursts, calls of 100 acked at once, 10 ms apart: the first burst left
// about 300 keys in the newcomer lane; weight-4 keys, which ran out of
// runs between bursts with a parked tag that V passed, came back through
// it, and in calls 100-200 were served 8.2 times each against 33.2 for a
// weight-1 key, 171 keys never served in 200 calls). With the cold mark
// the first burst registers at V whole, and every key is served within the
// first round.
func TestPromoteBurstsKeepWeights(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling, cfg.SerialCalls = true, true })
		const keys, per, every, bursts, calls = 600, 30, 40, 5, 200
		ws := []float64{0.25, 1, 4}
		key := func(k int) string { return fmt.Sprintf("k%04d", k) }
		for k := range keys {
			if w := ws[k%3]; w != 1 {
				require.NoError(t, b.q.SetWeight(b.ctx, env, queueName, key(k), w))
			}
		}
		t0 := b.clock.Now()
		var ps []runqueue.EnqueueParams
		for bu := range bursts {
			due := t0.Add(time.Duration(bu*every)*10*time.Millisecond + time.Millisecond)
			ps = append(ps, dueTogether(keys, per, key, fmt.Sprintf("-b%d", bu), due)...)
		}
		enqueueAll(t, b, ps)
		b.clock.Advance(5 * time.Millisecond)
		var perWeight [3]float64 // serves per unit of weight in calls 100-199, by class
		first := map[string]int{}
		for call := range calls {
			runs := dequeue(t, b, queueName, 100)
			require.Len(t, runs, 100, "call %d", call)
			for _, r := range runs {
				if _, ok := first[r.Key]; !ok {
					first[r.Key] = call
				}
				if call >= 100 {
					var k int
					_, err := fmt.Sscanf(r.Key, "k%04d", &k)
					require.NoError(t, err)
					perWeight[k%3] += 1 / ws[k%3]
				}
			}
			ackAll(t, b, runs)
			b.clock.Advance(10 * time.Millisecond)
		}
		require.Len(t, first, keys, "keys served in 200 calls")
		late := 0
		for _, c := range first {
			late = max(late, c)
		}
		// one round: 600 keys of total weight 1,050, calls of 100
		require.LessOrEqual(t, late, 11, "the last key's first serve (call)")
		lo, hi := min(perWeight[0], perWeight[1], perWeight[2]), max(perWeight[0], perWeight[1], perWeight[2])
		t.Logf("serves per unit of weight by class (0.25, 1, 4), calls 100-199: %.0f; the last key first served at call %d", perWeight, late)
		require.Less(t, hi/lo, 1.3, "serves per unit of weight by class (0.25, 1, 4), calls 100-199: %v", perWeight)
	})
}

// TestColdMarkDequeuerAhead: the cold mark is the time the last due
// variant fell due, not the marking call's clock. helper-185: a dequeuer
// whose clock ran 60 s ahead made the first call on an idle queue when 40
// keys' burst of 500 runs each fell due, and marked its own time; 100 new
// keys whose runs fell due 2 s later, while the burst's keys were served,
// then registered at V past the newcomer lane (the burst's backlog kept
// the mark alive): 350 of the next 500 serves, every new key served,
// against 45 through the lane without the skew. Now the same either way.
func TestColdMarkDequeuerAhead(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		newServes := map[time.Duration]int{}
		for _, skew := range []time.Duration{0, time.Minute} {
			b := setup(t, c, func(cfg *runqueue.Config) { cfg.VtimeScheduling, cfg.SerialCalls = true, true })
			t0 := b.clock.Now()
			enqueueAll(t, b, dueTogether(40, 500, func(k int) string { return fmt.Sprintf("b%02d", k) }, "", t0.Add(time.Millisecond)))
			b.clock.Advance(time.Millisecond + skew)
			ackAll(t, b, dequeue(t, b, queueName, 10)) // cut short on a cold state: the mark
			b.clock.Advance(-skew)
			enqueueAll(t, b, dueTogether(100, 30, func(k int) string { return fmt.Sprintf("n%03d", k) }, "", t0.Add(2*time.Second)))
			for range 100 {
				ackAll(t, b, dequeue(t, b, queueName, 10))
				b.clock.Advance(time.Millisecond)
			}
			b.clock.Advance(t0.Add(2 * time.Second).Sub(b.clock.Now()))
			for range 50 {
				got := dequeue(t, b, queueName, 10)
				require.Len(t, got, 10)
				for _, r := range got {
					if r.Key[0] == 'n' {
						newServes[skew]++
					}
				}
				ackAll(t, b, got)
				b.clock.Advance(time.Millisecond)
			}
		}
		t.Logf("new keys' serves of the 500 after they fell due: %v", newServes)
		// through the lane, beside 40 backlogged keys: about one serve in 41 for
		// the lane and one for each newcomer it let in
		require.Less(t, newServes[0], 100, "no skew")
		require.Equal(t, newServes[0], newServes[time.Minute], "the first dequeuer 60 s ahead")
	})
}

// dueTogether is runs runs of each of keys keys (key(k) names key k) of
// the test queue, all due at at, with ids key(k) + tag + "-" + i.
func dueTogether(keys, runs int, key func(int) string, tag string, at time.Time) []runqueue.EnqueueParams {
	var ps []runqueue.EnqueueParams
	for k := range keys {
		for i := range runs {
			ps = append(ps, runqueue.EnqueueParams{Env: env, Queue: queueName, Key: key(k),
				ID: fmt.Sprintf("%s%s-%d", key(k), tag, i), AvailableAt: at})
		}
	}
	return ps
}
