//go:build !purego

#include "textflag.h"

// AVX2 decoding kernels (simd_amd64.go has their contracts). Each computes
// the float32 value of the Go path with the same operations in the same
// order (a product, then a sum; no fused multiply-add) and narrows it with
// the same rounding: bf16 by integer round-to-nearest-even on the float32
// bits, f16 by VCVTPS2PH with round-to-nearest-even, which is
// F32ToF16 for every finite value.

// fp8Sub is the float32 bits of the e4m3 codes without an implicit one
// (exponent field 0), by their low 3 bits: m * 2^-9. They are looked up
// rather than computed so that no float32 subnormal is ever an operand (a
// subnormal operand costs a microcode assist).
DATA fp8Sub<>+0(SB)/4, $0x00000000
DATA fp8Sub<>+4(SB)/4, $0x3b000000
DATA fp8Sub<>+8(SB)/4, $0x3b800000
DATA fp8Sub<>+12(SB)/4, $0x3bc00000
DATA fp8Sub<>+16(SB)/4, $0x3c000000
DATA fp8Sub<>+20(SB)/4, $0x3c200000
DATA fp8Sub<>+24(SB)/4, $0x3c400000
DATA fp8Sub<>+28(SB)/4, $0x3c600000
GLOBL fp8Sub<>(SB), RODATA|NOPTR, $32

// BCAST fills the dwords of Y register y with the constant c, through AX.
#define BCAST(c, x, y) \
	MOVL         c, AX; \
	MOVQ         AX, x; \
	VPBROADCASTD x, y

// BF16CONSTS loads the constants of BF16ROUND: Y14 = 0x7fff, Y15 = 1.
#define BF16CONSTS \
	BCAST($0x7fff, X14, Y14); \
	BCAST($1, X15, Y15)

// BF16STORE rounds the 8 float32 values in Y0 to bf16 (u += 0x7fff +
// (u>>16)&1, keep the high half) and stores them at m. Uses Y1.
#define BF16STORE(m) \
	VPSRLD       $16, Y0, Y1; \
	VPAND        Y15, Y1, Y1; \
	VPADDD       Y14, Y0, Y0; \
	VPADDD       Y1, Y0, Y0; \
	VPSRLD       $16, Y0, Y0; \
	VEXTRACTI128 $1, Y0, X1; \
	VPACKUSDW    X1, X0, X0; \
	VMOVDQU      X0, m

// F16STORE rounds the 8 float32 values in Y0 to f16 and stores them at m.
#define F16STORE(m) \
	VCVTPS2PH $0, Y0, X0; \
	VMOVDQU   X0, m

// FP8CONSTS loads the constants of FP8LOAD: Y8 = 0x7f, Y9 = 120<<23,
// Y10 = fp8Sub, Y11 = 8, Y12 = 0x80; Y13 accumulates NaN lanes.
#define FP8CONSTS \
	BCAST($0x7f, X8, Y8); \
	BCAST($0x3c000000, X9, Y9); \
	VMOVDQU fp8Sub<>(SB), Y10; \
	BCAST($8, X11, Y11); \
	BCAST($0x80, X12, Y12); \
	VPXOR   Y13, Y13, Y13

// FP8LOAD widens the 8 e4m3 codes at m to their float32 values in Y0
// (FP8E4M3ToF32) and sets the lanes of Y13 whose code is NaN. A code with
// a nonzero exponent field is (b&0x7f)<<20 + 120<<23; one without is
// looked up in fp8Sub. Uses Y1-Y4.
#define FP8LOAD(m) \
	VPMOVZXBD m, Y0; \
	VPAND     Y8, Y0, Y1; \
	VPCMPEQD  Y8, Y1, Y2; \
	VPOR      Y2, Y13, Y13; \
	VPSLLD    $20, Y1, Y2; \
	VPADDD    Y9, Y2, Y2; \
	VPERMD    Y10, Y1, Y3; \
	VPCMPGTD  Y1, Y11, Y4; \
	VPBLENDVB Y4, Y3, Y2, Y2; \
	VPAND     Y12, Y0, Y0; \
	VPSLLD    $24, Y0, Y0; \
	VPOR      Y2, Y0, Y0

