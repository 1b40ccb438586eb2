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
	"github.com/kvmesh/kvmesh/meta"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// fetchSink keeps what a FetchMany stream announced, in order.
type fetchSink struct {
	order   []int // entries announced (found or missing)
	missing map[int]codes.Code
	blobs   map[int][]byte
	layers  [][2]int
}

func (s *fetchSink) Found(i int, blob []byte, _ *chunk.Header) {
	s.order = append(s.order, i)
	s.blobs[i] = blob
}

func (s *fetchSink) Missing(i int, code codes.Code) {
	s.order = append(s.order, i)
	s.missing[i] = code
}

func (s *fetchSink) Layer(i, l int) { s.layers = append(s.layers, [2]int{i, l}) }

// TestInjectStreams: with R=1 on two nodes, a node injecting chunks the
// other holds reads them all in one FetchMany stream, and writes exactly
// what the owner writes injecting them from its own tier. Peer.FetchMany
// itself answers in request order, a missing key with NOT_FOUND, the
// entries' stored bytes layer by layer.
func TestInjectStreams(t *testing.T) {
	nodes := startCluster(t, 2)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	set := meta.Settings{ReplicationFactor: 1, WriteQuorum: 1, Codec: meta.DefaultSettings().Codec}
	if err := nodes[0].Meta().SetSettings(ctx, set, meta.AnyVersion()); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "R=1 on every node", func() bool {
		return nodes[0].Meta().Settings().ReplicationFactor == 1 && nodes[1].Meta().Settings().ReplicationFactor == 1
	})
	c := newClient(t, nodes...)
	spec := testutil.Spec()
	fp, err := c.RegisterModel(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	// Chunks owned by nodes[1] only.
	rng := rand.New(rand.NewPCG(21, 3))
	var chunks []pagedkv.InjectChunk
	var keys []chunk.Key
	for len(chunks) < 4 {
		tokens := testutil.Tokens(rng, 5)
		ent := testutil.NewEntry(rng, spec, tokens, chunk.StandaloneContext())
		normalKV(rng, ent)
		if _, err := c.Put(ctx, testutil.Encode(t, ent, chunk.CodecRaw)); err != nil {
			t.Fatal(err)
		}
		if nodes[0].Store().Contains(ent.Key) {
			continue
		}
		slots := make([]int, len(tokens))
		for i := range slots {
			slots[i] = 8*len(chunks) + i
		}
		chunks = append(chunks, pagedkv.InjectChunk{Key: ent.Key, Tokens: tokens, Pos: 50 + 10*len(chunks), Slots: slots})
		keys = append(keys, ent.Key)
	}

	lay := pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: 4, BlockSize: 16, KVHeads: spec.KVHeads, HeadDim: spec.HeadDim, DType: chunk.F32}
	injectThrough := func(nd *node.Node) [][]byte {
		t.Helper()
		shm, err := inject.CreateShm("", spec.Layers, []pagedkv.CacheLayout{lay})
		if err != nil {
			t.Skipf("shared memory: %v", err)
		}
		t.Cleanup(func() { _ = shm.Close() })
		inj, err := c.RegisterCache(ctx, nd.GRPCAddr(), client.CacheRegistration{Fingerprint: fp, Layers: spec.Layers,
			Layouts: []pagedkv.CacheLayout{lay}, MaxPositions: 1024, File: shm.Memory.File, Offsets: shm.Memory.Offsets})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = inj.Close(ctx) }()
		res, _, err := inj.InjectLayered(ctx, chunks, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			if r.Match != chunk.MatchExact {
				t.Fatalf("through %s: chunk %d %+v", nd.ID(), i, r)
			}
		}
		return shm.Layers
	}
	streams0, _, _ := node.InjectReads(nodes[0])
	remote := injectThrough(nodes[0])
	local := injectThrough(nodes[1])
	for l := range local {
		if !bytes.Equal(remote[l], local[l]) {
			t.Fatalf("layer %d: the injection of streamed entries differs from the owner's local one", l)
		}
	}
	streams, fetched, _ := node.InjectReads(nodes[0])
	if streams-streams0 != 1 || fetched < float64(len(chunks)) {
		t.Fatalf("%v streams for %d chunks on one replica (want 1), %v entries fetched", streams-streams0, len(chunks), fetched)
	}

	// Peer.FetchMany on the owner, with a key it lacks in the middle.
	cc := dialFrames(t, nodes[1])
	missing := chunk.Key{Fingerprint: fp, Content: chunk.ContentID(fp, testutil.Tokens(rng, 3)), Context: chunk.StandaloneContext()}
	ask := []chunk.Key{keys[0], missing, keys[1]}
	req := &api.FetchManyRequest{}
	for _, k := range ask {
		req.Keys = append(req.Keys, api.ProtoKey(k))
	}
	st, err := api.NewPeerClient(cc).FetchMany(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	s := &fetchSink{missing: map[int]codes.Code{}, blobs: map[int][]byte{}}
	if err := api.RecvFetchMany(st, len(ask), chunk.Limits{}, s); err != nil {
		t.Fatal(err)
	}
	if len(s.order) != 3 || s.order[0] != 0 || s.order[1] != 1 || s.order[2] != 2 || s.missing[1] != codes.NotFound {
		t.Fatalf("announced %v, missing %v", s.order, s.missing)
	}
	for _, i := range []int{0, 2} {
		want, err := c.Get(ctx, ask[i])
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(s.blobs[i], want) {
			t.Fatalf("entry %d: streamed bytes differ from the stored ones", i)
		}
	}
	for j, il := range s.layers {
		if want := [2]int{[]int{0, 2}[j%2], j / 2}; il != want {
			t.Fatalf("layers arrived as %v, want by layer then by entry", s.layers)
		}
	}
}
