package node_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/meta"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/nodetest"
)

// TestDrainWhenGossipLeaveIsLost reproduces the lost-gossip-leave drain
// bug in process: the node being drained has lost touch with the others in
// gossip (here its gossip is stopped, so the leader holds it failed, as
// after a partition), so no gossip leave can reach the leader, and with
// DeadGrace at 1 h nothing else would remove it. The drain must still
// take it out of the ring and raft (through raft, acknowledged) before it
// reports success, and nothing it held may be lost.
func TestDrainWhenGossipLeaveIsLost(t *testing.T) {
	nodes, _ := startReplCluster(t, 4)
	leader := waitLeader(t, nodes)
	drained := nodes[0]
	if drained == leader {
		drained = nodes[1]
	}
	var rest []*node.Node
	for _, nd := range nodes {
		if nd != drained {
			rest = append(rest, nd)
		}
	}
	c := newClient(t, rest...)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	chunks := registerAndPut(t, ctx, c, 23, 30)
	epoch := leader.Meta().Ring().Epoch()

	// The drained node's gossip goes silent; the leader holds it failed.
	if err := drained.Gossip().Shutdown(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForWithin(t, 30*time.Second, "the leader to hold "+drained.ID()+" failed", func() bool {
		for _, st := range leader.Gossip().Status() {
			if st.Meta.ID == drained.ID() {
				return st.State == gossip.StateFailed
			}
		}
		return false
	})
	if !leader.Meta().Ring().Contains(drained.ID()) {
		t.Fatal("removed before the drain (DeadGrace is 1 h)")
	}

	last, err := c.Drain(ctx, drained.GRPCAddr(), false, nil)
	if err != nil {
		t.Fatalf("drain: %v", err)
	}
	if !last.Left || last.Phase != "done" {
		t.Fatalf("last progress %v, want done and left", last)
	}
	select {
	case <-drained.Left(): // kvmeshd exits on it
	default:
		t.Fatal("Left is open after a drain that left the cluster")
	}
	if st, _ := api.SplitState(drained.State()); st != api.StateLeft {
		t.Fatalf("state after the drain %q, want %s", drained.State(), api.StateLeft)
	}
	// Acknowledged through raft: already true on the leader of the time.
	l := leader
	if !l.Meta().IsLeader() {
		for _, nd := range rest {
			if nd.Meta().IsLeader() {
				l = nd
			}
		}
	}
	if rg := l.Meta().Ring(); rg.Contains(drained.ID()) || rg.Epoch() <= epoch {
		t.Fatalf("after the drain the leader's ring holds %s (epoch %d, was %d)", drained.ID(), rg.Epoch(), epoch)
	}
	servers, err := l.Meta().Servers()
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(servers, func(s meta.Server) bool { return s.ID == drained.ID() }) {
		t.Fatalf("raft still holds %s: %v", drained.ID(), servers)
	}
	nodetest.WaitRing(t, 3, rest...)
	if err := drained.Close(); err != nil {
		t.Fatal(err)
	}
	checkReadable(t, ctx, rest[0], chunks)
}

// TestRestartedNodeRefills: a DRAM-only node that restarts comes back
// empty; without any read or write it holds its keys again from the
// startup pull, long before anti-entropy (5 min by default, off here)
// would run. With the pull off, nothing refills it.
func TestRestartedNodeRefills(t *testing.T) {
	testutil.SkipIfShort(t, "a 3-node cluster and a restart")
	tests := []struct {
		name   string
		noPull bool
	}{
		{"startup pull", false},
		{"no startup pull", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			nodes, cfgs := startReplCluster(t, 3)
			c := newClient(t, nodes[0], nodes[1])
			ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
			defer cancel()
			chunks := registerAndPut(t, ctx, c, 29, 24)
			// R=3 on 3 nodes: n3 holds every chunk once the writes'
			// stragglers are done.
			testutil.WaitForWithin(t, 30*time.Second, "n3 to hold every chunk", func() bool {
				return len(holdersOf(nodes[2], chunks)) == len(chunks)
			})
			// The others' own startup pulls (rounds retried while the
			// ring formed) push too: let them end first.
			testutil.WaitForWithin(t, 60*time.Second, "the startup pulls of the first start to end", func() bool {
				for _, nd := range nodes {
					if nd.Replicator().Metrics().PullRunning != 0 {
						return false
					}
				}
				return true
			})
			rounds := []int64{nodes[0].Replicator().Metrics().AntiEntropyRounds, nodes[1].Replicator().Metrics().AntiEntropyRounds}
			if err := nodes[2].Close(); err != nil {
				t.Fatal(err)
			}
			cfg := cfgs[2]
			cfg.NoStartupPull = tc.noPull
			cfg.Replication.AntiEntropyInterval = -1
			cfg.Replication.ReadRepairChance = -1
			back := nodetest.StartNode(t, cfg)
			nodetest.WaitRing(t, 3, nodes[0], nodes[1], back)
			if tc.noPull {
				// Everything that could refill it, done: its recovery (no
				// pull), each member's rebalance pass for this ring and
				// hint delivery (run here, as their loops would), every
				// repair queue drained. Anti-entropy is off on it, and
				// no round ran on the others (checked below).
				testutil.WaitFor(t, "the restarted n3 ready", func() bool { return back.Ready() == nil })
				all := []*node.Node{nodes[0], nodes[1], back}
				for _, nd := range all {
					r := nd.Replicator()
					if st, err := r.Rebalance(ctx); err != nil || st.Pending != 0 {
						t.Fatalf("%s: rebalance %+v: %v", nd.ID(), st, err)
					}
					if n, err := r.DeliverHints(ctx); err != nil || n != 0 {
						t.Fatalf("%s: delivered %d hints: %v", nd.ID(), n, err)
					}
				}
				testutil.WaitFor(t, "every repair queue to drain", func() bool {
					for _, nd := range all {
						m := nd.Replicator().Metrics()
						if nd.Replicator().RepairsPending() > 0 || m.RepairsQueued != m.RepairsDone+m.RepairErrors {
							return false
						}
					}
					return true
				})
				if n := len(holdersOf(back, chunks)); n != 0 {
					t.Fatalf("%d chunks refilled without the startup pull: %+v; n1 %+v", n, back.Replicator().Metrics(), nodes[0].Replicator().Metrics())
				}
				for i, nd := range nodes[:2] {
					if m := nd.Replicator().Metrics(); m.AntiEntropyRounds != rounds[i] {
						t.Fatalf("%s ran %d anti-entropy rounds meanwhile: the check above proves nothing", nd.ID(), m.AntiEntropyRounds-rounds[i])
					}
				}
				if m := back.Replicator().Metrics(); m.PullRounds != 0 || m.AntiEntropyRounds != 0 {
					t.Fatalf("n3 ran rounds without a startup pull: %+v", m)
				}
				return
			}
			testutil.WaitForWithin(t, 30*time.Second, "the restarted n3 refilled", func() bool {
				return len(holdersOf(back, chunks)) == len(chunks)
			})
			testutil.WaitForWithin(t, 30*time.Second, "the startup pull to end", func() bool { return back.Replicator().Metrics().PullRunning == 0 })
			if m := back.Replicator().Metrics(); m.PullKeys != int64(len(chunks)) || m.PullRounds < 1 {
				t.Fatalf("pull metrics %+v, want %d keys", m, len(chunks))
			}
		})
	}
}

func holdersOf(nd *node.Node, chunks []testChunk) []chunk.Key {
	var out []chunk.Key
	for _, ch := range chunks {
		if nd.Store().Contains(ch.key) {
			out = append(out, ch.key)
		}
	}
	return out
}
