package kvtier

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

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
