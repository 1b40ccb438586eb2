package meta

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestLeaveWithoutGossip reproduces a drain bug: a node that
// leaves (the last step of `kvmesh drain`) while its gossip leave never
// reaches the leader. The leader's gossip view either still shows it alive
// (the leave broadcast was lost) or holds it failed since a partition
// (memberlist then drops the leave and nothing marks it "left"); with
// DeadGrace at 1 h, gossip alone would keep it a raft voter and ring
// member. The leave must go through raft: when Leave returns nil, the
// leader's ring and raft configuration no longer hold the node, the node is
// not added back while that incarnation stays alive in gossip, and it is
// admitted again when it comes back with a new incarnation.
func TestLeaveWithoutGossip(t *testing.T) {
	tests := []struct {
		name   string
		gossip func(c *cluster, id string) // what the leader's gossip shows of the leaver
	}{
		{"leave broadcast lost, still alive in gossip", func(*cluster, string) {}},
		{"held failed in gossip since a partition", func(c *cluster, id string) { c.peers.remove(id) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, 3)
			var inc atomic.Uint64
			c.tweak = func(cfg *Config) {
				cfg.DeadGrace = time.Hour // only an explicit leave removes a node
				cfg.Incarnation = 100 + inc.Add(1)
			}
			for _, id := range ids(4) {
				c.start(id)
			}
			e0 := c.waitAgree(ids(4))
			leaver := c.follower()
			id := leaver.NodeID()
			tc.gossip(c, id)

			if err := leaver.Leave(ctxT(t)); err != nil {
				t.Fatalf("leave: %v", err)
			}
			// Committed when Leave returned: the leader already shows it.
			l := c.leader()
			if l.Ring().Contains(id) || l.Ring().Epoch() <= e0 {
				t.Fatalf("after Leave the leader's ring is %v at epoch %d (was %d)", ringIDs(l), l.Ring().Epoch(), e0)
			}
			if sv := serverIDs(t, l); slices.Contains(sv, id) {
				t.Fatalf("after Leave raft still holds %s: %v", id, sv)
			}
			if _, ok := l.Departed(id); !ok {
				t.Fatalf("no tombstone for %s", id)
			}
			rest := slices.DeleteFunc(ids(4), func(s string) bool { return s == id })
			c.waitAgree(rest)

			// A node joins: the leader's reconcile round that adds it
			// would add the leaver too, were it not tombstoned.
			c.start(nodeID(4))
			c.waitAgree(append(slices.Clone(rest), nodeID(4)))
			if sv := serverIDs(t, c.leader()); slices.Contains(sv, id) {
				t.Fatalf("%s is back in raft: %v", id, sv)
			}

			// It comes back as a new process: admitted again.
			c.stop(id)
			c.start(id)
			c.waitAgree(ids(5))
			testutil.WaitFor(t, id+" back in raft", func() bool { return slices.Contains(serverIDs(t, c.leader()), id) })
			if _, ok := c.leader().Departed(id); ok {
				t.Fatalf("tombstone of %s kept after it rejoined", id)
			}
		})
	}
}

// TestLeaveNeedsCommit: without a reachable leader a leave does not claim
// success; it fails when its context ends.
func TestLeaveNeedsCommit(t *testing.T) {
	c := newCluster(t, 3)
	for _, id := range ids(3) {
		c.start(id)
	}
	c.waitAgree(ids(3))
	f := c.follower()
	l := c.leader()
	// The forwarder reaches no node any more: not the leader, nor another
	// node that an ordinary election on a busy machine could make leader
	// during the wait (it would commit the leave).
	for _, id := range c.running() {
		c.fwd.set("grpc-"+id, nil)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	err := f.Leave(ctx)
	if err == nil {
		t.Fatal("leave without a reachable leader succeeded")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("leave: %v, want the context's deadline", err)
	}
	if !l.Ring().Contains(f.NodeID()) {
		t.Fatal("the leader removed a node whose leave never reached it")
	}
}

func serverIDs(t *testing.T, s *Store) []string {
	t.Helper()
	sv, err := s.Servers()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, x := range sv {
		out = append(out, x.ID)
	}
	slices.Sort(out)
	return out
}
