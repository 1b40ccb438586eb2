package cudakern

import (
	"encoding/binary"
	"math"

	"github.com/kvmesh/kvmesh/chunk"
)

// kernelKind names the fused K kernel a plan uses: a dtype-specialised
// NeoX kernel where source and destination share a dtype, otherwise the
// generic widen-rotate-round path through a float32 scratch vector.
type kernelKind uint8

const (
	kernelGeneric kernelKind = iota
	kernelBF16NeoX
	kernelF16NeoX
	kernelF32NeoX
	kernelBF16GPTJ // with AVX512-BF16 only; otherwise the generic path
)

// rotAsm is one assembly rotation kernel (see kernel_amd64.go): NeoX pairs
// i < n of count head vectors sharing one cos/sin row.
type rotAsm func(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)

// rotScalar is the Go form of a same-dtype NeoX kernel for pairs
// [from, half) of one head vector.
type rotScalar func(dst, src []byte, c, s []float32, half, from int)

// pick chooses the kernels of p once per call, from its dtype kernel and
// the simd, avx512 and nt flags: the widest assembly kernel takes what it
// can (wide, wideN pairs), the AVX2 one the next multiple of 8 (narrow,
// narrowN), Go the rest. Every one gives the same bits.
func (p *plan) pick() {
	p.wide, p.narrow, p.wideN, p.narrowN, p.scalar = nil, nil, 0, 0, nil
	p.pickFP8()
	var avx2, avx2NT, avx512, avx512NT rotAsm
	switch p.kernel {
	case kernelBF16NeoX:
		avx2, avx2NT, avx512, avx512NT = rotNeoXBF16AVX2, rotNeoXBF16AVX2NT, rotNeoXBF16AVX512, rotNeoXBF16AVX512NT
		p.scalar = rotBF16NeoX
	case kernelF16NeoX:
		avx2, avx2NT, avx512, avx512NT = rotNeoXF16AVX2, rotNeoXF16AVX2NT, rotNeoXF16AVX512, rotNeoXF16AVX512NT
		p.scalar = rotF16NeoX
	case kernelF32NeoX:
		avx2, avx2NT, avx512, avx512NT = rotNeoXF32AVX2, rotNeoXF32AVX2NT, rotNeoXF32AVX512, rotNeoXF32AVX512NT
		p.scalar = rotF32NeoX
	case kernelBF16GPTJ:
		if p.simd && !p.bf16 {
			// This kernel needs AVX512-BF16; without it the float32 path
			// (AVX2 GPT-J rotation) is faster than the Go loop.
			return
		}
		p.scalar = rotBF16GPTJ
		if p.simd && p.Rope.half >= 16 {
			p.wide, p.wideN = rotGPTJBF16AVX512BF16, p.Rope.half&^15
			if p.nt {
				p.wide = rotGPTJBF16AVX512BF16NT
			}
		}
		return
	default:
		return
	}
	if !p.simd {
		return
	}
	if p.bf16 && p.kernel == kernelBF16NeoX {
		avx512, avx512NT = rotNeoXBF16AVX512BF16, rotNeoXBF16AVX512BF16NT
	}
	if p.nt {
		avx2, avx512 = avx2NT, avx512NT
	}
	half := p.Rope.half
	if p.avx512 && avx512 != nil && half >= 16 {
		p.wide, p.wideN = avx512, half&^15
	}
	if n := (half - p.wideN) &^ 7; n > 0 {
		p.narrow, p.narrowN = avx2, n
	}
}

// rotHeads rotates count head vectors of one token with one table row:
// source vector k at src[k*p.srcRow:], destination vector k at
// dst[k*dstStride:]. x is a scratch vector of HeadDim float32.
func (p *plan) rotHeads(dst, src []byte, c, s, x []float32, count, dstStride int) {
	t := p.Rope
	sr, row := p.srcRow, t.headDim*p.dstES
	// One bounds check for the token; the kernels stay inside these.
	dst = dst[:(count-1)*dstStride+row]
	src = src[:count*sr]
	if p.fp8K != fp8None {
		nt := b2i(p.nt)
		if p.fp8K == fp8ToBF16 {
			rotNeoXFP8BF16AVX512(&dst[0], &src[0], &c[0], &s[0], t.half, t.half, count, dstStride, sr, p.kArg, nt)
		} else {
			rotNeoXBF16FP8AVX512(&dst[0], &src[0], &c[0], &s[0], t.half, t.half, count, dstStride, sr, p.kArg, p.kDiv, nt)
		}
		return
	}
	if p.scalar == nil {
		p.rotGeneric(dst, src, c, s, x, count, dstStride)
		return
	}
	half, rot, es := t.half, t.rotary, p.srcES
	from := 0
	if p.wide != nil {
		p.wide(&dst[0], &src[0], &c[0], &s[0], p.wideN, half, count, dstStride, sr)
		from = p.wideN
	}
	if p.narrow != nil {
		p.narrow(&dst[from*es], &src[from*es], &c[from], &s[from], p.narrowN, half, count, dstStride, sr)
		from += p.narrowN
	}
	if from == half && rot == t.headDim {
		return
	}
	for k := 0; k < count; k++ {
		d, v := dst[k*dstStride:k*dstStride+row], src[k*sr:(k+1)*sr]
		p.scalar(d, v, c, s, half, from)
		// Same dtype: the dims beyond the rotary ones pass through as bytes.
		copy(d[rot*es:], v[rot*es:])
	}
}

