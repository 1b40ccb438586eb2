package inject

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/cudakern"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// fetcherSource serves the engine from the same blobs the Service fetches,
// decoded whole, so both paths inject identical entries.
type fetcherSource struct{ f Fetcher }

func (s fetcherSource) Lookup(ctx context.Context, reqs []engine.LookupRequest) ([]*chunk.Entry, error) {
	out := make([]*chunk.Entry, len(reqs))
	for i, r := range reqs {
		got, err := s.f.Fetch(ctx, r.Key)
		if err != nil || got.Match == chunk.MatchMiss {
			continue
		}
		out[i], err = chunk.Decode(got.Blob.Bytes(), chunk.Limits{})
		got.Blob.Release()
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

func tinyEngine(t *testing.T) *engine.Engine {
	t.Helper()
	mc := engine.ModelConfig{
		ModelType: "llama", HiddenSize: 64, IntermediateSize: 128, NumLayers: 4,
		NumHeads: 4, NumKVHeads: 2, HeadDim: 16, VocabSize: 256, RMSNormEps: 1e-5,
		RopeTheta: 10000, RopeStyle: chunk.RopeNeoX, MaxPositionEmbeddings: 4096, DType: chunk.F32,
	}
	ts, err := engine.RandomTensors(mc, 5, 0)
	if err != nil {
		t.Fatal(err)
	}
	w, err := engine.NewWeights(mc, ts)
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(w, engine.Config{Workers: 2, CacheTokens: 1024})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// TestEngineCacheBytes is the exactness property at the cache level. A real
// engine encodes chunks after their prefixes (EXACT) and one standalone
// (APPROXIMATE); engine.Run injecting those entries itself gives prefill's
// logits; the Service, injecting the same blobs into a registered cache of
// the engine's layout at the slots engine.Run used, reports the same
// matches and writes exactly the bytes engine.Run's injection writes
// (cudakern with the engine's layout and RoPE table).
func TestEngineCacheBytes(t *testing.T) {
	ctx := t.Context()
	e := tinyEngine(t)
	spec, fp, lay := e.Spec(), e.Fingerprint(), e.Layout()
	rng := rand.New(rand.NewPCG(8, 9))
	vocab := func(n int) []uint32 {
		out := make([]uint32, n)
		for i := range out {
			out[i] = uint32(rng.IntN(256))
		}
		return out
	}
	segs := []engine.Segment{{Tokens: vocab(6)}, {Tokens: vocab(19), Chunk: true}, {Tokens: vocab(11), Chunk: true},
		{Tokens: vocab(23), Chunk: true}, {Tokens: vocab(5)}}
	const start = 37
	var toks [][]uint32
	for _, sg := range segs {
		toks = append(toks, sg.Tokens)
	}
	contexts, _ := chunk.PrefixChain(fp, toks)

	f := newMemFetcher()
	for i := 1; i <= 3; i++ {
		var ent *chunk.Entry
		var err error
		if i == 2 { // standalone: APPROXIMATE
			ent, err = e.EncodeStandalone(ctx, toks[i])
		} else {
			ent, err = e.EncodeAfterPrefix(ctx, toks[:i], toks[i])
		}
		if err != nil {
			t.Fatal(err)
		}
		f.put(t, ent, chunk.CodecLossless)
	}

	// Exact chunks only: engine.Run over the blobs equals prefill.
	exactSegs := append([]engine.Segment(nil), segs...)
	exactSegs[2].Chunk = false
	pre, err := e.Run(ctx, nil, engine.Request{StartPos: start, Segments: exactSegs})
	if err != nil {
		t.Fatal(err)
	}
	inj, err := e.Run(ctx, fetcherSource{f}, engine.Request{StartPos: start, Segments: exactSegs})
	if err != nil {
		t.Fatal(err)
	}
	var d float64
	for i := range pre.Logits {
		d = math.Max(d, math.Abs(float64(pre.Logits[i]-inj.Logits[i])))
	}
	if d > 1e-4 || inj.Injected != len(toks[1])+len(toks[3]) {
		t.Fatalf("engine injection: max |logit diff| %.3g, %d tokens injected", d, inj.Injected)
	}

	// The slots engine.Run gives the prompt.
	run, err := e.Run(ctx, fetcherSource{f}, engine.Request{StartPos: start, Segments: segs, Keep: true})
	if err != nil {
		t.Fatal(err)
	}
	slots := append([]int(nil), run.Seq.Slots()...)
	run.Seq.Release()

	s := newService(t, f, spec, nil)
	mem := layersOf(spec.Layers, lay)
	id, err := s.RegisterInProcess(ctx, Descriptor{Fingerprint: fp, Layers: spec.Layers,
		Layouts: []pagedkv.CacheLayout{lay}, MaxPositions: 8192}, mem)
	if err != nil {
		t.Fatal(err)
	}
	want := layersOf(spec.Layers, lay)
	rope, err := cudakern.NewRopeTable(spec, 8192)
	if err != nil {
		t.Fatal(err)
	}
	direct := cudakern.NewInjector(cudakern.Config{Workers: 1})
	defer direct.Close()
	req := &Request{Cache: id}
	at := 0
	var segOf []int
	for i, sg := range segs {
		n := len(sg.Tokens)
		if sg.Chunk {
			ch := pagedkv.InjectChunk{Key: chunk.Key{Context: contexts[i]}, Tokens: sg.Tokens, Pos: start + at, Slots: slots[at : at+n]}
			req.Chunks = append(req.Chunks, ch)
			segOf = append(segOf, i)
			got, err := f.Fetch(ctx, chunk.Key{Fingerprint: fp, Content: chunk.ContentID(fp, sg.Tokens), Context: contexts[i]})
			if err != nil {
				t.Fatal(err)
			}
			directInject(t, direct, rope, got.Blob.Bytes(), lay, 0, spec.KVHeads, ch.Pos, ch.Slots, want)
			got.Blob.Release()
		}
		at += n
	}
	resp, err := s.Inject(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for j, r := range resp.Results {
		em := run.Chunks[j]
		if em.Segment != segOf[j] || r.Match.String() != em.Match.String() || r.Context != em.Context {
			t.Errorf("chunk %d: service %v %v, engine %v %v", j, r.Match, r.Context, em.Match, em.Context)
		}
	}
	if resp.Results[1].Match != chunk.MatchApproximate || resp.Results[0].Match != chunk.MatchExact || resp.Results[2].Match != chunk.MatchExact {
		t.Errorf("matches %v %v %v, want exact approximate exact", resp.Results[0].Match, resp.Results[1].Match, resp.Results[2].Match)
	}
	equalLayers(t, "cache", mem, want)
}

// serviceInjector is the embedded wiring of engine.CacheInjector: the
// engine's cache memory registered in process, chunks injected by the
// Service. (Across processes the client implements the same interface over
// the node's Inject RPC, with the cache in shared memory.)
type serviceInjector struct {
	s  *Service
	id CacheID
}

func (si serviceInjector) InjectChunks(ctx context.Context, chunks []pagedkv.InjectChunk) ([]pagedkv.InjectResult, error) {
	req := &Request{Cache: si.id, Chunks: chunks}
	resp, err := si.s.Inject(ctx, req)
	if err != nil {
		return nil, err
	}
	out := make([]pagedkv.InjectResult, len(chunks))
	for i, r := range resp.Results {
		out[i] = r.InjectResult
	}
	return out, nil
}

// TestEngineForwardPass is the end-to-end property on a real forward
// pass: the engine's cache memory is registered with the Service, which
// fills it from stored blobs; the engine then computes only the other
// tokens. EXACT chunks give prefill's logits; the logits equal, bit for
// bit, those of the engine injecting the same entries itself; an
// APPROXIMATE chunk repaired with r = 100% gives prefill's logits again;
// a MISS is prefilled.
func TestEngineForwardPass(t *testing.T) {
	ctx := t.Context()
	e := tinyEngine(t)
	spec, fp := e.Spec(), e.Fingerprint()
	lay, mem := e.CacheMemory()
	rng := rand.New(rand.NewPCG(10, 11))
	vocab := func(n int) []uint32 {
		out := make([]uint32, n)
		for i := range out {
			out[i] = uint32(rng.IntN(256))
		}
		return out
	}
	segs := []engine.Segment{{Tokens: vocab(7)}, {Tokens: vocab(21), Chunk: true}, {Tokens: vocab(16), Chunk: true},
		{Tokens: vocab(9), Chunk: true}, {Tokens: vocab(30), Chunk: true}, {Tokens: vocab(6)}}
	var toks [][]uint32
	for _, sg := range segs {
		toks = append(toks, sg.Tokens)
	}
	f := newMemFetcher()
	put := func(i int, standalone bool, codec chunk.Codec) {
		var ent *chunk.Entry
		var err error
		if standalone {
			ent, err = e.EncodeStandalone(ctx, toks[i])
		} else {
			ent, err = e.EncodeAfterPrefix(ctx, toks[:i], toks[i])
		}
		if err != nil {
			t.Fatal(err)
		}
		f.put(t, ent, codec)
	}
	put(1, false, chunk.CodecRaw)
	put(2, false, chunk.CodecLossless)
	put(3, true, chunk.CodecRaw) // APPROXIMATE
	put(4, false, chunk.CodecRaw)

	s := newService(t, f, spec, nil)
	id, err := s.RegisterInProcess(ctx, Descriptor{Fingerprint: fp, Layers: spec.Layers,
		Layouts: []pagedkv.CacheLayout{lay}, MaxPositions: 8192}, mem)
	if err != nil {
		t.Fatal(err)
	}
	si := serviceInjector{s, id}
	for _, start := range []int{0, 45, 700} {
		// Exact chunks only (segment 3 is text here).
		exact := append([]engine.Segment(nil), segs...)
		exact[3].Chunk = false
		pre, err := e.Run(ctx, nil, engine.Request{StartPos: start, Segments: exact})
		if err != nil {
			t.Fatal(err)
		}
		got, err := e.RunInjected(ctx, si, engine.Request{StartPos: start, Segments: exact})
		if err != nil {
			t.Fatal(err)
		}
		own, err := e.Run(ctx, fetcherSource{f}, engine.Request{StartPos: start, Segments: exact})
		if err != nil {
			t.Fatal(err)
		}
		for _, cr := range got.Chunks {
			if cr.Match != chunk.MatchExact {
				t.Fatalf("start %d: segment %d %v, want exact", start, cr.Segment, cr.Match)
			}
		}
		injected := len(toks[1]) + len(toks[2]) + len(toks[4])
		if got.Injected != injected || got.TokenLayers != (got.Tokens-injected)*spec.Layers {
			t.Fatalf("start %d: injected %d tokens, computed %d token-layers", start, got.Injected, got.TokenLayers)
		}
		if d := maxAbsDiffF(got.Logits, own.Logits); d != 0 {
			t.Errorf("start %d: logits differ from the engine's own injection by %.3g", start, d)
		}
		if d := maxAbsDiffF(got.Logits, pre.Logits); d > 1e-4 {
			t.Errorf("start %d: max |logit diff| vs prefill %.3g > 1e-4", start, d)
		}

		// An approximate chunk, recomputed fully, and a miss.
		mixed := append([]engine.Segment(nil), segs...)
		mixed = append(mixed[:5], engine.Segment{Tokens: vocab(12), Chunk: true}, mixed[5])
		pre, err = e.Run(ctx, nil, engine.Request{StartPos: start, Segments: mixed})
		if err != nil {
			t.Fatal(err)
		}
		got, err = e.RunInjected(ctx, si, engine.Request{StartPos: start, Segments: mixed, Recompute: 1})
		if err != nil {
			t.Fatal(err)
		}
		want := []chunk.Match{chunk.MatchExact, chunk.MatchExact, chunk.MatchApproximate, chunk.MatchExact, chunk.MatchMiss}
		for j, cr := range got.Chunks {
			if cr.Match != want[j] {
				t.Errorf("start %d: chunk %d %v, want %v", start, j, cr.Match, want[j])
			}
		}
		if d := maxAbsDiffF(got.Logits, pre.Logits); d > 1e-4 {
			t.Errorf("start %d: approximate at r=1: max |logit diff| vs prefill %.3g > 1e-4", start, d)
		}
	}
	if f.out.Load() != 0 {
		t.Errorf("%d blobs not released", f.out.Load())
	}
}

func maxAbsDiffF(a, b []float32) float64 {
	var d float64
	for i := range a {
		d = math.Max(d, math.Abs(float64(a[i]-b[i])))
	}
	return d
}
