//go:build !purego

package cudakern

import "golang.org/x/sys/cpu"

// hasSIMD reports whether the AVX2 kernels can run here.
func hasSIMD() bool { return cpu.X86.HasAVX2 && cpu.X86.HasF16C }

// hasAVX512 reports whether the AVX-512 kernels can run here too.
func hasAVX512() bool { return hasSIMD() && cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW }

// The AVX2 kernels (kernel_amd64.s) rotate NeoX pairs i < n of a head
// vector whose halves start at element 0 and element half; n is a positive
// multiple of 8 and at most half; cos and sin hold at least n. Each does
// this for count vectors with the same cos and sin, vector k at
// dst+k*dstStride and src+k*srcStride (bytes). The NT variants need both
// halves of dst 16-byte aligned (32 for f32).

//go:noescape
func rotNeoXBF16AVX2(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)

//go:noescape
func rotNeoXF16AVX2(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)

//go:noescape
func rotNeoXF32AVX2(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)

//go:noescape
func rotNeoXBF16AVX2NT(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)

//go:noescape
func rotNeoXF16AVX2NT(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)

//go:noescape
func rotNeoXF32AVX2NT(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)

// copyNT copies count runs of n bytes, n a positive multiple of 64, to
// 32-byte aligned destinations with non-temporal stores; run k is at
// dst+k*dstStride and src+k*srcStride.
//
//go:noescape
func copyNT(dst, src *byte, n, count, dstStride, srcStride int)

// sfence orders the non-temporal stores before every later store.
func sfence()

//go:noescape
func rotNeoXBF16AVX512(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)

//go:noescape
func rotNeoXF16AVX512(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)

//go:noescape
func rotNeoXBF16AVX512NT(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)

//go:noescape
func rotNeoXF16AVX512NT(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)

// storeFP8AVX2 writes fp8(src[i] / scale) for i < n, a positive multiple of
// 8, with the bytes of chunk.F32ToFP8E4M3.
//
//go:noescape
func storeFP8AVX2(dst *byte, src *float32, n int, scale float32)

// storeFP8AVX2NT is storeFP8AVX2 with non-temporal stores.
//
//go:noescape
func storeFP8AVX2NT(dst *byte, src *float32, n int, scale float32)

// Vector conversions for loadF32 and storeF32; n is a positive multiple of 8.

//go:noescape
func widenBF16AVX2(dst *float32, src *byte, n int)

//go:noescape
func widenF16AVX2(dst *float32, src *byte, n int)

//go:noescape
func widenFP8AVX2(dst *float32, src *byte, n int, scale float32)

//go:noescape
func narrowBF16AVX2(dst *byte, src *float32, n int)

//go:noescape
func narrowF16AVX2(dst *byte, src *float32, n int)

// hasAVX512BF16 reports whether the AVX512-BF16 rotation kernels can run.
func hasAVX512BF16() bool { return hasAVX512() && cpu.X86.HasAVX512BF16 }

// rotNeoXBF16AVX512BF16 is rotNeoXBF16AVX512 rounding with VCVTNE2PS2BF16
// (same bits); n is a positive multiple of 16.
//
//go:noescape
func rotNeoXBF16AVX512BF16(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)

//go:noescape
func rotNeoXBF16AVX512BF16NT(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)

// rotNeoXF32AVX512 is rotNeoXF32AVX2 16 pairs at a time; n is a positive
// multiple of 16.
//
//go:noescape
func rotNeoXF32AVX512(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)

//go:noescape
func rotNeoXF32AVX512NT(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)

// rotGPTJF32AVX2 rotates GPT-J (interleaved) pairs i < n of float32 head
// vectors, n a positive multiple of 4 (half is unused); dst may equal src.
//
//go:noescape
func rotGPTJF32AVX2(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)

