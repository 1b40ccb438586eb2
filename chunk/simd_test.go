package chunk

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"
)

// The AVX2 kernels must write the bits of the Go loops (their reference)
// on every input the decoders give them. These tests run the dispatching
// functions, which use the kernels on whole multiples of 8 (merge: 16)
// elements and Go on the tail, against the Go loops alone, at every length
// up to a few vectors (so every tail), on random codes and parameters
// drawn as 16-bit dtype bits (subnormal, zero, negative zero and huge
// ones included) that the fast paths admit. FuzzSIMDKernels does the same
// on the fuzzer's bytes.

func requireAVX2(t testing.TB) {
	if !useAVX2 {
		t.Skip("no AVX2 kernels on this CPU or build: the Go loops are all there is")
	}
}

var simdDTypes = []DType{BF16, F16}

// dtypeValue is the float32 value of 16-bit dtype bits.
func dtypeValue(dt DType, u uint16) float32 {
	if dt == F16 {
		return F16ToF32(u)
	}
	return BF16ToF32(u)
}

// int8Params draws a zero and scale of dt (any sign of zero, any scale
// magnitude) that fastParams admits.
func int8Params(rng *rand.Rand, dt DType) (z, s float32) {
	c := quantCodec{dt: dt, kind: quantInt8}
	for {
		zu, su := uint16(rng.Uint32()), uint16(rng.Uint32())&0x7fff
		if rng.IntN(8) == 0 {
			su &= 0x03ff // subnormal or small
		}
		zero, scale := float64(dtypeValue(dt, zu)), float64(dtypeValue(dt, su))
		if zero != zero || scale != scale || zero > maxFinite(dt) || zero < -maxFinite(dt) || scale > maxFinite(dt) {
			continue
		}
		if z, s, ok := c.fastParams(zero, scale); ok {
			return z, s
		}
	}
}

// fp8Scale draws a scale of dt that fp8Fast admits.
func fp8Scale(rng *rand.Rand, dt DType) float32 {
	c := quantCodec{dt: dt, kind: quantFP8}
	for {
		su := uint16(rng.Uint32()) & 0x7fff
		if rng.IntN(4) == 0 {
			su &= 0x03ff
		}
		if s, ok := c.fp8Fast(float64(dtypeValue(dt, su))); ok {
			return s
		}
	}
}

// fp8Codes fills q with random e4m3 codes other than NaN.
func fp8Codes(rng *rand.Rand, q []byte) {
	for i := range q {
		b := byte(rng.Uint32())
		if b&0x7f == 0x7f {
			b &^= 1
		}
		q[i] = b
	}
}

func fp8LUT() *[256]float32 {
	var lut [256]float32
	for i := range lut {
		lut[i] = FP8E4M3ToF32(uint8(i))
	}
	return &lut
}

const simdMaxLen = 70

func TestSIMDInt8(t *testing.T) {
	requireAVX2(t)
	rng := rand.New(rand.NewPCG(31, 1))
	for _, dt := range simdDTypes {
		c := quantCodec{dt: dt, kind: quantInt8}
		for n := 0; n <= simdMaxLen; n++ {
			for range 20 {
				q := make([]byte, n)
				for i := range q {
					q[i] = byte(rng.Uint32())
				}
				zero, scale := make([]float32, n), make([]float32, n)
				for i := range zero {
					zero[i], scale[i] = int8Params(rng, dt)
				}
				got, want := make([]byte, 2*n), make([]byte, 2*n)
				c.dequantRow(got, q, zero, scale)
				dequantRowGo(want, q, zero, scale, dt)
				if !bytes.Equal(got, want) {
					t.Fatalf("%v row of %d: got %x, want %x (codes %x zero %v scale %v)", dt, n, got, want, q, zero, scale)
				}
				z, s := int8Params(rng, dt)
				int8Group(got, q, z, s, dt)
				int8GroupGo(want, q, z, s, dt)
				if !bytes.Equal(got, want) {
					t.Fatalf("%v group of %d: got %x, want %x (codes %x zero %v scale %v)", dt, n, got, want, q, z, s)
				}
			}
		}
	}
}

