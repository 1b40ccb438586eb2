package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/cudakern"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// prefill runs segments with no source (prompt injection).
func prefill(t testing.TB, e *Engine, start int, segs []Segment) *Response {
	t.Helper()
	resp, err := e.Run(t.Context(), nil, Request{StartPos: start, Segments: segs})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestExactInjection(t *testing.T) {
	// Positions: encoded at s, injected at t; float32 angle rounding grows
	// with position (REFERENCE.md), and these stay below 1100.
	vs := variants()
	ctx := t.Context()
	for _, name := range sortedNames(vs) {
		for _, pos := range []struct{ s, t int }{{0, 40}, {300, 5}, {17, 1000}} {
			t.Run(fmt.Sprintf("%s/s=%d/t=%d", name, pos.s, pos.t), func(t *testing.T) {
				e := newTestEngine(t, vs[name], 21)
				r := rand.New(rand.NewPCG(uint64(pos.s), uint64(pos.t)))
				prefix := randTokens(r, 13, e.cfg.VocabSize)
				ch := randTokens(r, 19, e.cfg.VocabSize)
				query := randTokens(r, 7, e.cfg.VocabSize)
				// KV of [prefix, chunk] encoded together at offset s.
				root := chunk.PrefixRoot(e.fp)
				ep, err := e.Encode(ctx, nil, prefix, chunk.PrefixContext(root), EncodeOptions{StartPos: pos.s})
				if err != nil {
					t.Fatal(err)
				}
				ec, err := e.Encode(ctx, prefix, ch, chunk.PrefixContext(chunk.NextPrefix(root, prefix)), EncodeOptions{StartPos: pos.s})
				if err != nil {
					t.Fatal(err)
				}
				store := NewMemStore(chunk.CodecRaw)
				for _, en := range []*chunk.Entry{ep, ec} {
					if err := store.Put(ctx, en); err != nil {
						t.Fatal(err)
					}
				}
				segs := []Segment{{Tokens: prefix, Chunk: true}, {Tokens: ch, Chunk: true}, {Tokens: query}}
				got, err := e.Run(ctx, store, Request{StartPos: pos.t, Segments: segs})
				if err != nil {
					t.Fatal(err)
				}
				for _, cr := range got.Chunks {
					if cr.Match != chunk.MatchExact {
						t.Fatalf("segment %d: %v, want exact", cr.Segment, cr.Match)
					}
				}
				want := prefill(t, e, pos.t, segs)
				d := maxAbsDiff(got.Logits, want.Logits)
				t.Logf("max |logit diff| %.3g", d)
				if d > 1e-4 {
					t.Fatalf("max |logit diff| %.3g > 1e-4", d)
				}
				if got.TokenLayers != len(query)*e.cfg.NumLayers || want.TokenLayers != got.Tokens*e.cfg.NumLayers {
					t.Fatalf("token-layers: injected %d, prefill %d; want %d and %d", got.TokenLayers, want.TokenLayers,
						len(query)*e.cfg.NumLayers, got.Tokens*e.cfg.NumLayers)
				}
				if got.Injected != len(prefix)+len(ch) {
					t.Fatalf("injected %d tokens, want %d", got.Injected, len(prefix)+len(ch))
				}
			})
		}
	}
}

func TestExactChainComposes(t *testing.T) {
	ctx := t.Context()
	for _, name := range []string{"llama-neox", "qwen2-bias-tied", "qwen3-qknorm"} {
		for _, kv := range []chunk.DType{chunk.F32, chunk.BF16} {
			t.Run(fmt.Sprintf("%s/%v", name, kv), func(t *testing.T) {
				c := variants()[name]
				dir := t.TempDir()
				if _, err := WriteRandomModel(dir, c, 9, 3); err != nil { // sharded
					t.Fatal(err)
				}
				w, err := LoadWeights(dir)
				if err != nil {
					t.Fatal(err)
				}
				e, err := New(w, Config{Workers: 2, CacheTokens: 1024, KVDType: kv})
				if err != nil {
					t.Fatal(err)
				}
				defer e.Close()
				r := rand.New(rand.NewPCG(7, 8))
				var chunks [][]uint32
				for i := 0; i < 4; i++ {
					chunks = append(chunks, randTokens(r, 5+7*i, c.VocabSize))
				}
				store := NewMemStore(chunk.CodecRaw)
				for i, ch := range chunks {
					en, err := e.EncodeAfterPrefix(ctx, chunks[:i], ch)
					if err != nil {
						t.Fatal(err)
					}
					if err := store.Put(ctx, en); err != nil {
						t.Fatal(err)
					}
				}
				var segs []Segment
				for _, ch := range chunks {
					segs = append(segs, Segment{Tokens: ch, Chunk: true})
				}
				segs = append(segs, Segment{Tokens: randTokens(r, 9, c.VocabSize)})
				got, err := e.Run(ctx, store, Request{StartPos: 100, Segments: segs})
				if err != nil {
					t.Fatal(err)
				}
				for _, cr := range got.Chunks {
					if cr.Match != chunk.MatchExact {
						t.Fatalf("segment %d: %v, want exact", cr.Segment, cr.Match)
					}
				}
				want := prefill(t, e, 100, segs)
				tol := 1e-4
				if kv == chunk.BF16 { // the stored KV itself is rounded
					tol = 0.1
				}
				d := maxAbsDiff(got.Logits, want.Logits)
				if d > tol {
					t.Fatalf("max |logit diff| %.3g > %g", d, tol)
				}
				// Reordering the chunks breaks the prefix chain: no exact hits.
				segs[0], segs[1] = segs[1], segs[0]
				re, err := e.Run(ctx, store, Request{StartPos: 100, Segments: segs})
				if err != nil {
					t.Fatal(err)
				}
				for _, cr := range re.Chunks {
					if cr.Match == chunk.MatchExact {
						t.Fatalf("reordered segment %d matched exactly", cr.Segment)
					}
				}
			})
		}
	}
}

// approxSetup encodes nChunks chunks standalone and windowed and returns
// prompts built from them.
type approxSetup struct {
	e          *Engine
	standalone *MemStore
	window     *MemStore
	prompts    [][]Segment
}

func newApproxSetup(t testing.TB, c ModelConfig, nPrompts, chunksPer, w int) *approxSetup {
	ctx := t.Context()
	e := newTestEngine(t, c, 31)
	r := rand.New(rand.NewPCG(31, 32))
	as := &approxSetup{e: e, standalone: NewMemStore(0), window: NewMemStore(0)}
	for p := 0; p < nPrompts; p++ {
		var segs []Segment
		var before [][]uint32
		for i := 0; i < chunksPer; i++ {
			ch := randTokens(r, 12, c.VocabSize)
			en, err := e.EncodeStandalone(ctx, ch)
			if err != nil {
				t.Fatal(err)
			}
			as.standalone.Put(ctx, en)
			// The window is the text that precedes the chunk in this prompt.
			en, err = e.EncodeWindow(ctx, before, w, ch)
			if err != nil {
				t.Fatal(err)
			}
			as.window.Put(ctx, en)
			segs = append(segs, Segment{Tokens: ch, Chunk: true})
			before = append(before, ch)
		}
		segs = append(segs, Segment{Tokens: randTokens(r, 6, c.VocabSize)})
		as.prompts = append(as.prompts, segs)
	}
	return as
}

func TestApproximateRecompute(t *testing.T) {
	ctx := t.Context()
	c := tinyConfig()
	c.NumLayers = 6
	as := newApproxSetup(t, c, 24, 4, 20)
	e := as.e
	refs := make([][]float32, len(as.prompts))
	var full int
	for i, segs := range as.prompts {
		resp := prefill(t, e, 0, segs)
		refs[i], full = resp.Logits, full+resp.TokenLayers
	}
	ratios := []float64{0, 0.15, 0.5, 1}
	fid := make([]Fidelity, len(ratios))
	work := make([]int, len(ratios))
	var win, winR Fidelity
	exact := 0 // token-layers of the first chunks, EXACT: never computed
	for i, segs := range as.prompts {
		exact += len(segs[0].Tokens) * e.cfg.NumLayers
		for k, r := range ratios {
			resp, err := e.Run(ctx, as.standalone, Request{Segments: segs, Recompute: r})
			if err != nil {
				t.Fatal(err)
			}
			for j, cr := range resp.Chunks {
				// The first chunk's standalone encoding is the prefix
				// encoding (nothing before it): EXACT.
				want := chunk.MatchApproximate
				if j == 0 {
					want = chunk.MatchExact
				}
				if cr.Match != want {
					t.Fatalf("standalone entry of chunk %d matched %v, want %v", j, cr.Match, want)
				}
			}
			fid[k].Add(refs[i], resp.Logits)
			work[k] += resp.TokenLayers
			// Count: the query in every layer; when recomputing, every
			// approximate token in layers 0..1 (check layer 1) and the
			// ceil(r·n) selected ones in the rest.
			L, nq := e.cfg.NumLayers, len(segs[len(segs)-1].Tokens)
			napprox := resp.Tokens - nq - len(segs[0].Tokens)
			want := nq * L
			if r > 0 {
				keep := int(math.Ceil(r * float64(napprox)))
				want += 2*napprox + keep*(L-2)
				if resp.Recomputed != keep {
					t.Fatalf("r=%v: %d tokens recomputed, want %d", r, resp.Recomputed, keep)
				}
			}
			if resp.TokenLayers != want {
				t.Fatalf("r=%v: %d token-layers, want %d", r, resp.TokenLayers, want)
			}
		}
		resp, err := e.Run(ctx, as.window, Request{Segments: segs})
		if err != nil {
			t.Fatal(err)
		}
		win.Add(refs[i], resp.Logits)
		resp, err = e.Run(ctx, as.window, Request{Segments: segs, Recompute: 0.15})
		if err != nil {
			t.Fatal(err)
		}
		winR.Add(refs[i], resp.Logits)
	}
	for k, r := range ratios {
		t.Logf("standalone r=%.2f: KL %.4g top1 %.2f max|dlogit| %.3g token-layers %d of %d", r, fid[k].MeanKL(), fid[k].Top1Rate(), fid[k].MaxLogit, work[k], full)
	}
	t.Logf("window w=20: KL %.4g top1 %.2f; with r=0.15: KL %.4g top1 %.2f", win.MeanKL(), win.Top1Rate(), winR.MeanKL(), winR.Top1Rate())
	if fid[0].MaxLogit < 1e-3 || win.MaxLogit < 1e-3 {
		t.Fatalf("standalone (%.3g) or windowed (%.3g) encodings do not differ from prefill", fid[0].MaxLogit, win.MaxLogit)
	}
	for k := 1; k < len(ratios); k++ {
		if fid[k].MeanKL() > fid[k-1].MeanKL() {
			t.Errorf("KL rises from r=%.2f (%.4g) to r=%.2f (%.4g)", ratios[k-1], fid[k-1].MeanKL(), ratios[k], fid[k].MeanKL())
		}
		if fid[k].Top1 < fid[k-1].Top1-1 {
			t.Errorf("top-1 agreement falls from r=%.2f (%d) to r=%.2f (%d)", ratios[k-1], fid[k-1].Top1, ratios[k], fid[k].Top1)
		}
	}
	if fid[3].MaxLogit > 1e-4 || fid[3].Top1 != fid[3].N {
		t.Errorf("r=1 differs from prefill: max |dlogit| %.3g", fid[3].MaxLogit)
	}
	if work[3] != full-exact {
		t.Errorf("r=1 computed %d token-layers, prefill %d of which %d are EXACT", work[3], full, exact)
	}
	// r=15% recomputes layers 0..1 for chunk tokens and 15% of them after.
	if float64(work[1]) > 0.6*float64(full) {
		t.Errorf("r=0.15 computed %d of %d token-layers; it should save far more", work[1], full)
	}
	if winR.MeanKL() > win.MeanKL() {
		t.Errorf("recompute made windowed encodings worse: KL %.4g -> %.4g", win.MeanKL(), winR.MeanKL())
	}
}

// failingSource always errors, as a store that is down.
type failingSource struct{}

func (failingSource) Lookup(context.Context, []LookupRequest) ([]*chunk.Entry, error) {
	return nil, errors.New("store down")
}

// foreignSource returns entries of another model.
type foreignSource struct{ ent *chunk.Entry }

func (f foreignSource) Lookup(_ context.Context, reqs []LookupRequest) ([]*chunk.Entry, error) {
	out := make([]*chunk.Entry, len(reqs))
	for i := range out {
		out[i] = f.ent
	}
	return out, nil
}

func TestRunFallsBackToPrefill(t *testing.T) {
	ctx := t.Context()
	e := newTestEngine(t, tinyConfig(), 41)
	r := rand.New(rand.NewPCG(41, 42))
	ch := randTokens(r, 10, e.cfg.VocabSize)
	segs := []Segment{{Tokens: ch, Chunk: true}, {Tokens: randTokens(r, 5, e.cfg.VocabSize)}}
	want := prefill(t, e, 0, segs)
	other := newTestEngine(t, tinyConfig(), 42) // different weights, different fingerprint
	foreign, err := other.EncodeStandalone(ctx, ch)
	if err != nil {
		t.Fatal(err)
	}
	wrongTokens, err := e.EncodeStandalone(ctx, randTokens(r, 10, e.cfg.VocabSize))
	if err != nil {
		t.Fatal(err)
	}
	for name, src := range map[string]ChunkSource{
		"down":         failingSource{},
		"empty":        NewMemStore(0),
		"foreign":      foreignSource{foreign},
		"wrong-tokens": foreignSource{wrongTokens},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := e.Run(ctx, src, Request{Segments: segs})
			if err != nil {
				t.Fatal(err)
			}
			if got.Injected != 0 || got.TokenLayers != want.TokenLayers {
				t.Fatalf("injected %d, computed %d token-layers; want a full prefill", got.Injected, got.TokenLayers)
			}
			if d := maxAbsDiff(got.Logits, want.Logits); d != 0 {
				t.Fatalf("fallback differs from prefill by %g", d)
			}
		})
	}
	if _, err := e.Run(ctx, nil, Request{Segments: segs, Recompute: 2}); err == nil {
		t.Fatal("recompute ratio 2 accepted")
	}
	if _, err := e.Run(ctx, nil, Request{}); err == nil {
		t.Fatal("empty prompt accepted")
	}
}

