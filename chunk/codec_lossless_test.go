package chunk

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
)

// f16Edges are f16 bit patterns a lossless codec must keep: ±0, the
// smallest and largest subnormals, the smallest normal, the largest
// finite, ±inf, quiet and signalling NaNs with payloads, and all ones.
var f16Edges = []uint16{
	0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x83ff, 0x0400, 0x8400, 0x3c00, 0x7bff, 0xfbff,
	0x7c00, 0xfc00, 0x7c01, 0x7d55, 0x7e00, 0xfe01, 0x7fff, 0xffff,
}

// f16Layer fills a layer of n f16 elements: random bits, edge values, or
// both mixed.
func f16Layer(rng *rand.Rand, n int, fill string) []byte {
	raw := make([]byte, 2*n)
	for i := 0; i < n; i++ {
		u := uint16(rng.Uint32())
		if fill == "edges" || (fill == "mixed" && rng.IntN(3) == 0) {
			u = f16Edges[rng.IntN(len(f16Edges))]
		}
		binary.LittleEndian.PutUint16(raw[2*i:], u)
	}
	return raw
}

// f16Lengths are element counts of a layer (even: a K and a V half): every
// tail of the 16-element groups and of the kernels, and halves of one
// block, a block and a bit, and several blocks.
func f16Lengths() []int {
	var ns []int
	for n := 2; n <= 200; n += 2 {
		ns = append(ns, n)
	}
	return append(ns, 2*huff4XMin, 2*huff4XMin+34, 2*losslessBlock, 2*(losslessBlock+17), 2*(2*losslessBlock+1000))
}

// Both f16 layouts decode to what was encoded, bit for bit: the exponent
// layout encoders write and the byte planes of the first layout, which
// entries written before it hold.
func TestLosslessF16Layouts(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 1))
	c := planeCodec{dt: F16}
	for _, l := range []planeLayout{layoutExp16, layoutBytes} {
		for _, fill := range []string{"random", "edges", "mixed", "synthetic"} {
			for _, n := range f16Lengths() {
				var raw []byte
				if fill == "synthetic" {
					if n%128 != 0 {
						continue
					}
					raw = synthEntry(rng, F16, n/128, 1, 1, 64).KV
				} else {
					raw = f16Layer(rng, n, fill)
				}
				enc, err := c.encodeLayout(nil, raw, l)
				if err != nil {
					t.Fatal(err)
				}
				if (enc[0] == layoutF16Exp) != (l == layoutExp16) {
					t.Fatalf("layout %d layer starts with %#x", l, enc[0])
				}
				got := make([]byte, len(raw))
				if err := c.decode(got, enc, Shape{}); err != nil {
					t.Fatalf("layout %d %s %d: %v", l, fill, n, err)
				}
				if !bytes.Equal(got, raw) {
					t.Fatalf("layout %d %s %d: not bit-exact", l, fill, n)
				}
			}
		}
	}
}

// Encoders write the exponent layout for f16 and no layout byte for the
// other dtypes, whose layers are as before it.
func TestLosslessLayoutByDType(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 2))
	for _, dt := range kvDTypes {
		e := synthEntry(rng, dt, 9, 2, 2, 16)
		blob, err := Encode(nil, e, CodecLossless)
		if err != nil {
			t.Fatal(err)
		}
		hd, err := ParseHeader(blob, Limits{})
		if err != nil {
			t.Fatal(err)
		}
		for l := range hd.Layers {
			p, err := hd.LayerPayload(blob, l)
			if err != nil {
				t.Fatal(err)
			}
			if (p[0] == layoutF16Exp) != (dt == F16) {
				t.Fatalf("%v layer %d starts with %#x", dt, l, p[0])
			}
		}
	}
}

