package workload

import (
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/engine"
)

// The three ways on one RAG request, on a tiny model and an in-memory
// store.
func TestWaysOnTinyModel(t *testing.T) {
	ctx := t.Context()
	e := tinyEngine(t)
	store := engine.NewMemStore(chunk.CodecRaw)
	cc := smallCorpus()
	cc.Vocab = e.Config().VocabSize
	c := NewCorpus(cc)
	if _, err := IngestCorpus(ctx, e, store, c); err != nil {
		t.Fatal(err)
	}
	reqs := c.RAGRequests(1, 2, 6, 1.5, 5)
	segs := c.Segments(reqs[0])

	t.Run("full prefill is its own reference", func(t *testing.T) {
		var st Stats
		a, err := serve(ctx, e, nil, engine.Request{Segments: segs}, &st, nil)
		if err != nil {
			t.Fatal(err)
		}
		// A second prefill must give the same bits, or full prefill could
		// not be the reference the other ways are measured against.
		b, err := e.Run(ctx, nil, engine.Request{Segments: segs})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(a.Logits, b.Logits) {
			t.Fatal("two full prefills of one prompt differ")
		}
		st.Fid.Add(b.Logits, a.Logits)
		if st.Fid.Top1Rate() != 1 || st.Fid.MaxKL != 0 || st.Fid.MaxLogit != 0 {
			t.Fatalf("full prefill against itself: %+v", st.Fid)
		}
		if st.Injected != 0 || st.Prefilled != a.Tokens || st.Miss != 7 || st.TokenLayers != a.Tokens*e.Config().NumLayers {
			t.Fatalf("full prefill stats %+v", st)
		}
	})

	t.Run("prefix caching of a repeated prompt is exact", func(t *testing.T) {
		ref, err := e.Run(ctx, nil, engine.Request{Segments: segs})
		if err != nil {
			t.Fatal(err)
		}
		// Before the prompt was served only the system prompt (at the
		// root) is a prefix hit; the passages stop the chain.
		var before Stats
		if _, err := serve(ctx, e, PrefixOnly(store), engine.Request{Segments: segs}, &before, ref.Logits); err != nil {
			t.Fatal(err)
		}
		if before.Exact != 1 || before.Approx != 0 || before.Miss != 6 {
			t.Fatalf("before write-back: %d exact, %d approximate, %d miss", before.Exact, before.Approx, before.Miss)
		}
		if err := writeBack(ctx, e, store, segs); err != nil {
			t.Fatal(err)
		}
		var st Stats
		got, err := serve(ctx, e, PrefixOnly(store), engine.Request{Segments: segs}, &st, ref.Logits)
		if err != nil {
			t.Fatal(err)
		}
		if st.Exact != 7 || st.Approx+st.Miss != 0 {
			t.Fatalf("repeated prompt: %d exact, %d approximate, %d miss", st.Exact, st.Approx, st.Miss)
		}
		// The write-back is bit-equal to what prefill computes for that
		// prompt, and injecting it reproduces prefill's logits.
		ents, err := e.EncodePrompt(ctx, segs)
		if err != nil {
			t.Fatal(err)
		}
		reqsL := make([]engine.LookupRequest, 0, len(ents))
		for _, ent := range ents {
			if ent != nil {
				reqsL = append(reqsL, engine.LookupRequest{Key: ent.Key, Tokens: ent.Tokens})
			}
		}
		found, err := store.Lookup(ctx, reqsL)
		if err != nil {
			t.Fatal(err)
		}
		j := 0
		for _, ent := range ents {
			if ent == nil {
				continue
			}
			if found[j] == nil || found[j].Key != ent.Key || !slices.Equal(found[j].KV, ent.KV) {
				t.Fatalf("chunk %d: stored entry is not the prefill's bits", j)
			}
			j++
		}
		// Same positions, f32 KV, the same rotation: bit-equal logits.
		if !slices.Equal(got.Logits, ref.Logits) {
			t.Fatalf("prefix hit: logits differ from prefill (max |dlogit| %.3g)", st.Fid.MaxLogit)
		}
		// The same prompt through kvmesh's rule is exact too.
		var ck Stats
		if _, err := serve(ctx, e, store, engine.Request{Segments: segs, Recompute: 0.15}, &ck, ref.Logits); err != nil {
			t.Fatal(err)
		}
		if ck.Exact != 7 || ck.Fid.MaxLogit != 0 {
			t.Fatalf("kvmesh on the repeated prompt: %d exact, max |dlogit| %.3g", ck.Exact, ck.Fid.MaxLogit)
		}
	})

	t.Run("reordered chunks are approximate and improve with r", func(t *testing.T) {
		// The same passages in another order: no prefix chain matches past
		// the system prompt.
		r := reqs[0]
		r.Passages = slices.Clone(r.Passages)
		slices.Reverse(r.Passages)
		rsegs := c.Segments(r)
		ref, err := e.Run(ctx, nil, engine.Request{Segments: rsegs})
		if err != nil {
			t.Fatal(err)
		}
		var pre Stats
		if _, err := serve(ctx, e, PrefixOnly(store), engine.Request{Segments: rsegs}, &pre, ref.Logits); err != nil {
			t.Fatal(err)
		}
		if pre.Exact != 1 || pre.Miss != 6 {
			t.Fatalf("prefix caching on reordered chunks: %d exact, %d miss", pre.Exact, pre.Miss)
		}
		ratios := []float64{0, 0.15, 0.5, 1}
		kl := make([]float64, len(ratios))
		work := make([]int, len(ratios))
		for i, rr := range ratios {
			var st Stats
			if _, err := serve(ctx, e, store, engine.Request{Segments: rsegs, Recompute: rr}, &st, ref.Logits); err != nil {
				t.Fatal(err)
			}
			if st.Exact != 1 || st.Approx != 6 || st.Miss != 0 {
				t.Fatalf("r=%v: %d exact, %d approximate, %d miss", rr, st.Exact, st.Approx, st.Miss)
			}
			kl[i], work[i] = st.Fid.MeanKL(), st.TokenLayers
		}
		t.Logf("KL by r %v: %v; token-layers %v", ratios, kl, work)
		if kl[0] <= 1e-6 {
			t.Fatalf("approximate injection without repair matches prefill (KL %.3g): the test prompt is too easy", kl[0])
		}
		for i := 1; i < len(kl); i++ {
			if kl[i] > kl[i-1]*1.05+1e-9 || work[i] <= work[i-1] {
				t.Fatalf("r=%v: KL %.3g after %.3g, work %d after %d", ratios[i], kl[i], kl[i-1], work[i], work[i-1])
			}
		}
		if kl[len(kl)-1] > 1e-8 || kl[len(kl)-1] >= kl[0]/100 {
			t.Fatalf("r=1 KL %.3g, want ~0", kl[len(kl)-1])
		}
	})
}

