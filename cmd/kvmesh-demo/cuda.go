//go:build cuda

package main

import (
	"fmt"
	"os"

	"github.com/kvmesh/kvmesh/cudakern"
	_ "github.com/kvmesh/kvmesh/cudakern/gpu" // registers the GPU kernel with cudakern.New
)

// With the cuda tag the demo's injections (the in-process nodes'
// inject.Service, through cudakern.New) run on the GPU when one answers;
// the demo says which kernel they got (its nodes' logs are discarded).
func init() {
	k, kind := cudakern.New(cudakern.Config{Workers: 1})
	k.Close()
	fmt.Fprintf(os.Stderr, "injection kernel: %s\n", kind)
}
