package kvtier

import (
	"context"
	"fmt"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/kvmesh/kvmesh/chunk"
)

// PutOptions are per-entry options of Put.
type PutOptions struct {
	// TTL, when positive, expires the entry that long after the put.
	TTL time.Duration
}

// Put stores blob, an encoded chunk entry, and returns its header. Putting
// a key again with the same bytes is a no-op (it extends the TTL); with
// other bytes it fails with ErrConflict. The blob is copied: the caller
// keeps it. A blob that is exactly the bytes of a Loan of this store is
// not copied: its checksums are checked in place and the entry takes the
// loan's pages (see Lend); the caller still reads them until it releases
// the loan. Under AdmitReuse a put the policy refuses stores nothing and
// returns no error, as a cache that chose not to keep it: Stats counts it.
func (s *Store) Put(ctx context.Context, blob []byte, opts PutOptions) (chunk.Header, error) {
	// The payload's checksums are checked while it is copied (place), in
	// one pass over memory rather than two.
	hd, err := chunk.ParseHeader(blob, s.cfg.Limits)
	if err != nil {
		return hd, fmt.Errorf("kvtier: put: %w", err)
	}
	var expires int64
	if opts.TTL > 0 {
		expires = s.now() + int64(opts.TTL)
	}
	s.mu.Lock()
	defer s.unlock()
	if s.closed {
		return hd, ErrClosed
	}
	if e := s.index[hd.Key]; e != nil {
		if e.expires != 0 && e.expires <= s.now() && !e.busy && !e.loading {
			s.remove(e)
		} else {
			if e.checksum != hd.Checksum || e.size != len(blob) {
				return hd, fmt.Errorf("%w: %v has checksum %016x, put %016x", ErrConflict, hd.Key, e.checksum, hd.Checksum)
			}
			if e.expires != 0 {
				e.expires = max(e.expires, expires)
				if expires == 0 {
					e.expires = 0
				}
			}
			return hd, nil
		}
	}
	reuse := ReuseOf(hd.Key)
	rs := &s.reuse[reuse]
	if s.cfg.Admission == AdmitReuse && !s.admitReuse(hd.Key, len(blob)) {
		rs.Refused++
		rs.RefusedBytes += uint64(len(blob))
		return hd, nil
	}
	e := &entry{key: hd.Key, checksum: hd.Checksum, size: len(blob), codec: hd.Codec, expires: expires, loading: true, reuse: reuse}
	s.link(e)
	if c := s.adoptable(blob); c != nil {
		err = s.adopt(e, c, &hd)
	} else {
		err = s.place(ctx, e, blob, &hd)
	}
	s.loaded(e)
	if err != nil {
		if !e.dead {
			s.remove(e)
		}
		return hd, err
	}
	rs.Admitted++
	rs.AdmittedBytes += uint64(len(blob))
	if e.dead { // deleted while being written
		e.dead = false
		s.remove(e)
	}
	return hd, nil
}

// place stores a new (loading) entry in DRAM, or on disk when DRAM cannot
// hold it. Called with mu held; releases it around copies and I/O.
func (s *Store) place(ctx context.Context, e *entry, blob []byte, hd *chunk.Header) error {
	c, err := s.allocDRAM(ctx, e.size)
	if err == nil {
		c.io++
		var verr error
		s.unlocked(func() {
			s.arena.prepare(&c.span)
			verr = s.copyVerify(c.span.view, blob, hd)
		})
		c.io--
		if verr != nil {
			c.detached = true
			s.maybeFreeDRAM(c)
			return verr
		}
		s.setDRAM(e, c)
		if e.dead {
			return nil
		}
		s.enterPolicy(TierDRAM, e, int64(c.span.pages)*int64(s.arena.pageSize))
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if s.disk == nil {
		return err
	}
	if !s.cfg.SkipVerify {
		var verr error
		s.unlocked(func() { _, verr = chunk.Verify(blob, s.cfg.Limits) })
		if verr != nil {
			return fmt.Errorf("kvtier: put: %w", verr)
		}
	}
	rel, size, err := s.writeDisk(ctx, e, blob)
	if err != nil {
		return err
	}
	s.setDisk(e, rel, size)
	if e.dead {
		return nil
	}
	s.enterPolicy(TierDisk, e, size)
	return nil
}

// verifyBlock is how much of a layer copyVerify hashes and then copies
// while it is still in cache.
const verifyBlock = 64 << 10

// copyVerify copies blob to dst, checking each layer against its checksum
// in the header on the way (unless SkipVerify).
func (s *Store) copyVerify(dst, blob []byte, hd *chunk.Header) error {
	if s.cfg.SkipVerify {
		copy(dst, blob)
		return nil
	}
	copy(dst[:hd.PayloadStart], blob[:hd.PayloadStart]) // checked by ParseHeader
	var d xxhash.Digest
	for l, ref := range hd.Layers {
		off := hd.PayloadStart + int(ref.Offset)
		end := off + int(ref.Length)
		d.Reset()
		for p := off; p < end; p += verifyBlock {
			q := min(p+verifyBlock, end)
			_, _ = d.Write(blob[p:q])
			copy(dst[p:q], blob[p:q])
		}
		if d.Sum64() != ref.Checksum {
			return fmt.Errorf("kvtier: put: %w: layer %d checksum mismatch", chunk.ErrCorrupt, l)
		}
	}
	return nil
}

// allocDRAM makes room for and allocates size bytes of pages, demoting
// DRAM victims to disk. Called with mu held; may release it.
func (s *Store) allocDRAM(ctx context.Context, size int) (*dramCopy, error) {
	n := s.arena.pagesFor(size)
	if n > s.arena.npages {
		return nil, fmt.Errorf("%w: %d bytes exceed the DRAM tier", ErrNoSpace, size)
	}
	ts := &s.tiers[TierDRAM]
	for s.arena.freePages() < n {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if s.closed {
			return nil, ErrClosed
		}
		if r := s.arena.reservedPages(); r > 0 && s.arena.freePages()+r >= n {
			// Pages being returned to the OS will do: wait for them
			// rather than evict (the punch is bounded by ReleaseBytes).
			if s.allocWaitHook != nil {
				s.allocWaitHook()
			}
			s.moved.Wait()
			continue
		}
		v := ts.pol.victim(func(p *pnode) bool {
			o := p.owner
			return o.busy || o.dram == nil || o.dram.pins.Load() > 0 || o.dram.io > 0
		})
		if v == nil {
			return nil, fmt.Errorf("%w: DRAM holds only pinned entries", ErrNoSpace)
		}
		s.demoteDRAM(ctx, v.owner)
	}
	span, err := s.arena.alloc(n, size)
	if err != nil {
		return nil, err
	}
	ts.used += int64(n) * int64(s.arena.pageSize)
	return &dramCopy{span: span}, nil
}
