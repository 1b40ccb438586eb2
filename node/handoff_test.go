package node_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/nodetest"
)

// A node without a disk tier that is closed (SIGTERM) hands the chunks it
// holds to their other owners that lack them before it leaves: here the
// other two replicas lost every key, so n1 is the only holder, and after
// its Close both hold them again.
func TestCloseHandsChunksToOtherOwners(t *testing.T) {
	testutil.SkipIfShort(t, "starts a three-node cluster")
	nodes := nodetest.Start(t, 3, nodetest.Config{Node: func(i int, cfg *node.Config) {
		cfg.DRAMBytes, cfg.HTTPAddr, cfg.RPCTimeout = 64<<20, "", 5*time.Second
		if i == 0 {
			cfg.ShutdownHandoff = 20 * time.Second
		}
	}}).Nodes
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
	holdAll := func(nd *node.Node) bool {
		for _, k := range keys {
			if !nd.Store().Contains(k) {
				return false
			}
		}
		return true
	}
	for _, nd := range nodes {
		testutil.WaitFor(t, nd.ID()+" holding every key", func() bool { return holdAll(nd) })
	}
	for _, nd := range nodes[1:] {
		for _, k := range keys {
			if err := nd.Store().Delete(k); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := nodes[0].Close(); err != nil {
		t.Fatal(err)
	}
	for _, nd := range nodes[1:] {
		if !holdAll(nd) {
			t.Fatalf("%s lacks keys after n1 closed: the handoff did not reach it", nd.ID())
		}
	}
}
