//go:build !purego

#include "textflag.h"
#include "bf16_amd64.h"

// AVX2 kernels of the fused injection (see kernels.go).
//
// The rotation kernels handle NeoX pairing: pairs i < n of x0 = src[0:half]
// and x1 = src[half:2*half], n a positive multiple of 8, n <= half. Each
// computes in float32, each product rounded and no fused multiply-add (the
// same bits as the Go kernels):
//   dst[i]      = x0*cos[i] - x1*sin[i]
//   dst[half+i] = x1*cos[i] + x0*sin[i]
// The NT variants store with non-temporal hints, so destination lines are
// not read before being overwritten; they need dst and dst+half elements
// 32-byte aligned.
//
// Every rotation kernel repeats this for count head vectors with the same
// cos and sin (one token's heads): vector k is at dst+k*dstStride and
// src+k*srcStride (bytes). One call per token instead of one per head keeps
// the Go loop out of the hot path and the table row in L1.

// func rotNeoXBF16AVX2(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)
TEXT ·rotNeoXBF16AVX2(SB), NOSPLIT, $0-72
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ cos+16(FP), R8
	MOVQ sin+24(FP), R9
	MOVQ n+32(FP), CX
	MOVQ half+40(FP), DX
	LEAQ (SI)(DX*2), R10
	LEAQ (DI)(DX*2), R11
	MOVL $0x7fff, AX
	MOVQ AX, X15
	VPBROADCASTD X15, Y15
	MOVL $1, AX
	MOVQ AX, X14
	VPBROADCASTD X14, Y14
	MOVL $0x40, AX
	MOVQ AX, X13
	VPBROADCASTD X13, Y13

	VPXOR     Y12, Y12, Y12

	MOVQ DI, R12
	MOVQ SI, R13
	MOVQ count+48(FP), BX
rotNeoXBF16AVX2head:
	MOVQ R12, DI
	MOVQ R13, SI
	MOVQ cos+16(FP), R8
	MOVQ sin+24(FP), R9
	MOVQ n+32(FP), CX
	LEAQ (SI)(DX*2), R10
	LEAQ (DI)(DX*2), R11
bf16loop16:
	CMPQ CX, $16
	JLT  bf16loop
	// 16 pairs: widen with the qwords in order [0 2 1 3] so the unpacks
	// give elements 0-7 and 8-15.
	VPERMQ     $0xD8, (SI), Y0
	VPUNPCKLWD Y0, Y12, Y1
	VPUNPCKHWD Y0, Y12, Y2
	VPERMQ     $0xD8, (R10), Y0
	VPUNPCKLWD Y0, Y12, Y3
	VPUNPCKHWD Y0, Y12, Y4
	VMOVUPS    (R8), Y5
	VMOVUPS    (R9), Y6
	VMULPS     Y5, Y1, Y7
	VMULPS     Y6, Y3, Y8
	VSUBPS     Y8, Y7, Y7
	VMULPS     Y5, Y3, Y8
	VMULPS     Y6, Y1, Y9
	VADDPS     Y9, Y8, Y8
	VMOVUPS    32(R8), Y5
	VMOVUPS    32(R9), Y6
	VMULPS     Y5, Y2, Y9
	VMULPS     Y6, Y4, Y10
	VSUBPS     Y10, Y9, Y9
	VMULPS     Y5, Y4, Y10
	VMULPS     Y6, Y2, Y11
	VADDPS     Y11, Y10, Y10
	VPSRLD    $16, Y7, Y0
	VPAND     Y14, Y0, Y1
	VPADDD    Y15, Y7, Y2
	VPADDD    Y1, Y2, Y2
	VPSRLD    $16, Y2, Y2
	VPOR      Y13, Y0, Y0
	VCMPPS    $3, Y7, Y7, Y1
	VPBLENDVB Y1, Y0, Y2, Y7
	VPSRLD    $16, Y9, Y0
	VPAND     Y14, Y0, Y1
	VPADDD    Y15, Y9, Y2
	VPADDD    Y1, Y2, Y2
	VPSRLD    $16, Y2, Y2
	VPOR      Y13, Y0, Y0
	VCMPPS    $3, Y9, Y9, Y1
	VPBLENDVB Y1, Y0, Y2, Y9
	VPSRLD    $16, Y8, Y0
	VPAND     Y14, Y0, Y1
	VPADDD    Y15, Y8, Y2
	VPADDD    Y1, Y2, Y2
	VPSRLD    $16, Y2, Y2
	VPOR      Y13, Y0, Y0
	VCMPPS    $3, Y8, Y8, Y1
	VPBLENDVB Y1, Y0, Y2, Y8
	VPSRLD    $16, Y10, Y0
	VPAND     Y14, Y0, Y1
	VPADDD    Y15, Y10, Y2
	VPADDD    Y1, Y2, Y2
	VPSRLD    $16, Y2, Y2
	VPOR      Y13, Y0, Y0
	VCMPPS    $3, Y10, Y10, Y1
	VPBLENDVB Y1, Y0, Y2, Y10
	VPACKUSDW  Y9, Y7, Y7
	VPERMQ     $0xD8, Y7, Y7
	VMOVDQU    Y7, (DI)
	VPACKUSDW  Y10, Y8, Y8
	VPERMQ     $0xD8, Y8, Y8
	VMOVDQU    Y8, (R11)
	ADDQ       $32, SI
	ADDQ       $32, R10
	ADDQ       $32, DI
	ADDQ       $32, R11
	ADDQ       $64, R8
	ADDQ       $64, R9
	SUBQ       $16, CX
	JMP        bf16loop16

bf16loop:
	TESTQ CX, CX
	JZ    bf16loopdone
	BF16LOAD((SI), Y0)
	BF16LOAD((R10), Y1)
	VMOVUPS   (R8), Y2
	VMOVUPS   (R9), Y3
	VMULPS    Y2, Y0, Y4
	VMULPS    Y3, Y1, Y5
	VSUBPS    Y5, Y4, Y4
	VMULPS    Y2, Y1, Y6
	VMULPS    Y3, Y0, Y7
	VADDPS    Y7, Y6, Y6

	// Round to bfloat16: nearest even; NaN keeps its sign and turns quiet.
	VPSRLD    $16, Y4, Y8
	VPAND     Y14, Y8, Y9
	VPADDD    Y15, Y4, Y10
	VPADDD    Y9, Y10, Y10
	VPSRLD    $16, Y10, Y10
	VPOR      Y13, Y8, Y8
	VCMPPS    $3, Y4, Y4, Y11
	VPBLENDVB Y11, Y8, Y10, Y10
	VEXTRACTI128 $1, Y10, X9
	VPACKUSDW X9, X10, X10
	VMOVDQU   X10, (DI)
	VPSRLD    $16, Y6, Y8
	VPAND     Y14, Y8, Y9
	VPADDD    Y15, Y6, Y10
	VPADDD    Y9, Y10, Y10
	VPSRLD    $16, Y10, Y10
	VPOR      Y13, Y8, Y8
	VCMPPS    $3, Y6, Y6, Y11
	VPBLENDVB Y11, Y8, Y10, Y10
	VEXTRACTI128 $1, Y10, X9
	VPACKUSDW X9, X10, X10
	VMOVDQU   X10, (R11)

	ADDQ $16, SI
	ADDQ $16, R10
	ADDQ $16, DI
	ADDQ $16, R11
	ADDQ $32, R8
	ADDQ $32, R9
	SUBQ $8, CX
	JNZ  bf16loop

bf16loopdone:
	ADDQ dstStride+56(FP), R12
	ADDQ srcStride+64(FP), R13
	DECQ BX
	JNZ  rotNeoXBF16AVX2head
	VZEROUPPER
	RET

// func rotNeoXF16AVX2(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)
TEXT ·rotNeoXF16AVX2(SB), NOSPLIT, $0-72
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ cos+16(FP), R8
	MOVQ sin+24(FP), R9
	MOVQ n+32(FP), CX
	MOVQ half+40(FP), DX
	LEAQ (SI)(DX*2), R10
	LEAQ (DI)(DX*2), R11

	MOVQ DI, R12
	MOVQ SI, R13
	MOVQ count+48(FP), BX
rotNeoXF16AVX2head:
	MOVQ R12, DI
	MOVQ R13, SI
	MOVQ cos+16(FP), R8
	MOVQ sin+24(FP), R9
	MOVQ n+32(FP), CX
	LEAQ (SI)(DX*2), R10
	LEAQ (DI)(DX*2), R11
f16loop:
	VCVTPH2PS (SI), Y0
	VCVTPH2PS (R10), Y1
	VMOVUPS   (R8), Y2
	VMOVUPS   (R9), Y3
	VMULPS    Y2, Y0, Y4
	VMULPS    Y3, Y1, Y5
	VSUBPS    Y5, Y4, Y4
	VMULPS    Y2, Y1, Y6
	VMULPS    Y3, Y0, Y7
	VADDPS    Y7, Y6, Y6
	VCVTPS2PH $0, Y4, (DI)
	VCVTPS2PH $0, Y6, (R11)

	ADDQ $16, SI
	ADDQ $16, R10
	ADDQ $16, DI
	ADDQ $16, R11
	ADDQ $32, R8
	ADDQ $32, R9
	SUBQ $8, CX
	JNZ  f16loop
	ADDQ dstStride+56(FP), R12
	ADDQ srcStride+64(FP), R13
	DECQ BX
	JNZ  rotNeoXF16AVX2head
	VZEROUPPER
	RET

// func rotNeoXF32AVX2(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)
TEXT ·rotNeoXF32AVX2(SB), NOSPLIT, $0-72
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ cos+16(FP), R8
	MOVQ sin+24(FP), R9
	MOVQ n+32(FP), CX
	MOVQ half+40(FP), DX
	LEAQ (SI)(DX*4), R10
	LEAQ (DI)(DX*4), R11

	MOVQ DI, R12
	MOVQ SI, R13
	MOVQ count+48(FP), BX
rotNeoXF32AVX2head:
	MOVQ R12, DI
	MOVQ R13, SI
	MOVQ cos+16(FP), R8
	MOVQ sin+24(FP), R9
	MOVQ n+32(FP), CX
	LEAQ (SI)(DX*4), R10
	LEAQ (DI)(DX*4), R11
f32loop:
	VMOVUPS   (SI), Y0
	VMOVUPS   (R10), Y1
	VMOVUPS   (R8), Y2
	VMOVUPS   (R9), Y3
	VMULPS    Y2, Y0, Y4
	VMULPS    Y3, Y1, Y5
	VSUBPS    Y5, Y4, Y4
	VMULPS    Y2, Y1, Y6
	VMULPS    Y3, Y0, Y7
	VADDPS    Y7, Y6, Y6
	VMOVUPS   Y4, (DI)
	VMOVUPS   Y6, (R11)

	ADDQ $32, SI
	ADDQ $32, R10
	ADDQ $32, DI
	ADDQ $32, R11
	ADDQ $32, R8
	ADDQ $32, R9
	SUBQ $8, CX
	JNZ  f32loop
	ADDQ dstStride+56(FP), R12
	ADDQ srcStride+64(FP), R13
	DECQ BX
	JNZ  rotNeoXF32AVX2head
	VZEROUPPER
	RET

// func rotNeoXBF16AVX2NT(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)
TEXT ·rotNeoXBF16AVX2NT(SB), NOSPLIT, $0-72
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ cos+16(FP), R8
	MOVQ sin+24(FP), R9
	MOVQ n+32(FP), CX
	MOVQ half+40(FP), DX
	LEAQ (SI)(DX*2), R10
	LEAQ (DI)(DX*2), R11
	MOVL $0x7fff, AX
	MOVQ AX, X15
	VPBROADCASTD X15, Y15
	MOVL $1, AX
	MOVQ AX, X14
	VPBROADCASTD X14, Y14
	MOVL $0x40, AX
	MOVQ AX, X13
	VPBROADCASTD X13, Y13

	VPXOR     Y12, Y12, Y12

	MOVQ DI, R12
	MOVQ SI, R13
	MOVQ count+48(FP), BX
rotNeoXBF16AVX2NThead:
	MOVQ R12, DI
	MOVQ R13, SI
	MOVQ cos+16(FP), R8
	MOVQ sin+24(FP), R9
	MOVQ n+32(FP), CX
	LEAQ (SI)(DX*2), R10
	LEAQ (DI)(DX*2), R11
