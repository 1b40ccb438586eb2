package pagedkv

import (
	"errors"
	"math"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
)

func TestValidate(t *testing.T) {
	good := CacheLayout{Order: NHD, NumBlocks: 4, BlockSize: 16, KVHeads: 2, HeadDim: 64, DType: chunk.BF16}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(*CacheLayout)
	}{
		{"order", func(l *CacheLayout) { l.Order = 0 }},
		{"no blocks", func(l *CacheLayout) { l.NumBlocks = 0 }},
		{"negative block size", func(l *CacheLayout) { l.BlockSize = -1 }},
		{"no heads", func(l *CacheLayout) { l.KVHeads = 0 }},
		{"no head dim", func(l *CacheLayout) { l.HeadDim = 0 }},
		{"dtype", func(l *CacheLayout) { l.DType = 0 }},
		{"huge", func(l *CacheLayout) { l.NumBlocks = 1 << 40 }},
		{"fp8 negative scale", func(l *CacheLayout) { l.DType, l.KScale = chunk.FP8E4M3, -1 }},
		{"fp8 NaN scale", func(l *CacheLayout) { l.DType, l.VScale = chunk.FP8E4M3, float32(math.NaN()) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := good
			tc.edit(&l)
			if err := l.Validate(); !errors.Is(err, ErrInvalidLayout) {
				t.Fatalf("Validate() = %v, want ErrInvalidLayout", err)
			}
		})
	}
}

// TestOffsetsTile: in both orders the head vectors of a layer tile it
// exactly once, and a slot's heads are contiguous in NHD.
func TestOffsetsTile(t *testing.T) {
	for _, order := range []Order{NHD, HND} {
		l := CacheLayout{Order: order, NumBlocks: 3, BlockSize: 5, KVHeads: 3, HeadDim: 4, DType: chunk.F16}
		seen := make([]int, l.LayerBytes())
		row := l.HeadDim * l.DType.Size()
		for kv := range 2 {
			for s := range l.Slots() {
				for h := range l.KVHeads {
					o := l.Offset(kv, s, h)
					if order == NHD && h > 0 && o != l.Offset(kv, s, h-1)+row {
						t.Fatalf("NHD (%d,%d,%d): heads not contiguous", kv, s, h)
					}
					for i := o; i < o+row; i++ {
						seen[i]++
					}
				}
			}
		}
		for i, n := range seen {
			if n != 1 {
				t.Fatalf("%v: byte %d covered %d times", order, i, n)
			}
		}
	}
}

func TestScales(t *testing.T) {
	for _, tc := range []struct {
		l    CacheLayout
		k, v float32
	}{
		{CacheLayout{DType: chunk.BF16, KScale: 2, VScale: 3}, 1, 1},
		{CacheLayout{DType: chunk.FP8E4M3}, 1, 1},
		{CacheLayout{DType: chunk.FP8E4M3, KScale: 0.5, VScale: 4}, 0.5, 4},
	} {
		if k, v := tc.l.Scales(); k != tc.k || v != tc.v {
			t.Errorf("%+v: scales %v %v, want %v %v", tc.l, k, v, tc.k, tc.v)
		}
	}
}
