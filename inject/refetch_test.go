package inject

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/pagedkv"
	"github.com/kvmesh/kvmesh/pinned"
)

// damagedLocal serves a damaged copy of every entry as local and the
// good one from Refetch, recording what Refetch was asked.
type damagedLocal struct {
	good map[chunk.Key][]byte
	mu   sync.Mutex
	asks [][2]chunk.Key // stored, want
}

func (d *damagedLocal) Fetch(_ context.Context, key chunk.Key) (Fetched, error) {
	b, ok := d.good[key]
	if !ok {
		return Fetched{Match: chunk.MatchMiss}, nil
	}
	bad := slices.Clone(b)
	bad[len(bad)-1] ^= 1 // one payload byte
	return Fetched{Blob: pinned.Owned(bad), Local: true, Key: key, Match: chunk.MatchExact}, nil
}

func (d *damagedLocal) Refetch(_ context.Context, stored, want chunk.Key, _ error) (Fetched, error) {
	d.mu.Lock()
	d.asks = append(d.asks, [2]chunk.Key{stored, want})
	d.mu.Unlock()
	return Fetched{Blob: pinned.Owned(d.good[want]), Match: chunk.MatchExact}, nil
}

// TestLocalCorruptRefetched: a local entry that fails verification is
// not a miss when the Fetcher can refetch it: the Service asks for it
// again (the stored key and the wanted one) and writes the replica's copy.
func TestLocalCorruptRefetched(t *testing.T) {
	spec := testSpec(chunk.F32)
	rng := rand.New(rand.NewPCG(35, 2))
	toks := randTokens(rng, 16)
	e := synthEntry(rng, spec, toks, chunk.StandaloneContext())
	d := &damagedLocal{good: map[chunk.Key][]byte{e.Key: encode(t, e, chunk.CodecRaw)}}
	s := newService(t, d, spec, nil)
	lay := pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: 4, BlockSize: 16, KVHeads: spec.KVHeads, HeadDim: spec.HeadDim, DType: chunk.F32}
	id, _ := registerMem(t, s, inProc, Descriptor{Fingerprint: spec.Fingerprint(), Layers: spec.Layers, MaxPositions: 512}, lay)
	slots := make([]int, 16)
	for i := range slots {
		slots[i] = i
	}
	resp, err := s.Inject(t.Context(), &Request{Cache: id, Chunks: []pagedkv.InjectChunk{{Key: chunk.Key{Context: chunk.StandaloneContext()}, Tokens: toks, Slots: slots}}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Results[0].Match != chunk.MatchExact {
		t.Fatalf("result %+v, want EXACT from the refetched copy", resp.Results[0])
	}
	if len(d.asks) != 1 || d.asks[0][0] != e.Key || d.asks[0][1] != e.Key {
		t.Errorf("Refetch asked %v, want once for %v", d.asks, e.Key)
	}
}
