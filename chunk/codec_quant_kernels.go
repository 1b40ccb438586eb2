package chunk

import (
	"encoding/binary"
	"math"
)

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
