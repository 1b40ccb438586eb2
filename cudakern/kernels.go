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
)

// rotKey rotates one source head vector src into dst, both HeadDim long,
// with one row of the table. x is a scratch vector of HeadDim float32.
func (p *plan) rotKey(dst, src []byte, c, s, x []float32) {
	t := p.Rope
	half, rot := t.half, t.rotary
	es := p.srcES
	from := 0
	switch p.kernel {
	case kernelBF16NeoX:
		if p.simd && half >= 8 {
			from = half &^ 7
			if p.nt {
				rotNeoXBF16AVX2NT(&dst[0], &src[0], &c[0], &s[0], from, half)
			} else {
				rotNeoXBF16AVX2(&dst[0], &src[0], &c[0], &s[0], from, half)
			}
		}
		rotBF16NeoX(dst, src, c, s, half, from)
	case kernelF16NeoX:
		if p.simd && half >= 8 {
			from = half &^ 7
			if p.nt {
				rotNeoXF16AVX2NT(&dst[0], &src[0], &c[0], &s[0], from, half)
			} else {
				rotNeoXF16AVX2(&dst[0], &src[0], &c[0], &s[0], from, half)
			}
		}
		rotF16NeoX(dst, src, c, s, half, from)
	case kernelF32NeoX:
		if p.simd && half >= 8 {
			from = half &^ 7
			if p.nt {
				rotNeoXF32AVX2NT(&dst[0], &src[0], &c[0], &s[0], from, half)
			} else {
				rotNeoXF32AVX2(&dst[0], &src[0], &c[0], &s[0], from, half)
			}
		}
		rotF32NeoX(dst, src, c, s, half, from)
	default:
		loadF32(x, src, p.SrcDType, p.srcKScale)
		t.rotate(x, c, s)
		storeF32(dst, x, p.Layout.DType, p.dstKScale)
		return
	}
	// Same dtype: the dims beyond the rotary ones pass through as bytes.
	copy(dst[rot*es:], src[rot*es:])
}

// copyRun copies one run of V bytes, with non-temporal stores when the plan
// uses them and the run allows.
func (p *plan) copyRun(dst, src []byte) {
	if p.nt && len(src)%64 == 0 {
		copyNT(&dst[0], &src[0], len(src))
		return
	}
	copy(dst, src)
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
