package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// TestReviewCallgrindDumpTotal: the summary line is read (the header's,
// before the totals line), totals when there is no summary; a dump with
// neither, or an empty one, is an error.
func TestReviewCallgrindDumpTotal(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
		return p
	}
	got, err := dumpTotal(write("a", "version: 1\ncreator: callgrind-3.19.0\nevents: Ir\nsummary: 138519\n\nfl=(1) x\nfn=(1) f\n3 5\ntotals: 159774\n"))
	require.NoError(t, err)
	require.Equal(t, 138519.0, got)
	got, err = dumpTotal(write("b", "events: Ir\nfn=(1) f\n3 5\ntotals: 42 7\n"))
	require.NoError(t, err)
	require.Equal(t, 42.0, got)
	_, err = dumpTotal(write("c", "events: Ir\nfn=(1) f\n3 5\n"))
	require.ErrorContains(t, err, "no summary line")
	_, err = dumpTotal(write("d", "summary:\n"))
	require.ErrorContains(t, err, "empty summary: line")
	_, err = dumpTotal(write("e", ""))
	require.Error(t, err)
	_, err = dumpTotal(filepath.Join(dir, "missing"))
	require.Error(t, err)
}

// TestReviewCallgrindLastDump: the newest dump is the highest part number
// (10 after 9, not after 1), and every dump is removed after the read.
func TestReviewCallgrindLastDump(t *testing.T) {
	t.Parallel()
	cg := &callgrind{dir: t.TempDir()}
	_, err := cg.lastDump()
	require.ErrorContains(t, err, "no dump")
	for _, part := range []int{1, 2, 9, 10} {
		require.NoError(t, os.WriteFile(filepath.Join(cg.dir, "cg.out."+strconv.Itoa(part)),
			[]byte("summary: "+strconv.Itoa(part*100)+"\n"), 0o600))
	}
	require.NoError(t, os.WriteFile(filepath.Join(cg.dir, "cg.out"), []byte("summary: 1\n"), 0o600))
	got, err := cg.lastDump()
	require.NoError(t, err)
	require.Equal(t, 1000.0, got)
	left, err := filepath.Glob(filepath.Join(cg.dir, "cg.out.*"))
	require.NoError(t, err)
	require.Empty(t, left)
}

