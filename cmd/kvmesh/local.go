package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/node"
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

// localHosts returns n loopback hosts: 127.0.0.11, .12, ... when this
// machine can bind them, else 127.0.0.1 for all.
func localHosts(n int) []string {
	hosts := make([]string, n)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("127.0.0.%d", 11+i)
		l, err := net.Listen("tcp", hosts[i]+":0")
		if err != nil || 11+n > 255 {
			for j := range hosts {
				hosts[j] = "127.0.0.1"
			}
			return hosts
		}
		l.Close()
	}
	return hosts
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
	hosts := localHosts(n)
	var children []*child
	defer func() { stopChildren(children) }()
	for i := range n {
		id := fmt.Sprintf("n%d", i+1)
		a := append(append([]string(nil), argv[1:]...), "-id", id, "-data-dir", filepath.Join(*dir, id),
			"-grpc", hosts[i]+":0", "-bootstrap-expect", strconv.Itoa(n), "-local-timing", "-dram", *dram)
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

// demo runs a 3-node cluster in this process and exercises it: register
// a model, put chunks, look them up in a batch, read a head range back.
func demo(ctx context.Context, w io.Writer) error {
	dir, err := os.MkdirTemp("", "kvmesh-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	hosts := localHosts(3)
	var nodes []*node.Node
	defer func() {
		for _, n := range nodes {
			_ = n.Close()
		}
	}()
	var seeds []string
	for i, h := range hosts {
		n, err := node.New(node.Config{NodeID: fmt.Sprintf("n%d", i+1), DataDir: filepath.Join(dir, strconv.Itoa(i)),
			GRPCAddr: h + ":0", Seeds: seeds, BootstrapExpect: 3, DRAMBytes: 256 << 20, LocalTiming: true, Logger: log})
		if err != nil {
			return err
		}
		if err := n.Start(ctx); err != nil {
			return err
		}
		nodes = append(nodes, n)
		if i == 0 {
			seeds = []string{n.GossipAddr()}
		}
		fmt.Fprintf(w, "started %s grpc=%s http=%s\n", n.ID(), n.GRPCAddr(), n.HTTPAddr())
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for ready := false; !ready; {
		ready = true
		for _, n := range nodes {
			if n.Ready() != nil || n.Meta().Ring().Len() != 3 {
				ready = false
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster not ready: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	c, err := client.New(ctx, client.Config{Seeds: []string{nodes[0].GRPCAddr()}})
	if err != nil {
		return err
	}
	defer c.Close()
	spec := chunk.ModelSpec{Family: "llama", Layers: 16, KVHeads: 8, HeadDim: 64, DType: chunk.BF16, RopeStyle: chunk.RopeNeoX,
		RopeTheta: 500000, TokenizerID: "demo", WeightsRevision: "random"}
	fp, err := c.RegisterModel(ctx, spec)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "registered model %s (%d bytes of KV per token)\n", fp, spec.KVBytesPerToken())
	rng := rand.New(rand.NewPCG(1, 2))
	var keys []chunk.Key
	var blobs [][]byte
	var total int
	for range 48 {
		tokens := make([]uint32, 32+rng.IntN(96))
		for j := range tokens {
			tokens[j] = rng.Uint32N(128000)
		}
		e := &chunk.Entry{Key: chunk.Key{Fingerprint: fp, Content: chunk.ContentID(fp, tokens), Context: chunk.StandaloneContext()},
			DType: spec.DType, Layers: spec.Layers, KVHeads: spec.KVHeads, HeadDim: spec.HeadDim, Tokens: tokens}
		e.KV = make([]byte, e.Layers*e.LayerBytes())
		for j := 0; j < len(e.KV); j += 2 {
			v := chunk.F32ToBF16(float32(rng.NormFloat64()))
			e.KV[j], e.KV[j+1] = byte(v), byte(v>>8)
		}
		blob, err := chunk.Encode(nil, e, chunk.CodecRaw)
		if err != nil {
			return err
		}
		keys = append(keys, e.Key)
		blobs = append(blobs, blob)
		total += len(blob)
	}
	start := time.Now()
	for i, blob := range blobs {
		if _, err := c.Put(ctx, blob); err != nil {
			return fmt.Errorf("put %d: %w", i, err)
		}
	}
	el := time.Since(start)
	fmt.Fprintf(w, "put %d chunks, %s in %v (%.0f MB/s, one at a time, each to 3 replicas)\n", len(keys), human(uint64(total)), el.Round(time.Millisecond),
		float64(total)/el.Seconds()/1e6)
	items := make([]client.LookupItem, 0, len(keys)+2)
	for _, k := range keys {
		items = append(items, client.LookupItem{Content: k.Content, Want: chunk.StandaloneContext()})
	}
	items = append(items, client.LookupItem{Content: keys[0].Content, Want: chunk.PrefixContext(chunk.ID{Lo: 1})},
		client.LookupItem{Content: chunk.ID{Lo: 12345}, Want: chunk.StandaloneContext()})
	res, err := c.Lookup(ctx, fp, items)
	if err != nil {
		return err
	}
	count := map[client.Match]int{}
	for _, r := range res {
		count[r.Match]++
	}
	fmt.Fprintf(w, "lookup of %d items: %d EXACT, %d APPROXIMATE, %d MISS\n", len(items), count[client.Exact], count[client.Approximate], count[client.Miss])
	rr, err := c.GetRange(ctx, keys[0], chunk.Range{LayerLo: 0, LayerHi: 4, HeadLo: 2, HeadHi: 4})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "read layers [0,4) heads [2,4) of %s: %d bytes for %d tokens\n", keys[0], len(rr.Data), rr.Shape.Tokens)
	if err := status(ctx, c, w); err != nil {
		return err
	}
	return nil
}
