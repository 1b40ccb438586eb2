package chunk

import (
	"encoding/binary"
	"fmt"
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

func (c quantCodec) encode(dst, raw []byte, sh Shape) ([]byte, error) {
	g := geom(sh)
	es := c.dt.Size()
	halfBytes := g.elems() * es
	if len(raw) != 2*halfBytes {
		return dst, fmt.Errorf("%w: layer of %d bytes, shape needs %d", ErrInvalidEntry, len(raw), 2*halfBytes)
	}
	s := quantScratchPool.Get().(*quantScratch)
	defer quantScratchPool.Put(s)
	s.size(g.chans)
	start := len(dst)
	dst = append(dst, make([]byte, c.encodedBytes(g))...)
	out := dst[start:]
	kg, vg := g.groups()
	ps := c.kind.params() * es
	kParams, out := out[:kg*ps], out[kg*ps:]
	kCodes, out := out[:c.kind.codeBytes(g.elems())], out[c.kind.codeBytes(g.elems()):]
	vParams, vCodes := out[:vg*ps], out[vg*ps:]
	if err := c.encodeK(kParams, kCodes, raw[:halfBytes], g, s); err != nil {
		return dst[:start], err
	}
	if err := c.encodeV(vParams, vCodes, raw[halfBytes:], g, s); err != nil {
		return dst[:start], err
	}
	return dst, nil
}

// encodeK quantizes keys per channel over groups of tokens.
func (c quantCodec) encodeK(params, codes, raw []byte, g quantGeom, s *quantScratch) error {
	es := c.dt.Size()
	ps := c.kind.params() * es
	rowBytes := g.chans * es
	for tg := 0; tg < g.kGroups; tg++ {
		t0, t1 := tg*quantGroupTokens, min((tg+1)*quantGroupTokens, g.tokens)
		lo, hi := s.lo[:g.chans], s.hi[:g.chans]
		WidenRow(lo, raw[t0*rowBytes:(t0+1)*rowBytes], c.dt)
		copy(hi, lo)
		for t := t0 + 1; t < t1; t++ {
			row := s.row[:g.chans]
			WidenRow(row, raw[t*rowBytes:(t+1)*rowBytes], c.dt)
			for i, v := range row {
				// Plain compares, not min/max: NaN is caught below
				// through Inf-free ranges instead.
				if v < lo[i] {
					lo[i] = v
				}
				if v > hi[i] {
					hi[i] = v
				}
			}
		}
		p := params[tg*g.chans*ps:]
		for i := range lo {
			if !finiteRange(lo[i], hi[i]) {
				return fmt.Errorf("%w: %v codec: NaN or Inf in keys of tokens %d..%d", ErrInvalidEntry, c.kind, t0, t1)
			}
			s.zero[i], s.scale[i] = c.groupParams(p[i*ps:], lo[i], hi[i])
			s.scale[i] = inverse(s.scale[i])
		}
		for t := t0; t < t1; t++ {
			row := s.row[:g.chans]
			WidenRow(row, raw[t*rowBytes:(t+1)*rowBytes], c.dt)
			if hasNaN(row) {
				return fmt.Errorf("%w: %v codec: NaN in keys of token %d", ErrInvalidEntry, c.kind, t)
			}
			q := s.codes[:g.chans]
			c.quantizeRow(q, row, s.zero, s.scale)
			c.putCodes(codes, t*g.chans, q)
		}
	}
	return nil
}

// encodeV quantizes values per token over groups of dims within a head.
func (c quantCodec) encodeV(params, codes, raw []byte, g quantGeom, s *quantScratch) error {
	es := c.dt.Size()
	rowBytes := g.chans * es
	ps := c.kind.params() * es
	gi := 0
	for t := 0; t < g.tokens; t++ {
		row := s.row[:g.chans]
		WidenRow(row, raw[t*rowBytes:(t+1)*rowBytes], c.dt)
		if hasNaN(row) {
			return fmt.Errorf("%w: %v codec: NaN in values of token %d", ErrInvalidEntry, c.kind, t)
		}
		q := s.codes[:g.chans]
		for h := 0; h < g.heads; h++ {
			for d0 := 0; d0 < g.dim; d0 += quantGroupDims {
				a, b := h*g.dim+d0, h*g.dim+min(d0+quantGroupDims, g.dim)
				grp := row[a:b]
				lo, hi := grp[0], grp[0]
				for _, v := range grp {
					if v < lo {
						lo = v
					}
					if v > hi {
						hi = v
					}
				}
				if !finiteRange(lo, hi) {
					return fmt.Errorf("%w: %v codec: Inf in values of token %d", ErrInvalidEntry, c.kind, t)
				}
				zero, scale := c.groupParams(params[gi*ps:], lo, hi)
				gi++
				c.quantizeGroup(q[a:b], grp, zero, inverse(scale))
			}
		}
		c.putCodes(codes, t*g.chans, q)
	}
	return nil
}

// finiteRange reports whether a group's range is finite. NaN does not take
// part in the compares that build the range, so rows are checked for it
// separately (hasNaN).
func finiteRange(lo, hi float32) bool {
	return lo >= -math.MaxFloat32 && hi <= math.MaxFloat32
}

func hasNaN(row []float32) bool {
	for _, v := range row {
		if v != v {
			return true
		}
	}
	return false
}

// inverse is 1/scale, or 0 for a constant (or all-zero) group, whose codes
// are then all 0.
func inverse(scale float64) float64 {
	if scale == 0 {
		return 0
	}
	return 1 / scale
}

// quantizeRow quantizes a row with per-element zeros and inverse scales
// (keys).
func (c quantCodec) quantizeRow(q []byte, row []float32, zero, inv []float64) {
	q, zero, inv = q[:len(row)], zero[:len(row)], inv[:len(row)]
	if c.kind == quantFP8 {
		for i, v := range row {
			q[i] = F32ToFP8E4M3(float32(float64(v) * inv[i]))
		}
		return
	}
	levels := c.kind.levels()
	for i, v := range row {
		q[i] = intCode(v, zero[i], inv[i], levels)
	}
}

// quantizeGroup quantizes a group sharing one zero and inverse scale
// (values).
func (c quantCodec) quantizeGroup(q []byte, grp []float32, zero, inv float64) {
	q = q[:len(grp)]
	if c.kind == quantFP8 {
		for i, v := range grp {
			q[i] = F32ToFP8E4M3(float32(float64(v) * inv))
		}
		return
	}
	levels := c.kind.levels()
	for i, v := range grp {
		q[i] = intCode(v, zero, inv, levels)
	}
}

// intCode is round((v-zero)/scale) clamped to [0, levels]. Multiplying by
// the inverse instead of dividing moves a code across a rounding boundary
// only within 2^-52 relative of it, far inside the documented bound; the
// truncating conversion is a floor because the operand is clamped to be
// non-negative first.
func intCode(v float32, zero, inv, levels float64) byte {
	x := (float64(v)-zero)*inv + 0.5
	if x < 0 {
		x = 0
	} else if x > levels {
		x = levels
	}
	return byte(int32(x))
}

// groupParams chooses and stores (at p) a group's parameters and returns
// them as stored.
func (c quantCodec) groupParams(p []byte, lo, hi float32) (zero, scale float64) {
	es := c.dt.Size()
	if c.kind == quantFP8 {
		amax := max(-float64(lo), float64(hi))
		scale = c.storeUp(p, amax/FP8E4M3Max)
		return 0, scale
	}
	zero = float64(lo) // a value of the dtype: stored exactly
	c.store(p, lo)
	scale = c.storeUp(p[es:], (float64(hi)-zero)/c.kind.levels())
	return zero, scale
}

// store writes v, which is representable in the dtype, exactly.
func (c quantCodec) store(p []byte, v float32) {
	switch c.dt {
	case F32:
		binary.LittleEndian.PutUint32(p, math.Float32bits(v))
	case F16:
		binary.LittleEndian.PutUint16(p, F32ToF16(v))
	case BF16:
		binary.LittleEndian.PutUint16(p, F32ToBF16(v))
	}
}

// storeUp writes the smallest dtype value >= v (v >= 0 and finite) and
// returns it.
func (c quantCodec) storeUp(p []byte, v float64) float64 {
	if v <= 0 {
		c.store(p, 0)
		return 0
	}
	switch c.dt {
	case F32:
		f := float32(v)
		if float64(f) < v {
			f = math.Nextafter32(f, float32(math.Inf(1)))
		}
		binary.LittleEndian.PutUint32(p, math.Float32bits(f))
		return float64(f)
	case F16:
		h := F32ToF16(float32(v))
		for float64(F16ToF32(h)) < v {
			h++ // positive: the next larger magnitude
		}
		binary.LittleEndian.PutUint16(p, h)
		return float64(F16ToF32(h))
	default:
		h := F32ToBF16(float32(v))
		for float64(BF16ToF32(h)) < v {
			h++
		}
		binary.LittleEndian.PutUint16(p, h)
		return float64(BF16ToF32(h))
	}
}

// putCodes stores q as the codes of elements [at, at+len(q)).
func (c quantCodec) putCodes(codes []byte, at int, q []byte) {
	if c.kind != quantInt4 {
		copy(codes[at:], q)
		return
	}
	i := 0
	if at&1 == 0 { // the common case: whole bytes, two codes each
		dst := codes[at>>1 : at>>1+len(q)>>1]
		for k := range dst {
			dst[k] = q[2*k] | q[2*k+1]<<4
		}
		i = 2 * len(dst)
	}
	for ; i < len(q); i++ {
		j := at + i
		if j&1 == 0 {
			codes[j>>1] = q[i]
		} else {
			codes[j>>1] |= q[i] << 4
		}
	}
}

func (c quantCodec) decode(dst, enc []byte, sh Shape) error {
	g := geom(sh)
	es := c.dt.Size()
	halfBytes := g.elems() * es
	if len(dst) != 2*halfBytes {
		return fmt.Errorf("%w: layer of %d bytes, shape needs %d", ErrInvalidEntry, len(dst), 2*halfBytes)
	}
	if len(enc) != c.encodedBytes(g) {
		return fmt.Errorf("%w: %v layer of %d bytes, want %d", ErrCorrupt, c.kind, len(enc), c.encodedBytes(g))
	}
	if c.kind == quantInt4 && g.elems()&1 == 1 {
		// The unused high nibbles must be zero, so that an entry has one
		// encoding.
		cb := c.kind.codeBytes(g.elems())
		kg, _ := g.groups()
		if enc[kg*c.kind.params()*es+cb-1]>>4 != 0 || enc[len(enc)-1]>>4 != 0 {
			return fmt.Errorf("%w: int4 padding nibble set", ErrCorrupt)
		}
	}
	s := quantScratchPool.Get().(*quantScratch)
	defer quantScratchPool.Put(s)
	s.size(g.chans)
	var lut [256]float32
	if c.kind == quantFP8 {
		for i := range lut {
			lut[i] = FP8E4M3ToF32(uint8(i))
		}
	}
	kg, vg := g.groups()
	ps := c.kind.params() * es
	cb := c.kind.codeBytes(g.elems())
	kParams, rest := enc[:kg*ps], enc[kg*ps:]
	kCodes, rest := rest[:cb], rest[cb:]
	vParams, vCodes := rest[:vg*ps], rest[vg*ps:]
	if err := c.decodeK(dst[:halfBytes], kParams, kCodes, g, s, &lut); err != nil {
		return err
	}
	return c.decodeV(dst[halfBytes:], vParams, vCodes, g, s, &lut)
}

// loadParams reads a group's parameters.
func (c quantCodec) loadParams(p []byte) (zero, scale float64, err error) {
	es := c.dt.Size()
	if c.kind == quantFP8 {
		scale = c.load(p)
	} else {
		zero, scale = c.load(p), c.load(p[es:])
	}
	if !(scale >= 0) || math.IsInf(scale, 0) || math.IsInf(zero, 0) || zero != zero {
		return 0, 0, fmt.Errorf("%w: %v group parameters zero %v scale %v", ErrCorrupt, c.kind, zero, scale)
	}
	return zero, scale, nil
}

func (c quantCodec) load(p []byte) float64 {
	switch c.dt {
	case F32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(p)))
	case F16:
		return float64(F16ToF32(binary.LittleEndian.Uint16(p)))
	}
	return float64(BF16ToF32(binary.LittleEndian.Uint16(p)))
}

