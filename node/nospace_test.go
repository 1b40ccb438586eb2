package node_test

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvtier"
	"github.com/kvmesh/kvmesh/node/nodetest"
)

// TestNoSpaceDropPullsEarly: when the disk tier's file system fills up,
// the DRAM victims it could not take are dropped, and the node's store
// tells its replicator (kvtier.Config.OnDropped): a Pull round runs at
// once, not at the next periodic round (an hour away here). What the round
// takes back is replication's TestCopiesDropped.
func TestNoSpaceDropPullsEarly(t *testing.T) {
	dir := testutil.Tmpfs(t, 8<<20)
	cfg := nodetest.NodeConfig(t, "n1", nil)
	cfg.Insecure = true
	cfg.DataDir = dir
	cfg.DRAMBytes = 2 << 20
	cfg.DiskBytes = 64 << 20 // more than the file system holds
	cfg.Replication.AntiEntropyInterval = time.Hour
	nd := nodetest.StartNode(t, cfg)
	nodetest.WaitRing(t, 1, nd)
	testutil.WaitFor(t, "n1 ready (its startup pull done)", func() bool { return nd.Ready() == nil })
	before := nd.Replicator().Metrics()
	// Leave the tier less room than its DRAM victims need.
	fillFS(t, dir, 1<<20)
	rng := rand.New(rand.NewPCG(7, 7))
	st := nd.Store()
	for i := 0; st.Stats().Tiers[kvtier.TierDisk].NoSpaceErrors == 0; i++ {
		if i == 200 {
			t.Fatalf("no ENOSPC after %d puts: %+v", i, st.Stats().Tiers[kvtier.TierDisk])
		}
		_, blob := testutil.StandaloneBlob(t, rng, testutil.Spec(), 512)
		if _, err := st.Put(t.Context(), blob, kvtier.PutOptions{}); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	testutil.WaitFor(t, "a pull round after the drop", func() bool {
		return nd.Replicator().Metrics().PullRounds > before.PullRounds
	})
}

// fillFS fills the file system of dir with one file, leaving it about
// leave bytes free.
func fillFS(t *testing.T, dir string, leave int64) {
	t.Helper()
	_, free, err := kvtier.FSSpace(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "filler"), make([]byte, max(free-leave, 0)), 0o600); err != nil {
		t.Fatal(err)
	}
}