func TestSIMDFP8(t *testing.T) {
	requireAVX2(t)
	rng := rand.New(rand.NewPCG(31, 2))
	lut := fp8LUT()
	for _, dt := range simdDTypes {
		for n := 0; n <= simdMaxLen; n++ {
			for range 20 {
				q := make([]byte, n)
				fp8Codes(rng, q)
				scale := make([]float32, n)
				for i := range scale {
					scale[i] = fp8Scale(rng, dt)
				}
				got, want := make([]byte, 2*n), make([]byte, 2*n)
				if err := fp8Row(got, q, lut, scale, dt); err != nil {
					t.Fatal(err)
				}
				fp8RowGo(want, q, lut, scale, dt)
				if !bytes.Equal(got, want) {
					t.Fatalf("%v row of %d: got %x, want %x (codes %x scale %v)", dt, n, got, want, q, scale)
				}
				s := fp8Scale(rng, dt)
				if err := fp8Group(got, q, lut, s, dt); err != nil {
					t.Fatal(err)
				}
				fp8GroupGo(want, q, lut, s, dt)
				if !bytes.Equal(got, want) {
					t.Fatalf("%v group of %d: got %x, want %x (codes %x scale %v)", dt, n, got, want, q, s)
				}
				if n == 0 {
					continue
				}
				// A NaN code anywhere, in the kernel's part or the tail, is
				// ErrCorrupt.
				q[rng.IntN(n)] = 0x7f | byte(rng.IntN(2))<<7
				if err := fp8Row(got, q, lut, scale, dt); !errors.Is(err, ErrCorrupt) {
					t.Fatalf("%v row of %d with a NaN code (%x): %v", dt, n, q, err)
				}
				if err := fp8Group(got, q, lut, s, dt); !errors.Is(err, ErrCorrupt) {
					t.Fatalf("%v group of %d with a NaN code (%x): %v", dt, n, q, err)
				}
			}
		}
	}
}

// TestSIMDFP8EveryCode checks each of the 254 non-NaN codes at its own
// position in a vector, with scale 1 and with small scales.
func TestSIMDFP8EveryCode(t *testing.T) {
	requireAVX2(t)
	lut := fp8LUT()
	var q []byte
	for b := range 256 {
		if b&0x7f != 0x7f {
			q = append(q, byte(b))
		}
	}
	for _, dt := range simdDTypes {
		for _, su := range []uint16{0x3c00, 0x0001, 0x0400, 0x0000, 0x1234} {
			if dt == BF16 {
				su = F32ToBF16(F16ToF32(su))
			}
			s := dtypeValue(dt, su)
			got, want := make([]byte, 2*len(q)), make([]byte, 2*len(q))
			if err := fp8Group(got, q, lut, s, dt); err != nil {
				t.Fatal(err)
			}
			fp8GroupGo(want, q, lut, s, dt)
			if !bytes.Equal(got, want) {
				t.Fatalf("%v scale %v: got %x, want %x", dt, s, got, want)
			}
		}
	}
}

func TestSIMDMerge(t *testing.T) {
	requireAVX2(t)
	rng := rand.New(rand.NewPCG(31, 3))
	for _, dt := range simdDTypes {
		for n := 0; n <= 3*simdMaxLen; n++ {
			var planes [4][]byte
			for p := range 2 {
				planes[p] = make([]byte, n)
				for i := range planes[p] {
					planes[p][i] = byte(rng.Uint32())
				}
			}
			got, want := make([]byte, 2*n), make([]byte, 2*n)
			merge(got, &planes, dt)
			mergeGo(want, &planes, dt)
			if !bytes.Equal(got, want) {
				t.Fatalf("%v merge of %d: got %x, want %x", dt, n, got, want)
			}
		}
	}
}

