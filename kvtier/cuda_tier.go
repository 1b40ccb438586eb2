package kvtier

import "errors"

// ErrNoCUDA: OpenGPU in a build without the cuda tag.
var ErrNoCUDA = errors.New("kvtier: built without CUDA (build with -tags cuda)")

// GPUConfig names the GPU tier a node opens: a slab of Bytes on Device.
type GPUConfig struct {
	// Device is the GPU's ordinal.
	Device int
	// Bytes is the tier's budget, reserved at open.
	Bytes int64
}

// OpenGPU opens the GPU tier's device memory: OpenCUDA's slab in a build
// with the cuda tag, ErrNoCUDA in one without. Close it after the Store
// that uses it.
func OpenGPU(cfg GPUConfig) (*SlabDevice, error) {
	return openGPU(cfg)
}
