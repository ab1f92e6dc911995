package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// With -callgrind the bench starts its own redis-server under valgrind's
// callgrind tool and measures each cost phase by the instructions Redis
// executes (callgrind's Ir count: zeroed before the phase, dumped after).
// Unlike time, that count does not depend on what else the machine runs,
// so two runs give the same figures to a fraction of a percent and a
// ratio (flag on against off, batch 1 against batch 10) can be read on a
// busy shared machine. It counts instructions, not cycles (a cache miss
// costs nothing), and valgrind runs Redis some 50 times slower: only the
// cost section runs this way.

// callgrind is a redis-server running under callgrind.
type callgrind struct {
	cmd     *exec.Cmd
	dir     string // callgrind's output files
	addr    string
	control string // the callgrind_control binary
	exited  chan struct{}
}

// callgrindTools finds valgrind, callgrind_control and redis-server.
func callgrindTools() (valgrind, control, server string, err error) {
	var missing []string
	look := func(name string) string {
		p, err := exec.LookPath(name)
		if err != nil {
			missing = append(missing, name)
		}
		return p
	}
	valgrind, control, server = look("valgrind"), look("callgrind_control"), look("redis-server")
	if len(missing) > 0 {
		return "", "", "", fmt.Errorf("-callgrind needs %s on PATH (Debian: apt-get install valgrind redis-server)", strings.Join(missing, " and "))
	}
	return valgrind, control, server, nil
}

// startCallgrind starts redis-server under callgrind on a free loopback
// port and waits until it answers. The server's timer (serverCron) is left
// out of the counts: it is a cost per second, not per command, and
// valgrind stretches every second some 50 times. On Redis 8.0 one run of
// it costs about 2.3 million instructions (its allocator statistics), so
// a phase counted it once or twice at random and two runs of one phase
// differed by 20%. --toggle-collect turns counting off inside the named
// function and --collect-atstart=yes, which must follow it (valgrind's
// --toggle-collect sets it to no), on everywhere else; hz 1 makes the
// timer rare besides.
func startCallgrind(ctx context.Context) (*callgrind, error) {
	valgrind, control, server, err := callgrindTools()
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir, err := os.MkdirTemp("", "runqueue-bench-callgrind-")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(valgrind, "--tool=callgrind", "--callgrind-out-file="+filepath.Join(dir, "cg.out"),
		"--toggle-collect=serverCron", "--collect-atstart=yes",
		server, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--hz", "1")
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("starting redis-server under callgrind: %w", err)
	}
	cg := &callgrind{cmd: cmd, dir: dir, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), control: control, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(cg.exited)
	}()
	// Wait for the port to take connections (go-redis would log each
	// refused dial), then for an answer.
	deadline := time.Now().Add(60 * time.Second)
	for {
		var conn net.Conn
		if conn, err = net.DialTimeout("tcp", cg.addr, time.Second); err == nil {
			_ = conn.Close()
			c := redis.NewClient(&redis.Options{Addr: cg.addr, MaxRetries: -1})
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err = c.Ping(pctx).Err()
			cancel()
			_ = c.Close()
			if err == nil {
				return cg, nil
			}
		}
		select {
		case <-cg.exited:
			cg.stop()
			return nil, fmt.Errorf("redis-server under callgrind exited: %s", strings.TrimSpace(logs.String()))
		case <-ctx.Done():
			cg.stop()
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cg.stop()
			return nil, fmt.Errorf("redis-server under callgrind did not answer within a minute: %w", err)
		}
	}
}

// url is the server's address as a -redis value.
func (cg *callgrind) url() string { return "redis://" + cg.addr }

// count returns the instructions Redis executed while fn ran.
func (cg *callgrind) count(ctx context.Context, fn func() error) (float64, error) {
	if err := cg.run(ctx, "-z"); err != nil {
		return 0, err
	}
	if err := fn(); err != nil {
		return 0, err
	}
	if err := cg.run(ctx, "-d"); err != nil {
		return 0, err
	}
	return cg.lastDump()
}

// run runs callgrind_control with flag on the server.
func (cg *callgrind) run(ctx context.Context, flag string) error {
	out, err := exec.CommandContext(ctx, cg.control, flag, strconv.Itoa(cg.cmd.Process.Pid)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("callgrind_control %s: %w: %s", flag, err, strings.TrimSpace(string(out)))
	}
	// It exits 0 when it finds no callgrind process to talk to ("Error:
	// Callgrind task with PID/name ... not detected"), for instance when
	// redis-server on PATH is a script that valgrind does not follow.
	if strings.Contains(string(out), "Error") {
		return fmt.Errorf("callgrind_control %s: %s", flag, strings.TrimSpace(string(out)))
	}
	return nil
}

// lastDump reads the total instruction count of the newest dump and
// removes every dump (each can be megabytes).
func (cg *callgrind) lastDump() (float64, error) {
	paths, err := filepath.Glob(filepath.Join(cg.dir, "cg.out.*"))
	if err != nil {
		return 0, err
	}
	if len(paths) == 0 {
		return 0, errors.New("callgrind wrote no dump")
	}
	part := func(p string) int {
		n, _ := strconv.Atoi(p[strings.LastIndexByte(p, '.')+1:])
		return n
	}
	sort.Slice(paths, func(i, j int) bool { return part(paths[i]) < part(paths[j]) })
	defer func() {
		for _, p := range paths {
			_ = os.Remove(p)
		}
	}()
	return dumpTotal(paths[len(paths)-1])
}

// dumpTotal reads the "summary:" (or "totals:") line of a callgrind dump:
// the instructions of the dumped interval.
func dumpTotal(path string) (float64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		for _, prefix := range []string{"summary:", "totals:"} {
			if rest, ok := strings.CutPrefix(line, prefix); ok {
				fields := strings.Fields(rest)
				if len(fields) == 0 {
					return 0, fmt.Errorf("%s: empty %s line", path, prefix)
				}
				return strconv.ParseFloat(fields[0], 64)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%s has no summary line", path)
}

// stop ends the server (and valgrind) and removes the output files.
func (cg *callgrind) stop() {
	if cg.cmd.Process != nil {
		_ = cg.cmd.Process.Kill() // valgrind runs Redis in its own process: one pid
	}
	select {
	case <-cg.exited:
	case <-time.After(10 * time.Second):
	}
	_ = os.RemoveAll(cg.dir)
}
