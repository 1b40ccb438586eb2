package engine

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// layeredInjector plays a node that plans: it computes the whole
// injection into a scratch copy of the cache (through storeInjector), then
// announces the plan and copies the injected slots into the engine's cache
// one layer at a time, announcing each, while RunInjected computes.
type layeredInjector struct {
	base *storeInjector
	// noPlan: behave like a node that predates plans (no events).
	noPlan bool
	// lose: answer chunk lose MISS at the end after planning it as a hit
	// (its first layers written), like an entry whose payload fails to
	// decode at a later layer; -1: none.
	lose int
	// failAt: fail the call after writing this many layers; -1: never.
	failAt int
	// order records the layers announced, then -1 when the call returns.
	order []int
}

func (li *layeredInjector) InjectChunks(ctx context.Context, chunks []pagedkv.InjectChunk) ([]pagedkv.InjectResult, error) {
	return li.InjectPlanned(ctx, chunks, nil, nil)
}

func (li *layeredInjector) InjectPlanned(ctx context.Context, chunks []pagedkv.InjectChunk, plan func([]pagedkv.InjectResult), layer func(int)) ([]pagedkv.InjectResult, error) {
	b := li.base
	scratch := make([][]byte, len(b.layers))
	for l := range scratch {
		scratch[l] = make([]byte, len(b.layers[l]))
	}
	sb := *b
	sb.layers = scratch
	res, err := sb.InjectChunks(ctx, chunks)
	if err != nil {
		return nil, err
	}
	if li.noPlan {
		plan, layer = nil, nil
	}
	if plan != nil {
		plan(res)
	}
	lay := b.layout
	hb := lay.HeadDim * lay.DType.Size()
	for l := range b.layers {
		if l == li.failAt {
			return nil, errors.New("node went away")
		}
		for i, c := range chunks {
			if res[i].Match == chunk.MatchMiss || (i == li.lose && l >= 2) {
				continue
			}
			for _, sl := range c.Slots {
				for kv := 0; kv < 2; kv++ {
					for h := 0; h < lay.KVHeads; h++ {
						off := lay.Offset(kv, sl, h)
						copy(b.layers[l][off:off+hb], scratch[l][off:off+hb])
					}
				}
			}
		}
		li.order = append(li.order, l)
		if layer != nil {
			layer(l)
		}
		runtime.Gosched() // let the forward pass run ahead of later layers
	}
	li.order = append(li.order, -1)
	if li.lose >= 0 {
		res = slices.Clone(res)
		res[li.lose] = pagedkv.InjectResult{}
	}
	return res, nil
}

// TestRunInjectedLayered: with an injector that plans and announces
// layers, RunInjected gives, bit for bit, the logits, work and answers of
// the sequential path (waiting for the whole injection), at every
// recompute ratio; a planned hit lost at a later layer, a call that fails
// after its plan and a node without plans all end as the sequential path
// over the same final answers would.
func TestRunInjectedLayered(t *testing.T) {
	ctx := t.Context()
	e := newTestEngine(t, variants()["qwen3-qknorm"], 81)
	r := rand.New(rand.NewPCG(81, 82))
	var chunks [][]uint32
	store := NewMemStore(0)
	// lostStore lacks chunk 1: the sequential reference for a lost chunk 1.
	lostStore := NewMemStore(0)
	for i := 0; i < 4; i++ {
		ch := randTokens(r, 9+i, e.cfg.VocabSize)
		en, err := e.EncodeAfterPrefix(ctx, chunks, ch)
		if i == 2 { // standalone only: approximate
			en, err = e.EncodeStandalone(ctx, ch)
		}
		if err != nil {
			t.Fatal(err)
		}
		store.Put(ctx, en)
		if i != 1 {
			lostStore.Put(ctx, en)
		}
		chunks = append(chunks, ch)
	}
	var segs []Segment
	for _, ch := range chunks {
		segs = append(segs, Segment{Tokens: ch, Chunk: true})
	}
	segs = append(segs, Segment{Tokens: randTokens(r, 6, e.cfg.VocabSize)}, Segment{Tokens: randTokens(r, 7, e.cfg.VocabSize), Chunk: true})
	layout, layers := e.CacheMemory()
	base := &storeInjector{t: t, store: store, rope: e.rope, layout: layout, layers: layers}
	lostBase := &storeInjector{t: t, store: lostStore, rope: e.rope, layout: layout, layers: layers}
	cases := []struct {
		name string
		inj  *layeredInjector
		rec  float64
		want func() *Response
	}{
		{name: "planned", inj: &layeredInjector{lose: -1, failAt: -1}},
		{name: "planned-recompute", inj: &layeredInjector{lose: -1, failAt: -1}, rec: 0.5},
		{name: "planned-recompute-all", inj: &layeredInjector{lose: -1, failAt: -1}, rec: 1},
		{name: "no-plan", inj: &layeredInjector{noPlan: true, lose: -1, failAt: -1}},
		{name: "lost-hit", inj: &layeredInjector{lose: 1, failAt: -1}, want: func() *Response {
			resp, err := e.RunInjected(ctx, lostBase, Request{StartPos: 30, Segments: segs})
			if err != nil {
				t.Fatal(err)
			}
			return resp
		}},
		{name: "lost-hit-recompute", inj: &layeredInjector{lose: 1, failAt: -1}, rec: 0.5, want: func() *Response { return prefill(t, e, 30, segs) }},
		{name: "fails-after-plan", inj: &layeredInjector{lose: -1, failAt: 2}, want: func() *Response { return prefill(t, e, 30, segs) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clear(layers[0])
			var want *Response
			if tc.want != nil {
				want = tc.want()
			} else {
				var err error
				if want, err = e.RunInjected(ctx, base, Request{StartPos: 30, Segments: segs, Recompute: tc.rec}); err != nil {
					t.Fatal(err)
				}
			}
			tc.inj.base = base
			got, err := e.RunInjected(ctx, tc.inj, Request{StartPos: 30, Segments: segs, Recompute: tc.rec})
			if err != nil {
				t.Fatal(err)
			}
			if d := maxAbsDiff(got.Logits, want.Logits); d != 0 {
				t.Fatalf("logits differ from the sequential path by %g", d)
			}
			if got.TokenLayers != want.TokenLayers || got.Injected != want.Injected || got.Recomputed != want.Recomputed {
				t.Fatalf("work: %d token-layers, %d injected, %d recomputed; want %d, %d, %d",
					got.TokenLayers, got.Injected, got.Recomputed, want.TokenLayers, want.Injected, want.Recomputed)
			}
			if want.Chunks == nil { // a prefill: every chunk answered MISS
				for _, cr := range got.Chunks {
					want.Chunks = append(want.Chunks, ChunkResult{Segment: cr.Segment})
				}
			}
			if !slices.Equal(got.Chunks, want.Chunks) {
				t.Fatalf("chunks %+v, want %+v", got.Chunks, want.Chunks)
			}
			if n := len(tc.inj.order); n == 0 || tc.inj.order[n-1] != -1 && tc.inj.failAt < 0 {
				t.Fatalf("injector events %v", tc.inj.order)
			}
		})
	}
	if !slices.ContainsFunc(cases[0].inj.order, func(l int) bool { return l == e.cfg.NumLayers-1 }) {
		t.Fatalf("planned injector wrote layers %v", cases[0].inj.order)
	}
}
