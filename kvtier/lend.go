package kvtier

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
	"github.com/kvmesh/kvmesh/chunk"
)

// Loan is DRAM pages that Lend lent for the borrower to write an entry
// into, typically a body as it arrives off the network. Put of exactly
// Bytes() adopts the pages as the entry's DRAM copy instead of copying
// them. The borrower may write into Bytes until it passes them to Put,
// may read them until Release, and must call Release exactly once;
// afterwards neither the slice nor any sub-slice of it may be used.
type Loan struct {
	s    *Store
	c    *dramCopy
	done atomic.Bool
}

// Bytes returns the lent pages as one contiguous slice of the size asked.
func (l *Loan) Bytes() []byte { return l.c.span.view }

// Release ends the loan. Pages that no entry took go back to the arena;
// those an entry took stay with it (as a pin would) and are freed with the
// entry if it is already gone. A second Release does nothing.
func (l *Loan) Release() {
	if !l.done.CompareAndSwap(false, true) {
		return
	}
	s, c := l.s, l.c
	s.mu.Lock()
	defer s.unlock()
	delete(s.loans, &c.span.view[0])
	s.lentBytes -= int64(c.span.pages) * int64(s.arena.pageSize)
	if c.pins.Add(-1) == 0 {
		s.pinnedBytes[TierDRAM].Add(-int64(len(c.span.view)))
	}
	s.maybeFreeDRAM(c)
}

// Lend allocates size bytes of DRAM pages, as a Put of that size would
// (evicting or demoting victims to make room), for the caller to write an
// entry into and then Put without a copy. The pages count against the
// DRAM tier, and are pinned, from Lend to Release. Loans together hold at
// most Config.LendBytes; beyond that, or when the DRAM tier cannot make
// room, Lend fails with an error wrapping ErrNoSpace and the caller uses
// a buffer of its own.
func (s *Store) Lend(ctx context.Context, size int) (*Loan, error) {
	if size <= 0 {
		return nil, fmt.Errorf("kvtier: lend of %d bytes", size)
	}
	s.mu.Lock()
	defer s.unlock()
	if s.closed {
		return nil, ErrClosed
	}
	// Charge the loan cap before allocDRAM, which may release the lock.
	charge := int64(s.arena.pagesFor(size)) * int64(s.arena.pageSize)
	if s.lentBytes+charge > s.cfg.LendBytes {
		return nil, fmt.Errorf("%w: %d bytes lent, %d more exceed the lending cap of %d", ErrNoSpace, s.lentBytes, charge, s.cfg.LendBytes)
	}
	s.lentBytes += charge
	c, err := s.allocDRAM(ctx, size)
	if err != nil {
		s.lentBytes -= charge
		return nil, err
	}
	// No entry holds the pages: the loan's pin keeps them until Release.
	c.detached = true
	c.pins.Store(1)
	s.pinnedBytes[TierDRAM].Add(int64(size))
	s.loans[&c.span.view[0]] = c
	c.io++
	s.unlocked(func() { s.arena.prepare(&c.span) })
	c.io--
	return &Loan{s: s, c: c}, nil
}

// adoptable returns the loan whose pages blob is exactly, when a new
// entry may take them: no entry holds them now, and no other put is
// checking them. Otherwise Put copies blob as any other. mu held.
func (s *Store) adoptable(blob []byte) *dramCopy {
	if len(blob) == 0 {
		return nil
	}
	c := s.loans[&blob[0]]
	if c == nil || len(c.span.view) != len(blob) || !c.detached || c.io > 0 {
		return nil
	}
	return c
}

// adopt makes the lent pages c the DRAM copy of e, a new (loading) entry,
// after checking every layer checksum in place. The loan keeps its pin.
// Called with mu held; releases it around the check.
func (s *Store) adopt(e *entry, c *dramCopy, hd *chunk.Header) error {
	if !s.cfg.SkipVerify {
		c.io++
		var verr error
		s.unlocked(func() { verr = verifyLayers(c.span.view, hd) })
		c.io--
		if verr != nil {
			return verr // the pages stay the loan's
		}
	}
	c.detached = false
	s.setDRAM(e, c)
	s.adopted++
	if e.dead {
		return nil
	}
	s.enterPolicy(TierDRAM, e, int64(c.span.pages)*int64(s.arena.pageSize))
	return nil
}

// verifyLayers checks each layer of blob against its checksum in hd, a
// header parsed from blob.
func verifyLayers(blob []byte, hd *chunk.Header) error {
	for l, ref := range hd.Layers {
		off := hd.PayloadStart + int(ref.Offset)
		if xxhash.Sum64(blob[off:off+int(ref.Length)]) != ref.Checksum {
			return fmt.Errorf("kvtier: put: %w: layer %d checksum mismatch", chunk.ErrCorrupt, l)
		}
	}
	return nil
}
