//go:build cuda

package daemon

import (
	"github.com/kvmesh/kvmesh/cudakern"
	"github.com/kvmesh/kvmesh/cudakern/gpu"
)

// linkedGPU is the GPU a kvmeshd built with the cuda tag injects on and
// opens CUDA IPC caches with. Such a binary needs the NVIDIA driver to
// start at all (gorgonia.org/cu's init exits without one); whether a
// device answers is decided when the node starts, falling back to the CPU.
func linkedGPU() cudakern.GPU { return gpu.Driver{} }
