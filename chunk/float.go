package chunk

import (
	"encoding/binary"
	"math"
	"slices"
)

// Float conversions between float32 and the 16-bit and 8-bit storage types.
// Narrowing rounds to nearest, ties to even; NaN stays NaN (quiet), Inf stays
// Inf, subnormals are produced and read exactly.

// BF16ToF32 widens a bfloat16 exactly.
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 rounds to the nearest bfloat16, ties to even.
func F32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 { // NaN: keep sign, force a quiet payload
		return uint16(u>>16) | 0x0040
	}
	// Adding 0x7fff plus the lowest kept bit rounds to nearest even; a carry
	// into the exponent gives the right result, up to Inf.
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

// F16ToF32 widens an IEEE half exactly.
func F16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // Inf or NaN
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp != 0: // normal
		return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
	case man == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal half: value = man * 2^-24, exact in float32.
	f := float32(man) * (1.0 / (1 << 24))
	return math.Float32frombits(sign | math.Float32bits(f))
}

// F32ToF16 rounds to the nearest IEEE half, ties to even, overflowing to Inf.
func F32ToF16(f float32) uint16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	a := u & 0x7fffffff
	switch {
	case a > 0x7f800000: // NaN
		return sign | 0x7e00 | uint16(a>>13)&0x3ff
	case a >= 0x477ff000: // rounds to >= 65520: Inf
		return sign | 0x7c00
	case a >= 0x38800000: // normal half range (>= 2^-14)
		// Rebias the exponent and round the 13 dropped bits to even.
		a -= 112 << 23
		a += 0x0fff + (a>>13)&1
		return sign | uint16(a>>13)
	case a < 0x33000000: // below half of the smallest subnormal: zero
		return sign
	}
	// Subnormal half: shift the full significand right and round to even.
	exp := a >> 23
	man := a&0x7fffff | 0x800000
	shift := 126 - exp // value = man * 2^(exp-150); units of 2^-24
	halfUnit := uint32(1) << (shift - 1)
	r := man >> shift
	rem := man & (1<<shift - 1)
	if rem > halfUnit || (rem == halfUnit && r&1 == 1) {
		r++
	}
	return sign | uint16(r)
}

// FP8E4M3ToF32 widens an OCP e4m3fn byte (bias 7, no Inf, 0x7f/0xff NaN).
func FP8E4M3ToF32(b uint8) float32 {
	sign := uint32(b&0x80) << 24
	exp := uint32(b>>3) & 0xf
	man := uint32(b) & 7
	switch {
	case exp == 0xf && man == 7:
		return math.Float32frombits(sign | 0x7fc00000)
	case exp != 0:
		return math.Float32frombits(sign | (exp+120)<<23 | man<<20)
	}
	f := float32(man) * (1.0 / 512) // subnormal: man * 2^-9
	return math.Float32frombits(sign | math.Float32bits(f))
}

// FP8E4M3Max is the largest finite e4m3fn value.
const FP8E4M3Max = 448

// F32ToFP8E4M3 rounds to the nearest e4m3fn, ties to even, saturating to
// ±448 (as vLLM's conversion does); NaN maps to NaN.
func F32ToFP8E4M3(f float32) uint8 {
	u := math.Float32bits(f)
	sign := uint8(u>>24) & 0x80
	a := u & 0x7fffffff
	switch {
	case a > 0x7f800000:
		return sign | 0x7f
	case a >= 0x43e00000: // >= 448 (and Inf): saturate
		return sign | 0x7e
	case a >= 0x3c800000: // normal e4m3 range (>= 2^-6)
		a -= 120 << 23
		a += 0x7ffff + (a>>20)&1
		r := a >> 20
		if r > 0x7e { // rounding up past 448
			r = 0x7e
		}
		return sign | uint8(r)
	case a < 0x3a800000: // below 2^-10, half the smallest subnormal 2^-9
		return sign
	}
	exp := a >> 23
	man := a&0x7fffff | 0x800000
	shift := 141 - exp // value = man * 2^(exp-150); units of 2^-9
	halfUnit := uint32(1) << (shift - 1)
	r := man >> shift
	rem := man & (1<<shift - 1)
	if rem > halfUnit || (rem == halfUnit && r&1 == 1) {
		r++
	}
	return sign | uint8(r)
}

// WidenRow widens the len(dst) little-endian elements of dt at the start of
// src (F32, F16 or BF16) exactly. Every row of float elements the module
// reads (codecs, weights, entries) is widened here.
func WidenRow(dst []float32, src []byte, dt DType) {
	switch dt {
	case F32:
		src = src[:4*len(dst)]
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case F16:
		src = src[:2*len(dst)]
		for i := range dst {
			dst[i] = F16ToF32(uint16(src[2*i]) | uint16(src[2*i+1])<<8)
		}
	case BF16:
		src = src[:2*len(dst)]
		for i := range dst {
			dst[i] = BF16ToF32(uint16(src[2*i]) | uint16(src[2*i+1])<<8)
		}
	}
}

// NarrowRow writes src as len(src) little-endian elements of dt (F32, F16
// or BF16) at the start of dst, rounding to nearest even as F32ToF16 and
// F32ToBF16 do (a NaN stays a NaN). Every row of float elements the module
// writes is narrowed here.
func NarrowRow(dst []byte, src []float32, dt DType) {
	switch dt {
	case F32:
		dst = dst[:4*len(src)]
		for i, v := range src {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
		}
	case F16:
		dst = dst[:2*len(src)]
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], F32ToF16(v))
		}
	case BF16:
		dst = dst[:2*len(src)]
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], F32ToBF16(v))
		}
	}
}

// AppendRow appends src narrowed to dt (NarrowRow) to dst.
func AppendRow(dst []byte, src []float32, dt DType) []byte {
	n := len(dst)
	dst = slices.Grow(dst, len(src)*dt.Size())[:n+len(src)*dt.Size()]
	NarrowRow(dst[n:], src, dt)
	return dst
}
