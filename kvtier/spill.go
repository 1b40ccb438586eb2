package kvtier

import "context"

// SpillStats says what Spill wrote and what it left.
type SpillStats struct {
	// Entries and Bytes were written to the disk tier.
	Entries int
	Bytes   int64
	// NoRoom entries (NoRoomBytes) did not fit the disk tier's budget.
	NoRoom      int
	NoRoomBytes int64
	// Failed entries (FailedBytes) could not be written (the file system
	// full, an I/O error: Stats counts the errors) and were dropped.
	Failed      int
	FailedBytes int64
	// Busy entries were pinned or moving, and stayed where they were.
	Busy int
}

// Spill writes the entries that live only in DRAM to the disk tier, as
// far as the disk tier has free room (it evicts nothing from disk for
// them), so that a store opened again on the same directory has them
// back: a node calls it before it closes. Pinned entries and entries
// already moving stay where they are. It says what moved and what did
// not; without a disk tier it moves nothing. ctx bounds it.
func (s *Store) Spill(ctx context.Context) SpillStats {
	var st SpillStats
	if s.disk == nil {
		return st
	}
	s.mu.Lock()
	defer s.unlock()
	movable := func(e *entry) bool {
		return !e.loading && !e.busy && !e.dead && e.dram != nil && e.dram.pins.Load() == 0 && e.dram.io == 0
	}
	var cands []*entry
	for _, e := range s.index {
		if e.dram == nil || e.dead || e.loading {
			continue
		}
		if movable(e) {
			cands = append(cands, e)
		} else {
			st.Busy++
		}
	}
	disk := &s.tiers[TierDisk]
	for _, e := range cands {
		if ctx.Err() != nil || s.closed {
			break
		}
		// demoteDRAM releases the lock while it writes: check again.
		if !movable(e) {
			st.Busy++
			continue
		}
		if disk.used+int64(e.size) > disk.budget {
			st.NoRoom++
			st.NoRoomBytes += int64(e.size)
			continue
		}
		errs := disk.stats.WriteErrors
		s.demoteDRAM(ctx, e)
		switch {
		case e.diskRel != "" && e.dram == nil:
			st.Entries++
			st.Bytes += int64(e.size)
		case disk.stats.WriteErrors != errs:
			st.Failed++
			st.FailedBytes += int64(e.size)
		}
	}
	return st
}