func TestRunKeepsSequenceForDecode(t *testing.T) {
	ctx := t.Context()
	e := newTestEngine(t, tinyConfig(), 51)
	r := rand.New(rand.NewPCG(51, 52))
	ch := randTokens(r, 10, e.cfg.VocabSize)
	store := NewMemStore(0)
	en, err := e.EncodeAfterPrefix(ctx, nil, ch)
	if err != nil {
		t.Fatal(err)
	}
	store.Put(ctx, en)
	q := randTokens(r, 4, e.cfg.VocabSize)
	resp, err := e.Run(ctx, store, Request{StartPos: 9, Segments: []Segment{{Tokens: ch, Chunk: true}, {Tokens: q}}, Keep: true})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Seq.Release()
	got, err := resp.Seq.Generate(ctx, nil, 5)
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := e.NewSequence(9)
	defer ref.Release()
	want, err := ref.Generate(ctx, append(append([]uint32(nil), ch...), q...), 5)
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("generation after injection %v, after prefill %v", got, want)
		}
	}
}

func TestMemStorePrefersExactThenWindow(t *testing.T) {
	ctx := t.Context()
	fp := chunk.Fingerprint{Lo: 1, Hi: 2}
	toks := []uint32{1, 2, 3}
	mk := func(cx chunk.Context) *chunk.Entry {
		return &chunk.Entry{Key: chunk.Key{Fingerprint: fp, Content: chunk.ContentID(fp, toks), Context: cx},
			DType: chunk.F32, Layers: 1, KVHeads: 1, HeadDim: 2, Tokens: toks, KV: make([]byte, 2*3*2*4)}
	}
	exact := chunk.PrefixContext(chunk.ID{Lo: 7})
	w8 := chunk.WindowContext(fp, 8, []uint32{9})
	w20 := chunk.WindowContext(fp, 20, []uint32{9, 9})
	tests := []struct {
		name string
		have []chunk.Context
		want chunk.Context
	}{
		{"exact", []chunk.Context{chunk.StandaloneContext(), w20, exact}, exact},
		{"larger window", []chunk.Context{chunk.StandaloneContext(), w8, w20}, w20},
		{"window over standalone", []chunk.Context{chunk.StandaloneContext(), w8}, w8},
		{"other prefix over standalone", []chunk.Context{chunk.PrefixContext(chunk.ID{Lo: 8}), chunk.StandaloneContext()}, chunk.PrefixContext(chunk.ID{Lo: 8})},
		{"miss", nil, chunk.Context{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMemStore(0)
			for _, cx := range tc.have {
				if err := m.Put(ctx, mk(cx)); err != nil {
					t.Fatal(err)
				}
			}
			got, err := m.Lookup(ctx, []LookupRequest{{Key: mk(exact).Key, Tokens: toks}, {Key: mk(exact).Key, Tokens: []uint32{1, 2, 4}}})
			if err != nil {
				t.Fatal(err)
			}
			if got[1] != nil {
				t.Fatal("entry returned for other tokens")
			}
			if tc.have == nil {
				if got[0] != nil {
					t.Fatal("hit in an empty store")
				}
				return
			}
			if got[0] == nil || got[0].Key.Context != tc.want {
				t.Fatalf("got %v, want %v", got[0], tc.want)
			}
		})
	}
}

