//go:build !cuda

package daemon

import "github.com/kvmesh/kvmesh/cudakern"

// linkedGPU is nil in a build without the cuda tag: injection runs on the
// CPU and CUDA IPC registrations are refused as unsupported.
func linkedGPU() cudakern.GPU { return nil }
