//go:build amd64 && !purego

#include "textflag.h"

// func dotAVX(a, b *float32, n int) float32
// n is a multiple of 8; two accumulators, added, then the high half folded
// onto the low one and the lanes added in pairs.
TEXT ·dotAVX(SB), NOSPLIT, $0-28
	MOVQ a+0(FP), AX
	MOVQ b+8(FP), BX
	MOVQ n+16(FP), R8
	SHLQ $2, R8
	XORQ R10, R10
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	CMPQ R8, $32
	JEQ  tail

pair:
	CMPQ R10, R8
	JGE  sum
	LEAQ 32(R10), R11
	CMPQ R11, R8
	JGE  tail
	VMOVUPS (AX)(R10*1), Y8
	VFMADD231PS (BX)(R10*1), Y8, Y0
	VMOVUPS (AX)(R11*1), Y9
	VFMADD231PS (BX)(R11*1), Y9, Y1
	ADDQ $64, R10
	JMP  pair

tail:
	CMPQ R10, R8
	JGE  sum
	VMOVUPS (AX)(R10*1), Y8
	VFMADD231PS (BX)(R10*1), Y8, Y0
	ADDQ $32, R10

sum:
	VADDPS Y1, Y0, Y0
	VEXTRACTF128 $1, Y0, X14
	VADDPS X0, X14, X14
	VMOVHLPS X14, X14, X15
	VADDPS X15, X14, X14
	VMOVSHDUP X14, X15
	VADDSS X15, X14, X14
	VMOVSS X14, ret+24(FP)
	VZEROUPPER
	RET

// func axpyAVX(alpha float32, x, y *float32, n int)
// y[i] += alpha * x[i]; n is a multiple of 8.
TEXT ·axpyAVX(SB), NOSPLIT, $0-32
	VBROADCASTSS alpha+0(FP), Y15
	MOVQ x+8(FP), AX
	MOVQ y+16(FP), BX
	MOVQ n+24(FP), R8
	SHLQ $2, R8
	XORQ R10, R10

axloop:
	CMPQ R10, R8
	JGE  axdone
	VMOVUPS (BX)(R10*1), Y0
	VFMADD231PS (AX)(R10*1), Y15, Y0
	VMOVUPS Y0, (BX)(R10*1)
	ADDQ $32, R10
	JMP  axloop

axdone:
	VZEROUPPER
	RET

// QKSUM4 reduces accumulators A0-A3 (one key each) to their four sums in
// X lanes 0-3: lane k is ((a0+a1)+(a2+a3)) + ((a4+a5)+(a6+a7)) of Ak.
// QKSUM1 gives one accumulator's sum in lane 0 of X in the same order, so a
// key's score has the same bits whichever lane or group it goes through.
#define QKSUM4(A0, A1, A2, A3, X0, X1) \
	VHADDPS A1, A0, A0 \
	VHADDPS A3, A2, A2 \
	VHADDPS A2, A0, A0 \
	VEXTRACTF128 $1, A0, X1 \
	VADDPS X1, X0, X0

#define QKSUM1(A, X, X1) \
	VHADDPS A, A, A \
	VHADDPS A, A, A \
	VEXTRACTF128 $1, A, X1 \
	VADDSS X1, X, X

// func qkAVX(q, kv *float32, offs *int32, n, hd int, out *float32)
// out[j] = q · kv[offs[j] : offs[j]+hd] for j < n; hd is a multiple of 8.
// Keys go four at a time (four independent chains); each key's lanes
// accumulate d in steps of 8 and reduce like QKSUM1, in groups or alone.
TEXT ·qkAVX(SB), NOSPLIT, $0-48
	MOVQ q+0(FP), AX
	MOVQ kv+8(FP), BX
	MOVQ offs+16(FP), CX
	MOVQ n+24(FP), DX
	MOVQ hd+32(FP), R8
	MOVQ out+40(FP), R9
	SHLQ $2, R8 // hd in bytes

qk4:
	CMPQ DX, $4
	JLT  qk1
	MOVLQSX 0(CX), R10
	MOVLQSX 4(CX), R11
	MOVLQSX 8(CX), R12
	MOVLQSX 12(CX), R13
	LEAQ (BX)(R10*4), R10
	LEAQ (BX)(R11*4), R11
	LEAQ (BX)(R12*4), R12
	LEAQ (BX)(R13*4), R13
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	XORQ SI, SI