// storeInjector plays the node in node-side injection: it holds a store and
// writes the engine's registered cache memory itself through cudakern.
type storeInjector struct {
	t      *testing.T
	store  *MemStore
	rope   *cudakern.RopeTable
	layout pagedkv.CacheLayout
	layers [][]byte
	// garbage makes it scribble over every slot and then report a miss.
	garbage bool
}

func (s *storeInjector) InjectChunks(ctx context.Context, chunks []pagedkv.InjectChunk) ([]pagedkv.InjectResult, error) {
	var reqs []LookupRequest
	for _, c := range chunks {
		reqs = append(reqs, LookupRequest{Key: c.Key, Tokens: c.Tokens})
	}
	ents, err := s.store.Lookup(ctx, reqs)
	if err != nil {
		return nil, err
	}
	kin := cudakern.NewInjector(cudakern.Config{Workers: 1})
	defer kin.Close()
	out := make([]pagedkv.InjectResult, len(chunks))
	for i, c := range chunks {
		if s.garbage {
			junk := make([]float32, len(c.Slots)*s.layout.KVHeads*s.layout.HeadDim)
			for j := range junk {
				junk[j] = 1e3
			}
			for _, l := range s.layers {
				cudakern.ScatterF32(l, s.layout, 0, c.Slots, junk)
				cudakern.ScatterF32(l, s.layout, 1, c.Slots, junk)
			}
			continue
		}
		ent := ents[i]
		if ent == nil {
			continue
		}
		job := cudakern.Job{Rope: s.rope, Src: ent.KV, SrcDType: ent.DType, Tokens: len(c.Tokens), SrcHeads: ent.KVHeads,
			Pos: c.Pos, Slots: c.Slots, Layout: s.layout, Dst: s.layers}
		if err := kin.Inject(ctx, &job); err != nil {
			s.t.Errorf("inject: %v", err)
			continue
		}
		out[i] = pagedkv.InjectResult{Match: chunk.MatchApproximate, Context: ent.Key.Context}
		if ent.Key.Context == c.Key.Context {
			out[i].Match = chunk.MatchExact
		}
	}
	return out, nil
}

