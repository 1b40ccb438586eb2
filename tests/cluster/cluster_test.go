// Package cluster holds real-process tests: it builds kvmeshd, starts
// nodes on their own loopback addresses, and drives them with the Go
// client. The addresses (127.0.0.21-25, .31-33; the rebalance benchmark
// .51-54) are apart from tests/chaos (.11-15), whose partitions drop
// whole address pairs, and tests/inject (.41-43): go test runs packages
// in parallel.
package cluster

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/tests/harness"
)

// kvmeshdBin is the kvmeshd that TestMain built, or why it could not.
var kvmeshdBin, kvmeshdErr = "", error(nil)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kvmeshd-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	flag.Parse()
	if testing.Short() {
		// Every process test skips under -short: no build to wait for.
		kvmeshdErr = fmt.Errorf("%w: not built under -short", harness.ErrNoGo)
	} else {
		kvmeshdBin, kvmeshdErr = harness.Build(context.Background(), dir)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if err := testutil.Leaks(); code == 0 && err != nil {
		fmt.Fprintf(os.Stderr, "goroutines left running after the tests: %v\n", err)
		code = 1
	}
	os.Exit(code)
}

// buildKvmeshd returns the kvmeshd TestMain built; it skips when there
// was no go command to build it.
func buildKvmeshd(tb testing.TB) string {
	tb.Helper()
	if errors.Is(kvmeshdErr, harness.ErrNoGo) {
		tb.Skip(kvmeshdErr)
	}
	if kvmeshdErr != nil {
		tb.Fatal(kvmeshdErr)
	}
	return kvmeshdBin
}

// checkBindable skips unless every host can be bound (loopback aliases
// beyond 127.0.0.1 are missing on some systems).
func checkBindable(tb testing.TB, hosts ...string) {
	tb.Helper()
	if err := harness.Bindable(hosts...); err != nil {
		tb.Skipf("loopback aliases needed: %v", err)
	}
}

// start runs kvmeshd (harness.Proc) as node id on host with its data in
// dataDir and further flags args, and waits for its ready line. The
// process is killed when the test or benchmark ends (and, on Linux, when
// its binary dies first, so that a test killed by its timeout leaves no
// node behind); the tail of its log is logged on failure. Proc.Start
// restarts it on the same addresses and data directory. The tests and
// BenchmarkRebalance10G share it.
// waitMembers waits until c's ClusterInfo shows n members and a leader
// and c's ring holds the n, and returns that ClusterInfo.
func waitMembers(ctx context.Context, tb testing.TB, c *client.Client, n int) *api.ClusterInfoResponse {
	tb.Helper()
	var info *api.ClusterInfoResponse
	testutil.WaitFor(tb, fmt.Sprintf("a cluster of %d members with a leader", n), func() bool {
		got, err := c.ClusterInfo(ctx)
		if err != nil || len(got.Members) != n || got.LeaderId == "" {
			return false
		}
		info = got
		return c.Refresh(ctx) == nil && c.Ring().Len() == n
	})
	return info
}

func start(tb testing.TB, bin, id, host, dataDir string, args ...string) *harness.Proc {
	tb.Helper()
	p := harness.NewProc(harness.ProcConfig{Bin: bin, ID: id, Host: host, DataDir: dataDir,
		LogPath: filepath.Join(tb.TempDir(), id+".log"), Args: args, ReadyTimeout: time.Minute})
	tb.Cleanup(func() {
		p.Kill()
		if tb.Failed() {
			b, _ := os.ReadFile(p.LogPath())
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			tb.Logf("log of %s (tail):\n%s", id, b)
		}
	})
	if err := p.Start(tb.Context()); err != nil {
		tb.Fatal(err)
	}
	return p
}

func TestThreeProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts processes")
	}
	hosts := []string{"127.0.0.31", "127.0.0.32", "127.0.0.33"}
	checkBindable(t, hosts...)
	bin := buildKvmeshd(t)

	var procs []*harness.Proc
	var dirs []string
	for i, h := range hosts {
		dirs = append(dirs, t.TempDir())
		args := []string{"-bootstrap-expect", "3", "-local-timing",
			"-dead-grace", "1h", "-dram", "64M", "-rpc-timeout", "3s", "-log-level", "debug"}
		if i > 0 {
			args = append(args, "-join", procs[0].Addr("gossip"))
		}
		procs = append(procs, start(t, bin, fmt.Sprintf("n%d", i+1), h, dirs[i], args...))
	}
	for i, p := range procs {
		for _, k := range []string{"grpc", "gossip", "raft", "http"} {
			if h, _, err := net.SplitHostPort(p.Addr(k)); err != nil || h != hosts[i] {
				t.Fatalf("%s bound %s=%q, want host %s", p.ID(), k, p.Addr(k), hosts[i])
			}
		}
	}

	// Generous: a loaded 2-core machine (CI runs other packages' tests
	// alongside) runs the cluster many times slower than an idle one.
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var seeds []string
	for _, p := range procs {
		seeds = append(seeds, p.Addr("grpc"))
	}
	c, err := client.New(ctx, client.Config{Seeds: seeds, RPCTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitMembers(ctx, t, c, 3)

	rng := rand.New(rand.NewPCG(7, 7))
	spec := testutil.Spec()
	k0, b0 := testutil.StandaloneBlob(t, rng, spec, 16)
	if _, err := c.Put(ctx, b0); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("put of an unregistered model: %v, want FailedPrecondition", err)
	}
	if _, err := c.RegisterModel(ctx, spec); err != nil {
		t.Fatal(err)
	}
	keys := []chunk.Key{k0}
	blobs := [][]byte{b0}
	if _, err := c.Put(ctx, b0); err != nil {
		t.Fatal(err)
	}
	for i := range 15 {
		k, b := testutil.StandaloneBlob(t, rng, spec, 8+i*8)
		if _, err := c.Put(ctx, b); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		keys, blobs = append(keys, k), append(blobs, b)
	}
	bad := bytes.Clone(blobs[1])
	bad[len(bad)/2] ^= 0x40
	if _, err := c.Put(ctx, bad); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("corrupt put: %v, want InvalidArgument", err)
	}
	readAll := func(when string) {
		t.Helper()
		for i, k := range keys {
			got, err := c.Get(ctx, k)
			if err != nil {
				t.Fatalf("%s: get %d: %v", when, i, err)
			}
			if !bytes.Equal(got, blobs[i]) {
				t.Fatalf("%s: get %d: bytes differ", when, i)
			}
		}
	}
	readAll("all up")

	// SIGKILL one node: with R=3 every entry has two live replicas.
	victim := procs[2]
	victim.Kill()
	readAll("one node killed")
	res, err := c.Lookup(ctx, spec.Fingerprint(), []client.LookupItem{{Content: keys[3].Content, Want: chunk.StandaloneContext()}})
	if err != nil || res[0].Match != chunk.MatchExact {
		t.Fatalf("lookup with a node down: %v %v", res, err)
	}

	// Restart the killed node on the same addresses and data directory: it
	// rejoins with its raft state and serves every entry again (its DRAM
	// tier is gone; it reads from the other replicas and repairs itself).
	restarted := victim
	if err := restarted.Start(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the restarted node to know the leader and the model", func() bool {
		models, leader, _, err := nodeView(ctx, restarted.Addr("grpc"))
		return err == nil && leader != "" && slices.Contains(models, spec.Fingerprint().String())
	})
	// Its first reads may race its connections to the others and its
	// startup pull: each read is retried until the test's deadline, and
	// wrong bytes fail at once.
	for i, k := range keys {
		testutil.WaitFor(t, fmt.Sprintf("get %d through the restarted node", i), func() bool {
			got, err := getFrom(ctx, restarted.Addr("grpc"), k)
			if err == nil && !bytes.Equal(got, blobs[i]) {
				t.Fatalf("get %d through the restarted node: bytes differ", i)
			}
			return err == nil
		})
	}

	// SIGTERM shuts a node down cleanly.
	if err := procs[1].Terminate(60 * time.Second); err != nil {
		t.Fatalf("kvmeshd after SIGTERM: %v", err)
	}
}
