package chunk

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
)

func testEntry(rng *rand.Rand, dt DType, tokens, layers, heads, dim int) *Entry {
	spec := ModelSpec{Family: "llama", Layers: layers, KVHeads: heads, HeadDim: dim, DType: dt, RopeStyle: RopeNeoX, RopeTheta: 10000}
	fp := spec.Fingerprint()
	toks := make([]uint32, tokens)
	for i := range toks {
		toks[i] = rng.Uint32N(128000)
	}
	e := &Entry{Key: Key{Fingerprint: fp, Content: ContentID(fp, toks), Context: StandaloneContext()},
		DType: dt, Layers: layers, KVHeads: heads, HeadDim: dim, Tokens: toks}
	e.KV = make([]byte, e.Shape().RawBytes())
	for i := range e.KV {
		e.KV[i] = byte(rng.Uint32())
	}
	return e
}

func TestEntryRoundTripRaw(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	e := testEntry(rng, BF16, 7, 3, 4, 8)
	blob, err := Encode(nil, e, CodecRaw)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(blob, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Key != e.Key || !bytes.Equal(got.KV, e.KV) || len(got.Tokens) != 7 || got.Tokens[6] != e.Tokens[6] {
		t.Fatal("round trip differs")
	}
	// A layer and head range equals slicing the canonical layout.
	hd, _ := ParseHeader(blob, Limits{})
	r := Range{LayerLo: 1, LayerHi: 3, HeadLo: 1, HeadHi: 3}
	dst := make([]byte, r.RangeBytes(hd.Shape))
	if err := DecodeRange(dst, blob, &hd, r, nil); err != nil {
		t.Fatal(err)
	}
	var want []byte
	es := 2
	for l := 1; l < 3; l++ {
		for kv := 0; kv < 2; kv++ {
			for tok := 0; tok < 7; tok++ {
				for h := 1; h < 3; h++ {
					off := (((l*2+kv)*7+tok)*4 + h) * 8 * es
					want = append(want, e.KV[off:off+8*es]...)
				}
			}
		}
	}
	if !bytes.Equal(dst, want) {
		t.Fatal("range read differs from canonical slice")
	}
	// Every single-byte corruption is detected.
	for i := 0; i < len(blob); i += 3 {
		bad := bytes.Clone(blob)
		bad[i] ^= 0x5a
		if _, err := Decode(bad, Limits{}); err == nil {
			t.Fatalf("corruption at byte %d not detected", i)
		}
	}
	for n := 0; n < len(blob); n += 5 {
		if _, err := Decode(blob[:n], Limits{}); !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrTooLarge) {
			t.Fatalf("truncation to %d: %v", n, err)
		}
	}
}
