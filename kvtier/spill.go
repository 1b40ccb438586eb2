package kvtier

import "context"

// Spill writes the entries that live only in DRAM to the disk tier, as
// far as the disk tier has free room (it evicts nothing from disk for
// them), so that a store opened again on the same directory has them
// back: a node calls it before it closes. Pinned entries and entries
// already moving stay where they are. It returns how many entries and
// bytes moved; without a disk tier it moves nothing. ctx bounds it.
func (s *Store) Spill(ctx context.Context) (entries int, bytes int64) {
	if s.disk == nil {
		return 0, 0
	}
	s.mu.Lock()
	defer s.unlock()
	movable := func(e *entry) bool {
		return !e.loading && !e.busy && !e.dead && e.dram != nil && e.dram.pins.Load() == 0 && e.dram.io == 0
	}
	var cands []*entry
	for _, e := range s.index {
		if movable(e) {
			cands = append(cands, e)
		}
	}
	disk := &s.tiers[TierDisk]
	for _, e := range cands {
		if ctx.Err() != nil || s.closed {
			break
		}
		// demoteDRAM releases the lock while it writes: check again.
		if !movable(e) || disk.used+int64(e.size) > disk.budget {
			continue
		}
		s.demoteDRAM(ctx, e)
		if e.diskRel != "" && e.dram == nil {
			entries++
			bytes += int64(e.size)
		}
	}
	return entries, bytes
}
