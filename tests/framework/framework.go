// Package framework runs one cluster test body two ways, as etcd's
// tests/framework does: with the nodes in the test's own process
// (node/nodetest) and with real kvmeshd processes (tests/harness). A test
// writes its body against Cluster and hands it to Run with the Runners it
// wants; each runs as a subtest named after its runner.
//
// Only what both ways can do is in Cluster: member addresses, a clean stop
// and a crash of a member, its restart at the same addresses and data
// directory, readiness, and a client. Tests of one way's internals (a
// node's replicator, a process's signals or log) use nodetest or harness
// directly.
//
// Imported only by tests.
package framework

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/nodetest"
	"github.com/kvmesh/kvmesh/tests/harness"
)

// RPCTimeout is the deadline of the members' calls to each other and of
// the cluster's client.
const RPCTimeout = 3 * time.Second

// Options says how a Runner builds its members; both ways read them the
// same. The zero Options is 64 MiB of DRAM and no disk tier.
type Options struct {
	// DRAMBytes is each member's DRAM tier. Default 64 MiB.
	DRAMBytes int64
	// DiskBytes is each member's disk tier budget; 0: none.
	DiskBytes int64
}

func (o Options) dram() int64 {
	if o.DRAMBytes == 0 {
		return 64 << 20
	}
	return o.DRAMBytes
}

// Cluster is a started cluster of members 0…Len()-1, named n1, n2, …, that
// bootstrapped together; every member was ready with all of them in its
// ring when Start returned. Everything it started ends with the test.
type Cluster interface {
	// Len is the number of members.
	Len() int
	// GRPCAddr is member i's gRPC address (stable across restarts).
	GRPCAddr(i int) string
	// Addrs is every member's gRPC address, client seeds.
	Addrs() []string
	// Stop stops member i cleanly: kvmeshd's SIGTERM, a node's Close
	// (DRAM spilled to a disk tier when it has one).
	Stop(i int) error
	// Kill crashes member i: SIGKILL of a process; in process, a Close,
	// as nodetest's Stop (what a DRAM-only node holds is lost either way).
	Kill(i int)
	// Restart starts member i again, at the same ID, addresses and data
	// directory, after Stop or Kill. It does not wait for readiness.
	Restart(ctx context.Context, i int) error
	// WaitReady waits until member i says it is ready.
	WaitReady(i int)
	// Client is a client over the cluster (all members as seeds),
	// closed at test end.
	Client() *client.Client
}

// A Runner starts clusters one way.
type Runner interface {
	// Name names the subtest Run runs the body in.
	Name() string
	// Start starts n members of opts (skipping t where this way cannot
	// run here) and returns them ready.
	Start(t *testing.T, n int, opts Options) Cluster
}

// Run runs body once per runner, each as a subtest over a fresh cluster of
// n members.
func Run(t *testing.T, n int, opts Options, runners []Runner, body func(t *testing.T, c Cluster)) {
	t.Helper()
	for _, r := range runners {
		t.Run(r.Name(), func(t *testing.T) {
			body(t, r.Start(t, n, opts))
		})
	}
}

