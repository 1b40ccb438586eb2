// Package kern holds the CUDA C of cudakern's kernels and checks it on the
// CPU.
//
// inject.h is the per-element arithmetic of the fused inject (rotate,
// convert, scatter; int8, int4 and fp8 codec payloads decoded in the same
// pass) as __host__ __device__ functions; inject.cu is the kernel around
// them, nothing but the launch geometry. gen.sh (`make cuda`) compiles it
// to PTX for sm_80 and sm_90, committed in ptx/ and embedded here (PTX);
// TestPTXFresh fails when the PTX is stale.
//
// With cgo, Run executes inject.h on the host, over every token and lane a
// kernel's grid would cover, and the tests hold it to cudakern's Go kernels
// bit for bit: every dtype pair, layout and RoPE variant, arbitrary bits,
// large positions, partial blocks, skipped slots, codec payloads. So a
// machine without a GPU checks all of a device run but the grid.
package kern
