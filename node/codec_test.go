package node_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/inject"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/meta"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// TestClusterCodec: a raw entry is stored in the cluster codec (lossless
// by default) and a re-put of it in either codec is the same bytes; a
// node without the entry fetches the compressed bytes from its owner and
// injects exactly what the raw entry holds; a codec change applies to new
// writes only (the client learns it), old entries stay readable, and a
// lossy entry is stored as it came.
func TestClusterCodec(t *testing.T) {
	nodes := startCluster(t, 2)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	set := meta.Settings{ReplicationFactor: 1, WriteQuorum: 1, Codec: meta.DefaultSettings().Codec}
	if err := nodes[0].Meta().SetSettings(ctx, set, meta.AnyVersion()); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, nodes...)
	if err := c.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if c.Codec() != chunk.CodecLossless {
		t.Fatalf("client learnt codec %v, want the default lossless", c.Codec())
	}
	spec := testutil.Spec()
	fp, err := c.RegisterModel(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(18, 2))
	tokens := testutil.Tokens(rng, 6)
	ent := testutil.NewEntry(rng, spec, tokens, chunk.StandaloneContext())
	normalKV(rng, ent)
	raw := testutil.Encode(t, ent, chunk.CodecRaw)
	lossless := testutil.Encode(t, ent, chunk.CodecLossless)

	stored := func(key chunk.Key) []byte {
		t.Helper()
		b, err := c.Get(ctx, key)
		if err != nil {
			t.Fatalf("get %v: %v", key, err)
		}
		return b
	}
	res, err := c.Put(ctx, raw)
	if err != nil {
		t.Fatal(err)
	}
	if got := stored(ent.Key); !bytes.Equal(got, lossless) {
		t.Fatalf("a raw put is stored in codec %v (%d bytes), want the lossless encoding (%d bytes)", chunk.Codec(got[6]), len(got), len(lossless))
	}
	for _, blob := range [][]byte{raw, lossless} {
		again, err := c.Put(ctx, blob)
		if err != nil || again.Checksum != res.Checksum {
			t.Fatalf("re-put in codec %v: %v, checksum %x, want %x", chunk.Codec(blob[6]), err, again.Checksum, res.Checksum)
		}
	}
	if len(lossless) >= len(raw) {
		t.Fatalf("lossless entry of %d bytes, raw %d: nothing to tell apart", len(lossless), len(raw))
	}

	// Inject through the node that does not hold the entry: its bytes come
	// from the owner as stored.
	var querier *node.Node
	for _, nd := range nodes {
		if !nd.Store().Contains(ent.Key) {
			querier = nd
		}
	}
	if querier == nil {
		t.Fatal("both nodes hold the entry with R=1")
	}
	lay := pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: 4, BlockSize: 16, KVHeads: spec.KVHeads, HeadDim: spec.HeadDim, DType: chunk.F32}
	shm, err := inject.CreateShm("", spec.Layers, []pagedkv.CacheLayout{lay})
	if err != nil {
		t.Skipf("shared memory: %v", err)
	}
	defer shm.Close()
	inj, err := c.RegisterCache(ctx, querier.GRPCAddr(), client.CacheRegistration{Fingerprint: fp, Layers: spec.Layers,
		Layouts: []pagedkv.CacheLayout{lay}, MaxPositions: 1024, File: shm.Memory.File, Offsets: shm.Memory.Offsets})
	if err != nil {
		t.Fatal(err)
	}
	injectAt := func(key chunk.Key, slots []int) {
		t.Helper()
		res, _, err := inj.InjectLayered(ctx, []pagedkv.InjectChunk{{Key: key, Tokens: tokens, Pos: 100, Slots: slots}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res[0].Match != chunk.MatchExact {
			t.Fatalf("inject %v: %+v", key, res[0])
		}
	}
	lossSlots := []int{0, 1, 2, 3, 4, 5}
	injectAt(ent.Key, lossSlots)
	if local, peers := querier.InjectFetchedBytes(); local != 0 || peers != float64(len(lossless)) {
		t.Fatalf("fetched %v local, %v from the peer; want 0, %d (the lossless entry; raw is %d)", local, peers, len(lossless), len(raw))
	}

	// The codec becomes raw: the client learns it, a new write is stored
	// raw even when sent lossless, and the lossless entry stays readable.
	set.Codec = chunk.CodecRaw
	if err := nodes[0].Meta().SetSettings(ctx, set, meta.AnyVersion()); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "every node at the raw codec", func() bool {
		return nodes[0].Meta().Settings().Codec == chunk.CodecRaw && nodes[1].Meta().Settings().Codec == chunk.CodecRaw
	})
	if err := c.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if c.Codec() != chunk.CodecRaw {
		t.Fatalf("client learnt codec %v after the change, want raw", c.Codec())
	}
	// The same KV under another context: another key, same values.
	win := *ent
	win.Key.Context = chunk.WindowContext(fp, 1, testutil.Tokens(rng, 1))
	if _, err := c.Put(ctx, testutil.Encode(t, &win, chunk.CodecLossless)); err != nil {
		t.Fatal(err)
	}
	if got := stored(win.Key); !bytes.Equal(got, testutil.Encode(t, &win, chunk.CodecRaw)) {
		t.Fatalf("a lossless put after the change is stored in codec %v, want raw", chunk.Codec(got[6]))
	}
	if got := stored(ent.Key); !bytes.Equal(got, lossless) {
		t.Fatal("the lossless entry changed with the codec")
	}
	rawSlots := []int{16, 17, 18, 19, 20, 21}
	injectAt(win.Key, rawSlots)
	slotBytes := spec.KVHeads * spec.HeadDim * 4
	for l, layer := range shm.Layers {
		half := len(layer) / 2
		for kv := range 2 {
			for i := range tokens {
				a := layer[kv*half+lossSlots[i]*slotBytes:][:slotBytes]
				b := layer[kv*half+rawSlots[i]*slotBytes:][:slotBytes]
				if !bytes.Equal(a, b) {
					t.Fatalf("layer %d kv %d token %d: injected from lossless differs from raw", l, kv, i)
				}
			}
		}
	}

	// A lossy entry is never quantised again.
	lossyEnt := testutil.NewEntry(rng, spec, testutil.Tokens(rng, 4), chunk.StandaloneContext())
	normalKV(rng, lossyEnt)
	int8Blob := testutil.Encode(t, lossyEnt, chunk.CodecInt8)
	if _, err := c.Put(ctx, int8Blob); err != nil {
		t.Fatal(err)
	}
	if got := stored(lossyEnt.Key); !bytes.Equal(got, int8Blob) {
		t.Fatalf("an int8 put is stored in codec %v, want as it came", chunk.Codec(got[6]))
	}
}

// normalKV fills a bf16 entry with normal values, like a model's (random
// bytes would not compress, nor quantise: some are NaN).
func normalKV(rng *rand.Rand, e *chunk.Entry) {
	for i := 0; i < len(e.KV); i += 2 {
		binary.LittleEndian.PutUint16(e.KV[i:], chunk.F32ToBF16(float32(rng.NormFloat64())))
	}
}
