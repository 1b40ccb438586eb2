package chunk

import "fmt"

// The int8/int4 decoder as it was before the float32 and lookup-table fast
// paths (float64 per element, a float32 row, then NarrowRow): the reference
// that TestQuantDecodeMatchesReference holds the decoder bit-identical to.
// Only the names differ from that version.

func (c quantCodec) decodeRef(dst, enc []byte, sh Shape) error {
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
	if err := c.decodeKRef(dst[:halfBytes], kParams, kCodes, g, s, &lut); err != nil {
		return err
	}
	return c.decodeVRef(dst[halfBytes:], vParams, vCodes, g, s, &lut)
}

func (c quantCodec) decodeKRef(dst, params, codes []byte, g quantGeom, s *quantScratch, lut *[256]float32) error {
	es := c.dt.Size()
	ps := c.kind.params() * es
	rowBytes := g.chans * es
	lim := maxFinite(c.dt)
	for tg := 0; tg < g.kGroups; tg++ {
		p := params[tg*g.chans*ps:]
		for i := 0; i < g.chans; i++ {
			var err error
			if s.zero[i], s.scale[i], err = c.loadParams(p[i*ps:]); err != nil {
				return err
			}
		}
		for t := tg * quantGroupTokens; t < min((tg+1)*quantGroupTokens, g.tokens); t++ {
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

func (c quantCodec) decodeVRef(dst, params, codes []byte, g quantGeom, s *quantScratch, lut *[256]float32) error {
	es := c.dt.Size()
	ps := c.kind.params() * es
	rowBytes := g.chans * es
	lim := maxFinite(c.dt)
	gi := 0
	for t := 0; t < g.tokens; t++ {
		q := c.getCodes(s.codes[:g.chans], codes, t*g.chans)
		if c.kind == quantFP8 {
			if err := fp8Check(q); err != nil {
				return err
			}
		}
		row := s.row[:g.chans]
		for h := 0; h < g.heads; h++ {
			for d0 := 0; d0 < g.dim; d0 += quantGroupDims {
				zero, scale, err := c.loadParams(params[gi*ps:])
				if err != nil {
					return err
				}
				gi++
				a, b := h*g.dim+d0, h*g.dim+min(d0+quantGroupDims, g.dim)
				out, qg := row[a:b], q[a:b]
				if c.kind == quantFP8 {
					for i, b := range qg {
						out[i] = clampF32(float64(lut[b])*scale, lim)
					}
				} else {
					for i, b := range qg {
						out[i] = clampF32(zero+float64(b)*scale, lim)
					}
				}
			}
		}
		NarrowRow(dst[t*rowBytes:(t+1)*rowBytes], row, c.dt)
	}
	return nil
}
