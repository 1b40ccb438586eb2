//go:build !amd64 || purego

package cudakern

// hasSIMD is false where no assembly kernel exists; the portable Go kernels
// run instead and the stubs below are never called.
func hasSIMD() bool { return false }

func hasAVX512() bool { return false }

func hasAVX512BF16() bool { return false }

func rotNeoXBF16AVX512BF16(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int) {
	panic("cudakern: no SIMD")
}

func rotNeoXBF16AVX512BF16NT(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int) {
	panic("cudakern: no SIMD")
}

func rotNeoXBF16AVX2(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int) {
	panic("cudakern: no SIMD")
}
func rotNeoXF16AVX2(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int) {
	panic("cudakern: no SIMD")
}
func rotNeoXF32AVX2(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int) {
	panic("cudakern: no SIMD")
}
func rotNeoXBF16AVX2NT(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int) {
	panic("cudakern: no SIMD")
}
func rotNeoXF16AVX2NT(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int) {
	panic("cudakern: no SIMD")
}
func rotNeoXF32AVX2NT(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int) {
	panic("cudakern: no SIMD")
}
func copyNT(dst, src *byte, n, count, dstStride, srcStride int) { panic("cudakern: no SIMD") }
func sfence()                                                   {}
func rotNeoXBF16AVX512(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int) {
	panic("cudakern: no SIMD")
}
func rotNeoXF16AVX512(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int) {
	panic("cudakern: no SIMD")
}
func rotNeoXBF16AVX512NT(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int) {
	panic("cudakern: no SIMD")
}
func rotNeoXF16AVX512NT(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int) {
	panic("cudakern: no SIMD")
}
func storeFP8AVX2(dst *byte, src *float32, n int, scale float32)   { panic("cudakern: no SIMD") }
func storeFP8AVX2NT(dst *byte, src *float32, n int, scale float32) { panic("cudakern: no SIMD") }
func widenBF16AVX2(dst *float32, src *byte, n int)                 { panic("cudakern: no SIMD") }
func widenF16AVX2(dst *float32, src *byte, n int)                  { panic("cudakern: no SIMD") }
func widenFP8AVX2(dst *float32, src *byte, n int, scale float32)   { panic("cudakern: no SIMD") }
func narrowBF16AVX2(dst *byte, src *float32, n int)                { panic("cudakern: no SIMD") }
func narrowF16AVX2(dst *byte, src *float32, n int)                 { panic("cudakern: no SIMD") }

func rotNeoXF32AVX512(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int) {
	panic("cudakern: no SIMD")
}

func rotNeoXF32AVX512NT(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int) {
	panic("cudakern: no SIMD")
}

func rotGPTJF32AVX2(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int) {
	panic("cudakern: no SIMD")
}

func storeFP8MulAVX512(dst *byte, src *float32, n int, scale float32)   { panic("cudakern: no SIMD") }
func storeFP8MulAVX512NT(dst *byte, src *float32, n int, scale float32) { panic("cudakern: no SIMD") }
func storeFP8DivAVX512(dst *byte, src *float32, n int, scale float32)   { panic("cudakern: no SIMD") }
func storeFP8DivAVX512NT(dst *byte, src *float32, n int, scale float32) { panic("cudakern: no SIMD") }
func storeFP8AVX512(dst *byte, src *float32, n int, scale float32)      { panic("cudakern: no SIMD") }
func storeFP8AVX512NT(dst *byte, src *float32, n int, scale float32)    { panic("cudakern: no SIMD") }
func widenFP8AVX512(dst *float32, src *byte, n int, scale float32)      { panic("cudakern: no SIMD") }
func narrowBF16AVX512BF16(dst *byte, src *float32, n int)               { panic("cudakern: no SIMD") }
func narrowBF16AVX512BF16NT(dst *byte, src *float32, n int)             { panic("cudakern: no SIMD") }

func widenBF16AVX512(dst *float32, src *byte, n int) { panic("cudakern: no SIMD") }
func widenF16AVX512(dst *float32, src *byte, n int)  { panic("cudakern: no SIMD") }

func rotGPTJBF16AVX512BF16(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int) {
	panic("cudakern: no SIMD")
}

func rotGPTJBF16AVX512BF16NT(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int) {
	panic("cudakern: no SIMD")
}

func fp8ToBF16AVX512(dst, src *byte, n int, scale float32, nt int) { panic("cudakern: no SIMD") }

func rotNeoXFP8BF16AVX512(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int, scale float32, nt int) {
	panic("cudakern: no SIMD")
}

func bf16ToFP8AVX512(dst, src *byte, n int, scale float32, div, nt int) { panic("cudakern: no SIMD") }

func rotNeoXBF16FP8AVX512(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int, scale float32, div, nt int) {
	panic("cudakern: no SIMD")
}

func fp8ToBF16WAVX512(dst, src *byte, n int, nt int) { panic("cudakern: no SIMD") }
