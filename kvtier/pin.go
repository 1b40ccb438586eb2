package kvtier

import (
	"sync/atomic"

	"github.com/kvmesh/kvmesh/pinned"
)

// dramPin is the pin a DRAM read holds on an entry's pages: Release of
// the Bytes that Get lends drops it. A pin is released at most once even
// if a holder releases copies of the Bytes.
type dramPin struct {
	s    *Store
	c    *dramCopy
	done atomic.Bool
}

// Release unpins the pages.
func (p *dramPin) Release() {
	if !p.done.CompareAndSwap(false, true) {
		return
	}
	s, c := p.s, p.c
	// The read lock orders this against the writers that detach c and
	// decide on its pins: whichever comes second frees the pages.
	s.mu.RLock()
	last := c.pins.Add(-1) == 0
	if last {
		s.pinnedBytes[TierDRAM].Add(-int64(len(c.span.view)))
	}
	free := last && c.detached
	s.mu.RUnlock()
	if free {
		// Detached copies gain no pins, so only the io count (a writer
		// mid-copy) can have changed; maybeFreeDRAM checks it again.
		s.mu.Lock()
		s.maybeFreeDRAM(c)
		s.unlock()
	}
}

// pinDRAM pins e's pages. mu held, shared or exclusive.
func (s *Store) pinDRAM(e *entry) pinned.Bytes {
	c := e.dram
	if c.pins.Add(1) == 1 {
		s.pinnedBytes[TierDRAM].Add(int64(e.size))
	}
	return pinned.New(c.span.view, &dramPin{s: s, c: c})
}
