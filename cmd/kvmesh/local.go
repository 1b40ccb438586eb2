package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/kvmesh/kvmesh/daemon"
	"github.com/kvmesh/kvmesh/internal/loopback"
	"github.com/kvmesh/kvmesh/tests/harness"
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

// localClusterCmd is `kvmesh local-cluster N`. It prints its nodes as a
// table, or with -format json as one JSON object (localOut), then runs
// until ctx ends.
func localClusterCmd(ctx context.Context, e *env, args []string) error {
	fs := e.flags("local-cluster")
	dir := fs.String("dir", "", "data and log directory (default: a new temporary directory)")
	bin := fs.String("kvmeshd", "", "kvmeshd binary (default: next to kvmesh, in PATH, or kvmesh itself)")
	dram := fs.String("dram", "256M", "DRAM budget of each node")
	pos, err := e.parse(fs, args, 1, 1)
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(pos[0])
	if err != nil || n < 1 || n > 64 {
		return usagef("local-cluster: N must be 1..64, not %q", pos[0])
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
	var nodes []*harness.Proc
	defer func() { stopNodes(nodes) }()
	for i := range n {
		id := fmt.Sprintf("n%d", i+1)
		// More than MaxBootstrapExpect nodes: the first ones bootstrap,
		// the leader adds the others.
		a := []string{"-bootstrap-expect", strconv.Itoa(min(n, daemon.MaxBootstrapExpect))}
		if n == 1 {
			a = []string{"-bootstrap"}
		}
		a = append(a, "-local-timing", "-dram", *dram)
		if i > 0 {
			a = append(a, "-join", nodes[0].Addr("gossip"))
		}
		p := harness.NewProc(harness.ProcConfig{Bin: argv[0], BinArgs: argv[1:], ID: id, Host: hosts[i],
			DataDir: filepath.Join(*dir, id), LogPath: filepath.Join(*dir, id+".log"), Args: a,
			OwnGroup: true, ReadyTimeout: time.Minute})
		if err := p.Start(ctx); err != nil {
			return err
		}
		nodes = append(nodes, p)
	}
	out := localOut{Dir: *dir}
	var grpcs []string
	for _, p := range nodes {
		out.Nodes = append(out.Nodes, localNode{p.ID(), p.Addr("grpc"), p.Addr("http"), p.Addr("gossip"), p.Addr("raft"), p.LogPath()})
		grpcs = append(grpcs, p.Addr("grpc"))
	}
	out.Addr = strings.Join(grpcs, ",")
	if err := e.print(out, func(w io.Writer) error {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NODE\tGRPC\tHTTP\tGOSSIP\tRAFT\tLOG")
		for _, n := range out.Nodes {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", n.ID, n.GRPC, n.HTTP, n.Gossip, n.Raft, n.Log)
		}
		tw.Flush()
		_, err := fmt.Fprintf(w, "\n%d nodes running (data in %s). Try:\n  export KVMESH_ADDR=%s\n  kvmesh status\nCtrl-C stops them.\n",
			n, out.Dir, out.Addr)
		return err
	}); err != nil {
		return err
	}
	watched := slices.Clone(nodes)
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(e.stderr, "stopping")
			return nil
		case <-time.After(time.Second):
		}
		for i, p := range watched {
			if p.Running() {
				continue
			}
			// Status 0 without a signal: a drain took it out of the
			// cluster; the others go on.
			if err := p.ExitErr(); err != nil {
				return fmt.Errorf("%s exited: %v (see its log)", p.ID(), err)
			}
			fmt.Fprintf(e.stderr, "%s left the cluster and exited\n", p.ID())
			watched = slices.Delete(watched, i, i+1)
			break
		}
	}
}

// stopNodes sends SIGTERM to every node at once and waits for them
// (SIGKILL after 15s).
func stopNodes(nodes []*harness.Proc) {
	var wg sync.WaitGroup
	for _, p := range nodes {
		wg.Go(func() { _ = p.Terminate(15 * time.Second) })
	}
	wg.Wait()
}

// localOut is `kvmesh local-cluster -format json`.
type localOut struct {
	Dir   string      `json:"dir"`
	Addr  string      `json:"addr"` // for KVMESH_ADDR
	Nodes []localNode `json:"nodes"`
}

type localNode struct {
	ID     string `json:"id"`
	GRPC   string `json:"grpc"`
	HTTP   string `json:"http"`
	Gossip string `json:"gossip"`
	Raft   string `json:"raft"`
	Log    string `json:"log"`
}
