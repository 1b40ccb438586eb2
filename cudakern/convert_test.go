package cudakern

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
)

// TestF32ToFP8MatchesChunk: the inlined fast path agrees with chunk's
// conversion on the boundaries of every branch and on random bit patterns.
func TestF32ToFP8MatchesChunk(t *testing.T) {
	edges := []uint32{0, 1, 0x3a800000, 0x3a800001, 0x3c7fffff, 0x3c800000, 0x3c800001, 0x3c880000,
		0x43dfffff, 0x43e00000, 0x43e00001, 0x43d80000, 0x43d7ffff, 0x43d80001, 0x7f7fffff, 0x7f800000, 0x7fc00000, 0x7f800001}
	check := func(u uint32) {
		for _, s := range []uint32{0, 0x80000000} {
			f := math.Float32frombits(u | s)
			var got [1]byte
			storeF32(got[:], []float32{f}, chunk.FP8E4M3, 1, false, hostISA())
			if got[0] != f32ToFP8(f) {
				t.Fatalf("%#08x: storeF32 and f32ToFP8 disagree", u|s)
			}
			if got, want := f32ToFP8(f), chunk.F32ToFP8E4M3(f); got != want {
				t.Fatalf("%#08x (%g): fast %#02x, chunk %#02x", u|s, f, got, want)
			}
		}
	}
	for _, u := range edges {
		for d := uint32(0); d < 3; d++ {
			check(u + d)
			check(u - d)
		}
	}
	// Every rounding position of the normal range, ties included.
	for e := uint32(0x3c800000); e < 0x43e00000; e += 1 << 19 {
		check(e)
		check(e + 1)
		check(e - 1)
	}
	rng := rand.New(rand.NewPCG(23, 24))
	for i := 0; i < 1<<20; i++ {
		check(rng.Uint32() & 0x7fffffff)
	}
}

func TestFP8ToF32MatchesChunk(t *testing.T) {
	for b := 0; b < 256; b++ {
		got, want := fp8ToF32(uint8(b)), chunk.FP8E4M3ToF32(uint8(b))
		if math.Float32bits(got) != math.Float32bits(want) && !(got != got && want != want) {
			t.Fatalf("%#02x: %v, chunk %v", b, got, want)
		}
	}
}

