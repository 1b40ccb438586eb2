//go:build cuda

package gpu

/*
#cgo LDFLAGS: -lcuda
#cgo linux CFLAGS: -I/usr/local/cuda/include
#cgo linux LDFLAGS: -L/usr/local/cuda/lib64 -L/usr/local/cuda/lib64/stubs
#include <cuda.h>
#include <string.h>

// gorgonia.org/cu has no binding for CUDA IPC.
static CUresult kvmIpcOpen(CUdeviceptr *p, const void *handle) {
	CUipcMemHandle h;
	memcpy(&h, handle, sizeof h);
	return cuIpcOpenMemHandle(p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
}
static CUresult kvmIpcClose(CUdeviceptr p) { return cuIpcCloseMemHandle(p); }
static CUresult kvmIpcExport(void *handle, CUdeviceptr p) {
	CUipcMemHandle h;
	CUresult r = cuIpcGetMemHandle(&h, p);
	memcpy(handle, &h, sizeof h);
	return r;
}
static CUresult kvmAllocHost(void **p, size_t n) { return cuMemAllocHost(p, n); }
static CUresult kvmRange(CUdeviceptr p, size_t *size) {
	CUdeviceptr base;
	return cuMemGetAddressRange(&base, size, p);
}
static const char *kvmErrName(CUresult r) {
	const char *s = 0;
	if (cuGetErrorName(r, &s) != CUDA_SUCCESS || s == 0)
		return "unknown CUresult";
	return s;
}
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/cudakern"
)

// cuResult names a driver result for an error message (the number alone
// says little in a device run's log).
func cuResult(r C.CUresult) string {
	return fmt.Sprintf("%s (CUresult %d)", C.GoString(C.kvmErrName(r)), int(r))
}

// IPCCache is an engine's paged cache in its device memory, opened here
// from the CUDA IPC handles it exported: the node writes hits straight
// into it, staging only the source through device memory.
type IPCCache struct {
	in     *Injector
	mapped []uint64 // each distinct handle's mapping
	sizes  []int64  // each mapping's size, as cuMemGetAddressRange says
	layers []uint64 // each layer's address
}

// OpenIPC opens handles (cudakern.IPCHandleBytes each; layers may share
// one, opened once) on the injector's device: layer l is layerBytes[l]
// bytes at offsets[l] (nil: 0) in its handle's allocation.
func (in *Injector) OpenIPC(handles [][]byte, offsets []int64, layerBytes []int) (*IPCCache, error) {
	if len(handles) != len(layerBytes) || (offsets != nil && len(offsets) != len(handles)) {
		return nil, fmt.Errorf("%w: %d handles, %d offsets for %d layers", cudakern.ErrInvalidJob, len(handles), len(offsets), len(layerBytes))
	}
	c := &IPCCache{in: in}
	err := in.do(func() error {
		open := map[string]uint64{}
		for l, h := range handles {
			if len(h) != cudakern.IPCHandleBytes {
				return fmt.Errorf("%w: layer %d handle of %d bytes", cudakern.ErrInvalidJob, l, len(h))
			}
			p, ok := open[string(h)]
			if !ok {
				var d C.CUdeviceptr
				if r := C.kvmIpcOpen(&d, unsafe.Pointer(&h[0])); r != C.CUDA_SUCCESS {
					return fmt.Errorf("gpu: opening the IPC handle of layer %d: %s", l, cuResult(r))
				}
				p = uint64(d)
				open[string(h)] = p
				c.mapped = append(c.mapped, p)
				var size C.size_t
				if r := C.kvmRange(C.CUdeviceptr(p), &size); r != C.CUDA_SUCCESS {
					return fmt.Errorf("gpu: the size of the IPC mapping of layer %d: %s", l, cuResult(r))
				}
				c.sizes = append(c.sizes, int64(size))
			}
			var off int64
			if offsets != nil {
				off = offsets[l]
			}
			size := c.sizes[slices.Index(c.mapped, p)]
			if off < 0 || size < off+int64(layerBytes[l]) {
				return fmt.Errorf("%w: layer %d: %d bytes at %d in an allocation of %d",
					cudakern.ErrInvalidJob, l, layerBytes[l], off, size)
			}
			c.layers = append(c.layers, p+uint64(off))
		}
		return nil
	})
	if err != nil {
		return nil, errors.Join(err, c.unmap())
	}
	return c, nil
}

// upload queues a copy of b to device memory dst on the stream through
// the page-locked staging buffer (grown as needed), so the DMA runs at the
// bus's speed rather than through the driver's pageable bounce buffers.
// The stream must be idle (every call ends synchronized). Owner thread.
func (in *Injector) upload(dst cu.DevicePtr, b []byte) error {
	if len(b) > len(in.pinned) {
		n := max(len(b), 2*len(in.pinned), 1<<20)
		if in.pinned != nil {
			if err := cu.MemFreeHost(unsafe.Pointer(&in.pinned[0])); err != nil {
				return cuErr("freeing page-locked staging", err)
			}
			in.pinned = nil
		}
		var p unsafe.Pointer
		if r := C.kvmAllocHost(&p, C.size_t(n)); r != C.CUDA_SUCCESS {
			return fmt.Errorf("gpu: allocating %d bytes of page-locked staging: %s", n, cuResult(r))
		}
		in.pinned = unsafe.Slice((*byte)(p), n)
	}
	copy(in.pinned, b)
	if err := cu.MemcpyHtoDAsync(dst, unsafe.Pointer(&in.pinned[0]), int64(len(b)), in.stream); err != nil {
		return cuErr("copying the source in", err)
	}
	return nil
}

// freePinned releases the staging buffer. Owner thread, stream idle.
func (in *Injector) freePinned() error {
	if in.pinned == nil {
		return nil
	}
	p := unsafe.Pointer(&in.pinned[0])
	in.pinned = nil
	return cu.MemFreeHost(p)
}

// exportIPC is what an engine does to register its cache: the IPC handle
// of device memory p, for another process to open (tests).
func (in *Injector) exportIPC(p uint64) ([]byte, error) {
	h := make([]byte, cudakern.IPCHandleBytes)
	err := in.do(func() error {
		if r := C.kvmIpcExport(unsafe.Pointer(&h[0]), C.CUdeviceptr(p)); r != C.CUDA_SUCCESS {
			return fmt.Errorf("gpu: exporting an IPC handle: %s", cuResult(r))
		}
		return nil
	})
	return h, err
}

// Inject writes j (its source in host memory, j.Dst one nil layer) into
// layer `layer` of the cache: the source is copied to the device, then
// the kernel writes the slots in place.
func (c *IPCCache) Inject(ctx context.Context, j *cudakern.Job, layer int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(j.Dst) != 1 || layer < 0 || layer >= len(c.layers) {
		return fmt.Errorf("%w: layer %d of a %d-layer device cache, %d job layers", cudakern.ErrInvalidJob, layer, len(c.layers), len(j.Dst))
	}
	dj, err := cudakern.DeviceJobOf(j, chunk.CodecRaw)
	if err != nil {
		return err
	}
	if j.Tokens == 0 {
		return nil
	}
	in := c.in
	return in.do(func() error {
		sb := int64(len(j.Src))
		if err := in.data.reserve(sb); err != nil {
			return cuErr("allocating the source", err)
		}
		if err := in.upload(in.data.ptr, j.Src); err != nil {
			return err
		}
		return in.launch(ctx, j, dj, []uint64{uint64(in.data.ptr)}, c.layers[layer:layer+1], nil)
	})
}

// InjectDevice implements cudakern.DeviceCache: j into layer `layer` of
// the cache from src, device memory in this process's primary context
// (the GPU tier's slab: the injector runs in that context too), by one
// launch of the kernel, which decodes a codec payload in the same pass.
// Nothing crosses the bus but the job's metadata.
func (c *IPCCache) InjectDevice(ctx context.Context, j *cudakern.Job, layer int, src uint64, codec chunk.Codec) error {
	if len(j.Dst) != 1 || layer < 0 || layer >= len(c.layers) {
		return fmt.Errorf("%w: layer %d of a %d-layer device cache, %d job layers", cudakern.ErrInvalidJob, layer, len(c.layers), len(j.Dst))
	}
	return c.in.InjectDevice(ctx, j, Target{Codec: codec, Src: []uint64{src}, Dst: c.layers[layer : layer+1]})
}

// Close unmaps the cache's memory and closes its injector.
func (c *IPCCache) Close() error {
	err := c.unmap()
	c.in.Close()
	return err
}

func (c *IPCCache) unmap() error {
	if len(c.mapped) == 0 {
		return nil
	}
	err := c.in.do(func() error {
		var errs []error
		for _, p := range c.mapped {
			if r := C.kvmIpcClose(C.CUdeviceptr(p)); r != C.CUDA_SUCCESS {
				errs = append(errs, fmt.Errorf("gpu: closing an IPC mapping: %s", cuResult(r)))
			}
		}
		return errors.Join(errs...)
	})
	c.mapped, c.sizes, c.layers = nil, nil, nil
	return err
}

// OpenIPC implements cudakern.GPU: a device cache registered by CUDA IPC
// gets an injector of its own on its device (closed with it).
func (Driver) OpenIPC(device int, handles [][]byte, offsets []int64, layerBytes []int) (cudakern.DeviceCache, error) {
	in, err := Open(Config{Device: device})
	if err != nil {
		return nil, err
	}
	c, err := in.OpenIPC(handles, offsets, layerBytes)
	if err != nil {
		in.Close()
		return nil, err
	}
	return c, nil
}
