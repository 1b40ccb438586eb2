//go:build amd64 && !purego

#include "textflag.h"

// HSUM reduces the 8 lanes of Y to a float32 stored at OFF(R9), always in
// the same order, so every kernel gives one (row, column) the same bits.
#define HSUM(Y, X, OFF) \
	VEXTRACTF128 $1, Y, X14 \
	VADDPS X, X14, X14 \
	VMOVHLPS X14, X14, X15 \
	VADDPS X15, X14, X14 \
	VMOVSHDUP X14, X15 \
	VADDSS X15, X14, X14 \
	VMOVSS X14, OFF(R9)

// func dot2x4AVX(xa, xb, w0, w1, w2, w3 *float32, n int, out *[8]float32)
// out[0:4] = xa·w0..w3, out[4:8] = xb·w0..w3; n is a multiple of 8.
TEXT ·dot2x4AVX(SB), NOSPLIT, $0-64
	MOVQ xa+0(FP), AX
	MOVQ xb+8(FP), BX
	MOVQ w0+16(FP), CX
	MOVQ w1+24(FP), DX
	MOVQ w2+32(FP), SI
	MOVQ w3+40(FP), DI
	MOVQ n+48(FP), R8
	MOVQ out+56(FP), R9
	SHLQ $2, R8
	XORQ R10, R10
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7

loop2:
	CMPQ R10, R8
	JGE  done2
	VMOVUPS (AX)(R10*1), Y8
	VMOVUPS (BX)(R10*1), Y9
	VMOVUPS (CX)(R10*1), Y10
	VFMADD231PS Y10, Y8, Y0
	VFMADD231PS Y10, Y9, Y4
	VMOVUPS (DX)(R10*1), Y11
	VFMADD231PS Y11, Y8, Y1
	VFMADD231PS Y11, Y9, Y5
	VMOVUPS (SI)(R10*1), Y12
	VFMADD231PS Y12, Y8, Y2
	VFMADD231PS Y12, Y9, Y6
	VMOVUPS (DI)(R10*1), Y13
	VFMADD231PS Y13, Y8, Y3
	VFMADD231PS Y13, Y9, Y7
	ADDQ $32, R10
	JMP  loop2

done2:
	HSUM(Y0, X0, 0)
	HSUM(Y1, X1, 4)
	HSUM(Y2, X2, 8)
	HSUM(Y3, X3, 12)
	HSUM(Y4, X4, 16)
	HSUM(Y5, X5, 20)
	HSUM(Y6, X6, 24)
	HSUM(Y7, X7, 28)
	VZEROUPPER
	RET

// func dot1x4AVX(xa, w0, w1, w2, w3 *float32, n int, out *[4]float32)
// out[0:4] = xa·w0..w3 with the same per-lane order as dot2x4AVX.
TEXT ·dot1x4AVX(SB), NOSPLIT, $0-56
	MOVQ xa+0(FP), AX
	MOVQ w0+8(FP), CX
	MOVQ w1+16(FP), DX
	MOVQ w2+24(FP), SI
	MOVQ w3+32(FP), DI
	MOVQ n+40(FP), R8
	MOVQ out+48(FP), R9
	SHLQ $2, R8
	XORQ R10, R10
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3

loop1:
	CMPQ R10, R8
	JGE  done1
	VMOVUPS (AX)(R10*1), Y8
	VFMADD231PS (CX)(R10*1), Y8, Y0
	VFMADD231PS (DX)(R10*1), Y8, Y1
	VFMADD231PS (SI)(R10*1), Y8, Y2
	VFMADD231PS (DI)(R10*1), Y8, Y3
	ADDQ $32, R10
	JMP  loop1

done1:
	HSUM(Y0, X0, 0)
	HSUM(Y1, X1, 4)
	HSUM(Y2, X2, 8)
	HSUM(Y3, X3, 12)
	VZEROUPPER
	RET

// func dotAVX(a, b *float32, n int) float32
// n is a multiple of 8; two accumulators, reduced like HSUM.
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

// func qkAVX(q, kv *float32, offs *int32, n, hd int, out *float32)
// out[j] = q · kv[offs[j] : offs[j]+hd] for j < n; hd is a multiple of 8.
// Keys go four at a time (four independent chains); each key's lanes
// accumulate d in steps of 8 and reduce like HSUM, in groups or alone.
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
	HSUM(Y0, X0, 0)
	HSUM(Y1, X1, 4)
	HSUM(Y2, X2, 8)
	HSUM(Y3, X3, 12)
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
	HSUM(Y0, X0, 0)
	ADDQ $4, CX
	ADDQ $4, R9
	DECQ DX
	JMP  qk1

qkdone:
	VZEROUPPER
	RET

// func pvAVX(p, kv *float32, offs *int32, n, hd int, out *float32)
// out[0:hd] += p[j] * kv[offs[j] : offs[j]+hd] for j = 0, 1, ..., n-1 in
// order, each lane one fused multiply-add per j (the order axpyAVX gives).
// hd is a multiple of 8; 64 lanes at a time stay in registers.
TEXT ·pvAVX(SB), NOSPLIT, $0-48
	MOVQ p+0(FP), AX
	MOVQ kv+8(FP), BX
	MOVQ offs+16(FP), CX
	MOVQ n+24(FP), DX
	MOVQ hd+32(FP), R8
	MOVQ out+40(FP), R9
	SHLQ $2, R8 // hd in bytes
	XORQ DI, DI // byte offset of the current lane block

pv64:
	LEAQ 256(DI), R10
	CMPQ R10, R8
	JGT  pv8
	VMOVUPS 0(R9)(DI*1), Y0
	VMOVUPS 32(R9)(DI*1), Y1
	VMOVUPS 64(R9)(DI*1), Y2
	VMOVUPS 96(R9)(DI*1), Y3
	VMOVUPS 128(R9)(DI*1), Y4
	VMOVUPS 160(R9)(DI*1), Y5
	VMOVUPS 192(R9)(DI*1), Y6
	VMOVUPS 224(R9)(DI*1), Y7
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
	VMOVUPS (R9)(DI*1), Y0
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
	VMOVUPS Y0, (R9)(DI*1)
	MOVQ R10, DI
	JMP  pv8

pvdone:
	VZEROUPPER
	RET