qk4d:
	VMOVUPS (AX)(SI*1), Y8
	VFMADD231PS (R10)(SI*1), Y8, Y0
	VFMADD231PS (R11)(SI*1), Y8, Y1
	VFMADD231PS (R12)(SI*1), Y8, Y2
	VFMADD231PS (R13)(SI*1), Y8, Y3
	ADDQ $32, SI
	CMPQ SI, R8
	JLT  qk4d
	QKSUM4(Y0, Y1, Y2, Y3, X0, X1)
	VMOVUPS X0, (R9)
	ADDQ $16, CX
	ADDQ $16, R9
	SUBQ $4, DX
	JMP  qk4

qk1:
	CMPQ DX, $0
	JLE  qkdone
	MOVLQSX 0(CX), R10
	LEAQ (BX)(R10*4), R10
	VXORPS Y0, Y0, Y0
	XORQ SI, SI

qk1d:
	VMOVUPS (AX)(SI*1), Y8
	VFMADD231PS (R10)(SI*1), Y8, Y0
	ADDQ $32, SI
	CMPQ SI, R8
	JLT  qk1d
	QKSUM1(Y0, X0, X1)
	VMOVSS X0, (R9)
	ADDQ $4, CX
	ADDQ $4, R9
	DECQ DX
	JMP  qk1

qkdone:
	VZEROUPPER
	RET

// func qk2AVX(q0, q1, kv *float32, offs *int32, n, hd int, out0, out1 *float32)
// qkAVX for two query heads that share the keys (grouped-query attention):
// each key row is loaded once for both; every score gets the bits qkAVX
// gives it.
TEXT ·qk2AVX(SB), NOSPLIT, $0-64
	MOVQ q0+0(FP), AX
	MOVQ q1+8(FP), DI
	MOVQ kv+16(FP), BX
	MOVQ offs+24(FP), CX
	MOVQ n+32(FP), DX
	MOVQ hd+40(FP), R8
	MOVQ out0+48(FP), R9
	MOVQ out1+56(FP), R14
	SHLQ $2, R8 // hd in bytes

q2k4:
	CMPQ DX, $4
	JLT  q2k1
	MOVLQSX 0(CX), R10
	MOVLQSX 4(CX), R11
	MOVLQSX 8(CX), R12
	MOVLQSX 12(CX), R13
	LEAQ (BX)(R10*4), R10
	LEAQ (BX)(R11*4), R11
	LEAQ (BX)(R12*4), R12
	LEAQ (BX)(R13*4), R13
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	XORQ SI, SI

q2k4d:
	VMOVUPS (AX)(SI*1), Y8
	VMOVUPS (DI)(SI*1), Y9
	VMOVUPS (R10)(SI*1), Y10
	VFMADD231PS Y10, Y8, Y0
	VFMADD231PS Y10, Y9, Y4
	VMOVUPS (R11)(SI*1), Y11
	VFMADD231PS Y11, Y8, Y1
	VFMADD231PS Y11, Y9, Y5
	VMOVUPS (R12)(SI*1), Y12
	VFMADD231PS Y12, Y8, Y2
	VFMADD231PS Y12, Y9, Y6
	VMOVUPS (R13)(SI*1), Y13
	VFMADD231PS Y13, Y8, Y3
	VFMADD231PS Y13, Y9, Y7
	ADDQ $32, SI
	CMPQ SI, R8
	JLT  q2k4d
	QKSUM4(Y0, Y1, Y2, Y3, X0, X1)
	QKSUM4(Y4, Y5, Y6, Y7, X4, X5)
	VMOVUPS X0, (R9)
	VMOVUPS X4, (R14)
	ADDQ $16, CX
	ADDQ $16, R9
	ADDQ $16, R14
	SUBQ $4, DX
	JMP  q2k4

q2k1:
	CMPQ DX, $0
	JLE  q2done
	MOVLQSX 0(CX), R10
	LEAQ (BX)(R10*4), R10
	VXORPS Y0, Y0, Y0
	VXORPS Y4, Y4, Y4
	XORQ SI, SI

