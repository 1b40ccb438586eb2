// The CUDA kernels of cudakern's fused inject. All arithmetic is in
// inject.h, shared with the host build that checks it bit for bit
// (Run, in host.go); this file is only the launch geometry.
//
// kvm_inject: grid (tokens, layers), one block per token of a layer, its
// threads striding over the token's work items (the rotating pairs and
// pass-through dims of K, then V, of every head); block (t, y) does layer
// layer+y, so one launch per layer (layers 1) or per range. vLLM's
// reshape_and_cache has the same shape. A slot of -1 returns at once;
// error bits (codec payloads only) are ORed into job->err. The job is in
// device memory: a launch passes only 8-byte arguments.
//
// Built by `make cuda` (gen.sh) into ptx/inject_sm80.ptx and
// ptx/inject_sm90.ptx with -fmad=false, so no multiply contracts into a
// fused multiply-add.
#include "inject.h"

extern "C" __global__ void kvm_inject(const kvm_job *job, long long layer) {
	kvm_u32 err = kvm_token(job, (int)layer + blockIdx.y, blockIdx.x, threadIdx.x, blockDim.x);
	if (err != 0)
		atomicOr((unsigned int *)job->err, err);
}
