// Package cudathread runs CUDA work on one OS thread that owns a device's
// primary context. CUDA makes a context current per OS thread, so code
// that keeps device state (streams, buffers, modules) hands closures to
// such a thread and waits for them: the GPU tier's slab (kvtier) and the
// CUDA injector (cudakern/gpu) each own one. Using the primary context
// means device pointers of one are valid in the other on the same device.
//
// Everything but this comment is behind the `cuda` build tag:
// gorgonia.org/cu's init exits the process when no driver answers, so a
// default build must never link it.
package cudathread
