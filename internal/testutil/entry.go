package testutil

import (
	"math/rand/v2"
	"testing"

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
	fp := spec.Fingerprint()
	e := &chunk.Entry{
		Key:   chunk.Key{Fingerprint: fp, Content: chunk.ContentID(fp, tokens), Context: ctx},
		DType: spec.DType, Layers: spec.Layers, KVHeads: spec.KVHeads, HeadDim: spec.HeadDim, Tokens: tokens,
	}
	e.KV = make([]byte, e.Layers*e.LayerBytes())
	for i := range e.KV {
		e.KV[i] = byte(rng.Uint32())
	}
	return e
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