bf16loopnt16:
	CMPQ CX, $16
	JLT  bf16loopnt
	// 16 pairs: widen with the qwords in order [0 2 1 3] so the unpacks
	// give elements 0-7 and 8-15.
	VPERMQ     $0xD8, (SI), Y0
	VPUNPCKLWD Y0, Y12, Y1
	VPUNPCKHWD Y0, Y12, Y2
	VPERMQ     $0xD8, (R10), Y0
	VPUNPCKLWD Y0, Y12, Y3
	VPUNPCKHWD Y0, Y12, Y4
	VMOVUPS    (R8), Y5
	VMOVUPS    (R9), Y6
	VMULPS     Y5, Y1, Y7
	VMULPS     Y6, Y3, Y8
	VSUBPS     Y8, Y7, Y7
	VMULPS     Y5, Y3, Y8
	VMULPS     Y6, Y1, Y9
	VADDPS     Y9, Y8, Y8
	VMOVUPS    32(R8), Y5
	VMOVUPS    32(R9), Y6
	VMULPS     Y5, Y2, Y9
	VMULPS     Y6, Y4, Y10
	VSUBPS     Y10, Y9, Y9
	VMULPS     Y5, Y4, Y10
	VMULPS     Y6, Y2, Y11
	VADDPS     Y11, Y10, Y10
	VPSRLD    $16, Y7, Y0
	VPAND     Y14, Y0, Y1
	VPADDD    Y15, Y7, Y2
	VPADDD    Y1, Y2, Y2
	VPSRLD    $16, Y2, Y2
	VPOR      Y13, Y0, Y0
	VCMPPS    $3, Y7, Y7, Y1
	VPBLENDVB Y1, Y0, Y2, Y7
	VPSRLD    $16, Y9, Y0
	VPAND     Y14, Y0, Y1
	VPADDD    Y15, Y9, Y2
	VPADDD    Y1, Y2, Y2
	VPSRLD    $16, Y2, Y2
	VPOR      Y13, Y0, Y0
	VCMPPS    $3, Y9, Y9, Y1
	VPBLENDVB Y1, Y0, Y2, Y9
	VPSRLD    $16, Y8, Y0
	VPAND     Y14, Y0, Y1
	VPADDD    Y15, Y8, Y2
	VPADDD    Y1, Y2, Y2
	VPSRLD    $16, Y2, Y2
	VPOR      Y13, Y0, Y0
	VCMPPS    $3, Y8, Y8, Y1
	VPBLENDVB Y1, Y0, Y2, Y8
	VPSRLD    $16, Y10, Y0
	VPAND     Y14, Y0, Y1
	VPADDD    Y15, Y10, Y2
	VPADDD    Y1, Y2, Y2
	VPSRLD    $16, Y2, Y2
	VPOR      Y13, Y0, Y0
	VCMPPS    $3, Y10, Y10, Y1
	VPBLENDVB Y1, Y0, Y2, Y10
	VPACKUSDW  Y9, Y7, Y7
	VPERMQ     $0xD8, Y7, Y7
	VMOVNTDQ   Y7, (DI)
	VPACKUSDW  Y10, Y8, Y8
	VPERMQ     $0xD8, Y8, Y8
	VMOVNTDQ   Y8, (R11)
	ADDQ       $32, SI
	ADDQ       $32, R10
	ADDQ       $32, DI
	ADDQ       $32, R11
	ADDQ       $64, R8
	ADDQ       $64, R9
	SUBQ       $16, CX
	JMP        bf16loopnt16

bf16loopnt:
	TESTQ CX, CX
	JZ    bf16loopntdone
	BF16LOAD((SI), Y0)
	BF16LOAD((R10), Y1)
	VMOVUPS   (R8), Y2
	VMOVUPS   (R9), Y3
	VMULPS    Y2, Y0, Y4
	VMULPS    Y3, Y1, Y5
	VSUBPS    Y5, Y4, Y4
	VMULPS    Y2, Y1, Y6
	VMULPS    Y3, Y0, Y7
	VADDPS    Y7, Y6, Y6

	// Round to bfloat16: nearest even; NaN keeps its sign and turns quiet.
	VPSRLD    $16, Y4, Y8
	VPAND     Y14, Y8, Y9
	VPADDD    Y15, Y4, Y10
	VPADDD    Y9, Y10, Y10
	VPSRLD    $16, Y10, Y10
	VPOR      Y13, Y8, Y8
	VCMPPS    $3, Y4, Y4, Y11
	VPBLENDVB Y11, Y8, Y10, Y10
	VEXTRACTI128 $1, Y10, X9
	VPACKUSDW X9, X10, X10
	VMOVNTDQ  X10, (DI)
	VPSRLD    $16, Y6, Y8
	VPAND     Y14, Y8, Y9
	VPADDD    Y15, Y6, Y10
	VPADDD    Y9, Y10, Y10
	VPSRLD    $16, Y10, Y10
	VPOR      Y13, Y8, Y8
	VCMPPS    $3, Y6, Y6, Y11
	VPBLENDVB Y11, Y8, Y10, Y10
	VEXTRACTI128 $1, Y10, X9
	VPACKUSDW X9, X10, X10
	VMOVNTDQ  X10, (R11)

	ADDQ $16, SI
	ADDQ $16, R10
	ADDQ $16, DI
	ADDQ $16, R11
	ADDQ $32, R8
	ADDQ $32, R9
	SUBQ $8, CX
	JNZ  bf16loopnt

bf16loopntdone:
	ADDQ dstStride+56(FP), R12
	ADDQ srcStride+64(FP), R13
	DECQ BX
	JNZ  rotNeoXBF16AVX2NThead
	VZEROUPPER
	RET

// func rotNeoXF16AVX2NT(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)
TEXT ·rotNeoXF16AVX2NT(SB), NOSPLIT, $0-72
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ cos+16(FP), R8
	MOVQ sin+24(FP), R9
	MOVQ n+32(FP), CX
	MOVQ half+40(FP), DX
	LEAQ (SI)(DX*2), R10
	LEAQ (DI)(DX*2), R11

	MOVQ DI, R12
	MOVQ SI, R13
	MOVQ count+48(FP), BX
rotNeoXF16AVX2NThead:
	MOVQ R12, DI
	MOVQ R13, SI
	MOVQ cos+16(FP), R8
	MOVQ sin+24(FP), R9
	MOVQ n+32(FP), CX
	LEAQ (SI)(DX*2), R10
	LEAQ (DI)(DX*2), R11
f16loopnt:
	VCVTPH2PS (SI), Y0
	VCVTPH2PS (R10), Y1
	VMOVUPS   (R8), Y2
	VMOVUPS   (R9), Y3
	VMULPS    Y2, Y0, Y4
	VMULPS    Y3, Y1, Y5
	VSUBPS    Y5, Y4, Y4
	VMULPS    Y2, Y1, Y6
	VMULPS    Y3, Y0, Y7
	VADDPS    Y7, Y6, Y6
	VCVTPS2PH $0, Y4, X4
	VMOVNTDQ  X4, (DI)
	VCVTPS2PH $0, Y6, X6
	VMOVNTDQ  X6, (R11)

	ADDQ $16, SI
	ADDQ $16, R10
	ADDQ $16, DI
	ADDQ $16, R11
	ADDQ $32, R8
	ADDQ $32, R9
	SUBQ $8, CX
	JNZ  f16loopnt
	ADDQ dstStride+56(FP), R12
	ADDQ srcStride+64(FP), R13
	DECQ BX
	JNZ  rotNeoXF16AVX2NThead
	VZEROUPPER
	RET

// func rotNeoXF32AVX2NT(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)
TEXT ·rotNeoXF32AVX2NT(SB), NOSPLIT, $0-72
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ cos+16(FP), R8
	MOVQ sin+24(FP), R9
	MOVQ n+32(FP), CX
	MOVQ half+40(FP), DX
	LEAQ (SI)(DX*4), R10
	LEAQ (DI)(DX*4), R11

	MOVQ DI, R12
	MOVQ SI, R13
	MOVQ count+48(FP), BX
rotNeoXF32AVX2NThead:
	MOVQ R12, DI
	MOVQ R13, SI
	MOVQ cos+16(FP), R8
	MOVQ sin+24(FP), R9
	MOVQ n+32(FP), CX
	LEAQ (SI)(DX*4), R10
	LEAQ (DI)(DX*4), R11
f32loopnt:
	VMOVUPS   (SI), Y0
	VMOVUPS   (R10), Y1
	VMOVUPS   (R8), Y2
	VMOVUPS   (R9), Y3
	VMULPS    Y2, Y0, Y4
	VMULPS    Y3, Y1, Y5
	VSUBPS    Y5, Y4, Y4
	VMULPS    Y2, Y1, Y6
	VMULPS    Y3, Y0, Y7
	VADDPS    Y7, Y6, Y6
	VMOVNTPS  Y4, (DI)
	VMOVNTPS  Y6, (R11)

	ADDQ $32, SI
	ADDQ $32, R10
	ADDQ $32, DI
	ADDQ $32, R11
	ADDQ $32, R8
	ADDQ $32, R9
	SUBQ $8, CX
	JNZ  f32loopnt
	ADDQ dstStride+56(FP), R12
	ADDQ srcStride+64(FP), R13
	DECQ BX
	JNZ  rotNeoXF32AVX2NThead
	VZEROUPPER
	RET

// func copyNT(dst, src *byte, n, count, dstStride, srcStride int)
// Copies count runs of n bytes, n a positive multiple of 64, to 32-byte
// aligned destinations with non-temporal stores; run i is at dst+i*dstStride
// and src+i*srcStride.
TEXT ·copyNT(SB), NOSPLIT, $0-48
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ count+24(FP), BX

nthead:
	MOVQ n+16(FP), CX
	MOVQ DI, R12
	MOVQ SI, R13

ntloop:
	VMOVDQU  (SI), Y0
	VMOVDQU  32(SI), Y1
	VMOVNTDQ Y0, (DI)
	VMOVNTDQ Y1, 32(DI)
	ADDQ     $64, SI
	ADDQ     $64, DI
	SUBQ     $64, CX
	JNZ      ntloop
	MOVQ     R12, DI
	MOVQ     R13, SI
	ADDQ     dstStride+32(FP), DI
	ADDQ     srcStride+40(FP), SI
	DECQ     BX
	JNZ      nthead
	VZEROUPPER
	RET

// func sfence()
TEXT ·sfence(SB), NOSPLIT, $0-0
	SFENCE
	RET

// AVX-512 variants: 16 pairs per iteration; n is a positive multiple of 16.

// func rotNeoXBF16AVX512(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)
TEXT ·rotNeoXBF16AVX512(SB), NOSPLIT, $0-72
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ cos+16(FP), R8
	MOVQ sin+24(FP), R9
	MOVQ n+32(FP), CX
	MOVQ half+40(FP), DX
	LEAQ (SI)(DX*2), R10
	LEAQ (DI)(DX*2), R11
	MOVL $0x7fff, AX
	VPBROADCASTD AX, Z15
	MOVL $1, AX
	VPBROADCASTD AX, Z14
	MOVL $0x40, AX
	VPBROADCASTD AX, Z13

	MOVQ DI, R12
	MOVQ SI, R13
	MOVQ count+48(FP), BX
rotNeoXBF16AVX512head:
	MOVQ R12, DI
	MOVQ R13, SI
	MOVQ cos+16(FP), R8
	MOVQ sin+24(FP), R9
	MOVQ n+32(FP), CX
	LEAQ (SI)(DX*2), R10
	LEAQ (DI)(DX*2), R11
bf16z:
	BF16LOAD((SI), Z0)
	BF16LOAD((R10), Z1)
	VMOVUPS (R8), Z2
	VMOVUPS (R9), Z3
	VMULPS  Z2, Z0, Z4
	VMULPS  Z3, Z1, Z5
	VSUBPS  Z5, Z4, Z4
	VMULPS  Z2, Z1, Z6
	VMULPS  Z3, Z0, Z7
	VADDPS  Z7, Z6, Z6
	// Round to bfloat16 as the AVX2 kernel does; NaN lanes (K1) take
	// (u>>16)|0x40 instead.
	VCMPPS    $3, Z4, Z4, K1
	VPSRLD    $16, Z4, Z8
	VPANDD    Z14, Z8, Z9
	VPADDD    Z15, Z4, Z4
	VPADDD    Z9, Z4, Z4
	VPSRLD    $16, Z4, Z4
	VPORD     Z13, Z8, K1, Z4
	VPMOVDW   Z4, (DI)
	VCMPPS    $3, Z6, Z6, K1
	VPSRLD    $16, Z6, Z8
	VPANDD    Z14, Z8, Z9
	VPADDD    Z15, Z6, Z6
	VPADDD    Z9, Z6, Z6
	VPSRLD    $16, Z6, Z6
	VPORD     Z13, Z8, K1, Z6
	VPMOVDW   Z6, (R11)

	ADDQ $32, SI
	ADDQ $32, R10
	ADDQ $32, DI
	ADDQ $32, R11
	ADDQ $64, R8
	ADDQ $64, R9
	SUBQ $16, CX
	JNZ  bf16z
	ADDQ dstStride+56(FP), R12
	ADDQ srcStride+64(FP), R13
	DECQ BX
	JNZ  rotNeoXBF16AVX512head
	VZEROUPPER
	RET

// func rotNeoXF16AVX512(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)
TEXT ·rotNeoXF16AVX512(SB), NOSPLIT, $0-72
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ cos+16(FP), R8
	MOVQ sin+24(FP), R9
	MOVQ n+32(FP), CX
	MOVQ half+40(FP), DX
	LEAQ (SI)(DX*2), R10
	LEAQ (DI)(DX*2), R11

	MOVQ DI, R12
	MOVQ SI, R13
	MOVQ count+48(FP), BX
rotNeoXF16AVX512head:
	MOVQ R12, DI
	MOVQ R13, SI
	MOVQ cos+16(FP), R8
	MOVQ sin+24(FP), R9
	MOVQ n+32(FP), CX
	LEAQ (SI)(DX*2), R10
	LEAQ (DI)(DX*2), R11
f16z:
	PREFETCHNTA 1024(SI)
	PREFETCHNTA 1024(R10)
	VCVTPH2PS (SI), Z0
	VCVTPH2PS (R10), Z1
	VMOVUPS (R8), Z2
	VMOVUPS (R9), Z3
	VMULPS  Z2, Z0, Z4
	VMULPS  Z3, Z1, Z5
	VSUBPS  Z5, Z4, Z4
	VMULPS  Z2, Z1, Z6
	VMULPS  Z3, Z0, Z7
	VADDPS  Z7, Z6, Z6
	VCVTPS2PH $0, Z4, (DI)
	VCVTPS2PH $0, Z6, (R11)

	ADDQ $32, SI
	ADDQ $32, R10
	ADDQ $32, DI
	ADDQ $32, R11
	ADDQ $64, R8
	ADDQ $64, R9
	SUBQ $16, CX
	JNZ  f16z
	ADDQ dstStride+56(FP), R12
	ADDQ srcStride+64(FP), R13
	DECQ BX
	JNZ  rotNeoXF16AVX512head
	VZEROUPPER
	RET

