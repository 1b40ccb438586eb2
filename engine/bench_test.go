package engine

import (
	"math/rand/v2"
	"testing"

	"github.com/kvmesh/kvmesh/internal/cputime"
)

// BenchmarkPrefill is a 256-token prefill of the benchmark model shape.
func BenchmarkPrefill(b *testing.B) {
	e := newTestEngine(b, BenchModel(), 1)
	toks := randTokens(rand.New(rand.NewPCG(1, 1)), 256, e.cfg.VocabSize)
	ctx := b.Context()
	b.ResetTimer()
	cpu0 := cputime.Process()
	for b.Loop() {
		s, _ := e.NewSequence(0)
		if _, err := s.Append(ctx, toks); err != nil {
			b.Fatal(err)
		}
		s.Release()
	}
	cpu := cputime.Process() - cpu0
	b.ReportMetric(float64(len(toks)*b.N)/b.Elapsed().Seconds(), "tokens/s")
	b.ReportMetric(float64(len(toks)*b.N)/cpu.Seconds(), "tokens/CPU-s")
}

// BenchmarkDecode is one decode step after 256 tokens on the benchmark
// model shape; it must not allocate beyond the logits it returns.
func BenchmarkDecode(b *testing.B) {
	e := newTestEngine(b, BenchModel(), 1)
	toks := randTokens(rand.New(rand.NewPCG(1, 1)), 256, e.cfg.VocabSize)
	ctx := b.Context()
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