func TestRunInjected(t *testing.T) {
	ctx := t.Context()
	e := newTestEngine(t, variants()["qwen3-qknorm"], 71)
	r := rand.New(rand.NewPCG(71, 72))
	var chunks [][]uint32
	store := NewMemStore(0)
	for i := 0; i < 3; i++ {
		ch := randTokens(r, 11, e.cfg.VocabSize)
		en, err := e.EncodeAfterPrefix(ctx, chunks, ch)
		if i == 2 { // the last one only standalone: approximate
			en, err = e.EncodeStandalone(ctx, ch)
		}
		if err != nil {
			t.Fatal(err)
		}
		store.Put(ctx, en)
		chunks = append(chunks, ch)
	}
	var segs []Segment
	for _, ch := range chunks {
		segs = append(segs, Segment{Tokens: ch, Chunk: true})
	}
	segs = append(segs, Segment{Tokens: randTokens(r, 5, e.cfg.VocabSize)})
	layout, layers := e.CacheMemory()
	node := &storeInjector{t: t, store: store, rope: e.rope, layout: layout, layers: layers}
	for _, req := range []Request{{}, {Recompute: 0.5}, {Recompute: 0.5, Select: SelectBoth}, {FallbackBound: 1e-9}} {
		req.StartPos, req.Segments = 20, segs
		want, err := e.Run(ctx, store, req)
		if err != nil {
			t.Fatal(err)
		}
		got, err := e.RunInjected(ctx, node, req)
		if err != nil {
			t.Fatal(err)
		}
		if d := maxAbsDiff(got.Logits, want.Logits); d != 0 || got.TokenLayers != want.TokenLayers || got.Fallbacks != want.Fallbacks {
			t.Fatalf("r=%v %v bound %v: injector path differs from the engine's: %g, %d vs %d token-layers", req.Recompute, req.Select, req.FallbackBound, d, got.TokenLayers, want.TokenLayers)
		}
		wantMatch := []chunk.Match{chunk.MatchExact, chunk.MatchExact, chunk.MatchApproximate}
		for j, cr := range got.Chunks {
			if cr.Match != wantMatch[j] {
				t.Fatalf("chunk %d: %v, want %v", j, cr.Match, wantMatch[j])
			}
		}
	}
	// Whatever a failing injector scribbled is overwritten by the prefill.
	node.garbage = true
	got, err := e.RunInjected(ctx, node, Request{StartPos: 20, Segments: segs})
	if err != nil {
		t.Fatal(err)
	}
	want := prefill(t, e, 20, segs)
	if d := maxAbsDiff(got.Logits, want.Logits); d != 0 || got.Injected != 0 {
		t.Fatalf("after a scribbling miss: diff %g, injected %d", d, got.Injected)
	}
}

