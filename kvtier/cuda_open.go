//go:build cuda

package kvtier

func openGPU(cfg GPUConfig) (*SlabDevice, error) {
	return OpenCUDA(CUDAConfig{Device: cfg.Device, Bytes: cfg.Bytes})
}
