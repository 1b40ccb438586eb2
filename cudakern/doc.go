// Package cudakern turns stored pre-RoPE keys into keys at new positions and
// writes them, with their values, into an inference engine's paged KV cache.
//
// It has three parts:
//
//   - RopeTable: inverse frequencies and cos/sin rows for a chunk.ModelSpec,
//     with Hugging Face transformers' semantics (default, linear, llama3,
//     YaRN and dynamic NTK scaling; NeoX and GPT-J pairing; partial rotary).
//   - GatherF32, ScatterF32: read and write head vectors of one layer of a
//     paged KV cache whose geometry is a pagedkv.CacheLayout (vLLM's
//     FlashAttention layout NHD or its HND variant, or FlashInfer's with K
//     and V inside each block), so that no caller repeats the layout
//     arithmetic.
//   - Injector: the fused hot path. For a range of layers it reads a chunk's
//     canonical K and V, rotates K to the target positions, converts to the
//     cache dtype and scatters both into the named slots in one pass over the
//     bytes, split over a fixed set of worker goroutines.
//
// The CPU implementation here is always built. The CUDA one (package
// cudakern/gpu, behind the `cuda` build tag) has the same methods (Kernel)
// and the same bits: its arithmetic is cudakern/kern's inject.h, which the
// host checks there hold to this package's kernels. New picks it when it
// is linked and a device answers. DeviceJobOf is a Job as the kernels
// read it.
//
// Speed: on amd64 with AVX2 (AVX-512 and AVX512-BF16 where present) every
// path is vectorised (kernel_amd64.s), with the same bits as the Go code,
// which the tests check on arbitrary bit patterns. Same-dtype NeoX jobs
// (and bf16 GPT-J jobs, with AVX512-BF16) rotate in registers, one kernel
// call per token covering all its heads with one cos/sin row (kept in L1);
// values of the same dtype are copied. fp8 <-> bf16 jobs (vLLM's fp8 KV
// cache; fp8 entries) run single-pass AVX-512 kernels (kernel_fp8_amd64.s):
// read the source, widen, rotate (NeoX K), scale and round in registers,
// store, with fp8 widening by integer rebias plus a 16-entry table for
// zero, subnormal and NaN codes and e4m3 rounding by integer
// round-to-nearest-even. Other pairs (other dtype changes, GPT-J fp8 jobs,
// partial rotary fp8 keys, CPUs without AVX-512) go through a float32
// scratch vector per token: widen all heads, rotate them with one call,
// round them with one call. Jobs over 4 MiB store
// non-temporally (whole aligned lines), so the cache lines they overwrite
// are not read first. The build tag purego, or another architecture, gives
// the portable Go path.
//
// Precision, everywhere in this package: the rotation angle is the float32
// product float32(position) * inv_freq[i]; cos and sin are computed in
// float64 from that float32 angle (times YaRN's attention factor, in float64)
// and rounded once to float32; x*cos - y*sin is computed in float32 with each
// product rounded to float32 (no fused multiply-add, so every platform gives
// the same bits) and rounded once into the destination dtype.
package cudakern
