package engine

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/kvmesh/kvmesh/cudakern"
)

// refForward is an independent float64 forward pass written from the HF
// modeling code (no cache, no pool, no blocking): the last token's logits.
// RoPE takes only the inverse frequencies and attention factor from the
// table and rotates in float64 with its own pairing.
func refForward(w *Weights, rope *cudakern.RopeTable, tokens []uint32, start int) []float64 {
	c := w.Config
	n, H, hd := len(tokens), c.HiddenSize, c.HeadDim
	nh, nkv := c.NumHeads, c.NumKVHeads
	linear := func(x []float64, wt []float32, bias []float32, in, out int) []float64 {
		y := make([]float64, out)
		for o := 0; o < out; o++ {
			var s float64
			for k := 0; k < in; k++ {
				s += x[k] * float64(wt[o*in+k])
			}
			if bias != nil {
				s += float64(bias[o])
			}
			y[o] = s
		}
		return y
	}
	norm := func(x []float64, wt []float32) []float64 {
		var ss float64
		for _, v := range x {
			ss += v * v
		}
		inv := 1 / math.Sqrt(ss/float64(len(x))+c.RMSNormEps)
		y := make([]float64, len(x))
		for i, v := range x {
			y[i] = v * inv * float64(wt[i])
		}
		return y
	}
	inv := rope.InvFreq()
	af := rope.AttentionFactor()
	rd := c.RotaryDim()
	rotate := func(x []float64, pos int) {
		for i := 0; i < rd/2; i++ {
			ang := float64(float32(pos) * inv[i])
			cs, sn := math.Cos(ang)*af, math.Sin(ang)*af
			a, b := i, i+rd/2
			if c.RopeStyle == 2 { // GPT-J
				a, b = 2*i, 2*i+1
			}
			x0, x1 := x[a], x[b]
			x[a] = x0*cs - x1*sn
			x[b] = x1*cs + x0*sn
		}
	}
	h := make([][]float64, n)
	for i, t := range tokens {
		h[i] = make([]float64, H)
		for j := range h[i] {
			h[i][j] = float64(w.embed[int(t)*H+j])
		}
	}
	for _, lw := range w.layers {
		ks := make([][][]float64, n) // [token][kvhead][dim]
		vs := make([][][]float64, n)
		qs := make([][][]float64, n)
		for i := range h {
			x := norm(h[i], lw.inputNorm)
			q := linear(x, lw.q, lw.qBias, H, nh*hd)
			k := linear(x, lw.k, lw.kBias, H, nkv*hd)
			v := linear(x, lw.v, lw.vBias, H, nkv*hd)
			qs[i], ks[i], vs[i] = make([][]float64, nh), make([][]float64, nkv), make([][]float64, nkv)
			for hh := 0; hh < nh; hh++ {
				qs[i][hh] = q[hh*hd : (hh+1)*hd]
				if lw.qNorm != nil {
					qs[i][hh] = norm(qs[i][hh], lw.qNorm)
				}
				rotate(qs[i][hh], start+i)
			}
			for hh := 0; hh < nkv; hh++ {
				ks[i][hh] = k[hh*hd : (hh+1)*hd]
				if lw.kNorm != nil {
					ks[i][hh] = norm(ks[i][hh], lw.kNorm)
				}
				rotate(ks[i][hh], start+i)
				vs[i][hh] = v[hh*hd : (hh+1)*hd]
			}
		}
		for i := range h {
			att := make([]float64, nh*hd)
			for hh := 0; hh < nh; hh++ {
				g := hh / (nh / nkv)
				sc := make([]float64, i+1)
				mx := math.Inf(-1)
				for j := 0; j <= i; j++ {
					var s float64
					for d := 0; d < hd; d++ {
						s += qs[i][hh][d] * ks[j][g][d]
					}
					sc[j] = s / math.Sqrt(float64(hd))
					mx = math.Max(mx, sc[j])
				}
				var sum float64
				for j := range sc {
					sc[j] = math.Exp(sc[j] - mx)
					sum += sc[j]
				}
				for j := range sc {
					for d := 0; d < hd; d++ {
						att[hh*hd+d] += sc[j] / sum * vs[j][g][d]
					}
				}
			}
			o := linear(att, lw.o, lw.oBias, nh*hd, H)
			for j := range o {
				h[i][j] += o[j]
			}
		}
		for i := range h {
			x := norm(h[i], lw.postNorm)
			g := linear(x, lw.gate, nil, H, c.IntermediateSize)
			u := linear(x, lw.up, nil, H, c.IntermediateSize)
			for j := range g {
				g[j] = g[j] / (1 + math.Exp(-g[j])) * u[j]
			}
			d := linear(g, lw.down, nil, c.IntermediateSize, H)
			for j := range d {
				h[i][j] += d[j]
			}
		}
	}
	x := norm(h[n-1], w.norm)
	return linear(x, w.lmHead, nil, H, c.VocabSize)
}

func sortedNames[T any](m map[string]T) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func TestForwardMatchesReference(t *testing.T) {
	vs := variants()
	for _, name := range sortedNames(vs) {
		t.Run(name, func(t *testing.T) {
			e := newTestEngine(t, vs[name], 11)
			r := rand.New(rand.NewPCG(3, 4))
			for _, start := range []int{0, 37} {
				toks := randTokens(r, 21, e.cfg.VocabSize)
				s, err := e.NewSequence(start)
				if err != nil {
					t.Fatal(err)
				}
				got, err := s.Append(t.Context(), toks)
				s.Release()
				if err != nil {
					t.Fatal(err)
				}
				want := refForward(e.w, e.rope, toks, start)
				var md, mag float64
				for i := range want {
					md = math.Max(md, math.Abs(float64(got[i])-want[i]))
					mag = math.Max(mag, math.Abs(want[i]))
				}
				if md > 1e-4*math.Max(1, mag) {
					t.Errorf("start %d: max |logit - float64 reference| = %.3g (logits up to %.3g)", start, md, mag)
				}
			}
		})
	}
}

