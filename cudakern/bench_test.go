//go:build unix

package cudakern

import (
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// benchJob is a 512-token chunk of a Llama-3.1-8B-shaped model (32 layers,
// 8 KV heads, head dim 128, llama3 RoPE): 64 MiB of KV in bf16, scattered
// into a cache of 1024 slots per layer in blocks of 16 taken in random order,
// as vLLM's block table hands them out.
func benchJob(b *testing.B, srcDT, dstDT chunk.DType, order pagedkv.Order, style chunk.RopeStyle) *Job {
	b.Helper()
	const layers, heads, hd, tokens, blocks, bs = 32, 8, 128, 512, 64, 16
	spec := chunk.ModelSpec{Family: "llama", Layers: layers, KVHeads: heads, HeadDim: hd, DType: chunk.BF16,
		RopeStyle: style, RopeTheta: 500000, Scaling: chunk.RopeScaling{
			Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192}}
	tab, err := NewRopeTable(spec, 8192)
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	lay := pagedkv.CacheLayout{Order: order, NumBlocks: blocks, BlockSize: bs, KVHeads: heads, HeadDim: hd, DType: dstDT}
	blockTable := rng.Perm(blocks)
	slots := make([]int, tokens)
	for t := range slots {
		slots[t] = blockTable[t/bs]*bs + t%bs
	}
	// Real KV: normal values with log-normal channel scales (never
	// subnormal, which would measure the CPU's slow path, not ours). 1 MiB
	// of them tiles the source.
	src := make([]byte, layers*2*tokens*heads*hd*srcDT.Size())
	copy(src, randKV(rng, srcDT, (1<<20)/srcDT.Size()))
	for o := 1 << 20; o < len(src); o += 1 << 20 {
		copy(src[o:], src[:1<<20])
	}
	dst := make([][]byte, layers)
	for i := range dst {
		dst[i] = make([]byte, lay.LayerBytes())
	}
	return &Job{Rope: tab, Src: src, SrcDType: srcDT, Tokens: tokens, SrcHeads: heads, Pos: 4000,
		Slots: slots, Layout: lay, Dst: dst}
}

// writtenBytes is what a job writes: K and V of every named slot.
func writtenBytes(j *Job) int {
	n := 0
	for _, s := range j.Slots {
		if s >= 0 {
			n++
		}
	}
	return len(j.Dst) * 2 * n * j.Layout.KVHeads * j.Layout.HeadDim * j.Layout.DType.Size()
}

// processCPU is the CPU time of the whole process so far: on a shared
// machine it measures what a pass costs whatever else is running.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchWorkers is -cpu's GOMAXPROCS: all cores by default.
func benchWorkers(*testing.B) int { return runtime.GOMAXPROCS(0) }

// layerCopy is the memcpy baseline: n bytes of j's source copied into the
// same destination buffers, one memmove per layer (n/layers bytes from the
// start of that layer's source, repeated if the source is shorter, to the
// start of that layer's destination), the layers split over w goroutines.
// The runtime's memmove prefetches and stores non-temporally above 1 MiB,
// as a large copy should.
//
// With nt, the copies use this package's copyNT instead (AVX2 non-temporal
// stores, no software prefetch), the fastest copy we have on this machine:
// the strictest baseline.
func layerCopy(j *Job, n, w int, nt bool) {
	layers := len(j.Dst)
	per := n / layers
	srcLayer := len(j.Src) / layers
	var wg sync.WaitGroup
	for i := 0; i < w; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for l := i * layers / w; l < (i+1)*layers/w; l++ {
				src := j.Src[l*srcLayer : (l+1)*srcLayer]
				for o := 0; o < per; o += len(src) {
					if c := min(per-o, len(src)); nt {
						copyNT(&j.Dst[l][o], &src[0], c, 1, 0, 0)
					} else {
						copy(j.Dst[l][o:o+c], src[:c])
					}
				}
				if nt {
					sfence()
				}
			}
		}()
	}
	wg.Wait()
}

var benchCases = []struct {
	name         string
	srcDT, dstDT chunk.DType
	order        pagedkv.Order
	style        chunk.RopeStyle
}{
	{"bf16-bf16-pagedkv.NHD", chunk.BF16, chunk.BF16, pagedkv.NHD, chunk.RopeNeoX},
	{"bf16-bf16-pagedkv.HND", chunk.BF16, chunk.BF16, pagedkv.HND, chunk.RopeNeoX},
	{"bf16-bf16-pagedkv.BlockNHD", chunk.BF16, chunk.BF16, pagedkv.BlockNHD, chunk.RopeNeoX},
	{"bf16-bf16-pagedkv.BlockHND", chunk.BF16, chunk.BF16, pagedkv.BlockHND, chunk.RopeNeoX},
	{"f16-f16-pagedkv.NHD", chunk.F16, chunk.F16, pagedkv.NHD, chunk.RopeNeoX},
	{"f32-f32-pagedkv.NHD", chunk.F32, chunk.F32, pagedkv.NHD, chunk.RopeNeoX},
	{"bf16-fp8-pagedkv.NHD", chunk.BF16, chunk.FP8E4M3, pagedkv.NHD, chunk.RopeNeoX},
	{"fp8-bf16-pagedkv.NHD", chunk.FP8E4M3, chunk.BF16, pagedkv.NHD, chunk.RopeNeoX},
	{"bf16-bf16-pagedkv.NHD-gptj", chunk.BF16, chunk.BF16, pagedkv.NHD, chunk.RopeGPTJ},
}

