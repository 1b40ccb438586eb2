package cudakern

import (
	"context"
	"errors"
	"sync"
)

// ErrNoDevice: no device kernel is linked (a build without the cuda tag)
// to open a cache in device memory.
var ErrNoDevice = errors.New("cudakern: no device kernel in this build")

// IPCHandleBytes is the size of one CUDA IPC memory handle
// (cudaIpcMemHandle_t, CUipcMemHandle).
const IPCHandleBytes = 64

// DeviceCache is a paged cache in another process's device memory, opened
// from its CUDA IPC handles (one per layer). Inject writes a job whose
// source is in host memory (j.Src) into layer `layer` of the cache; j.Dst
// holds one nil layer. Close unmaps the memory.
type DeviceCache interface {
	Inject(ctx context.Context, j *Job, layer int) error
	Close() error
}

var (
	ipcMu   sync.Mutex
	ipcOpen func(device int, handles [][]byte, offsets []int64, layerBytes []int) (DeviceCache, error)
)

// RegisterIPC sets how OpenIPC opens a device cache. cudakern/gpu calls
// it when it is linked (the cuda build tag); nothing else should.
func RegisterIPC(open func(device int, handles [][]byte, offsets []int64, layerBytes []int) (DeviceCache, error)) {
	ipcMu.Lock()
	defer ipcMu.Unlock()
	ipcOpen = open
}

// OpenIPC opens the cache whose layer l is layerBytes[l] bytes at
// offsets[l] (nil: 0) in the allocation handles[l] exports on device, with
// the registered device kernel; ErrNoDevice when none is linked.
func OpenIPC(device int, handles [][]byte, offsets []int64, layerBytes []int) (DeviceCache, error) {
	ipcMu.Lock()
	open := ipcOpen
	ipcMu.Unlock()
	if open == nil {
		return nil, ErrNoDevice
	}
	return open(device, handles, offsets, layerBytes)
}
