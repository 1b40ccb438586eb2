package node_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/node"
)

// TestPutForwardsAsItArrives: a client's entry goes on to the other
// replicas while it is still arriving (cut-through), so the node a client
// writes to has sent a replica half the entry before the client sent the
// other half; then every replica stores it whole. An entry found corrupt
// once whole is stored nowhere, though the replicas had received it.
func TestPutForwardsAsItArrives(t *testing.T) {
	nodes := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	c := newClient(t, nodes...)
	spec := testutil.Spec()
	if _, err := c.RegisterModel(ctx, spec); err != nil {
		t.Fatal(err)
	}
	cc := dialFrames(t, nodes[0])
	rng := rand.New(rand.NewPCG(18, 3))
	// start sends the header and the first half of blob to nodes[0].
	start := func(t *testing.T, key chunk.Key, blob []byte) grpc.ClientStreamingClient[api.PutFrame, api.PutResponse] {
		t.Helper()
		st, err := api.NewClientClient(cc).Put(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := api.SendHeader(st, &api.PutHeader{Key: api.ProtoKey(key), BlobBytes: uint64(len(blob))}); err != nil {
			t.Fatal(err)
		}
		if err := api.SendBody(st, mem.SliceBuffer(blob[:len(blob)/2]), 0); err != nil {
			t.Fatal(err)
		}
		return st
	}
	waitForwarded := func(t *testing.T, from float64, n int) {
		t.Helper()
		testutil.WaitFor(t, "half the entry forwarded to a replica before the rest was sent",
			func() bool { return node.BytesOut(nodes[0], "replicate")-from >= float64(n) })
	}

	// A node streams to the replicas it has a connection up to, and sends
	// others the entry once whole: a first put through nodes[0] connects
	// it to its peers.
	warm := func(t *testing.T) {
		key, blob := testutil.Blob(t, rng, spec, testutil.Tokens(rng, 8), chunk.StandaloneContext())
		st := start(t, key, blob)
		if err := api.SendBody(st, mem.SliceBuffer(blob[len(blob)/2:]), 0); err != nil {
			t.Fatal(err)
		}
		if _, err := st.CloseAndRecv(); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("whole entry", func(t *testing.T) {
		warm(t)
		// Lossless: the cluster's default codec, so the entry is stored as it comes.
		key, blob := testutil.Blob(t, rng, spec, testutil.Tokens(rng, 300), chunk.StandaloneContext())
		out0 := node.BytesOut(nodes[0], "replicate")
		st := start(t, key, blob)
		waitForwarded(t, out0, len(blob)/2)
		if err := api.SendBody(st, mem.SliceBuffer(blob[len(blob)/2:]), 0); err != nil {
			t.Fatal(err)
		}
		res, err := st.CloseAndRecv()
		if err != nil {
			t.Fatal(err)
		}
		if len(res.StoredOn) < 2 {
			t.Fatalf("stored on %v, want at least W=2 replicas", res.StoredOn)
		}
		for _, nd := range nodes {
			testutil.WaitFor(t, "every replica stores the entry", func() bool { return nd.Store().Contains(key) })
			got, err := nd.Store().Get(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			same := bytes.Equal(got.Bytes(), blob)
			got.Release()
			if !same {
				t.Fatalf("%s stores other bytes than were put", nd.ID())
			}
		}
	})

	t.Run("corrupt entry", func(t *testing.T) {
		key, blob := testutil.Blob(t, rng, spec, testutil.Tokens(rng, 300), chunk.StandaloneContext())
		blob[len(blob)-1] ^= 0x40 // the last layer's checksum no longer matches
		out0 := node.BytesOut(nodes[0], "replicate")
		st := start(t, key, blob)
		waitForwarded(t, out0, len(blob)/2)
		if err := api.SendBody(st, mem.SliceBuffer(blob[len(blob)/2:]), 0); err != nil {
			t.Fatal(err)
		}
		if _, err := st.CloseAndRecv(); err == nil {
			t.Fatal("a corrupt entry was acknowledged")
		}
		// The replicas wait for the end of the stream that only a good
		// entry gets: the write was cancelled, so none of them stores it.
		for _, nd := range nodes {
			if nd.Store().Contains(key) {
				t.Fatalf("%s stores a corrupt entry", nd.ID())
			}
		}
	})
}
