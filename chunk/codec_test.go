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

var allCodecs = []Codec{CodecRaw, CodecLossless, CodecInt8, CodecInt4, CodecFP8}

var kvDTypes = []DType{F32, F16, BF16}

// codecShapes cover partial token and dim groups, odd element counts (int4
// padding), single tokens, and halves longer than one lossless block.
var codecShapes = []struct{ tokens, layers, heads, dim int }{
	{1, 1, 1, 2},
	{7, 3, 3, 5},
	{64, 2, 2, 64},
	{65, 2, 4, 130},
	{130, 1, 8, 72}, // 74880 elements per half: two lossless blocks
}

func TestCodecRoundTrip(t *testing.T) {
	for _, c := range allCodecs {
		for _, dt := range kvDTypes {
			for _, s := range codecShapes {
				name := fmt.Sprintf("%v/%v/%dx%dx%dx%d", c, dt, s.tokens, s.layers, s.heads, s.dim)
				t.Run(name, func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(s.tokens), uint64(c)<<8|uint64(dt)))
					e := synthEntry(rng, dt, s.tokens, s.layers, s.heads, s.dim)
					checkRoundTrip(t, e, c)
				})
			}
		}
	}
}

func checkRoundTrip(t *testing.T, e *Entry, c Codec) {
	t.Helper()
	blob, err := Encode(nil, e, c)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(blob, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Key != e.Key || got.DType != e.DType || !equalTokens(got.Tokens, e.Tokens) {
		t.Fatal("header round trip differs")
	}
	if !c.Lossy() {
		if !bytes.Equal(got.KV, e.KV) {
			t.Fatal("lossless round trip is not bit-exact")
		}
		return
	}
	sh := e.Shape()
	lb := sh.LayerBytes()
	n := lb / sh.DType.Size()
	var maxErr float64
	for l := 0; l < sh.Layers; l++ {
		raw, dec := e.KV[l*lb:(l+1)*lb], got.KV[l*lb:(l+1)*lb]
		bounds := lossyBounds(c, raw, sh)
		for i := 0; i < n; i++ {
			x, y := elemF64(raw, i, sh.DType), elemF64(dec, i, sh.DType)
			if b := bounds[i]; !(math.Abs(y-x) <= b) {
				t.Fatalf("layer %d element %d: decoded %v, want %v within %v", l, i, y, x, b)
			}
			maxErr = max(maxErr, math.Abs(y-x))
		}
	}
	if maxErr == 0 && c == CodecInt4 && sh.Tokens > 2 && sh.HeadDim > 2 { // smaller groups hold only their min and max
		t.Fatal("int4 decoded every element exactly: the codec is not quantizing")
	}
}

func equalTokens(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Lossless codecs keep every bit pattern: NaN payloads, infinities,
// subnormals, negative zero, and random bytes.
func TestLosslessArbitraryBits(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, dt := range kvDTypes {
		for _, fill := range []string{"random", "specials", "constant", "zero"} {
			t.Run(fmt.Sprintf("%v/%s", dt, fill), func(t *testing.T) {
				e := testEntry(rng, dt, 70, 2, 8, 64)
				switch fill {
				case "specials":
					var pats []uint32
					if dt == F32 {
						pats = []uint32{0x7fc00001, 0xff800000, 0x7f800000, 0x00000001, 0x80000000, 0x807fffff}
					} else {
						pats = []uint32{0x7e01, 0xfc00, 0x7c00, 0x0001, 0x8000, 0x83ff, 0x7f81, 0xff80}
					}
					for i := 0; i < len(e.KV); i += dt.Size() {
						p := pats[rng.IntN(len(pats))]
						if dt == F32 {
							binary.LittleEndian.PutUint32(e.KV[i:], p)
						} else {
							binary.LittleEndian.PutUint16(e.KV[i:], uint16(p))
						}
					}
				case "constant":
					for i := range e.KV {
						e.KV[i] = 0x3f
					}
				case "zero":
					clear(e.KV)
				}
				checkRoundTrip(t, e, CodecLossless)
			})
		}
	}
}

// Lossy codecs refuse non-finite values rather than quantize garbage, and
// keep exact constant groups exact.
func TestLossyInputs(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, c := range []Codec{CodecInt8, CodecInt4, CodecFP8} {
		for _, dt := range kvDTypes {
			t.Run(fmt.Sprintf("%v/%v", c, dt), func(t *testing.T) {
				e := synthEntry(rng, dt, 9, 2, 2, 8)
				lb := e.LayerBytes()
				for _, at := range []int{0, lb/2 + 3*dt.Size(), lb + 5*dt.Size()} { // a key, a value, layer 1
					bad := *e
					bad.KV = bytes.Clone(e.KV)
					if dt == F32 {
						binary.LittleEndian.PutUint32(bad.KV[at:], 0x7f800000)
					} else {
						binary.LittleEndian.PutUint16(bad.KV[at:], map[DType]uint16{F16: 0x7e00, BF16: 0x7fc0}[dt])
					}
					if _, err := Encode(nil, &bad, c); !errors.Is(err, ErrInvalidEntry) {
						t.Fatalf("non-finite at %d: %v, want ErrInvalidEntry", at, err)
					}
				}
				// Constant and zero groups decode exactly.
				for _, v := range []float32{0, -1.5, 3} {
					ce := *e
					ce.KV = make([]byte, len(e.KV))
					for i := 0; i < len(ce.KV); i += dt.Size() {
						switch dt {
						case F32:
							binary.LittleEndian.PutUint32(ce.KV[i:], math.Float32bits(v))
						case F16:
							binary.LittleEndian.PutUint16(ce.KV[i:], F32ToF16(v))
						case BF16:
							binary.LittleEndian.PutUint16(ce.KV[i:], F32ToBF16(v))
						}
					}
					blob, err := Encode(nil, &ce, c)
					if err != nil {
						t.Fatal(err)
					}
					got, err := Decode(blob, Limits{})
					if err != nil {
						t.Fatal(err)
					}
					for i := 0; i < len(got.KV); i += dt.Size() {
						if y := elemF64(got.KV, i/dt.Size(), dt); y != float64(v) {
							t.Fatalf("constant %v decoded as %v", v, y)
						}
					}
				}
			})
		}
	}
}

// A range read of every codec equals the same slice of a full decode.
func TestCodecRangeRead(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	ranges := []Range{{}, {LayerLo: 1, LayerHi: 3}, {HeadLo: 1, HeadHi: 3}, {LayerLo: 2, LayerHi: 3, HeadLo: 3, HeadHi: 4}, {LayerLo: 0, LayerHi: 1, HeadLo: 0, HeadHi: 1}}
	for _, c := range allCodecs {
		for _, dt := range kvDTypes {
			e := synthEntry(rng, dt, 67, 3, 4, 66) // partial K and V groups
			blob, err := Encode(nil, e, c)
			if err != nil {
				t.Fatal(err)
			}
			full, err := Decode(blob, Limits{})
			if err != nil {
				t.Fatal(err)
			}
			hd, err := ParseHeader(blob, Limits{})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range ranges {
				rr, err := r.Resolve(hd.Shape)
				if err != nil {
					t.Fatal(err)
				}
				dst := make([]byte, rr.RangeBytes(hd.Shape))
				scratches := [][]byte{nil}
				if r.HeadHi != 0 { // a head range decodes through scratch
					scratches = append(scratches, make([]byte, hd.Shape.LayerBytes()))
				}
				for _, scratch := range scratches {
					if err := DecodeRange(dst, blob, &hd, r, scratch); err != nil {
						t.Fatalf("%v %v %+v: %v", c, dt, r, err)
					}
					if want := sliceRange(full.KV, hd.Shape, rr); !bytes.Equal(dst, want) {
						t.Fatalf("%v %v %+v: range read differs from full decode", c, dt, r)
					}
				}
			}
		}
	}
}

// sliceRange cuts r out of a canonical tensor, independently of copyHeads.
func sliceRange(kv []byte, sh Shape, r Range) []byte {
	row := sh.HeadDim * sh.DType.Size()
	var out []byte
	for l := r.LayerLo; l < r.LayerHi; l++ {
		for kvi := 0; kvi < 2; kvi++ {
			for t := 0; t < sh.Tokens; t++ {
				for h := r.HeadLo; h < r.HeadHi; h++ {
					off := (((l*2+kvi)*sh.Tokens+t)*sh.KVHeads + h) * row
					out = append(out, kv[off:off+row]...)
				}
			}
		}
	}
	return out
}

// Every byte flip and truncation of every codec's blob is detected, and the
// error wraps ErrCorrupt (or ErrTooLarge / ErrUnsupported for header fields
// that claim more than the limits or an unknown codec).
func TestCodecCorruption(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, c := range allCodecs {
		e := synthEntry(rng, BF16, 9, 2, 2, 8)
		blob, err := Encode(nil, e, c)
		if err != nil {
			t.Fatal(err)
		}
		typed := func(err error) bool {
			return errors.Is(err, ErrCorrupt) || errors.Is(err, ErrTooLarge) || errors.Is(err, ErrUnsupported)
		}
		for i := range blob {
			bad := bytes.Clone(blob)
			bad[i] ^= 1 << (i % 8)
			if _, err := Decode(bad, Limits{}); !typed(err) {
				t.Fatalf("%v: flip at byte %d: %v", c, i, err)
			}
			if _, err := Verify(bad, Limits{}); !typed(err) {
				t.Fatalf("%v: verify missed flip at byte %d: %v", c, i, err)
			}
		}
		for n := 0; n < len(blob); n++ {
			if _, err := Decode(blob[:n], Limits{}); !typed(err) {
				t.Fatalf("%v: truncation to %d: %v", c, n, err)
			}
		}
	}
}

// The codec decoders themselves (behind the checksums) reject damaged
// layers with ErrCorrupt and never panic; resealed blobs reach them.
func TestCodecDecoderRejects(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, c := range allCodecs[1:] {
		for _, dt := range kvDTypes {
			e := synthEntry(rng, dt, 33, 1, 2, 16)
			blob, err := Encode(nil, e, c)
			if err != nil {
				t.Fatal(err)
			}
			hd, _ := ParseHeader(blob, Limits{})
			payload := blob[hd.PayloadStart:]
			lc, _ := c.impl(dt)
			dst := make([]byte, hd.Shape.LayerBytes())
			for _, n := range []int{0, 1, 5, len(payload) / 2, len(payload) - 1} {
				if err := lc.decode(dst, payload[:n], hd.Shape); !errors.Is(err, ErrCorrupt) {
					t.Fatalf("%v %v: truncated layer of %d bytes: %v", c, dt, n, err)
				}
			}
			if err := lc.decode(dst, append(bytes.Clone(payload), 0), hd.Shape); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("%v %v: trailing byte: %v", c, dt, err)
			}
			for i := 0; i < len(payload); i += 1 + len(payload)/300 {
				bad := bytes.Clone(payload)
				bad[i] ^= byte(rng.UintN(255) + 1)
				if err := lc.decode(dst, bad, hd.Shape); err != nil && !errors.Is(err, ErrCorrupt) {
					t.Fatalf("%v %v: flip at %d: untyped error %v", c, dt, i, err)
				}
			}
		}
	}
}

func TestParseCodec(t *testing.T) {
	for _, c := range allCodecs {
		got, err := ParseCodec(c.String())
		if err != nil || got != c {
			t.Fatalf("ParseCodec(%q) = %v, %v", c.String(), got, err)
		}
	}
	if _, err := ParseCodec("zstd"); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("unknown codec: %v", err)
	}
	if _, err := CodecLossless.impl(FP8E4M3); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("lossless fp8: %v", err)
	}
}

