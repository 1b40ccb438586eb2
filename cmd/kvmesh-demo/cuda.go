//go:build cuda

package main

// With the cuda tag the demo's injections (the in-process nodes'
// inject.Service) run on the GPU when one answers.
import _ "github.com/kvmesh/kvmesh/cudakern/gpu"