func TestRecomputeCheckLayer(t *testing.T) {
	ctx := t.Context()
	c := tinyConfig()
	as := newApproxSetup(t, c, 2, 3, 8)
	e, L := as.e, c.NumLayers
	segs := as.prompts[0]
	ref := prefill(t, e, 0, segs)
	nq := len(segs[len(segs)-1].Tokens)
	// The first chunk's standalone encoding is its prefix encoding: EXACT,
	// never recomputed. The others are approximate.
	napprox := ref.Tokens - nq - len(segs[0].Tokens)
	for _, tc := range []struct {
		check, effective int
		r                float64
	}{{1, 1, 0.3}, {2, 2, 0.3}, {9, L - 1, 0.3}, {0, 1, 0.01}, {3, 3, 1}} {
		t.Run(fmt.Sprintf("check=%d/r=%v", tc.check, tc.r), func(t *testing.T) {
			resp, err := e.Run(ctx, as.standalone, Request{Segments: segs, Recompute: tc.r, CheckLayer: tc.check})
			if err != nil {
				t.Fatal(err)
			}
			keep := int(math.Ceil(tc.r * float64(napprox)))
			want := nq*L + napprox*(tc.effective+1) + keep*(L-tc.effective-1)
			if resp.TokenLayers != want {
				t.Fatalf("%d token-layers, want %d", resp.TokenLayers, want)
			}
			if tc.r == 1 {
				if d := maxAbsDiff(resp.Logits, ref.Logits); d != 0 {
					t.Fatalf("r=1 differs from prefill by %g", d)
				}
			}
		})
	}
}

