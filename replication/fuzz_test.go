package replication

import (
	"bytes"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
)

// FuzzDecodeHint: hint files come from disk, where anything may be found
// after a crash; decoding must never panic, and what decodes re-encodes to
// the same bytes.
func FuzzDecodeHint(f *testing.F) {
	blob, key := makeBlob(f, 1, 0)
	good := encodeHint(&hintMeta{target: "node-b", key: key, at: 42, created: 43}, blob)
	f.Add(good)
	f.Add(good[:len(good)-1])
	f.Add([]byte(hintMagic))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, blob, err := decodeHint(b, chunk.Limits{MaxBlobBytes: 1 << 20})
		if err != nil {
			return
		}
		if again := encodeHint(&h, blob); !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs")
		}
	})
}

// FuzzDecodeTombstone: the tombstone log is read back after crashes.
func FuzzDecodeTombstone(f *testing.F) {
	_, key := makeBlob(f, 1, 0)
	f.Add(encodeTomb(nil, key, tomb{at: 7, deleted: true}))
	f.Add(encodeTomb(nil, key, tomb{at: -1}))
	f.Add(make([]byte, tombRecordBytes))
	f.Fuzz(func(t *testing.T, b []byte) {
		k, tb, err := decodeTomb(b)
		if err != nil {
			return
		}
		if again := encodeTomb(nil, k, tb); !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs")
		}
	})
}

func TestHintAndTombstoneRoundTrip(t *testing.T) {
	blob, key := makeBlob(t, 5, 0)
	for _, h := range []hintMeta{
		{target: "a", key: key, at: 1, created: 2},
		{target: string(bytes.Repeat([]byte("x"), maxTarget)), key: key, at: -5, created: 1 << 62},
	} {
		got, gotBlob, err := decodeHint(encodeHint(&h, blob), chunk.Limits{})
		if err != nil || got.target != h.target || got.at != h.at || got.created != h.created || got.key != key || !bytes.Equal(gotBlob, blob) {
			t.Fatalf("hint round trip: %+v, %v", got, err)
		}
	}
	for _, tb := range []tomb{{at: 1, deleted: true}, {at: 1 << 60}} {
		k, got, err := decodeTomb(encodeTomb(nil, key, tb))
		if err != nil || k != key || got != tb {
			t.Fatalf("tombstone round trip: %v %+v %v", k, got, err)
		}
	}
}
