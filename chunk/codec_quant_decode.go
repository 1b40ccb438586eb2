package chunk

import (
	"encoding/binary"
	"fmt"
	"math"
)

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