q2k1d:
	VMOVUPS (R10)(SI*1), Y10
	VFMADD231PS (AX)(SI*1), Y10, Y0
	VFMADD231PS (DI)(SI*1), Y10, Y4
	ADDQ $32, SI
	CMPQ SI, R8
	JLT  q2k1d
	QKSUM1(Y0, X0, X1)
	QKSUM1(Y4, X4, X5)
	VMOVSS X0, (R9)
	VMOVSS X4, (R14)
	ADDQ $4, CX
	ADDQ $4, R9
	ADDQ $4, R14
	DECQ DX
	JMP  q2k1

q2done:
	VZEROUPPER
	RET

// func mm4AVX(x, w0, w1, w2, w3, y *float32, rows, in, ldy, m int)
// For i < rows and c < m (1 <= m <= 4): y[i*ldy+c] = x[i*in:][:in] · wc[:in];
// in is a multiple of 8. Rows go two at a time (a 2×4 tile: eight
// independent chains, each w load used twice), the last one alone if rows
// is odd; every (row, column) accumulates in steps of 8 and reduces like
// QKSUM1, so its bits do not depend on the rows or columns beside it.
TEXT ·mm4AVX(SB), NOSPLIT, $0-80
	MOVQ x+0(FP), AX
	MOVQ w0+8(FP), R10
	MOVQ w1+16(FP), R11
	MOVQ w2+24(FP), R12
	MOVQ w3+32(FP), R13
	MOVQ y+40(FP), R9
	MOVQ rows+48(FP), DX
	MOVQ in+56(FP), R8
	MOVQ ldy+64(FP), R14
	MOVQ m+72(FP), CX
	SHLQ $2, R8  // in bytes
	SHLQ $2, R14 // ldy bytes
	MOVQ $8, BX
	SUBQ CX, BX
	LEAQ smxMask<>(SB), DI
	VMOVUPS (DI)(BX*4), X15 // the first m lanes
	LEAQ (AX)(R8*1), BX     // row b of the pair
	LEAQ (R9)(R14*1), DI    // its output

mm2:
	CMPQ DX, $2
	JLT  mm1
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	XORQ SI, SI

mm2k:
	VMOVUPS (AX)(SI*1), Y8
	VMOVUPS (BX)(SI*1), Y9
	VMOVUPS (R10)(SI*1), Y10
	VFMADD231PS Y10, Y8, Y0
	VFMADD231PS Y10, Y9, Y4
	VMOVUPS (R11)(SI*1), Y11
	VFMADD231PS Y11, Y8, Y1
	VFMADD231PS Y11, Y9, Y5
	VMOVUPS (R12)(SI*1), Y12
	VFMADD231PS Y12, Y8, Y2
	VFMADD231PS Y12, Y9, Y6
	VMOVUPS (R13)(SI*1), Y13
	VFMADD231PS Y13, Y8, Y3
	VFMADD231PS Y13, Y9, Y7
	ADDQ $32, SI
	CMPQ SI, R8
	JLT  mm2k
	QKSUM4(Y0, Y1, Y2, Y3, X0, X1)
	QKSUM4(Y4, Y5, Y6, Y7, X4, X5)
	VMASKMOVPS X0, X15, (R9)
	VMASKMOVPS X4, X15, (DI)
	LEAQ (AX)(R8*2), AX
	LEAQ (BX)(R8*2), BX
	LEAQ (R9)(R14*2), R9
	LEAQ (DI)(R14*2), DI
	SUBQ $2, DX
	JMP  mm2

mm1:
	CMPQ DX, $0
	JLE  mmdone
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	XORQ SI, SI

mm1k:
	VMOVUPS (AX)(SI*1), Y8
	VFMADD231PS (R10)(SI*1), Y8, Y0
	VFMADD231PS (R11)(SI*1), Y8, Y1
	VFMADD231PS (R12)(SI*1), Y8, Y2
	VFMADD231PS (R13)(SI*1), Y8, Y3
	ADDQ $32, SI
	CMPQ SI, R8
	JLT  mm1k
	QKSUM4(Y0, Y1, Y2, Y3, X0, X1)
	VMASKMOVPS X0, X15, (R9)

mmdone:
	VZEROUPPER
	RET

