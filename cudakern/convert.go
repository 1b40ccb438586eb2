package cudakern

import (
	"math"
	"unsafe"

	"github.com/kvmesh/kvmesh/chunk"
)

// isa is the set of assembly kernels a call may use.
type isa struct {
	avx2   bool // AVX2 and F16C
	avx512 bool // AVX-512 F and BW
	bf16   bool // AVX512-BF16
}

// hostISA is everything this machine runs.
func hostISA() isa {
	return isa{avx2: hasSIMD(), avx512: hasAVX512(), bf16: hasAVX512BF16()}
}

// aligned64 reports whether b starts on a cache line.
func aligned64(b []byte) bool {
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))%64 == 0
}

// loadF32 widens len(dst) elements of src in dtype dt into dst. fp8 values
// are multiplied by scale (x = fp8 * scale); other dtypes ignore it.
func loadF32(dst []float32, src []byte, dt chunk.DType, scale float32, k isa) {
	if dt == chunk.F32 && k.avx2 {
		// amd64 is little-endian: the float32 bits are the bytes.
		copy(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(dst))), 4*len(dst)), src)
		return
	}
	if n := len(dst) &^ 31; n > 0 && k.avx512 {
		switch dt {
		case chunk.BF16:
			widenBF16AVX512(&dst[0], &src[0], n)
		case chunk.F16:
			widenF16AVX512(&dst[0], &src[0], n)
		case chunk.FP8E4M3:
			widenFP8AVX512(&dst[0], &src[0], n, scale)
		}
		dst, src = dst[n:], src[n*dt.Size():]
	}
	if n := len(dst) &^ 7; n > 0 && k.avx2 {
		switch dt {
		case chunk.BF16:
			widenBF16AVX2(&dst[0], &src[0], n)
		case chunk.F16:
			widenF16AVX2(&dst[0], &src[0], n)
		case chunk.FP8E4M3:
			widenFP8AVX2(&dst[0], &src[0], n, scale)
		}
		dst, src = dst[n:], src[n*dt.Size():]
	}
	switch dt {
	case chunk.F32, chunk.BF16, chunk.F16:
		chunk.WidenRow(dst, src, dt)
	case chunk.FP8E4M3:
		src = src[:len(dst)]
		for i := range dst {
			dst[i] = fp8ToF32(src[i]) * scale
		}
	default:
		panic("cudakern: loadF32 of " + dt.String())
	}
}

// exactRecip returns 1/s when multiplying by it gives the bits of dividing
// by s for every x: s a power of two (its reciprocal is exact, and both
// operations round the same real number once).
func exactRecip(s float32) (float32, bool) {
	u := math.Float32bits(s)
	if u&0x7fffff != 0 || u>>23 == 0 || u>>23 >= 0xff {
		return 0, false
	}
	return 1 / s, true
}

// storeF32 rounds src once into dst in dtype dt. fp8 stores fp8(x / scale),
// dividing (not multiplying by a reciprocal, unless that is exact) as vLLM's
// scaled conversion does. nt asks for non-temporal stores where a kernel has
// them (bf16 and fp8 with AVX-512, on 64-byte aligned runs).
func storeF32(dst []byte, src []float32, dt chunk.DType, scale float32, nt bool, k isa) {
	switch dt {
	case chunk.F32:
		dst = dst[:4*len(src)]
		if k.avx2 { // amd64 is little-endian: the float32 bits are the bytes
			copy(dst, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(src))), 4*len(src)))
			return
		}
		chunk.NarrowRow(dst, src, dt)
	case chunk.BF16:
		if n := len(src) &^ 31; n > 0 && k.bf16 {
			if nt && aligned64(dst) {
				narrowBF16AVX512BF16NT(&dst[0], &src[0], n)
			} else {
				narrowBF16AVX512BF16(&dst[0], &src[0], n)
			}
			dst, src = dst[2*n:], src[n:]
		}
		if n := len(src) &^ 7; n > 0 && k.avx2 {
			narrowBF16AVX2(&dst[0], &src[0], n)
			dst, src = dst[2*n:], src[n:]
		}
		chunk.NarrowRow(dst, src, dt)
	case chunk.F16:
		if n := len(src) &^ 7; n > 0 && k.avx2 {
			narrowF16AVX2(&dst[0], &src[0], n)
			dst, src = dst[2*n:], src[n:]
		}
		chunk.NarrowRow(dst, src, dt)
	case chunk.FP8E4M3:
		dst = dst[:len(src)]
		if n := len(src) &^ 63; n > 0 && k.avx512 {
			nt := nt && aligned64(dst)
			if scale == 1 {
				if nt {
					storeFP8AVX512NT(&dst[0], &src[0], n, 1)
				} else {
					storeFP8AVX512(&dst[0], &src[0], n, 1)
				}
			} else if r, ok := exactRecip(scale); ok {
				if nt {
					storeFP8MulAVX512NT(&dst[0], &src[0], n, r)
				} else {
					storeFP8MulAVX512(&dst[0], &src[0], n, r)
				}
			} else if nt {
				storeFP8DivAVX512NT(&dst[0], &src[0], n, scale)
			} else {
				storeFP8DivAVX512(&dst[0], &src[0], n, scale)
			}
			dst, src = dst[n:], src[n:]
		}
		if n := len(src) &^ 7; n > 0 && k.avx2 {
			if nt {
				storeFP8AVX2NT(&dst[0], &src[0], n, scale)
			} else {
				storeFP8AVX2(&dst[0], &src[0], n, scale)
			}
			dst, src = dst[n:], src[n:]
		}
		for i, v := range src {
			if scale != 1 { // x / 1 is x: skip the division
				v /= scale
			}
			// f32ToFP8, inlined by hand: the compiler will not inline a
			// function that also calls the slow path.
			u := math.Float32bits(v)
			a := u & 0x7fffffff
			if a-0x3c800000 >= 0x43e00000-0x3c800000 {
				dst[i] = chunk.F32ToFP8E4M3(v)
				continue
			}
			a -= 120 << 23
			a += 0x7ffff + (a>>20)&1
			dst[i] = uint8(u>>24)&0x80 | uint8(min(a>>20, 0x7e))
		}
	default:
		panic("cudakern: storeF32 of " + dt.String())
	}
}

// f32ToFP8 is chunk.F32ToFP8E4M3 with the common case (a normal e4m3
// result) inlined: rebias the exponent, round the 20 dropped bits to even,
// saturate at 448. Everything else (subnormal, zero, saturation, NaN) takes
// the full function.
func f32ToFP8(f float32) uint8 {
	u := math.Float32bits(f)
	a := u & 0x7fffffff
	if a-0x3c800000 >= 0x43e00000-0x3c800000 { // outside [2^-6, 448)
		return chunk.F32ToFP8E4M3(f)
	}
	a -= 120 << 23
	a += 0x7ffff + (a>>20)&1
	return uint8(u>>24)&0x80 | uint8(min(a>>20, 0x7e))
}

// fp8ToF32 is chunk.FP8E4M3ToF32 without branches but one: the 7 low bits
// shifted into a float32's exponent and mantissa fields read as 2^(e-127)
// (1.m) for e > 0 and as a float32 subnormal for e = 0; times 2^120 both
// are exactly the e4m3 value (bias 7, subnormals m * 2^-9).
func fp8ToF32(b uint8) float32 {
	if b&0x7f == 0x7f {
		return chunk.FP8E4M3ToF32(b) // NaN
	}
	v := math.Float32frombits(uint32(b&0x7f)<<20) * 0x1p120
	return math.Float32frombits(math.Float32bits(v) | uint32(b&0x80)<<24)
}