// func rotNeoXBF16AVX512NT(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)
TEXT ·rotNeoXBF16AVX512NT(SB), NOSPLIT, $0-72
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ cos+16(FP), R8
	MOVQ sin+24(FP), R9
	MOVQ n+32(FP), CX
	MOVQ half+40(FP), DX
	LEAQ (SI)(DX*2), R10
	LEAQ (DI)(DX*2), R11
	MOVL $0x7fff, AX
	VPBROADCASTD AX, Z15
	MOVL $1, AX
	VPBROADCASTD AX, Z14
	MOVL $0x40, AX
	VPBROADCASTD AX, Z13

	MOVQ DI, R12
	MOVQ SI, R13
	MOVQ count+48(FP), BX
rotNeoXBF16AVX512NThead:
	MOVQ R12, DI
	MOVQ R13, SI
	MOVQ cos+16(FP), R8
	MOVQ sin+24(FP), R9
	MOVQ n+32(FP), CX
	LEAQ (SI)(DX*2), R10
	LEAQ (DI)(DX*2), R11
bf16znt:
	BF16LOAD((SI), Z0)
	BF16LOAD((R10), Z1)
	VMOVUPS (R8), Z2
	VMOVUPS (R9), Z3
	VMULPS  Z2, Z0, Z4
	VMULPS  Z3, Z1, Z5
	VSUBPS  Z5, Z4, Z4
	VMULPS  Z2, Z1, Z6
	VMULPS  Z3, Z0, Z7
	VADDPS  Z7, Z6, Z6
	// Round to bfloat16 as the AVX2 kernel does; NaN lanes (K1) take
	// (u>>16)|0x40 instead.
	VCMPPS    $3, Z4, Z4, K1
	VPSRLD    $16, Z4, Z8
	VPANDD    Z14, Z8, Z9
	VPADDD    Z15, Z4, Z4
	VPADDD    Z9, Z4, Z4
	VPSRLD    $16, Z4, Z4
	VPORD     Z13, Z8, K1, Z4
	VPMOVDW   Z4, Y10
	VMOVNTDQ  Y10, (DI)
	VCMPPS    $3, Z6, Z6, K1
	VPSRLD    $16, Z6, Z8
	VPANDD    Z14, Z8, Z9
	VPADDD    Z15, Z6, Z6
	VPADDD    Z9, Z6, Z6
	VPSRLD    $16, Z6, Z6
	VPORD     Z13, Z8, K1, Z6
	VPMOVDW   Z6, Y10
	VMOVNTDQ  Y10, (R11)

	ADDQ $32, SI
	ADDQ $32, R10
	ADDQ $32, DI
	ADDQ $32, R11
	ADDQ $64, R8
	ADDQ $64, R9
	SUBQ $16, CX
	JNZ  bf16znt
	ADDQ dstStride+56(FP), R12
	ADDQ srcStride+64(FP), R13
	DECQ BX
	JNZ  rotNeoXBF16AVX512NThead
	VZEROUPPER
	RET

// func rotNeoXF16AVX512NT(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)
TEXT ·rotNeoXF16AVX512NT(SB), NOSPLIT, $0-72
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ cos+16(FP), R8
	MOVQ sin+24(FP), R9
	MOVQ n+32(FP), CX
	MOVQ half+40(FP), DX
	LEAQ (SI)(DX*2), R10
	LEAQ (DI)(DX*2), R11

	MOVQ DI, R12
	MOVQ SI, R13
	MOVQ count+48(FP), BX
rotNeoXF16AVX512NThead:
	MOVQ R12, DI
	MOVQ R13, SI
	MOVQ cos+16(FP), R8
	MOVQ sin+24(FP), R9
	MOVQ n+32(FP), CX
	LEAQ (SI)(DX*2), R10
	LEAQ (DI)(DX*2), R11
f16znt:
	PREFETCHNTA 1024(SI)
	PREFETCHNTA 1024(R10)
	VCVTPH2PS (SI), Z0
	VCVTPH2PS (R10), Z1
	VMOVUPS (R8), Z2
	VMOVUPS (R9), Z3
	VMULPS  Z2, Z0, Z4
	VMULPS  Z3, Z1, Z5
	VSUBPS  Z5, Z4, Z4
	VMULPS  Z2, Z1, Z6
	VMULPS  Z3, Z0, Z7
	VADDPS  Z7, Z6, Z6
	VCVTPS2PH $0, Z4, Y4
	VMOVNTDQ  Y4, (DI)
	VCVTPS2PH $0, Z6, Y6
	VMOVNTDQ  Y6, (R11)

	ADDQ $32, SI
	ADDQ $32, R10
	ADDQ $32, DI
	ADDQ $32, R11
	ADDQ $64, R8
	ADDQ $64, R9
	SUBQ $16, CX
	JNZ  f16znt
	ADDQ dstStride+56(FP), R12
	ADDQ srcStride+64(FP), R13
	DECQ BX
	JNZ  rotNeoXF16AVX512NThead
	VZEROUPPER
	RET

// func storeFP8AVX2(dst *byte, src *float32, n int, scale float32)
// Writes fp8 e4m3fn(src[i] / scale) for i < n (a positive multiple of 8),
// the same bytes as chunk.F32ToFP8E4M3: the normal range rounds its 20
// dropped bits to even and saturates at 448 (0x7e); below 2^-6 the result is
// |x|*512 converted to an integer (exact scaling, round to nearest even);
// |x| >= 448 and Inf saturate, NaN gives 0x7f; the sign is ORed in.
TEXT ·storeFP8AVX2(SB), NOSPLIT, $0-28
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS scale+24(FP), Y15
	MOVL $0x7fffffff, AX
	MOVQ AX, X14
	VPBROADCASTD X14, Y14
	MOVL $0x3c7fffff, AX
	MOVQ AX, X13
	VPBROADCASTD X13, Y13
	MOVL $0x43dfffff, AX
	MOVQ AX, X12
	VPBROADCASTD X12, Y12
	MOVL $0x7f800000, AX
	MOVQ AX, X11
	VPBROADCASTD X11, Y11
	MOVL $0x3c000000, AX
	MOVQ AX, X10
	VPBROADCASTD X10, Y10
	MOVL $0x7ffff, AX
	MOVQ AX, X9
	VPBROADCASTD X9, Y9
	MOVL $0x7e, AX
	MOVQ AX, X7
	VPBROADCASTD X7, Y7
	MOVL $0x44000000, AX
	MOVQ AX, X6
	VPBROADCASTD X6, Y6
	MOVL $0x7f, AX
	MOVQ AX, X5
	VPBROADCASTD X5, Y5

fp8loop:
	VMOVUPS   (SI), Y0
	VDIVPS    Y15, Y0, Y0
	VPAND     Y14, Y0, Y1
	VPXOR     Y1, Y0, Y2
	VPSRLD    $24, Y2, Y2
	VPSUBD    Y10, Y1, Y3
	VPSLLD    $11, Y3, Y4
	VPSRLD    $31, Y4, Y4
	VPADDD    Y9, Y3, Y3
	VPADDD    Y4, Y3, Y3
	VPSRLD    $20, Y3, Y3
	VPMINUD   Y7, Y3, Y3
	VMULPS    Y6, Y1, Y4
	VCVTPS2DQ Y4, Y4
	VPCMPGTD  Y13, Y1, Y8
	VPBLENDVB Y8, Y3, Y4, Y3
	VPCMPGTD  Y12, Y1, Y8
	VPBLENDVB Y8, Y7, Y3, Y3
	VPCMPGTD  Y11, Y1, Y8
	VPBLENDVB Y8, Y5, Y3, Y3
	VPOR      Y2, Y3, Y3
	VEXTRACTI128 $1, Y3, X4
	VPACKUSDW X4, X3, X3
	VPACKUSWB X3, X3, X3
	MOVQ      X3, (DI)
	ADDQ      $32, SI
	ADDQ      $8, DI
	SUBQ      $8, CX
	JNZ       fp8loop
	VZEROUPPER
	RET

// func storeFP8AVX2NT(dst *byte, src *float32, n int, scale float32)
// storeFP8AVX2 with non-temporal stores.
TEXT ·storeFP8AVX2NT(SB), NOSPLIT, $0-28
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS scale+24(FP), Y15
	MOVL $0x7fffffff, AX
	MOVQ AX, X14
	VPBROADCASTD X14, Y14
	MOVL $0x3c7fffff, AX
	MOVQ AX, X13
	VPBROADCASTD X13, Y13
	MOVL $0x43dfffff, AX
	MOVQ AX, X12
	VPBROADCASTD X12, Y12
	MOVL $0x7f800000, AX
	MOVQ AX, X11
	VPBROADCASTD X11, Y11
	MOVL $0x3c000000, AX
	MOVQ AX, X10
	VPBROADCASTD X10, Y10
	MOVL $0x7ffff, AX
	MOVQ AX, X9
	VPBROADCASTD X9, Y9
	MOVL $0x7e, AX
	MOVQ AX, X7
	VPBROADCASTD X7, Y7
	MOVL $0x44000000, AX
	MOVQ AX, X6
	VPBROADCASTD X6, Y6
	MOVL $0x7f, AX
	MOVQ AX, X5
	VPBROADCASTD X5, Y5

fp8ntloop:
	VMOVUPS   (SI), Y0
	VDIVPS    Y15, Y0, Y0
	VPAND     Y14, Y0, Y1
	VPXOR     Y1, Y0, Y2
	VPSRLD    $24, Y2, Y2
	VPSUBD    Y10, Y1, Y3
	VPSLLD    $11, Y3, Y4
	VPSRLD    $31, Y4, Y4
	VPADDD    Y9, Y3, Y3
	VPADDD    Y4, Y3, Y3
	VPSRLD    $20, Y3, Y3
	VPMINUD   Y7, Y3, Y3
	VMULPS    Y6, Y1, Y4
	VCVTPS2DQ Y4, Y4
	VPCMPGTD  Y13, Y1, Y8
	VPBLENDVB Y8, Y3, Y4, Y3
	VPCMPGTD  Y12, Y1, Y8
	VPBLENDVB Y8, Y7, Y3, Y3
	VPCMPGTD  Y11, Y1, Y8
	VPBLENDVB Y8, Y5, Y3, Y3
	VPOR      Y2, Y3, Y3
	VEXTRACTI128 $1, Y3, X4
	VPACKUSDW X4, X3, X3
	VPACKUSWB X3, X3, X3
	MOVQ      X3, AX
	MOVNTIQ   AX, (DI)
	ADDQ      $32, SI
	ADDQ      $8, DI
	SUBQ      $8, CX
	JNZ       fp8ntloop
	VZEROUPPER
	RET

// Vector forms of loadF32 and storeF32 (convert.go); n is a positive
// multiple of 8 and the results are the bits of the Go code.

// func widenBF16AVX2(dst *float32, src *byte, n int)
TEXT ·widenBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

wbf16loop:
	BF16LOAD((SI), Y0)
	VMOVUPS   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	SUBQ      $8, CX
	JNZ       wbf16loop
	VZEROUPPER
	RET

// func widenF16AVX2(dst *float32, src *byte, n int)
TEXT ·widenF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

wf16loop:
	VCVTPH2PS (SI), Y0
	VMOVUPS   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	SUBQ      $8, CX
	JNZ       wf16loop
	VZEROUPPER
	RET

// func narrowBF16AVX2(dst *byte, src *float32, n int)
TEXT ·narrowBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVL $0x7fff, AX
	MOVQ AX, X15
	VPBROADCASTD X15, Y15
	MOVL $1, AX
	MOVQ AX, X14
	VPBROADCASTD X14, Y14
	MOVL $0x40, AX
	MOVQ AX, X13
	VPBROADCASTD X13, Y13

nbf16loop:
	VMOVUPS   (SI), Y4
	VPSRLD    $16, Y4, Y8
	VPAND     Y14, Y8, Y9
	VPADDD    Y15, Y4, Y10
	VPADDD    Y9, Y10, Y10
	VPSRLD    $16, Y10, Y10
	VPOR      Y13, Y8, Y8
	VCMPPS    $3, Y4, Y4, Y11
	VPBLENDVB Y11, Y8, Y10, Y10
	VEXTRACTI128 $1, Y10, X9
	VPACKUSDW X9, X10, X10
	VMOVDQU   X10, (DI)
	ADDQ      $32, SI
	ADDQ      $16, DI
	SUBQ      $8, CX
	JNZ       nbf16loop
	VZEROUPPER
	RET

// func narrowF16AVX2(dst *byte, src *float32, n int)
TEXT ·narrowF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

nf16loop:
	VMOVUPS   (SI), Y0
	VCVTPS2PH $0, Y0, (DI)
	ADDQ      $32, SI
	ADDQ      $16, DI
	SUBQ      $8, CX
	JNZ       nf16loop
	VZEROUPPER
	RET

// func widenFP8AVX2(dst *float32, src *byte, n int, scale float32)
// x = fp8 * scale: the 7 low bits shifted into a float32's exponent and
// mantissa fields, times 2^120, are the e4m3 magnitude (subnormals too);
// 0x7f is NaN (sign | 0x7fc00000), as chunk.FP8E4M3ToF32 gives.
TEXT ·widenFP8AVX2(SB), NOSPLIT, $0-28
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS scale+24(FP), Y15
	MOVL $0x7f, AX
	MOVQ AX, X14
	VPBROADCASTD X14, Y14
	MOVL $0x7b800000, AX
	MOVQ AX, X13
	VPBROADCASTD X13, Y13
	MOVL $0x80, AX
	MOVQ AX, X12
	VPBROADCASTD X12, Y12
	MOVL $0x7fc00000, AX
	MOVQ AX, X11
	VPBROADCASTD X11, Y11

wfp8loop:
	VPMOVZXBD (SI), Y0
	VPAND     Y14, Y0, Y1
	VPCMPEQD  Y14, Y1, Y3
	VPSLLD    $20, Y1, Y1
	VMULPS    Y13, Y1, Y1
	VPBLENDVB Y3, Y11, Y1, Y1
	VPAND     Y12, Y0, Y2
	VPSLLD    $24, Y2, Y2
	VPOR      Y2, Y1, Y1
	VMULPS    Y15, Y1, Y1
	VMOVUPS   Y1, (DI)
	ADDQ      $8, SI
	ADDQ      $32, DI
	SUBQ      $8, CX
	JNZ       wfp8loop
	VZEROUPPER
	RET

