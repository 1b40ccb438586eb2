//go:build !purego

#include "textflag.h"
#include "bf16_amd64.h"

// Single-pass AVX-512 kernels for the fp8 <-> bf16 jobs (see kernels.go):
// each reads the source dtype, works in float32 registers and writes the
// destination dtype, with no float32 scratch vector in between. They give
// the bits of the Go path (loadF32, rotNeoX, storeF32):
//
//   - fp8 -> float32 (x = fp8 * scale) is arithmetic: a normal code's bits
//     are (b&0x7f)<<20 + 120<<23; zero, subnormal and NaN codes take their
//     float32 bits from a 16-entry table (VPERMD on the low 4 bits: codes
//     0-7 are m * 2^-9, code 0x7f is NaN), so no float32 subnormal is ever
//     an input (a subnormal operand costs this CPU a microcode assist).
//   - float32 -> bf16 is VCVTNE2PS2BF16, whose subnormal inputs are fixed
//     up with integer rounding (as in rotNeoXBF16AVX512BF16).
//   - float32 -> e4m3 is the integer rounding of storeFP8AVX512: rebias,
//     round the 20 dropped bits to even, saturate at 448; subnormal results
//     by VCVTPS2DQ of x * 2^9; NaN to 0x7f.
//
// The rotation is the NeoX one of the other kernels (each product rounded
// to float32, no fused multiply-add), over count head vectors sharing a
// cos/sin row. A nonzero nt stores non-temporally (the caller checks the
// alignment the vector stores need).

// fp8Special is the float32 bits of the e4m3 codes without an implicit
// one, by their low 4 bits: m * 2^-9 for codes 0-7, NaN for 0x7f.
DATA fp8Special<>+0(SB)/4, $0x00000000
DATA fp8Special<>+4(SB)/4, $0x3b000000
DATA fp8Special<>+8(SB)/4, $0x3b800000
DATA fp8Special<>+12(SB)/4, $0x3bc00000
DATA fp8Special<>+16(SB)/4, $0x3c000000
DATA fp8Special<>+20(SB)/4, $0x3c200000
DATA fp8Special<>+24(SB)/4, $0x3c400000
DATA fp8Special<>+28(SB)/4, $0x3c600000
DATA fp8Special<>+32(SB)/4, $0
DATA fp8Special<>+36(SB)/4, $0
DATA fp8Special<>+40(SB)/4, $0
DATA fp8Special<>+44(SB)/4, $0
DATA fp8Special<>+48(SB)/4, $0
DATA fp8Special<>+52(SB)/4, $0
DATA fp8Special<>+56(SB)/4, $0
DATA fp8Special<>+60(SB)/4, $0x7fc00000
GLOBL fp8Special<>(SB), RODATA|NOPTR, $64

// fp8SpecialBF16 is fp8Special as bf16 bits, by the low 5 bits of the
// code (NaN, 0x7f, at 31).
DATA fp8SpecialBF16<>+0(SB)/8, $0x3bc03b803b000000
DATA fp8SpecialBF16<>+8(SB)/8, $0x3c603c403c203c00
DATA fp8SpecialBF16<>+16(SB)/8, $0
DATA fp8SpecialBF16<>+24(SB)/8, $0
DATA fp8SpecialBF16<>+32(SB)/8, $0
DATA fp8SpecialBF16<>+40(SB)/8, $0
DATA fp8SpecialBF16<>+48(SB)/8, $0
DATA fp8SpecialBF16<>+56(SB)/8, $0x7fc0000000000000
GLOBL fp8SpecialBF16<>(SB), RODATA|NOPTR, $64

