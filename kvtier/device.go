package kvtier

import (
	"errors"
	"fmt"
	"sync"
)

// ErrDeviceFull is what a DeviceMemory returns when an allocation does not
// fit.
var ErrDeviceFull = errors.New("kvtier: device memory full")

// DevicePtr names an allocation in device memory.
type DevicePtr uint64

// DeviceMemory is the GPU tier's memory: an allocator and copies to and
// from host memory. The CUDA implementation, OpenCUDA (a SlabDevice over
// one cuMemAlloc slab), is built only with the cuda build tag; HostDevice
// and a SlabDevice over host memory stand in for it. The Store calls it
// under its exclusive lock, one call at a time, but implementations should
// still be safe for concurrent use.
type DeviceMemory interface {
	// Capacity is the most bytes the device lets the tier allocate.
	Capacity() int64
	// Alloc reserves n bytes; ErrDeviceFull when they do not fit.
	Alloc(n int64) (DevicePtr, error)
	// Free returns an allocation.
	Free(p DevicePtr) error
	// Write copies src to p at byte offset off.
	Write(p DevicePtr, off int64, src []byte) error
	// Read copies from p at byte offset off into dst.
	Read(p DevicePtr, off int64, dst []byte) error
}

// HostDevice is a DeviceMemory in host memory with a capacity, for tests
// and for nodes without a GPU that still want to exercise the tier.
type HostDevice struct {
	capacity int64

	mu    sync.Mutex
	used  int64
	next  DevicePtr
	alloc map[DevicePtr][]byte
}

// NewHostDevice returns a stand-in device of capacity bytes.
func NewHostDevice(capacity int64) *HostDevice {
	return &HostDevice{capacity: capacity, alloc: make(map[DevicePtr][]byte)}
}

// Capacity implements DeviceMemory.
func (d *HostDevice) Capacity() int64 { return d.capacity }

// Used returns the bytes allocated now.
func (d *HostDevice) Used() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.used
}

// Alloc implements DeviceMemory.
func (d *HostDevice) Alloc(n int64) (DevicePtr, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if n <= 0 || d.used+n > d.capacity {
		return 0, fmt.Errorf("%w: %d bytes with %d of %d used", ErrDeviceFull, n, d.used, d.capacity)
	}
	d.next++
	d.alloc[d.next] = make([]byte, n)
	d.used += n
	return d.next, nil
}

// Free implements DeviceMemory.
func (d *HostDevice) Free(p DevicePtr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, ok := d.alloc[p]
	if !ok {
		return fmt.Errorf("kvtier: free of unknown device pointer %d", p)
	}
	delete(d.alloc, p)
	d.used -= int64(len(b))
	return nil
}

func (d *HostDevice) region(p DevicePtr, off int64, n int) ([]byte, error) {
	b, ok := d.alloc[p]
	if !ok || off < 0 || off+int64(n) > int64(len(b)) {
		return nil, fmt.Errorf("kvtier: device access %d+%d outside allocation %d", off, n, p)
	}
	return b[off : off+int64(n)], nil
}

// Write implements DeviceMemory.
func (d *HostDevice) Write(p DevicePtr, off int64, src []byte) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, err := d.region(p, off, len(src))
	if err != nil {
		return err
	}
	copy(b, src)
	return nil
}

// Read implements DeviceMemory.
func (d *HostDevice) Read(p DevicePtr, off int64, dst []byte) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, err := d.region(p, off, len(dst))
	if err != nil {
		return err
	}
	copy(dst, b)
	return nil
}