// func rotNeoXBF16AVX512BF16(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)
// AVX512-BF16 form of rotNeoXBF16AVX512: 32 pairs per iteration (a last 16
// when n is an odd multiple of 16), rounded by VCVTNE2PS2BF16. That
// instruction rounds to nearest even and quiets NaN exactly as
// chunk.F32ToBF16, but flushes denormal results to zero; VFPCLASSPS finds
// those lanes and the rare fix-up path rounds them with integers.
TEXT ·rotNeoXBF16AVX512BF16(SB), NOSPLIT, $0-72
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ half+40(FP), DX
	MOVL $0x7fff, AX
	VPBROADCASTD AX, Z15
	MOVL $1, AX
	VPBROADCASTD AX, Z14
	MOVQ DI, R12
	MOVQ SI, R13
	MOVQ count+48(FP), BX

rotNeoXBF16AVX512BF16head:
	MOVQ R12, DI
	MOVQ R13, SI
	MOVQ cos+16(FP), R8
	MOVQ sin+24(FP), R9
	MOVQ n+32(FP), CX
	LEAQ (SI)(DX*2), R10
	LEAQ (DI)(DX*2), R11

rotNeoXBF16AVX512BF16loop32:
	CMPQ CX, $32
	JLT  rotNeoXBF16AVX512BF16tail16
	PREFETCHNTA 1024(SI)
	PREFETCHNTA 1024(R10)
	BF16LOAD((SI), Z0)
	BF16LOAD(32(SI), Z1)
	BF16LOAD((R10), Z2)
	BF16LOAD(32(R10), Z3)
	VMOVUPS   (R8), Z4
	VMOVUPS   64(R8), Z5
	VMOVUPS   (R9), Z6
	VMOVUPS   64(R9), Z7
	VMULPS    Z4, Z0, Z8
	VMULPS    Z6, Z2, Z9
	VSUBPS    Z9, Z8, Z8
	VMULPS    Z5, Z1, Z9
	VMULPS    Z7, Z3, Z10
	VSUBPS    Z10, Z9, Z9
	VMULPS    Z4, Z2, Z10
	VMULPS    Z6, Z0, Z11
	VADDPS    Z11, Z10, Z10
	VMULPS    Z5, Z3, Z11
	VMULPS    Z7, Z1, Z12
	VADDPS    Z12, Z11, Z11
	// VCVTNE2PS2BF16 Z8, Z9, Z16 (low half from Z8)
	BYTE $0x62; BYTE $0xc2; BYTE $0x37; BYTE $0x48; BYTE $0x72; BYTE $0xc0
	// VCVTNE2PS2BF16 Z10, Z11, Z17 (low half from Z10)
	BYTE $0x62; BYTE $0xc2; BYTE $0x27; BYTE $0x48; BYTE $0x72; BYTE $0xca
	VFPCLASSPSZ $0x20, Z8, K1
	VFPCLASSPSZ $0x20, Z9, K2
	VFPCLASSPSZ $0x20, Z10, K3
	VFPCLASSPSZ $0x20, Z11, K4
	KORW      K1, K2, K5
	KORW      K3, K4, K6
	KORTESTW  K5, K6
	JNZ       rotNeoXBF16AVX512BF16fix32

rotNeoXBF16AVX512BF16store32:
	VMOVDQU64 Z16, (DI)
	VMOVDQU64 Z17, (R11)
	ADDQ      $64, SI
	ADDQ      $64, R10
	ADDQ      $64, DI
	ADDQ      $64, R11
	ADDQ      $128, R8
	ADDQ      $128, R9
	SUBQ      $32, CX
	JMP       rotNeoXBF16AVX512BF16loop32

rotNeoXBF16AVX512BF16fix32:
	VPSRLD    $16, Z8, Z18
	VPANDD    Z14, Z18, Z18
	VPADDD    Z15, Z8, Z19
	VPADDD    Z18, Z19, Z19
	VPSRLD    $16, Z19, Z19
	VPMOVDW   Z19, Y20
	VPSRLD    $16, Z9, Z18
	VPANDD    Z14, Z18, Z18
	VPADDD    Z15, Z9, Z19
	VPADDD    Z18, Z19, Z19
	VPSRLD    $16, Z19, Z19
	VPMOVDW   Z19, Y21
	VINSERTI64X4 $1, Y21, Z20, Z20
	KUNPCKWD  K1, K2, K7
	VMOVDQU16 Z20, K7, Z16
	VPSRLD    $16, Z10, Z18
	VPANDD    Z14, Z18, Z18
	VPADDD    Z15, Z10, Z19
	VPADDD    Z18, Z19, Z19
	VPSRLD    $16, Z19, Z19
	VPMOVDW   Z19, Y20
	VPSRLD    $16, Z11, Z18
	VPANDD    Z14, Z18, Z18
	VPADDD    Z15, Z11, Z19
	VPADDD    Z18, Z19, Z19
	VPSRLD    $16, Z19, Z19
	VPMOVDW   Z19, Y21
	VINSERTI64X4 $1, Y21, Z20, Z20
	KUNPCKWD  K3, K4, K7
	VMOVDQU16 Z20, K7, Z17
	JMP       rotNeoXBF16AVX512BF16store32

rotNeoXBF16AVX512BF16tail16:
	TESTQ     CX, CX
	JZ        rotNeoXBF16AVX512BF16next
	BF16LOAD((SI), Z0)
	BF16LOAD((R10), Z2)
	VMOVUPS   (R8), Z4
	VMOVUPS   (R9), Z6
	VMULPS    Z4, Z0, Z8
	VMULPS    Z6, Z2, Z9
	VSUBPS    Z9, Z8, Z8
	VMULPS    Z4, Z2, Z10
	VMULPS    Z6, Z0, Z11
	VADDPS    Z11, Z10, Z10
	// VCVTNE2PS2BF16 Z8, Z10, Z16 (low half from Z8)
	BYTE $0x62; BYTE $0xc2; BYTE $0x2f; BYTE $0x48; BYTE $0x72; BYTE $0xc0
	VFPCLASSPSZ $0x20, Z8, K1
	VFPCLASSPSZ $0x20, Z10, K3
	KORTESTW  K1, K3
	JZ        rotNeoXBF16AVX512BF16store16
	VPSRLD    $16, Z8, Z18
	VPANDD    Z14, Z18, Z18
	VPADDD    Z15, Z8, Z19
	VPADDD    Z18, Z19, Z19
	VPSRLD    $16, Z19, Z19
	VPMOVDW   Z19, Y20
	VPSRLD    $16, Z10, Z18
	VPANDD    Z14, Z18, Z18
	VPADDD    Z15, Z10, Z19
	VPADDD    Z18, Z19, Z19
	VPSRLD    $16, Z19, Z19
	VPMOVDW   Z19, Y21
	VINSERTI64X4 $1, Y21, Z20, Z20
	KUNPCKWD  K1, K3, K7
	VMOVDQU16 Z20, K7, Z16

rotNeoXBF16AVX512BF16store16:
	VEXTRACTI64X4 $1, Z16, Y17
	VMOVDQU64 Y16, (DI)
	VMOVDQU64 Y17, (R11)

rotNeoXBF16AVX512BF16next:
	ADDQ dstStride+56(FP), R12
	ADDQ srcStride+64(FP), R13
	DECQ BX
	JNZ  rotNeoXBF16AVX512BF16head
	VZEROUPPER
	RET

// func rotNeoXBF16AVX512BF16NT(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)
// AVX512-BF16 form of rotNeoXBF16AVX512: 32 pairs per iteration (a last 16
// when n is an odd multiple of 16), rounded by VCVTNE2PS2BF16. That
// instruction rounds to nearest even and quiets NaN exactly as
// chunk.F32ToBF16, but flushes denormal results to zero; VFPCLASSPS finds
// those lanes and the rare fix-up path rounds them with integers.
TEXT ·rotNeoXBF16AVX512BF16NT(SB), NOSPLIT, $0-72
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ half+40(FP), DX
	MOVL $0x7fff, AX
	VPBROADCASTD AX, Z15
	MOVL $1, AX
	VPBROADCASTD AX, Z14
	MOVQ DI, R12
	MOVQ SI, R13
	MOVQ count+48(FP), BX

rotNeoXBF16AVX512BF16NThead:
	MOVQ R12, DI
	MOVQ R13, SI
	MOVQ cos+16(FP), R8
	MOVQ sin+24(FP), R9
	MOVQ n+32(FP), CX
	LEAQ (SI)(DX*2), R10
	LEAQ (DI)(DX*2), R11

rotNeoXBF16AVX512BF16NTloop32:
	CMPQ CX, $32
	JLT  rotNeoXBF16AVX512BF16NTtail16
	PREFETCHNTA 1024(SI)
	PREFETCHNTA 1024(R10)
	BF16LOAD((SI), Z0)
	BF16LOAD(32(SI), Z1)
	BF16LOAD((R10), Z2)
	BF16LOAD(32(R10), Z3)
	VMOVUPS   (R8), Z4
	VMOVUPS   64(R8), Z5
	VMOVUPS   (R9), Z6
	VMOVUPS   64(R9), Z7
	VMULPS    Z4, Z0, Z8
	VMULPS    Z6, Z2, Z9
	VSUBPS    Z9, Z8, Z8
	VMULPS    Z5, Z1, Z9
	VMULPS    Z7, Z3, Z10
	VSUBPS    Z10, Z9, Z9
	VMULPS    Z4, Z2, Z10
	VMULPS    Z6, Z0, Z11
	VADDPS    Z11, Z10, Z10
	VMULPS    Z5, Z3, Z11
	VMULPS    Z7, Z1, Z12
	VADDPS    Z12, Z11, Z11
	// VCVTNE2PS2BF16 Z8, Z9, Z16 (low half from Z8)
	BYTE $0x62; BYTE $0xc2; BYTE $0x37; BYTE $0x48; BYTE $0x72; BYTE $0xc0
	// VCVTNE2PS2BF16 Z10, Z11, Z17 (low half from Z10)
	BYTE $0x62; BYTE $0xc2; BYTE $0x27; BYTE $0x48; BYTE $0x72; BYTE $0xca
	VFPCLASSPSZ $0x20, Z8, K1
	VFPCLASSPSZ $0x20, Z9, K2
	VFPCLASSPSZ $0x20, Z10, K3
	VFPCLASSPSZ $0x20, Z11, K4
	KORW      K1, K2, K5
	KORW      K3, K4, K6
	KORTESTW  K5, K6
	JNZ       rotNeoXBF16AVX512BF16NTfix32

rotNeoXBF16AVX512BF16NTstore32:
	VMOVNTDQ  Z16, (DI)
	VMOVNTDQ  Z17, (R11)
	ADDQ      $64, SI
	ADDQ      $64, R10
	ADDQ      $64, DI
	ADDQ      $64, R11
	ADDQ      $128, R8
	ADDQ      $128, R9
	SUBQ      $32, CX
	JMP       rotNeoXBF16AVX512BF16NTloop32

rotNeoXBF16AVX512BF16NTfix32:
	VPSRLD    $16, Z8, Z18
	VPANDD    Z14, Z18, Z18
	VPADDD    Z15, Z8, Z19
	VPADDD    Z18, Z19, Z19
	VPSRLD    $16, Z19, Z19
	VPMOVDW   Z19, Y20
	VPSRLD    $16, Z9, Z18
	VPANDD    Z14, Z18, Z18
	VPADDD    Z15, Z9, Z19
	VPADDD    Z18, Z19, Z19
	VPSRLD    $16, Z19, Z19
	VPMOVDW   Z19, Y21
	VINSERTI64X4 $1, Y21, Z20, Z20
	KUNPCKWD  K1, K2, K7
	VMOVDQU16 Z20, K7, Z16
	VPSRLD    $16, Z10, Z18
	VPANDD    Z14, Z18, Z18
	VPADDD    Z15, Z10, Z19
	VPADDD    Z18, Z19, Z19
	VPSRLD    $16, Z19, Z19
	VPMOVDW   Z19, Y20
	VPSRLD    $16, Z11, Z18
	VPANDD    Z14, Z18, Z18
	VPADDD    Z15, Z11, Z19
	VPADDD    Z18, Z19, Z19
	VPSRLD    $16, Z19, Z19
	VPMOVDW   Z19, Y21
	VINSERTI64X4 $1, Y21, Z20, Z20
	KUNPCKWD  K3, K4, K7
	VMOVDQU16 Z20, K7, Z17
	JMP       rotNeoXBF16AVX512BF16NTstore32

rotNeoXBF16AVX512BF16NTtail16:
	TESTQ     CX, CX
	JZ        rotNeoXBF16AVX512BF16NTnext
	BF16LOAD((SI), Z0)
	BF16LOAD((R10), Z2)
	VMOVUPS   (R8), Z4
	VMOVUPS   (R9), Z6
	VMULPS    Z4, Z0, Z8
	VMULPS    Z6, Z2, Z9
	VSUBPS    Z9, Z8, Z8
	VMULPS    Z4, Z2, Z10
	VMULPS    Z6, Z0, Z11
	VADDPS    Z11, Z10, Z10
	// VCVTNE2PS2BF16 Z8, Z10, Z16 (low half from Z8)
	BYTE $0x62; BYTE $0xc2; BYTE $0x2f; BYTE $0x48; BYTE $0x72; BYTE $0xc0
	VFPCLASSPSZ $0x20, Z8, K1
	VFPCLASSPSZ $0x20, Z10, K3
	KORTESTW  K1, K3
	JZ        rotNeoXBF16AVX512BF16NTstore16
	VPSRLD    $16, Z8, Z18
	VPANDD    Z14, Z18, Z18
	VPADDD    Z15, Z8, Z19
	VPADDD    Z18, Z19, Z19
	VPSRLD    $16, Z19, Z19
	VPMOVDW   Z19, Y20
	VPSRLD    $16, Z10, Z18
	VPANDD    Z14, Z18, Z18
	VPADDD    Z15, Z10, Z19
	VPADDD    Z18, Z19, Z19
	VPSRLD    $16, Z19, Z19
	VPMOVDW   Z19, Y21
	VINSERTI64X4 $1, Y21, Z20, Z20
	KUNPCKWD  K1, K3, K7
	VMOVDQU16 Z20, K7, Z16