func (c quantCodec) decodeK(dst, params, codes []byte, g quantGeom, s *quantScratch, lut *[256]float32) error {
	es := c.dt.Size()
	ps := c.kind.params() * es
	rowBytes := g.chans * es
	lim := maxFinite(c.dt)
	for tg := 0; tg < g.kGroups; tg++ {
		p := params[tg*g.chans*ps:]
		fast := c.kind == quantInt8
		for i := 0; i < g.chans; i++ {
			var err error
			if s.zero[i], s.scale[i], err = c.loadParams(p[i*ps:]); err != nil {
				return err
			}
			if fast {
				s.zero32[i], s.scale32[i], fast = c.fastParams(s.zero[i], s.scale[i])
			}
		}
		t0, t1 := tg*quantGroupTokens, min((tg+1)*quantGroupTokens, g.tokens)
		switch {
		case c.kind == quantInt4:
			// 16 outputs per channel serve the group's (up to) 64 tokens.
			tab := s.tab[:16*g.chans]
			for i := 0; i < g.chans; i++ {
				c.fillTable(tab[16*i:16*i+16], s.zero[i], s.scale[i], lim)
			}
			for t := t0; t < t1; t++ {
				out := dst[t*rowBytes : (t+1)*rowBytes]
				if es == 2 && g.chans%2 == 0 {
					at := t * g.chans
					lookupPacked(out, codes[at/2:(at+g.chans)/2], tab, 32)
					continue
				}
				q := c.getCodes(s.codes[:g.chans], codes, t*g.chans)
				c.lookupRow(out, q, tab)
			}
			continue
		case fast:
			for t := t0; t < t1; t++ {
				c.dequantRow(dst[t*rowBytes:(t+1)*rowBytes], codes[t*g.chans:(t+1)*g.chans], s.zero32[:g.chans], s.scale32[:g.chans])
			}
			continue
		case c.kind == quantFP8 && c.fp8FastRow(s.scale[:g.chans], s.scale32[:g.chans]):
			for t := t0; t < t1; t++ {
				q := codes[t*g.chans : (t+1)*g.chans]
				if err := fp8Row(dst[t*rowBytes:(t+1)*rowBytes], q, lut, s.scale32[:g.chans], c.dt); err != nil {
					return err
				}
			}
			continue
		}
		for t := t0; t < t1; t++ {
			q := c.getCodes(s.codes[:g.chans], codes, t*g.chans)
			row := s.row[:g.chans]
			zero, scale := s.zero[:len(row)], s.scale[:len(row)]
			if c.kind == quantFP8 {
				if err := fp8Check(q); err != nil {
					return err
				}
				for i, b := range q {
					row[i] = clampF32(float64(lut[b])*scale[i], lim)
				}
			} else {
				for i, b := range q {
					row[i] = clampF32(zero[i]+float64(b)*scale[i], lim)
				}
			}
			NarrowRow(dst[t*rowBytes:(t+1)*rowBytes], row, c.dt)
		}
	}
	return nil
}

