package kvtier

import (
	"fmt"
	"sync"
	"unsafe"
)

// hostSlabAlign is the alignment of a HostSlab's first byte: what
// cuMemAlloc gives a slab, so allocations of a SlabDevice over it are
// aligned as on a device.
const hostSlabAlign = 256

// HostSlab is a SlabMemory in host memory whose Base is the real address
// of its first byte, so the DevicePtr values of a SlabDevice over it are
// host addresses. It stands in for device memory where a test's stand-in
// kernel reads the tier's copies by address, as a CUDA kernel reads the
// slab (At gives it the bytes at an address). A mutex orders the copies,
// as a device's copy engine would; copies to distinct allocations never
// overlap anyway.
type HostSlab struct {
	mu   sync.Mutex
	buf  []byte // keeps mem's allocation alive; the Go heap does not move it
	mem  []byte
	base DevicePtr
}

// NewHostSlab allocates a HostSlab of size bytes, its first byte aligned
// to 256.
func NewHostSlab(size int64) *HostSlab {
	buf := make([]byte, size+hostSlabAlign)
	skip := (hostSlabAlign - int(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))%hostSlabAlign)) % hostSlabAlign
	mem := buf[skip : skip+int(size)]
	return &HostSlab{buf: buf, mem: mem, base: DevicePtr(uintptr(unsafe.Pointer(unsafe.SliceData(mem))))}
}

// Base implements SlabMemory: the address of the first byte.
func (h *HostSlab) Base() DevicePtr { return h.base }

// Size implements SlabMemory.
func (h *HostSlab) Size() int64 { return int64(len(h.mem)) }

// CopyIn implements SlabMemory.
func (h *HostSlab) CopyIn(off int64, src []byte) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mem == nil {
		return ErrDeviceClosed
	}
	copy(h.mem[off:off+int64(len(src))], src)
	return nil
}

// CopyOut implements SlabMemory.
func (h *HostSlab) CopyOut(off int64, dst []byte) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mem == nil {
		return ErrDeviceClosed
	}
	copy(dst, h.mem[off:off+int64(len(dst))])
	return nil
}

// At returns the n bytes at address p, for a stand-in kernel to read as
// a device kernel reads the slab: without a copy and without the mutex
// (the tier keeps a pinned copy in place). It fails for a range outside
// the slab or after Close.
func (h *HostSlab) At(p uint64, n int) ([]byte, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	off := p - uint64(h.base)
	if h.mem == nil || p < uint64(h.base) || n < 0 || off > uint64(len(h.mem)) || uint64(n) > uint64(len(h.mem))-off {
		return nil, fmt.Errorf("kvtier: %d bytes at %#x outside the host slab [%#x, +%d)", n, p, uint64(h.base), len(h.mem))
	}
	return h.mem[off : off+uint64(n)], nil
}

// Close implements SlabMemory.
func (h *HostSlab) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.mem, h.buf = nil, nil
	return nil
}
