package kvtier

import (
	"github.com/kvmesh/kvmesh/chunk"
)

// idle ends a move of e and wakes whoever waits for it.
func (s *Store) idle(e *entry) {
	e.busy = false
	s.moved.Broadcast()
}

func (s *Store) link(e *entry) {
	s.index[e.key] = e
	g := groupKey{e.key.Fingerprint, e.key.Content}
	s.groups[g] = append(s.groups[g], e)
	s.recount(e)
}

func (s *Store) unlink(e *entry) {
	if s.index[e.key] == e {
		delete(s.index, e.key)
	}
	g := groupKey{e.key.Fingerprint, e.key.Content}
	vs := s.groups[g]
	for i, v := range vs {
		if v == e {
			vs[i] = vs[len(vs)-1]
			vs[len(vs)-1] = nil
			vs = vs[:len(vs)-1]
			break
		}
	}
	if len(vs) == 0 {
		delete(s.groups, g)
	} else {
		s.groups[g] = vs
	}
	s.recount(e)
}

// recount keeps the per-tier entry and byte counts that Stats reports: an
// entry counts, in the tier it lives in, while it is the index's entry for
// its key and not loading. Nothing else calls it: the index changes (link,
// unlink) and the setters below, the only writers of where an entry lives
// (dram, diskRel, dev) and of loading, do, so the counts cannot drift from
// the fields. Calling it when nothing changed is harmless.
func (s *Store) recount(e *entry) {
	want := !e.loading && s.index[e.key] == e
	if e.counted && (!want || e.ct != e.tier()) {
		s.tiers[e.ct].entries--
		s.tiers[e.ct].stored -= int64(e.size)
		s.reuse[e.reuse].Entries--
		s.reuse[e.reuse].StoredBytes -= int64(e.size)
		e.counted = false
	}
	if want && !e.counted {
		e.ct = e.tier()
		s.tiers[e.ct].entries++
		s.tiers[e.ct].stored += int64(e.size)
		s.reuse[e.reuse].Entries++
		s.reuse[e.reuse].StoredBytes += int64(e.size)
		e.counted = true
	}
}

// setDRAM makes c (nil: none) e's DRAM copy.
func (s *Store) setDRAM(e *entry, c *dramCopy) {
	e.dram = c
	s.recount(e)
}

// setDisk makes the file rel of size bytes ("" and 0: none) e's disk copy.
func (s *Store) setDisk(e *entry, rel string, size int64) {
	e.diskRel, e.diskSize = rel, size
	s.recount(e)
}

// setDev makes c (nil: none) e's device copy.
func (s *Store) setDev(e *entry, c *devCopy) {
	e.dev = c
	s.recount(e)
}

// loaded ends e's put: it becomes visible, and counts.
func (s *Store) loaded(e *entry) {
	e.loading = false
	s.recount(e)
}

// enterPolicy puts e in tier t's policy, charged cost bytes (already in used).
func (s *Store) enterPolicy(t Tier, e *entry, cost int64) {
	ts := &s.tiers[t]
	e.pn = pnode{cost: cost, key: e.key, owner: e, reuse: e.reuse}
	e.pol = ts.pol
	ts.pol.add(&e.pn)
}

func (s *Store) leavePolicy(e *entry, evicted bool) {
	if e.pol == nil {
		return
	}
	if evicted {
		e.pol.evict(&e.pn)
	} else {
		e.pol.remove(&e.pn)
	}
	e.pol = nil
}

// dropDRAM detaches e's pages, freeing them unless pinned or in use.
func (s *Store) dropDRAM(e *entry) {
	c := e.dram
	if c == nil {
		return
	}
	s.setDRAM(e, nil)
	c.detached = true
	s.maybeFreeDRAM(c)
}

func (s *Store) maybeFreeDRAM(c *dramCopy) {
	if c.detached && c.pins.Load() == 0 && c.io == 0 && c.span.pages > 0 {
		s.tiers[TierDRAM].used -= int64(c.span.pages) * int64(s.arena.pageSize)
		if !s.freed {
			s.arena.release(&c.span)
		}
	}
}

func (s *Store) dropDisk(e *entry) {
	if e.diskRel == "" {
		return
	}
	if err := s.disk.remove(e.diskRel); err != nil {
		s.log.Warn("kvtier: removing disk entry", "err", err)
	}
	s.tiers[TierDisk].used -= e.diskSize
	s.setDisk(e, "", 0)
}

func (s *Store) dropDev(e *entry) {
	c := e.dev
	if c == nil {
		return
	}
	s.setDev(e, nil)
	c.detached = true
	s.maybeFreeDev(c)
}

func (s *Store) maybeFreeDev(c *devCopy) {
	if c.detached && c.pins == 0 && c.size > 0 && !s.freed {
		if err := s.cfg.GPU.Free(c.ptr); err != nil {
			s.log.Warn("kvtier: freeing device memory", "err", err)
		}
		s.tiers[TierGPU].used -= c.size
		c.size = 0
	}
}

