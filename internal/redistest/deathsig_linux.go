package redistest

import (
	"os/exec"
	"syscall"
)

// setDeathSignal has the kernel kill the server when the test binary dies
// without reaching Main's cleanup, as when go test's -timeout panics. Linux
// sends the signal when the thread that started the child exits; Go threads
// only exit under runtime.LockOSThread, which these tests do not use.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
