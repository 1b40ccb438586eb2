//go:build linux

package inject

import (
	"log/slog"
	"math/rand/v2"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/cudakern"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// benchSetup is a RAG prompt's worth of chunks for a Llama-3.1-8B-shaped
// model (32 layers, 8 KV heads, head dim 128, bf16): 50 chunks of 24
// tokens, 150 MiB of KV, into a bf16 NHD cache whose blocks of 16 come in
// random order.
type benchSetup struct {
	spec    chunk.ModelSpec
	lay     pagedkv.CacheLayout
	entries []*chunk.Entry
	chunks  []pagedkv.InjectChunk
	mem     [][]byte
	written int64
}

func newBenchSetup(b *testing.B) *benchSetup {
	return newShapeSetup(b, 32, 8, 128, 50, 24, chunk.BF16)
}

// newShapeSetup is n chunks of tokens tokens of a model of layers layers,
// heads KV heads of hd dims, KV of dtype dt (entries and cache).
func newShapeSetup(b *testing.B, layers, heads, hd, n, tokens int, dt chunk.DType) *benchSetup {
	spec := chunk.ModelSpec{Family: "llama", Layers: layers, KVHeads: heads, HeadDim: hd, DType: dt,
		RopeStyle: chunk.RopeNeoX, RopeTheta: 500000, Scaling: chunk.RopeScaling{
			Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192}}
	blocks := (n*tokens+15)/16 + 4
	st := &benchSetup{spec: spec, lay: pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: blocks, BlockSize: 16,
		KVHeads: heads, HeadDim: hd, DType: dt}}
	rng := rand.New(rand.NewPCG(5, 6))
	table := rng.Perm(blocks)
	for i := 0; i < n; i++ {
		toks := randTokens(rng, tokens)
		e := synthEntry(rng, spec, toks, chunk.StandaloneContext())
		slots := make([]int, tokens)
		for t := range slots {
			p := i*tokens + t
			slots[t] = table[p/16]*16 + p%16
		}
		st.entries = append(st.entries, e)
		st.chunks = append(st.chunks, pagedkv.InjectChunk{Key: chunk.Key{Context: chunk.StandaloneContext()}, Tokens: toks, Pos: 100 + i*tokens, Slots: slots})
		st.written += int64(layers * 2 * tokens * heads * hd * dt.Size())
	}
	st.mem = layersOf(layers, st.lay)
	for _, l := range st.mem { // fault the pages in before any timing
		for i := range l {
			l[i] = 1
		}
	}
	return st
}

// cpuTime is the CPU time the process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// measure runs op in b.Loop and reports, besides wall-clock throughput,
// the throughput per CPU-second, which stays meaningful on a machine
// shared with other work.
func measure(b *testing.B, bytes int64, op func()) {
	b.SetBytes(bytes)
	c0 := cpuTime()
	n := 0
	for b.Loop() {
		op()
		n++
	}
	cpu := cpuTime() - c0
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(n), "cpu-ns/op")
	b.ReportMetric(float64(bytes)*float64(n)/cpu.Seconds()/1e6, "MB/cpu-s")
}

// BenchmarkInject50x24 compares, for the same 50 chunks: cudakern direct
// (entries already decoded, one injector over all cores), a serial
// decode-then-inject of each chunk, and the Service's pipeline from
// encoded blobs (raw and lossless), fetch from memory included.
// Throughput is KV bytes written into the cache.
func BenchmarkInject50x24(b *testing.B) { runInjectBench(b, newBenchSetup(b)) }

// BenchmarkInjectDemoShape is BenchmarkInject50x24 at the shape of the
// demo's trained model (4 layers, 2 KV heads of 64, f32 KV) with the
// chunks of a facts prompt at k=50 (50 facts of 5 tokens), plus a memcpy
// of the same bytes: the injection path's cost per MiB against a copy.
func BenchmarkInjectDemoShape(b *testing.B) {
	st := newShapeSetup(b, 4, 2, 64, 50, 5, chunk.F32)
	b.Run("memcpy", func(b *testing.B) {
		src, dst := make([]byte, st.written), make([]byte, st.written)
		measure(b, st.written, func() { copy(dst, src) })
	})
	runInjectBench(b, st)
}

func runInjectBench(b *testing.B, st *benchSetup) {
	ctx := b.Context()
	rope, err := cudakern.NewRopeTable(st.spec, 8192)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("cudakern-direct", func(b *testing.B) {
		inj := cudakern.NewInjector(cudakern.Config{})
		defer inj.Close()
		measure(b, st.written, func() {
			for i, e := range st.entries {
				ch := &st.chunks[i]
				j := cudakern.Job{Rope: rope, Src: e.KV, SrcDType: e.DType, Tokens: len(e.Tokens), SrcHeads: e.KVHeads,
					Pos: ch.Pos, Slots: ch.Slots, Layout: st.lay, Dst: st.mem}
				if err := inj.Inject(ctx, &j); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	for _, codec := range []chunk.Codec{chunk.CodecRaw, chunk.CodecLossless} {
		f := newMemFetcher()
		for _, e := range st.entries {
			f.put(b, e, codec)
		}
		b.Run("serial-decode-inject/"+codec.String(), func(b *testing.B) {
			inj := cudakern.NewInjector(cudakern.Config{})
			defer inj.Close()
			raw := make([]byte, st.entries[0].Shape().RawBytes())
			measure(b, st.written, func() {
				for i, e := range st.entries {
					got, _ := f.Fetch(ctx, e.Key)
					hd, err := chunk.Verify(got.Blob.Bytes(), chunk.Limits{})
					if err != nil {
						b.Fatal(err)
					}
					if err := chunk.DecodeRange(raw, got.Blob.Bytes(), &hd, chunk.Range{}, nil); err != nil {
						b.Fatal(err)
					}
					got.Blob.Release()
					ch := &st.chunks[i]
					j := cudakern.Job{Rope: rope, Src: raw, SrcDType: e.DType, Tokens: len(e.Tokens), SrcHeads: e.KVHeads,
						Pos: ch.Pos, Slots: ch.Slots, Layout: st.lay, Dst: st.mem}
					if err := inj.Inject(ctx, &j); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
		b.Run("pipeline/"+codec.String(), func(b *testing.B) {
			s, err := New(Config{Fetcher: f, Models: fixedModels{st.spec}, Workers: runtime.GOMAXPROCS(0),
				Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			id, err := s.RegisterInProcess(ctx, Descriptor{Fingerprint: st.spec.Fingerprint(), Layers: st.spec.Layers,
				Layouts: []pagedkv.CacheLayout{st.lay}, MaxPositions: 8192}, st.mem)
			if err != nil {
				b.Fatal(err)
			}
			var t0 time.Time
			var first time.Duration
			req := &Request{Cache: id, Chunks: st.chunks, OnLayer: func(l int) {
				if l == 0 {
					first += time.Since(t0)
				}
			}}
			defer func() { b.ReportMetric(float64(first.Nanoseconds())/float64(b.N), "first-layer-ns/op") }()
			measure(b, st.written, func() {
				t0 = time.Now()
				resp, err := s.Inject(ctx, req)
				if err != nil {
					b.Fatal(err)
				}
				if resp.WrittenBytes != st.written {
					b.Fatalf("wrote %d bytes, want %d", resp.WrittenBytes, st.written)
				}
			})
		})
	}
}
