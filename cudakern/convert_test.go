package cudakern

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
)

// TestF32ToFP8MatchesChunk: the inlined fast path agrees with chunk's
// conversion on the boundaries of every branch and on random bit patterns.
func TestF32ToFP8MatchesChunk(t *testing.T) {
	edges := []uint32{0, 1, 0x3a800000, 0x3a800001, 0x3c7fffff, 0x3c800000, 0x3c800001, 0x3c880000,
		0x43dfffff, 0x43e00000, 0x43e00001, 0x43d80000, 0x43d7ffff, 0x43d80001, 0x7f7fffff, 0x7f800000, 0x7fc00000, 0x7f800001}
	check := func(u uint32) {
		for _, s := range []uint32{0, 0x80000000} {
			f := math.Float32frombits(u | s)
			var got [1]byte
			storeF32(got[:], []float32{f}, chunk.FP8E4M3, 1)
			if got[0] != f32ToFP8(f) {
				t.Fatalf("%#08x: storeF32 and f32ToFP8 disagree", u|s)
			}
			if got, want := f32ToFP8(f), chunk.F32ToFP8E4M3(f); got != want {
				t.Fatalf("%#08x (%g): fast %#02x, chunk %#02x", u|s, f, got, want)
			}
		}
	}
	for _, u := range edges {
		for d := uint32(0); d < 3; d++ {
			check(u + d)
			check(u - d)
		}
	}
	// Every rounding position of the normal range, ties included.
	for e := uint32(0x3c800000); e < 0x43e00000; e += 1 << 19 {
		check(e)
		check(e + 1)
		check(e - 1)
	}
	rng := rand.New(rand.NewPCG(23, 24))
	for i := 0; i < 1<<20; i++ {
		check(rng.Uint32() & 0x7fffffff)
	}
}
