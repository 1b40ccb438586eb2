package kvtier

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestDiskOutOfSpace: a disk budget larger than the file system (here a
// 512 KiB tmpfs under a 4 MiB budget). The first ENOSPC lowers the budget
// to what the tier holds and is logged once; later demotions evict older
// disk entries by policy and succeed, instead of failing (and dropping
// their entry) one by one. Stats report the errors, the state and the
// file system's own size and free space.
func TestDiskOutOfSpace(t *testing.T) {
	dir := testutil.Tmpfs(t, 512<<10)
	var logs bytes.Buffer
	s := openTest(t, Config{DRAMBytes: 16 * 4096, DiskDir: dir, DiskBytes: 4 << 20, PageSize: 4096,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	const puts = 400
	for i := range puts {
		if _, err := s.Put(t.Context(), makeBlob(t, testFP, uint64(i+1), 12, testStandalone, 2), PutOptions{}); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	st := s.Stats()
	d, demotions := st.Tiers[TierDisk], st.Tiers[TierDRAM].Demotions
	if d.NoSpaceErrors == 0 || d.Budget >= 512<<10 || d.Bytes > d.Budget {
		t.Fatalf("after filling a 512 KiB file system under a 4 MiB budget: %+v", d)
	}
	if d.Entries == 0 || d.Evictions == 0 || demotions < puts/2 {
		t.Fatalf("the full disk tier stopped taking demotions (%d): %+v", demotions, d)
	}
	if d.NoSpaceErrors > 10 {
		t.Fatalf("%d ENOSPC failures for %d demotions: the budget did not follow the file system", d.NoSpaceErrors, demotions)
	}
	if d.FSBytes != 512<<10 || d.FSFreeBytes >= 64<<10 {
		t.Fatalf("file system %d bytes, %d free", d.FSBytes, d.FSFreeBytes)
	}
	if n := strings.Count(logs.String(), "out of space"); n == 0 || uint64(n) > d.NoSpaceErrors {
		t.Fatalf("%d log lines for %d ENOSPC failures:\n%s", n, d.NoSpaceErrors, logs.String())
	}
	checkCounts(t, s)
}

// TestOnDropped: Config.OnDropped names each copy the store drops because
// the disk tier could not take a demotion (here the file system fills up),
// and nothing that the eviction policy drops: the evictions of a store
// without a disk tier, nor those of a disk tier that makes room by policy.
func TestOnDropped(t *testing.T) {
	const puts = 400
	run := func(t *testing.T, cfg Config) (*Store, []chunk.Key) {
		var drops []chunk.Key
		cfg.OnDropped = func(k chunk.Key) { drops = append(drops, k) }
		s := openTest(t, cfg)
		for i := range puts {
			if _, err := s.Put(t.Context(), makeBlob(t, testFP, uint64(i+1), 12, testStandalone, 2), PutOptions{}); err != nil {
				t.Fatalf("put %d: %v", i, err)
			}
		}
		// Every put has returned: OnDropped runs under the store's lock,
		// so drops is complete.
		return s, drops
	}
	t.Run("no disk tier", func(t *testing.T) {
		s, drops := run(t, Config{DRAMBytes: 16 * 4096})
		if ev := s.Stats().Tiers[TierDRAM].Evictions; ev == 0 || len(drops) != 0 {
			t.Fatalf("%d DRAM evictions, %d reported as dropped for want of room; want some, none", ev, len(drops))
		}
	})
	t.Run("disk tier evicting by policy", func(t *testing.T) {
		s, drops := run(t, Config{DRAMBytes: 16 * 4096, DiskDir: t.TempDir(), DiskBytes: 64 * 4096})
		if ev := s.Stats().Tiers[TierDisk].Evictions; ev == 0 || len(drops) != 0 {
			t.Fatalf("%d disk evictions, %d reported as dropped for want of room; want some, none", ev, len(drops))
		}
	})
	t.Run("file system full", func(t *testing.T) {
		s, drops := run(t, Config{DRAMBytes: 16 * 4096, DiskDir: testutil.Tmpfs(t, 512<<10), DiskBytes: 4 << 20})
		d := s.Stats().Tiers[TierDisk]
		if d.NoSpaceErrors == 0 {
			t.Fatalf("the file system never filled: %+v", d)
		}
		// Each failed write dropped its DRAM victim.
		if uint64(len(drops)) < d.WriteErrors {
			t.Fatalf("%d copies reported dropped for %d failed disk writes", len(drops), d.WriteErrors)
		}
		for _, k := range drops {
			if s.Contains(k) {
				t.Fatalf("%v reported dropped, still stored", k)
			}
		}
		checkCounts(t, s)
	})
}