// func pvAVX(p, kv *float32, offs *int32, n, hd int, scale float32, out *float32)
// out[0:hd] = scale * (p[0]*kv[offs[0]:][:hd] + p[1]*kv[offs[1]:][:hd] + ...),
// the sum from zero in order j = 0, 1, ..., n-1, each lane one fused
// multiply-add per j (the order axpyAVX gives), then one multiply.
// hd is a multiple of 8; 64 lanes at a time stay in registers.
TEXT ·pvAVX(SB), NOSPLIT, $0-56
	MOVQ p+0(FP), AX
	MOVQ kv+8(FP), BX
	MOVQ offs+16(FP), CX
	MOVQ n+24(FP), DX
	MOVQ hd+32(FP), R8
	VBROADCASTSS scale+40(FP), Y14
	MOVQ out+48(FP), R9
	SHLQ $2, R8 // hd in bytes
	XORQ DI, DI // byte offset of the current lane block

pv64:
	LEAQ 256(DI), R10
	CMPQ R10, R8
	JGT  pv8
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	XORQ SI, SI

pv64j:
	CMPQ SI, DX
	JGE  pv64s
	VBROADCASTSS (AX)(SI*4), Y15
	MOVLQSX (CX)(SI*4), R11
	LEAQ (BX)(R11*4), R11
	ADDQ DI, R11
	VFMADD231PS 0(R11), Y15, Y0
	VFMADD231PS 32(R11), Y15, Y1
	VFMADD231PS 64(R11), Y15, Y2
	VFMADD231PS 96(R11), Y15, Y3
	VFMADD231PS 128(R11), Y15, Y4
	VFMADD231PS 160(R11), Y15, Y5
	VFMADD231PS 192(R11), Y15, Y6
	VFMADD231PS 224(R11), Y15, Y7
	INCQ SI
	JMP  pv64j

pv64s:
	VMULPS Y14, Y0, Y0
	VMULPS Y14, Y1, Y1
	VMULPS Y14, Y2, Y2
	VMULPS Y14, Y3, Y3
	VMULPS Y14, Y4, Y4
	VMULPS Y14, Y5, Y5
	VMULPS Y14, Y6, Y6
	VMULPS Y14, Y7, Y7
	VMOVUPS Y0, 0(R9)(DI*1)
	VMOVUPS Y1, 32(R9)(DI*1)
	VMOVUPS Y2, 64(R9)(DI*1)
	VMOVUPS Y3, 96(R9)(DI*1)
	VMOVUPS Y4, 128(R9)(DI*1)
	VMOVUPS Y5, 160(R9)(DI*1)
	VMOVUPS Y6, 192(R9)(DI*1)
	VMOVUPS Y7, 224(R9)(DI*1)
	MOVQ R10, DI
	JMP  pv64

pv8:
	LEAQ 32(DI), R10
	CMPQ R10, R8
	JGT  pvdone
	VXORPS Y0, Y0, Y0
	XORQ SI, SI

pv8j:
	CMPQ SI, DX
	JGE  pv8s
	VBROADCASTSS (AX)(SI*4), Y15
	MOVLQSX (CX)(SI*4), R11
	LEAQ (BX)(R11*4), R11
	VFMADD231PS (R11)(DI*1), Y15, Y0
	INCQ SI
	JMP  pv8j

pv8s:
	VMULPS Y14, Y0, Y0
	VMOVUPS Y0, (R9)(DI*1)
	MOVQ R10, DI
	JMP  pv8

pvdone:
	VZEROUPPER
	RET

// func pv2AVX(p0, p1, kv *float32, offs *int32, n, hd int, scale0, scale1 float32, out0, out1 *float32)
// pvAVX for two query heads that share the values: each value row is
// loaded once for both. Each head's lanes see the same fused multiply-adds
// in the same order as in pvAVX, so the same bits. 32 lanes of both heads
// at a time stay in registers.
TEXT ·pv2AVX(SB), NOSPLIT, $0-72
	MOVQ p0+0(FP), AX
	MOVQ p1+8(FP), R12
	MOVQ kv+16(FP), BX
	MOVQ offs+24(FP), CX
	MOVQ n+32(FP), DX
	MOVQ hd+40(FP), R8
	VBROADCASTSS scale0+48(FP), Y12
	VBROADCASTSS scale1+52(FP), Y13
	MOVQ out0+56(FP), R9
	MOVQ out1+64(FP), R13
	SHLQ $2, R8 // hd in bytes
	XORQ DI, DI // byte offset of the current lane block

