package node_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/inject"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// damage writes into nd's stored copy of key in its DRAM tier, as a
// process writing into the tier's memory would: the header's magic, or
// one payload byte.
func damage(t *testing.T, nd *node.Node, key chunk.Key, header bool) {
	t.Helper()
	b, err := nd.Store().Get(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	mem := b.Bytes()
	if header {
		mem[0] ^= 0xff
	} else {
		mem[len(mem)-1] ^= 0x01
	}
}

// heldIntact reports whether nd's own copy of key is blob.
func heldIntact(t *testing.T, nd *node.Node, key chunk.Key, blob []byte) bool {
	b, err := nd.Store().Get(t.Context(), key)
	if err != nil {
		return false
	}
	defer b.Release()
	return bytes.Equal(b.Bytes(), blob)
}

// TestCorruptLocalCopyFallsBack: a node whose own copy of an entry was
// damaged after it was stored (header or payload) serves the entry from
// another replica and repairs its copy, on every read path: a plain Get,
// a peer's FetchMany (answered as absent, so the peer reads elsewhere)
// and an injection.
func TestCorruptLocalCopyFallsBack(t *testing.T) {
	nodes := startCluster(t, 3)
	n1 := nodes[0]
	c := newClient(t, nodes...)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	spec := testutil.Spec()
	fp, err := c.RegisterModel(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(35, 3))
	type entry struct {
		key    chunk.Key
		blob   []byte
		tokens []uint32
	}
	var es []entry
	for range 6 {
		toks := testutil.Tokens(rng, 8)
		key, blob := testutil.Blob(t, rng, spec, toks, chunk.StandaloneContext())
		if _, err := c.Put(ctx, blob); err != nil {
			t.Fatal(err)
		}
		es = append(es, entry{key, blob, toks})
	}
	for _, e := range es {
		testutil.WaitFor(t, "every copy", func() bool {
			for _, nd := range nodes {
				if !heldIntact(t, nd, e.key, e.blob) {
					return false
				}
			}
			return true
		})
	}
	repaired := func(e entry) {
		t.Helper()
		testutil.WaitFor(t, "n1's copy repaired", func() bool { return heldIntact(t, n1, e.key, e.blob) })
	}
	cc := dialFrames(t, n1)

	// A plain Get on n1.
	for i, header := range []bool{true, false} {
		e := es[i]
		damage(t, n1, e.key, header)
		st, err := api.NewClientClient(cc).Get(ctx, &api.GetRequest{Key: api.ProtoKey(e.key), Format: api.Format_FORMAT_ENTRY})
		if err != nil {
			t.Fatal(err)
		}
		var hdr api.GetHeader
		if err := api.RecvHeader(st, &hdr); err != nil {
			t.Fatalf("Get of a damaged copy (header %v): %v", header, err)
		}
		got := make([]byte, hdr.TotalBytes)
		if err := api.RecvBody(st, got); err != nil || !bytes.Equal(got, e.blob) {
			t.Fatalf("Get of a damaged copy (header %v): %v, %d bytes", header, err, len(got))
		}
		repaired(e)
	}

	// A peer's FetchMany from n1: the damaged key is absent there.
	e := es[2]
	damage(t, n1, e.key, true)
	st, err := api.NewPeerClient(cc).FetchMany(ctx, &api.FetchManyRequest{Keys: []*api.Key{api.ProtoKey(e.key), api.ProtoKey(es[3].key)}})
	if err != nil {
		t.Fatal(err)
	}
	sink := &fetchSink{missing: map[int]codes.Code{}, blobs: map[int][]byte{}}
	if err := api.RecvFetchMany(st, 2, chunk.Limits{}, sink); err != nil {
		t.Fatal(err)
	}
	if len(sink.missing) != 1 || sink.missing[0] != codes.NotFound || !bytes.Equal(sink.blobs[1], es[3].blob) {
		t.Errorf("FetchMany of a damaged and an intact copy: missing %v, found %d; want the first NotFound, the second", sink.missing, len(sink.blobs))
	}
	repaired(e)

	// An injection through n1.
	lay := pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: 4, BlockSize: 16, KVHeads: spec.KVHeads, HeadDim: spec.HeadDim, DType: chunk.F32}
	shm, err := inject.CreateShm("", spec.Layers, []pagedkv.CacheLayout{lay})
	if err != nil {
		t.Skipf("shared memory: %v", err)
	}
	defer shm.Close()
	inj, err := c.RegisterCache(ctx, n1.GRPCAddr(), client.CacheRegistration{Fingerprint: fp, Layers: spec.Layers,
		Layouts: []pagedkv.CacheLayout{lay}, MaxPositions: 1024, File: shm.Memory.File, Offsets: shm.Memory.Offsets})
	if err != nil {
		t.Fatal(err)
	}
	defer inj.Close(ctx)
	for i, header := range []bool{true, false} {
		e := es[4+i]
		damage(t, n1, e.key, header)
		res, err := inj.InjectChunks(ctx, []pagedkv.InjectChunk{{Key: e.key, Tokens: e.tokens, Slots: []int{0, 1, 2, 3, 4, 5, 6, 7}}})
		if err != nil || res[0].Match != chunk.MatchExact {
			t.Fatalf("injection of a damaged copy (header %v): %v %+v", header, err, res)
		}
		repaired(e)
	}
	if m := n1.Replicator().Metrics(); m.LocalCorrupt != 5 {
		t.Errorf("LocalCorrupt %d, want 5", m.LocalCorrupt)
	}
}