func TestPrefixOnlyStopsAtFirstMiss(t *testing.T) {
	ctx := t.Context()
	fp := chunk.Fingerprint{Lo: 1, Hi: 2}
	store := engine.NewMemStore(chunk.CodecRaw)
	toks := [][]uint32{{1, 2}, {3, 4}, {5, 6}, {7, 8}, {9, 10}}
	contexts, _ := chunk.PrefixChain(fp, toks)
	reqs := make([]engine.LookupRequest, len(toks))
	for i, tk := range toks {
		reqs[i] = engine.LookupRequest{Key: chunk.Key{Fingerprint: fp, Content: chunk.ContentID(fp, tk), Context: contexts[i]}, Tokens: tk}
	}
	put := func(i int, cx chunk.Context) {
		e := &chunk.Entry{Key: chunk.Key{Fingerprint: fp, Content: reqs[i].Key.Content, Context: cx}, DType: chunk.F32,
			Layers: 1, KVHeads: 1, HeadDim: 2, Tokens: toks[i], KV: make([]byte, 2*2*2*4)}
		if err := store.Put(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	// 0, 1: exact; 2: standalone only; 3: exact; 4: nothing.
	put(0, contexts[0])
	put(1, contexts[1])
	put(2, chunk.StandaloneContext())
	put(3, contexts[3])
	tests := []struct {
		name string
		src  engine.ChunkSource
		want []string
	}{
		{"kvmesh", store, []string{"exact", "exact", "approx", "exact", "miss"}},
		{"prefix", PrefixOnly(store), []string{"exact", "exact", "miss", "miss", "miss"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.src.Lookup(ctx, reqs)
			if err != nil {
				t.Fatal(err)
			}
			for i, ent := range got {
				kind := "miss"
				if ent != nil {
					kind = "approx"
					if ent.Key.Context == reqs[i].Key.Context {
						kind = "exact"
					}
				}
				if kind != tc.want[i] {
					t.Fatalf("chunk %d: %s, want %s", i, kind, tc.want[i])
				}
			}
		})
	}
}

func TestQuantile(t *testing.T) {
	d := []int64{5, 1, 4, 2, 3, 10, 9, 8, 7, 6}
	var st Stats
	for _, x := range d {
		st.TTFT = append(st.TTFT, timeMS(x))
	}
	tests := []struct {
		q    float64
		want int64
	}{{0.5, 5}, {0.99, 10}, {0.1, 1}, {1, 10}, {0, 1}}
	for _, tc := range tests {
		if got := st.P(tc.q); got != timeMS(tc.want) {
			t.Fatalf("q=%v: %v, want %v", tc.q, got, timeMS(tc.want))
		}
	}
	if (&Stats{}).P(0.5) != 0 {
		t.Fatal("empty quantile")
	}
}