func (c quantCodec) decodeV(dst, params, codes []byte, g quantGeom, s *quantScratch, lut *[256]float32) error {
	es := c.dt.Size()
	ps := c.kind.params() * es
	rowBytes := g.chans * es
	lim := maxFinite(c.dt)
	gi := 0
	// int4 codes of 16-bit entries are looked up a byte (two codes) at a
	// time when every group starts and ends on a byte.
	packed := c.kind == quantInt4 && es == 2 && g.dim%2 == 0
	for t := 0; t < g.tokens; t++ {
		if c.kind != quantFP8 {
			// Integer codes go straight into dst, a group at a time.
			var q []byte
			if !packed {
				q = c.getCodes(s.codes[:g.chans], codes, t*g.chans)
			}
			out := dst[t*rowBytes : (t+1)*rowBytes]
			for h := 0; h < g.heads; h++ {
				for d0 := 0; d0 < g.dim; d0 += quantGroupDims {
					zero, scale, err := c.loadParams(params[gi*ps:])
					if err != nil {
						return err
					}
					gi++
					a, b := h*g.dim+d0, h*g.dim+min(d0+quantGroupDims, g.dim)
					if packed {
						var tab [16]uint32
						c.fillTable(tab[:], zero, scale, lim)
						at := t*g.chans + a
						lookupPacked(out[a*es:b*es], codes[at/2:(at+b-a)/2], tab[:], 0)
						continue
					}
					c.dequantGroup(out[a*es:b*es], q[a:b], zero, scale, lim, s)
				}
			}
			continue
		}
		q := c.getCodes(s.codes[:g.chans], codes, t*g.chans)
		row := s.row[:g.chans]
		for h := 0; h < g.heads; h++ {
			for d0 := 0; d0 < g.dim; d0 += quantGroupDims {
				_, scale, err := c.loadParams(params[gi*ps:])
				if err != nil {
					return err
				}
				gi++
				a, b := h*g.dim+d0, h*g.dim+min(d0+quantGroupDims, g.dim)
				out, qg := row[a:b], q[a:b]
				if sc, ok := c.fp8Fast(scale); ok {
					if err := fp8Group(dst[t*rowBytes+a*es:t*rowBytes+b*es], qg, lut, sc, c.dt); err != nil {
						return err
					}
					continue
				}
				if err := fp8Check(qg); err != nil {
					return err
				}
				for i, b := range qg {
					out[i] = clampF32(float64(lut[b])*scale, lim)
				}
				NarrowRow(dst[t*rowBytes+a*es:t*rowBytes+b*es], out, c.dt)
			}
		}
	}
	return nil
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

// fastParams returns a group's parameters in float32 and whether the int8
// float32 path computes the reference result for every code of the group.
func (c quantCodec) fastParams(zero, scale float64) (z, s float32, ok bool) {
	if c.dt == F32 || c.kind != quantInt8 || scale*255 >= 0x1p127 {
		return 0, 0, false
	}
	z, s = float32(zero), float32(scale)
	top := z + float32(float32(255)*s)
	return z, s, top <= float32(maxFinite(c.dt))
}

// dequantGroup writes the outputs of one group's int codes (unpacked in q)
// into out, sharing one zero and scale.
func (c quantCodec) dequantGroup(out, q []byte, zero, scale, lim float64, s *quantScratch) {
	if c.kind == quantInt4 {
		var tab [16]uint32
		c.fillTable(tab[:], zero, scale, lim)
		c.lookupGroup(out, q, &tab)
		return
	}
	if z, sc, ok := c.fastParams(zero, scale); ok {
		int8Group(out, q, z, sc, c.dt)
		return
	}
	row := s.row[:len(q)]
	for i, b := range q {
		row[i] = clampF32(zero+float64(b)*scale, lim)
	}
	NarrowRow(out, row, c.dt)
}

// int8Group writes the outputs of int8 codes q sharing the float32
// parameters z and sc that fastParams admitted (so dt is bf16 or f16).
func int8Group(out, q []byte, z, sc float32, dt DType) {
	out = out[:2*len(q)]
	if k := len(q) &^ 7; useAVX2 && k > 0 {
		if dt == BF16 {
			int8GroupBF16AVX2(&out[0], &q[0], z, sc, k)
		} else {
			int8GroupF16AVX2(&out[0], &q[0], z, sc, k)
		}
		out, q = out[2*k:], q[k:]
	}
	int8GroupGo(out, q, z, sc, dt)
}

// int8GroupGo is int8Group in Go: the kernels' reference.
func int8GroupGo(out, q []byte, z, sc float32, dt DType) {
	out = out[:2*len(q)]
	if dt == BF16 {
		for i, b := range q {
			binary.LittleEndian.PutUint16(out[2*i:], bf16Bits(z+float32(float32(b)*sc)))
		}
		return
	}
	for i, b := range q {
		// f16Bits by hand: it is over the inlining budget, and a
		// call per element cost 0.88 -> 0.57 GB/s per CPU-s here (-bench Decode/int8/f16).
		v := z + float32(float32(b)*sc)
		h, ok := halfNormal(v)
		if !ok {
			h = F32ToF16(v)
		}
		binary.LittleEndian.PutUint16(out[2*i:], h)
	}
}

// fp8 fast paths. The reference output of code b is
// clampF32(float64(lut[b])*scale, lim) narrowed into the dtype. For bf16
// and f16 entries the scale is a value of the 16-bit dtype (at most 11
// significant bits) and an e4m3 value has 4, so their product is exact in
// float32 unless it overflows, and a float32 product below the normal
// range rounds once, as float32(float64 product) does. fp8Fast admits a
// scale whose largest output, 448*scale, is at most lim: then no code
// overflows or needs the clamp, and the float32 product is the reference
// value.

// fp8Fast returns scale in float32 and whether the float32 path computes
// the reference result for every code of a group with that scale.
func (c quantCodec) fp8Fast(scale float64) (float32, bool) {
	if c.dt == F32 || !(scale*FP8E4M3Max <= maxFinite(c.dt)) {
		return 0, false
	}
	return float32(scale), true
}

// fp8FastRow is fp8Fast for every channel's scale, into s32.
func (c quantCodec) fp8FastRow(scale []float64, s32 []float32) bool {
	s32 = s32[:len(scale)]
	for i, sc := range scale {
		v, ok := c.fp8Fast(sc)
		if !ok {
			return false
		}
		s32[i] = v
	}
	return true
}

// fp8Group writes the outputs of codes q sharing scale sc (fp8Fast
// admitted) into out, 16-bit dtype elements; a NaN code is ErrCorrupt.
func fp8Group(out, q []byte, lut *[256]float32, sc float32, dt DType) error {
	out = out[:2*len(q)]
	if k := len(q) &^ 7; useAVX2 && k > 0 {
		var nan bool
		if dt == BF16 {
			nan = fp8GroupBF16AVX2(&out[0], &q[0], sc, k)
		} else {
			nan = fp8GroupF16AVX2(&out[0], &q[0], sc, k)
		}
		if nan {
			return errFP8NaN()
		}
		out, q = out[2*k:], q[k:]
	}
	if err := fp8Check(q); err != nil {
		return err
	}
	fp8GroupGo(out, q, lut, sc, dt)
	return nil
}

// fp8GroupGo is fp8Group in Go, for codes without NaN: the kernels'
// reference.
func fp8GroupGo(out, q []byte, lut *[256]float32, sc float32, dt DType) {
	out = out[:2*len(q)]
	if dt == BF16 {
		for len(q) >= 4 {
			o := out[:8]
			binary.LittleEndian.PutUint64(o, uint64(bf16Bits(lut[q[0]]*sc))|uint64(bf16Bits(lut[q[1]]*sc))<<16|
				uint64(bf16Bits(lut[q[2]]*sc))<<32|uint64(bf16Bits(lut[q[3]]*sc))<<48)
			out, q = out[8:], q[4:]
		}
		for i, b := range q {
			binary.LittleEndian.PutUint16(out[2*i:], bf16Bits(lut[b]*sc))
		}
		return
	}
	for i, b := range q {
		v := lut[b] * sc
		h, ok := halfNormal(v)
		if !ok {
			h = F32ToF16(v)
		}
		binary.LittleEndian.PutUint16(out[2*i:], h)
	}
}

// fp8Row writes a key row of codes q with per-channel scales (fp8Fast
// admitted each) into out; a NaN code is ErrCorrupt.
func fp8Row(out, q []byte, lut *[256]float32, scale []float32, dt DType) error {
	out = out[:2*len(q)]
	scale = scale[:len(q)]
	if k := len(q) &^ 7; useAVX2 && k > 0 {
		var nan bool
		if dt == BF16 {
			nan = fp8RowBF16AVX2(&out[0], &q[0], &scale[0], k)
		} else {
			nan = fp8RowF16AVX2(&out[0], &q[0], &scale[0], k)
		}
		if nan {
			return errFP8NaN()
		}
		out, q, scale = out[2*k:], q[k:], scale[k:]
	}
	if err := fp8Check(q); err != nil {
		return err
	}
	fp8RowGo(out, q, lut, scale, dt)
	return nil
}

// fp8RowGo is fp8Row in Go, for codes without NaN: the kernels'
// reference.
func fp8RowGo(out, q []byte, lut *[256]float32, scale []float32, dt DType) {
	out = out[:2*len(q)]
	scale = scale[:len(q)]
	if dt == BF16 {
		for i, b := range q {
			binary.LittleEndian.PutUint16(out[2*i:], bf16Bits(lut[b]*scale[i]))
		}
		return
	}
	for i, b := range q {
		v := lut[b] * scale[i]
		h, ok := halfNormal(v)
		if !ok {
			h = F32ToF16(v)
		}
		binary.LittleEndian.PutUint16(out[2*i:], h)
	}
}

// dequantRow writes a key row of int8 codes with per-channel parameters
// that fastParams admitted (so dt is bf16 or f16).
func (c quantCodec) dequantRow(out, q []byte, zero, scale []float32) {
	out = out[:2*len(q)]
	zero, scale = zero[:len(q)], scale[:len(q)]
	if k := len(q) &^ 7; useAVX2 && k > 0 {
		if c.dt == BF16 {
			int8RowBF16AVX2(&out[0], &q[0], &zero[0], &scale[0], k)
		} else {
			int8RowF16AVX2(&out[0], &q[0], &zero[0], &scale[0], k)
		}
		out, q, zero, scale = out[2*k:], q[k:], zero[k:], scale[k:]
	}
	dequantRowGo(out, q, zero, scale, c.dt)
}

// dequantRowGo is dequantRow in Go: the kernels' reference.
func dequantRowGo(out, q []byte, zero, scale []float32, dt DType) {
	out = out[:2*len(q)]
	zero, scale = zero[:len(q)], scale[:len(q)]
	if dt == BF16 {
		for i, b := range q {
			binary.LittleEndian.PutUint16(out[2*i:], bf16Bits(zero[i]+float32(float32(b)*scale[i])))
		}
		return
	}
	for i, b := range q {
		v := zero[i] + float32(float32(b)*scale[i])
		h, ok := halfNormal(v)
		if !ok {
			h = F32ToF16(v)
		}
		binary.LittleEndian.PutUint16(out[2*i:], h)
	}
}

// fillTable stores in tab[b] the dtype bits of the reference output of
// code b.
func (c quantCodec) fillTable(tab []uint32, zero, scale, lim float64) {
	for b := range tab {
		v := clampF32(zero+float64(b)*scale, lim)
		switch c.dt {
		case F32:
			tab[b] = math.Float32bits(v)
		case F16:
			tab[b] = uint32(F32ToF16(v))
		default:
			tab[b] = uint32(bf16Bits(v))
		}
	}
}

// lookupGroup writes the table outputs of codes q (one table).
func (c quantCodec) lookupGroup(out, q []byte, tab *[16]uint32) {
	if c.dt == F32 {
		out = out[:4*len(q)]
		for i, b := range q {
			binary.LittleEndian.PutUint32(out[4*i:], tab[b&15])
		}
		return
	}
	out = out[:2*len(q)]
	for i, b := range q {
		binary.LittleEndian.PutUint16(out[2*i:], uint16(tab[b&15]))
	}
}

// lookupRow writes the table outputs of a key row's codes q, channel i
// looking up tab[16*i:16*i+16].
func (c quantCodec) lookupRow(out, q []byte, tab []uint32) {
	tab = tab[:16*len(q)]
	if c.dt == F32 {
		out = out[:4*len(q)]
		for i, b := range q {
			binary.LittleEndian.PutUint32(out[4*i:], tab[16*i+int(b&15)])
		}
		return
	}
	out = out[:2*len(q)]
	for i, b := range q {
		binary.LittleEndian.PutUint16(out[2*i:], uint16(tab[16*i+int(b&15)]))
	}
}

// lookupPacked writes the 16-bit table outputs of packed int4 codes (two
// per byte, low nibble first) into out. Byte k's codes look up
// tab[k*stride:] and tab[k*stride+stride/2:]: stride 32 walks per-channel
// tables (keys), stride 0 stays on one table (a value group).
func lookupPacked(out, src []byte, tab []uint32, stride int) {
	out = out[:4*len(src)]
	if stride == 0 {
		t := (*[16]uint32)(tab[:16])
		for len(src) >= 4 {
			o, b := out[:16], src[:4]
			binary.LittleEndian.PutUint32(o[0:], t[b[0]&15]|t[b[0]>>4]<<16)
			binary.LittleEndian.PutUint32(o[4:], t[b[1]&15]|t[b[1]>>4]<<16)
			binary.LittleEndian.PutUint32(o[8:], t[b[2]&15]|t[b[2]>>4]<<16)
			binary.LittleEndian.PutUint32(o[12:], t[b[3]&15]|t[b[3]>>4]<<16)
			out, src = out[16:], src[4:]
		}
		for k, b := range src {
			binary.LittleEndian.PutUint32(out[4*k:], t[b&15]|t[b>>4]<<16)
		}
		return
	}
	tab = tab[:32*len(src)]
	for k, b := range src {
		t := (*[32]uint32)(tab[32*k:])
		binary.LittleEndian.PutUint32(out[4*k:], t[b&15]|t[16+b>>4]<<16)
	}
}

// bf16Bits rounds a finite float32 to bf16 bits, to nearest even (NarrowRow's
// rounding).
func bf16Bits(v float32) uint16 {
	u := math.Float32bits(v)
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

// f16Bits is F32ToF16 with its common case (a normal half) inline; the
// call is kept out of the inlined part (halfNormal) so that loops pay for
// it only on subnormal results.
func f16Bits(v float32) uint16 {
	if h, ok := halfNormal(v); ok {
		return h
	}
	return F32ToF16(v)
}

// halfNormal is F32ToF16(v) when that is a finite normal half (ok).
func halfNormal(v float32) (h uint16, ok bool) {
	u := math.Float32bits(v)
	a := u & 0x7fffffff
	a -= 0x38800000 // 2^-14, the smallest normal half
	if a >= 0x477ff000-0x38800000 {
		return 0, false
	}
	a += (0x38800000 - 112<<23) + 0x0fff + (a>>13)&1
	return uint16(u>>16)&0x8000 | uint16(a>>13), true
}

// clampF32 narrows v to float32 within the dtype's finite range (lim), so
// that a value just above the largest finite one does not round to Inf.
func clampF32(v, lim float64) float32 {
	if v > lim {
		v = lim
	} else if v < -lim {
		v = -lim
	}
	return float32(v)
}

// fp8Check rejects the e4m3 NaN codes, which the encoder never writes.
func fp8Check(q []byte) error {
	// Eight codes at a time: a byte of x is zero where the code's low
	// seven bits are all set.
	const ones, highs = 0x0101_0101_0101_0101, 0x8080_8080_8080_8080
	for len(q) >= 8 {
		x := binary.LittleEndian.Uint64(q) & ^uint64(highs) ^ (0x7f * ones)
		if (x-ones)&^x&highs != 0 {
			return errFP8NaN()
		}
		q = q[8:]
	}
	for _, b := range q {
		if b&0x7f == 0x7f {
			return errFP8NaN()
		}
	}
	return nil
}

func errFP8NaN() error { return fmt.Errorf("%w: fp8 NaN code", ErrCorrupt) }

// getCodes returns the codes of elements [at, at+len(buf)), unpacking int4
// into buf.
func (c quantCodec) getCodes(buf, codes []byte, at int) []byte {
	if c.kind != quantInt4 {
		return codes[at : at+len(buf)]
	}
	i := 0
	if at&1 == 0 { // the common case: whole bytes, two codes each
		src := codes[at>>1 : at>>1+len(buf)>>1]
		for k, b := range src {
			buf[2*k] = b & 15
			buf[2*k+1] = b >> 4
		}
		i = 2 * len(src)
	}
	for ; i < len(buf); i++ {
		j := at + i
		buf[i] = codes[j>>1] >> (4 * (j & 1)) & 15
	}
	return buf
}

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
