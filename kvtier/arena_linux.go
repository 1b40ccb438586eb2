//go:build linux

package kvtier

import (
	"fmt"
	"math/bits"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// arena is the DRAM tier's memory: a memfd of npages fixed-size pages,
// mapped once as a whole. Pages are handed out lowest-index first so that
// most entries get a single contiguous run, which is a plain slice of the
// whole mapping; an entry whose pages form several runs gets its own
// mapping that places the runs side by side in virtual memory, so every
// entry is one contiguous []byte whatever its pages are. Nothing here lives
// on the Go heap except the bitmaps. Not safe for concurrent use: the Store
// serializes it under its mutex (prepare is the exception, see there).
//
// Memory comes from the kernel on first write and goes back by punching
// holes in the memfd. populate faults an entry's pages in with one
// MADV_POPULATE_WRITE before the copy, instead of one page fault per 4 KiB
// page during it. Freed pages stay resident (a free page that is allocated
// again costs nothing) until releaseAt bytes of them accumulate; then all
// free resident pages are punched at once: the Store reserves them
// (reserveFree) under its lock, punches them (punchRuns) without it and
// returns them to the free set (unreserve) under it again. A node that runs full reuses
// the pages evictions free at once, so it never reaches the threshold; a
// node that drops data (rebalancing away a share of its keys) does, and
// gives the memory back.
type arena struct {
	fd       int
	pageSize int
	npages   int
	mem      []byte   // the whole memfd, mapped shared
	used     []uint64 // bitmap: 1 = page in use
	nused    int
	hint     int // lowest word that may hold a free page

	// freeRes: 1 = page free but possibly resident (freed since the last
	// punch). nfreeRes counts its bits; at releaseAt pages (0 = never) the
	// arena punches them.
	freeRes  []uint64
	nfreeRes int
	// res: 1 = page resident (populated or handed out since the last
	// punch), so prepare skips pages that need no faulting: repopulating
	// resident pages walks their page tables for nothing (about a fifth of
	// the cost of copying into them).
	res       []uint64
	releaseAt int
	// nreserved counts pages taken out of the free set for a punch in
	// flight (reserveFree to unreserve): their used bits are set, so no
	// alloc hands them out while the kernel drops them, but they are no
	// entry's and no tier is charged for them.
	nreserved int
	// populate is false once the kernel has refused MADV_POPULATE_WRITE
	// (before Linux 5.14); pages then fault in as they are written.
	populate atomic.Bool
	// punched counts hole punches, for tests.
	punched int
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
	fresh bool // some pages were not resident when allocated
}

// newArena maps bytes (rounded down to pages) of memfd. Freed pages go back
// to the OS once releaseBytes of them are resident; 0 means never.
func newArena(bytes int64, pageSize int, prefault bool, releaseBytes int64) (*arena, error) {
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
	a := &arena{fd: fd, pageSize: pageSize, npages: npages, mem: mem, used: make([]uint64, (npages+63)/64),
		freeRes: make([]uint64, (npages+63)/64), res: make([]uint64, (npages+63)/64)}
	if prefault {
		for w := range a.res {
			a.res[w] = ^uint64(0)
		}
	}
	a.populate.Store(true)
	if releaseBytes > 0 {
		a.releaseAt = int(max(1, min(releaseBytes/int64(pageSize), int64(npages))))
	}
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

func (a *arena) freePages() int { return a.npages - a.nused - a.nreserved }

// reservedPages is how many pages a punch in flight holds back.
func (a *arena) reservedPages() int { return a.nreserved }

// freeResidentPages is how many free pages are still resident: freed since
// the last punch, or reserved by one in flight.
func (a *arena) freeResidentPages() int { return a.nfreeRes + a.nreserved }

// punchDue reports whether enough freed pages are resident to return them
// to the OS.
func (a *arena) punchDue() bool { return a.releaseAt > 0 && a.nfreeRes >= a.releaseAt }

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
			mask := (^uint64(0) >> (64 - l)) << b
			a.used[w] |= mask
			if a.res[w]&mask != mask {
				sp.fresh = true
				a.res[w] |= mask
			}
			if r := a.freeRes[w] & mask; r != 0 {
				a.freeRes[w] &^= r
				a.nfreeRes -= bits.OnesCount64(r)
			}
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
			if a.freeRes[p/64]&(1<<(p%64)) == 0 {
				a.freeRes[p/64] |= 1 << (p % 64)
				a.nfreeRes++
			}
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

// reserveFree takes every free resident page out of the free set, as
// maximal runs, for punchRuns to return to the OS without the Store's lock;
// unreserve gives them back. A reserved page is neither free nor resident
// (the next alloc of it faults it in again).
func (a *arena) reserveFree() []run {
	var runs []run
	for w, word := range a.freeRes {
		if word == 0 {
			continue
		}
		a.used[w] |= word
		a.res[w] &^= word
		a.freeRes[w] = 0
		for word != 0 {
			b := bits.TrailingZeros64(word)
			l := bits.TrailingZeros64(^(word >> b))
			if b+l > 64 {
				l = 64 - b
			}
			p := uint32(w*64 + b)
			if k := len(runs); k > 0 && runs[k-1].first+runs[k-1].n == p {
				runs[k-1].n += uint32(l)
			} else {
				runs = append(runs, run{first: p, n: uint32(l)})
			}
			if l == 64 {
				word = 0
			} else {
				word &^= (^uint64(0) >> (64 - l)) << b
			}
		}
	}
	a.nreserved += a.nfreeRes
	a.nfreeRes = 0
	a.advanceHint()
	return runs
}

// punchRuns returns runs to the OS, one fallocate(PUNCH_HOLE) per run, and
// reports how many pages it released. It touches only the memfd, so it runs
// without the Store's lock, on pages reserveFree took out of the free set.
func (a *arena) punchRuns(runs []run) (pages int) {
	ps := int64(a.pageSize)
	for _, r := range runs {
		// Failure (a kernel without hole punching in shmem) only leaves
		// the pages resident; they stay usable.
		if unix.Fallocate(a.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE,
			int64(r.first)*ps, int64(r.n)*ps) == nil {
			pages += int(r.n)
		}
	}
	return pages
}

// unreserve returns the pages of a finished punch to the free set.
func (a *arena) unreserve(runs []run) {
	for _, r := range runs {
		for p := r.first; p < r.first+r.n; p++ {
			a.used[p/64] &^= 1 << (p % 64)
		}
		if w := int(r.first / 64); w < a.hint {
			a.hint = w
		}
		a.nreserved -= int(r.n)
	}
	a.punched += len(runs)
}

// prepare faults in the pages behind view before the caller writes them:
// one MADV_POPULATE_WRITE walks the range in the kernel, where a first
// write would take a fault per 4 KiB page. Pages already resident are left
// as they are, so it is cheap on reused pages and safe to run without the
// Store's lock on pages the caller owns. A scattered entry's own mapping
// was populated when it was made.
func (a *arena) prepare(sp *pageSpan) {
	if !sp.fresh || !a.populate.Load() || sp.own != nil || len(sp.view) == 0 {
		return
	}
	off := int(sp.runs[0].first) * a.pageSize
	n := int(sp.runs[0].n) * a.pageSize
	if err := unix.Madvise(a.mem[off:off+n], unix.MADV_POPULATE_WRITE); err != nil {
		// EINVAL: before 5.14. Anything else (ENOMEM under memory
		// pressure) leaves the copy to fault the pages in, or fail the same way.
		if err == unix.EINVAL {
			a.populate.Store(false)
		}
	}
}
