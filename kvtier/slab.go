package kvtier

import (
	"errors"
	"fmt"
	"sync"
)

// ErrDeviceClosed is what a closed SlabDevice returns.
var ErrDeviceClosed = errors.New("kvtier: device memory closed")

// SlabMemory is one contiguous region of memory that a SlabDevice carves
// up: device memory allocated once (the CUDA slab, behind the cuda build
// tag) or host memory for tests. Offsets are bytes from the region's start.
type SlabMemory interface {
	// Base is the address of byte 0; DevicePtr values are Base plus an
	// offset, so they are real device addresses a kernel can use.
	Base() DevicePtr
	// Size is the region's length in bytes.
	Size() int64
	// CopyIn copies src to the region at off; it has completed (the
	// region holds the bytes) when it returns.
	CopyIn(off int64, src []byte) error
	// CopyOut copies the region at off into dst.
	CopyOut(off int64, dst []byte) error
	// Close releases the region.
	Close() error
}

// SlabConfig configures a SlabDevice.
type SlabConfig struct {
	// Align is the allocation unit and alignment, a power of two. Default
	// 256 bytes, what cuMemAlloc guarantees and coalesced loads want.
	Align int64
}

// SlabDevice is a DeviceMemory that allocates from one region reserved
// up front, rather than asking the driver per entry: cuMemAlloc and
// cuMemFree synchronize the whole device and take milliseconds, and memory
// other processes take between tier operations would make the budget a
// guess. Allocation is best fit with coalescing (extentAllocator), O(log n).
// It is safe for concurrent use; copies run outside its lock, so the
// memory's own CopyIn and CopyOut must be safe for concurrent use.
type SlabDevice struct {
	mem SlabMemory

	mu     sync.Mutex
	ext    *extentAllocator
	closed bool
}

// NewSlabDevice returns a DeviceMemory over mem; Close closes mem.
func NewSlabDevice(mem SlabMemory, cfg SlabConfig) (*SlabDevice, error) {
	if cfg.Align == 0 {
		cfg.Align = 256
	}
	ext, err := newExtentAllocator(mem.Size(), cfg.Align)
	if err != nil {
		return nil, err
	}
	return &SlabDevice{mem: mem, ext: ext}, nil
}

// Capacity implements DeviceMemory.
func (d *SlabDevice) Capacity() int64 { return d.ext.capacity }

// Used returns the bytes allocated now, rounded up to the alignment.
func (d *SlabDevice) Used() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ext.usedSize
}

// LargestFree returns the largest allocation that would succeed now.
func (d *SlabDevice) LargestFree() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ext.largestFree()
}

// Alloc implements DeviceMemory.
func (d *SlabDevice) Alloc(n int64) (DevicePtr, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, ErrDeviceClosed
	}
	off, ok := d.ext.alloc(n)
	if !ok {
		return 0, fmt.Errorf("%w: %d bytes with %d of %d used, largest free extent %d",
			ErrDeviceFull, n, d.ext.usedSize, d.ext.capacity, d.ext.largestFree())
	}
	return d.mem.Base() + DevicePtr(off), nil
}

// Free implements DeviceMemory.
func (d *SlabDevice) Free(p DevicePtr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrDeviceClosed
	}
	off, ok := d.offset(p)
	if !ok {
		return fmt.Errorf("%w: pointer %#x outside the slab", errBadFree, uint64(p))
	}
	_, err := d.ext.free(off)
	return err
}

func (d *SlabDevice) offset(p DevicePtr) (int64, bool) {
	base := d.mem.Base()
	if p < base || p-base >= DevicePtr(d.ext.capacity) {
		return 0, false
	}
	return int64(p - base), true
}

// region checks that [off, off+n) lies in the allocation at p and returns
// the slab offset of its first byte.
func (d *SlabDevice) region(p DevicePtr, off int64, n int) (int64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, ErrDeviceClosed
	}
	start, ok := d.offset(p)
	size, alloc := d.ext.sizeAt(start)
	if !ok || !alloc || off < 0 || off > size || int64(n) > size-off {
		return 0, fmt.Errorf("kvtier: device access %d+%d outside allocation %#x", off, n, uint64(p))
	}
	return start + off, nil
}

// Write implements DeviceMemory.
func (d *SlabDevice) Write(p DevicePtr, off int64, src []byte) error {
	at, err := d.region(p, off, len(src))
	if err != nil || len(src) == 0 {
		return err
	}
	return d.mem.CopyIn(at, src)
}

// Read implements DeviceMemory.
func (d *SlabDevice) Read(p DevicePtr, off int64, dst []byte) error {
	at, err := d.region(p, off, len(dst))
	if err != nil || len(dst) == 0 {
		return err
	}
	return d.mem.CopyOut(at, dst)
}

// Close releases the slab. Allocations become invalid; calling Close again
// does nothing.
func (d *SlabDevice) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	return d.mem.Close()
}
