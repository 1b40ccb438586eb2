package chunk

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/cespare/xxhash/v2"
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

// TestKeyMustNameEntry: an entry whose content ID is not the one its tokens
// give, or whose context is not canonical, or whose reserved header bytes
// are set, is refused by Encode and by every decode (ParseHeader, Verify,
// Decode), so that no write or read path can store or serve it.
func TestKeyMustNameEntry(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	good := testEntry(rng, F16, 3, 1, 1, 4)
	fp := good.Key.Fingerprint
	cases := []struct {
		name  string
		patch func(k *Key)
		raw   func(h []byte) // header bytes to set after encoding, instead of patch
	}{
		{name: "content of other tokens", patch: func(k *Key) { k.Content = ContentID(fp, []uint32{1001, 1002, 1003}) }},
		{name: "content under another fingerprint", patch: func(k *Key) { k.Content = ContentID(Fingerprint{Lo: 1}, good.Tokens) }},
		{name: "standalone with an ID", patch: func(k *Key) { k.Context.ID = ID{Lo: 1} }},
		{name: "standalone with a window", patch: func(k *Key) { k.Context.Window = 4 }},
		{name: "prefix with a window", patch: func(k *Key) { k.Context = PrefixContext(PrefixRoot(fp)); k.Context.Window = 4 }},
		{name: "window 0", patch: func(k *Key) { k.Context = WindowContext(fp, 0, []uint32{1}) }},
		{name: "window over MaxWindow", patch: func(k *Key) { k.Context = WindowContext(fp, MaxWindow+1, []uint32{1}) }},
		{name: "unknown kind", patch: func(k *Key) { k.Context.Kind = 5 }},
		{name: "opaque context", patch: func(k *Key) { k.Context = OpaqueContext() }},
		// One computation, one key: nothing before the chunk is standalone.
		{name: "prefix at the chain root", patch: func(k *Key) { k.Context = PrefixContext(PrefixRoot(fp)) }},
		{name: "window of no tokens", patch: func(k *Key) { k.Context = Context{Kind: ContextWindow, Window: 8, ID: WindowID(fp, nil)} }},
		{name: "reserved byte", raw: func(h []byte) { h[42] = 1 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := *good
			if tc.patch != nil {
				tc.patch(&e.Key)
				if _, err := Encode(nil, &e, CodecRaw); !errors.Is(err, ErrInvalidEntry) || (tc.name != "unknown kind" && !errors.Is(err, ErrNonCanonical)) {
					t.Fatalf("Encode: %v, want ErrInvalidEntry and ErrNonCanonical", err)
				}
			}
			// The same key written by hand, with a valid header checksum.
			blob, err := Encode(nil, good, CodecRaw)
			if err != nil {
				t.Fatal(err)
			}
			if tc.patch != nil {
				putID(blob[24:], e.Key.Content)
				blob[40] = byte(e.Key.Context.Kind)
				binary.LittleEndian.PutUint32(blob[44:], e.Key.Context.Window)
				putID(blob[48:], e.Key.Context.ID)
			} else {
				tc.raw(blob)
			}
			sumAt := fixedHeaderBytes + layerRefBytes*good.Layers + 4*len(good.Tokens)
			binary.LittleEndian.PutUint64(blob[sumAt:], xxhash.Sum64(blob[:sumAt]))
			if _, err := ParseHeader(blob, Limits{}); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("ParseHeader: %v, want ErrCorrupt", err)
			}
			if _, err := Verify(blob, Limits{}); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Verify: %v, want ErrCorrupt", err)
			}
			if _, err := Decode(blob, Limits{}); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Decode: %v, want ErrCorrupt", err)
			}
		})
	}
	// The canonical forms of every kind are accepted.
	for _, cx := range []Context{StandaloneContext(), WindowContext(fp, 1, nil), WindowContext(fp, MaxWindow, []uint32{7}), PrefixContext(ID{Lo: 3, Hi: 4})} {
		e := *good
		e.Key.Context = cx
		blob, err := Encode(nil, &e, CodecRaw)
		if err != nil {
			t.Fatalf("%v: %v", cx, err)
		}
		if _, err := Decode(blob, Limits{}); err != nil {
			t.Fatalf("%v: %v", cx, err)
		}
	}
}

// TestPeekCodec: the first bytes of an entry name its codec, as the whole
// entry's header does; too few bytes, or bytes that do not start an entry
// of this version, name none.
func TestPeekCodec(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 8))
	e := synthEntry(rng, BF16, 4, 2, 2, 8)
	for _, c := range allCodecs {
		blob, err := Encode(nil, e, c)
		if err != nil {
			t.Fatal(err)
		}
		hd, err := ParseHeader(blob, Limits{})
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := PeekCodec(blob[:8]); !ok || got != hd.Codec || got != c {
			t.Errorf("%v: peek says %v, %v", c, got, ok)
		}
		if _, ok := PeekCodec(blob[:7]); ok {
			t.Errorf("%v: a codec from 7 bytes", c)
		}
		bad := bytes.Clone(blob[:8])
		bad[4]++ // another version
		if _, ok := PeekCodec(bad); ok {
			t.Errorf("%v: a codec from another version's header", c)
		}
		bad = bytes.Clone(blob[:8])
		bad[0] = 'X'
		if _, ok := PeekCodec(bad); ok {
			t.Errorf("%v: a codec from bytes with another magic", c)
		}
	}
}
