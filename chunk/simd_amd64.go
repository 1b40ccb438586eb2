//go:build !purego

package chunk

import "golang.org/x/sys/cpu"

// useAVX2 selects the AVX2 decoding kernels of simd_amd64.s. It is read
// from the CPU once, when the package is loaded; the decoders call the
// kernels on the whole multiples of 8 (merge: 16) elements of a run and
// the Go loops, which compute the same bits, on the rest. Without AVX2 and
// F16C (or with the purego build tag, or on another architecture) the Go
// loops do everything.
var useAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasF16C

// The kernels below take n elements, a multiple of 8 (merge: of 16); each
// writes n 16-bit elements at out.
//
// int8Row: out[i] = zero[i] + float32(q[i])*scale[i], rounded to the
// dtype (dequantRowGo). int8Group: the same with one zero and scale
// (dequantGroup's fast path).

//go:noescape
func int8RowBF16AVX2(out, q *byte, zero, scale *float32, n int)

//go:noescape
func int8RowF16AVX2(out, q *byte, zero, scale *float32, n int)

//go:noescape
func int8GroupBF16AVX2(out, q *byte, zero, scale float32, n int)

//go:noescape
func int8GroupF16AVX2(out, q *byte, zero, scale float32, n int)

// fp8Row: out[i] = FP8E4M3ToF32(q[i])*scale[i], rounded to the dtype
// (fp8RowGo); fp8Group: the same with one scale (fp8GroupGo). nan reports
// whether any code was an e4m3 NaN (0x7f or 0xff), whose output is then
// meaningless.

//go:noescape
func fp8RowBF16AVX2(out, q *byte, scale *float32, n int) (nan bool)

//go:noescape
func fp8RowF16AVX2(out, q *byte, scale *float32, n int) (nan bool)

//go:noescape
func fp8GroupBF16AVX2(out, q *byte, scale float32, n int) (nan bool)

//go:noescape
func fp8GroupF16AVX2(out, q *byte, scale float32, n int) (nan bool)

// merge: the 16-bit elements of the byte planes p0 and p1 (mergeGo).

//go:noescape
func mergeBF16AVX2(out, p0, p1 *byte, n int)

//go:noescape
func mergeF16AVX2(out, p0, p1 *byte, n int)

// mergeF16Exp: the f16 elements of the exponent layout's planes exp, lo
// and bits (n/16 groups of 6 bytes), as mergeF16ExpGo writes them; bad
// reports whether any exponent byte was over 31.

//go:noescape
func mergeF16ExpAVX2(out, exp, lo, bits *byte, n int) (bad bool)

// huffAsm selects huffFast4 (any amd64 CPU) over huffDecoder.fast2.
const huffAsm = true

// huffFast4 runs huffDecoder's fast loop over the four streams of st at
// once (the Go loop, fast2, cannot keep four streams in registers): while
// every stream has off >= 8 and pos <= end, a refill and huffRound
// lookups of tab per stream, writing 4 bytes at out+pos per lookup. On
// entry every bitsRead is at most 63.
//
//go:noescape
func huffFast4(tab *[1 << huffWindow]uint64, out *byte, st *huffFastState)
