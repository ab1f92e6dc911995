package redistest

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// LeakPatience is how long the leak checks below let goroutines end before
// they call them leaked. goleak's own check gives up after about 430 ms (20
// retries), which a goroutine that ends late on a loaded machine can
// exceed: a closed connection's reader, a stopped worker's last send. A
// real leak outlives any wait, so a longer one fails the same leaks and no
// late ends.
const LeakPatience = 3 * time.Second

// FindLeaks is goleak.Find retried until LeakPatience has passed: nil as
// soon as no goroutine other than those opts ignore is running, else the
// last error.
func FindLeaks(opts ...goleak.Option) error {
	deadline := time.Now().Add(LeakPatience)
	for {
		err := goleak.Find(opts...)
		if err == nil || time.Now().After(deadline) {
			return err
		}
	}
}

// VerifyNoLeaks fails t when goroutines other than those opts ignore are
// still running after LeakPatience; as goleak.VerifyNone, with the longer
// wait. Deferred at a test's start with goleak.IgnoreCurrent(), it fails
// the goroutines the test left running.
func VerifyNoLeaks(t testing.TB, opts ...goleak.Option) {
	t.Helper()
	if err := FindLeaks(opts...); err != nil {
		t.Error(err)
	}
}

// LeakCheckMain runs the package's tests as Wrap does and, when they all
// passed, fails the run (exit status 1) when goroutines other than those
// opts ignore are still running after LeakPatience; as
// goleak.VerifyTestMain, with the longer wait. It does not return.
func LeakCheckMain(m *testing.M, opts ...goleak.Option) {
	code := Wrap(m).Run()
	if code == 0 {
		if err := FindLeaks(opts...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: Errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
