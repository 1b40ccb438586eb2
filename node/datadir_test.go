package node_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/nodetest"
)

// TestDataDirNodeID: the first start records the node ID in the data
// directory; a start under another ID is refused, saying which ID the
// directory belongs to; the same ID starts again.
func TestDataDirNodeID(t *testing.T) {
	cfg := replConfig(t, "n1", nil, 1)
	nd := nodetest.StartNode(t, cfg)
	testutil.WaitFor(t, "n1 ready", func() bool { return nd.State() == api.StateReady })
	if err := nd.Close(); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(cfg.DataDir, node.NodeIDFileName)); err != nil || string(b) != "n1\n" {
		t.Fatalf("%s: %q, %v", node.NodeIDFileName, b, err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	other := cfg
	other.NodeID = "n2"
	nd, err := node.New(other)
	if err != nil {
		t.Fatal(err)
	}
	err = nd.Start(ctx)
	_ = nd.Close()
	if !errors.Is(err, node.ErrNodeIDMismatch) || !strings.Contains(err.Error(), `"n1"`) {
		t.Fatalf("start as n2: %v, want ErrNodeIDMismatch naming n1", err)
	}
	nodetest.StartNode(t, cfg)
}

// TestDataDirPrivate: the directories a node creates (the data directory
// and each one below it) are its user's alone.
func TestDataDirPrivate(t *testing.T) {
	cfg := replConfig(t, "n1", nil, 1)
	cfg.DataDir = filepath.Join(cfg.DataDir, "new")
	cfg.DiskBytes = 64 << 20
	nd := nodetest.StartNode(t, cfg)
	testutil.WaitFor(t, "n1 ready", func() bool { return nd.State() == api.StateReady })
	n := 0
	err := filepath.WalkDir(cfg.DataDir, func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if perm := fi.Mode().Perm(); perm&0o077 != 0 {
			t.Errorf("%s: mode %v, want no access for others", path, perm)
		}
		n++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 3 {
		t.Fatalf("only %d directories under %s", n, cfg.DataDir)
	}
}