rotNeoXBF16AVX512BF16NTstore16:
	VEXTRACTI64X4 $1, Z16, Y17
	VMOVNTDQ  Y16, (DI)
	VMOVNTDQ  Y17, (R11)

rotNeoXBF16AVX512BF16NTnext:
	ADDQ dstStride+56(FP), R12
	ADDQ srcStride+64(FP), R13
	DECQ BX
	JNZ  rotNeoXBF16AVX512BF16NThead
	VZEROUPPER
	RET

// func rotNeoXF32AVX512(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)
// AVX-512 form of rotNeoXF32AVX2: 16 pairs per iteration, n a positive
// multiple of 16.
TEXT ·rotNeoXF32AVX512(SB), NOSPLIT, $0-72
	MOVQ dst+0(FP), R12
	MOVQ src+8(FP), R13
	MOVQ half+40(FP), DX
	MOVQ count+48(FP), BX

rotNeoXF32AVX512head:
	MOVQ R12, DI
	MOVQ R13, SI
	MOVQ cos+16(FP), R8
	MOVQ sin+24(FP), R9
	MOVQ n+32(FP), CX
	LEAQ (SI)(DX*4), R10
	LEAQ (DI)(DX*4), R11

rotNeoXF32AVX512loop:
	PREFETCHNTA 1024(SI)
	PREFETCHNTA 1024(R10)
	VMOVUPS (SI), Z0
	VMOVUPS (R10), Z1
	VMOVUPS (R8), Z2
	VMOVUPS (R9), Z3
	VMULPS  Z2, Z0, Z4
	VMULPS  Z3, Z1, Z5
	VSUBPS  Z5, Z4, Z4
	VMULPS  Z2, Z1, Z6
	VMULPS  Z3, Z0, Z7
	VADDPS  Z7, Z6, Z6
	VMOVUPS Z4, (DI)
	VMOVUPS Z6, (R11)
	ADDQ $64, SI
	ADDQ $64, R10
	ADDQ $64, DI
	ADDQ $64, R11
	ADDQ $64, R8
	ADDQ $64, R9
	SUBQ $16, CX
	JNZ  rotNeoXF32AVX512loop
	ADDQ dstStride+56(FP), R12
	ADDQ srcStride+64(FP), R13
	DECQ BX
	JNZ  rotNeoXF32AVX512head
	VZEROUPPER
	RET

// func rotNeoXF32AVX512NT(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)
// AVX-512 form of rotNeoXF32AVX2: 16 pairs per iteration, n a positive
// multiple of 16.
TEXT ·rotNeoXF32AVX512NT(SB), NOSPLIT, $0-72
	MOVQ dst+0(FP), R12
	MOVQ src+8(FP), R13
	MOVQ half+40(FP), DX
	MOVQ count+48(FP), BX

rotNeoXF32AVX512NThead:
	MOVQ R12, DI
	MOVQ R13, SI
	MOVQ cos+16(FP), R8
	MOVQ sin+24(FP), R9
	MOVQ n+32(FP), CX
	LEAQ (SI)(DX*4), R10
	LEAQ (DI)(DX*4), R11

rotNeoXF32AVX512NTloop:
	PREFETCHNTA 1024(SI)
	PREFETCHNTA 1024(R10)
	VMOVUPS (SI), Z0
	VMOVUPS (R10), Z1
	VMOVUPS (R8), Z2
	VMOVUPS (R9), Z3
	VMULPS  Z2, Z0, Z4
	VMULPS  Z3, Z1, Z5
	VSUBPS  Z5, Z4, Z4
	VMULPS  Z2, Z1, Z6
	VMULPS  Z3, Z0, Z7
	VADDPS  Z7, Z6, Z6
	VMOVNTPS Z4, (DI)
	VMOVNTPS Z6, (R11)
	ADDQ $64, SI
	ADDQ $64, R10
	ADDQ $64, DI
	ADDQ $64, R11
	ADDQ $64, R8
	ADDQ $64, R9
	SUBQ $16, CX
	JNZ  rotNeoXF32AVX512NTloop
	ADDQ dstStride+56(FP), R12
	ADDQ srcStride+64(FP), R13
	DECQ BX
	JNZ  rotNeoXF32AVX512NThead
	VZEROUPPER
	RET

DATA gptjPerm<>+0(SB)/4, $0
DATA gptjPerm<>+4(SB)/4, $0
DATA gptjPerm<>+8(SB)/4, $1
DATA gptjPerm<>+12(SB)/4, $1
DATA gptjPerm<>+16(SB)/4, $2
DATA gptjPerm<>+20(SB)/4, $2
DATA gptjPerm<>+24(SB)/4, $3
DATA gptjPerm<>+28(SB)/4, $3
GLOBL gptjPerm<>(SB), RODATA|NOPTR, $32
// func rotGPTJF32AVX2(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)
// GPT-J (interleaved) pairs (x[2i], x[2i+1]), i < n, n a positive multiple
// of 4; half is unused. cos and sin are duplicated to both lanes of a pair
// and sin negated on the even lanes, so that
//   dst[2i]   = x0*cos[i] + x1*(-sin[i]) = x0*cos[i] - x1*sin[i]
//   dst[2i+1] = x1*cos[i] + x0*sin[i]
// with each product rounded to float32: the bits of rotGPTJ. dst may equal
// src.
TEXT ·rotGPTJF32AVX2(SB), NOSPLIT, $0-72
	MOVQ dst+0(FP), R12
	MOVQ src+8(FP), R13
	MOVQ count+48(FP), BX
	// Y15: the permutation [0 0 1 1 2 2 3 3]; Y14: the sign of the even
	// lanes.
	VMOVDQU gptjPerm<>(SB), Y15
	MOVQ $0x80000000, AX
	MOVQ AX, X14
	VPBROADCASTQ X14, Y14

rotGPTJF32AVX2head:
	MOVQ R12, DI
	MOVQ R13, SI
	MOVQ cos+16(FP), R8
	MOVQ sin+24(FP), R9
	MOVQ n+32(FP), CX

rotGPTJF32AVX2loop:
	VMOVUPS   (SI), Y0
	VPERMILPS $0xB1, Y0, Y1
	VMOVUPS   (R8), X2
	VPERMPS   Y2, Y15, Y2
	VMOVUPS   (R9), X3
	VPERMPS   Y3, Y15, Y3
	VXORPS    Y14, Y3, Y3
	VMULPS    Y2, Y0, Y4
	VMULPS    Y3, Y1, Y5
	VADDPS    Y5, Y4, Y4
	VMOVUPS   Y4, (DI)
	ADDQ $32, SI
	ADDQ $32, DI
	ADDQ $16, R8
	ADDQ $16, R9
	SUBQ $4, CX
	JNZ  rotGPTJF32AVX2loop
	ADDQ dstStride+56(FP), R12
	ADDQ srcStride+64(FP), R13
	DECQ BX
	JNZ  rotGPTJF32AVX2head
	VZEROUPPER
	RET

// fp8Perm puts the dwords of VPACKUSWB(VPACKUSDW(a, b), VPACKUSDW(c, d)) in
// the order a, b, c, d.
DATA fp8Perm<>+0(SB)/4, $0
DATA fp8Perm<>+4(SB)/4, $4
DATA fp8Perm<>+8(SB)/4, $8
DATA fp8Perm<>+12(SB)/4, $12
DATA fp8Perm<>+16(SB)/4, $1
DATA fp8Perm<>+20(SB)/4, $5
DATA fp8Perm<>+24(SB)/4, $9
DATA fp8Perm<>+28(SB)/4, $13
DATA fp8Perm<>+32(SB)/4, $2
DATA fp8Perm<>+36(SB)/4, $6
DATA fp8Perm<>+40(SB)/4, $10
DATA fp8Perm<>+44(SB)/4, $14
DATA fp8Perm<>+48(SB)/4, $3
DATA fp8Perm<>+52(SB)/4, $7
DATA fp8Perm<>+56(SB)/4, $11
DATA fp8Perm<>+60(SB)/4, $15
GLOBL fp8Perm<>(SB), RODATA|NOPTR, $64

// func storeFP8MulAVX512(dst *byte, src *float32, n int, scale float32)
// AVX-512 form of storeFP8AVX2: 64 values per iteration, n a positive
// multiple of 64; x * scale first (the caller passes 1/scale to a
// multiplying kernel only when that is exact). Per lane, on a = |x|:
// normal results round (a - (120<<23)) at bit 20 to even, and VPMINUD
// saturates them (Inf included) at 0x7e; a < 2^-6 takes a*512 converted to
// an integer (exact, nearest even); NaN gives 0x7f; VPTERNLOGD ORs in the
// sign (x>>24)&0x80. The four dword vectors are packed to bytes and put in
// order by VPERMD.
TEXT ·storeFP8MulAVX512(SB), NOSPLIT, $0-28
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS scale+24(FP), Z15
	MOVL $0x7fffffff, AX
	VPBROADCASTD AX, Z14
	MOVL $1, AX
	VPBROADCASTD AX, Z13
	MOVL $0x3c7fffff, AX
	VPBROADCASTD AX, Z12
	MOVL $0x80, AX
	VPBROADCASTD AX, Z11
	MOVL $0xc407ffff, AX
	VPBROADCASTD AX, Z9
	MOVL $0x7f800000, AX
	VPBROADCASTD AX, Z8
	MOVL $0x7e, AX
	VPBROADCASTD AX, Z7
	MOVL $0x44000000, AX
	VPBROADCASTD AX, Z6
	MOVL $0x7f, AX
	VPBROADCASTD AX, Z5
	VMOVDQU32 fp8Perm<>(SB), Z4

storeFP8MulAVX512loop:
	VMOVUPS   0(SI), Z0
	VMULPS    Z15, Z0, Z0
	VPANDD    Z14, Z0, Z1
	VPSRLD    $24, Z0, Z2
	VPSRLD    $20, Z1, Z20
	VPANDD    Z13, Z20, Z20
	VPADDD    Z9, Z1, Z16
	VPADDD    Z20, Z16, Z16
	VPSRLD    $20, Z16, Z16
	VPMINUD   Z7, Z16, Z16
	VPCMPUD   $2, Z12, Z1, K1
	VMULPS    Z6, Z1, Z21
	VCVTPS2DQ Z21, K1, Z16
	VPCMPUD   $6, Z8, Z1, K3
	VMOVDQA32 Z5, K3, Z16
	VPTERNLOGD $0xF8, Z11, Z2, Z16
	VMOVUPS   64(SI), Z0
	VMULPS    Z15, Z0, Z0
	VPANDD    Z14, Z0, Z1
	VPSRLD    $24, Z0, Z2
	VPSRLD    $20, Z1, Z20
	VPANDD    Z13, Z20, Z20
	VPADDD    Z9, Z1, Z17
	VPADDD    Z20, Z17, Z17
	VPSRLD    $20, Z17, Z17
	VPMINUD   Z7, Z17, Z17
	VPCMPUD   $2, Z12, Z1, K1
	VMULPS    Z6, Z1, Z21
	VCVTPS2DQ Z21, K1, Z17
	VPCMPUD   $6, Z8, Z1, K3
	VMOVDQA32 Z5, K3, Z17
	VPTERNLOGD $0xF8, Z11, Z2, Z17
	VMOVUPS   128(SI), Z0
	VMULPS    Z15, Z0, Z0
	VPANDD    Z14, Z0, Z1
	VPSRLD    $24, Z0, Z2
	VPSRLD    $20, Z1, Z20
	VPANDD    Z13, Z20, Z20
	VPADDD    Z9, Z1, Z18
	VPADDD    Z20, Z18, Z18
	VPSRLD    $20, Z18, Z18
	VPMINUD   Z7, Z18, Z18
	VPCMPUD   $2, Z12, Z1, K1
	VMULPS    Z6, Z1, Z21
	VCVTPS2DQ Z21, K1, Z18
	VPCMPUD   $6, Z8, Z1, K3
	VMOVDQA32 Z5, K3, Z18
	VPTERNLOGD $0xF8, Z11, Z2, Z18
	VMOVUPS   192(SI), Z0
	VMULPS    Z15, Z0, Z0
	VPANDD    Z14, Z0, Z1
	VPSRLD    $24, Z0, Z2
	VPSRLD    $20, Z1, Z20
	VPANDD    Z13, Z20, Z20
	VPADDD    Z9, Z1, Z19
	VPADDD    Z20, Z19, Z19
	VPSRLD    $20, Z19, Z19
	VPMINUD   Z7, Z19, Z19
	VPCMPUD   $2, Z12, Z1, K1
	VMULPS    Z6, Z1, Z21
	VCVTPS2DQ Z21, K1, Z19
	VPCMPUD   $6, Z8, Z1, K3
	VMOVDQA32 Z5, K3, Z19
	VPTERNLOGD $0xF8, Z11, Z2, Z19
	VPACKUSDW Z17, Z16, Z16
	VPACKUSDW Z19, Z18, Z18
	VPACKUSWB Z18, Z16, Z16
	VPERMD    Z16, Z4, Z16
	VMOVDQU32 Z16, (DI)
	ADDQ      $256, SI
	ADDQ      $64, DI
	SUBQ      $64, CX
	JNZ       storeFP8MulAVX512loop
	VZEROUPPER
	RET