p2v32:
	LEAQ 128(DI), R10
	CMPQ R10, R8
	JGT  p2v8
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	XORQ SI, SI

p2v32j:
	CMPQ SI, DX
	JGE  p2v32s
	VBROADCASTSS (AX)(SI*4), Y14
	VBROADCASTSS (R12)(SI*4), Y15
	MOVLQSX (CX)(SI*4), R11
	LEAQ (BX)(R11*4), R11
	ADDQ DI, R11
	VMOVUPS 0(R11), Y8
	VFMADD231PS Y8, Y14, Y0
	VFMADD231PS Y8, Y15, Y4
	VMOVUPS 32(R11), Y9
	VFMADD231PS Y9, Y14, Y1
	VFMADD231PS Y9, Y15, Y5
	VMOVUPS 64(R11), Y10
	VFMADD231PS Y10, Y14, Y2
	VFMADD231PS Y10, Y15, Y6
	VMOVUPS 96(R11), Y11
	VFMADD231PS Y11, Y14, Y3
	VFMADD231PS Y11, Y15, Y7
	INCQ SI
	JMP  p2v32j

p2v32s:
	VMULPS Y12, Y0, Y0
	VMULPS Y12, Y1, Y1
	VMULPS Y12, Y2, Y2
	VMULPS Y12, Y3, Y3
	VMULPS Y13, Y4, Y4
	VMULPS Y13, Y5, Y5
	VMULPS Y13, Y6, Y6
	VMULPS Y13, Y7, Y7
	VMOVUPS Y0, 0(R9)(DI*1)
	VMOVUPS Y1, 32(R9)(DI*1)
	VMOVUPS Y2, 64(R9)(DI*1)
	VMOVUPS Y3, 96(R9)(DI*1)
	VMOVUPS Y4, 0(R13)(DI*1)
	VMOVUPS Y5, 32(R13)(DI*1)
	VMOVUPS Y6, 64(R13)(DI*1)
	VMOVUPS Y7, 96(R13)(DI*1)
	MOVQ R10, DI
	JMP  p2v32

p2v8:
	LEAQ 32(DI), R10
	CMPQ R10, R8
	JGT  p2vdone
	VXORPS Y0, Y0, Y0
	VXORPS Y4, Y4, Y4
	XORQ SI, SI

p2v8j:
	CMPQ SI, DX
	JGE  p2v8s
	VBROADCASTSS (AX)(SI*4), Y14
	VBROADCASTSS (R12)(SI*4), Y15
	MOVLQSX (CX)(SI*4), R11
	LEAQ (BX)(R11*4), R11
	VMOVUPS (R11)(DI*1), Y8
	VFMADD231PS Y8, Y14, Y0
	VFMADD231PS Y8, Y15, Y4
	INCQ SI
	JMP  p2v8j

p2v8s:
	VMULPS Y12, Y0, Y0
	VMULPS Y13, Y4, Y4
	VMOVUPS Y0, (R9)(DI*1)
	VMOVUPS Y4, (R13)(DI*1)
	MOVQ R10, DI
	JMP  p2v8

p2vdone:
	VZEROUPPER
	RET

// Constants of softmaxAVX, eight lanes each: the same range reduction and
// Taylor coefficients as expNeg, and the masks of a partial last block.
DATA smxC<>+0(SB)/4, $0x3fb8aa3b   // log2(e)
DATA smxC<>+4(SB)/4, $0x3f000000   // 0.5
DATA smxC<>+8(SB)/4, $0x3f318000   // ln2hi = 0.693359375
DATA smxC<>+12(SB)/4, $0xb95e8083  // ln2lo = -2.12194440e-4
DATA smxC<>+16(SB)/4, $0xc2ae0000  // -87
DATA smxC<>+20(SB)/4, $0x3f800000  // 1
DATA smxC<>+24(SB)/4, $0x0000007f  // 127, the exponent bias
DATA smxC<>+28(SB)/4, $0xff800000  // -Inf
DATA smxC<>+32(SB)/4, $0xc2b00000  // -88
GLOBL smxC<>(SB), RODATA|NOPTR, $36

