package kvtier

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/pinned"
)

// ErrWrongCodec: GetDevice was asked for an entry in other codecs than
// the one it is stored in; it was not moved.
var ErrWrongCodec = errors.New("kvtier: entry stored in another codec")

// DeviceHandle is a pinned entry in device memory: the GPU tier keeps it
// there, at Ptr, until Release.
type DeviceHandle struct {
	s    *Store
	c    *devCopy
	Ptr  DevicePtr
	Size int64
	// Header is the entry's header, parsed on the host when the entry
	// entered the GPU tier, from bytes whose every layer then matched its
	// checksum: the device copy is those bytes. A reader needs no
	// device-to-host read to find a layer (Ptr + PayloadStart + the
	// layer's Offset). It is shared: read it, never modify it.
	Header *chunk.Header
	done   bool
}

// Release unpins the device copy; calling it again does nothing.
func (h *DeviceHandle) Release() {
	h.s.mu.Lock()
	defer h.s.unlock()
	if h.done {
		return
	}
	h.done = true
	h.s.unpinDev(h.c)
}

// pinDev pins a device copy: it stays in device memory, and counts as
// pinned, until unpinDev. mu held.
func (s *Store) pinDev(c *devCopy) {
	if c.pins == 0 {
		s.pinnedBytes[TierGPU].Add(c.size)
	}
	c.pins++
}

// unpinDev undoes pinDev, freeing the copy if it was the last pin of a
// detached one. mu held.
func (s *Store) unpinDev(c *devCopy) {
	c.pins--
	if c.pins == 0 {
		s.pinnedBytes[TierGPU].Add(-c.size)
	}
	s.maybeFreeDev(c)
}

// GetDevice returns the entry under key pinned in device memory, promoting
// it there from DRAM or disk (the GPU tier's victims are demoted to DRAM).
// It is for the local engine, which injects from device memory. With
// codecs, an entry stored in another codec is not moved (ErrWrongCodec):
// a reader that cannot decode it on the device reads it with Get.
//
// An entry enters the GPU tier only from host bytes whose header parses
// under Config.Limits, names key, and whose every layer matches its
// checksum; other bytes stay where they are and GetDevice fails with
// chunk.ErrCorrupt (a reader of them with Get finds the same).
func (s *Store) GetDevice(ctx context.Context, key chunk.Key, codecs ...chunk.Codec) (*DeviceHandle, error) {
	s.mu.Lock()
	defer s.unlock()
	if s.cfg.GPU == nil {
		return nil, fmt.Errorf("%w: no GPU tier", ErrNoSpace)
	}
	for {
		if s.closed {
			return nil, ErrClosed
		}
		e := s.lookup(key)
		if e == nil {
			s.countMisses(numTiers)
			return nil, ErrNotFound
		}
		if len(codecs) > 0 && !slices.Contains(codecs, e.codec) {
			return nil, fmt.Errorf("%w: %v, wanted one of %v", ErrWrongCodec, e.codec, codecs)
		}
		if e.dev != nil {
			s.countMisses(TierGPU)
			s.tiers[TierGPU].hits.Add(1)
			if e.pol != nil {
				e.pol.touch(&e.pn)
			}
			s.pinDev(e.dev)
			return &DeviceHandle{s: s, c: e.dev, Ptr: e.dev.ptr, Size: e.dev.size, Header: e.dev.hd}, nil
		}
		if e.busy {
			// Another goroutine is moving it; look again when it is done.
			s.moved.Wait()
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			continue
		}
		// Pin a host copy (promoting from disk to DRAM on the way).
		b, err := s.getLocked(ctx, e)
		if errors.Is(err, errMoved) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if e.busy || e.dead || e.dev != nil {
			// getLocked released the lock (a disk read), and another
			// goroutine started moving e, deleted it or put it on the GPU
			// meanwhile: look again rather than move it twice.
			s.unlocked(b.Release)
			continue
		}
		dh, err := s.promoteGPU(ctx, e, b.Bytes())
		s.unlocked(b.Release)
		return dh, err
	}
}

// getLocked is Get for an entry already looked up.
func (s *Store) getLocked(ctx context.Context, e *entry) (pinned.Bytes, error) {
	switch e.tier() {
	case TierGPU:
		b := make([]byte, e.size)
		if err := s.cfg.GPU.Read(e.dev.ptr, 0, b); err != nil {
			return pinned.Bytes{}, err
		}
		return pinned.Owned(b), nil
	case TierDRAM:
		s.countMisses(TierDRAM)
		s.tiers[TierDRAM].hits.Add(1)
		return s.pinDRAM(e), nil
	}
	s.countMisses(TierDisk)
	s.tiers[TierDisk].hits.Add(1)
	return s.promote(ctx, e)
}

