package node

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// A node without a disk tier that is closed (SIGTERM) hands the chunks it
// holds to their other owners that lack them before it leaves: here the
// other two replicas lost every key, so n1 is the only holder, and after
// its Close both hold them again.
func TestCloseHandsChunksToOtherOwners(t *testing.T) {
	testutil.SkipIfShort(t, "starts a three-node cluster")
	nodes := make([]*Node, 3)
	var seeds []string
	for i := range nodes {
		cfg := Config{NodeID: fmt.Sprintf("n%d", i+1), DataDir: t.TempDir(), Seeds: seeds, BootstrapExpect: 3,
			DRAMBytes: 64 << 20, LocalTiming: true, DeadGrace: time.Hour, RPCTimeout: 5 * time.Second,
			Logger: testLogger(t), Insecure: true}
		if i == 0 {
			cfg.ShutdownHandoff = 20 * time.Second
		}
		nodes[i] = startConfigured(t, cfg)
		if i == 0 {
			seeds = []string{nodes[0].GossipAddr()}
		}
	}
	waitRing(t, nodes, 3)
	c := newClient(t, nodes...)
	spec := testutil.Spec()
	if _, err := c.RegisterModel(t.Context(), spec); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 5))
	var keys []chunk.Key
	for range 12 {
		key, blob := testutil.StandaloneBlob(t, rng, spec, 16)
		if _, err := c.Put(t.Context(), blob); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, key)
	}
	holdAll := func(nd *Node) bool {
		for _, k := range keys {
			if !nd.store.Contains(k) {
				return false
			}
		}
		return true
	}
	for _, nd := range nodes {
		testutil.WaitFor(t, nd.cfg.NodeID+" holding every key", func() bool { return holdAll(nd) })
	}
	for _, nd := range nodes[1:] {
		for _, k := range keys {
			if err := nd.store.Delete(k); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := nodes[0].Close(); err != nil {
		t.Fatal(err)
	}
	for _, nd := range nodes[1:] {
		if !holdAll(nd) {
			t.Fatalf("%s lacks keys after n1 closed: the handoff did not reach it", nd.cfg.NodeID)
		}
	}
}