func BenchmarkInject(b *testing.B) {
	for _, c := range benchCases {
		b.Run(c.name, func(b *testing.B) {
			j := benchJob(b, c.srcDT, c.dstDT, c.order, c.style)
			in := NewInjector(Config{})
			defer in.Close()
			ctx := b.Context()
			// The first call faults the cache pages in; an engine's cache is
			// resident.
			if err := in.Inject(ctx, j); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(writtenBytes(j)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := in.Inject(ctx, j); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// scatterCopy is a plain memcpy of exactly the bytes j writes, from the
// same source into the same destination slots in the same order as the
// Injector: (layer, 16-token tile) items taken by w goroutines, each token's
// K heads then V heads copied with the runtime's memmove (NHD, BlockNHD:
// one 2 KiB run per token and K or V; HND, BlockHND: one run per head). It is the kernel
// without rotation or conversion, so it only makes sense for same-dtype
// jobs.
func scatterCopy(j *Job, w int) {
	l := j.Layout
	row := l.HeadDim * l.DType.Size()
	srcTok := j.SrcHeads * row
	srcLayer := 2 * j.Tokens * srcTok
	tiles := (j.Tokens + tileTokens - 1) / tileTokens
	var next atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < w; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k := int(next.Add(1) - 1)
				if k >= len(j.Dst)*tiles {
					return
				}
				layer, tile := k/tiles, k%tiles
				src := j.Src[layer*srcLayer : (layer+1)*srcLayer]
				dst := j.Dst[layer]
				for kv := 0; kv < 2; kv++ {
					for tok := tile * tileTokens; tok < min((tile+1)*tileTokens, j.Tokens); tok++ {
						slot := j.Slots[tok]
						if slot < 0 {
							continue
						}
						so := kv*j.Tokens*srcTok + tok*srcTok
						if l.Strides().Head == row {
							d := l.Offset(kv, slot, 0)
							copy(dst[d:d+l.KVHeads*row], src[so:so+l.KVHeads*row])
							continue
						}
						for h := 0; h < l.KVHeads; h++ {
							d := l.Offset(kv, slot, h)
							copy(dst[d:d+row], src[so+h*row:so+(h+1)*row])
						}
					}
				}
			}
		}()
	}
	wg.Wait()
}

// BenchmarkInjectVsMemcpy alternates the fused pass with two baselines of
// the same byte count n (what the pass writes), all cores each (GOMAXPROCS
// workers or goroutines), all three reading the job's source and writing its
// destination buffers:
//
//   - memcpy: layerCopy, contiguous copies of 2 MiB per layer (the runtime's
//     memmove, non-temporal): the physical limit;
//   - ntcopy: layerCopy with copyNT (where AVX2 runs): the same copies
//     without the runtime's software prefetch, which costs this machine
//     time;
//   - scatter: scatterCopy, the same bytes into the same slots of the same
//     destination in the same block order (same-dtype cases only).
//
// It reports the rates, the median per-iteration wall-time ratios (ratio =
// memcpy time / inject time; scatter-ratio likewise) and cpu-ratio, the
// ratio of process CPU times, which a busy machine disturbs least.
func BenchmarkInjectVsMemcpy(b *testing.B) {
	for _, c := range benchCases {
		b.Run(c.name, func(b *testing.B) {
			j := benchJob(b, c.srcDT, c.dstDT, c.order, c.style)
			in := NewInjector(Config{Workers: benchWorkers(b)})
			defer in.Close()
			n := writtenBytes(j)
			w := in.Workers()
			ctx := b.Context()
			scatter := c.srcDT == c.dstDT
			// Fault every page in before timing (an engine's cache is
			// resident).
			if err := in.Inject(ctx, j); err != nil {
				b.Fatal(err)
			}
			var tInject, tCopy, tScatter, tNT, cpuInject, cpuCopy time.Duration
			ntOK := hasSIMD() && (n/len(j.Dst))%64 == 0
			ntratios := make([]float64, 0, b.N)
			ratios := make([]float64, 0, b.N)
			sratios := make([]float64, 0, b.N)
			b.SetBytes(int64(n))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				c0, t0 := processCPU(), time.Now()
				layerCopy(j, n, w, false)
				c1, t1 := processCPU(), time.Now()
				if err := in.Inject(ctx, j); err != nil {
					b.Fatal(err)
				}
				c2, t2 := processCPU(), time.Now()
				cpuCopy += c1 - c0
				cpuInject += c2 - c1
				tCopy += t1.Sub(t0)
				tInject += t2.Sub(t1)
				ratios = append(ratios, t1.Sub(t0).Seconds()/t2.Sub(t1).Seconds())
				if ntOK {
					t3 := time.Now()
					layerCopy(j, n, w, true)
					d := time.Since(t3)
					tNT += d
					ntratios = append(ntratios, d.Seconds()/t2.Sub(t1).Seconds())
				}
				if scatter {
					t3 := time.Now()
					scatterCopy(j, w)
					d := time.Since(t3)
					tScatter += d
					sratios = append(sratios, d.Seconds()/t2.Sub(t1).Seconds())
				}
			}
			b.StopTimer()
			gb := float64(n) * float64(b.N) / 1e9
			slices.Sort(ratios)
			b.ReportMetric(gb/tInject.Seconds(), "inject-GB/s")
			b.ReportMetric(gb/tCopy.Seconds(), "memcpy-GB/s")
			// On a shared machine the median of per-iteration ratios is
			// steadier than the ratio of totals.
			b.ReportMetric(ratios[len(ratios)/2], "ratio")
			b.ReportMetric(cpuCopy.Seconds()/cpuInject.Seconds(), "cpu-ratio")
			if ntOK {
				slices.Sort(ntratios)
				b.ReportMetric(gb/tNT.Seconds(), "ntcopy-GB/s")
				b.ReportMetric(ntratios[len(ntratios)/2], "ntcopy-ratio")
			}
			if scatter {
				slices.Sort(sratios)
				b.ReportMetric(gb/tScatter.Seconds(), "scatter-GB/s")
				b.ReportMetric(sratios[len(sratios)/2], "scatter-ratio")
			}
		})
	}
}

// BenchmarkRotateF32 is the engine's per-head rotation of q and k.
func BenchmarkRotateF32(b *testing.B) {
	for _, style := range []chunk.RopeStyle{chunk.RopeNeoX, chunk.RopeGPTJ} {
		b.Run(style.String(), func(b *testing.B) {
			spec := testSpec(style, 128, 0, chunk.RopeScaling{})
			tab, err := NewRopeTable(spec, 4096)
			if err != nil {
				b.Fatal(err)
			}
			x := make([]float32, 128)
			for i := range x {
				x[i] = float32(i)
			}
			b.SetBytes(128 * 4)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				tab.RotateF32(x, i&4095)
			}
		})
	}
}