// promoteGPU copies host bytes b of e into device memory and moves e to
// the GPU tier. mu held; may be released while victims are demoted.
func (s *Store) promoteGPU(ctx context.Context, e *entry, b []byte) (*DeviceHandle, error) {
	ts := &s.tiers[TierGPU]
	need := int64(e.size)
	if need > ts.budget {
		return nil, fmt.Errorf("%w: %d bytes exceed the GPU tier", ErrNoSpace, need)
	}
	e.busy = true
	defer s.idle(e)
	var ptr DevicePtr
	for {
		if ts.used+need <= ts.budget {
			p, err := s.cfg.GPU.Alloc(need)
			if err == nil {
				ptr = p
				break
			}
			if !errors.Is(err, ErrDeviceFull) {
				return nil, fmt.Errorf("kvtier: device alloc: %w", err)
			}
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		v := ts.pol.victim(func(p *pnode) bool {
			o := p.owner
			return o.busy || o.dev == nil || o.dev.pins > 0
		})
		if v == nil {
			return nil, fmt.Errorf("%w: GPU tier holds only pinned entries", ErrNoSpace)
		}
		s.demoteGPU(ctx, v.owner)
	}
	// Charge the bytes before the lock is released for the copy (which
	// takes milliseconds for a large entry on a real device), so that a
	// concurrent promotion sees them; e is busy, so nothing else moves it.
	ts.used += need
	var (
		hd         *chunk.Header
		verr, werr error
	)
	s.unlocked(func() {
		// Checked here, once, because no reader of the device copy can
		// check it without copying it back.
		if hd, verr = verifyEntry(b, e.key, s.cfg.Limits); verr == nil {
			werr = s.cfg.GPU.Write(ptr, 0, b)
		}
	})
	if werr == nil && verr == nil && s.closed {
		werr = ErrClosed
	}
	if verr != nil || werr != nil {
		ts.used -= need
		if !s.freed {
			_ = s.cfg.GPU.Free(ptr)
		}
		switch {
		case verr != nil:
			return nil, fmt.Errorf("kvtier: %v not moved to the GPU tier: %w", e.key, verr)
		case errors.Is(werr, ErrClosed):
			return nil, werr
		}
		return nil, fmt.Errorf("kvtier: device write: %w", werr)
	}
	c := &devCopy{ptr: ptr, size: need, hd: hd}
	if e.dead { // deleted meanwhile: its other copies are ours to drop
		c.detached = true
		s.maybeFreeDev(c)
		s.dropDRAM(e)
		s.dropDisk(e)
		return nil, ErrNotFound
	}
	s.leavePolicy(e, false)
	s.dropDRAM(e)
	s.dropDisk(e)
	s.setDev(e, c)
	s.enterPolicy(TierGPU, e, need)
	ts.stats.Promotions++
	s.pinDev(c)
	return &DeviceHandle{s: s, c: c, Ptr: ptr, Size: need, Header: hd}, nil
}

// verifyEntry parses blob's header and checks that it names key and that
// every layer matches its checksum. Its errors wrap chunk.ErrCorrupt.
func verifyEntry(blob []byte, key chunk.Key, lim chunk.Limits) (*chunk.Header, error) {
	corrupt := func(err error) error {
		if errors.Is(err, chunk.ErrCorrupt) {
			return err
		}
		return fmt.Errorf("%w: %w", chunk.ErrCorrupt, err)
	}
	hd, err := chunk.ParseHeader(blob, lim)
	if err != nil {
		return nil, corrupt(err)
	}
	if hd.Key != key {
		return nil, fmt.Errorf("%w: header names %v", chunk.ErrCorrupt, hd.Key)
	}
	for l := range hd.Layers {
		if _, err := hd.LayerPayload(blob, l); err != nil {
			return nil, corrupt(err)
		}
	}
	return &hd, nil
}

// demoteGPU moves e from the GPU tier to DRAM (which may demote to disk),
// or drops it when DRAM cannot make room. mu held; may be released.
func (s *Store) demoteGPU(ctx context.Context, e *entry) {
	ts := &s.tiers[TierGPU]
	s.leavePolicy(e, true)
	e.busy = true
	c, err := s.allocDRAM(ctx, e.size)
	if err == nil && !e.dead && e.dev.pins == 0 {
		// The copy runs without the lock; e stays busy, so only a pin
		// (checked below) or a delete (e.dead) can happen to it meanwhile.
		dev := e.dev
		s.unlocked(func() {
			s.arena.prepare(&c.span)
			err = s.cfg.GPU.Read(dev.ptr, 0, c.span.view)
		})
	}
	s.idle(e)
	if err == nil && !e.dead && e.dev.pins > 0 {
		// Pinned while DRAM made room or the bytes came over: pins win,
		// it stays on the GPU.
		c.detached = true
		s.maybeFreeDRAM(c)
		s.enterPolicy(TierGPU, e, e.dev.size)
		return
	}
	if err != nil || e.dead {
		if c != nil {
			c.detached = true
			s.maybeFreeDRAM(c)
		}
		if !e.dead {
			ts.stats.Evictions++
			s.remove(e)
			s.dropped(e.key)
		} else {
			s.dropDev(e)
		}
		return
	}
	s.dropDev(e)
	s.setDRAM(e, c)
	s.enterPolicy(TierDRAM, e, int64(c.span.pages)*int64(s.arena.pageSize))
	ts.stats.Demotions++
}
