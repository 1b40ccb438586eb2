package kvtier

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/pinned"
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

// Config configures a Store. Zero fields take the documented defaults.
type Config struct {
	// DRAMBytes is the DRAM tier's budget; required. It is rounded down
	// to whole pages of a memfd, off the Go heap, whose memory the kernel
	// commits as pages are first written (all at Open with Prefault).
	DRAMBytes int64
	// Prefault commits the whole DRAM budget at Open, so that no put pays
	// for first-touch page faults (about as much as the copy itself).
	// Without it, Put faults an entry's pages in with one
	// MADV_POPULATE_WRITE before copying, which costs a fraction of
	// faulting them one 4 KiB page at a time.
	Prefault bool
	// ReleaseBytes is how many bytes of freed DRAM pages may stay resident
	// before all free pages are returned to the OS (holes punched in the
	// memfd). Pages freed and soon reused, as in a full tier that evicts
	// to make room, never count against it; a node that drops a share of
	// its data gets its memory back. The punch takes about 0.4 CPU-s per
	// GiB (some 25 ms at the default) and runs in the Store's releaser
	// goroutine, without the store's lock: the call that freed the last
	// pages only wakes it. The pages being punched are neither free nor
	// charged to the tier meanwhile, and a put that needs them waits for
	// the punch rather than evict. Default min(DRAMBytes/8, 64 MiB);
	// negative means never (RSS stays at its peak, no put refaults a page).
	ReleaseBytes int64
	// PageSize is the DRAM page size, a multiple of the OS page size.
	// Default 64 KiB: an entry wastes less than a page, under 3.2% for a
	// 16-token chunk of a 32-layer, 8-KV-head, 128-dim bf16 model (2 MiB).
	PageSize int
	// DiskDir enables the disk tier in that directory; "" means none.
	DiskDir string
	// DiskBytes is the disk tier's budget; required with DiskDir.
	DiskBytes int64
	// DiskCodec re-encodes raw entries on disk. Default chunk.CodecLossless;
	// entries are stored as given while this build's chunk package lacks
	// it, or when it does not shrink them.
	DiskCodec chunk.Codec
	// GPU enables the GPU tier; nil means none.
	GPU DeviceMemory
	// GPUBytes is the GPU tier's budget; 0 means GPU.Capacity().
	GPUBytes int64
	// Policy is the eviction policy of every tier. Default PolicyS3FIFO.
	Policy Policy
	// Admission says which puts are kept. Default AdmitAll; AdmitReuse
	// keeps what is predicted to be read again and, with S3-FIFO, weighs
	// eviction by reuse class (see AdmitReuse).
	Admission Admission
	// DoorkeeperBytes bounds AdmitReuse's memory of refused keys by the
	// bytes of the entries they name (the index holds only the keys, under
	// a hundred bytes each). Default DRAMBytes: a prefix is kept if it
	// recurs before as many bytes of other refused prefixes came by as
	// the DRAM tier holds.
	DoorkeeperBytes int64
	// LendBytes bounds the DRAM pages lent at once (Lend), whole pages,
	// so that bodies still arriving cannot evict or pin the whole tier.
	// Default DRAMBytes/4; negative means Lend always refuses.
	LendBytes int64
	// Limits bound the entries Put accepts. Zero means chunk.DefaultLimits.
	Limits chunk.Limits
	// SkipVerify skips checking every layer checksum on Put (the header is
	// always checked). Only for callers that verified the blob already.
	SkipVerify bool
	// Now is the clock for TTLs. Default time.Now.
	Now func() time.Time
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// PutOptions are per-entry options of Put.
type PutOptions struct {
	// TTL, when positive, expires the entry that long after the put.
	TTL time.Duration
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

// devCopy is an entry's allocation in device memory.
type devCopy struct {
	ptr      DevicePtr
	size     int64
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

// DefaultConfig is the configuration of every field Open defaults to a
// fixed value: the values a zero field takes. DoorkeeperBytes defaults to
// DRAMBytes, LendBytes to a quarter of it and ReleaseBytes to an eighth (at
// most 64 MiB); the caller sets DRAMBytes (and DiskDir with DiskBytes for a
// disk tier) before Open.
func DefaultConfig() Config {
	return Config{
		PageSize:  64 << 10,
		DiskCodec: chunk.CodecLossless,
		Limits:    chunk.DefaultLimits,
		Now:       time.Now,
	}
}

// Validate reports what Open would refuse before opening anything.
func (c Config) Validate() error {
	_, err := c.withDefaults()
	return err
}

// withDefaults checks c and gives its zero fields their defaults, the
// ones derived from DRAMBytes included, so that the store keeps the
// configuration it runs by.
func (c Config) withDefaults() (Config, error) {
	if c.DRAMBytes <= 0 {
		return c, fmt.Errorf("kvtier: DRAMBytes must be positive")
	}
	if c.DiskDir != "" && c.DiskBytes <= 0 {
		return c, fmt.Errorf("kvtier: DiskBytes must be positive with DiskDir")
	}
	d := DefaultConfig()
	if c.PageSize == 0 {
		c.PageSize = d.PageSize
	}
	if c.DiskCodec == chunk.CodecInvalid {
		c.DiskCodec = d.DiskCodec
	}
	if c.Limits == (chunk.Limits{}) {
		c.Limits = d.Limits
	}
	if c.Now == nil {
		c.Now = d.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.DoorkeeperBytes <= 0 {
		c.DoorkeeperBytes = c.DRAMBytes
	}
	if c.LendBytes == 0 {
		c.LendBytes = c.DRAMBytes / 4
	}
	if c.ReleaseBytes == 0 {
		c.ReleaseBytes = min(c.DRAMBytes/8, 64<<20)
	}
	return c, nil
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
		s.admit(TierDisk, e, f.stored)
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

// releaseLoop is the releaser: it returns freed pages to the OS whenever
// unlock finds a release due, until Close.
func (s *Store) releaseLoop() {
	defer close(s.releaseDone)
	for {
		select {
		case <-s.releaseStop:
			return
		case <-s.releaseKick:
		}
		s.mu.Lock()
		// Pages freed during a punch may make another one due.
		for !s.closed && s.arena.punchDue() {
			s.releasePages()
		}
		s.mu.Unlock()
	}
}

// releasePages returns every free resident page to the OS: it reserves
// them under mu, so that no put is handed a page being punched, punches
// them without mu, so that reads and puts proceed meanwhile, and frees
// them again under mu. mu held; released around the punch.
func (s *Store) releasePages() {
	runs := s.arena.reserveFree()
	var pages int
	s.unlocked(func() {
		if s.punchHook != nil {
			s.punchHook()
		}
		pages = s.arena.punchRuns(runs)
	})
	s.arena.unreserve(runs)
	s.released += uint64(pages) * uint64(s.arena.pageSize)
	s.moved.Broadcast() // puts waiting for the reserved pages
}

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

// admit puts e in tier t's policy, charged cost bytes (already in used).
func (s *Store) admit(t Tier, e *entry, cost int64) {
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
		s.admit(TierDRAM, e, int64(c.span.pages)*int64(s.arena.pageSize))
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
	s.admit(TierDisk, e, size)
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

// demoteDRAM moves e from DRAM to disk if the disk tier can take it, else
// drops it. Called with mu held; may release it.
func (s *Store) demoteDRAM(ctx context.Context, e *entry) {
	ts := &s.tiers[TierDRAM]
	s.leavePolicy(e, true)
	if s.disk == nil || !s.reserveDisk(int64(e.size)) {
		ts.stats.Evictions++
		s.reuse[e.reuse].Evicted++
		s.remove(e)
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
		s.admit(TierDRAM, e, int64(c.span.pages)*int64(s.arena.pageSize))
	default:
		s.dropDRAM(e)
		s.setDisk(e, rel, size)
		s.admit(TierDisk, e, size)
		ts.stats.Demotions++
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
	s.admit(TierDRAM, e, int64(c.span.pages)*int64(s.arena.pageSize))
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