// NANRET stores whether any lane of Y13 is set at m.
#define NANRET(m) \
	VPTEST Y13, Y13; \
	SETNE  m

// func int8RowBF16AVX2(out, q *byte, zero, scale *float32, n int)
TEXT ·int8RowBF16AVX2(SB), NOSPLIT, $0-40
	MOVQ out+0(FP), DI
	MOVQ q+8(FP), SI
	MOVQ zero+16(FP), R8
	MOVQ scale+24(FP), R9
	MOVQ n+32(FP), CX
	BF16CONSTS
	SHRQ $3, CX
	JZ   i8rb_done

i8rb_loop:
	VPMOVZXBD (SI), Y0
	VCVTDQ2PS Y0, Y0
	VMULPS    (R9), Y0, Y0
	VADDPS    (R8), Y0, Y0
	BF16STORE((DI))
	ADDQ      $8, SI
	ADDQ      $32, R8
	ADDQ      $32, R9
	ADDQ      $16, DI
	DECQ      CX
	JNZ       i8rb_loop

i8rb_done:
	VZEROUPPER
	RET

// func int8RowF16AVX2(out, q *byte, zero, scale *float32, n int)
TEXT ·int8RowF16AVX2(SB), NOSPLIT, $0-40
	MOVQ out+0(FP), DI
	MOVQ q+8(FP), SI
	MOVQ zero+16(FP), R8
	MOVQ scale+24(FP), R9
	MOVQ n+32(FP), CX
	SHRQ $3, CX
	JZ   i8rh_done

i8rh_loop:
	VPMOVZXBD (SI), Y0
	VCVTDQ2PS Y0, Y0
	VMULPS    (R9), Y0, Y0
	VADDPS    (R8), Y0, Y0
	F16STORE((DI))
	ADDQ      $8, SI
	ADDQ      $32, R8
	ADDQ      $32, R9
	ADDQ      $16, DI
	DECQ      CX
	JNZ       i8rh_loop

i8rh_done:
	VZEROUPPER
	RET

// func int8GroupBF16AVX2(out, q *byte, zero, scale float32, n int)
TEXT ·int8GroupBF16AVX2(SB), NOSPLIT, $0-32
	MOVQ         out+0(FP), DI
	MOVQ         q+8(FP), SI
	VBROADCASTSS zero+16(FP), Y6
	VBROADCASTSS scale+20(FP), Y7
	MOVQ         n+24(FP), CX
	BF16CONSTS
	SHRQ         $3, CX
	JZ           i8gb_done

i8gb_loop:
	VPMOVZXBD (SI), Y0
	VCVTDQ2PS Y0, Y0
	VMULPS    Y7, Y0, Y0
	VADDPS    Y6, Y0, Y0
	BF16STORE((DI))
	ADDQ      $8, SI
	ADDQ      $16, DI
	DECQ      CX
	JNZ       i8gb_loop

i8gb_done:
	VZEROUPPER
	RET

// func int8GroupF16AVX2(out, q *byte, zero, scale float32, n int)
TEXT ·int8GroupF16AVX2(SB), NOSPLIT, $0-32
	MOVQ         out+0(FP), DI
	MOVQ         q+8(FP), SI
	VBROADCASTSS zero+16(FP), Y6
	VBROADCASTSS scale+20(FP), Y7
	MOVQ         n+24(FP), CX
	SHRQ         $3, CX
	JZ           i8gh_done

i8gh_loop:
	VPMOVZXBD (SI), Y0
	VCVTDQ2PS Y0, Y0
	VMULPS    Y7, Y0, Y0
	VADDPS    Y6, Y0, Y0
	F16STORE((DI))
	ADDQ      $8, SI
	ADDQ      $16, DI
	DECQ      CX
	JNZ       i8gh_loop

