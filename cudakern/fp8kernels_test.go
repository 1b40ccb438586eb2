package cudakern

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// fp8Scales are the scales the single-pass kernels are checked with: 1, an
// exact reciprocal, inexact ones (a division), one that makes float32
// subnormals of small values and one that overflows large values.
var fp8Scales = []float32{1, 0.25, 4, 3.7, 0.0173, 1e-36, 3e35}

// TestFP8ToBF16AVX512Exhaustive: every e4m3 code, with every scale, gives
// bf16(fp8 * scale) as the Go path computes it (NaN, zero and subnormal
// codes included), with cached and non-temporal stores.
func TestFP8ToBF16AVX512Exhaustive(t *testing.T) {
	if !hasAVX512BF16() {
		t.Skip("no AVX512-BF16 on this machine")
	}
	src := make([]byte, 512)
	for i := range src {
		src[i] = byte(i)
	}
	for _, scale := range fp8Scales {
		for _, nt := range []int{0, 1} {
			dst := aligned(2 * len(src))
			fp8ToBF16AVX512(&dst[0], &src[0], len(src), scale, nt)
			for i, b := range src {
				want := chunk.F32ToBF16(chunk.FP8E4M3ToF32(b) * scale)
				if got := binary.LittleEndian.Uint16(dst[2*i:]); got != want {
					t.Fatalf("scale %g nt %d code %#02x: got %#04x want %#04x", scale, nt, b, got, want)
				}
			}
			if scale != 1 {
				continue
			}
			for _, n := range []int{len(src), len(src) - 32} {
				dst := aligned(2 * n)
				fp8ToBF16WAVX512(&dst[0], &src[0], n, nt)
				for i, b := range src[:n] {
					want := chunk.F32ToBF16(chunk.FP8E4M3ToF32(b))
					if got := binary.LittleEndian.Uint16(dst[2*i:]); got != want {
						t.Fatalf("word kernel, nt %d code %#02x: got %#04x want %#04x", nt, b, got, want)
					}
				}
			}
		}
	}
}

// TestBF16ToFP8AVX512Exhaustive: every bf16 input, with every scale, gives
// fp8(x / scale) (NaN, Inf, saturation, subnormal results and ties
// included), whether the kernel multiplies by an exact reciprocal or
// divides, over lengths that leave 16-value tails.
func TestBF16ToFP8AVX512Exhaustive(t *testing.T) {
	if !hasAVX512() {
		t.Skip("no AVX-512 on this machine")
	}
	src := make([]byte, 2<<16)
	for i := 0; i < 1<<16; i++ {
		binary.LittleEndian.PutUint16(src[2*i:], uint16(i))
	}
	for _, scale := range fp8Scales {
		arg, div := fp8StoreArg(scale)
		for _, nt := range []int{0, 1} {
			for _, n := range []int{1 << 16, 1<<16 - 48} {
				dst := aligned(n)
				bf16ToFP8AVX512(&dst[0], &src[0], n, arg, div, nt)
				for i := 0; i < n; i++ {
					x := math.Float32frombits(uint32(i) << 16)
					if want := chunk.F32ToFP8E4M3(x / scale); dst[i] != want {
						t.Fatalf("scale %g (div %d) nt %d bf16 %#04x: got %#02x want %#02x", scale, div, nt, i, dst[i], want)
					}
				}
			}
		}
	}
}

// isNaNBits reports whether the bf16 or fp8 bits b are a NaN. A NaN that
// two NaN operands make may carry either one's sign and payload, depending
// on operand order, in the assembly and in compiled Go alike.
func isNaNBits(b uint16, dt chunk.DType) bool {
	if dt == chunk.FP8E4M3 {
		return b&0x7f == 0x7f
	}
	return b&0x7fff > 0x7f80
}

// sameElems reports whether a and b hold the same elements of dt, any NaN
// matching any NaN.
func sameElems(a, b []byte, dt chunk.DType) bool {
	if len(a) != len(b) {
		return false
	}
	es := dt.Size()
	for i := 0; i < len(a); i += es {
		x, y := uint16(a[i]), uint16(b[i])
		if es == 2 {
			x, y = binary.LittleEndian.Uint16(a[i:]), binary.LittleEndian.Uint16(b[i:])
		}
		if x != y && !(isNaNBits(x, dt) && isNaNBits(y, dt)) {
			return false
		}
	}
	return true
}

