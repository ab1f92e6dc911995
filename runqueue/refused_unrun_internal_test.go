package runqueue

import (
	"fmt"
	"testing"
)

// TestRefusedUnrun: the replies that say Redis did not run the call (so
// the Worker's nack, and a cluster pipeline's call, may be sent again),
// and look-alikes that do not.
func TestRefusedUnrun(t *testing.T) {
	for _, tc := range []struct {
		reply string
		want  bool
	}{
		{"BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.", true},
		{"BUSY Redis is busy running a script. You can only call FUNCTION KILL or SHUTDOWN NOSAVE.", true},
		{"BUSYKEY Target key name already exists.", false},
		{"BUSYGROUP Consumer Group name already exists", false},
		{"MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.", true},
		{"LOADING Redis is loading the dataset in memory", true},
		{"TRYAGAIN Multiple keys request during rehashing of slot", true},
		{"CLUSTERDOWN The cluster is down", true},
		{"MOVED 3999 127.0.0.1:6381", true},
		{"ASK 3999 127.0.0.1:6381", true},
		// Refused at a write inside the script, after it ran in part.
		{"OOM command not allowed when used memory > 'maxmemory'.", false},
		{"ERR Error running script: busy", false},
		{"NOSCRIPT No matching script.", false},
	} {
		if got := refusedUnrun(errorReply(tc.reply)); got != tc.want {
			t.Errorf("refusedUnrun(%q) = %v, want %v", tc.reply, got, tc.want)
		}
	}
	// A hook that wraps the reply keeps it a BUSY refusal.
	if !refusedUnrun(fmt.Errorf("hook: %w", errorReply("BUSY Redis is busy running a script."))) {
		t.Error("refusedUnrun of a wrapped BUSY reply = false")
	}
	if refusedUnrun(nil) {
		t.Error("refusedUnrun(nil) = true")
	}
	// Not a reply of Redis: a client-side text that starts the same way.
	if refusedUnrun(fmt.Errorf("BUSY but not from Redis")) {
		t.Error("refusedUnrun of a plain error starting with BUSY = true")
	}
}
