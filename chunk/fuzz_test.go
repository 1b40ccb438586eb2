package chunk

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// fuzzLimits keep every decode small, so that a header that claims much
// must fail the limits rather than allocate.
var fuzzLimits = Limits{MaxBlobBytes: 1 << 20, MaxRawBytes: 1 << 18, MaxTokens: 300, MaxLayers: 8, MaxKVHeads: 8, MaxHeadDim: 160}

// fuzzSeeds are valid blobs of every codec and dtype, in shapes that reach
// partial groups and odd int4 counts, and f16 lossless blobs in the first
// f16 layout too.
func fuzzSeeds() [][]byte {
	rng := rand.New(rand.NewPCG(21, 22))
	var seeds [][]byte
	for _, c := range allCodecs {
		for _, dt := range kvDTypes {
			for _, s := range []struct{ tokens, layers, heads, dim int }{{3, 2, 1, 5}, {65, 1, 1, 3}, {2, 1, 1, 66}} {
				e := synthEntry(rng, dt, s.tokens, s.layers, s.heads, s.dim)
				blob, err := Encode(nil, e, c)
				if err != nil {
					panic(err)
				}
				seeds = append(seeds, blob)
				if c == CodecLossless && dt == F16 {
					// The first f16 layout, which stored entries hold.
					if blob, err = f16V1Blob(e); err != nil {
						panic(err)
					}
					seeds = append(seeds, blob)
				}
			}
		}
	}
	return seeds
}

// reseal recomputes the content ID and the layer and header checksums of a
// blob whose header parses structurally, so that the fuzzer's mutations of
// the tokens and payload reach the codec decoders instead of stopping at a
// checksum or the key check. It returns nil when the blob has no usable
// header.
func reseal(blob []byte) []byte {
	if len(blob) < fixedHeaderBytes {
		return nil
	}
	u32 := func(at int) uint64 { return uint64(binary.LittleEndian.Uint32(blob[at:])) }
	tokens, layers := u32(64), u32(68)
	if tokens > 1<<16 || layers > 1<<10 {
		return nil
	}
	headerLen := fixedHeaderBytes + layerRefBytes*int(layers) + 4*int(tokens) + 8
	if len(blob) < headerLen {
		return nil
	}
	b := append([]byte(nil), blob...)
	payload := b[headerLen:]
	binary.LittleEndian.PutUint64(b[80:], uint64(len(payload)))
	for l := 0; l < int(layers); l++ {
		ref := b[fixedHeaderBytes+layerRefBytes*l:]
		off, ln := binary.LittleEndian.Uint64(ref), binary.LittleEndian.Uint64(ref[8:])
		if off <= uint64(len(payload)) && ln <= uint64(len(payload))-off {
			binary.LittleEndian.PutUint64(ref[16:], xxhash.Sum64(payload[off:off+ln]))
		}
	}
	toks := make([]uint32, tokens)
	for i := range toks {
		toks[i] = binary.LittleEndian.Uint32(b[fixedHeaderBytes+layerRefBytes*int(layers)+4*i:])
	}
	putID(b[24:], ContentID(Fingerprint(getID(b[8:])), toks))
	sumAt := headerLen - 8
	binary.LittleEndian.PutUint64(b[sumAt:], xxhash.Sum64(b[:sumAt]))
	return b
}

