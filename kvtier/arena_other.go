//go:build !linux

package kvtier

import "errors"

// The DRAM arena needs memfd; elsewhere Open fails. These stubs keep the
// package compiling.

type arena struct {
	pageSize, npages, nused int
}

type run struct{ first, n uint32 }

type pageSpan struct {
	runs  []run
	pages int
	view  []byte
}

func newArena(int64, int, bool, int64) (*arena, error) {
	return nil, errors.New("kvtier: the DRAM arena needs Linux (memfd)")
}

func (a *arena) close() error          { return nil }
func (a *arena) freePages() int        { return 0 }
func (a *arena) pagesFor(size int) int { return 0 }
func (a *arena) alloc(n, size int) (pageSpan, error) {
	return pageSpan{}, errors.New("kvtier: no arena")
}
func (a *arena) release(sp *pageSpan)   {}
func (a *arena) reservedPages() int     { return 0 }
func (a *arena) freeResidentPages() int { return 0 }
func (a *arena) punchDue() bool         { return false }
func (a *arena) reserveFree() []run     { return nil }
func (a *arena) punchRuns([]run) int    { return 0 }
func (a *arena) unreserve([]run)        {}
func (a *arena) prepare(sp *pageSpan)   {}
