package runqueue_test

import (
	"flag"
	"runtime"
	"strconv"
	"testing"

	"go.uber.org/goleak"

	"github.com/runqueue/runqueue/internal/redistest"
)

// parallelPerCPU is how many parallel tests run at once per CPU when the
// command line does not say (-parallel). Most of this package's parallel
// tests wait rather than compute: on failovers, restarts and resharding
// of servers of their own, on sleeps that let leases or TTLs pass. go
// test's default (GOMAXPROCS) left a 2-core machine idle through those
// waits, the CPU-bound tests beside them being few.
const parallelPerCPU = 4

func TestMain(m *testing.M) {
	flag.Parse()
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if !explicit {
		if err := flag.Set("test.parallel", strconv.Itoa(parallelPerCPU*runtime.GOMAXPROCS(0))); err != nil {
			panic(err)
		}
	}
	redistest.LeakCheckMain(m,
		// go-redis keeps a pool reaper per client until the client closes;
		// clients close in t.Cleanup, but the pool goroutine may lag.
		goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"),
	)
}
