package inject

import (
	"math/rand/v2"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// TestTimings: a request that injected reports time in the stages it ran
// (decode only for a coded entry); a request whose chunks all miss spent
// none past the fetch. No duration is bounded.
func TestTimings(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	spec := testSpec(chunk.BF16)
	fp := spec.Fingerprint()
	lay := pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: 8, BlockSize: 16, KVHeads: 4, HeadDim: 16, DType: chunk.BF16}
	cx := chunk.StandaloneContext()
	for _, codec := range []chunk.Codec{chunk.CodecRaw, chunk.CodecLossless} {
		t.Run(codec.String(), func(t *testing.T) {
			f := newMemFetcher()
			s := newService(t, f, spec, nil)
			id, _ := registerMem(t, s, inProc, Descriptor{Fingerprint: fp, Layers: spec.Layers, MaxPositions: 1024}, lay)
			toks := randTokens(rng, 20)
			f.put(t, synthEntry(rng, spec, toks, cx), codec)
			slots := slotPlan(rng, lay.Slots(), []int{20, 20}, false)

			resp, err := s.Inject(t.Context(), &Request{Cache: id, Chunks: []pagedkv.InjectChunk{{Key: chunk.Key{Context: cx}, Tokens: toks, Slots: slots[0]}}})
			if err != nil {
				t.Fatal(err)
			}
			if m := resp.Results[0].Match; m != chunk.MatchExact {
				t.Fatalf("stored chunk: %v (%v)", m, resp.Results[0].Reason)
			}
			tm := resp.Timings
			if tm.Fetch <= 0 || tm.Verify <= 0 || tm.Scatter <= 0 {
				t.Errorf("hit: timings %+v, want fetch, verify and scatter filled", tm)
			}
			if (tm.Decode > 0) != (codec != chunk.CodecRaw) {
				t.Errorf("hit of a %v entry: decode %v", codec, tm.Decode)
			}
			if tm.Arrive != 0 {
				t.Errorf("hit of a stored entry: arrive %v, want 0", tm.Arrive)
			}
			if tot := s.StageTotals(); tot.Verify <= 0 || tot.Scatter <= 0 {
				t.Errorf("stage totals %+v after a hit, want verify and scatter filled", tot)
			}

			resp, err = s.Inject(t.Context(), &Request{Cache: id, Chunks: []pagedkv.InjectChunk{{Key: chunk.Key{Context: cx}, Tokens: randTokens(rng, 20), Slots: slots[1]}}})
			if err != nil {
				t.Fatal(err)
			}
			if m := resp.Results[0].Match; m != chunk.MatchMiss {
				t.Fatalf("unknown chunk: %v", m)
			}
			if tm := resp.Timings; tm.Arrive != 0 || tm.Verify != 0 || tm.Decode != 0 || tm.Scatter != 0 {
				t.Errorf("miss: timings %+v, want no stage past the fetch", tm)
			}
		})
	}
}
