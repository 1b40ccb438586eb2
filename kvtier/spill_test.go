package kvtier

import (
	"log/slog"
	"testing"
)

// TestSpillKeepsDRAMEntriesAcrossReopen: entries that lived only in DRAM
// are on disk after Spill, and a store opened again on the directory has
// every one of them, bit for bit. A spill stops at the disk budget rather
// than evict what the disk tier holds.
func TestSpillKeepsDRAMEntriesAcrossReopen(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	cfg := Config{DRAMBytes: 16 * 4096, DiskDir: dir, DiskBytes: 1 << 20, PageSize: 4096, Logger: slog.New(slog.DiscardHandler)}
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	bs := blobs(t, 10, 12) // one page each: all fit in DRAM
	for _, b := range bs {
		if _, err := s.Put(ctx, b, PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if st := s.Stats(); st.Tiers[TierDisk].Entries != 0 {
		t.Fatalf("disk holds %d entries before the spill", st.Tiers[TierDisk].Entries)
	}
	n := s.Spill(ctx).Entries
	if n != len(bs) {
		t.Fatalf("spilled %d of %d entries", n, len(bs))
	}
	if st := s.Stats(); st.Tiers[TierDisk].Entries != len(bs) || st.Tiers[TierDisk].Evictions != 0 {
		t.Fatalf("after the spill: %+v", st.Tiers[TierDisk])
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := openTest(t, cfg)
	for _, b := range bs {
		h := mustGet(t, s2, b)
		h.Release()
	}

	// A full disk tier: the spill moves what fits and evicts nothing.
	small := cfg
	small.DiskDir, small.DiskBytes = t.TempDir(), 3*4096
	s3 := openTest(t, small)
	for _, b := range bs {
		if _, err := s3.Put(ctx, b, PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sp := s3.Spill(ctx)
	st := s3.Stats()
	if sp.Entries == 0 || sp.Entries+sp.NoRoom != len(bs) || sp.Failed != 0 || st.Tiers[TierDisk].Evictions != 0 || st.Entries != len(bs) {
		t.Fatalf("spill into a small disk tier: %+v; %+v", sp, st)
	}
}

// TestSpillWithoutDiskTier moves nothing.
func TestSpillWithoutDiskTier(t *testing.T) {
	s := openTest(t, Config{DRAMBytes: 16 * 4096})
	if _, err := s.Put(t.Context(), blobs(t, 1, 12)[0], PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if sp := s.Spill(t.Context()); sp != (SpillStats{}) {
		t.Fatalf("spilled without a disk tier: %+v", sp)
	}
}

// TestRecoveryKeepsEntriesOverBudget: a store opened again with a smaller
// disk budget than its files take keeps every valid file (one may be a
// key's last copy), and then does not grow: each new entry evicts at
// least its own size by policy, counted as evictions, until the tier
// fits its budget.
func TestRecoveryKeepsEntriesOverBudget(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	cfg := Config{DRAMBytes: 16 * 4096, DiskDir: dir, DiskBytes: 1 << 20, PageSize: 4096, Logger: slog.New(slog.DiscardHandler)}
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	bs := blobs(t, 12, 12)
	for _, b := range bs {
		if _, err := s.Put(ctx, b, PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.Spill(ctx).Entries; n != len(bs) {
		t.Fatalf("spilled %d of %d", n, len(bs))
	}
	full := s.Stats().Tiers[TierDisk].Bytes
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	small := cfg
	small.DiskBytes = full / 3
	s2 := openTest(t, small)
	st := s2.Stats().Tiers[TierDisk]
	if st.Entries != len(bs) || st.Bytes != full || st.Evictions != 0 {
		t.Fatalf("reopened with a third of the budget: %d of %d entries, %d of %d bytes, %d evictions",
			st.Entries, len(bs), st.Bytes, full, st.Evictions)
	}
	// New entries demote DRAM to disk: the tier shrinks, by policy.
	prev := full
	for i := range 40 {
		if _, err := s2.Put(ctx, makeBlob(t, testFP, uint64(1000+i), 12, testStandalone, 2), PutOptions{}); err != nil {
			t.Fatal(err)
		}
		d := s2.Stats().Tiers[TierDisk]
		if d.Bytes > prev {
			t.Fatalf("put %d: the over-budget disk tier grew from %d to %d bytes", i, prev, d.Bytes)
		}
		prev = d.Bytes
	}
	d := s2.Stats().Tiers[TierDisk]
	if d.Bytes > d.Budget || d.Evictions == 0 {
		t.Fatalf("after 40 puts the disk tier holds %d bytes of a %d budget, %d evictions", d.Bytes, d.Budget, d.Evictions)
	}
	checkCounts(t, s2)
}
