package cudakern

import (
	"context"

	"github.com/kvmesh/kvmesh/chunk"
)

// IPCHandleBytes is the size of one CUDA IPC memory handle
// (cudaIpcMemHandle_t, CUipcMemHandle).
const IPCHandleBytes = 64

// DeviceCache is a paged cache in another process's device memory, opened
// from its CUDA IPC handles (one per layer) by GPU.OpenIPC. Close unmaps
// the memory.
type DeviceCache interface {
	// Inject writes a job whose source is in host memory (j.Src) into
	// layer `layer` of the cache; j.Dst holds one nil layer.
	Inject(ctx context.Context, j *Job, layer int) error
	// InjectDevice writes j into layer `layer` of the cache from a source
	// already in device memory on the cache's device, in this process's
	// primary context there (the node's GPU tier): src is the address of
	// one layer's bytes, a raw canonical layer of j.SrcHeads heads or its
	// payload in codec (EncodedLayerBytes long), decoded in the kernel's
	// pass by DeviceJobOf's rules. j.Src is not read; j.Dst holds one nil
	// layer. It returns once the kernel has stopped reading src. A payload
	// the kernel finds corrupt is an error wrapping chunk.ErrCorrupt.
	InjectDevice(ctx context.Context, j *Job, layer int, src uint64, codec chunk.Codec) error
	Close() error
}

// DeviceCodecs are the codecs whose payloads the CUDA kernels decode, in
// DeviceJobOf and InjectDevice: the others' decoding stays on the CPU.
func DeviceCodecs() []chunk.Codec {
	var out []chunk.Codec
	for c := range chunk.Codec(255) {
		if _, ok := deviceCodec(c); ok {
			out = append(out, c)
		}
	}
	return out
}