// BenchmarkGatherF32 reads one layer's K back for 512 slots (the engine's
// attention input).
func BenchmarkGatherF32(b *testing.B) {
	for _, dt := range []chunk.DType{chunk.BF16, chunk.F32} {
		b.Run(dt.String(), func(b *testing.B) {
			l := pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: 64, BlockSize: 16, KVHeads: 8, HeadDim: 128, DType: dt}
			layer := make([]byte, l.LayerBytes())
			slots := make([]int, 512)
			for i := range slots {
				slots[i] = i
			}
			out := make([]float32, len(slots)*l.KVHeads*l.HeadDim)
			b.SetBytes(int64(len(out) * dt.Size()))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := GatherF32(out, layer, l, 0, slots); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecodeThenInject measures the int8 and int4 entry path as it runs
// today: chunk.DecodeRange of the bench chunk into a bf16 buffer, layer by
// layer (the buffer stays in cache), then the fused inject of that layer
// into the cache, one worker. It reports the share of the time the decode
// takes (decode-share): a fused dequantization could at best remove the
// inject's reading of the decoded layer, not the decode itself.
func BenchmarkDecodeThenInject(b *testing.B) {
	for _, codec := range []chunk.Codec{chunk.CodecInt8, chunk.CodecInt4} {
		b.Run(codec.String(), func(b *testing.B) {
			j := benchJob(b, chunk.BF16, chunk.BF16, pagedkv.NHD, chunk.RopeNeoX)
			layers := len(j.Dst)
			e := &chunk.Entry{Key: chunk.Key{Context: chunk.Context{Kind: chunk.ContextStandalone}}, DType: chunk.BF16, Layers: layers, KVHeads: j.SrcHeads, HeadDim: j.Layout.HeadDim,
				Tokens: make([]uint32, j.Tokens), KV: j.Src}
			blob, err := chunk.Encode(nil, e, codec)
			if err != nil {
				b.Fatal(err)
			}
			hd, err := chunk.ParseHeader(blob, chunk.Limits{})
			if err != nil {
				b.Fatal(err)
			}
			in := NewInjector(Config{Workers: 1})
			defer in.Close()
			ctx := b.Context()
			lb := len(j.Src) / layers
			layer := make([]byte, lb)
			one := *j
			one.Src = layer
			var tDecode, tInject time.Duration
			b.SetBytes(int64(writtenBytes(j)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for l := 0; l < layers; l++ {
					t0 := time.Now()
					if err := chunk.DecodeRange(layer, blob, &hd, chunk.Range{LayerLo: l, LayerHi: l + 1}, nil); err != nil {
						b.Fatal(err)
					}
					t1 := time.Now()
					one.Dst = j.Dst[l : l+1]
					if err := in.Inject(ctx, &one); err != nil {
						b.Fatal(err)
					}
					tDecode += t1.Sub(t0)
					tInject += time.Since(t1)
				}
			}
			b.ReportMetric(tDecode.Seconds()/(tDecode+tInject).Seconds(), "decode-share")
		})
	}
}