// remove takes e out of the index and frees what it holds that no one is
// using; a goroutine moving e (busy or loading) frees the rest.
func (s *Store) remove(e *entry) {
	if e.dead {
		return
	}
	e.dead = true
	s.unlink(e)
	s.leavePolicy(e, false)
	if e.busy || e.loading {
		return
	}
	s.dropDRAM(e)
	s.dropDisk(e)
	s.dropDev(e)
}

func (s *Store) lookup(k chunk.Key) *entry {
	e := s.index[k]
	if e == nil || e.loading {
		return nil
	}
	if e.expires != 0 && e.expires <= s.now() {
		if !e.busy {
			s.remove(e)
		}
		return nil
	}
	return e
}

// Best returns the best stored encoding of content for a chunk wanted in
// context want, ranked by chunk.Better: want itself (chunk.MatchExact), else
// another encoding (chunk.MatchApproximate), else chunk.MatchMiss. Entries of
// other fingerprints never match.
func (s *Store) Best(fp chunk.Fingerprint, content chunk.ID, want chunk.Context) (chunk.Key, chunk.Match, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return chunk.Key{}, chunk.MatchMiss, ErrClosed
	}
	now := s.now()
	var best *entry
	for _, e := range s.groups[groupKey{fp, content}] {
		if e.loading || e.dead || (e.expires != 0 && e.expires <= now) {
			continue
		}
		if e.key.Context == want {
			return e.key, chunk.MatchExact, nil
		}
		if best == nil || chunk.Better(want, e.key.Context, best.key.Context) {
			best = e
		}
	}
	if best == nil {
		return chunk.Key{}, chunk.MatchMiss, nil
	}
	return best.key, chunk.MatchApproximate, nil
}

// Encodings returns the keys stored of content for the model fp, every
// context (an opaque value's versions), in no order.
func (s *Store) Encodings(fp chunk.Fingerprint, content chunk.ID) []chunk.Key {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil
	}
	now := s.now()
	var out []chunk.Key
	for _, e := range s.groups[groupKey{fp, content}] {
		if !e.loading && !e.dead && (e.expires == 0 || e.expires > now) {
			out = append(out, e.key)
		}
	}
	return out
}

// Contains reports whether key is stored (in any tier).
// It takes the exclusive lock only to drop an expired entry.
func (s *Store) Contains(key chunk.Key) bool {
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return false
	}
	e := s.index[key]
	expired := e != nil && e.expires != 0 && e.expires <= s.now()
	has := e != nil && !e.loading && !expired
	s.mu.RUnlock()
	if !expired {
		return has
	}
	s.mu.Lock()
	defer s.unlock()
	return !s.closed && s.lookup(key) != nil
}

// Delete removes key from every tier. Pinned bytes stay readable through
// the Bytes Get lent and are freed at the last Release.
func (s *Store) Delete(key chunk.Key) error { return s.delete(key, 0, false) }

// DeleteIf removes key from every tier only while the checksum of its
// stored blob is checksum, checked and removed under the store lock: a
// caller that handed a copy on can drop its own without dropping bytes
// stored since. Other bytes fail with ErrConflict, an absent key with
// ErrNotFound.
func (s *Store) DeleteIf(key chunk.Key, checksum uint64) error { return s.delete(key, checksum, true) }

// delete removes key's entry; with check, only if its checksum matches.
func (s *Store) delete(key chunk.Key, checksum uint64, check bool) error {
	s.mu.Lock()
	defer s.unlock()
	if s.closed {
		return ErrClosed
	}
	e := s.lookup(key)
	if e == nil {
		return ErrNotFound
	}
	if check && e.checksum != checksum {
		return ErrConflict
	}
	s.remove(e)
	return nil
}

// Scan calls fn for every stored entry (in no particular order) until fn
// returns false: its key (whose Content is what the ring places), the
// checksum of its blob and the blob's size. It drops expired entries as it
// goes, so a periodic Scan is also the TTL sweep. It iterates a snapshot taken
// under the lock and calls fn without it, so fn may call the Store.
func (s *Store) Scan(fn func(key chunk.Key, checksum uint64, size int) bool) {
	type item struct {
		k    chunk.Key
		sum  uint64
		size int
	}
	s.mu.Lock()
	now := s.now()
	items := make([]item, 0, len(s.index))
	for _, e := range s.index {
		if e.loading {
			continue
		}
		if e.expires != 0 && e.expires <= now {
			if !e.busy {
				s.remove(e) // the scan doubles as the TTL sweep
			}
			continue
		}
		items = append(items, item{e.key, e.checksum, e.size})
	}
	s.unlock()
	for _, it := range items {
		if !fn(it.k, it.sum, it.size) {
			return
		}
	}
}
