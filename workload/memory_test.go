package workload

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/engine"
)

// EncodeFact keys each encoding by exactly what it was computed after, and
// the encoding after the system prompt alone is the one a prefill of the
// system prompt and the fact writes back (EXACT for a fact right after it).
func TestEncodeFact(t *testing.T) {
	ctx := t.Context()
	e := tinyEngine(t)
	fp := e.Fingerprint()
	system := []uint32{1, 2, 3, 4}
	conv := [][]uint32{{10, 11}, {12, 13, 14}, {15, 16}}
	fact := []uint32{20, 21, 22}
	_, end := chunk.PrefixChain(fp, [][]uint32{system})
	afterSystem := chunk.PrefixContext(end)
	_, end = chunk.PrefixChain(fp, [][]uint32{system, conv[0]})
	afterSystemAndConv := chunk.PrefixContext(end)
	_, end = chunk.PrefixChain(fp, conv)
	afterConv := chunk.PrefixContext(end)
	tests := []struct {
		name   string
		system []uint32
		conv   [][]uint32
		w      int
		want   chunk.Context
	}{
		{"standalone", nil, conv, 0, chunk.StandaloneContext()},
		{"no conversation yet", nil, nil, 5, chunk.StandaloneContext()},
		{"window", nil, conv, 3, chunk.WindowContext(fp, 3, []uint32{14, 15, 16})},
		{"window wider than conversation, no system", nil, conv, 9, afterConv},
		{"system alone", system, conv, 0, afterSystem},
		{"system, first fact", system, nil, 5, afterSystem},
		{"system and window", system, conv, 3, chunk.WindowContext(fp, 7, []uint32{1, 2, 3, 4, 14, 15, 16})},
		{"window wider than conversation", system, conv[:1], 5, afterSystemAndConv},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ent, err := EncodeFact(ctx, e, tc.system, tc.conv, tc.w, fact)
			if err != nil {
				t.Fatal(err)
			}
			if ent.Key.Context != tc.want || ent.Key.Content != chunk.ContentID(fp, fact) {
				t.Fatalf("key %v, want context %v", ent.Key, tc.want)
			}
		})
	}
	ent, err := EncodeFact(ctx, e, system, conv, 0, fact)
	if err != nil {
		t.Fatal(err)
	}
	ents, err := e.EncodePrompt(ctx, []engine.Segment{{Tokens: system, Chunk: true}, {Tokens: fact, Chunk: true}})
	if err != nil {
		t.Fatal(err)
	}
	if ents[1].Key != ent.Key || !bytes.Equal(ents[1].KV, ent.KV) {
		t.Fatal("encoding after the system prompt differs from the prompt's write-back")
	}
}

// kindSource serves one encoding per content, whatever context is wanted.
type kindSource map[chunk.ID]*chunk.Entry

func (s kindSource) Lookup(_ context.Context, reqs []engine.LookupRequest) ([]*chunk.Entry, error) {
	out := make([]*chunk.Entry, len(reqs))
	for i, r := range reqs {
		out[i] = s[r.Key.Content]
	}
	return out, nil
}

// BenchmarkApproxKinds measures which APPROXIMATE encoding of a fact
// deviates least from prefill, on the workload model: prompts of a
// 32-token system prompt (EXACT), k facts and a query, with every fact
// served as one kind: standalone, after 20 tokens of other text (window),
// after the system prompt and those 20 tokens (sys+window, EncodeFact),
// or as written back from another prompt of the system prompt and 0-8
// other facts (prefix). It reports mean KL against prefill per kind;
// it is what the stores' ranking rests on. Run with -benchtime 1x.
func BenchmarkApproxKinds(b *testing.B) {
	ctx := b.Context()
	e, err := NewRandomEngine(Model(), 1, engine.Config{KVDType: chunk.BF16, CacheTokens: 8192})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	vocab := e.Config().VocabSize
	kinds := []string{"standalone", "window", "sys+window", "prefix"}
	for _, k := range []int{5, 20} {
		b.Run(fmt.Sprintf("k=%d", k), func(b *testing.B) {
			for range b.N {
				r := rand.New(rand.NewPCG(11, uint64(k)))
				system := randTokens(r, 32, vocab)
				facts := Facts(99, 3*k, 24, vocab)
				other := randTokens(r, 400, vocab)
				sys, err := e.EncodeStandalone(ctx, system)
				if err != nil {
					b.Fatal(err)
				}
				srcs := make([]kindSource, len(kinds))
				for i := range srcs {
					srcs[i] = kindSource{sys.Key.Content: sys}
				}
				for fi, f := range facts {
					off := r.IntN(len(other) - 20)
					win := other[off : off+20]
					ents := make([]*chunk.Entry, len(kinds))
					ents[0], err = e.EncodeStandalone(ctx, f)
					if err == nil {
						ents[1], err = e.EncodeWindow(ctx, [][]uint32{win}, 20, f)
					}
					if err == nil {
						ents[2], err = EncodeFact(ctx, e, system, [][]uint32{win}, 20, f)
					}
					segs := []engine.Segment{{Tokens: system, Chunk: true}}
					for _, j := range r.Perm(len(facts))[:r.IntN(9)] {
						if j != fi {
							segs = append(segs, engine.Segment{Tokens: facts[j], Chunk: true})
						}
					}
					segs = append(segs, engine.Segment{Tokens: f, Chunk: true})
					if err == nil {
						var wb []*chunk.Entry
						wb, err = e.EncodePrompt(ctx, segs)
						if err == nil {
							ents[3] = wb[len(wb)-1]
						}
					}
					if err != nil {
						b.Fatal(err)
					}
					for i, ent := range ents {
						srcs[i][ent.Key.Content] = ent
					}
				}
				fids := make([]engine.Fidelity, len(kinds))
				for range 8 {
					segs := []engine.Segment{{Tokens: system, Chunk: true}}
					for _, j := range r.Perm(len(facts))[:k] {
						segs = append(segs, engine.Segment{Tokens: facts[j], Chunk: true})
					}
					segs = append(segs, engine.Segment{Tokens: randTokens(r, 16, vocab)})
					full, err := e.Run(ctx, nil, engine.Request{Segments: segs})
					if err != nil {
						b.Fatal(err)
					}
					for i, src := range srcs {
						got, err := e.Run(ctx, src, engine.Request{Segments: segs})
						if err != nil {
							b.Fatal(err)
						}
						fids[i].Add(full.Logits, got.Logits)
					}
				}
				for i, name := range kinds {
					b.ReportMetric(fids[i].MeanKL(), "KL-"+name)
					b.ReportMetric(fids[i].Top1Rate(), "top1-"+name)
				}
			}
		})
	}
}
