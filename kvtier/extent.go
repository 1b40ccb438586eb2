package kvtier

import (
	"errors"
	"fmt"

	"github.com/google/btree"
)

// errBadFree is a free of an offset that is not the start of an
// allocation.
var errBadFree = errors.New("kvtier: free of an unallocated extent")

// extent is a free range [off, off+size) of a slab.
type extent struct{ size, off int64 }

func extentLess(a, b extent) bool {
	if a.size != b.size {
		return a.size < b.size
	}
	return a.off < b.off
}

// extentAllocator hands out byte ranges of one fixed region (the GPU
// tier's slab), best fit with immediate coalescing: the free extents are
// ordered by (size, offset) in a B-tree, so an allocation takes the
// smallest extent that fits, lowest offset on ties, in O(log n), and a free
// merges with its free neighbours, found through the maps of free extents
// by start and by end, in O(log n). Sizes are rounded up to align, which
// keeps every offset aligned. Best fit over exact sizes, rather than size
// classes, because the tier's entries span 16 to 2048 tokens (a 128x range
// at whatever bytes per token): classes would waste up to half of each
// allocation or need dozens of classes that fragment the slab between them.
// Not safe for concurrent use.
type extentAllocator struct {
	capacity int64
	align    int64
	bySize   *btree.BTreeG[extent]
	freeAt   map[int64]int64 // free extent start -> size
	freeEnd  map[int64]int64 // free extent end -> start
	used     map[int64]int64 // allocation start -> rounded size
	usedSize int64
}

// newExtentAllocator manages capacity bytes (rounded down to align) in
// units of align bytes, a power of two.
func newExtentAllocator(capacity, align int64) (*extentAllocator, error) {
	if align <= 0 || align&(align-1) != 0 {
		return nil, fmt.Errorf("kvtier: slab alignment %d is not a power of two", align)
	}
	capacity &^= align - 1
	if capacity <= 0 {
		return nil, fmt.Errorf("kvtier: slab of %d bytes holds no %d-byte unit", capacity, align)
	}
	a := &extentAllocator{
		capacity: capacity,
		align:    align,
		bySize:   btree.NewG(8, extentLess),
		freeAt:   make(map[int64]int64),
		freeEnd:  make(map[int64]int64),
		used:     make(map[int64]int64),
	}
	a.insertFree(0, capacity)
	return a, nil
}

func (a *extentAllocator) insertFree(off, size int64) {
	a.bySize.ReplaceOrInsert(extent{size: size, off: off})
	a.freeAt[off] = size
	a.freeEnd[off+size] = off
}

func (a *extentAllocator) deleteFree(off, size int64) {
	a.bySize.Delete(extent{size: size, off: off})
	delete(a.freeAt, off)
	delete(a.freeEnd, off+size)
}

// roundUp is n rounded up to the alignment; 0 when n is not positive or
// the rounding overflows.
func (a *extentAllocator) roundUp(n int64) int64 {
	if n <= 0 || n > a.capacity {
		return 0
	}
	return (n + a.align - 1) &^ (a.align - 1)
}

// alloc returns the offset of n bytes (rounded up to the alignment), or
// false when no free extent is large enough.
func (a *extentAllocator) alloc(n int64) (int64, bool) {
	n = a.roundUp(n)
	if n == 0 {
		return 0, false
	}
	var best extent
	found := false
	a.bySize.AscendGreaterOrEqual(extent{size: n, off: -1}, func(e extent) bool {
		best, found = e, true
		return false
	})
	if !found {
		return 0, false
	}
	a.deleteFree(best.off, best.size)
	if rest := best.size - n; rest > 0 {
		a.insertFree(best.off+n, rest)
	}
	a.used[best.off] = n
	a.usedSize += n
	return best.off, true
}

// free returns the allocation at off and the size it had.
func (a *extentAllocator) free(off int64) (int64, error) {
	n, ok := a.used[off]
	if !ok {
		return 0, fmt.Errorf("%w: offset %d", errBadFree, off)
	}
	delete(a.used, off)
	a.usedSize -= n
	start, size := off, n
	if prev, ok := a.freeEnd[start]; ok {
		ps := a.freeAt[prev]
		a.deleteFree(prev, ps)
		start, size = prev, size+ps
	}
	if ns, ok := a.freeAt[start+size]; ok {
		a.deleteFree(start+size, ns)
		size += ns
	}
	a.insertFree(start, size)
	return n, nil
}

// sizeAt is the (rounded) size of the allocation at off.
func (a *extentAllocator) sizeAt(off int64) (int64, bool) {
	n, ok := a.used[off]
	return n, ok
}

// largestFree is the size of the largest free extent.
func (a *extentAllocator) largestFree() int64 {
	if e, ok := a.bySize.Max(); ok {
		return e.size
	}
	return 0
}
