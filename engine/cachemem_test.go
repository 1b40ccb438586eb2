package engine

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/kvmesh/kvmesh/pagedkv"
)

// TestCacheMemory: an engine whose cache lives in caller memory computes
// the same logits as one on the Go heap, and its CacheMemory is exactly
// that memory; unusable memory is refused.
func TestCacheMemory(t *testing.T) {
	ctx := t.Context()
	c := tinyConfig()
	ts, err := RandomTensors(c, 3, 0)
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWeights(c, ts)
	if err != nil {
		t.Fatal(err)
	}
	heap, err := New(w, Config{Workers: 2, CacheTokens: 512})
	if err != nil {
		t.Fatal(err)
	}
	defer heap.Close()
	var backing []byte
	alloc := func(layers int, lay pagedkv.CacheLayout) ([][]byte, error) {
		n := lay.LayerBytes()
		backing = bytes.Repeat([]byte{0xff}, layers*n) // garbage the engine must clear
		out := make([][]byte, layers)
		for l := range out {
			out[l] = backing[l*n : (l+1)*n : (l+1)*n]
		}
		return out, nil
	}
	ext, err := New(w, Config{Workers: 2, CacheTokens: 512, CacheMemory: alloc})
	if err != nil {
		t.Fatal(err)
	}
	defer ext.Close()
	_, mem := ext.CacheMemory()
	if &mem[0][0] != &backing[0] || &mem[1][0] != &backing[len(mem[0])] {
		t.Fatal("CacheMemory does not expose the memory Config.CacheMemory gave")
	}
	r := rand.New(rand.NewPCG(1, 2))
	segs := []Segment{{Tokens: randTokens(r, 20, c.VocabSize)}, {Tokens: randTokens(r, 9, c.VocabSize)}}
	a, err := heap.Run(ctx, nil, Request{StartPos: 3, Segments: segs})
	if err != nil {
		t.Fatal(err)
	}
	b, err := ext.Run(ctx, nil, Request{StartPos: 3, Segments: segs})
	if err != nil {
		t.Fatal(err)
	}
	if d := maxAbsDiff(a.Logits, b.Logits); d != 0 {
		t.Fatalf("logits differ by %g", d)
	}

	bad := map[string]func(int, pagedkv.CacheLayout) ([][]byte, error){
		"too few layers": func(layers int, lay pagedkv.CacheLayout) ([][]byte, error) {
			out, _ := alloc(layers, lay)
			return out[1:], nil
		},
		"short layer": func(layers int, lay pagedkv.CacheLayout) ([][]byte, error) {
			out, _ := alloc(layers, lay)
			out[2] = out[2][:len(out[2])-4]
			return out, nil
		},
		"overlap": func(layers int, lay pagedkv.CacheLayout) ([][]byte, error) {
			out, _ := alloc(layers, lay)
			out[1] = out[0]
			return out, nil
		},
		"misaligned": func(layers int, lay pagedkv.CacheLayout) ([][]byte, error) {
			n := lay.LayerBytes()
			b := make([]byte, layers*n+1)
			out := make([][]byte, layers)
			for l := range out {
				out[l] = b[1+l*n : 1+(l+1)*n]
			}
			return out, nil
		},
	}
	for name, f := range bad {
		t.Run(name, func(t *testing.T) {
			e, err := New(w, Config{Workers: 1, CacheTokens: 512, CacheMemory: f})
			if err == nil {
				e.Close()
				t.Fatal("accepted")
			}
		})
	}
}
