package testutil

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/kvmesh/kvmesh/chunk"
)

// Spec is the small model most tests store chunks of: 4 layers, 2 KV
// heads of 16 bf16 values, NeoX RoPE. A test that needs another shape
// changes the fields it cares about.
func Spec() chunk.ModelSpec {
	return chunk.ModelSpec{Family: "llama", Layers: 4, KVHeads: 2, HeadDim: 16, DType: chunk.BF16,
		RopeStyle: chunk.RopeNeoX, RopeTheta: 10000, TokenizerID: "test"}
}

// Tokens returns n random token IDs below 150000 (a real vocabulary's
// size, so IDs look like a tokenizer's).
func Tokens(rng *rand.Rand, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = rng.Uint32N(150000)
	}
	return out
}

// NewEntry is an entry of spec for tokens in context ctx whose KV bytes
// are random: the same rng state gives the same entry.
func NewEntry(rng *rand.Rand, spec chunk.ModelSpec, tokens []uint32, ctx chunk.Context) *chunk.Entry {
	return EntryOf(spec, tokens, ctx, func(kv []byte) {
		for i := range kv {
			kv[i] = byte(rng.Uint32())
		}
	})
}

// EntryOf is an entry of spec for tokens in context ctx whose KV bytes
// fill writes (RandomKV, SmoothKV, PatternKV; nil leaves them zero).
func EntryOf(spec chunk.ModelSpec, tokens []uint32, ctx chunk.Context, fill func(kv []byte)) *chunk.Entry {
	fp := spec.Fingerprint()
	e := &chunk.Entry{
		Key:   chunk.Key{Fingerprint: fp, Content: chunk.ContentID(fp, tokens), Context: ctx},
		DType: spec.DType, Layers: spec.Layers, KVHeads: spec.KVHeads, HeadDim: spec.HeadDim, Tokens: tokens,
	}
	e.KV = make([]byte, e.Layers*e.LayerBytes())
	if fill != nil {
		fill(e.KV)
	}
	return e
}

// RandomKV fills KV bytes from rng eight at a time: random bytes, cheaper
// than NewEntry's for the large entries of benchmarks.
func RandomKV(rng *rand.Rand) func(kv []byte) {
	return func(kv []byte) {
		for i := 0; i < len(kv); i += 8 {
			v := rng.Uint64()
			for j := 0; j < 8 && i+j < len(kv); j++ {
				kv[i+j] = byte(v >> (8 * j))
			}
		}
	}
}

// SmoothKV fills bf16 KV values that look like activations (normal, σ
// 0.5), which the lossless codec compresses, unlike random bytes.
func SmoothKV(rng *rand.Rand) func(kv []byte) {
	return func(kv []byte) {
		for i := 0; i+2 <= len(kv); i += 2 {
			binary.LittleEndian.PutUint16(kv[i:], chunk.F32ToBF16(float32(rng.NormFloat64()*0.5)))
		}
	}
}

// PatternKV fills KV bytes with a pattern that does not repeat within a
// layer, by doubling (a byte loop over a large entry is slow under the
// race detector).
func PatternKV(kv []byte) {
	for i := range min(len(kv), 4099) {
		kv[i] = byte(i*31 + i>>9)
	}
	for n := 4099; n < len(kv); n *= 2 {
		copy(kv[n:], kv[:n])
	}
}

// Encode encodes e with codec, failing t on an error.
func Encode(t testing.TB, e *chunk.Entry, codec chunk.Codec) []byte {
	t.Helper()
	blob, err := chunk.Encode(nil, e, codec)
	if err != nil {
		t.Fatal(err)
	}
	return blob
}

// Blob is NewEntry encoded in the cluster's default codec (lossless): the
// key and the bytes a Put stores, unchanged by the node.
func Blob(t testing.TB, rng *rand.Rand, spec chunk.ModelSpec, tokens []uint32, ctx chunk.Context) (chunk.Key, []byte) {
	t.Helper()
	e := NewEntry(rng, spec, tokens, ctx)
	return e.Key, Encode(t, e, chunk.CodecLossless)
}

// StandaloneBlob is Blob of ntok random tokens in the standalone context.
func StandaloneBlob(t testing.TB, rng *rand.Rand, spec chunk.ModelSpec, ntok int) (chunk.Key, []byte) {
	t.Helper()
	return Blob(t, rng, spec, Tokens(rng, ntok), chunk.StandaloneContext())
}

// Relabel writes k into the header of an encoded entry, in place, and
// reseals the header checksum: the entry a buggy or hostile writer would
// send under a name its tokens do not give (or a non-canonical context).
// Every decoder must refuse it; tests check that they do.
func Relabel(blob []byte, k chunk.Key) []byte {
	le := binary.LittleEndian
	le.PutUint64(blob[8:], k.Fingerprint.Lo)
	le.PutUint64(blob[16:], k.Fingerprint.Hi)
	le.PutUint64(blob[24:], k.Content.Lo)
	le.PutUint64(blob[32:], k.Content.Hi)
	blob[40] = byte(k.Context.Kind)
	le.PutUint32(blob[44:], k.Context.Window)
	le.PutUint64(blob[48:], k.Context.ID.Lo)
	le.PutUint64(blob[56:], k.Context.ID.Hi)
	// The header checksum follows the 88-byte fixed header, the layer
	// table (24 bytes a layer) and the token IDs (docs/KEYS.md).
	sumAt := 88 + 24*int(le.Uint32(blob[68:])) + 4*int(le.Uint32(blob[64:]))
	le.PutUint64(blob[sumAt:], xxhash.Sum64(blob[:sumAt]))
	return blob
}
