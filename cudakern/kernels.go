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

// simdKernel is one assembly rotation kernel (see kernel_amd64.go).
type simdKernel func(dst, src *byte, cos, sin *float32, n, half int)

// simdKernels are the assembly kernels of one dtype; nil where none exists.
type simdKernels struct {
	avx2, avx2NT, avx512, avx512NT simdKernel
}

// rotKey rotates one source head vector src into dst, both HeadDim long,
// with one row of the table. x is a scratch vector of HeadDim float32.
func (p *plan) rotKey(dst, src []byte, c, s, x []float32) {
	t := p.Rope
	half, rot := t.half, t.rotary
	es := p.srcES
	var ks simdKernels
	var scalar func(dst, src []byte, c, s []float32, half, from int)
	switch p.kernel {
	case kernelBF16NeoX:
		ks = simdKernels{rotNeoXBF16AVX2, rotNeoXBF16AVX2NT, rotNeoXBF16AVX512, rotNeoXBF16AVX512NT}
		scalar = rotBF16NeoX
	case kernelF16NeoX:
		ks = simdKernels{rotNeoXF16AVX2, rotNeoXF16AVX2NT, rotNeoXF16AVX512, rotNeoXF16AVX512NT}
		scalar = rotF16NeoX
	case kernelF32NeoX:
		ks = simdKernels{avx2: rotNeoXF32AVX2, avx2NT: rotNeoXF32AVX2NT}
		scalar = rotF32NeoX
	default:
		loadF32(x, src, p.SrcDType, p.srcKScale)
		t.rotate(x, c, s)
		storeF32(dst, x, p.Layout.DType, p.dstKScale, p.nt)
		return
	}
	from := 0
	if p.simd {
		// The widest kernel takes what it can, the AVX2 one the next 8
		// pairs, Go the rest; every one gives the same bits.
		if k := ks.avx512; p.avx512 && k != nil && half >= 16 {
			if p.nt {
				k = ks.avx512NT
			}
			from = half &^ 15
			k(&dst[0], &src[0], &c[0], &s[0], from, half)
		}
		if n := (half - from) &^ 7; n > 0 {
			k := ks.avx2
			if p.nt {
				k = ks.avx2NT
			}
			k(&dst[from*es], &src[from*es], &c[from], &s[from], n, half)
			from += n
		}
	}
	scalar(dst, src, c, s, half, from)
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