// Decoding allocates only the output and the header's token list; the
// codecs take their working memory from pools.
func TestDecodeRangeAllocs(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	for _, c := range allCodecs {
		e := synthEntry(rng, BF16, 64, 4, 4, 64)
		blob, err := Encode(nil, e, c)
		if err != nil {
			t.Fatal(err)
		}
		hd, err := ParseHeader(blob, Limits{})
		if err != nil {
			t.Fatal(err)
		}
		dst := make([]byte, hd.Shape.RawBytes())
		allocs := testing.AllocsPerRun(20, func() {
			if err := DecodeRange(dst, blob, &hd, Range{}, nil); err != nil {
				t.Fatal(err)
			}
		})
		t.Logf("%v: %v allocs per DecodeRange", c, allocs)
		// A handful per layer at most (huff0's Decoder handle), never per
		// token or per element.
		if allocs > float64(2*hd.Shape.Layers*4) {
			t.Errorf("%v: %v allocations per DecodeRange of %d layers", c, allocs, hd.Shape.Layers)
		}
	}
}

// Encoders and decoders share pooled scratch; concurrent use must neither
// race nor mix up buffers.
func TestCodecConcurrent(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	type job struct {
		blob []byte
		want []byte
	}
	var jobs []job
	for _, c := range allCodecs {
		for _, dt := range kvDTypes {
			e := synthEntry(rng, dt, 40, 2, 2, 70)
			blob, err := Encode(nil, e, c)
			if err != nil {
				t.Fatal(err)
			}
			want, err := Decode(blob, Limits{})
			if err != nil {
				t.Fatal(err)
			}
			jobs = append(jobs, job{blob, want.KV})
		}
	}
	errs := make(chan error, 4)
	for w := 0; w < 4; w++ {
		go func() {
			for i := range jobs {
				j := jobs[(i+w*3)%len(jobs)]
				got, err := Decode(j.blob, Limits{})
				if err == nil && !bytes.Equal(got.KV, j.want) {
					err = errors.New("concurrent decode differs")
				}
				if err == nil {
					_, err = Encode(nil, got, Codec(j.blob[6]))
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for w := 0; w < 4; w++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// TestTranscode: raw and lossless entries move to the cluster codec (the
// same bytes whichever they came in), a lossy entry stays as it is, and an
// entry already in the cluster codec is returned unchanged.
func TestTranscode(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	e := synthEntry(rng, BF16, 9, 2, 2, 16)
	enc := func(c Codec) []byte {
		b, err := Encode(nil, e, c)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, from := range allCodecs {
		for _, to := range allCodecs {
			in := enc(from)
			got, err := Transcode(in, to, DefaultLimits)
			if err != nil {
				t.Fatalf("%v to %v: %v", from, to, err)
			}
			want := enc(to)
			if from.Lossy() || from == to {
				want = in
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%v to %v: stored as %v, want %v", from, to, Codec(got[6]), Codec(want[6]))
			}
			if from == to && &got[0] != &in[0] {
				t.Errorf("%v to itself copied the blob", from)
			}
		}
	}
	if got := StoredCodec(CodecRaw, CodecInvalid); got != CodecRaw {
		t.Errorf("no cluster codec: stored as %v, want raw", got)
	}
}
