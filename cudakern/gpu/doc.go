// Package gpu runs cudakern's fused inject on a CUDA device: the kernel of
// cudakern/kern, whose arithmetic the host checks hold bit for bit to the
// CPU Injector, loaded from the embedded PTX with gorgonia.org/cu.
//
// Everything but this comment is behind the `cuda` build tag (cgo, CUDA's
// driver library): gorgonia.org/cu's init exits the process when no driver
// answers, so a default build must never link it. With the tag, Open
// returns an Injector with the CPU Injector's methods (Inject, Workers,
// Close) plus InjectDevice for sources and caches already in device
// memory, and Driver is the cudakern.GPU a daemon built with the tag hands
// to the node: cudakern.NewKernel picks its kernel at start when a device
// answers, and CUDA IPC caches are opened through it.
package gpu
