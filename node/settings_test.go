package node_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/meta"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/nodetest"
	"github.com/kvmesh/kvmesh/replication"
	"github.com/kvmesh/kvmesh/tests/framework"
)

// TestSettingsChangeR changes R through Admin.SetSettings on a follower of
// a 3-node cluster and checks that the data follows by itself, with no
// ring change and no anti-entropy round (the interval is 5m): the
// settings change fires meta's Watch, which kicks each node's replicator,
// and a new R is a new placement to rebalance to. Raising R streams every
// chunk to its new replicas; lowering it, the copies beyond R go once the
// remaining owner acknowledged holding them.
func TestSettingsChangeR(t *testing.T) {
	var nodes []*node.Node
	var seeds []string
	for _, id := range []string{"n1", "n2", "n3"} {
		cfg := replConfig(t, id, seeds, 3)
		// Only the rounds the test runs move data.
		cfg.NoStartupPull = true
		nodes = append(nodes, nodetest.StartNode(t, cfg))
		seeds = []string{nodes[0].GossipAddr()}
	}
	nodetest.WaitRing(t, 3, nodes...)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
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
		testutil.WaitForWithin(t, 30*time.Second, "the settings on every node", func() bool {
			for _, n := range nodes {
				if n.Meta().Settings() != want {
					return false
				}
			}
			return true
		})
	}
	chunks := makeChunks(t, 21, 30)
	misplaced := func(rf int) string {
		for _, ch := range chunks {
			if h, o := holders(nodes, ch.key), owners(nodes[0], ch.key); len(o) != rf || !slices.Equal(h, o) {
				return fmt.Sprintf("%v held by %v, its %d owners are %v", ch.key, h, rf, o)
			}
		}
		return ""
	}
	placed := func(what string, rf int) {
		t.Helper()
		var bad string
		defer func() {
			if bad != "" {
				t.Logf("%s: last seen %s", what, bad)
			}
		}()
		testutil.WaitForWithin(t, 30*time.Second, what+": every chunk on its owners", func() bool {
			bad = misplaced(rf)
			return bad == ""
		})
	}

	set(1, 1)
	c := newClient(t, nodes...)
	framework.RegisterAndPutBlobs(t, ctx, c, testutil.Spec(), blobsOf(chunks))
	placed("R=1", 1)

	epoch := nodes[0].Meta().Ring().Epoch()

	// The counters move just after the store or delete they count.
	counted := func(what string, metric func(replication.Metrics) int64, want int64) {
		t.Helper()
		sum := func() (s int64) {
			for _, n := range nodes {
				s += metric(n.Replicator().Metrics())
			}
			return s
		}
		testutil.WaitForWithin(t, 30*time.Second, what, func() bool { return sum() >= want })
		if got := sum(); got != want {
			t.Fatalf("%s: %d, want %d", what, got, want)
		}
	}

	set(3, 2)
	placed("R=3 after the change", 3)
	counted("chunk copies streamed on raising R to 3 (each chunk once to each new replica)",
		func(m replication.Metrics) int64 { return m.RebalanceKeys }, int64(2*len(chunks)))

	set(1, 1)
	placed("R=1 after the change", 1)
	counted("copies dropped on lowering R to 1",
		func(m replication.Metrics) int64 { return m.RebalanceDropped }, int64(2*len(chunks)))
	if e := nodes[0].Meta().Ring().Epoch(); e != epoch {
		t.Fatalf("ring epoch moved from %d to %d: the data did not follow R alone", epoch, e)
	}
}