func TestEncodePromptMatchesPerChunkEncoding(t *testing.T) {
	ctx := t.Context()
	e := newTestEngine(t, variants()["llama-bias"], 81)
	r := rand.New(rand.NewPCG(81, 82))
	segs := []Segment{
		{Tokens: randTokens(r, 7, e.cfg.VocabSize), Chunk: true},
		{Tokens: randTokens(r, 3, e.cfg.VocabSize)}, // text between chunks
		{Tokens: randTokens(r, 9, e.cfg.VocabSize), Chunk: true},
	}
	ents, err := e.EncodePrompt(ctx, segs)
	if err != nil {
		t.Fatal(err)
	}
	if ents[1] != nil {
		t.Fatal("text segment encoded")
	}
	for _, i := range []int{0, 2} {
		var prefix [][]uint32
		for _, sg := range segs[:i] {
			prefix = append(prefix, sg.Tokens)
		}
		want, err := e.EncodeAfterPrefix(ctx, prefix, segs[i].Tokens)
		if err != nil {
			t.Fatal(err)
		}
		got := ents[i]
		if got.Key != want.Key {
			t.Fatalf("segment %d: key %v, want %v", i, got.Key, want.Key)
		}
		a, err := EntryF32(got)
		if err != nil {
			t.Fatal(err)
		}
		b, err := EntryF32(want)
		if err != nil {
			t.Fatal(err)
		}
		if d := maxAbsDiff(a, b); d != 0 {
			t.Fatalf("segment %d: KV differs by %g", i, d)
		}
	}
}

