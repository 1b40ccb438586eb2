package node_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/nodetest"
)

// TestDrainedNodeRestart: a node that left the cluster refuses to start
// again on its data directory (ErrLeftCluster, saying why and what to
// do), rather than rejoining silently; with Rejoin it starts, joins the
// ring again, and the record of the leave is gone (but not after a
// rejoin whose start failed).
func TestDrainedNodeRestart(t *testing.T) {
	var nodes []*node.Node
	var cfgs []node.Config
	var seeds []string
	for _, id := range []string{"n1", "n2", "n3"} {
		cfg := replConfig(t, id, seeds, 3)
		cfgs = append(cfgs, cfg)
		nodes = append(nodes, nodetest.StartNode(t, cfg))
		seeds = []string{nodes[0].GossipAddr()}
	}
	nodetest.WaitRing(t, 3, nodes...)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := nodes[2].Leave(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-nodes[2].Left():
		t.Fatal("Left closed by a Leave outside a drain")
	default:
	}
	if err := nodes[2].Close(); err != nil {
		t.Fatal(err)
	}
	nodetest.WaitRing(t, 2, nodes[:2]...)

	cfg := cfgs[2]
	cfg.Seeds = seeds
	nd, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = nd.Start(ctx)
	_ = nd.Close()
	if !errors.Is(err, node.ErrLeftCluster) || !strings.Contains(err.Error(), "-rejoin") {
		t.Fatalf("restart of a node that left: %v, want ErrLeftCluster naming -rejoin", err)
	}
	if nodes[0].Meta().Ring().Contains("n3") {
		t.Fatal("the refused start still reached the cluster")
	}

	// A rejoin whose start fails (its gRPC address is taken) keeps the
	// marker: the next start without Rejoin still refuses.
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	failing := cfg
	failing.Rejoin, failing.GRPCAddr = true, taken.Addr().String()
	nd, err = node.New(failing)
	if err != nil {
		t.Fatal(err)
	}
	err = nd.Start(ctx)
	_ = nd.Close()
	if err == nil {
		t.Fatal("a start on a taken gRPC address succeeded")
	}
	if _, err := os.Stat(filepath.Join(cfg.DataDir, node.LeftMarkerName)); err != nil {
		t.Fatalf("leave marker after a failed rejoin: %v", err)
	}

	cfg.Rejoin = true
	back := nodetest.StartNode(t, cfg)
	nodetest.WaitRing(t, 3, nodes[0], nodes[1], back)
	if _, err := os.Stat(filepath.Join(cfg.DataDir, node.LeftMarkerName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("leave marker after a rejoin: %v", err)
	}
}