// FuzzSIMDKernels compares the kernels with the Go loops on the fuzzer's
// bytes: the first byte picks the dtype, the next four a group's zero and
// scale (kept only where the fast paths admit them), the rest are the
// codes, also read as two byte planes for merge, as the three planes of
// the f16 exponent layout, and as per-channel parameters for the row
// kernels.
func FuzzSIMDKernels(f *testing.F) {
	rng := rand.New(rand.NewPCG(31, 4))
	for _, n := range []int{0, 5, 8, 17, 64, 130} {
		b := make([]byte, 5+n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		f.Add(b)
	}
	lut := fp8LUT()
	f.Fuzz(func(t *testing.T, data []byte) {
		requireAVX2(t)
		if len(data) < 5 {
			return
		}
		dt := simdDTypes[data[0]&1]
		zero := float64(dtypeValue(dt, binary.LittleEndian.Uint16(data[1:])))
		scale := float64(dtypeValue(dt, binary.LittleEndian.Uint16(data[3:])))
		q := data[5:]
		n := len(q)
		got, want := make([]byte, 2*n), make([]byte, 2*n)
		check := func(what string) {
			t.Helper()
			if !bytes.Equal(got, want) {
				t.Fatalf("%v %s of %d: got %x, want %x (data %x)", dt, what, n, got, want, data)
			}
		}
		ic := quantCodec{dt: dt, kind: quantInt8}
		okParams := scale >= 0 && zero == zero && zero <= maxFinite(dt) && zero >= -maxFinite(dt) && scale <= maxFinite(dt)
		if z, s, ok := ic.fastParams(zero, scale); okParams && ok {
			int8Group(got, q, z, s, dt)
			int8GroupGo(want, q, z, s, dt)
			check("int8 group")
			zs, ss := make([]float32, n), make([]float32, n)
			for i := range zs {
				// Per-channel scales from the codes: s * 2^-k.
				zs[i], ss[i] = z, s/float32(uint32(1)<<(q[i]&7))
			}
			ic.dequantRow(got, q, zs, ss)
			dequantRowGo(want, q, zs, ss, dt)
			check("int8 row")
		}
		fc := quantCodec{dt: dt, kind: quantFP8}
		if s, ok := fc.fp8Fast(scale); ok && scale >= 0 {
			errGot := fp8Group(got, q, lut, s, dt)
			errWant := fp8Check(q)
			if (errGot == nil) != (errWant == nil) {
				t.Fatalf("%v fp8 group NaN check: %v, want %v (codes %x)", dt, errGot, errWant, q)
			}
			if errWant == nil {
				fp8GroupGo(want, q, lut, s, dt)
				check("fp8 group")
				ss := make([]float32, n)
				for i := range ss {
					ss[i] = s / float32(uint32(1)<<(q[i]&7))
				}
				if err := fp8Row(got, q, lut, ss, dt); err != nil {
					t.Fatal(err)
				}
				fp8RowGo(want, q, lut, ss, dt)
				check("fp8 row")
			}
		}
		planes := [4][]byte{q[:n/2], q[n/2 : 2*(n/2)]}
		got, want = got[:2*(n/2)], want[:2*(n/2)]
		merge(got, &planes, dt)
		mergeGo(want, &planes, dt)
		check("merge")
		// The f16 exponent layout's planes: m exponents, m low bytes and
		// the bits, from the codes (exponents over 31 and bits past the
		// end included, which both must report).
		m := 16 * n / 38
		for m > 0 && 2*m+f16BitsBytes(m) > n {
			m--
		}
		got, want = got[:2*m], want[:2*m]
		okGot := mergeF16Exp(got, q[:m], q[m:2*m], q[2*m:])
		okWant := mergeF16ExpGo(want, q[:m], q[m:2*m], q[2*m:])
		if okGot != okWant {
			t.Fatalf("f16 exponent merge of %d: ok %v, want %v (data %x)", m, okGot, okWant, data)
		}
		check("f16 exponent merge")
	})
}
