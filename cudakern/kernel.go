package cudakern

import (
	"context"
	"fmt"
)

// Kernel is what callers of an injector use: the CPU Injector and the CUDA
// one (package cudakern/gpu, built with the cuda tag) both have these
// methods, with the same bits.
type Kernel interface {
	// Inject is Injector.Inject.
	Inject(ctx context.Context, j *Job) error
	// Workers is the number of jobs' worth of parallelism inside one call.
	Workers() int
	// Close stops the kernel; later calls return ErrClosed.
	Close()
}

// GPU opens injection work on this machine's CUDA devices. cudakern/gpu's
// Driver implements it in a build with the cuda tag; a caller without one
// passes nil and gets the CPU Injector (and no device caches). It is a
// value the caller hands down, not a registry, so that a default build
// links no CUDA and a test can pass a stand-in.
type GPU interface {
	// Kernel opens an injector on device, named for the log (the device
	// and its compute capability).
	Kernel(device int) (Kernel, string, error)
	// OpenIPC opens a cache in another process's device memory: layer l is
	// layerBytes[l] bytes at offsets[l] (nil: 0) in the allocation
	// handles[l] exports on device (IPCHandleBytes each).
	OpenIPC(device int, handles [][]byte, offsets []int64, layerBytes []int) (DeviceCache, error)
}

// NewKernel returns gpu's kernel on device when gpu is set and the device
// answers, else a CPU Injector of cfg. It says which it chose: the
// device's name, or why not (for the log), and onGPU.
func NewKernel(gpu GPU, device int, cfg Config) (k Kernel, name string, onGPU bool) {
	if gpu == nil {
		return NewInjector(cfg), "cpu (no GPU configured)", false
	}
	k, name, err := gpu.Kernel(device)
	if err != nil {
		return NewInjector(cfg), fmt.Sprintf("cpu (GPU %d does not answer: %v)", device, err), false
	}
	return k, name, true
}
