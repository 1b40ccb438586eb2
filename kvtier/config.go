package kvtier

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
)

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
	// OnDropped, when set, is called with the key of each copy the store
	// drops for want of room below it rather than by its eviction policy:
	// a demotion that the tier below could not take (the disk tier out of
	// space, failing its write or unable to make room; DRAM holding only
	// pinned entries for a GPU victim, or the device read failing). The
	// caller then holds fewer copies than its placement says. Evictions
	// from the lowest tier, deletes, TTL expiry and damaged copies a read
	// finds (it returns ErrDamaged to its caller) are not reported. It is
	// called with the store's lock held: it must return at once and must
	// not call the Store.
	OnDropped func(chunk.Key)
	// Now is the clock for TTLs. Default time.Now.
	Now func() time.Time
	// Logger defaults to slog.Default().
	Logger *slog.Logger
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
