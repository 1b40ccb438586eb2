package inject

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/cudakern"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// Errors callers branch on. Every error the Service returns wraps one of
// them, a context error, or (for an unknown model) the ModelSource's error.
var (
	// ErrInvalidCache: a Descriptor does not describe a usable cache
	// (layout, sizes, offsets, head range).
	ErrInvalidCache = errors.New("inject: invalid cache registration")
	// ErrRefused: the memory of a registration is not one the Service
	// maps (not shared memory, too small, already registered). The error
	// says no more: what the file is stays the caller's business, and the
	// Service logs the reason.
	ErrRefused = errors.New("inject: shared memory refused")
	// ErrUnsupported: a memory kind this build cannot map (CUDA IPC).
	ErrUnsupported = errors.New("inject: unsupported memory kind")
	// ErrTooManyCaches: Config.MaxCaches registrations are already held.
	ErrTooManyCaches = errors.New("inject: too many registered caches")
	// ErrUnknownCache: no registration has that CacheID (or it was
	// unregistered).
	ErrUnknownCache = errors.New("inject: unknown cache")
	// ErrInvalidRequest: an Inject request is malformed (slots out of range,
	// positions beyond the RoPE table, tokens that do not hash to the
	// content ID, too many chunks). Nothing was written.
	ErrInvalidRequest = errors.New("inject: invalid request")
	// ErrFault: touching the registered memory faulted (the engine shrank
	// its shared-memory file under the mapping). The request stopped.
	ErrFault = errors.New("inject: fault in registered memory")
	// ErrClosed: the Service was closed.
	ErrClosed = errors.New("inject: service closed")
)

// MemoryKind says where a registered cache lives.
type MemoryKind uint8

const (
	// MemoryInvalid is the zero kind.
	MemoryInvalid MemoryKind = iota
	// MemoryShm is a file the node maps MAP_SHARED: a memfd or a file on
	// tmpfs or hugetlbfs, which the engine hands over as an open
	// descriptor (the node's cache socket), never by name.
	MemoryShm
	// MemoryCUDAIPC is device memory exported with cudaIpcGetMemHandle, one
	// handle per layer, opened through the Service's Config.GPU
	// (cudakern/gpu.Driver in a cuda build); without one, ErrUnsupported.
	MemoryCUDAIPC
	// MemoryInProcess is memory handed to RegisterInProcess as slices (an
	// embedded cluster, tests). Register refuses it.
	MemoryInProcess
)

func (k MemoryKind) String() string {
	switch k {
	case MemoryShm:
		return "shm"
	case MemoryCUDAIPC:
		return "cuda-ipc"
	case MemoryInProcess:
		return "in-process"
	}
	return fmt.Sprintf("memory(%d)", uint8(k))
}

// Memory names the bytes of a registered cache.
type Memory struct {
	Kind MemoryKind
	// File is the shared-memory file (MemoryShm), open read-write.
	// Register maps it and keeps nothing of it: the caller closes it.
	File *os.File
	// Offsets holds the byte offset of each layer in the file (MemoryShm),
	// each a multiple of Alignment. Nil means the layers are packed in
	// order from offset 0.
	Offsets []int64
	// Device and IPCHandles are for MemoryCUDAIPC: the CUDA device ordinal
	// and one cudaIpcMemHandle_t (64 bytes) per layer; Offsets then holds
	// each layer's byte offset in the allocation its handle exports (a
	// framework's caching allocator hands out parts of larger blocks), nil
	// meaning 0. Layers may share a handle.
	Device     int
	IPCHandles [][]byte
}

// Alignment is the alignment every layer of registered memory must have
// (a cache line; the vector stores of cudakern need 32 bytes).
const Alignment = 64

// DefaultMaxPositions sizes a registration's RoPE table when the
// Descriptor does not say.
const DefaultMaxPositions = 32768

// Descriptor describes a paged KV cache an engine registers.
type Descriptor struct {
	// Fingerprint is the model whose chunks the cache takes. The node
	// resolves it to a ModelSpec (Config.Models) unless Spec is set.
	Fingerprint chunk.Fingerprint
	// Spec, when its Family is set, is the model spec itself; it must
	// hash to Fingerprint.
	Spec chunk.ModelSpec
	// Layers is the number of layers; it must equal the model's.
	Layers int
	// Layouts holds one layout shared by every layer, or one per layer.
	Layouts []pagedkv.CacheLayout
	// HeadLo and HeadHi are the model KV heads [HeadLo, HeadHi) the cache
	// holds (a tensor-parallel rank's slice); both zero means all.
	HeadLo, HeadHi int
	// MaxPositions bounds target positions (the RoPE table's size); 0
	// means DefaultMaxPositions.
	MaxPositions int
	// Memory is where the layers are.
	Memory Memory
}

// CacheID names a registration.
type CacheID uint64

