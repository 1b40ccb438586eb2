// Package nodetest starts in-process node clusters for tests: the one
// starter that every test outside package node uses for a cluster (or a
// single node) in its own process. Start builds n nodes on loopback from
// NodeConfig's defaults, closes each at test end through t.Cleanup and waits
// through testutil.WaitFor until every member is ready with all n in its
// ring; Stop and Restart take a member down and bring it back at the same
// addresses.
//
// Package node's own cluster tests use it too: they are in package
// node_test (a test in package node cannot import a package that imports
// node), and reach a node's store and replicator through node's
// export_test.go.
//
// Imported only by tests.
package nodetest

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/node"
)

// StartTimeout bounds one node's Start. It is a failure bound: a node on a
// loaded 2-core machine may take seconds to bind, open its store and join.
const StartTimeout = 30 * time.Second

// NodeConfig is the configuration of one test node id that joins seeds
// (none: it bootstraps a cluster of one). Its defaults: a temporary
// DataDir, 16 MiB of DRAM, no HTTP listener, local timing (short gossip and
// Raft intervals), dead members kept in the ring for an hour (so that reads
// must fail over rather than the ring shrinking under the test), a 3 s RPC
// timeout and a discarding logger. It sets no transport: the caller sets
// Insecure or TLS.
func NodeConfig(t testing.TB, id string, seeds []string) node.Config {
	expect := 0
	if len(seeds) == 0 {
		expect = 1
	}
	return node.Config{NodeID: id, DataDir: t.TempDir(), Seeds: seeds, BootstrapExpect: expect, DRAMBytes: 16 << 20,
		HTTPAddr: "off", LocalTiming: true, DeadGrace: time.Hour, RPCTimeout: 3 * time.Second,
		Logger: slog.New(slog.DiscardHandler)}
}

// StartNode starts one node of cfg, closed at test end, and returns it
// once Start has returned (not necessarily ready: a joining node may be
// refused, which is what some tests check).
func StartNode(t testing.TB, cfg node.Config) *node.Node {
	t.Helper()
	nd, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), StartTimeout)
	defer cancel()
	if err := nd.Start(ctx); err != nil {
		_ = nd.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nd.Close() })
	return nd
}

// Config says how Start builds its members. The zero Config starts
// insecure members from NodeConfig's defaults that bootstrap together.
type Config struct {
	// Join starts the first member as a cluster of one and, once it is
	// ready, the others joining it (as members added to a running
	// cluster). Default: all n bootstrap together (BootstrapExpect n).
	Join bool
	// Node edits member i's configuration after the defaults (Insecure
	// true, NodeConfig's) and before the node is built: TLS, tokens,
	// budgets, timeouts.
	Node func(i int, cfg *node.Config)
}

// Cluster is a started cluster. Nodes[i] is member i (n1, n2, …), or the
// node that last replaced it in Restart; Configs[i] is its configuration,
// with the addresses pinned to the ones it bound, so that a restarted
// member comes back where it was.
type Cluster struct {
	t       testing.TB
	Nodes   []*node.Node
	Configs []node.Config
}

// Start starts n members named n1…nn and waits until every one is ready
// with all n in its ring. Every member is closed at test end.
func Start(t testing.TB, n int, cfg Config) *Cluster {
	t.Helper()
	c := &Cluster{t: t, Nodes: make([]*node.Node, n), Configs: make([]node.Config, n)}
	var seeds []string
	for i := range n {
		nc := NodeConfig(t, fmt.Sprintf("n%d", i+1), seeds)
		if !cfg.Join {
			nc.BootstrapExpect = n
		}
		nc.Insecure = true
		if cfg.Node != nil {
			cfg.Node(i, &nc)
		}
		nd := StartNode(t, nc)
		nc.GRPCAddr, nc.GossipAddr, nc.RaftAddr = nd.GRPCAddr(), nd.GossipAddr(), nd.RaftAddr()
		c.Nodes[i], c.Configs[i] = nd, nc
		if i == 0 {
			seeds = []string{nd.GossipAddr()}
			if cfg.Join {
				testutil.WaitFor(t, "n1 ready", func() bool { return nd.Ready() == nil })
			}
		}
	}
	c.WaitRing(n, c.Nodes...)
	return c
}

// WaitRing waits until each of nodes is ready with a ring of n members.
func (c *Cluster) WaitRing(n int, nodes ...*node.Node) {
	c.t.Helper()
	WaitRing(c.t, n, nodes...)
}

// WaitRing waits until each of nodes is ready with a ring of n members.
func WaitRing(t testing.TB, n int, nodes ...*node.Node) {
	t.Helper()
	testutil.WaitFor(t, fmt.Sprintf("a ready ring of %d", n), func() bool {
		for _, nd := range nodes {
			if nd.Ready() != nil || nd.Meta().Ring().Len() != n {
				return false
			}
		}
		return true
	})
}

// Addrs returns the members' gRPC addresses, client seeds.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, nd := range c.Nodes {
		out[i] = nd.GRPCAddr()
	}
	return out
}

// Stop closes member i, as a crash of its process would (without a
// graceful leave).
func (c *Cluster) Stop(i int) error {
	return c.Nodes[i].Close()
}

// Restart starts member i again from its configuration (same ID, data
// directory and addresses), after Stop, and returns the new node, which
// replaces Nodes[i]. It does not wait for the node to be ready.
func (c *Cluster) Restart(i int) *node.Node {
	c.t.Helper()
	nd := StartNode(c.t, c.Configs[i])
	c.Nodes[i] = nd
	return nd
}
