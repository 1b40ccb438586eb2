package kvtier

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/kvmesh/kvmesh/chunk"
)

// Errors callers branch on.
var (
	// ErrNotFound: no entry under the key (or it expired).
	ErrNotFound = errors.New("kvtier: not found")
	// ErrConflict: a put of a key already stored with other bytes.
	ErrConflict = errors.New("kvtier: key stored with different bytes")
	// ErrNoSpace: no tier can hold the entry (too large, or everything
	// that could make room is pinned).
	ErrNoSpace = errors.New("kvtier: no space")
	// ErrClosed: the store is closed.
	ErrClosed = errors.New("kvtier: store closed")
	// ErrDamaged: the stored copy failed its checks when read (a bit
	// flip, a torn or truncated file, an I/O error); the store dropped
	// it. It wraps the cause, often chunk.ErrCorrupt: the damage is the
	// store's, not the caller's.
	ErrDamaged = errors.New("kvtier: stored copy damaged")

	// errMoved: a disk file vanished under a concurrent move; look again.
	errMoved = errors.New("kvtier: entry moved")
)

// Tier names a storage tier, fastest first.
type Tier int

const (
	TierGPU Tier = iota
	TierDRAM
	TierDisk
	numTiers
)

func (t Tier) String() string {
	switch t {
	case TierGPU:
		return "gpu"
	case TierDRAM:
		return "dram"
	case TierDisk:
		return "disk"
	}
	return "tier(?)"
}

// entry is one stored key. Its resources (dram, diskRel, dev) say where
// it lives; normally exactly one is set. The Store's mutex guards it.
type entry struct {
	key      chunk.Key
	checksum uint64
	size     int
	codec    chunk.Codec
	expires  int64 // unix nanos; 0 = never

	dram     *dramCopy
	diskRel  string
	diskSize int64
	dev      *devCopy

	pol     policy // the policy pn is in, or nil
	pn      pnode
	reuse   Reuse
	loading bool // being put: not visible yet
	busy    bool // a move to another tier is in flight
	dead    bool // deleted or dropped; whoever holds it cleans up
	// counted says the entry is in the per-tier entry and byte counts,
	// under tier ct (see recount).
	counted bool
	ct      Tier
}

func (e *entry) tier() Tier {
	switch {
	case e.dev != nil:
		return TierGPU
	case e.dram != nil:
		return TierDRAM
	}
	return TierDisk
}

// dramCopy is an entry's pages in the arena, or pages lent by Lend that
// no entry holds yet (detached). pins counts the Gets whose Bytes are not
// yet released, plus one while the pages are lent; io counts the Store's
// own unlocked reads and writes of the view. The pages go back to the
// arena once the copy is detached from its entry and both are zero.
// pins is atomic because Get and Release change it under the read lock;
// everything that decides on it (eviction, freeing) holds the write lock,
// which excludes them.
type dramCopy struct {
	span     pageSpan
	pins     atomic.Int32
	io       int
	detached bool
}

// devCopy is an entry's allocation in device memory, and its header:
// parsed, and every layer checked against its checksum, from the host
// bytes the copy was made of, so that a reader of the device copy needs
// no device-to-host read. Read-only once set.
type devCopy struct {
	ptr      DevicePtr
	size     int64
	hd       *chunk.Header
	pins     int
	detached bool
}

type groupKey struct {
	fp      chunk.Fingerprint
	content chunk.ID
}

type tierState struct {
	pol    policy
	budget int64
	used   int64 // bytes charged: whole pages for DRAM, file bytes for disk
	// stats holds the counters changed under the write lock (evictions,
	// demotions, promotions); hits and misses are counted under the read
	// lock too. entries and stored are what recount maintains, so that
	// Stats is O(1).
	stats   TierStats
	hits    atomic.Uint64
	misses  atomic.Uint64
	entries int
	stored  int64
}