// fp8Spread holds two VPERMW indices that move words 0-15 (then 16-31)
// into the high words of 16 dwords: with the even words zeroed, bf16 bits
// become float32 bits.
DATA fp8Spread<>+0(SB)/2, $0
DATA fp8Spread<>+2(SB)/2, $0
DATA fp8Spread<>+4(SB)/2, $1
DATA fp8Spread<>+6(SB)/2, $1
DATA fp8Spread<>+8(SB)/2, $2
DATA fp8Spread<>+10(SB)/2, $2
DATA fp8Spread<>+12(SB)/2, $3
DATA fp8Spread<>+14(SB)/2, $3
DATA fp8Spread<>+16(SB)/2, $4
DATA fp8Spread<>+18(SB)/2, $4
DATA fp8Spread<>+20(SB)/2, $5
DATA fp8Spread<>+22(SB)/2, $5
DATA fp8Spread<>+24(SB)/2, $6
DATA fp8Spread<>+26(SB)/2, $6
DATA fp8Spread<>+28(SB)/2, $7
DATA fp8Spread<>+30(SB)/2, $7
DATA fp8Spread<>+32(SB)/2, $8
DATA fp8Spread<>+34(SB)/2, $8
DATA fp8Spread<>+36(SB)/2, $9
DATA fp8Spread<>+38(SB)/2, $9
DATA fp8Spread<>+40(SB)/2, $10
DATA fp8Spread<>+42(SB)/2, $10
DATA fp8Spread<>+44(SB)/2, $11
DATA fp8Spread<>+46(SB)/2, $11
DATA fp8Spread<>+48(SB)/2, $12
DATA fp8Spread<>+50(SB)/2, $12
DATA fp8Spread<>+52(SB)/2, $13
DATA fp8Spread<>+54(SB)/2, $13
DATA fp8Spread<>+56(SB)/2, $14
DATA fp8Spread<>+58(SB)/2, $14
DATA fp8Spread<>+60(SB)/2, $15
DATA fp8Spread<>+62(SB)/2, $15
DATA fp8Spread<>+64(SB)/2, $16
DATA fp8Spread<>+66(SB)/2, $16
DATA fp8Spread<>+68(SB)/2, $17
DATA fp8Spread<>+70(SB)/2, $17
DATA fp8Spread<>+72(SB)/2, $18
DATA fp8Spread<>+74(SB)/2, $18
DATA fp8Spread<>+76(SB)/2, $19
DATA fp8Spread<>+78(SB)/2, $19
DATA fp8Spread<>+80(SB)/2, $20
DATA fp8Spread<>+82(SB)/2, $20
DATA fp8Spread<>+84(SB)/2, $21
DATA fp8Spread<>+86(SB)/2, $21
DATA fp8Spread<>+88(SB)/2, $22
DATA fp8Spread<>+90(SB)/2, $22
DATA fp8Spread<>+92(SB)/2, $23
DATA fp8Spread<>+94(SB)/2, $23
DATA fp8Spread<>+96(SB)/2, $24
DATA fp8Spread<>+98(SB)/2, $24
DATA fp8Spread<>+100(SB)/2, $25
DATA fp8Spread<>+102(SB)/2, $25
DATA fp8Spread<>+104(SB)/2, $26
DATA fp8Spread<>+106(SB)/2, $26
DATA fp8Spread<>+108(SB)/2, $27
DATA fp8Spread<>+110(SB)/2, $27
DATA fp8Spread<>+112(SB)/2, $28
DATA fp8Spread<>+114(SB)/2, $28
DATA fp8Spread<>+116(SB)/2, $29
DATA fp8Spread<>+118(SB)/2, $29
DATA fp8Spread<>+120(SB)/2, $30
DATA fp8Spread<>+122(SB)/2, $30
DATA fp8Spread<>+124(SB)/2, $31
DATA fp8Spread<>+126(SB)/2, $31
GLOBL fp8Spread<>(SB), RODATA|NOPTR, $128

// fp8Order undoes the lane interleaving of VPACKUSDW + VPACKUSWB.
DATA fp8Order<>+0(SB)/4, $0
DATA fp8Order<>+4(SB)/4, $4
DATA fp8Order<>+8(SB)/4, $8
DATA fp8Order<>+12(SB)/4, $12
DATA fp8Order<>+16(SB)/4, $1
DATA fp8Order<>+20(SB)/4, $5
DATA fp8Order<>+24(SB)/4, $9
DATA fp8Order<>+28(SB)/4, $13
DATA fp8Order<>+32(SB)/4, $2
DATA fp8Order<>+36(SB)/4, $6
DATA fp8Order<>+40(SB)/4, $10
DATA fp8Order<>+44(SB)/4, $14
DATA fp8Order<>+48(SB)/4, $3
DATA fp8Order<>+52(SB)/4, $7
DATA fp8Order<>+56(SB)/4, $11
DATA fp8Order<>+60(SB)/4, $15
GLOBL fp8Order<>(SB), RODATA|NOPTR, $64

