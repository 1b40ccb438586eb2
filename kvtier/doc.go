// Package kvtier is a node's chunk store: encoded chunk entries (the blobs
// chunk.Encode writes) kept in up to three tiers under byte budgets, GPU
// memory, host DRAM and local disk, and indexed by (fingerprint, content
// ID, context) so that one lookup finds the best encoding of a chunk.
//
// Tiers are exclusive: an entry lives in one tier at a time. Puts land in
// DRAM; DRAM victims are demoted to disk when the disk tier can make room
// (else dropped), disk hits are promoted back to DRAM, GetDevice promotes
// to the GPU tier and the GPU tier's victims are demoted to DRAM. Each tier
// orders its entries with its own policy instance, S3-FIFO by default (a
// probationary FIFO, a main FIFO with reinsertion and a ghost queue, all
// weighted by bytes): frequency-aware admission and eviction that beats
// LRU on skewed traces (see the benchmarks). With Config.Admission set to
// AdmitReuse, a put is kept only when it is predicted to be read again (a
// doorkeeper turns away further prefix-chained copies of a content until
// their key recurs) and S3-FIFO credits entries by how they can be reused
// (Reuse: standalone, window, prefix). Pinned entries are never
// evicted or demoted; a budget is never exceeded because the bytes are
// charged before they are written.
//
// DRAM layout. The DRAM tier is a memfd of fixed-size pages (64 KiB by
// default) mapped once, off the Go heap, so the garbage collector neither
// scans nor counts stored bytes: the heap holds only the index, well under
// a kilobyte per entry. Put checks every layer checksum while it copies the
// blob into its pages (hash a 64 KiB block, copy it while it is in cache),
// one pass over memory instead of two. An entry is a list of pages, allocated
// lowest-index first so that most entries are one contiguous run. Get
// returns a contiguous zero-copy view in every case: a single run is a
// slice of the arena mapping; an entry whose pages are scattered gets its
// own mapping in which the runs are placed side by side (mmap MAP_FIXED of
// the memfd's pages into a reserved range). This keeps the simple
// contract, one []byte that chunk.ParseHeader, chunk.DecodeRange and a gRPC
// send can use directly, without a buddy allocator's up-to-2x internal
// waste or a free-extent allocator's external fragmentation: waste is under
// one page per entry (under 3.2% for a 16-token chunk of a 32-layer,
// 8-KV-head, 128-dim bf16 model, far less for larger chunks), and any free
// pages can serve any entry. The cost is an mmap/munmap pair per scattered
// entry, a few microseconds against a copy of megabytes.
//
// DRAM residency. The kernel commits the memfd's pages on first write, and
// a first write costs a page fault per 4 KiB, several times the copy
// itself; Put therefore faults an entry's pages in with one
// MADV_POPULATE_WRITE before copying, for pages not resident yet (a bitmap
// says which). Freed pages stay resident while they are likely to be
// reused (a full tier reuses what eviction frees at once); once
// Config.ReleaseBytes of them accumulate, every free resident page goes
// back to the OS with fallocate(PUNCH_HOLE), so a node that drops data,
// as an old owner does in a rebalance, does not keep its peak RSS. The
// punch (about 25 ms per 64 MiB) runs in a background releaser owned by
// the Store (woken by the call that crosses the threshold, stopped by
// Close) and without the Store's lock: the pages are taken out of the free
// set under it, punched, and freed again, so reads and puts go on
// meanwhile and a put that needs those very pages waits for them rather
// than evict. Stats reports the freed pages still
// resident and the bytes released (kvtier_free_resident_bytes,
// kvtier_released_bytes_total).
//
// Disk layout. One file per entry, named by key, checksum and size, under
// 256 subdirectories; written to a temp file, fsynced, renamed, and the
// directory fsynced. Open rebuilds the index from the directory, verifies
// every file's checksums and drops temp files and torn or corrupted files.
// Raw entries are re-encoded with chunk.CodecLossless when the chunk
// package supports it and it shrinks them; promotion restores the exact
// bytes that were put.
//
// Receiving into the arena. A node that receives an entry off the network
// can write it straight into DRAM pages: Lend allocates them as a put of
// that size would (and counts them against the tier, capped by
// Config.LendBytes), the caller writes the body into them, and Put of
// exactly those bytes checks the layer checksums in place (a read pass)
// and makes the pages the entry's DRAM copy: one copy fewer than a Put of
// a heap buffer. The loan pins the pages like a Get: the caller still
// reads them (to forward to replicas) until Release, an entry deleted or
// evicted meanwhile frees them at that Release, and pages no entry took
// (a put that conflicts, is a no-op, is refused or fails, or none at all)
// go back to the arena then. Pages an entry already holds are never
// adopted a second time; a put of them copies or is a no-op as usual.
//
// Pins. Get lends the entry as a pinned.Bytes: a DRAM hit is a view of the
// arena whose pages stay valid, and whose entry stays put, until Release;
// a disk hit that cannot be promoted, and a GPU hit, are a private copy
// (pinned.Owned) instead. Delete of a pinned entry hides it at
// once and frees its pages at the last Release.
//
// Locking. One RWMutex guards the index, the policies and the budgets.
// The hot read, a DRAM hit, holds it shared: pin counts, hit and miss
// counters and S3-FIFO's frequency bits are atomics, so concurrent Gets
// proceed in parallel (LRU, whose hits move list nodes, takes the slow
// path). Best, Contains and Stats also read under the shared lock; Stats
// is O(1), the per-tier entry and byte counts being kept as entries come,
// move and go. Everything that evicts, moves or frees holds the lock
// exclusively, which excludes the pinning readers, and releases it around
// copies and disk I/O.
//
// GPU memory. With the cuda build tag, OpenCUDA reserves one slab of
// device memory at start and carves it with a best-fit allocator that
// coalesces free extents (O(log n), tested on the CPU against a bitmap
// reference); copies go through page-locked staging buffers on a stream
// owned by one goroutine locked to its OS thread, where the CUDA context
// is current. GetDevice moves an entry into the tier only from host bytes
// whose every layer matches its checksum, and lends it with that parsed
// header, so a kernel reading the copy needs nothing read back.
// scripts/device/gpu-check.sh runs the GPU tier tests on a machine with a
// GPU.
package kvtier
