//go:build !cuda

package main

import "github.com/kvmesh/kvmesh/cudakern"

// linkedGPU is nil without the cuda tag: the demo injects on the CPU.
func linkedGPU() cudakern.GPU { return nil }
