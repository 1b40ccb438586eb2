// Package harness runs real kvmeshd processes for integration and chaos
// tests: it builds the binary once, starts nodes on their own loopback
// addresses, restarts them on the same ports and data directory, sends them
// signals, and cuts links between them with tagged iptables rules that it
// always removes again.
//
// It is the one way kvmeshd processes are started: by every suite under
// tests/ and by `kvmesh local-cluster`, so it is a plain (non-test)
// package. It imports nothing of kvmesh.
package harness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Build compiles cmd/kvmeshd into dir and returns its path. It fails with
// ErrNoGo when there is no go command (callers skip then).
func Build(ctx context.Context, dir string) (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrNoGo, err)
	}
	bin := filepath.Join(dir, "kvmeshd")
	cmd := exec.CommandContext(ctx, goBin, "build", "-o", bin, "github.com/kvmesh/kvmesh/cmd/kvmeshd")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	// Build inside the module even when the test binary runs elsewhere.
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		if _, err := os.Stat(file); err == nil {
			cmd.Dir = filepath.Dir(file)
		}
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("harness: build kvmeshd: %w\n%s", err, out)
	}
	return bin, nil
}

// ErrNoGo: the go command is missing, so kvmeshd cannot be built.
var ErrNoGo = errors.New("harness: no go command")

// Bindable reports the first host of hosts that cannot be bound (loopback
// aliases beyond 127.0.0.1 are missing on some systems).
func Bindable(hosts ...string) error {
	for _, h := range hosts {
		l, err := net.Listen("tcp", net.JoinHostPort(h, "0"))
		if err != nil {
			return fmt.Errorf("cannot bind %s: %w", h, err)
		}
		l.Close()
	}
	return nil
}

// ProcConfig describes one node process.
type ProcConfig struct {
	Bin string // kvmeshd binary (required)
	// BinArgs come before the node's flags: {"kvmeshd"} when Bin is a
	// kvmesh binary that runs the daemon as a command.
	BinArgs []string
	ID      string   // node ID (required)
	Host    string   // loopback address every listener binds (required)
	DataDir string   // data directory, kept across restarts (required)
	LogPath string   // stderr of every incarnation is appended here (required)
	Args    []string // further flags (-join, -bootstrap-expect, ...)
	// Cgroup is a cgroup v2 directory every incarnation starts in
	// (Firewall.Cgroup); "" starts it in the test's own.
	Cgroup string
	// OwnGroup starts every incarnation in its own process group, so that
	// a terminal's Ctrl-C reaches only the starter, which then stops the
	// nodes in order.
	OwnGroup bool
	// ReadyTimeout bounds the wait for the ready line. Default 30 s.
	ReadyTimeout time.Duration
}

// Proc is one node: a sequence of kvmeshd incarnations on the same
// addresses and data directory. Its methods are safe for concurrent use.
type Proc struct {
	cfg ProcConfig

	mu          sync.Mutex
	cmd         *exec.Cmd
	done        chan struct{} // closed when the current incarnation exited
	exitErr     error
	addrs       map[string]string
	stopped     bool
	incarnation int
}

// NewProc returns a node that Start runs.
func NewProc(cfg ProcConfig) *Proc {
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 30 * time.Second
	}
	return &Proc{cfg: cfg}
}

// ID is the node ID.
func (p *Proc) ID() string { return p.cfg.ID }

// Host is the node's loopback address.
func (p *Proc) Host() string { return p.cfg.Host }

// LogPath is the file holding the stderr of every incarnation.
func (p *Proc) LogPath() string { return p.cfg.LogPath }

// Addr returns the bound address of a listener: "grpc", "gossip", "raft",
// "http", or another the ready line names ("resp"), as of the last start
// ("" before the first).
func (p *Proc) Addr(kind string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addrs[kind]
}