// rotRef is the Go path's rotation of one NeoX head vector through float32
// (each product rounded, no fused multiply-add) on widened values.
func rotRef(x []float32, c, s []float32) {
	half := len(x) / 2
	for i := 0; i < half; i++ {
		x0, x1 := x[i], x[half+i]
		x[i] = float32(x0*c[i]) - float32(x1*s[i])
		x[half+i] = float32(x1*c[i]) + float32(x0*s[i])
	}
}

// TestRotFP8KernelsMatchGo: the single-pass rotation kernels give the bits
// of widen, rotate and round in Go, for several heads with strides, on
// arbitrary source bits (every fp8 code; bf16 NaN, Inf and subnormals), at
// many positions and with every scale, touching nothing between heads.
func TestRotFP8KernelsMatchGo(t *testing.T) {
	if !hasAVX512() {
		t.Skip("no AVX-512 on this machine")
	}
	rng := rand.New(rand.NewPCG(31, 32))
	for _, hd := range []int{32, 64, 96, 128, 256} {
		spec := testSpec(chunk.RopeNeoX, hd, 0, chunk.RopeScaling{Type: "yarn", Factor: 8, OriginalMaxPositions: 4096})
		tab, err := NewRopeTable(spec, 8192)
		if err != nil {
			t.Fatal(err)
		}
		const heads = 3
		half := hd / 2
		x := make([]float32, hd)
		for _, pos := range []int{0, 1, 17, 4000, 8191} {
			c, s := tab.Row(pos)
			for _, scale := range fp8Scales {
				for _, nt := range []int{0, 1} {
					// fp8 -> bf16.
					// The non-temporal stores need 64-byte aligned halves.
					if hasAVX512BF16() && (nt == 0 || half%32 == 0) {
						srcStride, dstStride := hd+16, 2*hd+64
						src := make([]byte, heads*srcStride)
						for i := range src {
							src[i] = byte(rng.Uint32())
						}
						dst := aligned(heads * dstStride)
						guard := append([]byte(nil), dst...)
						rotNeoXFP8BF16AVX512(&dst[0], &src[0], &c[0], &s[0], half, half, heads, dstStride, srcStride, scale, nt)
						for h := 0; h < heads; h++ {
							for i := range x {
								x[i] = chunk.FP8E4M3ToF32(src[h*srcStride+i]) * scale
							}
							rotRef(x, c, s)
							for i, v := range x {
								got := binary.LittleEndian.Uint16(dst[h*dstStride+2*i:])
								if want := chunk.F32ToBF16(v); got != want && !(isNaNBits(got, chunk.BF16) && isNaNBits(want, chunk.BF16)) {
									t.Fatalf("fp8->bf16 hd %d pos %d scale %g nt %d head %d dim %d: got %#04x want %#04x", hd, pos, scale, nt, h, i, got, want)
								}
							}
							if !bytes.Equal(dst[h*dstStride+2*hd:(h+1)*dstStride], guard[h*dstStride+2*hd:(h+1)*dstStride]) {
								t.Fatalf("fp8->bf16 hd %d: wrote between heads", hd)
							}
						}
					}
					// bf16 -> fp8; half the sources are real values, half
					// arbitrary bits.
					srcStride, dstStride := 2*hd+32, hd+64
					src := make([]byte, heads*srcStride)
					for i := 0; i < len(src); i += 2 {
						b := uint16(rng.Uint32())
						if i%4 == 0 {
							b = chunk.F32ToBF16(float32(rng.NormFloat64() * math.Exp(3*rng.NormFloat64())))
						}
						binary.LittleEndian.PutUint16(src[i:], b)
					}
					if nt == 1 && half%32 != 0 {
						continue // the non-temporal stores need 32-byte aligned halves
					}
					dst := aligned(heads * dstStride)
					guard := append([]byte(nil), dst...)
					arg, div := fp8StoreArg(scale)
					rotNeoXBF16FP8AVX512(&dst[0], &src[0], &c[0], &s[0], half, half, heads, dstStride, srcStride, arg, div, nt)
					for h := 0; h < heads; h++ {
						for i := range x {
							x[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[h*srcStride+2*i:])) << 16)
						}
						rotRef(x, c, s)
						for i, v := range x {
							got := dst[h*dstStride+i]
							if want := chunk.F32ToFP8E4M3(v / scale); got != want && !(isNaNBits(uint16(got), chunk.FP8E4M3) && isNaNBits(uint16(want), chunk.FP8E4M3)) {
								t.Fatalf("bf16->fp8 hd %d pos %d scale %g nt %d head %d dim %d: got %#02x want %#02x (%g)", hd, pos, scale, nt, h, i, dst[h*dstStride+i], want, v/scale)
							}
						}
						if !bytes.Equal(dst[h*dstStride+hd:(h+1)*dstStride], guard[h*dstStride+hd:(h+1)*dstStride]) {
							t.Fatalf("bf16->fp8 hd %d: wrote between heads", hd)
						}
					}
				}
			}
		}
	}
}

