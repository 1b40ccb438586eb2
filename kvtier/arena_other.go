//go:build !linux

package kvtier

import "errors"

type arena struct {
	pageSize, npages int
}

type pageSpan struct {
	pages int
	view  []byte
}

func newArena(int64, int) (*arena, error) {
	return nil, errors.New("kvtier: the DRAM arena needs Linux (memfd)")
}

func (a *arena) close() error          { return nil }
func (a *arena) freePages() int        { return 0 }
func (a *arena) pagesFor(size int) int { return 0 }
func (a *arena) alloc(n, size int) (pageSpan, error) {
	return pageSpan{}, errors.New("kvtier: no arena")
}
func (a *arena) release(sp *pageSpan) {}