i8gh_done:
	VZEROUPPER
	RET

// func fp8RowBF16AVX2(out, q *byte, scale *float32, n int) (nan bool)
TEXT ·fp8RowBF16AVX2(SB), NOSPLIT, $0-33
	MOVQ out+0(FP), DI
	MOVQ q+8(FP), SI
	MOVQ scale+16(FP), R9
	MOVQ n+24(FP), CX
	BF16CONSTS
	FP8CONSTS
	SHRQ $3, CX
	JZ   f8rb_done

f8rb_loop:
	FP8LOAD((SI))
	VMULPS (R9), Y0, Y0
	BF16STORE((DI))
	ADDQ   $8, SI
	ADDQ   $32, R9
	ADDQ   $16, DI
	DECQ   CX
	JNZ    f8rb_loop

f8rb_done:
	NANRET(nan+32(FP))
	VZEROUPPER
	RET

// func fp8RowF16AVX2(out, q *byte, scale *float32, n int) (nan bool)
TEXT ·fp8RowF16AVX2(SB), NOSPLIT, $0-33
	MOVQ out+0(FP), DI
	MOVQ q+8(FP), SI
	MOVQ scale+16(FP), R9
	MOVQ n+24(FP), CX
	FP8CONSTS
	SHRQ $3, CX
	JZ   f8rh_done

f8rh_loop:
	FP8LOAD((SI))
	VMULPS (R9), Y0, Y0
	F16STORE((DI))
	ADDQ   $8, SI
	ADDQ   $32, R9
	ADDQ   $16, DI
	DECQ   CX
	JNZ    f8rh_loop

f8rh_done:
	NANRET(nan+32(FP))
	VZEROUPPER
	RET

// func fp8GroupBF16AVX2(out, q *byte, scale float32, n int) (nan bool)
TEXT ·fp8GroupBF16AVX2(SB), NOSPLIT, $0-33
	MOVQ         out+0(FP), DI
	MOVQ         q+8(FP), SI
	VBROADCASTSS scale+16(FP), Y7
	MOVQ         n+24(FP), CX
	BF16CONSTS
	FP8CONSTS
	SHRQ         $3, CX
	JZ           f8gb_done

f8gb_loop:
	FP8LOAD((SI))
	VMULPS Y7, Y0, Y0
	BF16STORE((DI))
	ADDQ   $8, SI
	ADDQ   $16, DI
	DECQ   CX
	JNZ    f8gb_loop

f8gb_done:
	NANRET(nan+32(FP))
	VZEROUPPER
	RET

// func fp8GroupF16AVX2(out, q *byte, scale float32, n int) (nan bool)
TEXT ·fp8GroupF16AVX2(SB), NOSPLIT, $0-33
	MOVQ         out+0(FP), DI
	MOVQ         q+8(FP), SI
	VBROADCASTSS scale+16(FP), Y7
	MOVQ         n+24(FP), CX
	FP8CONSTS
	SHRQ         $3, CX
	JZ           f8gh_done

f8gh_loop:
	FP8LOAD((SI))
	VMULPS Y7, Y0, Y0
	F16STORE((DI))
	ADDQ   $8, SI
	ADDQ   $16, DI
	DECQ   CX
	JNZ    f8gh_loop

f8gh_done:
	NANRET(nan+32(FP))
	VZEROUPPER
	RET

// func mergeBF16AVX2(out, p0, p1 *byte, n int)
TEXT ·mergeBF16AVX2(SB), NOSPLIT, $0-32
	MOVQ out+0(FP), DI
	MOVQ p0+8(FP), SI
	MOVQ p1+16(FP), DX
	MOVQ n+24(FP), CX
	BCAST($0x80008000, X14, Y14)
	BCAST($0x007f007f, X15, Y15)
	SHRQ $4, CX
	JZ   mb_done

