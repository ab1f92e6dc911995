package runqueue_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/runqueue/runqueue/internal/redistest"
)

func TestMain(m *testing.M) {
	redistest.LeakCheckMain(m,
		// go-redis keeps a pool reaper per client until the client closes;
		// clients close in t.Cleanup, but the pool goroutine may lag.
		goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"),
	)
}