// TestCacheOrders: the engine runs over a cache of every order, and
// injection into each gives its prefill's logits, the same in every order.
func TestCacheOrders(t *testing.T) {
	ctx := t.Context()
	c := variants()["llama-gptj"]
	dir := t.TempDir()
	if _, err := WriteRandomModel(dir, c, 91, 1); err != nil {
		t.Fatal(err)
	}
	w, err := LoadWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(91, 92))
	prefix, ch, q := randTokens(r, 9, c.VocabSize), randTokens(r, 21, c.VocabSize), randTokens(r, 5, c.VocabSize)
	segs := []Segment{{Tokens: prefix}, {Tokens: ch, Chunk: true}, {Tokens: q}}
	var logits [][]float32
	for _, order := range pagedkv.Orders() {
		e, err := New(w, Config{Workers: 2, CacheTokens: 256, BlockSize: 8, CacheOrder: order})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if e.Layout().Order != order {
			t.Fatalf("layout order %v, want %v", e.Layout().Order, order)
		}
		en, err := e.EncodeAfterPrefix(ctx, [][]uint32{prefix}, ch)
		if err != nil {
			t.Fatal(err)
		}
		store := NewMemStore(0)
		store.Put(ctx, en)
		got, err := e.Run(ctx, store, Request{StartPos: 30, Segments: segs})
		if err != nil {
			t.Fatal(err)
		}
		if got.Chunks[0].Match != chunk.MatchExact {
			t.Fatalf("%v: chunk %v", order, got.Chunks[0].Match)
		}
		want := prefill(t, e, 30, segs)
		if d := maxAbsDiff(got.Logits, want.Logits); d > 1e-4 {
			t.Fatalf("%v: injection differs from prefill by %g", order, d)
		}
		logits = append(logits, want.Logits)
	}
	for i, order := range pagedkv.Orders() {
		if d := maxAbsDiff(logits[0], logits[i]); d != 0 {
			t.Fatalf("%v and %v prefills differ by %g", pagedkv.Orders()[0], order, d)
		}
	}
}