DATA smxP<>+0(SB)/4, $0x3ab60b61   // 1/720
DATA smxP<>+4(SB)/4, $0x3ab60b61
DATA smxP<>+8(SB)/4, $0x3ab60b61
DATA smxP<>+12(SB)/4, $0x3ab60b61
DATA smxP<>+16(SB)/4, $0x3ab60b61
DATA smxP<>+20(SB)/4, $0x3ab60b61
DATA smxP<>+24(SB)/4, $0x3ab60b61
DATA smxP<>+28(SB)/4, $0x3ab60b61
DATA smxP<>+32(SB)/4, $0x3c088889  // 1/120
DATA smxP<>+36(SB)/4, $0x3c088889
DATA smxP<>+40(SB)/4, $0x3c088889
DATA smxP<>+44(SB)/4, $0x3c088889
DATA smxP<>+48(SB)/4, $0x3c088889
DATA smxP<>+52(SB)/4, $0x3c088889
DATA smxP<>+56(SB)/4, $0x3c088889
DATA smxP<>+60(SB)/4, $0x3c088889
DATA smxP<>+64(SB)/4, $0x3d2aaaab  // 1/24
DATA smxP<>+68(SB)/4, $0x3d2aaaab
DATA smxP<>+72(SB)/4, $0x3d2aaaab
DATA smxP<>+76(SB)/4, $0x3d2aaaab
DATA smxP<>+80(SB)/4, $0x3d2aaaab
DATA smxP<>+84(SB)/4, $0x3d2aaaab
DATA smxP<>+88(SB)/4, $0x3d2aaaab
DATA smxP<>+92(SB)/4, $0x3d2aaaab
DATA smxP<>+96(SB)/4, $0x3e2aaaab  // 1/6
DATA smxP<>+100(SB)/4, $0x3e2aaaab
DATA smxP<>+104(SB)/4, $0x3e2aaaab
DATA smxP<>+108(SB)/4, $0x3e2aaaab
DATA smxP<>+112(SB)/4, $0x3e2aaaab
DATA smxP<>+116(SB)/4, $0x3e2aaaab
DATA smxP<>+120(SB)/4, $0x3e2aaaab
DATA smxP<>+124(SB)/4, $0x3e2aaaab
DATA smxP<>+128(SB)/4, $0x3f000000 // 1/2
DATA smxP<>+132(SB)/4, $0x3f000000
DATA smxP<>+136(SB)/4, $0x3f000000
DATA smxP<>+140(SB)/4, $0x3f000000
DATA smxP<>+144(SB)/4, $0x3f000000
DATA smxP<>+148(SB)/4, $0x3f000000
DATA smxP<>+152(SB)/4, $0x3f000000
DATA smxP<>+156(SB)/4, $0x3f000000
GLOBL smxP<>(SB), RODATA|NOPTR, $160

// Loading 8 lanes at smxMask<>+4*(8-r) gives a mask of the first r lanes.
DATA smxMask<>+0(SB)/8, $0xffffffffffffffff
DATA smxMask<>+8(SB)/8, $0xffffffffffffffff
DATA smxMask<>+16(SB)/8, $0xffffffffffffffff
DATA smxMask<>+24(SB)/8, $0xffffffffffffffff
DATA smxMask<>+32(SB)/8, $0
DATA smxMask<>+40(SB)/8, $0
DATA smxMask<>+48(SB)/8, $0
DATA smxMask<>+56(SB)/8, $0
GLOBL smxMask<>(SB), RODATA|NOPTR, $64

// EXPNEG sets Y4 to e^x of the lanes of Y0 (x <= 0) as expNeg computes
// it (fused multiply-adds: one rounding where expNeg has two), 0 where
// x < -87 or x is NaN. Uses Y1-Y3; needs Y8-Y12 and Y6 as softmaxAVX sets them.
#define EXPNEG \
	VCMPPS $0x1d, Y12, Y0, Y1 \
	VMOVAPS Y0, Y2 \
	VFMADD213PS Y10, Y11, Y2 \
	VROUNDPS $9, Y2, Y2 \
	VMOVAPS Y0, Y3 \
	VFNMADD231PS Y9, Y2, Y3 \
	VFNMADD231PS Y8, Y2, Y3 \
	VMOVUPS smxP<>+0(SB), Y4 \
	VFMADD213PS smxP<>+32(SB), Y3, Y4 \
	VFMADD213PS smxP<>+64(SB), Y3, Y4 \
	VFMADD213PS smxP<>+96(SB), Y3, Y4 \
	VFMADD213PS smxP<>+128(SB), Y3, Y4 \
	VFMADD213PS Y7, Y3, Y4 \
	VFMADD213PS Y7, Y3, Y4 \
	VCVTTPS2DQ Y2, Y2 \
	VPADDD Y6, Y2, Y2 \
	VPSLLD $23, Y2, Y2 \
	VMULPS Y2, Y4, Y4 \
	VANDPS Y1, Y4, Y4