// The widening kernels keep Z18 0x78 (exponent field), Z19 120<<23, Z20
// 0x7f, Z21 the sign bit, Z22 the scale and Z23 fp8Special.

// WIDEN turns the zero-extended e4m3 codes in b into float32 values times
// the scale in r; t is a temporary; K1 and K2 are clobbered.
#define WIDEN(b, r, t) \
	VPANDD     Z20, b, t; \
	VPSLLD     $20, t, r; \
	VPADDD     Z19, r, r; \
	VPTESTNMD  Z18, b, K1; \
	VPCMPEQD   Z20, t, K2; \
	KORW       K1, K2, K1; \
	VPERMD     Z23, t, K1, r; \
	VPSLLD     $24, b, t; \
	VPTERNLOGD $0xF8, Z21, t, r; \
	VMULPS     Z22, r, r

// Encoding constants: Z24 2^9, Z25 0x7e, Z26 0x7f800000, Z27 0xc407ffff
// (rebias and the rounding half), Z28 0x80, Z29 0x3c7fffff (below 2^-6),
// Z30 1, Z31 the magnitude mask, Z23 0x7f, Z22 the scale or its
// reciprocal, Z21 fp8Order.
#define ENCODE_CONSTS \
	MOVL $0x44000000, AX; VPBROADCASTD AX, Z24; \
	MOVL $0x7e, AX; VPBROADCASTD AX, Z25; \
	MOVL $0x7f800000, AX; VPBROADCASTD AX, Z26; \
	MOVL $0xc407ffff, AX; VPBROADCASTD AX, Z27; \
	MOVL $0x80, AX; VPBROADCASTD AX, Z28; \
	MOVL $0x3c7fffff, AX; VPBROADCASTD AX, Z29; \
	MOVL $1, AX; VPBROADCASTD AX, Z30; \
	MOVL $0x7fffffff, AX; VPBROADCASTD AX, Z31; \
	MOVL $0x7f, AX; VPBROADCASTD AX, Z23; \
	VMOVDQU32 fp8Order<>(SB), Z21

// ENCODE rounds the float32 values in x to e4m3 codes (one per dword) in
// r; t1-t3 are temporaries; K1 and K3 are clobbered.
#define ENCODE(x, r, t1, t2, t3) \
	VPANDD     Z31, x, t1; \
	VPSRLD     $24, x, t2; \
	VPSRLD     $20, t1, t3; \
	VPANDD     Z30, t3, t3; \
	VPADDD     Z27, t1, r; \
	VPADDD     t3, r, r; \
	VPSRLD     $20, r, r; \
	VPMINUD    Z25, r, r; \
	VPCMPUD    $2, Z29, t1, K1; \
	VMULPS     Z24, t1, t3; \
	VCVTPS2DQ  t3, K1, r; \
	VPCMPUD    $6, Z26, t1, K3; \
	VMOVDQA32  Z23, K3, r; \
	VPTERNLOGD $0xF8, Z28, t2, r

// SCALE4 applies op (VMULPS or VDIVPS) by the scale in Z22 to a-d.
#define SCALE4(op, a, b, c, d) \
	op Z22, a, a; \
	op Z22, b, b; \
	op Z22, c, c; \
	op Z22, d, d

