package pagedkv

import (
	"errors"
	"fmt"
	"math"

	"github.com/kvmesh/kvmesh/chunk"
)

// ErrInvalidLayout is wrapped by Validate's errors.
var ErrInvalidLayout = errors.New("pagedkv: invalid cache layout")

// Order is the physical axis order of one layer of a paged KV cache.
type Order uint8

const (
	// NHD is vLLM FlashAttention's layout: [2, num_blocks, block_size,
	// kv_heads, head_dim]; one slot's heads are contiguous.
	NHD Order = 1
	// HND is [2, num_blocks, kv_heads, block_size, head_dim]; one head's
	// slots within a block are contiguous.
	HND Order = 2
	// BlockNHD keeps a block's K and V together: [num_blocks, 2,
	// block_size, kv_heads, head_dim], FlashInfer's NHD paged cache and
	// the shape of vLLM's FlashInfer and Triton backends.
	BlockNHD Order = 3
	// BlockHND is [num_blocks, 2, kv_heads, block_size, head_dim],
	// FlashInfer's HND paged cache (vLLM's FlashInfer backend with the HND
	// cache layout).
	BlockHND Order = 4
)

// Orders returns every valid order, in numeric order.
func Orders() []Order { return []Order{NHD, HND, BlockNHD, BlockHND} }

// Valid reports whether o is one of Orders.
func (o Order) Valid() bool { return o >= NHD && o <= BlockHND }

// headMajor: within a block of K or V, a head's slots are contiguous.
func (o Order) headMajor() bool { return o == HND || o == BlockHND }

// kvInBlock: a block holds its K then its V, instead of all of K's blocks
// coming before all of V's.
func (o Order) kvInBlock() bool { return o == BlockNHD || o == BlockHND }

func (o Order) String() string {
	switch o {
	case NHD:
		return "NHD"
	case HND:
		return "HND"
	case BlockNHD:
		return "BlockNHD"
	case BlockHND:
		return "BlockHND"
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

// Validate reports the first reason l is not a usable layout, wrapping
// ErrInvalidLayout.
func (l CacheLayout) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidLayout, fmt.Sprintf(format, a...))
	}
	switch {
	case !l.Order.Valid():
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
	return l.Strides().Offset(kv, slot, head)
}

// Strides are the byte strides of one layer. In every order the head
// vector (kv, slot, head) starts at
//
//	kv*KV + slot/BlockSize*Block + slot%BlockSize*Slot + head*Head
//
// so a kernel that derives them once computes offsets as Offset does.
type Strides struct {
	BlockSize int
	KV        int // between K and V of one block
	Block     int // between blocks
	Slot      int // between slots of one block
	Head      int // between the heads of one slot
}

// Offset is the byte offset of element 0 of head vector (kv, slot, head).
func (s Strides) Offset(kv, slot, head int) int {
	return kv*s.KV + slot/s.BlockSize*s.Block + slot%s.BlockSize*s.Slot + head*s.Head
}

// Strides derives l's strides; every offset into a layer comes from here.
// A block of K (or of V) is one plane of BlockSize*KVHeads head vectors,
// slot-major or head-major; the planes are all of K's blocks then all of
// V's, or each block's K then its V.
func (l CacheLayout) Strides() Strides {
	row := l.HeadDim * l.DType.Size()
	plane := l.BlockSize * l.KVHeads * row
	s := Strides{BlockSize: l.BlockSize, KV: l.NumBlocks * plane, Block: plane, Slot: l.KVHeads * row, Head: row}
	if l.Order.headMajor() {
		s.Slot, s.Head = row, l.BlockSize*row
	}
	if l.Order.kvInBlock() {
		s.KV, s.Block = plane, 2*plane
	}
	return s
}

// Scales returns the K and V scales the cache stores with: the fp8 scales
// with the 0 default applied, 1 and 1 for other dtypes.
func (l CacheLayout) Scales() (k, v float32) {
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