// func storeFP8MulAVX512NT(dst *byte, src *float32, n int, scale float32)
// AVX-512 form of storeFP8AVX2: 64 values per iteration, n a positive
// multiple of 64; x * scale first (the caller passes 1/scale to a
// multiplying kernel only when that is exact). Per lane, on a = |x|:
// normal results round (a - (120<<23)) at bit 20 to even, and VPMINUD
// saturates them (Inf included) at 0x7e; a < 2^-6 takes a*512 converted to
// an integer (exact, nearest even); NaN gives 0x7f; VPTERNLOGD ORs in the
// sign (x>>24)&0x80. The four dword vectors are packed to bytes and put in
// order by VPERMD.
TEXT ·storeFP8MulAVX512NT(SB), NOSPLIT, $0-28
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS scale+24(FP), Z15
	MOVL $0x7fffffff, AX
	VPBROADCASTD AX, Z14
	MOVL $1, AX
	VPBROADCASTD AX, Z13
	MOVL $0x3c7fffff, AX
	VPBROADCASTD AX, Z12
	MOVL $0x80, AX
	VPBROADCASTD AX, Z11
	MOVL $0xc407ffff, AX
	VPBROADCASTD AX, Z9
	MOVL $0x7f800000, AX
	VPBROADCASTD AX, Z8
	MOVL $0x7e, AX
	VPBROADCASTD AX, Z7
	MOVL $0x44000000, AX
	VPBROADCASTD AX, Z6
	MOVL $0x7f, AX
	VPBROADCASTD AX, Z5
	VMOVDQU32 fp8Perm<>(SB), Z4

storeFP8MulAVX512NTloop:
	VMOVUPS   0(SI), Z0
	VMULPS    Z15, Z0, Z0
	VPANDD    Z14, Z0, Z1
	VPSRLD    $24, Z0, Z2
	VPSRLD    $20, Z1, Z20
	VPANDD    Z13, Z20, Z20
	VPADDD    Z9, Z1, Z16
	VPADDD    Z20, Z16, Z16
	VPSRLD    $20, Z16, Z16
	VPMINUD   Z7, Z16, Z16
	VPCMPUD   $2, Z12, Z1, K1
	VMULPS    Z6, Z1, Z21
	VCVTPS2DQ Z21, K1, Z16
	VPCMPUD   $6, Z8, Z1, K3
	VMOVDQA32 Z5, K3, Z16
	VPTERNLOGD $0xF8, Z11, Z2, Z16
	VMOVUPS   64(SI), Z0
	VMULPS    Z15, Z0, Z0
	VPANDD    Z14, Z0, Z1
	VPSRLD    $24, Z0, Z2
	VPSRLD    $20, Z1, Z20
	VPANDD    Z13, Z20, Z20
	VPADDD    Z9, Z1, Z17
	VPADDD    Z20, Z17, Z17
	VPSRLD    $20, Z17, Z17
	VPMINUD   Z7, Z17, Z17
	VPCMPUD   $2, Z12, Z1, K1
	VMULPS    Z6, Z1, Z21
	VCVTPS2DQ Z21, K1, Z17
	VPCMPUD   $6, Z8, Z1, K3
	VMOVDQA32 Z5, K3, Z17
	VPTERNLOGD $0xF8, Z11, Z2, Z17
	VMOVUPS   128(SI), Z0
	VMULPS    Z15, Z0, Z0
	VPANDD    Z14, Z0, Z1
	VPSRLD    $24, Z0, Z2
	VPSRLD    $20, Z1, Z20
	VPANDD    Z13, Z20, Z20
	VPADDD    Z9, Z1, Z18
	VPADDD    Z20, Z18, Z18
	VPSRLD    $20, Z18, Z18
	VPMINUD   Z7, Z18, Z18
	VPCMPUD   $2, Z12, Z1, K1
	VMULPS    Z6, Z1, Z21
	VCVTPS2DQ Z21, K1, Z18
	VPCMPUD   $6, Z8, Z1, K3
	VMOVDQA32 Z5, K3, Z18
	VPTERNLOGD $0xF8, Z11, Z2, Z18
	VMOVUPS   192(SI), Z0
	VMULPS    Z15, Z0, Z0
	VPANDD    Z14, Z0, Z1
	VPSRLD    $24, Z0, Z2
	VPSRLD    $20, Z1, Z20
	VPANDD    Z13, Z20, Z20
	VPADDD    Z9, Z1, Z19
	VPADDD    Z20, Z19, Z19
	VPSRLD    $20, Z19, Z19
	VPMINUD   Z7, Z19, Z19
	VPCMPUD   $2, Z12, Z1, K1
	VMULPS    Z6, Z1, Z21
	VCVTPS2DQ Z21, K1, Z19
	VPCMPUD   $6, Z8, Z1, K3
	VMOVDQA32 Z5, K3, Z19
	VPTERNLOGD $0xF8, Z11, Z2, Z19
	VPACKUSDW Z17, Z16, Z16
	VPACKUSDW Z19, Z18, Z18
	VPACKUSWB Z18, Z16, Z16
	VPERMD    Z16, Z4, Z16
	VMOVNTDQ  Z16, (DI)
	ADDQ      $256, SI
	ADDQ      $64, DI
	SUBQ      $64, CX
	JNZ       storeFP8MulAVX512NTloop
	VZEROUPPER
	RET

// func storeFP8DivAVX512(dst *byte, src *float32, n int, scale float32)
// AVX-512 form of storeFP8AVX2: 64 values per iteration, n a positive
// multiple of 64; x / scale first (the caller passes 1/scale to a
// multiplying kernel only when that is exact). Per lane, on a = |x|:
// normal results round (a - (120<<23)) at bit 20 to even, and VPMINUD
// saturates them (Inf included) at 0x7e; a < 2^-6 takes a*512 converted to
// an integer (exact, nearest even); NaN gives 0x7f; VPTERNLOGD ORs in the
// sign (x>>24)&0x80. The four dword vectors are packed to bytes and put in
// order by VPERMD.
TEXT ·storeFP8DivAVX512(SB), NOSPLIT, $0-28
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS scale+24(FP), Z15
	MOVL $0x7fffffff, AX
	VPBROADCASTD AX, Z14
	MOVL $1, AX
	VPBROADCASTD AX, Z13
	MOVL $0x3c7fffff, AX
	VPBROADCASTD AX, Z12
	MOVL $0x80, AX
	VPBROADCASTD AX, Z11
	MOVL $0xc407ffff, AX
	VPBROADCASTD AX, Z9
	MOVL $0x7f800000, AX
	VPBROADCASTD AX, Z8
	MOVL $0x7e, AX
	VPBROADCASTD AX, Z7
	MOVL $0x44000000, AX
	VPBROADCASTD AX, Z6
	MOVL $0x7f, AX
	VPBROADCASTD AX, Z5
	VMOVDQU32 fp8Perm<>(SB), Z4

storeFP8DivAVX512loop:
	VMOVUPS   0(SI), Z0
	VDIVPS    Z15, Z0, Z0
	VPANDD    Z14, Z0, Z1
	VPSRLD    $24, Z0, Z2
	VPSRLD    $20, Z1, Z20
	VPANDD    Z13, Z20, Z20
	VPADDD    Z9, Z1, Z16
	VPADDD    Z20, Z16, Z16
	VPSRLD    $20, Z16, Z16
	VPMINUD   Z7, Z16, Z16
	VPCMPUD   $2, Z12, Z1, K1
	VMULPS    Z6, Z1, Z21
	VCVTPS2DQ Z21, K1, Z16
	VPCMPUD   $6, Z8, Z1, K3
	VMOVDQA32 Z5, K3, Z16
	VPTERNLOGD $0xF8, Z11, Z2, Z16
	VMOVUPS   64(SI), Z0
	VDIVPS    Z15, Z0, Z0
	VPANDD    Z14, Z0, Z1
	VPSRLD    $24, Z0, Z2
	VPSRLD    $20, Z1, Z20
	VPANDD    Z13, Z20, Z20
	VPADDD    Z9, Z1, Z17
	VPADDD    Z20, Z17, Z17
	VPSRLD    $20, Z17, Z17
	VPMINUD   Z7, Z17, Z17
	VPCMPUD   $2, Z12, Z1, K1
	VMULPS    Z6, Z1, Z21
	VCVTPS2DQ Z21, K1, Z17
	VPCMPUD   $6, Z8, Z1, K3
	VMOVDQA32 Z5, K3, Z17
	VPTERNLOGD $0xF8, Z11, Z2, Z17
	VMOVUPS   128(SI), Z0
	VDIVPS    Z15, Z0, Z0
	VPANDD    Z14, Z0, Z1
	VPSRLD    $24, Z0, Z2
	VPSRLD    $20, Z1, Z20
	VPANDD    Z13, Z20, Z20
	VPADDD    Z9, Z1, Z18
	VPADDD    Z20, Z18, Z18
	VPSRLD    $20, Z18, Z18
	VPMINUD   Z7, Z18, Z18
	VPCMPUD   $2, Z12, Z1, K1
	VMULPS    Z6, Z1, Z21
	VCVTPS2DQ Z21, K1, Z18
	VPCMPUD   $6, Z8, Z1, K3
	VMOVDQA32 Z5, K3, Z18
	VPTERNLOGD $0xF8, Z11, Z2, Z18
	VMOVUPS   192(SI), Z0
	VDIVPS    Z15, Z0, Z0
	VPANDD    Z14, Z0, Z1
	VPSRLD    $24, Z0, Z2
	VPSRLD    $20, Z1, Z20
	VPANDD    Z13, Z20, Z20
	VPADDD    Z9, Z1, Z19
	VPADDD    Z20, Z19, Z19
	VPSRLD    $20, Z19, Z19
	VPMINUD   Z7, Z19, Z19
	VPCMPUD   $2, Z12, Z1, K1
	VMULPS    Z6, Z1, Z21
	VCVTPS2DQ Z21, K1, Z19
	VPCMPUD   $6, Z8, Z1, K3
	VMOVDQA32 Z5, K3, Z19
	VPTERNLOGD $0xF8, Z11, Z2, Z19
	VPACKUSDW Z17, Z16, Z16
	VPACKUSDW Z19, Z18, Z18
	VPACKUSWB Z18, Z16, Z16
	VPERMD    Z16, Z4, Z16
	VMOVDQU32 Z16, (DI)
	ADDQ      $256, SI
	ADDQ      $64, DI
	SUBQ      $64, CX
	JNZ       storeFP8DivAVX512loop
	VZEROUPPER
	RET

// func storeFP8DivAVX512NT(dst *byte, src *float32, n int, scale float32)
// AVX-512 form of storeFP8AVX2: 64 values per iteration, n a positive
// multiple of 64; x / scale first (the caller passes 1/scale to a
// multiplying kernel only when that is exact). Per lane, on a = |x|:
// normal results round (a - (120<<23)) at bit 20 to even, and VPMINUD
// saturates them (Inf included) at 0x7e; a < 2^-6 takes a*512 converted to
// an integer (exact, nearest even); NaN gives 0x7f; VPTERNLOGD ORs in the
// sign (x>>24)&0x80. The four dword vectors are packed to bytes and put in
// order by VPERMD.
TEXT ·storeFP8DivAVX512NT(SB), NOSPLIT, $0-28
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS scale+24(FP), Z15
	MOVL $0x7fffffff, AX
	VPBROADCASTD AX, Z14
	MOVL $1, AX
	VPBROADCASTD AX, Z13
	MOVL $0x3c7fffff, AX
	VPBROADCASTD AX, Z12
	MOVL $0x80, AX
	VPBROADCASTD AX, Z11
	MOVL $0xc407ffff, AX
	VPBROADCASTD AX, Z9
	MOVL $0x7f800000, AX
	VPBROADCASTD AX, Z8
	MOVL $0x7e, AX
	VPBROADCASTD AX, Z7
	MOVL $0x44000000, AX
	VPBROADCASTD AX, Z6
	MOVL $0x7f, AX
	VPBROADCASTD AX, Z5
	VMOVDQU32 fp8Perm<>(SB), Z4

storeFP8DivAVX512NTloop:
	VMOVUPS   0(SI), Z0
	VDIVPS    Z15, Z0, Z0
	VPANDD    Z14, Z0, Z1
	VPSRLD    $24, Z0, Z2
	VPSRLD    $20, Z1, Z20
	VPANDD    Z13, Z20, Z20
	VPADDD    Z9, Z1, Z16
	VPADDD    Z20, Z16, Z16
	VPSRLD    $20, Z16, Z16
	VPMINUD   Z7, Z16, Z16
	VPCMPUD   $2, Z12, Z1, K1
	VMULPS    Z6, Z1, Z21
	VCVTPS2DQ Z21, K1, Z16
	VPCMPUD   $6, Z8, Z1, K3
	VMOVDQA32 Z5, K3, Z16
	VPTERNLOGD $0xF8, Z11, Z2, Z16
	VMOVUPS   64(SI), Z0
	VDIVPS    Z15, Z0, Z0
	VPANDD    Z14, Z0, Z1
	VPSRLD    $24, Z0, Z2
	VPSRLD    $20, Z1, Z20
	VPANDD    Z13, Z20, Z20
	VPADDD    Z9, Z1, Z17
	VPADDD    Z20, Z17, Z17
	VPSRLD    $20, Z17, Z17
	VPMINUD   Z7, Z17, Z17
	VPCMPUD   $2, Z12, Z1, K1
	VMULPS    Z6, Z1, Z21
	VCVTPS2DQ Z21, K1, Z17
	VPCMPUD   $6, Z8, Z1, K3
	VMOVDQA32 Z5, K3, Z17
	VPTERNLOGD $0xF8, Z11, Z2, Z17
	VMOVUPS   128(SI), Z0
	VDIVPS    Z15, Z0, Z0
	VPANDD    Z14, Z0, Z1
	VPSRLD    $24, Z0, Z2
	VPSRLD    $20, Z1, Z20
	VPANDD    Z13, Z20, Z20
	VPADDD    Z9, Z1, Z18
	VPADDD    Z20, Z18, Z18
	VPSRLD    $20, Z18, Z18
	VPMINUD   Z7, Z18, Z18
	VPCMPUD   $2, Z12, Z1, K1
	VMULPS    Z6, Z1, Z21
	VCVTPS2DQ Z21, K1, Z18
	VPCMPUD   $6, Z8, Z1, K3
	VMOVDQA32 Z5, K3, Z18
	VPTERNLOGD $0xF8, Z11, Z2, Z18
	VMOVUPS   192(SI), Z0
	VDIVPS    Z15, Z0, Z0
	VPANDD    Z14, Z0, Z1
	VPSRLD    $24, Z0, Z2
	VPSRLD    $20, Z1, Z20
	VPANDD    Z13, Z20, Z20
	VPADDD    Z9, Z1, Z19
	VPADDD    Z20, Z19, Z19
	VPSRLD    $20, Z19, Z19
	VPMINUD   Z7, Z19, Z19
	VPCMPUD   $2, Z12, Z1, K1
	VMULPS    Z6, Z1, Z21
	VCVTPS2DQ Z21, K1, Z19
	VPCMPUD   $6, Z8, Z1, K3
	VMOVDQA32 Z5, K3, Z19
	VPTERNLOGD $0xF8, Z11, Z2, Z19
	VPACKUSDW Z17, Z16, Z16
	VPACKUSDW Z19, Z18, Z18
	VPACKUSWB Z18, Z16, Z16
	VPERMD    Z16, Z4, Z16
	VMOVNTDQ  Z16, (DI)
	ADDQ      $256, SI
	ADDQ      $64, DI
	SUBQ      $64, CX
	JNZ       storeFP8DivAVX512NTloop
	VZEROUPPER
	RET

