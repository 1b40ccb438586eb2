package cudakern

import (
	"fmt"
	"math"

	"github.com/kvmesh/kvmesh/chunk"
)

// Order is the physical axis order of one layer of a paged KV cache.
type Order uint8

const (
	// NHD is vLLM FlashAttention's layout: [2, num_blocks, block_size,
	// kv_heads, head_dim]; one slot's heads are contiguous.
	NHD Order = 1
	// HND is [2, num_blocks, kv_heads, block_size, head_dim]; one head's
	// slots within a block are contiguous.
	HND Order = 2
)

func (o Order) String() string {
	switch o {
	case NHD:
		return "NHD"
	case HND:
		return "HND"
	}
	return fmt.Sprintf("order(%d)", uint8(o))
}

// maxLayerBytes bounds one layer so that offsets never overflow an int and a
// bogus layout is caught early.
const maxLayerBytes = 1 << 46

// CacheLayout describes one layer of a paged KV cache: K at kv = 0 and V at
// kv = 1, each NumBlocks*BlockSize slots of KVHeads head vectors of HeadDim
// elements of DType, little-endian. A slot is block*BlockSize + offset.
//
// For DType FP8E4M3 the cache stores fp8(x / scale) with per-tensor scales
// KScale and VScale (vLLM's k_scale / v_scale); 0 means 1. The scales are
// ignored for other dtypes.
type CacheLayout struct {
	Order     Order
	NumBlocks int
	BlockSize int
	KVHeads   int
	HeadDim   int
	DType     chunk.DType
	KScale    float32
	VScale    float32
}

// Validate reports the first reason l is not a usable layout.
func (l CacheLayout) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidLayout, fmt.Sprintf(format, a...))
	}
	switch {
	case l.Order != NHD && l.Order != HND:
		return bad("order %v", l.Order)
	case l.NumBlocks <= 0, l.BlockSize <= 0, l.KVHeads <= 0, l.HeadDim <= 0:
		return bad("blocks %d, block size %d, kv heads %d, head dim %d must be positive",
			l.NumBlocks, l.BlockSize, l.KVHeads, l.HeadDim)
	case !l.DType.Valid():
		return bad("dtype %v", l.DType)
	}
	// Multiply with overflow checks: each factor is < 2^46, so dividing back
	// detects a product past the bound.
	n := 2 * l.DType.Size()
	for _, f := range []int{l.NumBlocks, l.BlockSize, l.KVHeads, l.HeadDim} {
		if f > maxLayerBytes/n {
			return bad("layer of more than %d bytes", maxLayerBytes)
		}
		n *= f
	}
	if l.DType == chunk.FP8E4M3 {
		for _, s := range []float32{l.KScale, l.VScale} {
			if s < 0 || math.IsNaN(float64(s)) || math.IsInf(float64(s), 0) {
				return bad("fp8 scale %v must be finite and >= 0 (0 means 1)", s)
			}
		}
	}
	return nil
}

// Slots is the number of slots (NumBlocks * BlockSize).
func (l CacheLayout) Slots() int { return l.NumBlocks * l.BlockSize }

// LayerBytes is the size of one layer, K and V.
func (l CacheLayout) LayerBytes() int {
	return 2 * l.NumBlocks * l.BlockSize * l.KVHeads * l.HeadDim * l.DType.Size()
}

// Offset is the byte offset of element 0 of head vector (kv, slot, head),
// kv being 0 for K and 1 for V. It does not check its arguments.
func (l CacheLayout) Offset(kv, slot, head int) int {
	return l.elemOffset(kv, slot, head) * l.DType.Size()
}

func (l CacheLayout) elemOffset(kv, slot, head int) int {
	if l.Order == HND {
		b, o := slot/l.BlockSize, slot%l.BlockSize
		return (((kv*l.NumBlocks+b)*l.KVHeads+head)*l.BlockSize + o) * l.HeadDim
	}
	return ((kv*l.NumBlocks*l.BlockSize+slot)*l.KVHeads + head) * l.HeadDim
}