// Store is a node's tiered chunk store. It is safe for concurrent use.
type Store struct {
	cfg   Config
	log   *slog.Logger
	arena *arena
	disk  *diskDir

	// mu guards everything below. Reads that change nothing but pins and
	// counters (a DRAM hit, Best, Contains, Stats, Release) hold it shared;
	// everything else holds it exclusively.
	mu     sync.RWMutex
	moved  *sync.Cond // on mu: an entry stopped being busy, or I/O ended
	closed bool
	freed  bool // arena unmapped and device memory returned, after Close
	// inflight counts goroutines doing I/O with mu released; Close waits
	// for them before unmapping the arena.
	inflight int
	// diskFull: the last disk write failed for want of space
	// (diskWriteFailed).
	diskFull bool
	index    map[chunk.Key]*entry
	groups   map[groupKey][]*entry
	tiers    [numTiers]tierState
	// door is AdmitReuse's doorkeeper: keys refused once.
	door  ghost
	reuse [NumReuse]ReuseStats
	// pinnedBytes counts copies with at least one pin, detached or not.
	pinnedBytes [numTiers]atomic.Int64
	// sharedHits: the policy records hits under the read lock, so DRAM
	// hits need no exclusive lock (S3-FIFO; LRU moves its list).
	sharedHits bool
	// loans are the DRAM pages lent by Lend and not yet released, by the
	// address of their view's first byte, so that Put recognises them;
	// lentBytes is their whole pages; adopted counts the puts that took
	// lent pages as the entry's DRAM copy.
	loans     map[*byte]*dramCopy
	lentBytes int64
	adopted   uint64
	// released counts the DRAM bytes the releaser returned to the OS (a
	// punch in flight shows as arena.reservedPages() > 0).
	released uint64
	// The releaser (releaseLoop) owns the punches: unlock kicks it when
	// one is due, Close stops it (releaseStop) and waits for it
	// (releaseDone). All nil when pages are never released.
	releaseKick chan struct{}
	releaseStop chan struct{}
	releaseDone chan struct{}
	// punchHook, when set (by tests), runs in the releaser without the
	// lock just before a punch; allocWaitHook runs under it when a put
	// waits for one.
	punchHook     func()
	allocWaitHook func()
}

// Open creates a store; with a disk tier it rebuilds the index from the
// directory, dropping files that fail their checksums.
func Open(cfg Config) (*Store, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Store{cfg: cfg, log: cfg.Logger, index: make(map[chunk.Key]*entry), groups: make(map[groupKey][]*entry),
		loans: make(map[*byte]*dramCopy),
		door:  ghost{capacity: cfg.DoorkeeperBytes, at: make(map[chunk.Key]*gnode)}}
	for r := range s.reuse {
		s.reuse[r].Reuse = Reuse(r)
	}
	s.moved = sync.NewCond(&s.mu)
	a, err := newArena(cfg.DRAMBytes, cfg.PageSize, cfg.Prefault, cfg.ReleaseBytes)
	if err != nil {
		return nil, err
	}
	s.arena = a
	s.tiers[TierDRAM].budget = int64(a.npages) * int64(a.pageSize)
	if cfg.GPU != nil {
		b := cfg.GPU.Capacity()
		if cfg.GPUBytes > 0 {
			b = min(b, cfg.GPUBytes)
		}
		s.tiers[TierGPU].budget = b
	}
	if cfg.DiskDir != "" {
		s.tiers[TierDisk].budget = cfg.DiskBytes
		if s.disk, err = openDiskDir(cfg.DiskDir, cfg.DiskCodec, cfg.Limits); err != nil {
			a.close()
			return nil, err
		}
	}
	for t := range s.tiers {
		s.tiers[t].pol = newPolicy(cfg.Policy, s.tiers[t].budget, cfg.Admission == AdmitReuse)
	}
	s.sharedHits = s.tiers[TierDRAM].pol.sharedTouch()
	if s.disk != nil {
		if err := s.recoverDisk(); err != nil {
			a.close()
			return nil, err
		}
	}
	if cfg.ReleaseBytes > 0 {
		s.releaseKick = make(chan struct{}, 1)
		s.releaseStop = make(chan struct{})
		s.releaseDone = make(chan struct{})
		go s.releaseLoop()
	}
	return s, nil
}

