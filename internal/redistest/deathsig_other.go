//go:build !linux

package redistest

import "os/exec"

// setDeathSignal does nothing here: only Linux can kill a child when its
// parent dies, so a test binary killed before Main's cleanup leaves its
// redis-server running.
func setDeathSignal(*exec.Cmd) {}
