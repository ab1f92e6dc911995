//go:build !unix

package runqueue_test

import "time"

func processCPU() (time.Duration, bool) { return 0, false }
