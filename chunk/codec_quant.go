package chunk

import (
	"math"
	"sync"
)

// The quantizing codecs follow KIVI (Liu et al., 2024): keys have outlier
// channels, so they are quantized per channel, in groups of quantGroupTokens
// tokens for each (kv_head, head_dim) channel; values are quantized per
// token, in groups of quantGroupDims consecutive dims within one kv head (a
// group never spans two heads, so a head range reads only its own groups).
// The last group along an axis may be shorter.
//
// Group parameters are stored in the entry dtype (bf16 for a bf16 entry):
// the zero point is the group minimum, which is a value of that dtype and so
// stored exactly; the scale is rounded up, so the group range is always
// covered and nothing saturates.
//
// Error bounds, for an element x of a group, with s the stored scale. The
// decoded value is computed in float64 and rounded into the entry dtype
// (through float32, so the rounding adds at most one ulp of the result) and
// clamped to the dtype's finite range, which only brings it closer to x:
//
//   - CodecInt8: q = round((x-min)/s) in 0..255, s >= (max-min)/255, and
//     |x̂ - x| <= s/2 + ulp(x̂). s exceeds (max-min)/255 by at most one
//     ulp of the dtype (2^-7 relative for bf16).
//   - CodecInt4: the same with 15 levels: |x̂ - x| <= s/2 + ulp(x̂),
//     s >= (max-min)/15. Two codes per byte, low nibble first.
//   - CodecFP8: q = e4m3(x/s), s >= max|x|/448, x̂ = e4m3(q)*s; e4m3 keeps
//     3 mantissa bits, so |x̂ - x| <= max(|x|*2^-4, s*2^-10) + ulp(x̂).
//
// Encoding rejects NaN and Inf (ErrInvalidEntry): a group with either has no
// range to quantize. Decoding rejects non-finite or negative parameters and
// fp8 NaN codes as ErrCorrupt.
//
// Layer layout, for the K half then the V half: the group parameters (int:
// zero then scale per group; fp8: scale per group), then the codes in the
// canonical element order. K groups are ordered [token group][head][dim], V
// groups [token][head][dim group].
const (
	quantGroupTokens = 64
	quantGroupDims   = 64
)

type quantKind uint8

const (
	quantInt8 quantKind = iota + 1
	quantInt4
	quantFP8
)

func (k quantKind) levels() float64 {
	switch k {
	case quantInt8:
		return 255
	case quantInt4:
		return 15
	}
	return 0
}

// params is the number of parameters stored per group.
func (k quantKind) params() int {
	if k == quantFP8 {
		return 1
	}
	return 2
}

// codeBytes is the size of n codes.
func (k quantKind) codeBytes(n int) int {
	if k == quantInt4 {
		return (n + 1) / 2
	}
	return n
}

type quantCodec struct {
	dt   DType
	kind quantKind
}

// quantGeom is the group geometry of one half (K or V) of a layer.
type quantGeom struct {
	tokens, heads, dim int
	chans              int // heads*dim: elements per token
	kGroups            int // token groups of K
	vGroups            int // dim groups per head of V
}

func geom(sh Shape) quantGeom {
	g := quantGeom{tokens: sh.Tokens, heads: sh.KVHeads, dim: sh.HeadDim, chans: sh.KVHeads * sh.HeadDim}
	g.kGroups = (sh.Tokens + quantGroupTokens - 1) / quantGroupTokens
	g.vGroups = (sh.HeadDim + quantGroupDims - 1) / quantGroupDims
	return g
}

func (g quantGeom) elems() int { return g.tokens * g.chans }

// groups is the number of groups in the K half and in the V half.
func (g quantGeom) groups() (k, v int) { return g.kGroups * g.chans, g.tokens * g.heads * g.vGroups }

// encodedBytes is the exact size of an encoded layer of this geometry.
func (c quantCodec) encodedBytes(g quantGeom) int {
	kg, vg := g.groups()
	ps := c.kind.params() * c.dt.Size()
	return ps*(kg+vg) + 2*c.kind.codeBytes(g.elems())
}

// quantScratch is per-call working memory, pooled. Its slices grow to the
// largest row seen; rows are bounded by the (limit-checked) Shape.
type quantScratch struct {
	row    []float32 // one token's elements
	lo, hi []float32 // per-channel group min and max (K)
	zero   []float64 // per-channel group parameters (K)
	scale  []float64
	codes  []byte
	// Decoding: int8 key parameters in float32 and int4 key tables, per
	// channel.
	zero32, scale32 []float32
	tab             []uint32
}

var quantScratchPool = sync.Pool{New: func() any { return &quantScratch{} }}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

func (s *quantScratch) size(chans int) {
	s.row = grow(s.row, chans)
	s.lo = grow(s.lo, chans)
	s.hi = grow(s.hi, chans)
	s.zero = grow(s.zero, chans)
	s.scale = grow(s.scale, chans)
	s.codes = grow(s.codes, chans)
	s.zero32 = grow(s.zero32, chans)
	s.scale32 = grow(s.scale32, chans)
	s.tab = grow(s.tab, 16*chans)
}

// Integer dequantization fast paths. The reference result of a code b is
// clampF32(zero + float64(b)*scale, lim) narrowed into the dtype; the fast
// paths compute exactly that value with fewer operations:
//
//   - int4 builds the 16 outputs of a group (in dtype bits, with the
//     reference formula) and looks codes up: 16 evaluations serve a group's
//     64 elements.
//   - int8 computes zero + float32(b)*scale in float32 for bf16 and f16
//     entries when fastParams admits the group. zero and scale are values
//     of the 16-bit dtype, so b*scale (at most 8+11 significant bits, a
//     multiple of 2^-133, below 2^127) is exact in float32, and the float64
//     sum of two float32 values rounded to float32 is the correctly rounded
//     float32 sum (double rounding is innocuous for 53 >= 2*24+2 bits,
//     Figueroa 1995). fastParams also checks that the group's largest
//     output, zero + 255*scale, rounds to at most lim, so the clamp is a
//     no-op for every code (rounding is monotonic and zero >= -lim). Other
//     groups, and f32 entries (whose b*scale is not exact in float32), use
//     the reference formula.

// fp8 fast paths. The reference output of code b is
// clampF32(float64(lut[b])*scale, lim) narrowed into the dtype. For bf16
// and f16 entries the scale is a value of the 16-bit dtype (at most 11
// significant bits) and an e4m3 value has 4, so their product is exact in
// float32 unless it overflows, and a float32 product below the normal
// range rounds once, as float32(float64 product) does. fp8Fast admits a
// scale whose largest output, 448*scale, is at most lim: then no code
// overflows or needs the clamp, and the float32 product is the reference
// value.

// maxFinite is the largest finite value of dt, as float64.
func maxFinite(dt DType) float64 {
	switch dt {
	case F16:
		return 65504
	case BF16:
		return float64(BF16ToF32(0x7f7f))
	}
	return math.MaxFloat32
}

func (k quantKind) String() string {
	switch k {
	case quantInt8:
		return "int8"
	case quantInt4:
		return "int4"
	}
	return "fp8"
}