mb_loop:
	VPMOVZXBW (SI), Y0
	VPMOVZXBW (DX), Y1
	VPSLLW    $7, Y0, Y0
	VPSLLW    $8, Y1, Y2
	VPAND     Y14, Y2, Y2
	VPAND     Y15, Y1, Y1
	VPOR      Y0, Y1, Y1
	VPOR      Y2, Y1, Y1
	VMOVDQU   Y1, (DI)
	ADDQ      $16, SI
	ADDQ      $16, DX
	ADDQ      $32, DI
	DECQ      CX
	JNZ       mb_loop

mb_done:
	VZEROUPPER
	RET

// func mergeF16AVX2(out, p0, p1 *byte, n int)
TEXT ·mergeF16AVX2(SB), NOSPLIT, $0-32
	MOVQ out+0(FP), DI
	MOVQ p0+8(FP), SI
	MOVQ p1+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $4, CX
	JZ   mh_done

mh_loop:
	VMOVDQU    (SI), X0
	VMOVDQU    (DX), X1
	VPUNPCKLBW X0, X1, X2
	VPUNPCKHBW X0, X1, X3
	VMOVDQU    X2, (DI)
	VMOVDQU    X3, 16(DI)
	ADDQ       $16, SI
	ADDQ       $16, DX
	ADDQ       $32, DI
	DECQ       CX
	JNZ        mh_loop

mh_done:
	VZEROUPPER
	RET

// laneBit is bit i in 16-bit lane i: a lane of a broadcast bits-plane word
// ANDed with it equals it where the lane's element has the bit.
DATA laneBit<>+0(SB)/8, $0x0008000400020001
DATA laneBit<>+8(SB)/8, $0x0080004000200010
DATA laneBit<>+16(SB)/8, $0x0800040002000100
DATA laneBit<>+24(SB)/8, $0x8000400020001000
GLOBL laneBit<>(SB), RODATA|NOPTR, $32

// SPREADBIT sets bit b (the mask in Y register bit) of the 16 lanes of
// Y0 whose bit is set in the 16-bit word at m. Uses Y1.
#define SPREADBIT(m, bit) \
	VPBROADCASTW m, Y1; \
	VPAND        Y12, Y1, Y1; \
	VPCMPEQW     Y12, Y1, Y1; \
	VPAND        bit, Y1, Y1; \
	VPOR         Y1, Y0, Y0

// func mergeF16ExpAVX2(out, exp, lo, bits *byte, n int) (bad bool)
TEXT ·mergeF16ExpAVX2(SB), NOSPLIT, $0-41
	MOVQ    out+0(FP), DI
	MOVQ    exp+8(FP), SI
	MOVQ    lo+16(FP), DX
	MOVQ    bits+24(FP), R8
	MOVQ    n+32(FP), CX
	VMOVDQU laneBit<>(SB), Y12
	BCAST($0x80008000, X11, Y11)
	BCAST($0x02000200, X10, Y10)
	BCAST($0x01000100, X9, Y9)
	VPXOR   Y13, Y13, Y13
	SHRQ    $4, CX
	JZ      me_done

me_loop:
	VPMOVZXBW (SI), Y0
	VPOR      Y0, Y13, Y13
	VPSLLW    $10, Y0, Y0
	VPMOVZXBW (DX), Y2
	VPOR      Y2, Y0, Y0
	SPREADBIT((R8), Y11)
	SPREADBIT(2(R8), Y10)
	SPREADBIT(4(R8), Y9)
	VMOVDQU   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $16, DX
	ADDQ      $6, R8
	ADDQ      $32, DI
	DECQ      CX
	JNZ       me_loop

me_done:
	// An exponent over 31 has a bit in 0xe0 of its (zero-extended) lane.
	BCAST($0x00e000e0, X8, Y8)
	VPTEST Y8, Y13
	SETNE  bad+40(FP)
	VZEROUPPER
	RET

// Multi-symbol Huffman decoding (huff.go): four streams, each round a
// refill and huffRound lookups per stream. State layout (huffFastState):
// value [4]uint64 at 0, bitsRead at 32, off at 64, in at 96, pos at 128,
// end at 160. Registers: R8-R11 the values, SI DI R12 R13 the output
// pointers, DX the table, R15 the state.