// TestOneComputationOneKey: KV that is the same computation as the EXACT
// encoding is keyed and reported so. A standalone encoding of the chunk
// that starts the prompt is its prefix encoding, and a window encoding
// whose window holds every token before the chunk is the prefix encoding:
// both are bit-identical to what the prompt's prefill writes back, share
// its key, and a lookup reports them EXACT with nothing recomputed.
func TestOneComputationOneKey(t *testing.T) {
	ctx := context.Background()
	e := newTestEngine(t, variants()["qwen3-qknorm"], 91)
	r := rand.New(rand.NewPCG(91, 92))
	c0, c1, c2 := randTokens(r, 9, e.cfg.VocabSize), randTokens(r, 7, e.cfg.VocabSize), randTokens(r, 5, e.cfg.VocabSize)
	segs := []Segment{{Tokens: c0, Chunk: true}, {Tokens: c1, Chunk: true}, {Tokens: c2, Chunk: true}, {Tokens: randTokens(r, 4, e.cfg.VocabSize)}}
	written, err := e.EncodePrompt(ctx, segs)
	if err != nil {
		t.Fatal(err)
	}
	alone, err := e.EncodeStandalone(ctx, c0)
	if err != nil {
		t.Fatal(err)
	}
	// A window wider than everything before c1, and one of exactly that.
	wide, err := e.EncodeWindow(ctx, [][]uint32{c0}, 64, c1)
	if err != nil {
		t.Fatal(err)
	}
	exact, err := e.EncodeWindow(ctx, [][]uint32{c0, c1}, len(c0)+len(c1), c2)
	if err != nil {
		t.Fatal(err)
	}
	for i, got := range []*chunk.Entry{alone, wide, exact} {
		if got.Key != written[i].Key || !bytes.Equal(got.KV, written[i].KV) {
			t.Fatalf("chunk %d: key %v, the prompt writes back %v (same KV: %v)", i, got.Key, written[i].Key, bytes.Equal(got.KV, written[i].KV))
		}
	}
	store := NewMemStore(chunk.CodecRaw)
	for _, en := range []*chunk.Entry{alone, wide, exact} {
		if err := store.Put(ctx, en); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := e.Run(ctx, store, Request{Segments: segs, Recompute: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, cr := range resp.Chunks {
		if cr.Match != chunk.MatchExact {
			t.Errorf("chunk %d: %v, want exact", cr.Segment, cr.Match)
		}
	}
	if resp.Recomputed != 0 {
		t.Errorf("%d tokens recomputed, want none", resp.Recomputed)
	}
	// A lookup that spells the first chunk's want as the root of the
	// prefix chain finds the standalone key EXACT too.
	root := chunk.Key{Fingerprint: e.fp, Content: chunk.ContentID(e.fp, c0), Context: chunk.PrefixContext(chunk.PrefixRoot(e.fp))}
	got, err := store.Lookup(ctx, []LookupRequest{{Key: root, Tokens: c0}})
	if err != nil || got[0] == nil || got[0].Key != alone.Key {
		t.Fatalf("lookup of %v: %v, %v", root, got, err)
	}
}
