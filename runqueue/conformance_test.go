package runqueue_test

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/runqueue"
)

// conformanceCase is one behaviour of the flag-off run queue, checked on a
// fresh prefix of every backend.
type conformanceCase struct {
	name   string
	mutate func(*runqueue.Config)
	fn     func(t *testing.T, b *testBundle)
}

// TestConformance runs the whole life of a run, flag off, on miniredis, a
// real redis-server and a three-node Redis Cluster. The cases assert what a
// caller can observe: returned runs, Stats, dead letters and, where a call
// must not write, the full key dump of the prefix.
func TestConformance(t *testing.T) {
	t.Parallel()
	cases := [][]conformanceCase{
		enqueueCases(), orderCases(), limitCases(), ackNackCases(), leaseCases(), ttlCases(), statsCases(), errorCases(),
	}
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient) {
		for _, group := range cases {
			for _, tc := range group {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					tc.fn(t, setup(t, c, tc.mutate))
				})
			}
		}
	})
}
