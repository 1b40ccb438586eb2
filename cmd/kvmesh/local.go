package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/kvmesh/kvmesh/internal/loopback"
)

// daemonCommand returns how to run kvmeshd: the -kvmeshd flag, a kvmeshd
// next to this executable, one in PATH, or this executable's hidden
// "kvmeshd" command.
func daemonCommand(flagPath string) ([]string, error) {
	if flagPath != "" {
		return []string{flagPath}, nil
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	if p := filepath.Join(filepath.Dir(self), "kvmeshd"); isFile(p) {
		return []string{p}, nil
	}
	if p, err := exec.LookPath("kvmeshd"); err == nil {
		return []string{p}, nil
	}
	return []string{self, "kvmeshd"}, nil
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

type child struct {
	id    string
	cmd   *exec.Cmd
	addrs map[string]string
	done  chan error
}

func localCluster(ctx context.Context, args []string, w, stderr io.Writer) error {
	fs := flag.NewFlagSet("local-cluster", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "", "data and log directory (default: a new temporary directory)")
	bin := fs.String("kvmeshd", "", "kvmeshd binary (default: next to kvmesh, in PATH, or kvmesh itself)")
	dram := fs.String("dram", "256M", "DRAM budget of each node")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("usage: kvmesh local-cluster [-dir D] [-kvmeshd PATH] N")
	}
	n, err := strconv.Atoi(fs.Arg(0))
	if err != nil || n < 1 || n > 64 {
		return fmt.Errorf("N must be 1..64, not %q", fs.Arg(0))
	}
	if *dir == "" {
		if *dir, err = os.MkdirTemp("", "kvmesh-local-"); err != nil {
			return err
		}
	} else if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	argv, err := daemonCommand(*bin)
	if err != nil {
		return err
	}
	hosts := loopback.Hosts(n)
	var children []*child
	defer func() { stopChildren(children) }()
	for i := range n {
		id := fmt.Sprintf("n%d", i+1)
		a := append(append([]string(nil), argv[1:]...), "-id", id, "-data-dir", filepath.Join(*dir, id),
			"-grpc", hosts[i]+":0", "-bootstrap-expect", strconv.Itoa(n), "-local-timing", "-dram", *dram, "-insecure")
		if i > 0 {
			a = append(a, "-join", children[0].addrs["gossip"])
		}
		ch, err := startChild(ctx, argv[0], a, id, filepath.Join(*dir, id+".log"))
		if err != nil {
			return err
		}
		children = append(children, ch)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tGRPC\tHTTP\tGOSSIP\tRAFT\tLOG")
	var grpcs []string
	for _, ch := range children {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", ch.id, ch.addrs["grpc"], ch.addrs["http"], ch.addrs["gossip"], ch.addrs["raft"],
			filepath.Join(*dir, ch.id+".log"))
		grpcs = append(grpcs, ch.addrs["grpc"])
	}
	tw.Flush()
	fmt.Fprintf(w, "\n%d nodes running (data in %s). Try:\n  export KVMESH_ADDR=%s\n  kvmesh status\nCtrl-C stops them.\n",
		n, *dir, strings.Join(grpcs, ","))
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(w, "stopping")
			return nil
		case <-time.After(time.Second):
		}
		for _, ch := range children {
			select {
			case err := <-ch.done:
				ch.done <- err
				return fmt.Errorf("%s exited: %v (see its log)", ch.id, err)
			default:
			}
		}
	}
}

func startChild(ctx context.Context, bin string, args []string, id, logPath string) (*child, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stderr = logf
	// Its own process group: the terminal's Ctrl-C reaches kvmesh, which
	// then stops the children in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	ch := &child{id: id, cmd: cmd, done: make(chan error, 1)}
	ready := make(chan map[string]string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) > 2 && f[0] == "kvmeshd" && f[1] == "ready" {
				m := make(map[string]string)
				for _, kv := range f[2:] {
					k, v, _ := strings.Cut(kv, "=")
					m[k] = v
				}
				ready <- m
			}
		}
		ch.done <- cmd.Wait()
		logf.Close()
	}()
	select {
	case ch.addrs = <-ready:
		return ch, nil
	case err := <-ch.done:
		return nil, fmt.Errorf("%s exited before it was ready: %v (log: %s)", id, err, logPath)
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-ch.done
		return nil, ctx.Err()
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		<-ch.done
		return nil, fmt.Errorf("%s: not ready after a minute (log: %s)", id, logPath)
	}
}

// stopChildren sends SIGTERM to every child and waits (SIGKILL after 15s).
func stopChildren(children []*child) {
	for _, ch := range children {
		_ = ch.cmd.Process.Signal(syscall.SIGTERM)
	}
	deadline := time.After(15 * time.Second)
	for _, ch := range children {
		select {
		case <-ch.done:
		case <-deadline:
			_ = ch.cmd.Process.Kill()
			<-ch.done
		}
	}
}