// cache is one registration. Its fields are immutable after registration
// except refs and gone, which Service.mu guards.
type cache struct {
	id      CacheID
	desc    Descriptor
	spec    chunk.ModelSpec
	ropeKey ropeKey
	rope    *cudakern.RopeTable   // shared by the registrations of ropeKey
	layouts []pagedkv.CacheLayout // one per layer
	layers  [][]byte
	headLo  int
	headHi  int
	shared  bool                 // layers are a mapping that faults if the file shrinks
	unmap   func()               // nil for in-process memory
	dev     cudakern.DeviceCache // MemoryCUDAIPC: the engine's device memory; layers is nil
	file    fileID               // the mapped file (MemoryShm)

	refs int  // injects using the cache
	gone bool // unregistered; unmap when refs drops to 0
}

// fileID names a file: its device and inode. The zero value is no file.
type fileID struct{ dev, ino uint64 }

// ropeKey names a RoPE table: the model and the table's size.
type ropeKey struct {
	fp     chunk.Fingerprint
	maxPos int
}

// ropeRef is a shared table and the registrations using it.
type ropeRef struct {
	t *cudakern.RopeTable
	n int
}

// layerLayouts expands d.Layouts to one per layer.
func layerLayouts(layouts []pagedkv.CacheLayout, layers int) ([]pagedkv.CacheLayout, error) {
	if layers <= 0 {
		return nil, fmt.Errorf("%w: %d layers", ErrInvalidCache, layers)
	}
	switch len(layouts) {
	case 1:
		out := make([]pagedkv.CacheLayout, layers)
		for i := range out {
			out[i] = layouts[0]
		}
		return out, nil
	case layers:
		return slices.Clone(layouts), nil
	}
	return nil, fmt.Errorf("%w: %d layouts for %d layers (give 1 or one per layer)", ErrInvalidCache, len(layouts), layers)
}

// checkGeometry validates the descriptor against the model spec and
// returns the per-layer layouts and the resolved head range.
func checkGeometry(d *Descriptor, spec chunk.ModelSpec) (layouts []pagedkv.CacheLayout, lo, hi int, err error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidCache, fmt.Sprintf(format, a...))
	}
	if d.Layers != spec.Layers {
		return nil, 0, 0, bad("%d layers, model has %d", d.Layers, spec.Layers)
	}
	layouts, err = layerLayouts(d.Layouts, d.Layers)
	if err != nil {
		return nil, 0, 0, err
	}
	lo, hi = d.HeadLo, d.HeadHi
	if lo == 0 && hi == 0 {
		hi = spec.KVHeads
	}
	if lo < 0 || lo >= hi || hi > spec.KVHeads {
		return nil, 0, 0, bad("head range [%d,%d) of %d model KV heads", lo, hi, spec.KVHeads)
	}
	for l, lay := range layouts {
		if err := lay.Validate(); err != nil {
			return nil, 0, 0, fmt.Errorf("%w: layer %d: %w", ErrInvalidCache, l, err)
		}
		if lay.HeadDim != spec.HeadDim {
			return nil, 0, 0, bad("layer %d: head dim %d, model has %d", l, lay.HeadDim, spec.HeadDim)
		}
		if lay.KVHeads != hi-lo {
			return nil, 0, 0, bad("layer %d: %d KV heads, head range [%d,%d) has %d", l, lay.KVHeads, lo, hi, hi-lo)
		}
	}
	return layouts, lo, hi, nil
}

// shmOffsets resolves the layer offsets of a shared-memory registration
// and the size the file must have.
func shmOffsets(m *Memory, layouts []pagedkv.CacheLayout) (offs []int64, end int64, err error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidCache, fmt.Sprintf(format, a...))
	}
	offs = m.Offsets
	if offs == nil {
		offs = make([]int64, len(layouts))
		var at int64
		for l, lay := range layouts {
			offs[l] = at
			at += int64(lay.LayerBytes())
		}
	}
	if len(offs) != len(layouts) {
		return nil, 0, bad("%d offsets for %d layers", len(offs), len(layouts))
	}
	type span struct{ lo, hi int64 }
	spans := make([]span, len(offs))
	for l, o := range offs {
		if o < 0 || o%Alignment != 0 {
			return nil, 0, bad("layer %d at offset %d: must be >= 0 and a multiple of %d", l, o, Alignment)
		}
		n := int64(layouts[l].LayerBytes())
		if o > 1<<62-n {
			return nil, 0, bad("layer %d at offset %d overflows", l, o)
		}
		spans[l] = span{o, o + n}
		end = max(end, o+n)
	}
	// cudakern needs the layers not to overlap (and overlapping layers would
	// be an engine bug that corrupts its own cache).
	slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
	for i := 1; i < len(spans); i++ {
		if spans[i].lo < spans[i-1].hi {
			return nil, 0, bad("layers overlap at offset %d", spans[i].lo)
		}
	}
	return offs, end, nil
}
