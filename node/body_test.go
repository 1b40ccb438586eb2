package node_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvtier"
	"github.com/kvmesh/kvmesh/node"
)

func dramStats(n *node.Node) kvtier.TierStats { return n.Store().Stats().Tiers[kvtier.TierDRAM] }

// Every replica of a client's write receives it straight into DRAM pages
// that become the entry (kvtier adopts the loan: no second copy): the node
// the client wrote to and the two it forwarded to. Each serves the right
// bytes and lends nothing once the writes are done.
func TestPutAdoptsLentBody(t *testing.T) {
	nodes := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	c := newClient(t, nodes...)
	spec := testutil.Spec()
	if _, err := c.RegisterModel(ctx, spec); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(18, 1))
	const puts = 4
	var keys []chunk.Key
	var blobs [][]byte
	for range puts {
		// Lossless, the cluster's codec: stored as it comes.
		k, blob := testutil.Blob(t, rng, spec, testutil.Tokens(rng, 64), chunk.StandaloneContext())
		if _, err := c.Put(ctx, blob); err != nil {
			t.Fatal(err)
		}
		keys, blobs = append(keys, k), append(blobs, blob)
	}
	testutil.WaitFor(t, "every replica write adopted and the loans back", func() bool {
		for _, n := range nodes {
			if d := dramStats(n); d.LentBytes != 0 || d.AdoptedPuts != puts {
				return false
			}
		}
		return true
	})
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
}

// A write that one replica cannot take (it is down) still gives the lent
// body back once the replica writes are done: the forward to the lost
// replica fails, it gets a hint, and no pages stay lent.
func TestPutToLostReplicaReleasesLentBody(t *testing.T) {
	nodes := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	c := newClient(t, nodes[0], nodes[1])
	spec := testutil.Spec()
	if _, err := c.RegisterModel(ctx, spec); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "model known everywhere", func() bool {
		for _, n := range nodes {
			if _, ok := n.Meta().Model(spec.Fingerprint()); !ok {
				return false
			}
		}
		return true
	})
	if err := nodes[2].Close(); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(18, 3))
	for range 3 {
		_, blob := testutil.Blob(t, rng, spec, testutil.Tokens(rng, 64), chunk.StandaloneContext())
		if _, err := c.Put(ctx, blob); err != nil {
			t.Fatal(err)
		}
	}
	// Each write's forward to the lost replica fails and leaves a hint.
	testutil.WaitFor(t, "hints for the lost replica and the loans back", func() bool {
		hints := 0
		for _, n := range nodes[:2] {
			h, _ := n.Replicator().HintsPending()
			hints += h
			if d := dramStats(n); d.LentBytes != 0 || d.AdoptedPuts == 0 {
				return false
			}
		}
		return hints == 3
	})
}

// A direct put whose stream ends before the announced bytes arrived gives
// the lent pages back: the DRAM tier charges nothing afterwards.
func TestBrokenPutReleasesLentBody(t *testing.T) {
	n := startCluster(t, 1)[0]
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c := newClient(t, n)
	spec := testutil.Spec()
	if _, err := c.RegisterModel(ctx, spec); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(18, 2))
	k, blob := testutil.Blob(t, rng, spec, testutil.Tokens(rng, 64), chunk.StandaloneContext())
	cc, err := grpc.NewClient(n.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(api.Codec())))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	st, err := api.NewClientClient(cc).Put(ctx)
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
	testutil.WaitFor(t, "lent pages back", func() bool {
		d := dramStats(n)
		return d.LentBytes == 0 && d.Bytes == 0 && d.PinnedBytes == 0
	})
	// The same entry whole, direct: adopted.
	if err := api.PutDirect(ctx, cc, blob, k); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "direct put adopted", func() bool {
		d := dramStats(n)
		return d.AdoptedPuts == 1 && d.LentBytes == 0
	})
}