// BF16FIX rewrites the lanes of the bf16 pair a (low 16) and b (high 16)
// in out whose float32 source is subnormal (ka for a, kb for b), with
// integer round-to-nearest-even; Z14 is 1, Z15 0x7fff; Z0-Z3 and K7 are
// clobbered.
#define BF16FIX(a, b, out, ka, kb) \
	VPSRLD       $16, a, Z0; \
	VPANDD       Z14, Z0, Z0; \
	VPADDD       Z15, a, Z1; \
	VPADDD       Z0, Z1, Z1; \
	VPSRLD       $16, Z1, Z1; \
	VPMOVDW      Z1, Y2; \
	VPSRLD       $16, b, Z0; \
	VPANDD       Z14, Z0, Z0; \
	VPADDD       Z15, b, Z1; \
	VPADDD       Z0, Z1, Z1; \
	VPSRLD       $16, Z1, Z1; \
	VPMOVDW      Z1, Y3; \
	VINSERTI64X4 $1, Y3, Z2, Z2; \
	KUNPCKWD     ka, kb, K7; \
	VMOVDQU16    Z2, K7, out

// The word-domain widening keeps Z28 0x7f, Z29 120<<7, Z30 0x78 and Z31
// the sign bit in every word, Z24 fp8SpecialBF16, Z25 and Z26 the
// fp8Spread indices and K6 the odd words.
#define WIDENW_CONSTS \
	MOVL $0x007f007f, AX; VPBROADCASTD AX, Z28; \
	MOVL $0x3c003c00, AX; VPBROADCASTD AX, Z29; \
	MOVL $0x00780078, AX; VPBROADCASTD AX, Z30; \
	MOVL $0x80008000, AX; VPBROADCASTD AX, Z31; \
	VMOVDQU16 fp8SpecialBF16<>(SB), Z24; \
	VMOVDQU16 fp8Spread<>(SB), Z25; \
	VMOVDQU16 fp8Spread<>+64(SB), Z26; \
	MOVL $0xaaaaaaaa, AX; KMOVD AX, K6

// WIDENW turns the e4m3 codes zero-extended to words in w into the bf16
// bits of their values in r (exact: every e4m3 value is a bf16 value); t
// is a temporary; K1 and K2 are clobbered. Normal codes are a shift and a
// rebias; zero, subnormal and NaN codes come from fp8SpecialBF16.
#define WIDENW(w, r, t) \
	VPANDD     Z28, w, t; \
	VPSLLW     $4, t, r; \
	VPADDW     Z29, r, r; \
	VPTESTNMW  Z30, w, K1; \
	VPCMPEQW   Z28, t, K2; \
	KORD       K1, K2, K1; \
	VPERMW     Z24, t, K1, r; \
	VPSLLW     $8, w, t; \
	VPTERNLOGD $0xF8, Z31, t, r

