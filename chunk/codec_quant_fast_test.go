package chunk

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// paramBits returns a parameter value of dt as bits: mostly ordinary
// magnitudes, often the edges of the format (zero, subnormals, the largest
// finite values, Inf, NaN, negative scales) and arbitrary bit patterns.
func paramBits(rng *rand.Rand, dt DType) uint32 {
	var specials []uint32
	switch dt {
	case F32:
		specials = []uint32{0, 1, 0x007fffff, 0x00800000, 0x7f7fffff, 0x7f7ffffe, 0x7f800000, 0x7fc00000, 0x80000001, 0xff7fffff, 0xff800000, 0x3f800000, 0x7e800000, 0x7b000000}
	case F16:
		specials = []uint32{0, 1, 0x3ff, 0x400, 0x7bff, 0x7bfe, 0x7c00, 0x7e00, 0x8001, 0xfbff, 0xfc00, 0x3c00, 0x5800, 0x5bff, 0x0101}
	default:
		specials = []uint32{0, 1, 0x7f, 0x80, 0x7f7f, 0x7f7e, 0x7f80, 0x7fc0, 0x8001, 0xff7f, 0xff80, 0x3f80, 0x7e80, 0x7b00, 0x7c00, 0x0101}
	}
	switch rng.IntN(4) {
	case 0:
		return specials[rng.IntN(len(specials))]
	case 1:
		if dt == F32 {
			return rng.Uint32()
		}
		return rng.Uint32() & 0xffff
	}
	// A random finite magnitude across the whole exponent range.
	v := float32(math.Ldexp(rng.Float64()+0.5, rng.IntN(280)-150))
	if rng.IntN(3) == 0 {
		v = -v
	}
	switch dt {
	case F32:
		return math.Float32bits(v)
	case F16:
		return uint32(F32ToF16(v))
	}
	return uint32(F32ToBF16(v))
}

func putParam(p []byte, bits uint32, dt DType) {
	if dt == F32 {
		binary.LittleEndian.PutUint32(p, bits)
		return
	}
	binary.LittleEndian.PutUint16(p, uint16(bits))
}

// TestQuantDecodeMatchesReference holds the int8/int4 (and fp8) decoder
// bit-identical to the reference decoder (codec_quant_ref_test.go): the
// same bytes or the same error, on encoded layers and on layers whose group
// parameters and codes were overwritten with edge and random values.
func TestQuantDecodeMatchesReference(t *testing.T) {
	shapes := append([]struct{ tokens, layers, heads, dim int }{{3, 1, 1, 1}, {129, 1, 3, 65}, {66, 1, 1, 127}}, codecShapes...)
	for _, kind := range []quantKind{quantInt8, quantInt4, quantFP8} {
		for _, dt := range kvDTypes {
			for _, s := range shapes {
				t.Run(fmt.Sprintf("%v/%v/%dx%dx%d", kind, dt, s.tokens, s.heads, s.dim), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(s.tokens*1000+s.dim), uint64(kind)<<8|uint64(dt)))
					c := quantCodec{dt: dt, kind: kind}
					e := synthEntry(rng, dt, s.tokens, 1, s.heads, s.dim)
					sh := e.Shape()
					enc, err := c.encode(nil, e.KV, sh)
					if err != nil {
						t.Fatal(err)
					}
					g := geom(sh)
					kg, vg := g.groups()
					ps := kind.params() * dt.Size()
					cb := kind.codeBytes(g.elems())
					// Offsets and lengths in enc of the parameters and codes.
					params := [][2]int{{0, kg * ps}, {kg*ps + cb, vg * ps}}
					codes := [][2]int{{kg * ps, cb}, {kg*ps + cb + vg*ps, cb}}
					got, want := make([]byte, sh.LayerBytes()), make([]byte, sh.LayerBytes())
					for trial := 0; trial < 40; trial++ {
						mut := append([]byte(nil), enc...)
						if trial > 0 {
							// Overwrite a fraction of the parameters (the
							// first trial is the encoder's own output); in
							// half the trials only scales, keeping zeros
							// valid so that most layers decode.
							frac := []int{1, 4, 16}[trial%3]
							for _, pr := range params {
								off := pr[0]
								for gi := 0; gi < pr[1]/ps; gi++ {
									if rng.IntN(frac) != 0 {
										continue
									}
									for k := 0; k < kind.params(); k++ {
										if trial%2 == 0 && k == 0 && kind.params() == 2 {
											continue
										}
										putParam(mut[off+gi*ps+k*dt.Size():], paramBits(rng, dt), dt)
									}
								}
							}
							if trial%5 == 0 { // random codes too
								for _, cd := range codes {
									for i := 0; i < cd[1]; i++ {
										if rng.IntN(8) == 0 {
											mut[cd[0]+i] = byte(rng.Uint32())
										}
									}
								}
								if kind == quantInt4 && g.elems()&1 == 1 {
									mut[kg*ps+cb-1] &= 15
									mut[len(mut)-1] &= 15
								}
							}
						}
						clear(got)
						clear(want)
						gerr := c.decode(got, mut, sh)
						werr := c.decodeRef(want, mut, sh)
						if (gerr == nil) != (werr == nil) || (gerr != nil && !errors.Is(gerr, ErrCorrupt)) {
							t.Fatalf("trial %d: error %v, reference %v", trial, gerr, werr)
						}
						if gerr == nil && !bytes.Equal(got, want) {
							for i := range got {
								if got[i] != want[i] {
									t.Fatalf("trial %d: byte %d is %#x, reference %#x", trial, i, got[i], want[i])
								}
							}
						}
					}
				})
			}
		}
	}
}

