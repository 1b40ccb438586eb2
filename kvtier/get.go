package kvtier

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/pinned"
)

func (s *Store) countMisses(upTo Tier) {
	for t := TierGPU; t < upTo; t++ {
		if t == TierGPU && s.cfg.GPU == nil || t == TierDisk && s.disk == nil {
			continue
		}
		s.tiers[t].misses.Add(1)
	}
}

// getShared is Get's fast path, under the read lock: a DRAM hit (or a
// miss) with a policy that records hits without the write lock. ok is
// false when the slow path must decide (another tier, an expired entry,
// a closed store).
func (s *Store) getShared(key chunk.Key) (b pinned.Bytes, found, ok bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return b, false, false
	}
	e := s.index[key]
	if e == nil {
		s.countMisses(numTiers)
		return b, false, true
	}
	if e.loading || e.dram == nil || e.dev != nil || (e.expires != 0 && e.expires <= s.now()) {
		return b, false, false
	}
	s.countMisses(TierDRAM)
	s.tiers[TierDRAM].hits.Add(1)
	if e.pol != nil {
		e.pol.touchShared(&e.pn)
	}
	return s.pinDRAM(e), true, true
}

// Get lends the encoded entry under key; the holder must Release it. A
// DRAM hit is a view of the arena, pinned (the pages stay, and the entry
// stays in DRAM) until Release. A hit on disk promotes the entry to DRAM
// when DRAM can make room (else it is read into a private, Owned buffer);
// a hit on the GPU tier is copied out of device memory (Owned).
func (s *Store) Get(ctx context.Context, key chunk.Key) (pinned.Bytes, error) {
	b, _, err := s.get(ctx, key)
	return b, err
}

// get is Get that also tells the tier the entry was found in.
func (s *Store) get(ctx context.Context, key chunk.Key) (pinned.Bytes, Tier, error) {
	if s.sharedHits {
		if b, found, ok := s.getShared(key); ok {
			if !found {
				return b, 0, ErrNotFound
			}
			return b, TierDRAM, nil
		}
	}
	s.mu.Lock()
	defer s.unlock()
	for {
		if s.closed {
			return pinned.Bytes{}, 0, ErrClosed
		}
		e := s.lookup(key)
		if e == nil {
			s.countMisses(numTiers)
			return pinned.Bytes{}, 0, ErrNotFound
		}
		t := e.tier()
		switch t {
		case TierGPU:
			s.countMisses(TierGPU)
			s.tiers[TierGPU].hits.Add(1)
			if e.pol != nil {
				e.pol.touch(&e.pn)
			}
			// Pin the device copy and read it without the lock: a
			// device-to-host copy of a large entry takes milliseconds.
			c := e.dev
			s.pinDev(c)
			b := make([]byte, e.size)
			var err error
			s.unlocked(func() { err = s.cfg.GPU.Read(c.ptr, 0, b) })
			s.unpinDev(c)
			if err != nil {
				return pinned.Bytes{}, 0, fmt.Errorf("kvtier: reading device copy: %w", err)
			}
			return pinned.Owned(b), TierGPU, nil
		case TierDRAM:
			s.countMisses(TierDRAM)
			s.tiers[TierDRAM].hits.Add(1)
			if e.pol != nil {
				e.pol.touch(&e.pn)
			}
			return s.pinDRAM(e), TierDRAM, nil
		}
		s.countMisses(TierDisk)
		s.tiers[TierDisk].hits.Add(1)
		b, err := s.promote(ctx, e)
		if !errors.Is(err, errMoved) {
			return b, TierDisk, err
		}
		// The file went away under a concurrent move: look again.
	}
}

// promote reads a disk entry into DRAM (or a private buffer when DRAM has
// no room or another goroutine is already promoting it). mu held; released
// around I/O.
func (s *Store) promote(ctx context.Context, e *entry) (pinned.Bytes, error) {
	if e.busy {
		return s.readDiskHeap(e)
	}
	e.busy = true
	c, err := s.allocDRAM(ctx, e.size)
	if err != nil {
		s.idle(e)
		if e.dead {
			s.dropDisk(e)
			return pinned.Bytes{}, ErrNotFound
		}
		if ctx.Err() != nil {
			return pinned.Bytes{}, ctx.Err()
		}
		return s.readDiskHeap(e)
	}
	c.io++
	rel := e.diskRel
	var rerr error
	s.unlocked(func() {
		s.arena.prepare(&c.span)
		_, rerr = s.disk.read(rel, e.checksum, e.size, c.span.view)
	})
	c.io--
	s.idle(e)
	if rerr != nil || e.dead {
		c.detached = true
		s.maybeFreeDRAM(c)
		if e.dead {
			s.dropDisk(e)
			return pinned.Bytes{}, ErrNotFound
		}
		s.log.Warn("kvtier: dropping unreadable disk entry", "key", e.key, "err", rerr)
		if errors.Is(rerr, ErrDamaged) {
			s.tiers[TierDisk].stats.Damaged++
		}
		s.remove(e)
		return pinned.Bytes{}, fmt.Errorf("kvtier: get %v: %w", e.key, rerr)
	}
	s.leavePolicy(e, false)
	s.dropDisk(e)
	s.setDRAM(e, c)
	e.codec = chunk.Codec(0)
	if hd, err := chunk.ParseHeader(c.span.view, s.cfg.Limits); err == nil {
		e.codec = hd.Codec
	}
	s.enterPolicy(TierDRAM, e, int64(c.span.pages)*int64(s.arena.pageSize))
	s.tiers[TierDRAM].stats.Promotions++
	return s.pinDRAM(e), nil
}

func (s *Store) readDiskHeap(e *entry) (pinned.Bytes, error) {
	rel, sum, size := e.diskRel, e.checksum, e.size
	var b []byte
	var err error
	s.unlocked(func() { b, err = s.disk.read(rel, sum, size, nil) })
	if errors.Is(err, os.ErrNotExist) {
		return pinned.Bytes{}, errMoved
	}
	if err != nil {
		if errors.Is(err, ErrDamaged) && e.diskRel == rel && !e.dead {
			s.log.Warn("kvtier: dropping unreadable disk entry", "key", e.key, "err", err)
			s.tiers[TierDisk].stats.Damaged++
			s.remove(e)
		}
		return pinned.Bytes{}, fmt.Errorf("kvtier: get %v: %w", e.key, err)
	}
	return pinned.Owned(b), nil
}
