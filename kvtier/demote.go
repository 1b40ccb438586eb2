package kvtier

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"

	"github.com/kvmesh/kvmesh/chunk"
)

// demoteDRAM moves e from DRAM to disk if the disk tier can take it, else
// drops it. Called with mu held; may release it.
func (s *Store) demoteDRAM(ctx context.Context, e *entry) {
	ts := &s.tiers[TierDRAM]
	s.leavePolicy(e, true)
	if s.disk == nil || !s.reserveDisk(int64(e.size)) {
		ts.stats.Evictions++
		s.reuse[e.reuse].Evicted++
		s.remove(e)
		if s.disk != nil {
			s.dropped(e.key)
		}
		return
	}
	e.busy = true
	c := e.dram
	c.io++
	var rel string
	var size int64
	var err error
	s.unlocked(func() { rel, size, err = s.disk.write(e.key, e.checksum, e.codec, c.span.view) })
	c.io--
	s.idle(e)
	s.tiers[TierDisk].used -= int64(e.size)
	if err == nil {
		s.diskWritten()
		s.tiers[TierDisk].used += size
	}
	switch {
	case err != nil:
		s.diskWriteFailed(e.key, err)
		ts.stats.Evictions++
		s.reuse[e.reuse].Evicted++
		s.remove(e)
		s.maybeFreeDRAM(c)
		s.dropped(e.key)
	case e.dead:
		_ = s.disk.remove(rel)
		s.tiers[TierDisk].used -= size
		s.setDRAM(e, nil)
		c.detached = true
		s.maybeFreeDRAM(c)
	case c.pins.Load() > 0:
		// Pinned while it was written: pins win, it stays in DRAM.
		_ = s.disk.remove(rel)
		s.tiers[TierDisk].used -= size
		s.enterPolicy(TierDRAM, e, int64(c.span.pages)*int64(s.arena.pageSize))
	default:
		s.dropDRAM(e)
		s.setDisk(e, rel, size)
		s.enterPolicy(TierDisk, e, size)
		ts.stats.Demotions++
	}
}

// dropped reports a copy dropped for want of room below its tier
// (Config.OnDropped). mu held.
func (s *Store) dropped(key chunk.Key) {
	if s.cfg.OnDropped != nil {
		s.cfg.OnDropped(key)
	}
}

// reserveDisk charges n bytes to the disk tier, evicting disk entries
// (dropped: there is no lower tier) until they fit.
func (s *Store) reserveDisk(n int64) bool {
	ts := &s.tiers[TierDisk]
	if n > ts.budget {
		return false
	}
	// A tier over its budget (recovered so) shrinks by n with each write
	// of n bytes, evicting by policy, so that the excess goes as entries
	// come rather than all at once.
	limit := ts.budget
	if ts.used > ts.budget {
		limit = max(ts.budget, ts.used-n)
	}
	for ts.used+n > limit {
		v := ts.pol.victim(func(p *pnode) bool { return p.owner.busy })
		if v == nil {
			return false
		}
		s.leavePolicy(v.owner, true)
		ts.stats.Evictions++
		s.reuse[v.owner.reuse].Evicted++
		s.remove(v.owner)
	}
	ts.used += n
	return true
}

// writeDisk writes a loading entry straight to disk. mu held; released
// around the write.
func (s *Store) writeDisk(ctx context.Context, e *entry, blob []byte) (string, int64, error) {
	if !s.reserveDisk(int64(len(blob))) {
		return "", 0, fmt.Errorf("%w: disk tier cannot make room for %d bytes", ErrNoSpace, len(blob))
	}
	var rel string
	var size int64
	var err error
	s.unlocked(func() { rel, size, err = s.disk.write(e.key, e.checksum, e.codec, blob) })
	s.tiers[TierDisk].used -= int64(len(blob))
	if err != nil {
		s.diskWriteFailed(e.key, err)
		return "", 0, err
	}
	s.diskWritten()
	s.tiers[TierDisk].used += size
	return rel, size, nil
}

// diskWriteFailed counts a failed disk write. A file system out of space
// (ENOSPC, a quota, a short write) is a state, not an event per entry:
// the disk tier's budget drops to what it holds, so that later writes
// evict older disk entries by policy to make room instead of failing one
// by one, and the log says so once, not once per entry. A start sizes
// the budget against the file system again. mu held.
func (s *Store) diskWriteFailed(key chunk.Key, err error) {
	ts := &s.tiers[TierDisk]
	ts.stats.WriteErrors++
	if !noSpace(err) {
		s.log.Warn("kvtier: disk write failed", "key", key, "err", err)
		return
	}
	ts.stats.NoSpaceErrors++
	if ts.used < ts.budget {
		s.log.Warn("kvtier: the disk tier's file system is out of space; its budget drops to what it holds, and new entries evict older ones",
			"budget", ts.budget, "now", ts.used, "dir", s.cfg.DiskDir, "err", err)
		ts.budget = ts.used
	}
	s.diskFull = true
}

// diskWritten ends the out-of-space state once a write succeeds. mu held.
func (s *Store) diskWritten() {
	if s.diskFull {
		s.log.Info("kvtier: disk writes succeed again", "budget", s.tiers[TierDisk].budget)
		s.diskFull = false
	}
}

// noSpace reports whether err is a file system out of room.
func noSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) || errors.Is(err, io.ErrShortWrite)
}
