package cudakern

import "context"

// IPCHandleBytes is the size of one CUDA IPC memory handle
// (cudaIpcMemHandle_t, CUipcMemHandle).
const IPCHandleBytes = 64

// DeviceCache is a paged cache in another process's device memory, opened
// from its CUDA IPC handles (one per layer) by GPU.OpenIPC. Inject writes
// a job whose source is in host memory (j.Src) into layer `layer` of the
// cache; j.Dst holds one nil layer. Close unmaps the memory.
type DeviceCache interface {
	Inject(ctx context.Context, j *Job, layer int) error
	Close() error
}