// TestStoreFP8SIMD: the vector fp8 store gives chunk's bytes for every
// branch, with and without a scale.
func TestStoreFP8SIMD(t *testing.T) {
	if !hasSIMD() {
		t.Skip("no SIMD kernels on this machine")
	}
	rng := rand.New(rand.NewPCG(25, 26))
	var src []float32
	for _, u := range []uint32{0, 1, 0x3a800000, 0x3a800001, 0x3a7fffff, 0x3b000000, 0x3c7fffff, 0x3c800000,
		0x3c7c0000, 0x3c780000, 0x43dfffff, 0x43e00000, 0x43d80000, 0x43d7ffff, 0x43d80001, 0x7f7fffff,
		0x7f800000, 0x7fc00000, 0x7f800001, 0x00400000} {
		for _, s := range []uint32{0, 0x80000000} {
			src = append(src, math.Float32frombits(u|s), math.Float32frombits((u+1)|s), math.Float32frombits((u-1)|s))
		}
	}
	for e := uint32(0x3a000000); e < 0x44000000; e += 1 << 19 {
		src = append(src, math.Float32frombits(e), math.Float32frombits(e+1), math.Float32frombits(e-1))
	}
	for i := 0; i < 1<<16; i++ {
		src = append(src, math.Float32frombits(rng.Uint32()), float32(rng.NormFloat64()*math.Exp(3*rng.NormFloat64())))
	}
	src = src[:len(src)&^7]
	got := make([]byte, len(src))
	for n, scale := range []float32{1, 0.5, 3, 1e-30, 7e30, 1, 0.25} {
		if n < 5 {
			storeFP8AVX2(&got[0], &src[0], len(src), scale)
		} else {
			storeFP8AVX2NT(&got[0], &src[0], len(src), scale)
			sfence()
		}
		for i, v := range src {
			if want := chunk.F32ToFP8E4M3(v / scale); got[i] != want {
				t.Fatalf("scale %v: %#08x (%g): simd %#02x, chunk %#02x", scale, math.Float32bits(v), v, got[i], want)
			}
		}
	}
	if !hasAVX512() {
		return
	}
	src = src[:len(src)&^63]
	got = aligned(len(src))
	// The multiplying kernels get 1/scale only for powers of two, where
	// that is exact; the dividing ones any scale. 3 and 0.375 are not
	// powers of two.
	for _, s := range []float32{3, 0.375, 0, float32(math.Inf(1))} {
		if _, ok := exactRecip(s); ok {
			t.Fatalf("exactRecip(%v) claims an exact reciprocal", s)
		}
	}
	for _, c := range []struct {
		scale   float32
		mul, nt bool
	}{{1, true, false}, {1, true, true}, {0.5, true, true}, {0x1p-100, true, false}, {0x1p100, true, true},
		{1, false, false}, {0.5, false, false}, {3, false, true}, {1e-30, false, false}, {7e30, false, true}, {0.375, false, false}} {
		r, ok := exactRecip(c.scale)
		if c.mul && !ok {
			t.Fatalf("exactRecip(%v) = %v, %v", c.scale, r, ok)
		}
		switch {
		case c.scale == 1 && c.mul && c.nt:
			storeFP8AVX512NT(&got[0], &src[0], len(src), 1)
		case c.scale == 1 && c.mul:
			storeFP8AVX512(&got[0], &src[0], len(src), 1)
		case c.mul && c.nt:
			storeFP8MulAVX512NT(&got[0], &src[0], len(src), r)
		case c.mul:
			storeFP8MulAVX512(&got[0], &src[0], len(src), r)
		case c.nt:
			storeFP8DivAVX512NT(&got[0], &src[0], len(src), c.scale)
		default:
			storeFP8DivAVX512(&got[0], &src[0], len(src), c.scale)
		}
		sfence()
		for i, v := range src {
			if want := chunk.F32ToFP8E4M3(v / c.scale); got[i] != want {
				t.Fatalf("avx512 %+v: %#08x (%g): simd %#02x, chunk %#02x", c, math.Float32bits(v), v, got[i], want)
			}
		}
	}
}

// TestStoreFP8AVX512Exhaustive: every float32 whose low 8 bits are 0 or 1
// (so every sign, exponent and top 15 mantissa bits, with and without a
// sticky bit below them: every case of e4m3's rounding), through the
// AVX-512 store, against chunk.F32ToFP8E4M3.
func TestStoreFP8AVX512Exhaustive(t *testing.T) {
	if !hasAVX512() {
		t.Skip("no AVX-512 kernels on this machine")
	}
	if testing.Short() {
		t.Skip("exhaustive")
	}
	const n = 1 << 16
	src := make([]float32, n)
	got := make([]byte, n)
	for _, low := range []uint32{0, 1} {
		for hi := uint32(0); hi < 1<<24; hi += n {
			for i := range src {
				src[i] = math.Float32frombits((hi+uint32(i))<<8 | low)
			}
			if hi&(1<<20) == 0 { // both forms of scale 1, alternately
				storeFP8AVX512(&got[0], &src[0], n, 1)
			} else {
				storeFP8MulAVX512(&got[0], &src[0], n, 1)
			}
			for i, v := range src {
				if want := chunk.F32ToFP8E4M3(v); got[i] != want {
					t.Fatalf("%#08x (%g): simd %#02x, chunk %#02x", math.Float32bits(v), v, got[i], want)
				}
			}
		}
	}
}