// newClient dials a client over addrs, closed at test end.
func newClient(t *testing.T, addrs []string) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), nodetest.StartTimeout)
	defer cancel()
	c, err := client.New(ctx, client.Config{Seeds: addrs, RPCTimeout: RPCTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitReady waits until the member at addr answers Stats as ready: the
// same question for both ways (the process's /readyz says the same).
func waitReady(t *testing.T, c *client.Client, id, addr string) {
	t.Helper()
	testutil.WaitFor(t, id+" ready", func() bool {
		_, state, err := c.StatsAndState(t.Context(), addr)
		return err == nil && state == "ready"
	})
}

// waitRing waits until c's ring holds n members.
func waitRing(t *testing.T, c *client.Client, n int) {
	t.Helper()
	testutil.WaitFor(t, fmt.Sprintf("the client's ring of %d", n), func() bool {
		return c.Refresh(t.Context()) == nil && c.Ring().Len() == n
	})
}

// InProcess starts the members in the test's process through nodetest.
type InProcess struct {
	// Node, if set, edits member i's configuration after Options.
	Node func(i int, cfg *node.Config)
}

// Name implements Runner.
func (InProcess) Name() string { return "in-process" }

// Start implements Runner.
func (r InProcess) Start(t *testing.T, n int, opts Options) Cluster {
	t.Helper()
	nc := nodetest.Start(t, n, nodetest.Config{Node: func(i int, cfg *node.Config) {
		cfg.DRAMBytes, cfg.DiskBytes, cfg.RPCTimeout = opts.dram(), opts.DiskBytes, RPCTimeout
		if r.Node != nil {
			r.Node(i, cfg)
		}
	}})
	c := &inProcess{t: t, nc: nc}
	c.c = newClient(t, nc.Addrs())
	waitRing(t, c.c, n)
	return c
}

type inProcess struct {
	t  *testing.T
	nc *nodetest.Cluster
	c  *client.Client
}

func (c *inProcess) Len() int               { return len(c.nc.Nodes) }
func (c *inProcess) GRPCAddr(i int) string  { return c.nc.Configs[i].GRPCAddr }
func (c *inProcess) Addrs() []string        { return c.nc.Addrs() }
func (c *inProcess) Stop(i int) error       { return c.nc.Stop(i) }
func (c *inProcess) Kill(i int)             { _ = c.nc.Stop(i) }
func (c *inProcess) Client() *client.Client { return c.c }

// Restart fails the test itself (nodetest's way) when the node cannot start.
func (c *inProcess) Restart(_ context.Context, i int) error {
	c.nc.Restart(i)
	return nil
}

func (c *inProcess) WaitReady(i int) {
	c.t.Helper()
	waitReady(c.t, c.c, c.nc.Configs[i].NodeID, c.GRPCAddr(i))
}

// Processes starts the members as kvmeshd processes through harness, member
// i on Hosts[i].
type Processes struct {
	// Bin returns the kvmeshd to run (skipping t when it cannot be built).
	Bin func(testing.TB) string
	// Hosts are the members' loopback hosts, one per member; the test
	// skips when they cannot be bound.
	Hosts []string
	// Args are further flags of every member.
	Args []string
}

// Name implements Runner.
func (Processes) Name() string { return "processes" }

// Start implements Runner.
func (r Processes) Start(t *testing.T, n int, opts Options) Cluster {
	t.Helper()
	if len(r.Hosts) < n {
		t.Fatalf("framework: %d hosts for %d members", len(r.Hosts), n)
	}
	hosts := r.Hosts[:n]
	if err := harness.Bindable(hosts...); err != nil {
		t.Skipf("loopback aliases needed: %v", err)
	}
	bin := r.Bin(t)
	common := append([]string{"-bootstrap-expect", strconv.Itoa(n), "-local-timing", "-dead-grace", "1h",
		"-dram", strconv.FormatInt(opts.dram(), 10), "-disk", strconv.FormatInt(opts.DiskBytes, 10),
		"-rpc-timeout", RPCTimeout.String()}, r.Args...)
	c := &processes{t: t, procs: make([]*harness.Proc, n)}
	for i, h := range hosts {
		args := slices.Clone(common)
		if i > 0 {
			args = append(args, "-join", c.procs[0].Addr("gossip"))
		}
		id := fmt.Sprintf("n%d", i+1)
		p := harness.NewProc(harness.ProcConfig{Bin: bin, ID: id, Host: h, DataDir: t.TempDir(),
			LogPath: filepath.Join(t.TempDir(), id+".log"), Args: args, ReadyTimeout: time.Minute})
		t.Cleanup(func() {
			p.Kill()
			if t.Failed() {
				b, _ := os.ReadFile(p.LogPath())
				if len(b) > 4000 {
					b = b[len(b)-4000:]
				}
				t.Logf("log of %s (tail):\n%s", id, b)
			}
		})
		if err := p.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		c.procs[i] = p
	}
	c.c = newClient(t, c.Addrs())
	for i := range c.procs {
		c.WaitReady(i)
	}
	waitRing(t, c.c, n)
	return c
}

type processes struct {
	t     *testing.T
	procs []*harness.Proc
	c     *client.Client
}

func (c *processes) Len() int               { return len(c.procs) }
func (c *processes) GRPCAddr(i int) string  { return c.procs[i].Addr("grpc") }
func (c *processes) Client() *client.Client { return c.c }
func (c *processes) Kill(i int)             { c.procs[i].Kill() }

func (c *processes) Addrs() []string {
	out := make([]string, len(c.procs))
	for i, p := range c.procs {
		out[i] = p.Addr("grpc")
	}
	return out
}

// stopTimeout bounds a clean stop; a node spilling its DRAM to disk takes
// seconds on a loaded machine.
const stopTimeout = 30 * time.Second

func (c *processes) Stop(i int) error { return c.procs[i].Terminate(stopTimeout) }

func (c *processes) Restart(ctx context.Context, i int) error { return c.procs[i].Start(ctx) }

func (c *processes) WaitReady(i int) {
	c.t.Helper()
	waitReady(c.t, c.c, c.procs[i].ID(), c.GRPCAddr(i))
}

// Entries are entries a test wrote through a client, to read back.
type Entries struct {
	Keys  []chunk.Key
	Blobs [][]byte
}

// RegisterAndPut registers testutil.Spec's model through c and puts n
// standalone entries of tokens tokens each, drawn from seed: the setup
// of the tests that write a data set and then break the cluster.
func RegisterAndPut(t testing.TB, ctx context.Context, c *client.Client, n, tokens int, seed uint64) Entries {
	t.Helper()
	spec := testutil.Spec()
	rng := rand.New(rand.NewPCG(21, seed))
	e := Entries{Keys: make([]chunk.Key, n), Blobs: make([][]byte, n)}
	for i := range n {
		e.Keys[i], e.Blobs[i] = testutil.StandaloneBlob(t, rng, spec, tokens)
	}
	RegisterAndPutBlobs(t, ctx, c, spec, e.Blobs)
	return e
}

// RegisterAndPutBlobs registers spec through c and puts blobs in order
// (PutBlobs), failing t on the first error: the "register, then write the
// data set from one client" setup of the cluster tests. It returns the
// puts' replies, in order.
func RegisterAndPutBlobs(t testing.TB, ctx context.Context, c *client.Client, spec chunk.ModelSpec, blobs [][]byte) []client.PutResult {
	t.Helper()
	if _, err := c.RegisterModel(ctx, spec); err != nil {
		t.Fatal(err)
	}
	return PutBlobs(t, ctx, c, blobs)
}

// PutBlobs is RegisterAndPutBlobs' second step alone, for a test that
// acts on the cluster between registering and writing.
func PutBlobs(t testing.TB, ctx context.Context, c *client.Client, blobs [][]byte) []client.PutResult {
	t.Helper()
	res := make([]client.PutResult, len(blobs))
	for i, b := range blobs {
		var err error
		if res[i], err = c.Put(ctx, b); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	return res
}

// Check reads every entry back through c and compares its bytes; after
// says when, for the failure message.
func (e Entries) Check(t testing.TB, ctx context.Context, c *client.Client, after string) {
	t.Helper()
	for i, k := range e.Keys {
		b, err := c.Get(ctx, k)
		if err != nil {
			t.Fatalf("entry %d lost %s: %v", i, after, err)
		}
		if !bytes.Equal(b, e.Blobs[i]) {
			t.Fatalf("entry %d: wrong bytes %s", i, after)
		}
	}
}