// storeFP8MulAVX512 writes fp8(src[i] * scale) and storeFP8DivAVX512
// fp8(src[i] / scale) for i < n, a positive multiple of 64, with the bytes
// of chunk.F32ToFP8E4M3; the NT forms need dst 64-byte aligned.
//
//go:noescape
func storeFP8MulAVX512(dst *byte, src *float32, n int, scale float32)

//go:noescape
func storeFP8MulAVX512NT(dst *byte, src *float32, n int, scale float32)

//go:noescape
func storeFP8DivAVX512(dst *byte, src *float32, n int, scale float32)

//go:noescape
func storeFP8DivAVX512NT(dst *byte, src *float32, n int, scale float32)

// storeFP8AVX512 and storeFP8AVX512NT are storeFP8MulAVX512 without the
// scaling (scale 1); the scale argument is ignored.
//
//go:noescape
func storeFP8AVX512(dst *byte, src *float32, n int, scale float32)

//go:noescape
func storeFP8AVX512NT(dst *byte, src *float32, n int, scale float32)

// widenFP8AVX512 is widenFP8AVX2 16 values at a time.
//
//go:noescape
func widenFP8AVX512(dst *float32, src *byte, n int, scale float32)

// narrowBF16AVX512BF16 is narrowBF16AVX2 32 values at a time (VCVTNE2PS2BF16
// with a subnormal fix-up); the NT form needs dst 64-byte aligned.
//
//go:noescape
func narrowBF16AVX512BF16(dst *byte, src *float32, n int)

//go:noescape
func narrowBF16AVX512BF16NT(dst *byte, src *float32, n int)

// widenBF16AVX512 and widenF16AVX512 are the AVX2 widenings 32 values at a
// time; n is a positive multiple of 32.
//
//go:noescape
func widenBF16AVX512(dst *float32, src *byte, n int)

//go:noescape
func widenF16AVX512(dst *float32, src *byte, n int)

// rotGPTJBF16AVX512BF16 rotates GPT-J pairs i < n of bf16 head vectors in
// registers, n a positive multiple of 16 (half is unused); the NT form
// needs dst 64-byte aligned.
//
//go:noescape
func rotGPTJBF16AVX512BF16(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)

//go:noescape
func rotGPTJBF16AVX512BF16NT(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)

// The single-pass fp8 kernels (kernel_fp8_amd64.s). A nonzero nt stores
// non-temporally: it needs dst 64-byte aligned, and for the rotations both
// halves of every head vector (useNT checks this).

// fp8ToBF16AVX512 writes bf16(fp8(src[i]) * scale) for i < n, a positive
// multiple of 32 (needs AVX512-BF16).
//
//go:noescape
func fp8ToBF16AVX512(dst, src *byte, n int, scale float32, nt int)

// fp8ToBF16WAVX512 is fp8ToBF16AVX512 with scale 1, in integer word
// arithmetic (AVX-512 BW only).
//
//go:noescape
func fp8ToBF16WAVX512(dst, src *byte, n int, nt int)

// rotNeoXFP8BF16AVX512 rotates NeoX pairs i < n (a positive multiple of 16)
// of count fp8 head vectors, dequantized with scale, into bf16 head vectors
// (needs AVX512-BF16); strides are in bytes, as for the other rotations.
//
//go:noescape
func rotNeoXFP8BF16AVX512(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int, scale float32, nt int)

// bf16ToFP8AVX512 writes fp8(bf16(src[i]) / scale) for i < n, a positive
// multiple of 16: a division where div is nonzero, else a multiplication by
// scale, which the caller makes an exact reciprocal (see exactRecip).
//
//go:noescape
func bf16ToFP8AVX512(dst, src *byte, n int, scale float32, div, nt int)

// rotNeoXBF16FP8AVX512 rotates NeoX pairs i < n (a positive multiple of 16)
// of count bf16 head vectors into fp8 head vectors, scaled as in
// bf16ToFP8AVX512.
//
//go:noescape
func rotNeoXBF16FP8AVX512(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int, scale float32, div, nt int)