// Ports are the bound ports of every listener (empty before the first
// start).
func (p *Proc) Ports() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []int
	for _, k := range []string{"grpc", "gossip", "raft", "http"} {
		if _, ps, err := net.SplitHostPort(p.addrs[k]); err == nil {
			if n, err := strconv.Atoi(ps); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// Incarnation counts the starts so far.
func (p *Proc) Incarnation() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.incarnation
}

// Running reports whether an incarnation is alive (possibly stopped).
func (p *Proc) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Start runs a new incarnation and waits for its ready line. The first
// start binds port 0 everywhere; later ones reuse the ports the first one
// got, so the node comes back on the same addresses.
func (p *Proc) Start(ctx context.Context) error {
	p.mu.Lock()
	if p.done != nil {
		select {
		case <-p.done:
		default:
			p.mu.Unlock()
			return fmt.Errorf("harness: %s is running", p.cfg.ID)
		}
	}
	args := append(slices.Clip(p.cfg.BinArgs), "-id", p.cfg.ID, "-data-dir", p.cfg.DataDir)
	if !slices.Contains(p.cfg.Args, "-tls-cert") {
		// Loopback test clusters run without TLS unless Args configure it.
		args = append(args, "-insecure")
	}
	if p.addrs == nil {
		// Port 0 everywhere, never kvmeshd's fixed default ports: test
		// clusters must not collide with each other or a real node.
		free := net.JoinHostPort(p.cfg.Host, "0")
		args = append(args, "-grpc", free, "-gossip", free, "-raft", free, "-http", free)
	} else {
		args = append(args, "-grpc", p.addrs["grpc"], "-gossip", p.addrs["gossip"], "-raft", p.addrs["raft"], "-http", p.addrs["http"])
	}
	args = append(args, p.cfg.Args...)
	logf, err := os.OpenFile(p.cfg.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		p.mu.Unlock()
		return fmt.Errorf("harness: %w", err)
	}
	fmt.Fprintf(logf, "==== harness: start %s incarnation %d at %s: %s\n", p.cfg.ID, p.incarnation+1, time.Now().Format(time.RFC3339Nano), strings.Join(args, " "))
	cmd, out, err := p.spawn(args, logf)
	if err != nil {
		logf.Close()
		p.mu.Unlock()
		return err
	}
	done := make(chan struct{})
	p.cmd, p.done, p.exitErr, p.stopped = cmd, done, nil, false
	p.incarnation++
	p.mu.Unlock()

	ready := make(chan map[string]string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if line := sc.Text(); strings.HasPrefix(line, "kvmeshd listening ") {
				m := make(map[string]string)
				for _, f := range strings.Fields(line)[2:] {
					k, v, _ := strings.Cut(f, "=")
					m[k] = v
				}
				select {
				case ready <- m:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, out)
		err := cmd.Wait()
		logf.Close()
		p.mu.Lock()
		p.exitErr = err
		p.mu.Unlock()
		close(done)
	}()
	t := time.NewTimer(p.cfg.ReadyTimeout)
	defer t.Stop()
	select {
	case m := <-ready:
		p.mu.Lock()
		// A restart binds the same grpc, gossip, raft and http addresses
		// (pinned above); a listener left to pick its port (-resp
		// HOST:0) may bind another.
		p.addrs = m
		p.mu.Unlock()
		return nil
	case <-done:
		return fmt.Errorf("harness: %s exited before ready: %v (log %s)", p.cfg.ID, p.ExitErr(), p.cfg.LogPath)
	case <-t.C:
		p.Kill()
		return fmt.Errorf("harness: %s: no ready line within %v (log %s)", p.cfg.ID, p.cfg.ReadyTimeout, p.cfg.LogPath)
	case <-ctx.Done():
		p.Kill()
		return ctx.Err()
	}
}

// spawn starts kvmeshd with args, in the node's cgroup when it has one.
func (p *Proc) spawn(args []string, logf *os.File) (*exec.Cmd, io.ReadCloser, error) {
	cgroupFD := -1
	if p.cfg.Cgroup != "" {
		d, err := os.Open(p.cfg.Cgroup)
		if err != nil {
			return nil, nil, fmt.Errorf("harness: cgroup of %s: %w", p.cfg.ID, err)
		}
		defer d.Close()
		cgroupFD = int(d.Fd())
	}
	cmd := exec.Command(p.cfg.Bin, args...)
	cmd.Stderr = logf
	cmd.SysProcAttr = procAttr(cgroupFD, p.cfg.OwnGroup)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, fmt.Errorf("harness: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("harness: start %s: %w", p.cfg.ID, err)
	}
	return cmd, out, nil
}

// ExitErr is how the last incarnation ended (nil while running).
func (p *Proc) ExitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exitErr
}

func (p *Proc) current() (*exec.Cmd, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd, p.done
}

// Pid is the process ID of the current incarnation (0 before the first
// start).
func (p *Proc) Pid() int {
	cmd, _ := p.current()
	if cmd == nil || cmd.Process == nil {
		return 0
	}
	return cmd.Process.Pid
}

// Exited is closed when the current incarnation has exited (ExitErr then
// says how); nil before the first start.
func (p *Proc) Exited() <-chan struct{} {
	_, done := p.current()
	return done
}

// Signal sends sig to the running incarnation.
func (p *Proc) Signal(sig syscall.Signal) error {
	cmd, done := p.current()
	if cmd == nil {
		return fmt.Errorf("harness: %s never started", p.cfg.ID)
	}
	select {
	case <-done:
		return fmt.Errorf("harness: %s is not running", p.cfg.ID)
	default:
	}
	if err := cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("harness: signal %s: %w", p.cfg.ID, err)
	}
	p.mu.Lock()
	switch sig {
	case syscall.SIGSTOP:
		p.stopped = true
	case syscall.SIGCONT:
		p.stopped = false
	}
	p.mu.Unlock()
	return nil
}

// Stopped reports whether the incarnation was sent SIGSTOP and not SIGCONT.
func (p *Proc) Stopped() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stopped
}

// Kill sends SIGKILL and waits for the exit (a stopped process dies too).
func (p *Proc) Kill() {
	cmd, done := p.current()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// Terminate sends SIGTERM (after SIGCONT, in case it was stopped) and
// waits up to timeout for a clean exit, then kills. It returns the exit
// error of a clean exit, or an error saying it had to kill.
func (p *Proc) Terminate(timeout time.Duration) error {
	cmd, done := p.current()
	if cmd == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGCONT)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		return p.ExitErr()
	case <-t.C:
		p.Kill()
		return fmt.Errorf("harness: %s did not exit within %v of SIGTERM", p.cfg.ID, timeout)
	}
}

// CanSpawnIn checks that a process can be started inside the cgroup dir
// (clone3 with a cgroup needs Linux 5.7 and a writable hierarchy).
func CanSpawnIn(dir string) error {
	bin, err := exec.LookPath("true")
	if err != nil {
		return fmt.Errorf("harness: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("harness: %w", err)
	}
	defer d.Close()
	cmd := exec.Command(bin)
	cmd.SysProcAttr = procAttr(int(d.Fd()), false)
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("harness: start a process in cgroup %s: %w", dir, err)
	}
	return nil
}