func checkDecodeBlob(t *testing.T, blob []byte) {
	typed := func(err error) bool {
		return err == nil || errors.Is(err, ErrCorrupt) || errors.Is(err, ErrTooLarge) || errors.Is(err, ErrUnsupported)
	}
	e, err := Decode(blob, fuzzLimits)
	if !typed(err) {
		t.Fatalf("Decode: untyped error %v", err)
	}
	hd, verr := Verify(blob, fuzzLimits)
	if !typed(verr) {
		t.Fatalf("Verify: untyped error %v", verr)
	}
	if err == nil {
		if verr != nil {
			t.Fatalf("Decode accepted what Verify rejects: %v", verr)
		}
		if len(e.KV) != hd.Shape.RawBytes() || len(e.KV) > fuzzLimits.MaxRawBytes {
			t.Fatalf("decoded %d bytes for shape %+v", len(e.KV), hd.Shape)
		}
		// Only an entry its key names decodes.
		if err := CheckKey(e.Key, e.Tokens); err != nil || blob[41]|blob[42]|blob[43] != 0 {
			t.Fatalf("decoded an entry its key does not name: %v, reserved %x", err, blob[41:44])
		}
		// A decoded entry re-encodes bit-exactly with a lossless codec,
		// and a lossless blob decodes to the same entry again.
		if !hd.Codec.Lossy() {
			again, err := Encode(nil, e, hd.Codec)
			if err != nil {
				t.Fatalf("re-encode: %v", err)
			}
			e2, err := Decode(again, fuzzLimits)
			if err != nil || string(e2.KV) != string(e.KV) {
				t.Fatalf("re-encoded blob does not decode to the same entry: %v", err)
			}
		}
	}
	if verr == nil && hd.Codec.Lossy() {
		// The quantized decoders stay bit-identical to the reference
		// (codec_quant_ref_test.go), errors included.
		c := quantCodec{dt: hd.Shape.DType, kind: map[Codec]quantKind{CodecInt8: quantInt8, CodecInt4: quantInt4, CodecFP8: quantFP8}[hd.Codec]}
		got, want := make([]byte, hd.Shape.LayerBytes()), make([]byte, hd.Shape.LayerBytes())
		for l := range hd.Layers {
			p, err := hd.LayerPayload(blob, l)
			if err != nil {
				t.Fatal(err)
			}
			gerr, werr := c.decode(got, p, hd.Shape), c.decodeRef(want, p, hd.Shape)
			if (gerr == nil) != (werr == nil) || (gerr == nil && string(got) != string(want)) {
				t.Fatalf("layer %d: decoder (%v) differs from the reference (%v)", l, gerr, werr)
			}
		}
	}
	if verr == nil {
		// A head range goes through the scratch path of every codec.
		r := Range{LayerLo: hd.Shape.Layers - 1, LayerHi: hd.Shape.Layers, HeadLo: hd.Shape.KVHeads - 1, HeadHi: hd.Shape.KVHeads}
		dst := make([]byte, r.RangeBytes(hd.Shape))
		if err := DecodeRange(dst, blob, &hd, r, nil); !typed(err) {
			t.Fatalf("DecodeRange: untyped error %v", err)
		}
	}
}

// FuzzDecode feeds arbitrary blobs to Decode, Verify and DecodeRange with
// small Limits, both as given and resealed (checksums recomputed) so that
// mutated payloads reach the codec decoders.
func FuzzDecode(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s)
		f.Add(s[:len(s)/2])
		f.Add(s[:len(s)-1])
	}
	f.Fuzz(func(t *testing.T, blob []byte) {
		checkDecodeBlob(t, blob)
		if b := reseal(blob); b != nil {
			checkDecodeBlob(t, b)
		}
	})
}

// FuzzCodecRoundTrip encodes arbitrary bytes as a tensor with every codec:
// lossless codecs must return them bit for bit; lossy ones must either
// refuse (NaN/Inf) or decode within their bound.
func FuzzCodecRoundTrip(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8}, uint8(0), uint8(3))
	f.Add(make([]byte, 600), uint8(1), uint8(7))
	rng := rand.New(rand.NewPCG(23, 24))
	e := synthEntry(rng, BF16, 70, 1, 1, 8)
	f.Add(e.KV, uint8(2), uint8(8))
	f.Fuzz(func(t *testing.T, data []byte, dtSel, dimSel uint8) {
		dt := kvDTypes[int(dtSel)%len(kvDTypes)]
		dim := 1 + int(dimSel)%70
		tokens := len(data) / (2 * dim * dt.Size())
		if tokens == 0 || tokens > 200 {
			return
		}
		toks := make([]uint32, tokens)
		e := &Entry{Key: Key{Content: ContentID(Fingerprint{}, toks), Context: StandaloneContext()}, DType: dt, Layers: 1, KVHeads: 1, HeadDim: dim,
			Tokens: toks, KV: data[:2*tokens*dim*dt.Size()]}
		for _, c := range allCodecs {
			blob, err := Encode(nil, e, c)
			if err != nil {
				if c.Lossy() && errors.Is(err, ErrInvalidEntry) {
					continue // non-finite input
				}
				t.Fatalf("%v: %v", c, err)
			}
			got, err := Decode(blob, fuzzLimits)
			if err != nil {
				t.Fatalf("%v: %v", c, err)
			}
			if !c.Lossy() {
				if string(got.KV) != string(e.KV) {
					t.Fatalf("%v: not bit-exact", c)
				}
				continue
			}
			bounds := lossyBounds(c, e.KV, e.Shape())
			for i, b := range bounds {
				x, y := elemF64(e.KV, i, dt), elemF64(got.KV, i, dt)
				if !(y-x <= b && x-y <= b) {
					t.Fatalf("%v %v: element %d decoded %v, want %v within %v", c, dt, i, y, x, b)
				}
			}
		}
	})
}