// fp8Path names a single-pass fp8 kernel pair (kernel_fp8_amd64.s).
type fp8Path uint8

const (
	fp8None   fp8Path = iota
	fp8ToBF16         // fp8 source, bf16 cache (needs AVX512-BF16)
	bf16ToFP8         // bf16 source, fp8 cache
)

// pickFP8 chooses the single-pass kernels of an fp8 <-> bf16 plan: one
// read of the source and one write of the destination, in registers,
// instead of widening into the scratch vector, rotating it and rounding it
// in three calls. K needs a fully rotary NeoX head with half a multiple of
// 16, V a head dim that is a multiple of 32 (fp8 -> bf16) or 16; other
// shapes, GPT-J and CPUs without AVX-512 take the generic path (same bits).
func (p *plan) pickFP8() {
	p.fp8K, p.fp8V = fp8None, fp8None
	if !p.simd || !p.avx512 {
		return
	}
	t, hd := p.Rope, p.Layout.HeadDim
	kOK := t.neox && t.rotary == hd && t.half%16 == 0
	switch {
	case p.SrcDType == chunk.FP8E4M3 && p.Layout.DType == chunk.BF16 && p.bf16:
		p.kArg, p.vArg, p.kDiv, p.vDiv = p.srcKScale, p.srcVScale, 0, 0
		if kOK {
			p.fp8K = fp8ToBF16
		}
		if hd%32 == 0 {
			p.fp8V = fp8ToBF16
		}
	case p.SrcDType == chunk.BF16 && p.Layout.DType == chunk.FP8E4M3:
		p.kArg, p.kDiv = fp8StoreArg(p.dstKScale)
		p.vArg, p.vDiv = fp8StoreArg(p.dstVScale)
		if kOK {
			p.fp8K = bf16ToFP8
		}
		if hd%16 == 0 {
			p.fp8V = bf16ToFP8
		}
	}
}

// fp8StoreArg is the scale argument of the fp8-storing kernels: an exact
// reciprocal to multiply by where there is one (the bits of the division),
// else the scale itself with the division flag set.
func fp8StoreArg(scale float32) (arg float32, div int) {
	if r, ok := exactRecip(scale); ok {
		return r, 0
	}
	return scale, 1
}

