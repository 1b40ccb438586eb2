//go:build linux

package kvtier

import (
	"fmt"
	"math/bits"
	"unsafe"

	"golang.org/x/sys/unix"
)

// arena is the DRAM tier's memory: a memfd of npages fixed-size pages,
// mapped once as a whole. Pages are handed out lowest-index first so that
// most entries get a single contiguous run, which is a plain slice of the
// whole mapping; an entry whose pages form several runs gets its own
// mapping that places the runs side by side in virtual memory, so every
// entry is one contiguous []byte whatever its pages are. Nothing here lives
// on the Go heap except the bitmap. Not safe for concurrent use: the Store
// serializes it under its mutex.
type arena struct {
	fd       int
	pageSize int
	npages   int
	mem      []byte   // the whole memfd, mapped shared
	used     []uint64 // bitmap: 1 = page in use
	nused    int
	hint     int // lowest word that may hold a free page
}

// run is a contiguous range of pages.
type run struct{ first, n uint32 }

// pageSpan is the pages of one entry and its contiguous view.
type pageSpan struct {
	runs  []run
	pages int
	view  []byte
	own   unsafe.Pointer // dedicated mapping when len(runs) > 1
	ownN  uintptr
}

func newArena(bytes int64, pageSize int, prefault bool) (*arena, error) {
	if pageSize <= 0 || pageSize%unix.Getpagesize() != 0 {
		return nil, fmt.Errorf("kvtier: page size %d is not a multiple of the OS page size %d", pageSize, unix.Getpagesize())
	}
	npages := int(bytes / int64(pageSize))
	if npages <= 0 || npages > 1<<31 {
		return nil, fmt.Errorf("kvtier: DRAM budget %d holds %d pages of %d bytes", bytes, npages, pageSize)
	}
	fd, err := unix.MemfdCreate("kvtier-dram", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("kvtier: memfd_create: %w", err)
	}
	size := int64(npages) * int64(pageSize)
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("kvtier: sizing arena: %w", err)
	}
	flags := unix.MAP_SHARED
	if prefault {
		flags |= unix.MAP_POPULATE
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("kvtier: mapping arena: %w", err)
	}
	a := &arena{fd: fd, pageSize: pageSize, npages: npages, mem: mem, used: make([]uint64, (npages+63)/64)}
	// Mark the bits past npages used so scans never hand them out.
	if r := npages % 64; r != 0 {
		a.used[len(a.used)-1] = ^uint64(0) << r
	}
	return a, nil
}

func (a *arena) close() error {
	err := unix.Munmap(a.mem)
	if cerr := unix.Close(a.fd); err == nil {
		err = cerr
	}
	return err
}

func (a *arena) freePages() int { return a.npages - a.nused }

func (a *arena) pagesFor(size int) int { return (size + a.pageSize - 1) / a.pageSize }

// alloc takes n pages, lowest first, and maps them as one view of size
// bytes. The caller has checked freePages() >= n.
func (a *arena) alloc(n, size int) (pageSpan, error) {
	sp := pageSpan{pages: n}
	left := n
	for w := a.hint; w < len(a.used) && left > 0; w++ {
		for a.used[w] != ^uint64(0) && left > 0 {
			free := ^a.used[w]
			b := bits.TrailingZeros64(free)
			// length of the free run starting at bit b within this word
			l := bits.TrailingZeros64(^(free >> b))
			if b+l > 64 {
				l = 64 - b
			}
			l = min(l, left)
			a.used[w] |= (^uint64(0) >> (64 - l)) << b
			p := uint32(w*64 + b)
			if k := len(sp.runs); k > 0 && sp.runs[k-1].first+sp.runs[k-1].n == p {
				sp.runs[k-1].n += uint32(l)
			} else {
				sp.runs = append(sp.runs, run{first: p, n: uint32(l)})
			}
			left -= l
		}
	}
	if left > 0 {
		a.freeRuns(sp.runs)
		return pageSpan{}, fmt.Errorf("kvtier: arena has %d free pages, need %d", a.freePages(), n)
	}
	a.nused += n
	a.advanceHint()
	if len(sp.runs) == 1 {
		off := int(sp.runs[0].first) * a.pageSize
		sp.view = a.mem[off : off+size : off+size]
		return sp, nil
	}
	total := uintptr(n) * uintptr(a.pageSize)
	base, err := unix.MmapPtr(-1, 0, nil, total, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		a.release(&sp)
		return pageSpan{}, fmt.Errorf("kvtier: reserving view: %w", err)
	}
	sp.own, sp.ownN = base, total
	off := uintptr(0)
	for _, r := range sp.runs {
		l := uintptr(r.n) * uintptr(a.pageSize)
		_, err := unix.MmapPtr(a.fd, int64(r.first)*int64(a.pageSize), unsafe.Add(base, off), l,
			unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED|unix.MAP_POPULATE)
		if err != nil {
			a.release(&sp)
			return pageSpan{}, fmt.Errorf("kvtier: mapping run: %w", err)
		}
		off += l
	}
	sp.view = unsafe.Slice((*byte)(base), total)[:size:size]
	return sp, nil
}

func (a *arena) advanceHint() {
	for a.hint < len(a.used) && a.used[a.hint] == ^uint64(0) {
		a.hint++
	}
}

func (a *arena) freeRuns(runs []run) {
	for _, r := range runs {
		for p := r.first; p < r.first+r.n; p++ {
			a.used[p/64] &^= 1 << (p % 64)
		}
		if w := int(r.first / 64); w < a.hint {
			a.hint = w
		}
	}
}

// release returns sp's pages and unmaps its own view, if any.
func (a *arena) release(sp *pageSpan) {
	if sp.own != nil {
		// Failure leaves a stale mapping of pages that may be reused;
		// nothing reads it, and there is no recovery short of a leak.
		_ = unix.MunmapPtr(sp.own, sp.ownN)
		sp.own = nil
	}
	a.freeRuns(sp.runs)
	a.nused -= sp.pages
	*sp = pageSpan{}
}
