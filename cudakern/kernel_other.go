//go:build !amd64 || purego

package cudakern

// hasSIMD is false where no assembly kernel exists; the portable Go kernels
// run instead.
func hasSIMD() bool { return false }

func rotNeoXBF16AVX2(dst, src *byte, cos, sin *float32, n, half int) {
	panic("cudakern: no SIMD kernel")
}
func rotNeoXF16AVX2(dst, src *byte, cos, sin *float32, n, half int) {
	panic("cudakern: no SIMD kernel")
}
func rotNeoXF32AVX2(dst, src *byte, cos, sin *float32, n, half int) {
	panic("cudakern: no SIMD kernel")
}