// scales returns the K and V scales with the 0 default applied (1 for
// non-fp8 dtypes).
func (l CacheLayout) scales() (k, v float32) {
	if l.DType != chunk.FP8E4M3 {
		return 1, 1
	}
	k, v = l.KScale, l.VScale
	if k == 0 {
		k = 1
	}
	if v == 0 {
		v = 1
	}
	return k, v
}

// checkSlots validates a slot mapping against l: every slot is -1 (skipped)
// or in [0, Slots()).
func (l CacheLayout) checkSlots(slots []int) error {
	n := l.Slots()
	for i, s := range slots {
		if s < -1 || s >= n {
			return fmt.Errorf("%w: slot[%d] = %d out of range -1..%d", ErrInvalidJob, i, s, n-1)
		}
	}
	return nil
}

// GatherF32 reads the head vectors (kv, slots[i], head) of one layer into dst
// as float32 in the order [i][head][dim] (the canonical order), dequantizing
// fp8 with the layout's scale. A slot of -1 reads as zeros. kv is 0 for K and
// 1 for V. It checks everything before writing dst.
func GatherF32(dst []float32, layer []byte, l CacheLayout, kv int, slots []int) error {
	if err := l.checkIO(len(layer), kv, slots, len(dst)); err != nil {
		return err
	}
	ks, vs := l.scales()
	scale := ks
	if kv == 1 {
		scale = vs
	}
	hd, es := l.HeadDim, l.DType.Size()
	k := hostISA()
	for i, s := range slots {
		for h := 0; h < l.KVHeads; h++ {
			out := dst[(i*l.KVHeads+h)*hd : (i*l.KVHeads+h+1)*hd]
			if s < 0 {
				clear(out)
				continue
			}
			off := l.Offset(kv, s, h)
			loadF32(out, layer[off:off+hd*es], l.DType, scale, k)
		}
	}
	return nil
}

// ScatterF32 writes src, float32 head vectors in the order [i][head][dim],
// into (kv, slots[i], head) of one layer, rounding once to the layout's dtype
// (fp8: fp8(x / scale)). Slots of -1 are skipped. The engine uses it to store
// keys it rotated itself and values of a fresh prefill. It checks everything
// before writing the layer.
func ScatterF32(layer []byte, l CacheLayout, kv int, slots []int, src []float32) error {
	if err := l.checkIO(len(layer), kv, slots, len(src)); err != nil {
		return err
	}
	ks, vs := l.scales()
	scale := ks
	if kv == 1 {
		scale = vs
	}
	hd, es := l.HeadDim, l.DType.Size()
	k := hostISA()
	for i, s := range slots {
		if s < 0 {
			continue
		}
		for h := 0; h < l.KVHeads; h++ {
			off := l.Offset(kv, s, h)
			storeF32(layer[off:off+hd*es], src[(i*l.KVHeads+h)*hd:(i*l.KVHeads+h+1)*hd], l.DType, scale, false, k)
		}
	}
	return nil
}

func (l CacheLayout) checkIO(layerBytes, kv int, slots []int, f32s int) error {
	if err := l.Validate(); err != nil {
		return err
	}
	if layerBytes != l.LayerBytes() {
		return fmt.Errorf("%w: layer of %d bytes, layout needs %d", ErrInvalidJob, layerBytes, l.LayerBytes())
	}
	if kv != 0 && kv != 1 {
		return fmt.Errorf("%w: kv %d must be 0 (K) or 1 (V)", ErrInvalidJob, kv)
	}
	if want := len(slots) * l.KVHeads * l.HeadDim; f32s != want {
		return fmt.Errorf("%w: %d floats for %d slots, need %d", ErrInvalidJob, f32s, len(slots), want)
	}
	return l.checkSlots(slots)
}
