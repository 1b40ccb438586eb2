//go:build !amd64 || purego

package engine

func hasAVXKernels() bool { return false }

func dotAVX(a, b *float32, n int) float32 { panic("engine: no AVX kernels in this build") }

func axpyAVX(alpha float32, x, y *float32, n int) { panic("engine: no AVX kernels in this build") }

func qkAVX(q, kv *float32, offs *int32, n, hd int, out *float32) {
	panic("engine: no AVX kernels in this build")
}

func pvAVX(p, kv *float32, offs *int32, n, hd int, scale float32, out *float32) {
	panic("engine: no AVX kernels in this build")
}

func softmaxAVX(s *float32, n int, scale float32) float32 {
	panic("engine: no AVX kernels in this build")
}

func qk2AVX(q0, q1, kv *float32, offs *int32, n, hd int, out0, out1 *float32) {
	panic("engine: no AVX kernels in this build")
}

func pv2AVX(p0, p1, kv *float32, offs *int32, n, hd int, scale0, scale1 float32, out0, out1 *float32) {
	panic("engine: no AVX kernels in this build")
}

func siluMulAVX(gate, u *float32, n int) { panic("engine: no AVX kernels in this build") }

func mm4AVX(x, w0, w1, w2, w3, y *float32, rows, in, ldy, m int) {
	panic("engine: no AVX kernels in this build")
}

func rmsNormAVX(x, h, w *float32, rows, dim int, eps float64) {
	panic("engine: no AVX kernels in this build")
}