// HLOOK is one lookup of stream k: the entry of the top 11 bits of v; its
// four symbol bytes are stored at p, which advances by the entry's count;
// v shifts by its length, which bitsRead (at r) adds.
#define HLOOK(v, p, r) \
	MOVQ v, AX; \
	SHRQ $53, AX; \
	MOVQ (DX)(AX*8), AX; \
	MOVL AX, (p); \
	MOVQ AX, BX; \
	SHRQ $32, BX; \
	ANDL $7, BX; \
	ADDQ BX, p; \
	SHRQ $40, AX; \
	MOVQ AX, CX; \
	SHLQ CX, v; \
	ADDQ AX, r(R15)

// HREFILL reloads stream k's container: off -= bitsRead/8, bitsRead &= 7,
// v = load64(in+off) << bitsRead.
#define HREFILL(v, r, o, in) \
	MOVQ r(R15), CX; \
	MOVQ CX, AX; \
	SHRQ $3, AX; \
	MOVQ o(R15), BX; \
	SUBQ AX, BX; \
	MOVQ BX, o(R15); \
	ANDQ $7, CX; \
	MOVQ CX, r(R15); \
	MOVQ in(R15), AX; \
	MOVQ (AX)(BX*1), v; \
	SHLQ CX, v

#define HROUND \
	HLOOK(R8, SI, 32); \
	HLOOK(R9, DI, 40); \
	HLOOK(R10, R12, 48); \
	HLOOK(R11, R13, 56)

// func huffFast4(tab *[2048]uint64, out *byte, st *huffFastState)
TEXT ·huffFast4(SB), NOSPLIT, $0-24
	MOVQ tab+0(FP), DX
	MOVQ out+8(FP), AX
	MOVQ st+16(FP), R15
	MOVQ 0(R15), R8
	MOVQ 8(R15), R9
	MOVQ 16(R15), R10
	MOVQ 24(R15), R11
	MOVQ 128(R15), SI
	ADDQ AX, SI
	MOVQ 136(R15), DI
	ADDQ AX, DI
	MOVQ 144(R15), R12
	ADDQ AX, R12
	MOVQ 152(R15), R13
	ADDQ AX, R13
	// end becomes a pointer too.
	ADDQ AX, 160(R15)
	ADDQ AX, 168(R15)
	ADDQ AX, 176(R15)
	ADDQ AX, 184(R15)

hf_loop:
	CMPQ 64(R15), $8
	JLT  hf_done
	CMPQ 72(R15), $8
	JLT  hf_done
	CMPQ 80(R15), $8
	JLT  hf_done
	CMPQ 88(R15), $8
	JLT  hf_done
	CMPQ SI, 160(R15)
	JHI  hf_done
	CMPQ DI, 168(R15)
	JHI  hf_done
	CMPQ R12, 176(R15)
	JHI  hf_done
	CMPQ R13, 184(R15)
	JHI  hf_done
	HREFILL(R8, 32, 64, 96)
	HREFILL(R9, 40, 72, 104)
	HREFILL(R10, 48, 80, 112)
	HREFILL(R11, 56, 88, 120)
	HROUND
	HROUND
	HROUND
	HROUND
	HROUND
	JMP  hf_loop

hf_done:
	MOVQ R8, 0(R15)
	MOVQ R9, 8(R15)
	MOVQ R10, 16(R15)
	MOVQ R11, 24(R15)
	MOVQ out+8(FP), AX
	SUBQ AX, SI
	MOVQ SI, 128(R15)
	SUBQ AX, DI
	MOVQ DI, 136(R15)
	SUBQ AX, R12
	MOVQ R12, 144(R15)
	SUBQ AX, R13
	MOVQ R13, 152(R15)
	SUBQ AX, 160(R15)
	SUBQ AX, 168(R15)
	SUBQ AX, 176(R15)
	SUBQ AX, 184(R15)
	RET
