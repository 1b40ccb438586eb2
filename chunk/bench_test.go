package chunk

import (
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/klauspost/compress/huff0"
	"github.com/klauspost/compress/zstd"
)

// llamaChunk is a 256-token chunk shaped like Llama-3.1-8B (32 layers, 8 KV
// heads, head dim 128) with synthetic KV (synthKV): 32 MiB in 16 bits.
func llamaChunk(dt DType) *Entry {
	return synthEntry(rand.New(rand.NewPCG(8, uint64(dt))), dt, 256, 32, 8, 128)
}

// clock measures a benchmark loop in wall time and in process CPU time.
type clock struct{ wall, cpu time.Duration }

func startClock() clock { return clock{wall: time.Duration(time.Now().UnixNano()), cpu: cpuTime()} }

// report reports raw (16-bit) tensor bytes per second in GB/s, per
// wall-clock second and per CPU-second (the loop is single-threaded, so
// the latter is what one unshared core does).
func (c clock) report(b *testing.B, raw int) {
	wall := time.Duration(time.Now().UnixNano()) - c.wall
	cpu := cpuTime() - c.cpu
	bytes := float64(raw) * float64(b.N)
	if wall > 0 {
		b.ReportMetric(bytes/wall.Seconds()/1e9, "GB/s")
	}
	if cpu > 0 {
		b.ReportMetric(bytes/cpu.Seconds()/1e9, "cpu_GB/s")
	}
}

func BenchmarkEncode(b *testing.B) {
	for _, dt := range []DType{BF16, F16} {
		e := llamaChunk(dt)
		for _, c := range allCodecs {
			b.Run(c.String()+"/"+dt.String(), func(b *testing.B) {
				blob, err := Encode(nil, e, c)
				if err != nil {
					b.Fatal(err)
				}
				b.SetBytes(int64(len(e.KV)))
				b.ReportAllocs()
				b.ResetTimer()
				clk := startClock()
				for i := 0; i < b.N; i++ {
					if blob, err = Encode(blob[:0], e, c); err != nil {
						b.Fatal(err)
					}
				}
				clk.report(b, len(e.KV))
				b.ReportMetric(float64(len(e.KV))/float64(len(blob)), "ratio")
			})
		}
	}
}

func BenchmarkDecode(b *testing.B) {
	for _, dt := range []DType{BF16, F16} {
		e := llamaChunk(dt)
		for _, c := range allCodecs {
			b.Run(c.String()+"/"+dt.String(), func(b *testing.B) {
				blob, err := Encode(nil, e, c)
				if err != nil {
					b.Fatal(err)
				}
				hd, err := ParseHeader(blob, Limits{})
				if err != nil {
					b.Fatal(err)
				}
				dst := make([]byte, len(e.KV))
				if err := DecodeRange(dst, blob, &hd, Range{}, nil); err != nil {
					b.Fatal(err)
				}
				b.SetBytes(int64(len(e.KV)))
				b.ReportAllocs()
				b.ResetTimer()
				clk := startClock()
				for i := 0; i < b.N; i++ {
					if err := DecodeRange(dst, blob, &hd, Range{}, nil); err != nil {
						b.Fatal(err)
					}
				}
				clk.report(b, len(e.KV))
				b.ReportMetric(float64(len(e.KV))/float64(len(blob)), "ratio")
				b.StopTimer()
				if c.Lossy() { // after the timed loop: ResetTimer drops metrics
					maxAbs, relRMS, maxRel := kvError(e.KV, dst, hd.Shape)
					b.ReportMetric(maxAbs, "max_abs")
					b.ReportMetric(relRMS, "rel_rms")
					b.ReportMetric(maxRel, "max_rel")
				}
			})
		}
	}
}

// smallChunk is a 24-token chunk of a small model (4 layers, 2 KV heads,
// head dim 64; the shape of the demo's and the link-rate benchmark's
// model): each K or V half of a layer is 3072 elements, planes too small
// for huff0's 4X format at its default threshold.
func smallChunk(dt DType) *Entry {
	return synthEntry(rand.New(rand.NewPCG(24, uint64(dt))), dt, 24, 4, 2, 64)
}

// BenchmarkDecodeLayer decodes as the injection path does: a layer at a
// time (DecodeRange of one layer) into one reused layer-sized buffer, so
// the output stays in cache instead of streaming a whole entry to memory.
// cpu_GB/s is of 16-bit output bytes per CPU-second. The Llama-shaped
// chunk's cases are named codec/dtype, the small chunk's codec/dtype/small.
func BenchmarkDecodeLayer(b *testing.B) {
	for _, dt := range []DType{BF16, F16} {
		for _, shape := range []struct {
			suffix string
			e      *Entry
		}{{"", llamaChunk(dt)}, {"/small", smallChunk(dt)}} {
			benchDecodeLayer(b, dt, shape.e, shape.suffix)
		}
	}
}

// benchDecodeLayer runs BenchmarkDecodeLayer's cases on entry e.
func benchDecodeLayer(b *testing.B, dt DType, e *Entry, suffix string) {
	for _, c := range []Codec{CodecLossless, CodecInt8, CodecFP8} {
		b.Run(c.String()+"/"+dt.String()+suffix, func(b *testing.B) {
			blob, err := Encode(nil, e, c)
			if err != nil {
				b.Fatal(err)
			}
			hd, err := ParseHeader(blob, Limits{})
			if err != nil {
				b.Fatal(err)
			}
			dst := make([]byte, hd.Shape.LayerBytes())
			b.SetBytes(int64(len(e.KV)))
			b.ReportAllocs()
			b.ResetTimer()
			clk := startClock()
			for i := 0; i < b.N; i++ {
				for l := range hd.Shape.Layers {
					if err := DecodeRange(dst, blob, &hd, Range{LayerLo: l, LayerHi: l + 1}, nil); err != nil {
						b.Fatal(err)
					}
				}
			}
			clk.report(b, len(e.KV))
		})
	}
}

