package node_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/grpc/mem"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvtier"
	"github.com/kvmesh/kvmesh/node"
)

func dramStats(n *node.Node) kvtier.TierStats { return n.Store().Stats().Tiers[kvtier.TierDRAM] }

// TestPutLentBody: the nodes that store an entry receive it straight into
// DRAM pages that become the entry (kvtier adopts the loan: no second
// copy), and every loan ends, however the put ends: a whole write, a put
// whose stream breaks mid-body, a write one of whose replicas is down.
// One 3-node cluster (R=3) for all.
func TestPutLentBody(t *testing.T) {
	nodes := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	c := newClient(t, nodes[0], nodes[1]) // not the node lost below
	spec := testutil.Spec()
	if _, err := c.RegisterModel(ctx, spec); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(18, 1))
	// newBlob is a new entry in lossless, the cluster's codec: stored as it comes.
	newBlob := func() (chunk.Key, []byte) {
		return testutil.Blob(t, rng, spec, testutil.Tokens(rng, 64), chunk.StandaloneContext())
	}
	loansBack := func(what string, nodes []*node.Node, cond func(n *node.Node, d kvtier.TierStats) bool) {
		t.Helper()
		testutil.WaitFor(t, what, func() bool {
			for _, n := range nodes {
				if d := dramStats(n); d.LentBytes != 0 || d.PinnedBytes != 0 || !cond(n, d) {
					return false
				}
			}
			return true
		})
	}

	// The node a client writes to and the two it forwards to each adopt
	// the body they received, and serve the right bytes.
	const puts = 4
	var keys []chunk.Key
	var blobs [][]byte
	for range puts {
		k, blob := newBlob()
		if _, err := c.Put(ctx, blob); err != nil {
			t.Fatal(err)
		}
		keys, blobs = append(keys, k), append(blobs, blob)
	}
	loansBack("every replica write adopted", nodes, func(_ *node.Node, d kvtier.TierStats) bool { return d.AdoptedPuts == puts })
	for _, n := range nodes {
		for i, k := range keys {
			b, err := n.Store().Get(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			ok := bytes.Equal(b.Bytes(), blobs[i])
			b.Release()
			if !ok {
				t.Fatalf("%s serves other bytes for %v", n.ID(), k)
			}
		}
	}

	// A replica write whose stream ends before the announced bytes arrived
	// gives the lent pages back: the DRAM tier charges what it did before.
	n0 := nodes[0]
	before := dramStats(n0).Bytes
	k, blob := newBlob()
	cc := dialFrames(t, n0)
	st, err := api.NewPeerClient(cc).Replicate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := api.SendHeader(st, &api.PutHeader{Key: api.ProtoKey(k), BlobBytes: uint64(len(blob)), Direct: true}); err != nil {
		t.Fatal(err)
	}
	if err := api.SendBody(st, mem.SliceBuffer(blob[:len(blob)/2]), 1024); err != nil {
		t.Fatal(err)
	}
	if _, err := st.CloseAndRecv(); err == nil {
		t.Fatal("a put of half an entry succeeded")
	}
	loansBack("the broken put's pages back", nodes[:1], func(_ *node.Node, d kvtier.TierStats) bool { return d.Bytes == before })
	// The same entry whole, direct: adopted.
	if err := api.PutDirect(ctx, cc, blob, k); err != nil {
		t.Fatal(err)
	}
	loansBack("the direct put adopted", nodes[:1], func(_ *node.Node, d kvtier.TierStats) bool { return d.AdoptedPuts == puts+1 })

	// With a replica down, each write's forward to it fails and leaves a
	// hint; the loans still end once the replica writes are done.
	if err := nodes[2].Close(); err != nil {
		t.Fatal(err)
	}
	var adopted [2]uint64
	for i, n := range nodes[:2] {
		adopted[i] = dramStats(n).AdoptedPuts
	}
	const lost = 3
	for range lost {
		_, blob := newBlob()
		if _, err := c.Put(ctx, blob); err != nil {
			t.Fatal(err)
		}
	}
	hints := func() int {
		sum := 0
		for _, n := range nodes[:2] {
			h, _ := n.Replicator().HintsPending()
			sum += h
		}
		return sum
	}
	loansBack("hints for the lost replica and the loans back", nodes[:2], func(n *node.Node, d kvtier.TierStats) bool {
		i := 0
		if n == nodes[1] {
			i = 1
		}
		return d.AdoptedPuts == adopted[i]+lost && hints() == lost
	})
}
