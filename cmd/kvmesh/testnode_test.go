package main

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/node"
)

// startNode starts a single in-process node for the command tests, closed
// at test end, and waits until it is ready. cfg's zero fields take the
// test defaults: NodeID n1, a temporary DataDir, 16 MiB of DRAM, no HTTP
// listener, local timing, insecure transport and a discarding logger.
func startNode(ctx context.Context, t *testing.T, cfg node.Config) *node.Node {
	t.Helper()
	if cfg.NodeID == "" {
		cfg.NodeID = "n1"
	}
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	if cfg.DRAMBytes == 0 {
		cfg.DRAMBytes = 16 << 20
	}
	if cfg.HTTPAddr == "" {
		cfg.HTTPAddr = "off"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	cfg.LocalTiming, cfg.Insecure = true, true
	nd, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := nd.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nd.Close() })
	for nd.Ready() != nil {
		if ctx.Err() != nil {
			t.Fatal("node not ready")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nd
}
