//go:build !cuda

package kvtier

import "fmt"

func openGPU(cfg GPUConfig) (*SlabDevice, error) {
	return nil, fmt.Errorf("%w: GPU tier of %d bytes on device %d", ErrNoCUDA, cfg.Bytes, cfg.Device)
}
