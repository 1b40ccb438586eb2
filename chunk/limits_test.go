package chunk

import (
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
)

// A header that claims a huge shape fails the limits before anything is
// allocated for it: no token list, no layer table, no tensor.
func TestLimitsHugeHeader(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	blob, err := Encode(nil, synthEntry(rng, BF16, 4, 2, 2, 8), CodecRaw)
	if err != nil {
		t.Fatal(err)
	}
	set := func(at int, v uint32) []byte {
		b := append([]byte(nil), blob...)
		binary.LittleEndian.PutUint32(b[at:], v)
		return b
	}
	tests := []struct {
		name string
		blob []byte
		lim  Limits
	}{
		{"2^31 tokens", set(64, 1<<31), Limits{}},
		{"2^32-1 tokens", set(64, 1<<32-1), Limits{}},
		{"2^31 layers", set(68, 1<<31), Limits{}},
		{"2^31 heads", set(72, 1<<31), Limits{}},
		{"2^31 head dim", set(76, 1<<31), Limits{}},
		// Each field within DefaultLimits, the product far beyond MaxRawBytes.
		{"product", func() []byte {
			b := set(64, 1<<16)
			binary.LittleEndian.PutUint32(b[68:], 1024)
			binary.LittleEndian.PutUint32(b[72:], 1024)
			binary.LittleEndian.PutUint32(b[76:], 4096)
			return b
		}(), Limits{}},
		// Limits so large that an unchecked product would overflow int64.
		{"overflowing limits", func() []byte {
			b := set(64, 1<<31)
			for _, at := range []int{68, 72, 76} {
				binary.LittleEndian.PutUint32(b[at:], 1<<31)
			}
			return b
		}(), Limits{MaxBlobBytes: math.MaxInt, MaxRawBytes: math.MaxInt, MaxTokens: math.MaxInt, MaxLayers: math.MaxInt, MaxKVHeads: math.MaxInt, MaxHeadDim: math.MaxInt}},
		{"tiny raw limit", blob, Limits{MaxBlobBytes: 1 << 20, MaxRawBytes: 100, MaxTokens: 10, MaxLayers: 10, MaxKVHeads: 10, MaxHeadDim: 10}},
		{"tiny blob limit", blob, Limits{MaxBlobBytes: 64, MaxRawBytes: 1 << 20, MaxTokens: 10, MaxLayers: 10, MaxKVHeads: 10, MaxHeadDim: 10}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Decode(tc.blob, tc.lim); !errors.Is(err, ErrTooLarge) {
				t.Fatalf("Decode: %v, want ErrTooLarge", err)
			}
			if _, err := Verify(tc.blob, tc.lim); !errors.Is(err, ErrTooLarge) {
				t.Fatalf("Verify: %v, want ErrTooLarge", err)
			}
			// Only the error itself is allocated.
			allocs := testing.AllocsPerRun(50, func() { _, _ = ParseHeader(tc.blob, tc.lim) })
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for i := 0; i < 50; i++ {
				_, _ = Decode(tc.blob, tc.lim)
			}
			runtime.ReadMemStats(&after)
			if perCall := (after.TotalAlloc - before.TotalAlloc) / 50; allocs > 8 || perCall > 4<<10 {
				t.Fatalf("rejecting the header allocated %v times, %d bytes per call", allocs, perCall)
			}
		})
	}
}

// Encode accepts an entry of any size (limits are the reader's), but not a
// malformed one.
func TestEncodeRejects(t *testing.T) {
	rng := rand.New(rand.NewPCG(33, 34))
	good := synthEntry(rng, F16, 3, 1, 1, 4)
	for name, mut := range map[string]func(*Entry){
		"short KV":      func(e *Entry) { e.KV = e.KV[1:] },
		"no tokens":     func(e *Entry) { e.Tokens = nil },
		"fp8 dtype":     func(e *Entry) { e.DType = FP8E4M3 },
		"no dtype":      func(e *Entry) { e.DType = DTypeInvalid },
		"zero heads":    func(e *Entry) { e.KVHeads = 0 },
		"bad context":   func(e *Entry) { e.Key.Context.Kind = 9 },
		"zero layers":   func(e *Entry) { e.Layers = 0 },
		"negative dims": func(e *Entry) { e.HeadDim = -4 },
	} {
		e := *good
		mut(&e)
		if _, err := Encode(nil, &e, CodecLossless); !errors.Is(err, ErrInvalidEntry) {
			t.Errorf("%s: %v, want ErrInvalidEntry", name, err)
		}
	}
	if _, err := Encode(nil, good, Codec(42)); !errors.Is(err, ErrUnsupported) {
		t.Errorf("unknown codec: %v", err)
	}
}