// kvError returns the largest absolute error, the relative RMS error
// ||x̂-x||/||x||, and the largest error relative to the largest magnitude
// in the element's quantization group (the scale the codec works at).
func kvError(raw, dec []byte, sh Shape) (maxAbs, relRMS, maxRel float64) {
	lb := sh.LayerBytes()
	groupOf := quantGroupsOf(sh)
	amax := make([]float64, len(groupOf))
	var se, sx float64
	for l := 0; l < sh.Layers; l++ {
		r, d := raw[l*lb:(l+1)*lb], dec[l*lb:(l+1)*lb]
		clear(amax)
		for i, g := range groupOf {
			amax[g] = max(amax[g], math.Abs(elemF64(r, i, sh.DType)))
		}
		for i, g := range groupOf {
			x, y := elemF64(r, i, sh.DType), elemF64(d, i, sh.DType)
			e := math.Abs(y - x)
			maxAbs = max(maxAbs, e)
			se += e * e
			sx += x * x
			if amax[g] > 0 {
				maxRel = max(maxRel, e/amax[g])
			}
		}
	}
	return maxAbs, math.Sqrt(se / sx), maxRel
}

// BenchmarkExponentPlane compares huff0 (as the lossless codec uses it, in
// losslessBlock blocks) with zstd on the exponent plane of the synthetic
// Llama chunk's first layer: the measurement behind the choice of huff0.
func BenchmarkExponentPlane(b *testing.B) {
	for _, dt := range []DType{BF16, F16} {
		e := llamaChunk(dt)
		lb := e.LayerBytes()
		n := lb / 2
		var planes [4][losslessBlock]byte
		plane := make([]byte, 0, n)
		for off := 0; off < lb; off += 2 * losslessBlock {
			m := min(losslessBlock, (lb-off)/2)
			split(&planes, e.KV[off:off+2*m], dt)
			plane = append(plane, planes[0][:m]...)
		}
		b.Run("huff0/"+dt.String(), func(b *testing.B) {
			var hs huff0.Scratch
			hs.Reuse = huff0.ReusePolicyNone
			var enc []byte
			b.SetBytes(int64(n))
			clk := startClock()
			for i := 0; i < b.N; i++ {
				enc = enc[:0]
				for off := 0; off < n; off += losslessBlock {
					enc = appendPlane(enc, plane[off:min(off+losslessBlock, n)], &hs, 8)
				}
			}
			clk.report(b, n)
			b.ReportMetric(float64(n)/float64(len(enc)), "ratio")
			b.StopTimer()
			// Decode time, per plane byte, as a separate metric.
			buf := make([]byte, losslessBlock)
			ps := &planeScratch{}
			cpu := cpuTime()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				rest := enc
				for off := 0; off < n; off += losslessBlock {
					var err error
					if _, rest, err = readPlane(rest, buf[:min(losslessBlock, n-off)], ps); err != nil {
						b.Fatal(err)
					}
				}
			}
			reportDecode(b, n, start, cpu)
			// The same blocks through huff0's own decoder, which
			// readPlane uses for long codes (huffMultiMaxBits).
			var h0 huff0.Scratch
			cpu = cpuTime()
			for i := 0; i < b.N; i++ {
				rest := enc
				for off := 0; off < n; off += losslessBlock {
					m := min(losslessBlock, n-off)
					ln := int(binary.LittleEndian.Uint32(rest[1:]))
					if _, err := huff0Decode4X(&h0, buf[:0:m], rest[5:5+ln]); err != nil {
						b.Fatal(err)
					}
					rest = rest[5+ln:]
				}
			}
			if c := cpuTime() - cpu; c > 0 {
				b.ReportMetric(float64(n)*float64(b.N)/c.Seconds()/1e9, "huff0dec_cpu_GB/s")
			}
		})
		for _, lvl := range []zstd.EncoderLevel{zstd.SpeedFastest, zstd.SpeedDefault, zstd.SpeedBetterCompression} {
			b.Run("zstd-"+lvl.String()+"/"+dt.String(), func(b *testing.B) {
				zw, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(lvl), zstd.WithEncoderConcurrency(1))
				if err != nil {
					b.Fatal(err)
				}
				defer zw.Close()
				zr, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1))
				if err != nil {
					b.Fatal(err)
				}
				defer zr.Close()
				var enc []byte
				b.SetBytes(int64(n))
				clk := startClock()
				for i := 0; i < b.N; i++ {
					enc = zw.EncodeAll(plane, enc[:0])
				}
				clk.report(b, n)
				b.ReportMetric(float64(n)/float64(len(enc)), "ratio")
				b.StopTimer()
				dec := make([]byte, 0, n)
				cpu := cpuTime()
				start := time.Now()
				for i := 0; i < b.N; i++ {
					if dec, err = zr.DecodeAll(enc, dec[:0]); err != nil {
						b.Fatal(err)
					}
				}
				reportDecode(b, n, start, cpu)
				if len(dec) != n {
					b.Fatal(errors.New("zstd round trip size"))
				}
			})
		}
	}
}

// reportDecode reports a decode loop timed outside the benchmark timer.
func reportDecode(b *testing.B, n int, start time.Time, cpu time.Duration) {
	bytes := float64(n) * float64(b.N)
	b.ReportMetric(bytes/time.Since(start).Seconds()/1e9, "dec_GB/s")
	if c := cpuTime() - cpu; c > 0 {
		b.ReportMetric(bytes/c.Seconds()/1e9, "dec_cpu_GB/s")
	}
}
