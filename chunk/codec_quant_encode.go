package chunk

import (
	"encoding/binary"
	"fmt"
	"math"
)

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
