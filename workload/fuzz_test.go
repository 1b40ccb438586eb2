package workload

import (
	"context"
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/engine"
)

// fakeCluster answers every lookup with one key and every Get with blob.
type fakeCluster struct {
	match chunk.Match
	key   chunk.Key
	blob  []byte
}

func (f *fakeCluster) Lookup(_ context.Context, _ chunk.Fingerprint, items []client.LookupItem) ([]client.LookupResult, error) {
	out := make([]client.LookupResult, len(items))
	for i := range out {
		out[i] = client.LookupResult{Match: f.match, Key: f.key}
	}
	return out, nil
}

func (f *fakeCluster) Get(context.Context, chunk.Key) ([]byte, error) { return f.blob, nil }

func (f *fakeCluster) Put(context.Context, []byte) (client.PutResult, error) {
	return client.PutResult{}, nil
}

func (f *fakeCluster) Codec() chunk.Codec { return chunk.CodecLossless }

// FuzzClusterStoreLookup feeds arbitrary bytes to the adapter as a
// replica's answer: it must not panic, and an entry it returns must have
// decoded cleanly and carry exactly the requested tokens.
func FuzzClusterStoreLookup(f *testing.F) {
	fp := chunk.Fingerprint{Lo: 3, Hi: 4}
	toks := []uint32{5, 6, 7}
	key := chunk.Key{Fingerprint: fp, Content: chunk.ContentID(fp, toks), Context: chunk.StandaloneContext()}
	ent := &chunk.Entry{Key: key, DType: chunk.F32, Layers: 1, KVHeads: 1, HeadDim: 2, Tokens: toks, KV: make([]byte, 2*3*2*4)}
	for _, c := range []chunk.Codec{chunk.CodecRaw, chunk.CodecLossless, chunk.CodecInt8} {
		blob, err := chunk.Encode(nil, ent, c)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(blob, uint8(1))
		f.Add(blob[:len(blob)/2], uint8(2))
	}
	f.Add([]byte{}, uint8(0))
	f.Fuzz(func(t *testing.T, blob []byte, m uint8) {
		fc := &fakeCluster{match: chunk.Match(m % 3), key: key, blob: blob}
		s := NewClusterStore(fc, StoreConfig{Fingerprint: fp, Limits: chunk.Limits{MaxLayers: 4, MaxTokens: 64, MaxKVHeads: 4, MaxHeadDim: 16, MaxBlobBytes: 1 << 16, MaxRawBytes: 1 << 16}})
		req := engine.LookupRequest{Key: key, Tokens: toks}
		for _, src := range []engine.ChunkSource{s, PrefixOnly(s)} {
			got, err := src.Lookup(t.Context(), []engine.LookupRequest{req, req})
			if err != nil {
				continue
			}
			if len(got) != 2 {
				t.Fatalf("%d answers for 2 requests", len(got))
			}
			for _, e := range got {
				if e == nil {
					continue
				}
				if fc.match == chunk.MatchMiss || !slices.Equal(e.Tokens, toks) || e.Validate() != nil {
					t.Fatalf("returned entry %+v for match %v", e.Key, fc.match)
				}
			}
		}
	})
}
