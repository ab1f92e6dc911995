package runqueue

import (
	"context"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"
)

// Review s29: what unanswered (the Worker's nack retry, scripts.go) counts
// as a call that may not have reached Redis. Probes that held are asserted
// as they are. The pool timeout was a gap the review found, now closed: a
// nack that waited out go-redis's pool (all connections busy or being
// dialed during a restart) was never sent and is safe to send again, so
// it is retried too.
func TestS29Unanswered(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"redis reply", redis.ErrClosed, false}, // client closed: not Redis's silence
		{"ERR reply", fmt.Errorf("wrapped: %w", errorReply("ERR boom")), false},
		{"canceled", context.Canceled, false},
		// A deadline is a net.Error (Timeout()): counted unanswered. The
		// loop then sleeps on w.ctx(), which ends at once when that ctx is
		// the one whose deadline passed, so it does not spin.
		{"deadline", context.DeadlineExceeded, true},
		{"EOF", io.EOF, true},
		{"refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{"reset", fmt.Errorf("x: %w", syscall.ECONNRESET), true},
		{"pool timeout", redis.ErrPoolTimeout, true}, // never sent: safe to send
	} {
		if got := unanswered(tc.err); got != tc.want {
			t.Errorf("unanswered(%s: %v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// errorReply is a Redis error reply as go-redis makes it.
type errorReply string

func (e errorReply) Error() string { return string(e) }
func (e errorReply) RedisError()   {}
