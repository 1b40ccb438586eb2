//go:build amd64 && !purego

package engine

import "golang.org/x/sys/cpu"

// hasAVXKernels reports whether the AVX2+FMA kernels of matmul_amd64.s can
// run here.
func hasAVXKernels() bool { return cpu.X86.HasAVX2 && cpu.X86.HasFMA }

//go:noescape
func dotAVX(a, b *float32, n int) float32

//go:noescape
func axpyAVX(alpha float32, x, y *float32, n int)

//go:noescape
func qkAVX(q, kv *float32, offs *int32, n, hd int, out *float32)

//go:noescape
func pvAVX(p, kv *float32, offs *int32, n, hd int, scale float32, out *float32)

//go:noescape
func softmaxAVX(s *float32, n int, scale float32) float32

//go:noescape
func qk2AVX(q0, q1, kv *float32, offs *int32, n, hd int, out0, out1 *float32)

//go:noescape
func pv2AVX(p0, p1, kv *float32, offs *int32, n, hd int, scale0, scale1 float32, out0, out1 *float32)

//go:noescape
func siluMulAVX(gate, u *float32, n int)

//go:noescape
func mm4AVX(x, w0, w1, w2, w3, y *float32, rows, in, ldy, m int)

//go:noescape
func rmsNormAVX(x, h, w *float32, rows, dim int, eps float64)