// reviewFakeTools puts the scripts given first on PATH, in front of the
// real tools (which it needs), and gives the test a TMPDIR of its own.
func reviewFakeTools(t *testing.T, scripts map[string]string) string {
	t.Helper()
	requireCallgrind(t)
	bin := t.TempDir()
	for name, body := range scripts {
		require.NoError(t, os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"+body+"\n"), 0o755))
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	return tmp
}

func reviewTempLeft(t *testing.T, tmp string) []string {
	t.Helper()
	left, err := filepath.Glob(filepath.Join(tmp, "runqueue-bench-callgrind-*"))
	require.NoError(t, err)
	return left
}

func reviewAlive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// TestReviewCallgrindServerExitsAtStart: a redis-server that exits at
// once under valgrind is an error soon (not after the minute's wait),
// with its output, and leaves no temporary directory.
func TestReviewCallgrindServerExitsAtStart(t *testing.T) {
	tmp := reviewFakeTools(t, map[string]string{"redis-server": "echo 'bad config: boom' >&2; exit 3"})
	start := time.Now()
	cg, err := startCallgrind(context.Background())
	require.Nil(t, cg)
	require.ErrorContains(t, err, "exited")
	require.ErrorContains(t, err, "boom")
	require.Less(t, time.Since(start), 30*time.Second)
	require.Empty(t, reviewTempLeft(t, tmp))
}

// TestReviewCallgrindCanceledWhileStarting: a valgrind that never serves,
// and the context ends: startCallgrind returns the context's error, the
// process is gone and the directory removed.
func TestReviewCallgrindCanceledWhileStarting(t *testing.T) {
	tmp := reviewFakeTools(t, map[string]string{"valgrind": `echo $$ > "$TMPDIR/pid"; exec sleep 300`})
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	cg, err := startCallgrind(ctx)
	require.Nil(t, cg)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	raw, err := os.ReadFile(filepath.Join(tmp, "pid"))
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	require.NoError(t, err)
	require.False(t, reviewAlive(pid), "valgrind %d still runs", pid)
	require.Empty(t, reviewTempLeft(t, tmp))
}

// TestReviewCallgrindLifecycle: the real tools. A phase's count grows
// with its work; a phase that fails is its error; once the server died
// (valgrind gone mid-run) a count is an error, not a figure, and returns
// soon; stop ends everything and removes the directory.
func TestReviewCallgrindLifecycle(t *testing.T) {
	tmp := reviewFakeTools(t, nil)
	ctx := context.Background()
	cg, err := startCallgrind(ctx)
	require.NoError(t, err)
	stopped := false
	defer func() {
		if !stopped {
			cg.stop()
		}
	}()
	require.Len(t, reviewTempLeft(t, tmp), 1)
	c := redis.NewClient(&redis.Options{Addr: cg.addr, MaxRetries: -1})
	defer func() { _ = c.Close() }()
	require.NoError(t, c.Ping(ctx).Err()) // the connection is open before the phases
	pings := func(n int) func() error {
		return func() error {
			for range n {
				if err := c.Ping(ctx).Err(); err != nil {
					return err
				}
			}
			return nil
		}
	}
	small, err := cg.count(ctx, pings(20))
	require.NoError(t, err)
	big, err := cg.count(ctx, pings(200))
	require.NoError(t, err)
	require.Positive(t, small)
	t.Logf("%.0f instructions for 20 pings, %.0f for 200", small, big)
	// A phase's count carries a little noise besides its work (the event
	// loop woken by callgrind_control): a tenfold phase counts well above
	// three times as much.
	require.Greater(t, big, 3*small, "%.0f instructions for 20 pings, %.0f for 200", small, big)

	// The server's timer is not counted: an idle phase of 2.5 seconds
	// meets two or three runs of it (hz 1), which cost 150,000-350,000
	// instructions each on Redis 7.0.15 and some 2.3 million on 8.0.2; it
	// counts a few thousand (the wake-ups for callgrind_control).
	idle, err := cg.count(ctx, func() error {
		time.Sleep(2500 * time.Millisecond)
		return nil
	})
	require.NoError(t, err)
	require.Less(t, idle, 100000.0, "an idle phase counted %.0f instructions", idle)

	// A phase that fails after work: none of it is left in the next count.
	boom := errors.New("boom")
	_, err = cg.count(ctx, func() error {
		if err := pings(1000)(); err != nil {
			return err
		}
		return boom
	})
	require.ErrorIs(t, err, boom)
	again, err := cg.count(ctx, pings(20))
	require.NoError(t, err)
	t.Logf("%.0f instructions for 20 pings after the failed phase", again)
	// The failed phase's 1,000 pings would add about 50 times small; the
	// noise at most a few times small.
	require.Less(t, again, 10*small+big, "a failed phase leaves no count behind: %.0f then %.0f", small, again)

	// The server dies: the next count is an error.
	pid := cg.cmd.Process.Pid
	require.NoError(t, cg.cmd.Process.Kill())
	<-cg.exited
	start := time.Now()
	_, err = cg.count(ctx, func() error { return nil })
	require.Error(t, err)
	require.Less(t, time.Since(start), 30*time.Second)

	cg.stop()
	stopped = true
	require.False(t, reviewAlive(pid))
	require.Empty(t, reviewTempLeft(t, tmp))
}

// TestReviewCallgrindControlErrorsIgnored: callgrind_control exits 0 when
// it cannot reach the process ("Error: Callgrind task with PID/name ...
// not detected", checked with valgrind 3.19), and callgrind.run takes
// only the exit status: a zero or a dump that never happened passes as
// done. A count then fails later with "callgrind wrote no dump", which
// names neither the cause nor the process (and a redis-server on PATH
// that is a wrapper script, run natively after its exec since valgrind
// does not trace children, ends the same way).
func TestReviewCallgrindControlErrorsIgnored(t *testing.T) {
	reviewFakeTools(t, nil)
	ctx := context.Background()
	cg, err := startCallgrind(ctx)
	require.NoError(t, err)
	defer cg.stop()
	require.NoError(t, cg.run(ctx, "-z"), "the live server is reached")
	require.NoError(t, cg.cmd.Process.Kill())
	<-cg.exited
	require.Error(t, cg.run(ctx, "-z"), "callgrind_control could not reach the server, and run said it did")
}
