package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// startSpawned starts the redis-server at bin for Real.
func startSpawned(bin string) (*deployment, error) {
	p, err := spawn(bin, false)
	if err != nil {
		return nil, err
	}
	return &deployment{
		addrs:  []string{p.addr},
		source: fmt.Sprintf("%s redis-server %s (%s)", originSpawned, p.version, bin),
		stop:   p.kill,
	}, nil
}

// urlDeployment is the server at a REDIS_URL: it checks that the server
// answers, so that a wrong URL fails with one clear message, and reads its
// version for the source line. The server is not ours to stop.
func urlDeployment(url string) (*deployment, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	version, err := serverVersion(opt)
	if err != nil {
		return nil, fmt.Errorf("REDIS_URL %s: %w", opt.Addr, err)
	}
	return &deployment{
		addrs:  []string{opt.Addr},
		opt:    opt,
		source: fmt.Sprintf("%s: redis %s at %s", originURL, version, opt.Addr),
		stop:   func() {},
	}, nil
}

// serverVersion returns the redis_version of the server opt points at.
func serverVersion(opt *redis.Options) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := redis.NewClient(opt)
	defer func() { _ = c.Close() }()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return "", fmt.Errorf("INFO server: %w", err)
	}
	return infoField(info, "redis_version"), nil
}

// proc is a redis-server child process.
type proc struct {
	addr    string
	version string // redis_version of INFO server
	cmd     *exec.Cmd
	exited  chan struct{} // closed once cmd.Wait has returned
	dir     string
	logPath string
}

// spawn starts a redis-server on a free port, in cluster mode if cluster, and
// waits until it answers PING.
func spawn(bin string, cluster bool) (*proc, error) {
	// The port is free when freePort returns but another process may take it
	// before redis-server binds it; the next attempt picks another.
	for attempt := 1; ; attempt++ {
		p, err := spawnOnce(bin, cluster)
		if err == nil || attempt == 3 {
			return p, err
		}
	}
}

func spawnOnce(bin string, cluster bool) (*proc, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "redis.log")
	log, err := os.Create(logPath)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	args := []string{
		"--save", "", "--appendonly", "no",
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--daemonize", "no", "--dir", dir,
	}
	if cluster {
		args = append(args,
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes-"+strconv.Itoa(port)+".conf"),
			// Every node is reached, and announces itself, on loopback.
			"--cluster-announce-ip", "127.0.0.1",
		)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	// An *os.File is handed to the child as is: no copying goroutines.
	cmd.Stdout, cmd.Stderr = log, log
	setDeathSignal(cmd)
	err = cmd.Start()
	_ = log.Close()
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("starting redis-server: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	p := &proc{
		addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		cmd:  cmd, exited: exited, dir: dir, logPath: logPath,
	}
	if p.version, err = p.waitReady(); err != nil {
		err = p.failed(err)
		p.kill()
		return nil, fmt.Errorf("redis-server %s: %w", strings.Join(args, " "), err)
	}
	return p, nil
}

// waitReady waits until the server answers PING and returns its version.
func (p *proc) waitReady() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := redis.NewClient(&redis.Options{Addr: p.addr, MaxRetries: -1, DialTimeout: time.Second})
	defer func() { _ = c.Close() }()
	err := poll(ctx, "PONG", []*proc{p}, func() error { return c.Ping(ctx).Err() })
	if err != nil {
		return "", err
	}
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return "", fmt.Errorf("INFO server: %w", err)
	}
	// Another server may answer on the port: two spawns given the same
	// free port at once, the other bound it and this one failed to (a CI
	// run formed a cluster of one node twice over). The answer must be
	// this child's; else spawn tries another port.
	if pid := infoField(info, "process_id"); pid != strconv.Itoa(p.cmd.Process.Pid) {
		return "", fmt.Errorf("%s answered from process %s, not the server started (pid %d)", p.addr, pid, p.cmd.Process.Pid)
	}
	return infoField(info, "redis_version"), nil
}

// failed appends the tail of the server's log to err.
func (p *proc) failed(err error) error {
	return fmt.Errorf("%w\n%s", err, p.logTail())
}

// logTail returns the end of the server's log.
func (p *proc) logTail() []byte {
	out, _ := os.ReadFile(p.logPath)
	return tail(out, 2000)
}

// kill kills the server and removes its directory. There is nothing to save,
// so no need for a graceful SHUTDOWN.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
	_ = os.RemoveAll(p.dir)
}

// poll calls ok every 20ms until it returns nil, one of procs exits or ctx
// ends; the error then names what was awaited and ok's last error.
func poll(ctx context.Context, what string, procs []*proc, ok func() error) error {
	for {
		err := ok()
		if err == nil {
			return nil
		}
		for _, p := range procs {
			select {
			case <-p.exited:
				return fmt.Errorf("%s exited while waiting for %s", p.addr, what)
			default:
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no %s: %w (last: %v)", what, ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// infoField returns the value of name in an INFO or CLUSTER INFO reply.
func infoField(info, name string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