// convV converts n values of V from src into dst with the plan's fp8 V
// kernel.
func (p *plan) convV(dst, src []byte, n int) {
	dst, src = dst[:n*p.dstES], src[:n*p.srcES]
	if p.fp8V == fp8ToBF16 {
		if p.vArg == 1 { // x * 1 is x: widen the bits, no float arithmetic
			fp8ToBF16WAVX512(&dst[0], &src[0], n, b2i(p.nt))
			return
		}
		fp8ToBF16AVX512(&dst[0], &src[0], n, p.vArg, b2i(p.nt))
	} else {
		bf16ToFP8AVX512(&dst[0], &src[0], n, p.vArg, p.vDiv, b2i(p.nt))
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// isa is the kernel set of the plan's flags.
func (p *plan) isa() isa { return isa{avx2: p.simd, avx512: p.avx512, bf16: p.bf16} }

// rotGeneric is rotHeads through float32: widen as many heads as the
// scratch vector holds with one call, rotate them with one call, round them
// into the destination with one call where the heads are contiguous (NHD,
// BlockNHD).
func (p *plan) rotGeneric(dst, src []byte, c, s, x []float32, count, dstStride int) {
	k := p.isa()
	t := p.Rope
	hd, sr := t.headDim, p.srcRow
	for k0 := 0; k0 < count; {
		g := min(count-k0, len(x)/hd)
		xs := x[:g*hd]
		loadF32(xs, src[k0*sr:(k0+g)*sr], p.SrcDType, p.srcKScale, k)
		t.rotateN(xs, c, s, g, k)
		p.storeHeads(dst[k0*dstStride:], xs, g, dstStride, p.dstKScale)
		k0 += g
	}
}

// storeHeads rounds g float32 head vectors xs into destination heads
// dstStride bytes apart.
func (p *plan) storeHeads(dst []byte, xs []float32, g, dstStride int, scale float32) {
	k := p.isa()
	hd := p.Layout.HeadDim
	row := hd * p.dstES
	if dstStride == row {
		storeF32(dst[:g*row], xs, p.Layout.DType, scale, p.nt, k)
		return
	}
	for h := 0; h < g; h++ {
		storeF32(dst[h*dstStride:h*dstStride+row], xs[h*hd:(h+1)*hd], p.Layout.DType, scale, p.nt, k)
	}
}

// putV writes the values of count heads of one token: source head k at
// src[k*p.srcRow:], destination head k at dst[k*dstStride:]. x is a scratch
// vector of HeadDim float32.
func (p *plan) putV(dst, src []byte, x []float32, count, dstStride int) {
	sr, row := p.srcRow, p.Layout.HeadDim*p.dstES
	dst = dst[:(count-1)*dstStride+row]
	src = src[:count*sr]
	if p.fp8V != fp8None {
		hd := p.Layout.HeadDim
		if dstStride == row { // NHD, BlockNHD: the heads are one run in source and destination
			p.convV(dst, src, count*hd)
			return
		}
		for k := 0; k < count; k++ {
			p.convV(dst[k*dstStride:], src[k*sr:], hd)
		}
		return
	}
	if !p.copyV {
		k := p.isa()
		hd := p.Layout.HeadDim
		for k0 := 0; k0 < count; {
			g := min(count-k0, len(x)/hd)
			xs := x[:g*hd]
			loadF32(xs, src[k0*sr:(k0+g)*sr], p.SrcDType, p.srcVScale, k)
			p.storeHeads(dst[k0*dstStride:], xs, g, dstStride, p.dstVScale)
			k0 += g
		}
		return
	}
	if dstStride == row { // NHD, BlockNHD: the heads are one run in source and destination
		count, row = 1, count*row
	}
	if p.nt && row%64 == 0 {
		copyNT(&dst[0], &src[0], row, count, dstStride, sr)
		return
	}
	for k := 0; k < count; k++ {
		copy(dst[k*dstStride:k*dstStride+row], src[k*sr:k*sr+row])
	}
}

// rotBF16NeoX rotates bf16 pairs [from, half) into bf16: widen, rotate in
// float32 (products rounded to float32, no fused multiply-add), round once.
func rotBF16NeoX(dst, src []byte, c, s []float32, half, from int) {
	a, b := src[:2*half], src[2*half:4*half]
	da, db := dst[:2*half], dst[2*half:4*half]
	c, s = c[:half], s[:half]
	for i := from; i < half; i++ {
		x0 := math.Float32frombits(uint32(binary.LittleEndian.Uint16(a[2*i:])) << 16)
		x1 := math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*i:])) << 16)
		binary.LittleEndian.PutUint16(da[2*i:], chunk.F32ToBF16(float32(x0*c[i])-float32(x1*s[i])))
		binary.LittleEndian.PutUint16(db[2*i:], chunk.F32ToBF16(float32(x1*c[i])+float32(x0*s[i])))
	}
}

// rotBF16GPTJ rotates bf16 GPT-J pairs (2i, 2i+1), i in [from, half), into
// bf16, as rotBF16NeoX does NeoX pairs.
func rotBF16GPTJ(dst, src []byte, c, s []float32, half, from int) {
	src, dst = src[:4*half], dst[:4*half]
	c, s = c[:half], s[:half]
	for i := from; i < half; i++ {
		x0 := math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[4*i:])) << 16)
		x1 := math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[4*i+2:])) << 16)
		binary.LittleEndian.PutUint16(dst[4*i:], chunk.F32ToBF16(float32(x0*c[i])-float32(x1*s[i])))
		binary.LittleEndian.PutUint16(dst[4*i+2:], chunk.F32ToBF16(float32(x1*c[i])+float32(x0*s[i])))
	}
}

// rotF16NeoX is rotBF16NeoX for IEEE half.
func rotF16NeoX(dst, src []byte, c, s []float32, half, from int) {
	a, b := src[:2*half], src[2*half:4*half]
	da, db := dst[:2*half], dst[2*half:4*half]
	c, s = c[:half], s[:half]
	for i := from; i < half; i++ {
		x0 := chunk.F16ToF32(binary.LittleEndian.Uint16(a[2*i:]))
		x1 := chunk.F16ToF32(binary.LittleEndian.Uint16(b[2*i:]))
		binary.LittleEndian.PutUint16(da[2*i:], chunk.F32ToF16(float32(x0*c[i])-float32(x1*s[i])))
		binary.LittleEndian.PutUint16(db[2*i:], chunk.F32ToF16(float32(x1*c[i])+float32(x0*s[i])))
	}
}

// rotF32NeoX is rotBF16NeoX for float32.
func rotF32NeoX(dst, src []byte, c, s []float32, half, from int) {
	a, b := src[:4*half], src[4*half:8*half]
	da, db := dst[:4*half], dst[4*half:8*half]
	c, s = c[:half], s[:half]
	for i := from; i < half; i++ {
		x0 := math.Float32frombits(binary.LittleEndian.Uint32(a[4*i:]))
		x1 := math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		binary.LittleEndian.PutUint32(da[4*i:], math.Float32bits(float32(x0*c[i])-float32(x1*s[i])))
		binary.LittleEndian.PutUint32(db[4*i:], math.Float32bits(float32(x1*c[i])+float32(x0*s[i])))
	}
}
