package chunk

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/cespare/xxhash/v2"
)

func TestOpaqueRoundTrip(t *testing.T) {
	fp := OpaqueSpec("ns").Fingerprint()
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 1022, 1023, 1024, 5000, 1 << 20} {
		random := make([]byte, n)
		for i := range random {
			random[i] = byte(rng.Uint32())
		}
		for _, value := range [][]byte{random, make([]byte, n)} {
			key := []byte("key-" + string(rune('a'+n%26)))
			blob, err := EncodeOpaque(nil, fp, key, value, ID{}, Limits{})
			if err != nil {
				t.Fatalf("%d bytes: %v", n, err)
			}
			hd, err := Verify(blob, Limits{})
			if err != nil {
				t.Fatalf("%d bytes: %v", n, err)
			}
			if hd.Key != OpaqueKey(fp, key) {
				t.Fatalf("key %v, want %v", hd.Key, OpaqueKey(fp, key))
			}
			if kl, vl := OpaqueLens(&hd); kl != len(key) || vl != n {
				t.Fatalf("lens %d, %d; want %d, %d", kl, vl, len(key), n)
			}
			got, err := DecodeOpaque(blob, key, Limits{})
			if err != nil || !bytes.Equal(got, value) {
				t.Fatalf("%d bytes: decode %v, equal %v", n, err, bytes.Equal(got, value))
			}
			if _, err := DecodeOpaque(blob, []byte("other"), Limits{}); !errors.Is(err, ErrNonCanonical) {
				t.Fatalf("decode under another key: %v, want ErrNonCanonical", err)
			}
		}
	}
}

// A value of zeros is stored smaller than raw; random bytes are not
// stored larger than raw.
func TestOpaqueCompresses(t *testing.T) {
	fp := OpaqueSpec("").Fingerprint()
	zeros, err := EncodeOpaque(nil, fp, []byte("k"), make([]byte, 1<<20), ID{}, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if hd, _ := ParseHeader(zeros, Limits{}); hd.Codec != CodecLossless || len(zeros) > 1<<16 {
		t.Fatalf("1 MiB of zeros: codec %v, %d bytes", hd.Codec, len(zeros))
	}
	rng := rand.New(rand.NewPCG(3, 4))
	value := make([]byte, 1<<20)
	for i := range value {
		value[i] = byte(rng.Uint32())
	}
	blob, err := EncodeOpaque(nil, fp, []byte("k"), value, ID{}, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if hd, _ := ParseHeader(blob, Limits{}); hd.Codec != CodecRaw || len(blob) > len(value)+len(value)/200+2*OpaqueTokenBytes {
		t.Fatalf("1 MiB of noise: codec %v, %d bytes", hd.Codec, len(blob))
	}
}

func TestOpaqueRefused(t *testing.T) {
	fp := OpaqueSpec("").Fingerprint()
	blob, err := EncodeOpaque(nil, fp, []byte("k"), []byte("value"), ID{}, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Transcode(blob, CodecInt8, Limits{}); err == nil {
		t.Fatal("an opaque entry transcoded to int8")
	}
	if _, err := EncodeOpaque(nil, fp, nil, make([]byte, MaxOpaqueBytes(Limits{})+1), ID{}, Limits{}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a value over the limit: %v, want ErrTooLarge", err)
	}
	// A header that says more tokens than its lengths need is not the
	// one form of its value.
	hd, _ := ParseHeader(blob, Limits{})
	raw := make([]byte, 3*OpaqueTokenBytes)
	copy(raw, "kvalue")
	long, err := encodeLayers(nil, hd.Key, []uint32{1, 5, 0}, opaqueShape(3), CodecRaw, func(int) ([]byte, error) { return raw, nil })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseHeader(long, Limits{}); !errors.Is(err, ErrNonCanonical) {
		t.Fatalf("an opaque entry of 3 tokens for 6 bytes: %v, want ErrNonCanonical", err)
	}
}

// Each version of a value is an entry of its own; the newest ranks first
// whatever a lookup wants, and version zero (written before versions) is
// older than any.
func TestOpaqueVersions(t *testing.T) {
	fp := OpaqueSpec("ns").Fingerprint()
	v1, v2 := ID{Hi: 100, Lo: 7}, ID{Hi: 100, Lo: 8}
	blob, err := EncodeOpaque(nil, fp, []byte("k"), []byte("value"), v2, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	hd, err := Verify(blob, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if want := OpaqueKeyAt(fp, []byte("k"), v2); hd.Key != want || hd.Key.Content != OpaqueKey(fp, []byte("k")).Content {
		t.Fatalf("key %v, want %v", hd.Key, want)
	}
	if got, err := DecodeOpaque(blob, []byte("k"), Limits{}); err != nil || string(got) != "value" {
		t.Fatalf("decode: %q, %v", got, err)
	}
	zero, a, b := OpaqueContext(), OpaqueContextAt(v1), OpaqueContextAt(v2)
	for _, want := range []Context{OpaqueNewest(), zero, a, b} {
		if !Better(want, b, a) || Better(want, a, b) || !Better(want, a, zero) || Better(want, zero, a) {
			t.Fatalf("want %v: the newer version does not rank first", want)
		}
	}
	if err := OpaqueNewest().CheckCanonical(); !errors.Is(err, ErrNonCanonical) {
		t.Fatalf("OpaqueNewest is a stored context: %v", err)
	}
	if err := b.CheckCanonical(); err != nil {
		t.Fatal(err)
	}
	if s := b.String(); s != "opaque:00000000000000640000000000000008" {
		t.Fatalf("String %q", s)
	}
}

// TestOpaqueVectors: the opaque rows of docs/KEYS.md section 5, computed
// with the reference implementation of its appendix.
func TestOpaqueVectors(t *testing.T) {
	fp := OpaqueSpec("resp:").Fingerprint()
	if got := fp.String(); got != "e5db97ef09b635e977ce58d580b388e1" {
		t.Errorf("opaque fingerprint %s", got)
	}
	if got := OpaqueID(fp, []byte("k")).String(); got != "85471beeacfee4a8f21565af25c54487" {
		t.Errorf("OpaqueID %s", got)
	}
	lo := xxhash.Sum64String("n1")
	if lo != 0x51ce9f3ef4b004a7 {
		t.Errorf("XXH64(n1) %016x", lo)
	}
	k := OpaqueKeyAt(fp, []byte("k"), ID{Hi: 0x18ee2b0d97698b8b, Lo: lo})
	if got := k.String(); got != "e5db97ef09b635e977ce58d580b388e1/85471beeacfee4a8f21565af25c54487/opaque:18ee2b0d97698b8b51ce9f3ef4b004a7" {
		t.Errorf("key text %s", got)
	}
}