func TestDecodeMatchesPrefill(t *testing.T) {
	e := newTestEngine(t, variants()["qwen3-qknorm"], 5)
	ctx := t.Context()
	r := rand.New(rand.NewPCG(5, 6))
	toks := randTokens(r, 40, e.cfg.VocabSize)
	full, _ := e.NewSequence(3)
	defer full.Release()
	want, err := full.Append(ctx, toks)
	if err != nil {
		t.Fatal(err)
	}
	// Prefill in uneven pieces, the last ones one token at a time (decode).
	s, _ := e.NewSequence(3)
	defer s.Release()
	var got []float32
	for i := 0; i < len(toks); {
		n := max(1, min(len(toks)-i, (len(toks)-i)/2))
		if got, err = s.Append(ctx, toks[i:i+n]); err != nil {
			t.Fatal(err)
		}
		i += n
	}
	if d := maxAbsDiff(got, want); d > 1e-5 {
		t.Fatalf("piecewise prefill differs from one prefill by %g", d)
	}
	// Greedy generation from both sequences agrees token for token.
	g1, err := full.Generate(ctx, nil, 8)
	if err != nil {
		t.Fatal(err)
	}
	g2, err := s.Generate(ctx, nil, 8)
	if err != nil {
		t.Fatal(err)
	}
	if len(g1) != 8 {
		t.Fatalf("generated %d tokens, want 8", len(g1))
	}
	for i := range g1 {
		if g1[i] != g2[i] {
			t.Fatalf("generation diverges at %d: %v vs %v", i, g1, g2)
		}
	}
	if full.Len() != len(toks)+7 {
		t.Fatalf("sequence holds %d tokens, want %d", full.Len(), len(toks)+7)
	}
}

func TestCacheAccounting(t *testing.T) {
	c := tinyConfig()
	dir := t.TempDir()
	if _, err := WriteRandomModel(dir, c, 1, 1); err != nil {
		t.Fatal(err)
	}
	w, err := LoadWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(w, Config{Workers: 1, CacheTokens: 64, BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := t.Context()
	s, _ := e.NewSequence(0)
	if _, err := s.Append(ctx, make([]uint32, 40)); err != nil {
		t.Fatal(err)
	}
	if got := e.FreeTokens(); got != 16 {
		t.Fatalf("free tokens %d after 40 of 64, want 16", got)
	}
	s2, _ := e.NewSequence(0)
	if _, err := s2.Append(ctx, make([]uint32, 17)); err == nil {
		t.Fatal("append beyond capacity succeeded")
	}
	s.Release()
	s.Release()
	if got := e.FreeTokens(); got != 64 {
		t.Fatalf("free tokens %d after release, want 64", got)
	}
	if _, err := s2.Append(ctx, []uint32{uint32(c.VocabSize)}); err == nil {
		t.Fatal("token outside the vocabulary accepted")
	}
	e.Close()
	if _, err := s2.Append(ctx, []uint32{1}); err == nil {
		t.Fatal("append after close succeeded")
	}
}

func TestPureGoPath(t *testing.T) {
	ctx := t.Context()
	c := variants()["qwen3-qknorm"]
	dir := t.TempDir()
	if _, err := WriteRandomModel(dir, c, 13, 1); err != nil {
		t.Fatal(err)
	}
	w, err := LoadWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(13, 14))
	toks := randTokens(r, 30, c.VocabSize)
	var out [][]float32
	for _, pure := range []bool{true, false} {
		e, err := New(w, Config{Workers: 2, CacheTokens: 256, PureGo: pure})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if pure && (e.pool.avx || e.attnAVX) {
			t.Fatal("PureGo engine uses the assembly kernels")
		}
		s, _ := e.NewSequence(5)
		got, err := s.Append(ctx, toks)
		s.Release()
		if err != nil {
			t.Fatal(err)
		}
		want := refForward(e.w, e.rope, toks, 5)
		for i := range want {
			if d := math.Abs(float64(got[i]) - want[i]); d > 1e-4 {
				t.Fatalf("pure=%v: logit %d off the float64 reference by %g", pure, i, d)
			}
		}
		// Exact injection holds on this path too.
		segs := []Segment{{Tokens: toks[:20], Chunk: true}, {Tokens: toks[20:]}}
		ents, err := e.EncodePrompt(ctx, segs)
		if err != nil {
			t.Fatal(err)
		}
		store := NewMemStore(0)
		store.Put(ctx, ents[0])
		inj, err := e.Run(ctx, store, Request{StartPos: 5, Segments: segs})
		if err != nil {
			t.Fatal(err)
		}
		if d := maxAbsDiff(inj.Logits, got); d > 1e-4 || inj.Injected != 20 {
			t.Fatalf("pure=%v: injection differs from prefill by %g (injected %d)", pure, d, inj.Injected)
		}
		out = append(out, got)
	}
	if d := maxAbsDiff(out[0], out[1]); d > 1e-4 {
		t.Fatalf("pure Go and assembly kernels differ by %g", d)
	}
}
