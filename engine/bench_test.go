package engine

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestRunBenchSmall(t *testing.T) {
	e := newTestEngine(t, tinyConfig(), 61)
	res, err := RunBench(context.Background(), e, NewMemStore(0), BenchConfig{
		Ks: []int{2, 6}, FactTokens: 8, QueryTokens: 4, Trials: 1, Window: 6, FidelityPrompts: 3, FidelityK: 3, Seed: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.TTFT) != 2 || len(res.Fidelity) != 4 {
		t.Fatalf("%d TTFT rows, %d fidelity rows", len(res.TTFT), len(res.Fidelity))
	}
	L := e.cfg.NumLayers
	for _, row := range res.TTFT {
		if row.PrefillTL != row.PromptTokens*L || row.InjectTL != 4*L {
			t.Fatalf("k=%d: token-layers prefill %d, inject %d", row.K, row.PrefillTL, row.InjectTL)
		}
		if row.RepairTL <= row.InjectTL || row.RepairTL >= row.PrefillTL {
			t.Fatalf("k=%d: repair computed %d token-layers, outside (%d, %d)", row.K, row.RepairTL, row.InjectTL, row.PrefillTL)
		}
	}
	for _, f := range res.Fidelity {
		if f.N != 3 || f.WorkFraction <= 0 || f.WorkFraction >= 1 {
			t.Fatalf("fidelity row %+v", f)
		}
	}
	md := res.Markdown()
	if len(res.Codecs) != 5 {
		t.Fatalf("%d codec rows", len(res.Codecs))
	}
	for _, c := range res.Codecs {
		lossy := c.Codec.Lossy()
		if c.N == 0 || (!lossy && c.MaxLogit > 1e-4) || (lossy && c.MaxLogit == 0) || c.Ratio <= 0 {
			t.Fatalf("codec row %v: %+v", c.Codec, c)
		}
	}
	for _, want := range []string{"| k |", "| 6 | 52 |", "standalone", "window w=6", "| int4 |"} {
		if !strings.Contains(md, want) {
			t.Fatalf("markdown lacks %q:\n%s", want, md)
		}
	}
}

// BenchmarkPrefill is a 256-token prefill of the benchmark model shape.
func BenchmarkPrefill(b *testing.B) {
	e := newTestEngine(b, BenchModel(), 1)
	toks := randTokens(rand.New(rand.NewPCG(1, 1)), 256, e.cfg.VocabSize)
	ctx := context.Background()
	b.ResetTimer()
	cpu0 := processCPU()
	for b.Loop() {
		s, _ := e.NewSequence(0)
		if _, err := s.Append(ctx, toks); err != nil {
			b.Fatal(err)
		}
		s.Release()
	}
	cpu := processCPU() - cpu0
	b.ReportMetric(float64(len(toks)*b.N)/b.Elapsed().Seconds(), "tokens/s")
	b.ReportMetric(float64(len(toks)*b.N)/cpu.Seconds(), "tokens/CPU-s")
}

// BenchmarkDecode is one decode step after 256 tokens on the benchmark
// model shape; it must not allocate beyond the logits it returns.
func BenchmarkDecode(b *testing.B) {
	e := newTestEngine(b, BenchModel(), 1)
	toks := randTokens(rand.New(rand.NewPCG(1, 1)), 256, e.cfg.VocabSize)
	ctx := context.Background()
	s, _ := e.NewSequence(0)
	defer s.Release()
	if _, err := s.Append(ctx, toks); err != nil {
		b.Fatal(err)
	}
	tok := []uint32{7}
	logits := make([]float32, e.cfg.VocabSize)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if s.Len() >= 1024 {
			s.truncate(256)
		}
		if _, err := s.AppendTo(ctx, logits, tok); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}
