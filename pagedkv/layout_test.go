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
		{"order past the last", func(l *CacheLayout) { l.Order = BlockHND + 1 }},
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

// TestOffsetsTile: in every order the head vectors of a layer tile it
// exactly once, and a slot's heads are contiguous where the order is
// slot-major (NHD, BlockNHD).
func TestOffsetsTile(t *testing.T) {
	for _, order := range Orders() {
		l := CacheLayout{Order: order, NumBlocks: 3, BlockSize: 5, KVHeads: 3, HeadDim: 4, DType: chunk.F16}
		seen := make([]int, l.LayerBytes())
		row := l.HeadDim * l.DType.Size()
		for kv := range 2 {
			for s := range l.Slots() {
				for h := range l.KVHeads {
					o := l.Offset(kv, s, h)
					if !order.headMajor() && h > 0 && o != l.Offset(kv, s, h-1)+row {
						t.Fatalf("%v (%d,%d,%d): heads not contiguous", order, kv, s, h)
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

// TestOffsetsMatchShapes: Offset is the row-major index of each order's
// tensor shape as the engines name it (kv: K or V, block, slot within the
// block, head; head_dim innermost).
func TestOffsetsMatchShapes(t *testing.T) {
	shapes := map[Order]string{
		NHD:      "kbsh", // vLLM FlashAttention [2, num_blocks, block_size, kv_heads, head_dim]
		HND:      "kbhs", // [2, num_blocks, kv_heads, block_size, head_dim]
		BlockNHD: "bksh", // FlashInfer NHD, vLLM FlashInfer/Triton [num_blocks, 2, block_size, kv_heads, head_dim]
		BlockHND: "bkhs", // FlashInfer HND [num_blocks, 2, kv_heads, block_size, head_dim]
	}
	if len(shapes) != len(Orders()) {
		t.Fatalf("%d shapes for %d orders", len(shapes), len(Orders()))
	}
	for _, order := range Orders() {
		axes, ok := shapes[order]
		if !ok {
			t.Fatalf("no shape for %v", order)
		}
		l := CacheLayout{Order: order, NumBlocks: 3, BlockSize: 4, KVHeads: 5, HeadDim: 6, DType: chunk.BF16}
		dims := map[byte]int{'k': 2, 'b': l.NumBlocks, 's': l.BlockSize, 'h': l.KVHeads}
		for kv := range 2 {
			for s := range l.Slots() {
				for h := range l.KVHeads {
					idx := map[byte]int{'k': kv, 'b': s / l.BlockSize, 's': s % l.BlockSize, 'h': h}
					want := 0
					for i := range len(axes) {
						want = want*dims[axes[i]] + idx[axes[i]]
					}
					want *= l.HeadDim * l.DType.Size()
					if got := l.Offset(kv, s, h); got != want {
						t.Fatalf("%v: Offset(%d, %d, %d) = %d, want %d", order, kv, s, h, got, want)
					}
				}
			}
		}
	}
}

func TestOrders(t *testing.T) {
	seen := map[string]bool{}
	for _, o := range Orders() {
		if !o.Valid() || seen[o.String()] {
			t.Fatalf("order %d (%v): invalid or named twice", uint8(o), o)
		}
		seen[o.String()] = true
	}
	for _, o := range []Order{0, BlockHND + 1, 255} {
		if o.Valid() {
			t.Fatalf("order %d is valid", uint8(o))
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
