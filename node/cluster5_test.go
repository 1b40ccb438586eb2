package node_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/nodetest"
)

// waitLeader waits until one of nodes is the raft leader and every one of
// them names it as such, and returns it. Right after a cluster forms, or
// on a loaded machine, there may be no leader for a moment, or a deposed
// one that has not yet stepped down.
func waitLeader(t testing.TB, nodes []*node.Node) *node.Node {
	t.Helper()
	var leader *node.Node
	testutil.WaitForWithin(t, 30*time.Second, "a leader all nodes agree on", func() bool {
		leader = nil
		for _, nd := range nodes {
			if nd.Meta().IsLeader() {
				if leader != nil {
					return false
				}
				leader = nd
			}
		}
		if leader == nil {
			return false
		}
		for _, nd := range nodes {
			if id, _ := nd.Meta().Leader(); id != leader.ID() {
				return false
			}
		}
		return true
	})
	return leader
}

// TestCluster5 covers a 5-node cluster: leader loss and re-election,
// forwarded metadata writes, agreement on every live node, reads after the
// loss, a join and a graceful leave.
func TestCluster5(t *testing.T) {
	if testing.Short() {
		t.Skip("5 nodes")
	}
	nodes := startCluster(t, 5)
	c := newClient(t, nodes...)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	rng := rand.New(rand.NewPCG(5, 5))
	spec := testutil.Spec()
	if _, err := c.RegisterModel(ctx, spec); err != nil {
		t.Fatal(err)
	}
	keys := make([]chunk.Key, 20)
	blobs := make([][]byte, 20)
	for i := range keys {
		keys[i], blobs[i] = testutil.Blob(t, rng, spec, testutil.Tokens(rng, 3+i), chunk.StandaloneContext())
		if _, err := c.Put(ctx, blobs[i]); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}

	// Kill the leader.
	leader := waitLeader(t, nodes)
	old := leader.ID()
	if err := leader.Close(); err != nil {
		t.Fatal(err)
	}
	var live []*node.Node
	for _, nd := range nodes {
		if nd != leader {
			live = append(live, nd)
		}
	}
	testutil.WaitForWithin(t, 30*time.Second, "a new leader", func() bool {
		id, _ := live[0].Meta().Leader()
		return id != "" && id != old
	})

	// A metadata write through a follower reaches the new leader, and every
	// live node agrees on the result.
	spec2 := spec
	spec2.Salt = "after re-election"
	var follower *node.Node
	for _, nd := range live {
		if !nd.Meta().IsLeader() {
			follower = nd
			break
		}
	}
	if _, err := follower.Meta().RegisterModel(ctx, spec2); err != nil {
		t.Fatalf("register through follower %s: %v", follower.ID(), err)
	}
	testutil.WaitForWithin(t, 30*time.Second, "metadata agreement", func() bool {
		for _, nd := range live {
			if _, ok := nd.Meta().Model(spec2.Fingerprint()); !ok || nd.Meta().Ring().Epoch() != live[0].Meta().Ring().Epoch() {
				return false
			}
		}
		return true
	})

	for i, k := range keys {
		got, err := c.Get(ctx, k)
		if err != nil || !bytes.Equal(got, blobs[i]) {
			t.Fatalf("get %d after losing the leader: %v", i, err)
		}
	}

	// A sixth node joins: it lands in the ring and can serve.
	cfg6 := nodetest.NodeConfig(t, "n6", []string{live[0].GossipAddr()})
	cfg6.DRAMBytes, cfg6.HTTPAddr, cfg6.Insecure = 32<<20, "", true
	n6 := nodetest.StartNode(t, cfg6)
	testutil.WaitForWithin(t, 30*time.Second, "n6 in the ring", func() bool { return n6.Ready() == nil && live[0].Meta().Ring().Contains("n6") })
	testutil.WaitForWithin(t, 30*time.Second, "n6 knows the models", func() bool { _, ok := n6.Meta().Model(spec2.Fingerprint()); return ok })

	// A graceful leave takes a node out of the ring without DeadGrace.
	leaving := live[len(live)-1]
	if leaving.Meta().IsLeader() {
		leaving = live[len(live)-2]
	}
	epoch := live[0].Meta().Ring().Epoch()
	lctx, lcancel := context.WithTimeout(ctx, 30*time.Second)
	if err := leaving.Leave(lctx); err != nil {
		t.Fatalf("leave: %v", err)
	}
	lcancel()
	defer func() {
		if !t.Failed() {
			return
		}
		for _, nd := range append(live, n6) {
			if nd == leaving {
				continue
			}
			id, _ := nd.Meta().Leader()
			var ms []string
			for _, m := range nd.Meta().Ring().Members() {
				ms = append(ms, m.ID)
			}
			t.Logf("%s: leader %q epoch %d members %v gossip %d", nd.ID(), id, nd.Meta().Ring().Epoch(), ms, len(nd.Gossip().Members()))
		}
	}()
	testutil.WaitForWithin(t, 30*time.Second, fmt.Sprintf("%s out of the ring", leaving.ID()), func() bool {
		r := n6.Meta().Ring()
		return !r.Contains(leaving.ID()) && r.Epoch() > epoch
	})
	_ = leaving.Close()
	// Reads keep working for entries whose replicas moved: the client
	// refreshes its ring, and nodes fetch from the remaining replicas.
	for i, k := range keys {
		if _, err := c.Get(ctx, k); err != nil {
			// With R=3 over 6 nodes, an entry may have lost two of its
			// three holders (the dead leader and the leaver) and moved to
			// nodes that never got it: without rebalancing (the
			// replication package), only a survivor can serve it.
			var holders int
			for _, nd := range append(live, n6) {
				if nd != leaving && nd.Store().Contains(k) {
					holders++
				}
			}
			if holders > 0 {
				t.Fatalf("get %d after a leave: %v (held by %d live nodes)", i, err, holders)
			}
		}
	}
}