// func softmaxAVX(s *float32, n int, scale float32) float32
// softmaxRow on s[0:n], n >= 1, scale > 0: s[j] = e^(s[j]·scale - m) with
// m the largest s[j]·scale; returns the sum of the new s[j], added in
// eight lanes (lane j%8) and reduced as dotAVX reduces. The first pass takes the
// max of the raw scores: rounding s·scale is monotonic in s, so m is
// exactly the max of the scaled ones.
TEXT ·softmaxAVX(SB), NOSPLIT, $0-28
	MOVQ s+0(FP), SI
	MOVQ n+8(FP), DX
	VBROADCASTSS scale+16(FP), Y15
	MOVQ DX, CX
	ANDQ $7, CX   // lanes of the partial last block
	SUBQ CX, DX   // floats in whole blocks
	SHLQ $2, DX
	MOVQ $8, R8
	SUBQ CX, R8
	LEAQ smxMask<>(SB), R9
	VMOVUPS (R9)(R8*4), Y5 // mask of the partial block's lanes
	VBROADCASTSS smxC<>+28(SB), Y14
	XORQ AX, AX

smxmax:
	CMPQ AX, DX
	JGE  smxmaxt
	VMAXPS (SI)(AX*1), Y14, Y14
	ADDQ $32, AX
	JMP  smxmax

smxmaxt:
	TESTQ CX, CX
	JZ    smxmaxr
	VMASKMOVPS (SI)(DX*1), Y5, Y0
	VBROADCASTSS smxC<>+28(SB), Y1
	VBLENDVPS Y5, Y0, Y1, Y0
	VMAXPS Y0, Y14, Y14

smxmaxr:
	VEXTRACTF128 $1, Y14, X0
	VMAXPS X0, X14, X14
	VMOVHLPS X14, X14, X0
	VMAXPS X0, X14, X14
	VMOVSHDUP X14, X0
	VMAXSS X0, X14, X14
	VMULSS X15, X14, X14
	VBROADCASTSS X14, Y14 // m
	VBROADCASTSS smxC<>+0(SB), Y11
	VBROADCASTSS smxC<>+4(SB), Y10
	VBROADCASTSS smxC<>+8(SB), Y9
	VBROADCASTSS smxC<>+12(SB), Y8
	VBROADCASTSS smxC<>+16(SB), Y12
	VBROADCASTSS smxC<>+20(SB), Y7
	VPBROADCASTD smxC<>+24(SB), Y6
	VXORPS Y13, Y13, Y13
	XORQ AX, AX

smxexp:
	CMPQ AX, DX
	JGE  smxexpt
	VMULPS (SI)(AX*1), Y15, Y0
	VSUBPS Y14, Y0, Y0
	EXPNEG
	VMOVUPS Y4, (SI)(AX*1)
	VADDPS Y4, Y13, Y13
	ADDQ $32, AX
	JMP  smxexp

smxexpt:
	TESTQ CX, CX
	JZ    smxsum
	VMASKMOVPS (SI)(DX*1), Y5, Y0
	VMULPS Y15, Y0, Y0
	VSUBPS Y14, Y0, Y0
	EXPNEG
	VANDPS Y5, Y4, Y4
	VMASKMOVPS Y4, Y5, (SI)(DX*1)
	VADDPS Y4, Y13, Y13

smxsum:
	VEXTRACTF128 $1, Y13, X14
	VADDPS X13, X14, X14
	VMOVHLPS X14, X14, X15
	VADDPS X15, X14, X14
	VMOVSHDUP X14, X15
	VADDSS X15, X14, X14
	VMOVSS X14, ret+24(FP)
	VZEROUPPER
	RET