// TestInjectFP8SinglePassMatchesGo: whole jobs through the single-pass
// kernels (and, for shapes they do not take, the generic path) write the
// bytes of the portable Go path, NHD and HND, cached and non-temporal,
// with and without scales, on arbitrary source bits.
func TestInjectFP8SinglePassMatchesGo(t *testing.T) {
	fast := NewInjector(Config{Workers: 2})
	defer fast.Close()
	slow := NewInjector(Config{Workers: 2, NoSIMD: true})
	defer slow.Close()
	rng := rand.New(rand.NewPCG(41, 42))
	var tabs RopeTables
	type pair struct{ src, dst chunk.DType }
	for _, pr := range []pair{{chunk.FP8E4M3, chunk.BF16}, {chunk.BF16, chunk.FP8E4M3}} {
		for _, shape := range []struct{ hd, rot int }{{128, 128}, {64, 64}, {96, 96}, {80, 80}, {128, 64}} {
			for _, style := range []chunk.RopeStyle{chunk.RopeNeoX, chunk.RopeGPTJ} {
				if style == chunk.RopeGPTJ && shape.hd != 128 {
					continue // the generic path, covered elsewhere
				}
				for _, order := range pagedkv.Orders() {
					for _, ntMin := range []int{0, ntMinBytes} {
						spec := testSpec(style, shape.hd, shape.rot, chunk.RopeScaling{})
						tab, err := tabs.Get(spec, 2048)
						if err != nil {
							t.Fatal(err)
						}
						lay := pagedkv.CacheLayout{Order: order, NumBlocks: 4, BlockSize: 16, KVHeads: 4, HeadDim: shape.hd, DType: pr.dst}
						var srcScale float32
						if pr.dst == chunk.FP8E4M3 {
							lay.KScale, lay.VScale = 0.5, 0.037
						} else {
							srcScale = 1.9
						}
						jc := jobCase{spec: spec, srcDT: pr.src, srcScale: srcScale, layout: lay, tokens: 33, srcHeads: 6, lo: 1, hi: 5, pos: 1000, layers: 1, skipEvery: 7}
						j, _ := buildJob(t, rng, jc, tab)
						for i := range j.Src {
							if i%3 == 0 {
								j.Src[i] = byte(rng.Uint32()) // arbitrary bits too
							}
						}
						// The shapes the single-pass kernels take must reach them.
						p, err := j.plan()
						if err != nil {
							t.Fatal(err)
						}
						p.simd, p.avx512, p.bf16 = fast.simd, fast.avx512, fast.bf16
						p.pick()
						full := fast.avx512 && (pr.dst == chunk.FP8E4M3 || fast.bf16)
						if wantK := full && style == chunk.RopeNeoX && shape.rot == shape.hd && shape.hd%32 == 0; wantK != (p.fp8K != fp8None) {
							t.Fatalf("%v->%v hd %d rot %d %v: single-pass K kernel %v, want %v", pr.src, pr.dst, shape.hd, shape.rot, style, p.fp8K != fp8None, wantK)
						}
						if full && shape.hd%32 == 0 && p.fp8V == fp8None {
							t.Fatalf("%v->%v hd %d: no single-pass V kernel", pr.src, pr.dst, shape.hd)
						}
						want := make([][]byte, len(j.Dst))
						for i := range j.Dst {
							want[i] = append([]byte(nil), j.Dst[i]...)
						}
						wj := *j
						wj.Dst = want
						if err := slow.Inject(t.Context(), &wj); err != nil {
							t.Fatal(err)
						}
						fast.ntMin = ntMin
						if err := fast.Inject(t.Context(), j); err != nil {
							t.Fatal(err)
						}
						for i := range want {
							if !sameElems(j.Dst[i], want[i], pr.dst) {
								t.Fatalf("%v->%v hd %d rot %d %v %v ntMin %d: layer %d differs from the Go path", pr.src, pr.dst, shape.hd, shape.rot, style, order, ntMin, i)
							}
						}
					}
				}
			}
		}
	}
}
