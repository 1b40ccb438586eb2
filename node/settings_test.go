package node

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/meta"
)

// TestSettingsChangeR changes R through Admin.SetSettings on a follower of
// a 3-node cluster and checks how the data follows. A change of R moves
// nothing by itself (no ring epoch change, so no rebalance): raising it,
// one anti-entropy round on each node copies every chunk to its new
// replicas; lowering it, the copies beyond R go at the next rebalance
// (run here directly, as a ring change runs it).
func TestSettingsChangeR(t *testing.T) {
	var nodes []*Node
	var seeds []string
	for _, id := range []string{"n1", "n2", "n3"} {
		cfg := replConfig(t, id, seeds, 3)
		// Only the rounds the test runs move data.
		cfg.NoStartupPull = true
		nodes = append(nodes, startConfigured(t, cfg))
		seeds = []string{nodes[0].GossipAddr()}
	}
	waitRing(t, nodes, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cc, err := grpc.NewClient(nodes[1].GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	admin := api.NewAdminClient(cc)
	set := func(r, w uint32) {
		t.Helper()
		resp, err := admin.SetSettings(ctx, &api.SetSettingsRequest{ReplicationFactor: r, WriteQuorum: w})
		if err != nil {
			t.Fatalf("set R=%d W=%d: %v", r, w, err)
		}
		want := meta.DefaultSettings()
		want.ReplicationFactor, want.WriteQuorum = int(r), int(w)
		if resp.Settings.ReplicationFactor != r || resp.Settings.WriteQuorum != w {
			t.Fatalf("set R=%d W=%d answered %v", r, w, resp.Settings)
		}
		waitFor(t, 10*time.Second, "the settings on every node", func() bool {
			for _, n := range nodes {
				if n.meta.Settings() != want {
					return false
				}
			}
			return true
		})
	}
	placed := func(what string, rf int) {
		t.Helper()
		for _, ch := range makeChunks(t, 21, 30) {
			if h, o := holders(nodes, ch.key), owners(nodes[0], ch.key); len(o) != rf || !slices.Equal(h, o) {
				t.Fatalf("%s: %v held by %v, its %d owners are %v", what, ch.key, h, rf, o)
			}
		}
	}

	set(1, 1)
	c := newClient(t, nodes...)
	if _, err := c.RegisterModel(ctx, testSpec()); err != nil {
		t.Fatal(err)
	}
	for _, ch := range makeChunks(t, 21, 30) {
		if _, err := c.Put(ctx, ch.blob); err != nil {
			t.Fatal(err)
		}
	}
	placed("R=1", 1)

	set(3, 2)
	for _, n := range nodes {
		if _, err := n.repl.AntiEntropy(ctx); err != nil {
			t.Fatalf("anti-entropy on %s: %v", n.ID(), err)
		}
	}
	placed("R=3 after one anti-entropy round", 3)

	set(1, 1)
	for _, n := range nodes {
		if _, err := n.repl.Rebalance(ctx); err != nil {
			t.Fatalf("rebalance on %s: %v", n.ID(), err)
		}
	}
	placed("R=1 after a rebalance", 1)
}