// func storeFP8AVX512(dst *byte, src *float32, n int, scale float32)
// AVX-512 form of storeFP8AVX2: 64 values per iteration, n a positive
// multiple of 64; no scaling (scale is
// ignored). Per lane, on a = |x|:
// normal results round (a - (120<<23)) at bit 20 to even, and VPMINUD
// saturates them (Inf included) at 0x7e; a < 2^-6 takes a*512 converted to
// an integer (exact, nearest even); NaN gives 0x7f; VPTERNLOGD ORs in the
// sign (x>>24)&0x80. The four dword vectors are packed to bytes and put in
// order by VPERMD.
TEXT ·storeFP8AVX512(SB), NOSPLIT, $0-28
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS scale+24(FP), Z15
	MOVL $0x7fffffff, AX
	VPBROADCASTD AX, Z14
	MOVL $1, AX
	VPBROADCASTD AX, Z13
	MOVL $0x3c7fffff, AX
	VPBROADCASTD AX, Z12
	MOVL $0x80, AX
	VPBROADCASTD AX, Z11
	MOVL $0xc407ffff, AX
	VPBROADCASTD AX, Z9
	MOVL $0x7f800000, AX
	VPBROADCASTD AX, Z8
	MOVL $0x7e, AX
	VPBROADCASTD AX, Z7
	MOVL $0x44000000, AX
	VPBROADCASTD AX, Z6
	MOVL $0x7f, AX
	VPBROADCASTD AX, Z5
	VMOVDQU32 fp8Perm<>(SB), Z4

storeFP8AVX512loop:
	VMOVUPS   0(SI), Z0
	VPANDD    Z14, Z0, Z1
	VPSRLD    $24, Z0, Z2
	VPSRLD    $20, Z1, Z20
	VPANDD    Z13, Z20, Z20
	VPADDD    Z9, Z1, Z16
	VPADDD    Z20, Z16, Z16
	VPSRLD    $20, Z16, Z16
	VPMINUD   Z7, Z16, Z16
	VPCMPUD   $2, Z12, Z1, K1
	VMULPS    Z6, Z1, Z21
	VCVTPS2DQ Z21, K1, Z16
	VPCMPUD   $6, Z8, Z1, K3
	VMOVDQA32 Z5, K3, Z16
	VPTERNLOGD $0xF8, Z11, Z2, Z16
	VMOVUPS   64(SI), Z0
	VPANDD    Z14, Z0, Z1
	VPSRLD    $24, Z0, Z2
	VPSRLD    $20, Z1, Z20
	VPANDD    Z13, Z20, Z20
	VPADDD    Z9, Z1, Z17
	VPADDD    Z20, Z17, Z17
	VPSRLD    $20, Z17, Z17
	VPMINUD   Z7, Z17, Z17
	VPCMPUD   $2, Z12, Z1, K1
	VMULPS    Z6, Z1, Z21
	VCVTPS2DQ Z21, K1, Z17
	VPCMPUD   $6, Z8, Z1, K3
	VMOVDQA32 Z5, K3, Z17
	VPTERNLOGD $0xF8, Z11, Z2, Z17
	VMOVUPS   128(SI), Z0
	VPANDD    Z14, Z0, Z1
	VPSRLD    $24, Z0, Z2
	VPSRLD    $20, Z1, Z20
	VPANDD    Z13, Z20, Z20
	VPADDD    Z9, Z1, Z18
	VPADDD    Z20, Z18, Z18
	VPSRLD    $20, Z18, Z18
	VPMINUD   Z7, Z18, Z18
	VPCMPUD   $2, Z12, Z1, K1
	VMULPS    Z6, Z1, Z21
	VCVTPS2DQ Z21, K1, Z18
	VPCMPUD   $6, Z8, Z1, K3
	VMOVDQA32 Z5, K3, Z18
	VPTERNLOGD $0xF8, Z11, Z2, Z18
	VMOVUPS   192(SI), Z0
	VPANDD    Z14, Z0, Z1
	VPSRLD    $24, Z0, Z2
	VPSRLD    $20, Z1, Z20
	VPANDD    Z13, Z20, Z20
	VPADDD    Z9, Z1, Z19
	VPADDD    Z20, Z19, Z19
	VPSRLD    $20, Z19, Z19
	VPMINUD   Z7, Z19, Z19
	VPCMPUD   $2, Z12, Z1, K1
	VMULPS    Z6, Z1, Z21
	VCVTPS2DQ Z21, K1, Z19
	VPCMPUD   $6, Z8, Z1, K3
	VMOVDQA32 Z5, K3, Z19
	VPTERNLOGD $0xF8, Z11, Z2, Z19
	VPACKUSDW Z17, Z16, Z16
	VPACKUSDW Z19, Z18, Z18
	VPACKUSWB Z18, Z16, Z16
	VPERMD    Z16, Z4, Z16
	VMOVDQU32 Z16, (DI)
	ADDQ      $256, SI
	ADDQ      $64, DI
	SUBQ      $64, CX
	JNZ       storeFP8AVX512loop
	VZEROUPPER
	RET

// func storeFP8AVX512NT(dst *byte, src *float32, n int, scale float32)
// AVX-512 form of storeFP8AVX2: 64 values per iteration, n a positive
// multiple of 64; no scaling (scale is
// ignored). Per lane, on a = |x|:
// normal results round (a - (120<<23)) at bit 20 to even, and VPMINUD
// saturates them (Inf included) at 0x7e; a < 2^-6 takes a*512 converted to
// an integer (exact, nearest even); NaN gives 0x7f; VPTERNLOGD ORs in the
// sign (x>>24)&0x80. The four dword vectors are packed to bytes and put in
// order by VPERMD.
TEXT ·storeFP8AVX512NT(SB), NOSPLIT, $0-28
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS scale+24(FP), Z15
	MOVL $0x7fffffff, AX
	VPBROADCASTD AX, Z14
	MOVL $1, AX
	VPBROADCASTD AX, Z13
	MOVL $0x3c7fffff, AX
	VPBROADCASTD AX, Z12
	MOVL $0x80, AX
	VPBROADCASTD AX, Z11
	MOVL $0xc407ffff, AX
	VPBROADCASTD AX, Z9
	MOVL $0x7f800000, AX
	VPBROADCASTD AX, Z8
	MOVL $0x7e, AX
	VPBROADCASTD AX, Z7
	MOVL $0x44000000, AX
	VPBROADCASTD AX, Z6
	MOVL $0x7f, AX
	VPBROADCASTD AX, Z5
	VMOVDQU32 fp8Perm<>(SB), Z4

storeFP8AVX512NTloop:
	VMOVUPS   0(SI), Z0
	VPANDD    Z14, Z0, Z1
	VPSRLD    $24, Z0, Z2
	VPSRLD    $20, Z1, Z20
	VPANDD    Z13, Z20, Z20
	VPADDD    Z9, Z1, Z16
	VPADDD    Z20, Z16, Z16
	VPSRLD    $20, Z16, Z16
	VPMINUD   Z7, Z16, Z16
	VPCMPUD   $2, Z12, Z1, K1
	VMULPS    Z6, Z1, Z21
	VCVTPS2DQ Z21, K1, Z16
	VPCMPUD   $6, Z8, Z1, K3
	VMOVDQA32 Z5, K3, Z16
	VPTERNLOGD $0xF8, Z11, Z2, Z16
	VMOVUPS   64(SI), Z0
	VPANDD    Z14, Z0, Z1
	VPSRLD    $24, Z0, Z2
	VPSRLD    $20, Z1, Z20
	VPANDD    Z13, Z20, Z20
	VPADDD    Z9, Z1, Z17
	VPADDD    Z20, Z17, Z17
	VPSRLD    $20, Z17, Z17
	VPMINUD   Z7, Z17, Z17
	VPCMPUD   $2, Z12, Z1, K1
	VMULPS    Z6, Z1, Z21
	VCVTPS2DQ Z21, K1, Z17
	VPCMPUD   $6, Z8, Z1, K3
	VMOVDQA32 Z5, K3, Z17
	VPTERNLOGD $0xF8, Z11, Z2, Z17
	VMOVUPS   128(SI), Z0
	VPANDD    Z14, Z0, Z1
	VPSRLD    $24, Z0, Z2
	VPSRLD    $20, Z1, Z20
	VPANDD    Z13, Z20, Z20
	VPADDD    Z9, Z1, Z18
	VPADDD    Z20, Z18, Z18
	VPSRLD    $20, Z18, Z18
	VPMINUD   Z7, Z18, Z18
	VPCMPUD   $2, Z12, Z1, K1
	VMULPS    Z6, Z1, Z21
	VCVTPS2DQ Z21, K1, Z18
	VPCMPUD   $6, Z8, Z1, K3
	VMOVDQA32 Z5, K3, Z18
	VPTERNLOGD $0xF8, Z11, Z2, Z18
	VMOVUPS   192(SI), Z0
	VPANDD    Z14, Z0, Z1
	VPSRLD    $24, Z0, Z2
	VPSRLD    $20, Z1, Z20
	VPANDD    Z13, Z20, Z20
	VPADDD    Z9, Z1, Z19
	VPADDD    Z20, Z19, Z19
	VPSRLD    $20, Z19, Z19
	VPMINUD   Z7, Z19, Z19
	VPCMPUD   $2, Z12, Z1, K1
	VMULPS    Z6, Z1, Z21
	VCVTPS2DQ Z21, K1, Z19
	VPCMPUD   $6, Z8, Z1, K3
	VMOVDQA32 Z5, K3, Z19
	VPTERNLOGD $0xF8, Z11, Z2, Z19
	VPACKUSDW Z17, Z16, Z16
	VPACKUSDW Z19, Z18, Z18
	VPACKUSWB Z18, Z16, Z16
	VPERMD    Z16, Z4, Z16
	VMOVNTDQ  Z16, (DI)
	ADDQ      $256, SI
	ADDQ      $64, DI
	SUBQ      $64, CX
	JNZ       storeFP8AVX512NTloop
	VZEROUPPER
	RET

// func widenFP8AVX512(dst *float32, src *byte, n int, scale float32)
// AVX-512 form of widenFP8AVX2; n is a positive multiple of 16.
TEXT ·widenFP8AVX512(SB), NOSPLIT, $0-28
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS scale+24(FP), Z15
	MOVL $0x7f, AX
	VPBROADCASTD AX, Z14
	MOVL $0x7b800000, AX
	VPBROADCASTD AX, Z13
	MOVL $0x80, AX
	VPBROADCASTD AX, Z12
	MOVL $0x7fc00000, AX
	VPBROADCASTD AX, Z11

wfp8zloop:
	VPMOVZXBD (SI), Z0
	VPANDD    Z14, Z0, Z1
	VPCMPEQD  Z14, Z1, K1
	VPSLLD    $20, Z1, Z1
	VMULPS    Z13, Z1, Z1
	VMOVDQA32 Z11, K1, Z1
	VPANDD    Z12, Z0, Z2
	VPSLLD    $24, Z2, Z2
	VPORD     Z2, Z1, Z1
	VMULPS    Z15, Z1, Z1
	VMOVUPS   Z1, (DI)
	ADDQ      $16, SI
	ADDQ      $64, DI
	SUBQ      $16, CX
	JNZ       wfp8zloop
	VZEROUPPER
	RET