// func fp8ToBF16AVX512(dst, src *byte, n int, scale float32, nt int)
// dst[i] = bf16(fp8(src[i]) * scale) for i < n, a positive multiple of 32.
TEXT ·fp8ToBF16AVX512(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVQ nt+32(FP), R14
	MOVL $0x78, AX; VPBROADCASTD AX, Z18
	MOVL $0x3c000000, AX; VPBROADCASTD AX, Z19
	MOVL $0x7f, AX; VPBROADCASTD AX, Z20
	MOVL $0x80000000, AX; VPBROADCASTD AX, Z21
	VBROADCASTSS scale+24(FP), Z22
	VMOVDQU32 fp8Special<>(SB), Z23
	MOVL $0x7fff, AX; VPBROADCASTD AX, Z15
	MOVL $1, AX; VPBROADCASTD AX, Z14

fp8ToBF16loop:
	VPMOVZXBD (SI), Z0
	VPMOVZXBD 16(SI), Z1
	WIDEN(Z0, Z8, Z2)
	WIDEN(Z1, Z9, Z3)
	// VCVTNE2PS2BF16 Z8, Z9, Z16 (low half from Z8)
	BYTE $0x62; BYTE $0xc2; BYTE $0x37; BYTE $0x48; BYTE $0x72; BYTE $0xc0
	VFPCLASSPSZ $0x20, Z8, K1
	VFPCLASSPSZ $0x20, Z9, K2
	KORTESTW  K1, K2
	JNZ       fp8ToBF16fix

fp8ToBF16store:
	TESTQ     R14, R14
	JNZ       fp8ToBF16nt
	VMOVDQU32 Z16, (DI)
	JMP       fp8ToBF16next

fp8ToBF16nt:
	VMOVNTDQ  Z16, (DI)

fp8ToBF16next:
	ADDQ      $32, SI
	ADDQ      $64, DI
	SUBQ      $32, CX
	JNZ       fp8ToBF16loop
	VZEROUPPER
	RET

fp8ToBF16fix:
	BF16FIX(Z8, Z9, Z16, K1, K2)
	JMP       fp8ToBF16store

// func fp8ToBF16WAVX512(dst, src *byte, n int, nt int)
// fp8ToBF16AVX512 with scale 1, in the word domain (no float arithmetic);
// n is a positive multiple of 32.
TEXT ·fp8ToBF16WAVX512(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVQ nt+24(FP), R14
	WIDENW_CONSTS

fp8ToBF16Wloop64:
	CMPQ      CX, $64
	JLT       fp8ToBF16Wtail
	VPMOVZXBW (SI), Z0
	VPMOVZXBW 32(SI), Z1
	WIDENW(Z0, Z2, Z4)
	WIDENW(Z1, Z3, Z5)
	TESTQ     R14, R14
	JNZ       fp8ToBF16Wnt64
	VMOVDQU16 Z2, (DI)
	VMOVDQU16 Z3, 64(DI)
	JMP       fp8ToBF16Wnext64

fp8ToBF16Wnt64:
	VMOVNTDQ  Z2, (DI)
	VMOVNTDQ  Z3, 64(DI)

fp8ToBF16Wnext64:
	ADDQ      $64, SI
	ADDQ      $128, DI
	SUBQ      $64, CX
	JMP       fp8ToBF16Wloop64

fp8ToBF16Wtail:
	TESTQ     CX, CX
	JZ        fp8ToBF16Wdone
	VPMOVZXBW (SI), Z0
	WIDENW(Z0, Z2, Z4)
	TESTQ     R14, R14
	JNZ       fp8ToBF16Wnt32
	VMOVDQU16 Z2, (DI)
	JMP       fp8ToBF16Wdone

fp8ToBF16Wnt32:
	VMOVNTDQ  Z2, (DI)

fp8ToBF16Wdone:
	VZEROUPPER
	RET

// func rotNeoXFP8BF16AVX512(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int, scale float32, nt int)
// Rotates NeoX pairs i < n (a positive multiple of 16) of count fp8 head
// vectors (dequantized with scale) into bf16 head vectors.
TEXT ·rotNeoXFP8BF16AVX512(SB), NOSPLIT, $0-88
	MOVQ dst+0(FP), R12
	MOVQ src+8(FP), R13
	MOVQ half+40(FP), DX
	MOVQ count+48(FP), BX
	MOVQ nt+80(FP), R14
	MOVL $0x78, AX; VPBROADCASTD AX, Z18
	MOVL $0x3c000000, AX; VPBROADCASTD AX, Z19
	MOVL $0x7f, AX; VPBROADCASTD AX, Z20
	MOVL $0x80000000, AX; VPBROADCASTD AX, Z21
	VBROADCASTSS scale+72(FP), Z22
	VMOVDQU32 fp8Special<>(SB), Z23
	MOVL $0x7fff, AX; VPBROADCASTD AX, Z15
	MOVL $1, AX; VPBROADCASTD AX, Z14
	WIDENW_CONSTS

rotFP8BF16head:
	MOVQ R12, DI
	MOVQ R13, SI
	MOVQ cos+16(FP), R8
	MOVQ sin+24(FP), R9
	MOVQ n+32(FP), CX
	LEAQ (SI)(DX*1), R10
	LEAQ (DI)(DX*2), R11

rotFP8BF16loop32:
	CMPQ      CX, $32
	JLT       rotFP8BF16loop
	VPMOVZXBW (SI), Z0
	VPMOVZXBW (R10), Z1
	WIDENW(Z0, Z2, Z4)
	WIDENW(Z1, Z3, Z5)
	// bf16 bits to float32: each word into the high half of a dword.
	VPERMW.Z  Z2, Z25, K6, Z4
	VPERMW.Z  Z2, Z26, K6, Z5
	VPERMW.Z  Z3, Z25, K6, Z6
	VPERMW.Z  Z3, Z26, K6, Z7
	SCALE4(VMULPS, Z4, Z5, Z6, Z7)
	VMOVUPS   (R8), Z0
	VMOVUPS   64(R8), Z1
	VMOVUPS   (R9), Z2
	VMOVUPS   64(R9), Z3
	VMULPS    Z0, Z4, Z8
	VMULPS    Z2, Z6, Z12
	VSUBPS    Z12, Z8, Z8
	VMULPS    Z1, Z5, Z9
	VMULPS    Z3, Z7, Z12
	VSUBPS    Z12, Z9, Z9
	VMULPS    Z0, Z6, Z10
	VMULPS    Z2, Z4, Z12
	VADDPS    Z12, Z10, Z10
	VMULPS    Z1, Z7, Z11
	VMULPS    Z3, Z5, Z12
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
	KORW      K3, K4, K7
	KORTESTW  K5, K7
	JNZ       rotFP8BF16fix32

rotFP8BF16store32:
	TESTQ     R14, R14
	JNZ       rotFP8BF16nt32
	VMOVDQU16 Z16, (DI)
	VMOVDQU16 Z17, (R11)
	JMP       rotFP8BF16next32

rotFP8BF16nt32:
	VMOVNTDQ  Z16, (DI)
	VMOVNTDQ  Z17, (R11)

rotFP8BF16next32:
	ADDQ      $32, SI
	ADDQ      $32, R10
	ADDQ      $64, DI
	ADDQ      $64, R11
	ADDQ      $128, R8
	ADDQ      $128, R9
	SUBQ      $32, CX
	JNZ       rotFP8BF16loop32
	JMP       rotFP8BF16headnext

rotFP8BF16fix32:
	BF16FIX(Z8, Z9, Z16, K1, K2)
	BF16FIX(Z10, Z11, Z17, K3, K4)
	JMP       rotFP8BF16store32

rotFP8BF16loop:
	VPMOVZXBD (SI), Z0
	VPMOVZXBD (R10), Z1
	WIDEN(Z0, Z2, Z3)
	WIDEN(Z1, Z4, Z5)
	VMOVUPS   (R8), Z6
	VMOVUPS   (R9), Z7
	VMULPS    Z6, Z2, Z8
	VMULPS    Z7, Z4, Z9
	VSUBPS    Z9, Z8, Z8
	VMULPS    Z6, Z4, Z10
	VMULPS    Z7, Z2, Z11
	VADDPS    Z11, Z10, Z10
	// VCVTNE2PS2BF16 Z8, Z10, Z16 (low half from Z8)
	BYTE $0x62; BYTE $0xc2; BYTE $0x2f; BYTE $0x48; BYTE $0x72; BYTE $0xc0
	VFPCLASSPSZ $0x20, Z8, K1
	VFPCLASSPSZ $0x20, Z10, K2
	KORTESTW  K1, K2
	JNZ       rotFP8BF16fix

rotFP8BF16store:
	VEXTRACTI64X4 $1, Z16, Y17
	TESTQ     R14, R14
	JNZ       rotFP8BF16nt
	VMOVDQU32 Y16, (DI)
	VMOVDQU32 Y17, (R11)
	JMP       rotFP8BF16next

rotFP8BF16nt:
	VMOVNTDQ  Y16, (DI)
	VMOVNTDQ  Y17, (R11)

rotFP8BF16next:
	ADDQ      $16, SI
	ADDQ      $16, R10
	ADDQ      $32, DI
	ADDQ      $32, R11
	ADDQ      $64, R8
	ADDQ      $64, R9
	SUBQ      $16, CX
	JNZ       rotFP8BF16loop

rotFP8BF16headnext:
	ADDQ      dstStride+56(FP), R12
	ADDQ      srcStride+64(FP), R13
	DECQ      BX
	JNZ       rotFP8BF16head
	VZEROUPPER
	RET

rotFP8BF16fix:
	BF16FIX(Z8, Z10, Z16, K1, K2)
	JMP       rotFP8BF16store

// func bf16ToFP8AVX512(dst, src *byte, n int, scale float32, div, nt int)
// dst[i] = fp8(bf16(src[i]) / scale) for i < n, a positive multiple of 16:
// a division where div is nonzero, else a multiplication by scale (the
// caller passes an exact reciprocal).
TEXT ·bf16ToFP8AVX512(SB), NOSPLIT, $0-48
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVQ nt+40(FP), R14
	VBROADCASTSS scale+24(FP), Z22
	ENCODE_CONSTS
	MOVQ div+32(FP), R8

bf16ToFP8loop64:
	CMPQ      CX, $64
	JLT       bf16ToFP8tail
	BF16LOAD((SI), Z0)
	BF16LOAD(32(SI), Z1)
	BF16LOAD(64(SI), Z2)
	BF16LOAD(96(SI), Z3)
	TESTQ     R8, R8
	JNZ       bf16ToFP8div64
	SCALE4(VMULPS, Z0, Z1, Z2, Z3)
	JMP       bf16ToFP8enc64

bf16ToFP8div64:
	SCALE4(VDIVPS, Z0, Z1, Z2, Z3)

bf16ToFP8enc64:
	ENCODE(Z0, Z8, Z4, Z5, Z6)
	ENCODE(Z1, Z9, Z4, Z5, Z6)
	ENCODE(Z2, Z10, Z4, Z5, Z6)
	ENCODE(Z3, Z11, Z4, Z5, Z6)
	VPACKUSDW Z9, Z8, Z8
	VPACKUSDW Z11, Z10, Z10
	VPACKUSWB Z10, Z8, Z8
	VPERMD    Z8, Z21, Z8
	TESTQ     R14, R14
	JNZ       bf16ToFP8nt64
	VMOVDQU32 Z8, (DI)
	JMP       bf16ToFP8next64

bf16ToFP8nt64:
	VMOVNTDQ  Z8, (DI)

bf16ToFP8next64:
	ADDQ      $128, SI
	ADDQ      $64, DI
	SUBQ      $64, CX
	JMP       bf16ToFP8loop64

bf16ToFP8tail:
	TESTQ     CX, CX
	JZ        bf16ToFP8done
	BF16LOAD((SI), Z0)
	TESTQ     R8, R8
	JNZ       bf16ToFP8div16
	VMULPS    Z22, Z0, Z0
	JMP       bf16ToFP8enc16

bf16ToFP8div16:
	VDIVPS    Z22, Z0, Z0

bf16ToFP8enc16:
	ENCODE(Z0, Z8, Z4, Z5, Z6)
	VPMOVDB   Z8, X8
	TESTQ     R14, R14
	JNZ       bf16ToFP8nt16
	VMOVDQU   X8, (DI)
	JMP       bf16ToFP8next16

bf16ToFP8nt16:
	VMOVNTDQ  X8, (DI)

bf16ToFP8next16:
	ADDQ      $32, SI
	ADDQ      $16, DI
	SUBQ      $16, CX
	JMP       bf16ToFP8tail

bf16ToFP8done:
	VZEROUPPER
	RET

// func rotNeoXBF16FP8AVX512(dst, src *byte, cos, sin *float32, n, half, count, dstStride, srcStride int, scale float32, div, nt int)
// Rotates NeoX pairs i < n (a positive multiple of 16) of count bf16 head
// vectors into fp8 head vectors, storing fp8(x / scale) (a multiplication
// by scale where div is zero, as in bf16ToFP8AVX512).
TEXT ·rotNeoXBF16FP8AVX512(SB), NOSPLIT, $0-96
	MOVQ dst+0(FP), R12
	MOVQ src+8(FP), R13
	MOVQ half+40(FP), DX
	MOVQ count+48(FP), BX
	MOVQ nt+88(FP), R14
	VBROADCASTSS scale+72(FP), Z22
	ENCODE_CONSTS
	MOVQ div+80(FP), AX

rotBF16FP8head:
	MOVQ R12, DI
	MOVQ R13, SI
	MOVQ cos+16(FP), R8
	MOVQ sin+24(FP), R9
	MOVQ n+32(FP), CX
	LEAQ (SI)(DX*2), R10
	LEAQ (DI)(DX*1), R11

rotBF16FP8loop32:
	CMPQ      CX, $32
	JLT       rotBF16FP8tail
	BF16LOAD((SI), Z0)
	BF16LOAD(32(SI), Z1)
	BF16LOAD((R10), Z2)
	BF16LOAD(32(R10), Z3)
	VMOVUPS   (R8), Z4
	VMOVUPS   64(R8), Z5
	VMOVUPS   (R9), Z6
	VMOVUPS   64(R9), Z7
	VMULPS    Z4, Z0, Z8
	VMULPS    Z6, Z2, Z12
	VSUBPS    Z12, Z8, Z8
	VMULPS    Z5, Z1, Z9
	VMULPS    Z7, Z3, Z12
	VSUBPS    Z12, Z9, Z9
	VMULPS    Z4, Z2, Z10
	VMULPS    Z6, Z0, Z12
	VADDPS    Z12, Z10, Z10
	VMULPS    Z5, Z3, Z11
	VMULPS    Z7, Z1, Z12
	VADDPS    Z12, Z11, Z11
	TESTQ     AX, AX
	JNZ       rotBF16FP8div32
	SCALE4(VMULPS, Z8, Z9, Z10, Z11)
	JMP       rotBF16FP8enc32

rotBF16FP8div32:
	SCALE4(VDIVPS, Z8, Z9, Z10, Z11)

rotBF16FP8enc32:
	ENCODE(Z8, Z12, Z0, Z1, Z2)
	ENCODE(Z9, Z13, Z0, Z1, Z2)
	ENCODE(Z10, Z4, Z0, Z1, Z2)
	ENCODE(Z11, Z5, Z0, Z1, Z2)
	VPACKUSDW Z13, Z12, Z12
	VPACKUSDW Z5, Z4, Z4
	VPACKUSWB Z4, Z12, Z12
	VPERMD    Z12, Z21, Z12
	VEXTRACTI64X4 $1, Z12, Y13
	TESTQ     R14, R14
	JNZ       rotBF16FP8nt32
	VMOVDQU   Y12, (DI)
	VMOVDQU   Y13, (R11)
	JMP       rotBF16FP8next32

rotBF16FP8nt32:
	VMOVNTDQ  Y12, (DI)
	VMOVNTDQ  Y13, (R11)

rotBF16FP8next32:
	ADDQ      $64, SI
	ADDQ      $64, R10
	ADDQ      $32, DI
	ADDQ      $32, R11
	ADDQ      $128, R8
	ADDQ      $128, R9
	SUBQ      $32, CX
	JMP       rotBF16FP8loop32

rotBF16FP8tail:
	TESTQ     CX, CX
	JZ        rotBF16FP8next
	BF16LOAD((SI), Z0)
	BF16LOAD((R10), Z2)
	VMOVUPS   (R8), Z4
	VMOVUPS   (R9), Z6
	VMULPS    Z4, Z0, Z8
	VMULPS    Z6, Z2, Z12
	VSUBPS    Z12, Z8, Z8
	VMULPS    Z4, Z2, Z10
	VMULPS    Z6, Z0, Z12
	VADDPS    Z12, Z10, Z10
	TESTQ     AX, AX
	JNZ       rotBF16FP8div16
	VMULPS    Z22, Z8, Z8
	VMULPS    Z22, Z10, Z10
	JMP       rotBF16FP8enc16

rotBF16FP8div16:
	VDIVPS    Z22, Z8, Z8
	VDIVPS    Z22, Z10, Z10

rotBF16FP8enc16:
	ENCODE(Z8, Z12, Z0, Z1, Z2)
	ENCODE(Z10, Z4, Z0, Z1, Z2)
	VPMOVDB   Z12, X12
	VPMOVDB   Z4, X4
	TESTQ     R14, R14
	JNZ       rotBF16FP8nt16
	VMOVDQU   X12, (DI)
	VMOVDQU   X4, (R11)
	JMP       rotBF16FP8next

rotBF16FP8nt16:
	VMOVNTDQ  X12, (DI)
	VMOVNTDQ  X4, (R11)

rotBF16FP8next:
	ADDQ      dstStride+56(FP), R12
	ADDQ      srcStride+64(FP), R13
	DECQ      BX
	JNZ       rotBF16FP8head
	VZEROUPPER
	RET
