//go:build !amd64 || purego

package chunk

// useAVX2 is false where simd_amd64.s is not built: the Go loops decode
// everything and the kernels below are never called.
const useAVX2 = false

// huffAsm is false: huffDecoder.fast2 decodes the streams.
const huffAsm = false

func int8RowBF16AVX2(out, q *byte, zero, scale *float32, n int)            { panic("chunk: no AVX2") }
func int8RowF16AVX2(out, q *byte, zero, scale *float32, n int)             { panic("chunk: no AVX2") }
func int8GroupBF16AVX2(out, q *byte, zero, scale float32, n int)           { panic("chunk: no AVX2") }
func int8GroupF16AVX2(out, q *byte, zero, scale float32, n int)            { panic("chunk: no AVX2") }
func fp8RowBF16AVX2(out, q *byte, scale *float32, n int) bool              { panic("chunk: no AVX2") }
func fp8RowF16AVX2(out, q *byte, scale *float32, n int) bool               { panic("chunk: no AVX2") }
func fp8GroupBF16AVX2(out, q *byte, scale float32, n int) bool             { panic("chunk: no AVX2") }
func fp8GroupF16AVX2(out, q *byte, scale float32, n int) bool              { panic("chunk: no AVX2") }
func mergeBF16AVX2(out, p0, p1 *byte, n int)                               { panic("chunk: no AVX2") }
func mergeF16AVX2(out, p0, p1 *byte, n int)                                { panic("chunk: no AVX2") }
func mergeF16ExpAVX2(out, exp, lo, bits *byte, n int) bool                 { panic("chunk: no AVX2") }
func huffFast4(tab *[1 << huffWindow]uint64, out *byte, st *huffFastState) { panic("chunk: no asm") }
