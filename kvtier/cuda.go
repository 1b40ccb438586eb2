//go:build cuda

// The CUDA device memory of the GPU tier. Only this file and its test
// import gorgonia.org/cu and use cgo: that package's init exits the
// process when no driver answers, so a default build must never link it.
// Build with -tags cuda and CGO_CFLAGS/CGO_LDFLAGS pointing at cuda.h and
// libcuda.so when they are not under /usr/local/cuda.

package kvtier

/*
#cgo LDFLAGS: -lcuda
#cgo linux CFLAGS: -I/usr/local/cuda/include
#cgo linux LDFLAGS: -L/usr/local/cuda/lib64 -L/usr/local/cuda/lib64/stubs
#include <cuda.h>

// gorgonia.org/cu has no binding for page-locked host allocations.
static CUresult kvtierAllocHost(void **p, size_t n) { return cuMemAllocHost(p, n); }
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/kvmesh/kvmesh/internal/cudathread"
)

// CUDAConfig configures OpenCUDA. Zero fields take the documented defaults.
type CUDAConfig struct {
	// Device is the ordinal of the GPU. Default 0.
	Device int
	// Bytes is the slab reserved at open, the GPU tier's capacity; required.
	Bytes int64
	// StagingBytes is the size of each of the two page-locked host buffers
	// copies go through (one filled while the other is in flight). Default
	// 8 MiB: large enough for full PCIe/NVLink-C2C bandwidth per transfer,
	// small enough that the memcpy into it stays in cache-friendly chunks.
	StagingBytes int
	// Align is the allocation unit; see SlabConfig. Default 256.
	Align int64
}

// OpenCUDA reserves cfg.Bytes of device memory with one cuMemAlloc in the
// device's primary context (so other users of the primary context, such
// as injection kernels, can use the DevicePtr values directly) and returns
// a SlabDevice over it. Close the device to return the memory.
func OpenCUDA(cfg CUDAConfig) (*SlabDevice, error) {
	if cfg.Bytes <= 0 {
		return nil, fmt.Errorf("kvtier: CUDA slab size %d must be positive", cfg.Bytes)
	}
	if cfg.StagingBytes <= 0 {
		cfg.StagingBytes = 8 << 20
	}
	m := &cudaSlab{size: cfg.Bytes}
	th, err := cudathread.Start(cfg.Device, func(th *cudathread.Thread, _ cu.Device) error { return m.setup(th, cfg) })
	if err != nil {
		return nil, err
	}
	m.th = th
	d, err := NewSlabDevice(m, SlabConfig{Align: cfg.Align})
	if err != nil {
		_ = m.Close()
		return nil, err
	}
	return d, nil
}

// cudaSlab is a SlabMemory in device memory. Its thread (one goroutine
// locked to an OS thread with the device's context current) owns the
// stream, the staging buffers and the slab, and runs every call that
// touches them.
type cudaSlab struct {
	size int64
	base DevicePtr // written by setup before Start returns, read-only after
	th   *cudathread.Thread

	// Owned by the thread.
	stream cu.Stream
	stage  [2][]byte // page-locked
	ev     [2]cu.Event
}

func (m *cudaSlab) Base() DevicePtr { return m.base }
func (m *cudaSlab) Size() int64     { return m.size }

// do runs fn on the thread.
func (m *cudaSlab) do(fn func() error) error {
	err := m.th.Do(fn)
	if errors.Is(err, cudathread.ErrClosed) {
		return ErrDeviceClosed
	}
	return err
}

// Close implements SlabMemory: it stops the thread, which frees
// everything it allocated.
func (m *cudaSlab) Close() error {
	m.th.Close()
	return nil
}

func cuErr(what string, err error) error {
	return fmt.Errorf("kvtier: cuda %s: %w", what, err)
}

// setup allocates, on the thread, the stream, the slab and the staging
// buffers; the thread frees them at Close, after the stream drained.
func (m *cudaSlab) setup(th *cudathread.Thread, cfg CUDAConfig) error {
	var err error
	if m.stream, err = cu.MakeStream(cu.NonBlocking); err != nil {
		return cuErr("creating a stream", err)
	}
	th.Defer(m.stream.Destroy)
	slab, err := cu.MemAlloc(cfg.Bytes)
	if err != nil {
		return cuErr(fmt.Sprintf("allocating a %d-byte slab", cfg.Bytes), err)
	}
	th.Defer(func() error { return cu.MemFree(slab) })
	m.base = DevicePtr(slab)
	for i := range m.stage {
		var p unsafe.Pointer
		if r := C.kvtierAllocHost(&p, C.size_t(cfg.StagingBytes)); r != C.CUDA_SUCCESS {
			return cuErr("allocating page-locked staging", fmt.Errorf("CUresult %d", int(r)))
		}
		th.Defer(func() error { return cu.MemFreeHost(p) })
		m.stage[i] = unsafe.Slice((*byte)(p), cfg.StagingBytes)
		if m.ev[i], err = cu.MakeEvent(cu.DisableTiming); err != nil {
			return cuErr("creating an event", err)
		}
		ev := &m.ev[i]
		th.Defer(func() error { return cu.DestroyEvent(ev) })
	}
	// Everything is freed after the stream drains.
	th.Defer(m.stream.Synchronize)
	return nil
}

// CopyIn implements SlabMemory: src goes through the two staging buffers
// in turn, each chunk's host-to-device copy queued on the stream while the
// next chunk is copied into the other buffer; an event per buffer says when
// it may be refilled. It returns after the stream has drained.
func (m *cudaSlab) CopyIn(off int64, src []byte) error {
	return m.do(func() error {
		dst := cu.DevicePtr(m.base) + cu.DevicePtr(off)
		for i, k := 0, 0; i < len(src); k++ {
			b := k & 1
			if k >= 2 {
				if err := m.ev[b].Synchronize(); err != nil {
					return m.drain(cuErr("waiting for staging", err))
				}
			}
			n := copy(m.stage[b], src[i:])
			if err := cu.MemcpyHtoDAsync(dst+cu.DevicePtr(i), unsafe.Pointer(&m.stage[b][0]), int64(n), m.stream); err != nil {
				return m.drain(cuErr("host-to-device copy", err))
			}
			if err := m.ev[b].Record(m.stream); err != nil {
				return m.drain(cuErr("recording an event", err))
			}
			i += n
		}
		if err := m.stream.Synchronize(); err != nil {
			return cuErr("synchronizing", err)
		}
		return nil
	})
}

// CopyOut implements SlabMemory: the device-to-host copy of chunk k+1 is
// queued before chunk k is copied out of its staging buffer.
func (m *cudaSlab) CopyOut(off int64, dst []byte) error {
	return m.do(func() error {
		src := cu.DevicePtr(m.base) + cu.DevicePtr(off)
		sn := len(m.stage[0])
		chunks := (len(dst) + sn - 1) / sn
		issue := func(k int) error {
			b := k & 1
			lo := k * sn
			n := min(sn, len(dst)-lo)
			if err := cu.MemcpyDtoHAsync(unsafe.Pointer(&m.stage[b][0]), src+cu.DevicePtr(lo), int64(n), m.stream); err != nil {
				return cuErr("device-to-host copy", err)
			}
			if err := m.ev[b].Record(m.stream); err != nil {
				return cuErr("recording an event", err)
			}
			return nil
		}
		if chunks > 0 {
			if err := issue(0); err != nil {
				return m.drain(err)
			}
		}
		for k := 0; k < chunks; k++ {
			if k+1 < chunks {
				if err := issue(k + 1); err != nil {
					return m.drain(err)
				}
			}
			b := k & 1
			if err := m.ev[b].Synchronize(); err != nil {
				return m.drain(cuErr("waiting for a copy", err))
			}
			copy(dst[k*sn:], m.stage[b][:min(sn, len(dst)-k*sn)])
		}
		return nil
	})
}

// drain waits for the stream after a failure, so that no queued copy
// still uses a staging buffer, and returns err.
func (m *cudaSlab) drain(err error) error {
	if serr := m.stream.Synchronize(); serr != nil {
		return errors.Join(err, cuErr("synchronizing", serr))
	}
	return err
}