// recoverDisk rebuilds the disk tier's index from its files. It keeps
// every valid file, even beyond a budget that shrank since: a recovered
// entry may be the last copy of a key, and the files are on disk already.
// An over-budget tier then shrinks by the run-time policy as new entries
// come (reserveDisk), counted as evictions. The files enter the policy in a random order:
// they carry no access history, and the directory walk's order is the same
// on every node, so evicting by it would drop the same keys on every
// replica of them.
func (s *Store) recoverDisk() error {
	files, damaged, err := s.disk.recover(s.log)
	if err != nil {
		return err
	}
	ts := &s.tiers[TierDisk]
	ts.stats.Damaged += uint64(damaged)
	rand.Shuffle(len(files), func(i, j int) { files[i], files[j] = files[j], files[i] })
	for _, f := range files {
		if s.index[f.key] != nil {
			// A duplicate of a key (one put under another checksum):
			// keep the first.
			s.log.Info("kvtier: dropping a second disk file of a key", "file", f.rel, "key", f.key)
			_ = s.disk.remove(f.rel)
			continue
		}
		e := &entry{key: f.key, checksum: f.checksum, size: f.size, codec: f.codec, reuse: ReuseOf(f.key)}
		s.setDisk(e, f.rel, f.stored)
		s.link(e)
		ts.used += f.stored
		s.enterPolicy(TierDisk, e, f.stored)
	}
	if ts.used > ts.budget {
		s.log.Warn("kvtier: the disk tier holds more than its budget; every entry is kept, and new ones evict older ones by policy until it fits",
			"bytes", ts.used, "budget", ts.budget, "entries", ts.entries)
	}
	return nil
}

// Close stops the store and releases its DRAM arena and device memory.
// Bytes lent by Get must be released first: with pins outstanding, Close stops the
// store but keeps the memory (so their bytes stay valid) and returns an
// error; call it again once they are released.
func (s *Store) Close() error {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		if s.releaseStop != nil {
			close(s.releaseStop)
		}
	}
	s.mu.Unlock()
	if s.releaseDone != nil {
		// At most one punch (ReleaseBytes of pages) is in flight; the
		// releaser starts no other once the store is closed.
		<-s.releaseDone
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.inflight > 0 {
		s.moved.Wait()
	}
	if s.freed {
		return nil
	}
	if p := s.pinnedBytes[TierDRAM].Load() + s.pinnedBytes[TierGPU].Load(); p > 0 {
		return fmt.Errorf("kvtier: closing with %d pinned bytes; memory kept until the handles are released and Close is called again", p)
	}
	s.freed = true
	for _, e := range s.index {
		if e.dev != nil {
			_ = s.cfg.GPU.Free(e.dev.ptr)
		}
	}
	return s.arena.close()
}

func (s *Store) now() int64 { return s.cfg.Now().UnixNano() }

// unlocked runs fn (I/O or a copy) with mu released.
func (s *Store) unlocked(fn func()) {
	s.inflight++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inflight--
		s.moved.Broadcast()
	}()
	fn()
}

// unlock releases mu, first waking the releaser when enough freed DRAM
// pages have piled up to return them to the OS. Every exclusive section
// that can free DRAM pages ends with it (Close aside: a closed store keeps
// its pages until it unmaps them), so the caller that crosses ReleaseBytes
// pays a channel send, not the punch.
func (s *Store) unlock() {
	if !s.closed && s.arena.punchDue() {
		select {
		case s.releaseKick <- struct{}{}:
		default: // already kicked
		}
	}
	s.mu.Unlock()
}