// func narrowBF16AVX512BF16(dst *byte, src *float32, n int)
// narrowBF16AVX2 with VCVTNE2PS2BF16, 32 values per iteration, n a positive
// multiple of 32; subnormal lanes are fixed up with integer rounding as in
// rotNeoXBF16AVX512BF16.
TEXT ·narrowBF16AVX512BF16(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVL $0x7fff, AX
	VPBROADCASTD AX, Z15
	MOVL $1, AX
	VPBROADCASTD AX, Z14

narrowBF16AVX512BF16loop:
	VMOVUPS   (SI), Z8
	VMOVUPS   64(SI), Z9
	// VCVTNE2PS2BF16 Z8, Z9, Z16 (low half from Z8)
	BYTE $0x62; BYTE $0xc2; BYTE $0x37; BYTE $0x48; BYTE $0x72; BYTE $0xc0
	VFPCLASSPSZ $0x20, Z8, K1
	VFPCLASSPSZ $0x20, Z9, K2
	KORTESTW  K1, K2
	JNZ       narrowBF16AVX512BF16fix

narrowBF16AVX512BF16store:
	VMOVDQU32 Z16, (DI)
	ADDQ      $128, SI
	ADDQ      $64, DI
	SUBQ      $32, CX
	JNZ       narrowBF16AVX512BF16loop
	VZEROUPPER
	RET

narrowBF16AVX512BF16fix:
	VPSRLD    $16, Z8, Z18
	VPANDD    Z14, Z18, Z18
	VPADDD    Z15, Z8, Z19
	VPADDD    Z18, Z19, Z19
	VPSRLD    $16, Z19, Z19
	VPMOVDW   Z19, Y20
	VPSRLD    $16, Z9, Z18
	VPANDD    Z14, Z18, Z18
	VPADDD    Z15, Z9, Z19
	VPADDD    Z18, Z19, Z19
	VPSRLD    $16, Z19, Z19
	VPMOVDW   Z19, Y21
	VINSERTI64X4 $1, Y21, Z20, Z20
	KUNPCKWD  K1, K2, K7
	VMOVDQU16 Z20, K7, Z16
	JMP       narrowBF16AVX512BF16store

// func narrowBF16AVX512BF16NT(dst *byte, src *float32, n int)
// narrowBF16AVX2 with VCVTNE2PS2BF16, 32 values per iteration, n a positive
// multiple of 32; subnormal lanes are fixed up with integer rounding as in
// rotNeoXBF16AVX512BF16.
TEXT ·narrowBF16AVX512BF16NT(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVL $0x7fff, AX
	VPBROADCASTD AX, Z15
	MOVL $1, AX
	VPBROADCASTD AX, Z14

narrowBF16AVX512BF16NTloop:
	VMOVUPS   (SI), Z8
	VMOVUPS   64(SI), Z9
	// VCVTNE2PS2BF16 Z8, Z9, Z16 (low half from Z8)
	BYTE $0x62; BYTE $0xc2; BYTE $0x37; BYTE $0x48; BYTE $0x72; BYTE $0xc0
	VFPCLASSPSZ $0x20, Z8, K1
	VFPCLASSPSZ $0x20, Z9, K2
	KORTESTW  K1, K2
	JNZ       narrowBF16AVX512BF16NTfix

narrowBF16AVX512BF16NTstore:
	VMOVNTDQ  Z16, (DI)
	ADDQ      $128, SI
	ADDQ      $64, DI
	SUBQ      $32, CX
	JNZ       narrowBF16AVX512BF16NTloop
	VZEROUPPER
	RET

narrowBF16AVX512BF16NTfix:
	VPSRLD    $16, Z8, Z18
	VPANDD    Z14, Z18, Z18
	VPADDD    Z15, Z8, Z19
	VPADDD    Z18, Z19, Z19
	VPSRLD    $16, Z19, Z19
	VPMOVDW   Z19, Y20
	VPSRLD    $16, Z9, Z18
	VPANDD    Z14, Z18, Z18
	VPADDD    Z15, Z9, Z19
	VPADDD    Z18, Z19, Z19
	VPSRLD    $16, Z19, Z19
	VPMOVDW   Z19, Y21
	VINSERTI64X4 $1, Y21, Z20, Z20
	KUNPCKWD  K1, K2, K7
	VMOVDQU16 Z20, K7, Z16
	JMP       narrowBF16AVX512BF16NTstore

// func widenBF16AVX512(dst *float32, src *byte, n int)
// widenBF16AVX2 32 values at a time; n is a positive multiple of 32.
TEXT ·widenBF16AVX512(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

wbf16zloop:
	VPMOVZXWD (SI), Z0
	VPMOVZXWD 32(SI), Z1
	VPSLLD    $16, Z0, Z0
	VPSLLD    $16, Z1, Z1
	VMOVUPS   Z0, (DI)
	VMOVUPS   Z1, 64(DI)
	ADDQ      $64, SI
	ADDQ      $128, DI
	SUBQ      $32, CX
	JNZ       wbf16zloop
	VZEROUPPER
	RET

// func widenF16AVX512(dst *float32, src *byte, n int)
// widenF16AVX2 32 values at a time; n is a positive multiple of 32.
TEXT ·widenF16AVX512(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

wf16zloop:
	VCVTPH2PS (SI), Z0
	VCVTPH2PS 32(SI), Z1
	VMOVUPS   Z0, (DI)
	VMOVUPS   Z1, 64(DI)
	ADDQ      $64, SI
	ADDQ      $128, DI
	SUBQ      $32, CX
	JNZ       wf16zloop
	VZEROUPPER
	RET

// gptjBF16Perm interleaves [a0..a15, b0..b15] words into a0 b0 a1 b1 ...
DATA gptjBF16Perm<>+0(SB)/2, $0
DATA gptjBF16Perm<>+2(SB)/2, $16
DATA gptjBF16Perm<>+4(SB)/2, $1
DATA gptjBF16Perm<>+6(SB)/2, $17
DATA gptjBF16Perm<>+8(SB)/2, $2
DATA gptjBF16Perm<>+10(SB)/2, $18
DATA gptjBF16Perm<>+12(SB)/2, $3
DATA gptjBF16Perm<>+14(SB)/2, $19
DATA gptjBF16Perm<>+16(SB)/2, $4
DATA gptjBF16Perm<>+18(SB)/2, $20
DATA gptjBF16Perm<>+20(SB)/2, $5
DATA gptjBF16Perm<>+22(SB)/2, $21
DATA gptjBF16Perm<>+24(SB)/2, $6
DATA gptjBF16Perm<>+26(SB)/2, $22
DATA gptjBF16Perm<>+28(SB)/2, $7
DATA gptjBF16Perm<>+30(SB)/2, $23
DATA gptjBF16Perm<>+32(SB)/2, $8
DATA gptjBF16Perm<>+34(SB)/2, $24
DATA gptjBF16Perm<>+36(SB)/2, $9
DATA gptjBF16Perm<>+38(SB)/2, $25
DATA gptjBF16Perm<>+40(SB)/2, $10
DATA gptjBF16Perm<>+42(SB)/2, $26
DATA gptjBF16Perm<>+44(SB)/2, $11
DATA gptjBF16Perm<>+46(SB)/2, $27
DATA gptjBF16Perm<>+48(SB)/2, $12
DATA gptjBF16Perm<>+50(SB)/2, $28
DATA gptjBF16Perm<>+52(SB)/2, $13
DATA gptjBF16Perm<>+54(SB)/2, $29
DATA gptjBF16Perm<>+56(SB)/2, $14
DATA gptjBF16Perm<>+58(SB)/2, $30
DATA gptjBF16Perm<>+60(SB)/2, $15
DATA gptjBF16Perm<>+62(SB)/2, $31
GLOBL gptjBF16Perm<>(SB), RODATA|NOPTR, $64

// func rotGPTJBF16AVX512BF16(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)
// GPT-J (interleaved) pairs i < n of bf16 head vectors, n a positive
// multiple of 16 (half is unused), in registers: each dword of the source
// holds one pair, so VPSLLD and VPANDD give x0 and x1 as float32 with cos
// and sin in their natural order; VCVTNE2PS2BF16 rounds both results (with
// the subnormal fix-up of rotNeoXBF16AVX512BF16) and VPERMW interleaves
// them back. The bits of rotBF16GPTJ.
TEXT ·rotGPTJBF16AVX512BF16(SB), NOSPLIT, $0-72
	MOVQ dst+0(FP), R12
	MOVQ src+8(FP), R13
	MOVQ count+48(FP), BX
	MOVL $0x7fff, AX
	VPBROADCASTD AX, Z15
	MOVL $1, AX
	VPBROADCASTD AX, Z14
	MOVL $0xffff0000, AX
	VPBROADCASTD AX, Z13
	VMOVDQU32 gptjBF16Perm<>(SB), Z12

rotGPTJBF16AVX512BF16head:
	MOVQ R12, DI
	MOVQ R13, SI
	MOVQ cos+16(FP), R8
	MOVQ sin+24(FP), R9
	MOVQ n+32(FP), CX

rotGPTJBF16AVX512BF16loop:
	VMOVDQU32 (SI), Z0
	VPSLLD    $16, Z0, Z1
	VPANDD    Z13, Z0, Z2
	VMOVUPS   (R8), Z4
	VMOVUPS   (R9), Z6
	VMULPS    Z4, Z1, Z8
	VMULPS    Z6, Z2, Z9
	VSUBPS    Z9, Z8, Z8
	VMULPS    Z4, Z2, Z10
	VMULPS    Z6, Z1, Z11
	VADDPS    Z11, Z10, Z10
	// VCVTNE2PS2BF16 Z8, Z10, Z16 (low half from Z8)
	BYTE $0x62; BYTE $0xc2; BYTE $0x2f; BYTE $0x48; BYTE $0x72; BYTE $0xc0
	VFPCLASSPSZ $0x20, Z8, K1
	VFPCLASSPSZ $0x20, Z10, K2
	KORTESTW  K1, K2
	JNZ       rotGPTJBF16AVX512BF16fix

rotGPTJBF16AVX512BF16store:
	VPERMW    Z16, Z12, Z16
	VMOVDQU32 Z16, (DI)
	ADDQ      $64, SI
	ADDQ      $64, DI
	ADDQ      $64, R8
	ADDQ      $64, R9
	SUBQ      $16, CX
	JNZ       rotGPTJBF16AVX512BF16loop
	ADDQ dstStride+56(FP), R12
	ADDQ srcStride+64(FP), R13
	DECQ BX
	JNZ  rotGPTJBF16AVX512BF16head
	VZEROUPPER
	RET

rotGPTJBF16AVX512BF16fix:
	VPSRLD    $16, Z8, Z18
	VPANDD    Z14, Z18, Z18
	VPADDD    Z15, Z8, Z19
	VPADDD    Z18, Z19, Z19
	VPSRLD    $16, Z19, Z19
	VPMOVDW   Z19, Y20
	VPSRLD    $16, Z10, Z18
	VPANDD    Z14, Z18, Z18
	VPADDD    Z15, Z10, Z19
	VPADDD    Z18, Z19, Z19
	VPSRLD    $16, Z19, Z19
	VPMOVDW   Z19, Y21
	VINSERTI64X4 $1, Y21, Z20, Z20
	KUNPCKWD  K1, K2, K7
	VMOVDQU16 Z20, K7, Z16
	JMP       rotGPTJBF16AVX512BF16store

// func rotGPTJBF16AVX512BF16NT(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int)
// GPT-J (interleaved) pairs i < n of bf16 head vectors, n a positive
// multiple of 16 (half is unused), in registers: each dword of the source
// holds one pair, so VPSLLD and VPANDD give x0 and x1 as float32 with cos
// and sin in their natural order; VCVTNE2PS2BF16 rounds both results (with
// the subnormal fix-up of rotNeoXBF16AVX512BF16) and VPERMW interleaves
// them back. The bits of rotBF16GPTJ.
TEXT ·rotGPTJBF16AVX512BF16NT(SB), NOSPLIT, $0-72
	MOVQ dst+0(FP), R12
	MOVQ src+8(FP), R13
	MOVQ count+48(FP), BX
	MOVL $0x7fff, AX
	VPBROADCASTD AX, Z15
	MOVL $1, AX
	VPBROADCASTD AX, Z14
	MOVL $0xffff0000, AX
	VPBROADCASTD AX, Z13
	VMOVDQU32 gptjBF16Perm<>(SB), Z12

rotGPTJBF16AVX512BF16NThead:
	MOVQ R12, DI
	MOVQ R13, SI
	MOVQ cos+16(FP), R8
	MOVQ sin+24(FP), R9
	MOVQ n+32(FP), CX

rotGPTJBF16AVX512BF16NTloop:
	VMOVDQU32 (SI), Z0
	VPSLLD    $16, Z0, Z1
	VPANDD    Z13, Z0, Z2
	VMOVUPS   (R8), Z4
	VMOVUPS   (R9), Z6
	VMULPS    Z4, Z1, Z8
	VMULPS    Z6, Z2, Z9
	VSUBPS    Z9, Z8, Z8
	VMULPS    Z4, Z2, Z10
	VMULPS    Z6, Z1, Z11
	VADDPS    Z11, Z10, Z10
	// VCVTNE2PS2BF16 Z8, Z10, Z16 (low half from Z8)
	BYTE $0x62; BYTE $0xc2; BYTE $0x2f; BYTE $0x48; BYTE $0x72; BYTE $0xc0
	VFPCLASSPSZ $0x20, Z8, K1
	VFPCLASSPSZ $0x20, Z10, K2
	KORTESTW  K1, K2
	JNZ       rotGPTJBF16AVX512BF16NTfix

rotGPTJBF16AVX512BF16NTstore:
	VPERMW    Z16, Z12, Z16
	VMOVNTDQ  Z16, (DI)
	ADDQ      $64, SI
	ADDQ      $64, DI
	ADDQ      $64, R8
	ADDQ      $64, R9
	SUBQ      $16, CX
	JNZ       rotGPTJBF16AVX512BF16NTloop
	ADDQ dstStride+56(FP), R12
	ADDQ srcStride+64(FP), R13
	DECQ BX
	JNZ  rotGPTJBF16AVX512BF16NThead
	VZEROUPPER
	RET

rotGPTJBF16AVX512BF16NTfix:
	VPSRLD    $16, Z8, Z18
	VPANDD    Z14, Z18, Z18
	VPADDD    Z15, Z8, Z19
	VPADDD    Z18, Z19, Z19
	VPSRLD    $16, Z19, Z19
	VPMOVDW   Z19, Y20
	VPSRLD    $16, Z10, Z18
	VPANDD    Z14, Z18, Z18
	VPADDD    Z15, Z10, Z19
	VPADDD    Z18, Z19, Z19
	VPSRLD    $16, Z19, Z19
	VPMOVDW   Z19, Y21
	VINSERTI64X4 $1, Y21, Z20, Z20
	KUNPCKWD  K1, K2, K7
	VMOVDQU16 Z20, K7, Z16
	JMP       rotGPTJBF16AVX512BF16NTstore