// TestConvertSIMDMatchesGo: the vector widen and narrow kernels give the
// bits of the Go loops for every 16-bit and 8-bit pattern and for random
// float32 (NaN, Inf, subnormals included).
func TestConvertSIMDMatchesGo(t *testing.T) {
	if !hasSIMD() {
		t.Skip("no SIMD kernels on this machine")
	}
	same := func(a, b float32) bool {
		return math.Float32bits(a) == math.Float32bits(b) || (a != a && b != b)
	}
	// Widen: all patterns.
	for _, dt := range []chunk.DType{chunk.BF16, chunk.F16, chunk.FP8E4M3} {
		n := 1 << (8 * dt.Size())
		src := make([]byte, n*dt.Size())
		for i := 0; i < n; i++ {
			if dt.Size() == 2 {
				src[2*i], src[2*i+1] = byte(i), byte(i>>8)
			} else {
				src[i] = byte(i)
			}
		}
		for _, scale := range []float32{1, 0.375} {
			got := make([]float32, n)
			widen := map[chunk.DType]func(){
				chunk.BF16:    func() { widenBF16AVX2(&got[0], &src[0], n) },
				chunk.F16:     func() { widenF16AVX2(&got[0], &src[0], n) },
				chunk.FP8E4M3: func() { widenFP8AVX2(&got[0], &src[0], n, scale) },
			}
			widen[dt]()
			if hasAVX512() && scale != 1 {
				// The AVX-512 forms, on the second pass.
				switch dt {
				case chunk.BF16:
					widenBF16AVX512(&got[0], &src[0], n)
				case chunk.F16:
					widenF16AVX512(&got[0], &src[0], n)
				case chunk.FP8E4M3:
					widenFP8AVX512(&got[0], &src[0], n, scale)
				}
			}
			for i := 0; i < n; i++ {
				var want float32
				switch dt {
				case chunk.BF16:
					want = chunk.BF16ToF32(uint16(i))
				case chunk.F16:
					want = chunk.F16ToF32(uint16(i))
				case chunk.FP8E4M3:
					want = chunk.FP8E4M3ToF32(uint8(i)) * scale
				}
				if !same(got[i], want) {
					t.Fatalf("widen %v %#x (scale %v): simd %v, go %v", dt, i, scale, got[i], want)
				}
			}
		}
	}
	// Narrow: random bits and ordinary values.
	rng := rand.New(rand.NewPCG(27, 28))
	src := make([]float32, 1<<16)
	for i := range src {
		if i%2 == 0 {
			src[i] = math.Float32frombits(rng.Uint32())
		} else {
			src[i] = float32(rng.NormFloat64() * math.Exp(4*rng.NormFloat64()))
		}
	}
	for i := 0; i < len(src); i += 7 { // subnormals, for the fix-up of the BF16 kernels
		src[i] = math.Float32frombits(rng.Uint32() & 0x807fffff)
	}
	got := aligned(2 * len(src))
	narrowers := []func(){func() { narrowBF16AVX2(&got[0], &src[0], len(src)) }}
	if hasAVX512BF16() {
		narrowers = append(narrowers, func() { narrowBF16AVX512BF16(&got[0], &src[0], len(src)) },
			func() { narrowBF16AVX512BF16NT(&got[0], &src[0], len(src)); sfence() })
	}
	for k, narrow := range narrowers {
		clear(got)
		narrow()
		for i, v := range src {
			if w := chunk.F32ToBF16(v); uint16(got[2*i])|uint16(got[2*i+1])<<8 != w {
				t.Fatalf("narrow bf16 (kernel %d) %#08x: simd %#04x, go %#04x", k, math.Float32bits(v), uint16(got[2*i])|uint16(got[2*i+1])<<8, w)
			}
		}
	}
	narrowF16AVX2(&got[0], &src[0], len(src))
	for i, v := range src {
		if w := chunk.F32ToF16(v); uint16(got[2*i])|uint16(got[2*i+1])<<8 != w {
			t.Fatalf("narrow f16 %#08x: simd %#04x, go %#04x", math.Float32bits(v), uint16(got[2*i])|uint16(got[2*i+1])<<8, w)
		}
	}
}