// TestInt8FastParams checks the float32 int8 path against the reference
// formula for every code of random and edge groups of the 16-bit dtypes,
// and that it admits ordinary groups (so the fast path is the one taken).
func TestInt8FastParams(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	for _, dt := range []DType{F16, BF16} {
		c := quantCodec{dt: dt, kind: quantInt8}
		lim := maxFinite(dt)
		buf := make([]byte, 4)
		admitted := 0
		for n := 0; n < 200000; n++ {
			putParam(buf, paramBits(rng, dt), dt)
			putParam(buf[2:], paramBits(rng, dt)&0x7fff, dt) // scale >= 0
			zero, scale, err := c.loadParams(buf)
			if err != nil {
				continue
			}
			z, s, ok := c.fastParams(zero, scale)
			if !ok {
				continue
			}
			admitted++
			for b := 0; b < 256; b++ {
				ref := []float32{clampF32(zero+float64(b)*scale, lim)}
				want := make([]byte, 2)
				NarrowRow(want, ref, dt)
				v := z + float32(float32(b)*s)
				var got uint16
				if dt == BF16 {
					got = bf16Bits(v)
				} else {
					got = f16Bits(v)
				}
				if got != binary.LittleEndian.Uint16(want) {
					t.Fatalf("%v zero %v scale %v code %d: %#x, reference %#x", dt, zero, scale, b, got, binary.LittleEndian.Uint16(want))
				}
			}
		}
		if admitted < 20000 {
			t.Fatalf("%v: fast path admitted only %d groups", dt, admitted)
		}
		// A group spanning the whole range must take the reference path.
		if _, _, ok := c.fastParams(0, lim/100); ok {
			t.Fatalf("%v: fast path admitted a group that needs clamping", dt)
		}
	}
}

// TestF16Bits checks the inlined f16 rounding against F32ToF16 on every
// float32 exponent and random mantissas.
func TestF16Bits(t *testing.T) {
	rng := rand.New(rand.NewPCG(33, 34))
	for e := uint32(0); e < 255; e++ {
		for k := 0; k < 2000; k++ {
			u := e<<23 | rng.Uint32()&0x807fffff
			v := math.Float32frombits(u)
			if got, want := f16Bits(v), F32ToF16(v); got != want {
				t.Fatalf("%#x: %#x, want %#x", u, got, want)
			}
		}
	}
}

// TestCodecCheck holds Codec.check (the allocation-free validation that
// DecodeRange and ParseHeader use) to impl's answer for every codec and
// dtype byte.
func TestCodecCheck(t *testing.T) {
	for c := 0; c < 256; c++ {
		for dt := 0; dt < 256; dt++ {
			_, ierr := Codec(c).impl(DType(dt))
			cerr := Codec(c).check(DType(dt))
			if (ierr == nil) != (cerr == nil) || (cerr != nil && !errors.Is(cerr, ErrUnsupported)) {
				t.Fatalf("codec %d dtype %d: check %v, impl %v", c, dt, cerr, ierr)
			}
		}
	}
}

// TestDecodeRangeNoAllocs: decoding a layer range into a caller's dst (and a
// head subset with a caller's scratch) allocates nothing, for every codec.
func TestDecodeRangeNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items")
	}
	rng := rand.New(rand.NewPCG(35, 36))
	for _, c := range allCodecs {
		for _, dt := range kvDTypes {
			e := synthEntry(rng, dt, 70, 3, 2, 64)
			blob, err := Encode(nil, e, c)
			if err != nil {
				t.Fatal(err)
			}
			hd, err := ParseHeader(blob, Limits{})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range []Range{{LayerLo: 1, LayerHi: 2}, {LayerLo: 0, LayerHi: 3, HeadLo: 1, HeadHi: 2}} {
				if r, err = r.Resolve(hd.Shape); err != nil {
					t.Fatal(err)
				}
				dst := make([]byte, r.RangeBytes(hd.Shape))
				scratch := make([]byte, hd.Shape.LayerBytes())
				decode := func() {
					if err := DecodeRange(dst, blob, &hd, r, scratch); err != nil {
						t.Fatal(err)
					}
				}
				decode() // warm the scratch pools
				if n := testing.AllocsPerRun(20, decode); n > 0.5 {
					t.Errorf("%v/%v range %+v: %v allocations per DecodeRange", c, dt, r, n)
				}
			}
		}
	}
}