// func siluMulAVX(gate, u *float32, n int)
// siluMul on gate[0:n], u[0:n]; n is a multiple of 8. e^-x is EXPNEG's with
// -x raised to at least -87 (for x > 87, 1 + e^-x rounds to 1 either way);
// below x = -88 the product is 0 (silu(x) = x·e^x there is under 1e-36;
// expNeg's e^-x would overflow). NaN stays NaN.
TEXT ·siluMulAVX(SB), NOSPLIT, $0-24
	MOVQ gate+0(FP), AX
	MOVQ u+8(FP), BX
	MOVQ n+16(FP), DX
	SHLQ $2, DX
	VBROADCASTSS smxC<>+0(SB), Y11
	VBROADCASTSS smxC<>+4(SB), Y10
	VBROADCASTSS smxC<>+8(SB), Y9
	VBROADCASTSS smxC<>+12(SB), Y8
	VBROADCASTSS smxC<>+16(SB), Y12
	VBROADCASTSS smxC<>+20(SB), Y7
	VPBROADCASTD smxC<>+24(SB), Y6
	VBROADCASTSS smxC<>+32(SB), Y14
	VXORPS Y13, Y13, Y13
	XORQ SI, SI

siluloop:
	CMPQ SI, DX
	JGE  siludone
	VMOVUPS (AX)(SI*1), Y5
	VCMPPS $0x05, Y14, Y5, Y15 // x >= -88 or NaN
	VSUBPS Y5, Y13, Y0
	VMAXPS Y12, Y0, Y0
	EXPNEG
	VADDPS Y7, Y4, Y4
	VDIVPS Y4, Y5, Y5
	VMULPS (BX)(SI*1), Y5, Y5
	VANDPS Y15, Y5, Y5
	VMOVUPS Y5, (AX)(SI*1)
	ADDQ $32, SI
	JMP  siluloop

siludone:
	VZEROUPPER
	RET

// func rmsNormAVX(x, h, w *float32, rows, dim int, eps float64)
// rmsNorm with dim a multiple of 8: the squares summed in float64 in eight
// lanes (two vectors of four), the scale computed as rmsNorm computes it,
// and x = h*inv*w rounded after each multiply as there.
TEXT ·rmsNormAVX(SB), NOSPLIT, $0-48
	MOVQ x+0(FP), DI
	MOVQ h+8(FP), SI
	MOVQ w+16(FP), BX
	MOVQ rows+24(FP), DX
	MOVQ dim+32(FP), R8
	VMOVSD eps+40(FP), X13
	VCVTSI2SDQ R8, X12, X12 // dim as float64
	MOVQ $0x3ff0000000000000, AX
	MOVQ AX, X11          // 1.0
	SHLQ $2, R8           // dim in bytes

rmsrow:
	CMPQ DX, $0
	JLE  rmsdone
	VXORPD Y0, Y0, Y0
	VXORPD Y1, Y1, Y1
	XORQ CX, CX

rmsss:
	VCVTPS2PD (SI)(CX*1), Y2
	VCVTPS2PD 16(SI)(CX*1), Y3
	VFMADD231PD Y2, Y2, Y0
	VFMADD231PD Y3, Y3, Y1
	ADDQ $32, CX
	CMPQ CX, R8
	JLT  rmsss
	VADDPD Y1, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPD X1, X0, X0
	VUNPCKHPD X0, X0, X1
	VADDSD X1, X0, X0
	VDIVSD X12, X0, X0
	VADDSD X13, X0, X0
	VSQRTSD X0, X0, X0
	VDIVSD X0, X11, X0
	VCVTSD2SS X0, X0, X0
	VBROADCASTSS X0, Y4
	XORQ CX, CX

rmsmul:
	VMULPS (SI)(CX*1), Y4, Y5
	VMULPS (BX)(CX*1), Y5, Y5
	VMOVUPS Y5, (DI)(CX*1)
	ADDQ $32, CX
	CMPQ CX, R8
	JLT  rmsmul
	ADDQ R8, SI
	ADDQ R8, DI
	DECQ DX
	JMP  rmsrow

rmsdone:
	VZEROUPPER
	RET
