//go:build cuda

package main

import (
	"github.com/kvmesh/kvmesh/cudakern"
	"github.com/kvmesh/kvmesh/cudakern/gpu"
)

// linkedGPU is the GPU the demo's in-process nodes inject on in a build
// with the cuda tag (when device 0 answers; the CPU otherwise).
func linkedGPU() cudakern.GPU { return gpu.Driver{} }