// rawPlaneLayer is a lossless layer of planes stored raw, in order; tag
// prepends the exponent layout's byte.
func rawPlaneLayer(tag bool, planes ...[]byte) []byte {
	var enc []byte
	if tag {
		enc = append(enc, layoutF16Exp)
	}
	for _, p := range planes {
		enc = append(enc, planeRaw)
		enc = binary.LittleEndian.AppendUint32(enc, uint32(len(p)))
		enc = append(enc, p...)
	}
	return enc
}

// A layer no encoder writes is refused with ErrCorrupt: an exponent over
// 31 (in the kernel's part and in the tail), a bit set past a block's last
// element, a layout byte on a bf16 layer, a layout byte alone, planes of
// the wrong size.
func TestLosslessF16Corrupt(t *testing.T) {
	const m = 37 // elements per half: two whole groups of 16 and a tail of 5
	exp, lo, bits := make([]byte, m), make([]byte, m), make([]byte, f16BitsBytes(m))
	for i := range exp {
		exp[i], lo[i] = byte(i%31), byte(7*i)
	}
	half := func(exp, lo, bits []byte) [][]byte { return [][]byte{exp, lo, bits} }
	valid := append(half(exp, lo, bits), half(exp, lo, bits)...)
	c := planeCodec{dt: F16}
	dst := make([]byte, 4*m)
	if err := c.decode(dst, rawPlaneLayer(true, valid...), Shape{}); err != nil {
		t.Fatalf("valid layer: %v", err)
	}
	with := func(b []byte, i int, v byte) []byte {
		b = bytes.Clone(b)
		b[i] = v
		return b
	}
	cases := map[string][]byte{
		"exponent 32 in a whole group": rawPlaneLayer(true, append(half(exp, lo, bits), half(with(exp, 3, 32), lo, bits)...)...),
		"exponent 255 in the tail":     rawPlaneLayer(true, append(half(with(exp, m-1, 255), lo, bits), half(exp, lo, bits)...)...),
		"sign bit past the last":       rawPlaneLayer(true, append(half(exp, lo, with(bits, 12+1, 1<<5)), half(exp, lo, bits)...)...),
		"bit 8 past the last":          rawPlaneLayer(true, append(half(exp, lo, bits), half(exp, lo, with(bits, 17, 0x80))...)...),
		"short bits plane":             rawPlaneLayer(true, append(half(exp, lo, bits[:12]), half(exp, lo, bits)...)...),
		"layout byte alone":            {layoutF16Exp},
		"no layout byte":               rawPlaneLayer(false, valid...),
		"trailing byte":                append(rawPlaneLayer(true, valid...), 0),
	}
	for name, enc := range cases {
		if err := c.decode(dst, enc, Shape{}); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
	// The layout byte belongs to f16 alone.
	bf := planeCodec{dt: BF16}
	enc := rawPlaneLayer(true, exp, lo, exp, lo)
	if err := bf.decode(dst, enc, Shape{}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("bf16 layer with the f16 layout byte: %v, want ErrCorrupt", err)
	}
	if err := bf.decode(dst, enc[1:], Shape{}); err != nil {
		t.Errorf("bf16 layer without it: %v", err)
	}
}

// TestSIMDMergeF16Exp holds the exponent layout's merge to its Go loop at
// every length up to a few vectors, with exponents over 31 and bits past
// the end (which both must report) now and then.
func TestSIMDMergeF16Exp(t *testing.T) {
	requireAVX2(t)
	rng := rand.New(rand.NewPCG(41, 3))
	for n := 0; n <= 3*simdMaxLen; n++ {
		for trial := range 8 {
			exp, lo, bits := make([]byte, n), make([]byte, n), make([]byte, f16BitsBytes(n))
			for i := range exp {
				exp[i], lo[i] = byte(rng.IntN(32)), byte(rng.Uint32())
			}
			for i := range bits {
				bits[i] = byte(rng.Uint32())
			}
			if k := n % 16; k != 0 && trial%2 == 0 {
				// Clear the bits past the end, as encoders do.
				w := bits[len(bits)-6:]
				for j := 0; j < 3; j++ {
					u := binary.LittleEndian.Uint16(w[2*j:])
					binary.LittleEndian.PutUint16(w[2*j:], u&(1<<k-1))
				}
			}
			if n > 0 && trial == 3 {
				exp[rng.IntN(n)] |= byte(1) << (5 + rng.IntN(3))
			}
			got, want := make([]byte, 2*n), make([]byte, 2*n)
			okGot := mergeF16Exp(got, exp, lo, bits)
			okWant := mergeF16ExpGo(want, exp, lo, bits)
			if okGot != okWant || !bytes.Equal(got, want) {
				t.Fatalf("merge of %d: %v %x, want %v %x (exp %x lo %x bits %x)", n, okGot, got, okWant, want, exp, lo, bits)
			}
		}
	}
}

// f16V1Blob is e (f16) encoded with the lossless codec in the first f16
// layout, as entries written before the exponent layout are.
func f16V1Blob(e *Entry) ([]byte, error) {
	if e.DType != F16 {
		return nil, fmt.Errorf("%w: f16V1Blob of %v", ErrInvalidEntry, e.DType)
	}
	blob, err := Encode(nil, e, CodecLossless)
	if err != nil {
		return nil, err
	}
	hd, err := ParseHeader(blob, Limits{})
	if err != nil {
		return nil, err
	}
	out := bytes.Clone(blob[:hd.PayloadStart])
	lb := e.LayerBytes()
	for l := range hd.Layers {
		off := len(out) - hd.PayloadStart
		if out, err = (planeCodec{dt: F16}).encodeLayout(out, e.KV[l*lb:(l+1)*lb], layoutBytes); err != nil {
			return nil, err
		}
		ref := out[fixedHeaderBytes+layerRefBytes*l:]
		binary.LittleEndian.PutUint64(ref, uint64(off))
		binary.LittleEndian.PutUint64(ref[8:], uint64(len(out)-hd.PayloadStart-off))
	}
	return reseal(out), nil
}

// Entries in the first f16 layout decode, whole and by range, to what
// was encoded.
func TestLosslessF16FirstLayout(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 4))
	for _, s := range codecShapes {
		e := synthEntry(rng, F16, s.tokens, s.layers, s.heads, s.dim)
		blob, err := f16V1Blob(e)
		if err != nil {
			t.Fatal(err)
		}
		hd, err := ParseHeader(blob, Limits{})
		if err != nil {
			t.Fatal(err)
		}
		if p, _ := hd.LayerPayload(blob, 0); p[0] == layoutF16Exp {
			t.Fatal("f16V1Blob wrote the exponent layout")
		}
		got, err := Decode(blob, Limits{})
		if err != nil {
			t.Fatalf("%+v: %v", s, err)
		}
		if !bytes.Equal(got.KV, e.KV) {
			t.Fatalf("%+v: not bit-exact", s)
		}
		// Transcoding to the codec it is in keeps its bytes.
		if again, err := Transcode(blob, CodecLossless, Limits{}); err != nil || !bytes.Equal(again, blob) {
			t.Fatalf("%+v: transcode to lossless changed the blob (%v)", s, err)
		}
	}
}

// mergeF16ExpGo inverts splitF16Exp on every length and edge value on
// every CPU (the kernel test needs AVX2; this holds the Go loop, which
// other architectures run, to the split).
func TestMergeF16ExpGo(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 5))
	var planes [4][losslessBlock]byte
	for n := 0; n <= 3*simdMaxLen; n++ {
		raw := f16Layer(rng, n, "mixed")
		splitF16Exp(&planes, raw)
		got := make([]byte, 2*n)
		if !mergeF16ExpGo(got, planes[0][:n], planes[1][:n], planes[2][:f16BitsBytes(n)]) || !bytes.Equal(got, raw) {
			t.Fatalf("merge of split of %d elements: %x, want %x", n, got, raw)
		}
	}
}
